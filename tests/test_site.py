"""The built website as a reader sees it: opened from disk in headless Chromium, network off.

On every page, the maths must be typeset by the MathJax copy that ships inside the site (no CDN),
and no equation, table, code block or cell output may be wider than the text column (nothing
clipped, nothing that needs a horizontal scroll bar). The book is built once per test session by the
``built_book`` fixture in ``conftest.py``; ``test_book.py`` checks that this build passed with -W.

The browser is driven with the Chrome DevTools Protocol over a pipe (``--remote-debugging-pipe``),
so no Python package and no driver binary is needed, only a Chromium (Debian: ``apt-get install -y
chromium``). Without one the tests skip and say so.

Run by hand against an existing build, printing what every page measured::

    python tests/test_site.py _build/html
"""

from __future__ import annotations

import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

#: The windows the pages are measured in (width, height): small and common laptops, a desktop.
VIEWPORTS = ((1280, 800), (1366, 768), (1920, 1080))
#: From this window width up, code lines of up to CODE_COLUMNS characters never wrap.
CODE_FITS_FROM = 1366
#: Every code block must show this many characters per line without wrapping.
CODE_COLUMNS = 100
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
NO_BROWSER = (
    "no Chromium found (set CHROMIUM=/path/to/chrome, or on Debian: apt-get install -y chromium); "
    "the rendered-site checks did not run"
)

