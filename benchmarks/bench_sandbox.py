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
- starting a ``Pool(workers)`` (the zygotes' start-up, paid once).

Every figure is the median over ``--repeats`` repeats after one warm-up (latencies: the median call
of each repeat, then the median of those). Prints a table; writes nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--calls", type=int, default=200, help="sequential Pool(1) calls per repeat [200]"
    )
    p.add_argument("--snippets", type=int, default=200, help="snippets per map() call [200]")
    p.add_argument("--one-offs", type=int, default=10, help="run() calls per repeat [10]")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats after 1 warm-up [5]")
    p.add_argument("--workers", type=int, default=2, help="workers for the map() figure [2]")
    args = p.parse_args(argv)
    info = machine_info()
    codes = [f"print({i} * {i})" for i in range(args.snippets)]

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

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
