"""Speed of the code sandbox: a one-off ``run()`` vs the zygote ``Pool``.

Usage (from the repository root)::

    python benchmarks/bench_sandbox.py [--calls 200] [--snippets 200] [--repeats 5] [--workers 2]

Measured, for trivial arithmetic snippets (``print(i * i)``), with ``torch`` never imported:

- a fresh interpreter (``python -I -S -c ...`` through ``subprocess.run``): the baseline cost of
  starting Python for every snippet, without any sandboxing;
- ``sandbox.run()``: starts a zygote, runs the snippet in a forked, isolated child, stops it;
- ``Pool(1)``, sequential: per-call latency through one warm zygote (``--calls`` calls per repeat),
  and the part of it spent in the zygote (the Result's ``wall_s``: fork, limits, guards, snippet,
  clean-up; the rest is the trainer-side round trip);
- ``Pool(workers).map``: throughput in snippets/s over ``--snippets`` snippets, and ``Pool(1).map``
  for comparison;
- starting a ``Pool(workers)`` (the zygotes' start-up, paid once);
- per launcher that works here (``agentic_rl.jail``: bubblewrap, util-linux unshare, nothing), and
  for ``--before FILE`` (a ``sandbox.py`` of an earlier commit, e.g. ``git show
  COMMIT:src/agentic_rl/sandbox.py > /tmp/sandbox_before.py``): the per-call cost, with the calls
  to each taken in turn so that a loaded machine weighs on all alike, and a Pool(1)'s start-up;
- the reliability review's head-of-line scenario: 50 requests at once on ``Pool(2)``, every fifth
  a busy loop (1 s deadline): the harmless ones' latency, on a fresh pool and on the same pool
  again.

Every figure is the median over ``--repeats`` repeats after one warm-up (latencies: the median call
of each repeat, then the median of those; interleaved calls: the median of all). Prints a table;
writes nothing.

``--smoke``: a few-second check that the whole script runs (1 repeat, 2 calls, 4 snippets, the
head-of-line scenario cut to 10 requests with a 0.2 s deadline); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings

try:
    import agentic_rl  # noqa: F401
except ImportError:  # not installed: use the checkout's src/ (src layout)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "src"))

from agentic_rl import sandbox


def machine_info() -> dict:
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as fh:
            lines = (line for line in fh if line.startswith("model name"))
            cpu_model = next((line.split(":", 1)[1].strip() for line in lines), None)
    except OSError:
        pass
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpu_model": cpu_model or platform.processor() or "unknown CPU",
        "cpu_count": os.cpu_count(),
        "isolation": sandbox.isolation(),
        "loadavg_start": os.getloadavg(),
    }


def median_of(repeats: int, measure) -> float:
    """Median of ``measure()`` over ``repeats`` calls, after one warm-up call."""
    measure()
    return statistics.median(measure() for _ in range(repeats))


def per_call_ms(pool, codes, repeats: int) -> float:
    """Median latency of one sequential ``pool.run`` (median call of each repeat, then the median
    over repeats)."""

    def sequential() -> float:
        times = []
        for code in codes:
            start = time.perf_counter()
            assert pool.run(code).ok
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return median_of(repeats, sequential)


def launcher_rows(args, codes) -> list:
    """Each launcher that works here (agentic_rl.jail: bubblewrap, util-linux unshare, nothing;
    with and without a user namespace), and ``--before`` (a sandbox.py from an earlier commit):
    per-call cost with the calls interleaved (one Pool(1) each, a call to each in turn, so that
    the machine's load falls on all alike), and the start-up of a Pool(1)."""
    jail = getattr(sandbox, "jail", None)
    if jail is None:  # a sandbox from before the launchers
        return []
    chosen = [c for c in jail.candidates() if jail.works(c)]
    chosen.append(jail.Launcher("none", jail._layers("none", False), os.geteuid() == 0))
    pools, starts, original = {}, {}, jail.launcher
    # The weaker launchers run without a kernel boundary: fine for this script's own snippets,
    # which is the opt-in the sandbox asks for (allow_uncontained).
    weak = dict(allow_uncontained=True) if hasattr(jail, "require_boundary") else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for launcher in chosen:
                jail.launcher = lambda launcher=launcher: launcher
                name = launcher.kind + (" in a user namespace" if launcher.userns else "")
                start = lambda: timed(lambda: sandbox.Pool(1, **weak).close())  # noqa: E731
                starts[name] = median_of(args.repeats, start)
                pools[name] = sandbox.Pool(1, **weak)
    finally:
        jail.launcher = original
    if args.before:
        spec = importlib.util.spec_from_file_location("sandbox_before", args.before)
        before = sys.modules["sandbox_before"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        pools["--before"] = before.Pool(1)
        starts["--before"] = median_of(args.repeats, lambda: timed(lambda: before.Pool(1).close()))
    times = {name: [] for name in pools}
    for code in codes[: args.calls] * args.repeats:
        for name, pool in pools.items():
            times[name].append(timed(lambda: pool.run(code)))
    for pool in pools.values():
        pool.close()
    rows = []
    for name in pools:
        per_call = statistics.median(times[name])
        rows.append((f"{name}: Pool(1).run() per call, interleaved", per_call, "ms"))
        rows.append((f"{name}: Pool(1) start-up + close", starts[name], "ms"))
    return rows


def mixed_rows(args, requests: int = 50, timeout_s: float = 1.0) -> list:
    """The reliability review's head-of-line scenario: 50 requests at once on Pool(2), every fifth
    a busy loop (1 s deadline); latency of the 40 harmless ones, on a fresh pool and again."""
    codes = ["while True: pass" if i % 5 == 2 else f"print({i} * {i})" for i in range(requests)]
    busy = sum("while" in code for code in codes)
    rows = []
    with sandbox.Pool(2, timeout_s=timeout_s) as pool:
        pool.map(["pass"] * 2)
        for round_ in ("fresh pool", "second round"):
            done, lock, start = {}, threading.Lock(), time.monotonic()

            def one(i: int) -> None:
                pool.run(codes[i])
                with lock:
                    done[i] = time.monotonic() - start

            threads = [threading.Thread(target=one, args=(i,)) for i in range(requests)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            harmless = sorted(done[i] for i in range(requests) if "while" not in codes[i])
            p50, p95 = harmless[len(harmless) // 2], harmless[int(0.95 * len(harmless))]
            mix = f"{busy} busy loops among {requests}, {round_}"
            rows.append((f"{mix}: harmless p50", p50, "ms"))
            rows.append((f"{mix}: harmless p95", p95, "ms"))
    return rows


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--calls", type=int, default=200, help="sequential Pool(1) calls per repeat [200]"
    )
    p.add_argument("--snippets", type=int, default=200, help="snippets per map() call [200]")
    p.add_argument("--one-offs", type=int, default=10, help="run() calls per repeat [10]")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats after 1 warm-up [5]")
    p.add_argument("--workers", type=int, default=2, help="workers for the map() figure [2]")
    p.add_argument("--no-launchers", action="store_true", help="skip the per-launcher rows")
    p.add_argument("--before", help="a sandbox.py of an earlier commit, for the launcher rows")
    p.add_argument("--no-mixed", action="store_true", help="skip the busy-loop mix")
    p.add_argument("--smoke", action="store_true",
                   help="a few-second check that the script runs: 1 repeat, 2 calls, 4 snippets, "
                        "10 requests in the busy-loop mix (figures mean nothing)")
    args = p.parse_args(argv)
    mix = {}
    if args.smoke:
        args.calls, args.snippets, args.one_offs, args.repeats = 2, 4, 1, 1
        mix = dict(requests=10, timeout_s=0.2)
    info = machine_info()
    codes = [f"print({i} * {i})" for i in range(args.snippets)]

    def interpreter() -> float:
        cmd = [sys.executable, "-I", "-S", "-c", "print(6 * 7)"]
        return statistics.median(
            timed(lambda: subprocess.run(cmd, capture_output=True, env={}, check=True))
            for _ in range(args.one_offs)
        )

    def one_off() -> float:
        return statistics.median(
            timed(lambda: sandbox.run("print(6 * 7)")) for _ in range(args.one_offs)
        )

    rows = [
        ("fresh interpreter (subprocess, no sandbox)", median_of(args.repeats, interpreter), "ms"),
        ("sandbox.run() (zygote start-up + one call)", median_of(args.repeats, one_off), "ms"),
    ]
    with sandbox.Pool(1) as pool:
        inside = []

        def sequential() -> float:
            times = []
            for code in codes[: args.calls]:
                start = time.perf_counter()
                result = pool.run(code)
                times.append(time.perf_counter() - start)
                inside.append(result.wall_s)
                assert result.ok, result
            return statistics.median(times)

        rows.append(
            ("Pool(1).run(), sequential: per call", median_of(args.repeats, sequential), "ms")
        )
        rows.append(
            ("  of which inside the zygote (Result.wall_s)", statistics.median(inside), "ms")
        )

        def map_one() -> float:
            return timed(lambda: pool.map(codes))

        rows.append(
            ("Pool(1).map(): snippets/s", args.snippets / median_of(args.repeats, map_one), "/s")
        )
    with sandbox.Pool(args.workers) as pool:

        def map_many() -> float:
            return timed(lambda: pool.map(codes))

        rate = args.snippets / median_of(args.repeats, map_many)
        rows.append((f"Pool({args.workers}).map(): snippets/s", rate, "/s"))

    def start_pool() -> float:
        return timed(lambda: sandbox.Pool(args.workers).close())

    rows.append(
        (f"Pool({args.workers}) start-up + close", median_of(args.repeats, start_pool), "ms")
    )
    if not args.no_launchers:
        rows += launcher_rows(args, codes)
    if not args.no_mixed:
        rows += mixed_rows(args, **mix)
    assert "torch" not in sys.modules, "the sandbox benchmark must not import torch"
    info["loadavg_end"] = os.getloadavg()

    print(
        f"\n{info['cpu_model']}, {info['cpu_count']} CPUs, Python {info['python']}, {info['date']};"
        f" load average {info['loadavg_start'][0]:.2f} -> {info['loadavg_end'][0]:.2f} (1 min)\n"
        f"isolation: {info['isolation']}\n"
        f"medians of {args.repeats} repeats after 1 warm-up; {args.snippets} snippets per map(), "
        f"{args.calls} sequential calls, {args.one_offs} run() calls per repeat\n"
    )
    print("| measurement | median |\n|---|---:|")
    for name, value, unit in rows:
        shown = f"{value * 1e3:,.1f} ms" if unit == "ms" else f"{value:,.0f} snippets/s"
        print(f"| {name} | {shown} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