#: Runs in the page once it has loaded: waits for MathJax and the fonts, then measures.
PAGE_CHECK = r"""
(async () => {
  const out = {mathjax: null, math: 0, typeset: 0, untypeset: [], errors: [], raw: [], wide: [],
               figures: [], wrapped: [], width: 0};
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  // Wait up to 10 s for MathJax on a page that has maths or loads MathJax. A page with neither
  // (Sphinx adds the script only where there is maths) has nothing to wait for: the wait could
  // only end with no MathJax, which is what the check then records without waiting.
  const mathPage = window.MathJax || document.querySelector('script[src*="mathjax" i]')
    || document.querySelector("span.math, div.math");
  for (let i = 0; mathPage && i < 100
       && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++)
    await sleep(100);
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
    out.mathjax = (MathJax.version || "?");
  }
  await document.fonts.ready;
  await sleep(200);
  const article = document.querySelector("article.bd-article") || document.querySelector("main")
    || document.body;
  const describe = el => {
    const cls = (el.getAttribute("class") || "").split(/\s+/).filter(Boolean).slice(0, 3);
    const sec = el.closest("[id]");
    const text = (el.innerText || el.textContent || "").replace(/\s+/g, " ").trim().slice(0, 70);
    return `${el.tagName.toLowerCase()}${cls.map(c => "." + c).join("")}`
      + (sec ? ` in #${sec.id}` : "") + (text ? `: "${text}"` : "");
  };
  const kind = el => {
    if (el.closest("div.math, mjx-container")) return "equation";
    if (el.closest("table, .pst-scrollable-table-container")) return "table";
    if (el.closest(".cell_output, .output")) return "output";
    if (el.closest("pre, div.highlight, code")) return "code";
    if (el.closest("img, figure")) return "figure";
    return "other";
  };
  // 1. maths: every math node is typeset, no TeX error, no raw delimiters in the visible text
  out.fonts = [...document.fonts].filter(f => f.family.startsWith("MJX") && f.status === "error")
    .map(f => f.family);
  const maths = article.querySelectorAll("span.math, div.math");
  out.math = maths.length;
  for (const m of maths) {
    if (m.querySelector("mjx-container")) out.typeset++;
    else out.untypeset.push(describe(m));
  }
  for (const e of article.querySelectorAll("mjx-merror"))
    out.errors.push((e.getAttribute("data-mjx-error") || e.textContent).slice(0, 120));
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  const skip = "pre, code, script, style, textarea, mjx-container, .highlight";
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const t = n.textContent;
    if (!/\\\(|\\\[|\$\$|\\begin\{/.test(t) || n.parentElement.closest(skip)) continue;
    out.raw.push(describe(n.parentElement));
  }
  // 2. widths: nothing scrolls sideways or sticks out of the text column. MathJax's hidden copy of
  // each formula for screen readers (mjx-assistive-mml: clipped to nothing, but as wide as the
  // browser lays out its MathML) would count as overflow of the inline formulas it sits in.
  const hide = document.createElement("style");
  hide.textContent = "mjx-assistive-mml { display: none !important; }";
  document.head.appendChild(hide);
  await sleep(50);
  const box = article.getBoundingClientRect(), acs = getComputedStyle(article);
  const left = box.left + parseFloat(acs.paddingLeft);
  const right = box.right - parseFloat(acs.paddingRight);
  out.width = Math.round(right - left);
  const reported = [];
  for (const el of article.querySelectorAll("*")) {
    if (el.closest("mjx-assistive-mml") || reported.some(r => r.contains(el))) continue;
    // text inside a code block wraps; the block itself is what is measured
    if (el.parentElement.closest("pre")) continue;
    const cs = getComputedStyle(el);
    if (cs.display === "none" || cs.visibility === "hidden" || cs.position === "fixed") continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    // inside a formula only the formula's own box counts (MathJax clips its stretchy glyph parts)
    const scrolls = el.clientWidth > 0 && !el.parentElement.closest("mjx-container")
      && el.scrollWidth > el.clientWidth + 1
      && ["auto", "scroll", "hidden", "clip"].includes(cs.overflowX);
    const sticks = r.right > right + 1 || r.left < left - 1;
    if (!scrolls && !sticks) continue;
    reported.push(el);
    out.wide.push({kind: kind(el), what: describe(el), content: el.scrollWidth,
                   visible: scrolls ? el.clientWidth : Math.round(right - r.left)});
  }
  // 3. code: how many characters of code fit on one line of each code block
  for (const pre of article.querySelectorAll("pre")) {
    if (!pre.clientWidth) continue;
    const probe = document.createElement("span");
    probe.style.whiteSpace = "pre";
    probe.textContent = "x".repeat(100);
    pre.appendChild(probe);
    const perChar = probe.getBoundingClientRect().width / 100;
    probe.remove();
    const ps = getComputedStyle(pre);
    const room = pre.clientWidth - parseFloat(ps.paddingLeft) - parseFloat(ps.paddingRight);
    const fits = Math.floor(room / perChar + 0.01);
    if (out.columns === undefined || fits < out.columns) {
      out.columns = fits;
      out.narrowest = describe(pre).slice(0, 90) + ` (font ${ps.fontSize})`;
    }
    // code up to CODE_COLUMNS wide must fit unwrapped; longer lines may wrap (never clip)
    const longest = Math.max(...pre.textContent.split("\n").map(l => l.length));
    const wrap = pre.style.whiteSpace;
    pre.style.whiteSpace = "pre";
    if (longest <= CODE_COLUMNS && pre.scrollWidth > pre.clientWidth + 1
        && window.innerWidth >= CODE_FITS_FROM)
      out.wrapped.push(`${describe(pre).slice(0, 90)} (${longest} columns, ${fits} fit)`);
    pre.style.whiteSpace = wrap;
  }
  // 4. figures: rendered size against their natural size, caption number
  for (const img of article.querySelectorAll("img")) {
    if (!img.naturalWidth || img.closest("a.reference.external")) continue;
    const fig = img.closest("figure");
    const num = fig && fig.querySelector(".caption-number");
    out.figures.push({src: img.getAttribute("src").slice(-40), natural: img.naturalWidth,
                      shown: Math.round(img.getBoundingClientRect().width),
                      number: num ? num.textContent.trim() : null});
  }
  return out;
})()
"""


