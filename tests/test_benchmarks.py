"""Benchmarks that cannot rot: every script in ``benchmarks/`` runs its ``--smoke`` check.

A smoke run takes the script's real code path end to end at its tiniest size (one repeat, one tiny
step, the smallest model its configs accept) in a few seconds, writes nothing into the checkout
and exits 0. A method renamed in the package, a config field removed, a recipe added that a
benchmark cannot build: the script's smoke run fails here, not months later on the day someone
wants the figures. Its figures mean nothing.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
#: Scripts without a smoke run, each with its reason (none: keep it so).
WITHOUT_SMOKE: dict[str, str] = {}
SCRIPTS = [
    "bench_agent_llm.py",
    "bench_fast_path.py",
    "bench_gcd.py",
    "bench_gigpo.py",
    "bench_grpo.py",
    "bench_multiturn.py",
    "bench_pretrained.py",
    "bench_rcgrpo.py",
    "bench_sandbox.py",
    "bench_starpo.py",
    "bench_vs_trl.py",
    "isa_equality.py",
    "profile_step.py",
]
TIMEOUT_S = 120


def test_every_benchmark_script_has_a_smoke_run():
    found = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in WITHOUT_SMOKE)
    missing = sorted(set(found) - set(SCRIPTS))
    gone = sorted(set(SCRIPTS) - set(found))
    assert not missing, f"add a --smoke run to these scripts and list them in SCRIPTS: {missing}"
    assert not gone, f"these scripts are listed in SCRIPTS but no longer exist: {gone}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_smoke_run(script):
    env = dict(
        os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        PYTHONDONTWRITEBYTECODE="1",
    )  # fmt: skip
    before = _untracked()
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(BENCHMARKS / script), "--smoke"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        tail = _tail(err.stderr)
        pytest.fail(f"{script} --smoke ran over {TIMEOUT_S} s; stderr ends with:\n{tail}")
    wall = time.perf_counter() - start
    print(f"{script} --smoke: {wall:.1f} s")
    assert proc.returncode == 0, (
        f"{script} --smoke exited with {proc.returncode} after {wall:.1f} s; stderr ends with:\n"
        f"{_tail(proc.stderr)}"
    )
    written = sorted(_untracked() - before)
    assert not written, f"{script} --smoke wrote into the checkout: {written}"


def _tail(text, lines: int = 40) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").splitlines()[-lines:])


def _untracked() -> set[str]:
    """The checkout's untracked files that git does not ignore (none where git is missing): a
    smoke run writes its files to a temporary folder, never here. ``GIT_OPTIONAL_LOCKS=0``: the
    look leaves git's index alone."""
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        proc = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if proc.returncode != 0:
        return set()
    return {line[3:] for line in proc.stdout.splitlines() if line.startswith("?? ")}