def find_browser() -> str | None:
    """The Chromium to drive: $CHROMIUM, else the first of the usual names on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    """A headless Chromium with no network, spoken to with DevTools messages over a pipe."""

    def __init__(self, exe: str, width: int = 1280, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        # Chromium reads commands on fd 3 and writes replies on fd 4 (NUL-terminated JSON).
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def wire():  # runs in the child: put the two pipe ends on fds 3 and 4
            high = [os.dup(cmd_r), os.dup(out_w)]  # first out of the way of 3 and 4
            for fd, high_fd in zip((3, 4), high):
                os.dup2(high_fd, fd)
                os.close(high_fd)

        args = [
            exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
            # no network: every host name fails to resolve, and anything else goes to a dead proxy
            "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
            f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
            "--remote-debugging-pipe", "about:blank",
        ]
        self.proc = subprocess.Popen(
            args, preexec_fn=wire, pass_fds=(3, 4),  # kept open after wire() ran
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
        self.session = attached["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method: str, session: bool = False, timeout: float = 60, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            event = self._read(timeout)
            if event.get("method") == method:
                return event
            self.events.append(event)

    def open(self, url: str, timeout: float = 60) -> dict:
        """Load ``url``, run :data:`PAGE_CHECK` in it; add the remote requests the page tried."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired", timeout)
        check = PAGE_CHECK.replace("CODE_COLUMNS", str(CODE_COLUMNS))
        check = check.replace("CODE_FITS_FROM", str(CODE_FITS_FROM))
        result = self.call("Runtime.evaluate", session=True, timeout=timeout, expression=check,
                           awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"the page check failed on {url}: {result['exceptionDetails']}")
        report = result["result"]["value"]
        report["remote"] = sorted({
            f"{e['params'].get('type', '?')} {e['params']['request']['url'][:100]}"
            for e in self.events if e.get("method") == "Network.requestWillBeSent"
            and e["params"]["request"]["url"].startswith(("http:", "https:", "ws:", "wss:"))
        })
        return report

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - it is going away either way
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)
        shutil.rmtree(self.profile, ignore_errors=True)


def site_pages(html: pathlib.Path) -> list[pathlib.Path]:
    """The book's own pages (not the search or index pages Sphinx adds)."""
    pages = html.rglob("*.html")
    return sorted(p for p in pages if p.parent != html and p.relative_to(html).parts[0][0] != "_")


def measure_site(html: pathlib.Path, exe: str, width: int = 1280, height: int = 900) -> dict:
    browser = Browser(exe, width, height)
    try:
        return {str(p.relative_to(html)): browser.open(p.as_uri()) for p in site_pages(html)}
    finally:
        browser.close()


def measure_windows(html: pathlib.Path, exe: str, sizes) -> dict:
    """``{window width: measure_site(html, exe, width, height)}`` for each ``(width, height)``,
    one browser per window, measured at once: a page mostly waits (its load, MathJax, the fonts,
    the check's pauses), so the windows take little longer than one. The browsers start one after
    another, before the threads that drive them."""
    import concurrent.futures

    browsers, pages = [], site_pages(html)
    try:
        for size in sizes:
            browsers.append(Browser(exe, *size))

        def visit(browser):
            return {str(p.relative_to(html)): browser.open(p.as_uri()) for p in pages}

        with concurrent.futures.ThreadPoolExecutor(len(browsers)) as pool:
            return {size[0]: r for size, r in zip(sizes, pool.map(visit, browsers))}
    finally:
        for browser in browsers:
            browser.close()


def problems(page: str, report: dict) -> list[str]:
    """What a reader would see wrong on one page, one line each."""
    found = []
    if report["math"] and not report["mathjax"]:
        found.append("MathJax did not load")
    if report["untypeset"]:
        found.append(f"{len(report['untypeset'])} of {report['math']} formulas not typeset, e.g. "
                     f"{report['untypeset'][0]}")
    found += [f"TeX error: {e}" for e in report["errors"]]
    found += [f"MathJax font did not load: {f}" for f in report["fonts"]]
    found += [f"raw TeX in the text: {r}" for r in report["raw"]]
    found += [f"{w['kind']} {w['content']} px wide in a {w['visible']} px column: {w['what']}"
              for w in report["wide"]]
    found += [f"needs the network: {r}" for r in report["remote"] if not r.startswith("Image ")]
    found += [f"code no wider than {CODE_COLUMNS} columns wraps: {w}" for w in report["wrapped"]]
    return found


@pytest.fixture(scope="module")
def browser_exe():
    exe = find_browser()
    if not exe:
        pytest.skip(NO_BROWSER)
    return exe


@pytest.fixture(scope="module")
def site_html(built_book):
    html = built_book.html
    if not (html / "index.html").exists():
        pytest.fail(f"the book was not built (see test_book.py):\n{built_book.log[-3000:]}")
    return html


@pytest.fixture(scope="module")
def measured(site_html, browser_exe):
    """{window width: {page: what the page check measured}}, one browser per window size."""
    return measure_windows(site_html, browser_exe, VIEWPORTS)


@pytest.mark.xdist_group("book")
def test_every_page_typesets_its_maths_and_fits_the_column(measured, site_html):
    for width, reports in measured.items():
        assert len(reports) >= 6, f"only {sorted(reports)} were found in {site_html}"
        assert sum(r["math"] for r in reports.values()) > 50, "the chapters' maths went missing"
        bad = {page: problems(page, r) for page, r in reports.items()}
        bad = {page: found for page, found in bad.items() if found}
        assert not bad, f"in a {width}-px window:\n" + "\n".join(
            f"{page}:\n  " + "\n  ".join(found) for page, found in bad.items())


@pytest.mark.xdist_group("book")
def test_pages_show_no_remote_images(measured):
    """Scripts, styles and fonts from the network already fail the test above; images are here."""
    reports = measured[VIEWPORTS[0][0]]
    remote = sorted({f"{page}: {r}" for page, rep in reports.items() for r in rep["remote"]})
    if remote and all(": Image https://colab.research.google.com/" in r for r in remote):
        pytest.xfail("the labs' Colab badge is a remote image (a text link or an image in "
                     "book/_static would show offline):\n" + "\n".join(remote))
    assert not remote, "pages fetch from the network:\n" + "\n".join(remote)


@pytest.mark.xdist_group("book")
def test_chapter_figures_are_numbered_and_readable(measured):
    reports = measured[VIEWPORTS[-1][0]]
    figures = {p: r["figures"] for p, r in reports.items() if p.startswith("book/")}
    assert any(figures.values()), "the chapters show no figures"
    for page, figs in figures.items():
        for fig in figs:
            assert fig["number"], f"{page}: figure {fig['src']} has no number and caption"
            # on a desktop, a figure is shown at (nearly) the size it was drawn at, so its text
            # stays legible: plots are drawn at most about 9 inches wide at 100 dpi
            assert fig["shown"] >= 0.7 * fig["natural"], (
                f"{page}: figure {fig['src']} is shrunk from {fig['natural']} to {fig['shown']} px")


@pytest.mark.xdist_group("book")
def test_launch_buttons_only_on_notebook_pages(site_html):
    """Colab opens .ipynb files: the chapters (MyST .md) get no launch button, the labs do."""
    for page in site_pages(site_html):
        name, html = page.relative_to(site_html).as_posix(), page.read_text(encoding="utf-8")
        has_button = 'aria-label="Launch interactive content"' in html
        if name.startswith("labs/"):
            assert has_button, f"{name}: the lab lost its launch (Colab) button"
        else:
            assert not has_button, f"{name} is not a notebook but has a launch button"


if __name__ == "__main__":  # python tests/test_site.py [_build/html] [width]
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "_build/html").resolve()
    w = int(sys.argv[2]) if len(sys.argv) > 2 else VIEWPORTS[0][0]
    exe = find_browser() or sys.exit(NO_BROWSER)
    sys.stdout.reconfigure(encoding="utf-8")
    for name, rep in measure_site(root, exe, w, 800).items():
        print(f"== {name}: MathJax {rep['mathjax']}, {rep['typeset']}/{rep['math']} typeset, "
              f"text column {rep['width']} px, {rep.get('columns')} code columns")
        for line in problems(name, rep):
            print("   ", line)
        for fig in rep["figures"]:
            print(f"    figure {fig['src']}: {fig['natural']} px shown at {fig['shown']} px, "
                  f"number {fig['number']}")
        for r in rep["remote"]:
            print("    tried to load", r)
