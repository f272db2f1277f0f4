"""Experiments recorded once, then re-checked: arms x seeds, their record, the live replicate.

Data flows one way, runner -> record -> lab:

- :func:`run_cells` trains one seed of a lab's arms in this process (its warm starts shared, as
  the lab's own code shares them) and writes one small JSON per (arm, seed): the metrics the lab
  prints and asserts, the curves it plots, the wall time and where it ran;
- :func:`sweep` runs a lab's seeds as independent processes over ``jobs`` cores
  (``python -m agentic_rl experiment LAB``), skips the cells already written (a killed sweep
  continues where it stopped) and collects them into ``labs/results/<lab>.json``
  (:func:`collect`), stamped with its provenance (:func:`provenance`);
- :func:`load_record` gives a lab its :class:`Record`: the per-seed values, the paired
  comparisons (:mod:`agentic_rl.stats`), and :meth:`Record.check_replicate`, which compares a
  seed re-run live (in CI, on whatever machine) with the recorded one.

The replicate rule. Training on a CPU is chaotic in the last bits, which differ between
instruction sets (AVX-512 on one machine kind, AVX2 on another), so: where the instruction set
and torch version match the record's, every checked metric must equal the recorded value to the
printed digits (3 decimals); where they do not, it must fall inside the recorded distribution:
between ``min(lowest seed, mean - 4 sd)`` and ``max(highest seed, mean + 4 sd)``, with the sd
floored at the metric's resolution (0.01 unless the lab says otherwise). A code change that moves
results therefore fails, until the record is regenerated with the runner.

A lab's experiment is a module of :mod:`agentic_rl.experiments` (its docstring: the contract).
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import write_atomically
from .config import RunError
from .stats import Paired, paired

__all__ = [
    "EXPERIMENTS",
    "RecordError",
    "ReplicateError",
    "experiment",
    "instruction_set",
    "provenance",
    "source_hashes",
    "run_cells",
    "sweep",
    "collect",
    "Record",
    "load_record",
]

#: The labs with a recorded experiment: name -> module of :mod:`agentic_rl.experiments`.
EXPERIMENTS = {
    "agent_llm": "agentic_rl.experiments.agent_llm",
    "dapo": "agentic_rl.experiments.dapo",
    "early_experience": "agentic_rl.experiments.early_experience",
    "gae": "agentic_rl.experiments.gae",
    "gcd": "agentic_rl.experiments.gcd",
    "gigpo": "agentic_rl.experiments.gigpo",
    "grpo": "agentic_rl.experiments.grpo",
    "pretrained": "agentic_rl.experiments.pretrained",
    "rcgrpo": "agentic_rl.experiments.rcgrpo",
    "retool": "agentic_rl.experiments.retool",
    "starpo": "agentic_rl.experiments.starpo",
}
# A lab outside the package (a course's own) registers as AGENTIC_RL_EXPERIMENTS="name=module,...".
for _item in filter(None, os.environ.get("AGENTIC_RL_EXPERIMENTS", "").split(",")):
    _name, _, _module = _item.partition("=")
    EXPERIMENTS[_name.strip()] = _module.strip()
#: How many decimals "equal to the printed digits" compares.
DIGITS = 3
#: Modules that cannot change a number (the runner, the statistics, the command line). A package's
#: ``__init__.py`` can (``experiments/__init__.py`` measures), and so can ``plotting.py``
#: (``collapse_step`` is a metric): they are hashed, a figure-only edit there included.
_NOT_RESULTS = {"records.py", "stats.py", "cli.py", "__main__.py"}
_PACKAGE = Path(__file__).resolve().parent


class RecordError(RunError):
    """A record or a cell file that is missing, corrupt, or from another lab or another commit."""


class ReplicateError(AssertionError):
    """A live replicate that disagrees with its record."""


def experiment(lab: str):
    """The module of ``lab``'s experiment (``ARMS``, ``SEEDS``, ``REPLICATE``, ``train``...)."""
    if lab not in EXPERIMENTS:
        raise RecordError(f"unknown lab {lab!r}; labs with an experiment: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[lab])


# ------------------------------------------------------------------------------------ provenance


def _cpuinfo(field: str, default: str) -> str:
    """The first ``field`` of /proc/cpuinfo (``model name``, ``vendor_id``), else ``default``."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def _cpu_model() -> str:
    return _cpuinfo("model name", platform.processor() or platform.machine())


def _cpu_vendor() -> str:
    return _cpuinfo("vendor_id", platform.machine())


def instruction_set() -> str:
    """The CPU's vendor and the kernels torch picks for it, e.g. ``"GenuineIntel AVX512"``: what
    decides the last bits of a CPU run (with the thread count, always one here)."""
    import torch

    return f"{_cpu_vendor()} {torch.backends.cpu.get_cpu_capability()}"


def source_hashes(modules=None) -> dict[str, str]:
    """SHA-256 (16 hex digits) of each package source file loaded in this process that can change
    a result: what a record's numbers depend on."""
    names = modules if modules is not None else list(sys.modules)
    out = {}
    for name in sorted(names):
        if not name.startswith("agentic_rl"):
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        rel = Path(path).resolve().relative_to(_PACKAGE).as_posix()
        if Path(rel).name in _NOT_RESULTS:
            continue
        out[rel] = _digest(Path(path))
    return out


def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else None


def _package_digests() -> dict[str, str | None]:
    """Every package source file's digest now (a seed's modules are imported as it runs)."""
    return {p.relative_to(_PACKAGE).as_posix(): _digest(p) for p in _PACKAGE.rglob("*.py")}


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=_PACKAGE, capture_output=True,
            text=True, timeout=10, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance() -> dict:
    """Where and with what this process computes: the machine, the libraries, the date."""
    import torch
    import transformers

    return {
        "cpu_model": _cpu_model(),
        "instruction_set": instruction_set(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(),
    }


# ------------------------------------------------------------------------------------ the cells


def _cell_name(arm: str, seed: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', arm)}__seed{seed}.json"


def _check_arms(module, lab: str, arms) -> list[str]:
    arms = list(module.ARMS if arms is None else arms)
    unknown = [a for a in arms if a not in module.ARMS]
    if unknown or not arms:
        raise RecordError(
            f"lab {lab!r} has no arm {', '.join(map(repr, unknown)) or '(none given)'}; "
            f"its arms: {', '.join(module.ARMS)}"
        )
    return arms


def run_cells(
    lab: str, seed: int, arms=None, *, profile: str = "quick", device: str = "auto", **overrides
):
    """Train one seed of ``lab``'s ``arms`` here and measure them: ``{arm: cell}``, each cell
    ``{"metrics": {...}, "curves": {...}, "wall_s", "provenance"}``. Also returns the trainers
    (the lab's live replicate reuses them for its teaching cells). ``overrides``: config fields
    for a smaller run (tests)."""
    from .utils import setup

    module = experiment(lab)
    arms = _check_arms(module, lab, arms)
    if not isinstance(seed, int) or seed < 0:
        raise RecordError(f"a seed is a non-negative integer (got {seed!r})")
    if device == "auto":  # a lab's replicate: the GPU where there is one
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    setup(seed, threads=1 if device == "cpu" else None)
    at_start = _package_digests()
    t0 = time.perf_counter()
    trainers = module.train(seed, arms, profile=profile, device=device, **overrides)
    wall = (time.perf_counter() - t0) / len(arms)  # the arms share their warm start: a share each
    cells = measure_cells(lab, trainers, seed, profile=profile, device=device, wall_s=wall)
    # the digests are of the files at measuring time: the code that ran must be what they name
    source = next(iter(cells.values()))["source"]
    edited = sorted(rel for rel, digest in source.items() if at_start.get(rel) != digest)
    if edited:
        raise RecordError(
            f"{lab}, seed {seed}: package files changed while it ran ({', '.join(edited)}); "
            "its cells are not written: run it again"
        )
    return cells, trainers


def measure_cells(lab: str, trainers: dict, seed: int, *, profile: str = "quick",
                  device: str = "cpu", wall_s: float = math.nan) -> dict:
    """Cells (``{arm: cell}``, as :func:`run_cells` returns them) of trainers trained elsewhere:
    a lab whose teaching cells train the replicate's main arm themselves measures it with this."""
    module = experiment(lab)
    _check_arms(module, lab, list(trainers))
    cells = {}
    for arm, trainer in trainers.items():
        measured = module.measure(trainer, arm, seed)
        cells[arm] = {
            "lab": lab, "arm": arm, "seed": seed, "profile": profile, "device": device,
            "metrics": {k: float(v) for k, v in measured["metrics"].items()},
            "curves": {k: [float(x) for x in v] for k, v in measured.get("curves", {}).items()},
            "wall_s": round(wall_s, 1),
            "provenance": provenance(),
            "source": source_hashes(),
        }
    return cells


def _read_cell(path: Path) -> dict:
    try:
        cell = json.loads(path.read_text())
        if not isinstance(cell, dict) or not {"metrics", "arm", "seed", "lab"} <= cell.keys():
            raise ValueError("not a cell: it lacks lab, arm, seed or metrics")
    except (OSError, ValueError) as err:
        raise RecordError(
            f"{path}: a half-written or corrupt result file ({err}); delete it, or run the "
            "sweep again with --replace"
        ) from None
    return cell


def write_cells(cells: dict, folder: str | Path) -> list[Path]:
    """Write each cell atomically to ``folder/<arm>__seed<S>.json``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for arm, cell in cells.items():
        path = folder / _cell_name(arm, cell["seed"])
        write_atomically(str(path), json.dumps(cell, indent=1).encode())
        paths.append(path)
    return paths


def _manifest(lab: str, profile: str, device: str) -> dict:
    return {"lab": lab, "profile": profile, "device": device, "commit": _commit()}


def sweep(
    lab: str,
    seeds,
    arms=None,
    *,
    jobs: int = 1,
    profile: str = "quick",
    device: str = "cpu",
    work_dir: str | Path | None = None,
    record: str | Path | None = None,
    replace: bool = False,
    log=print,
) -> Path:
    """Run ``lab``'s ``arms`` x ``seeds`` as one process per seed, ``jobs`` at a time, each
    writing its cells into ``work_dir`` (default ``runs/experiments/<lab>``); skip cells already
    there; then collect them into ``record`` (default ``labs/results/<lab>.json``).

    Refused (:class:`RecordError`): an unknown lab or arm, a bad seed list, a work folder that
    holds another lab's, profile's or commit's cells (unless ``replace``), a corrupt cell."""
    module = experiment(lab)
    arms = _check_arms(module, lab, arms)
    seeds = list(seeds)
    if not seeds or any(not isinstance(s, int) or s < 0 for s in seeds) or len(set(seeds)) < len(
        seeds
    ):
        raise RecordError(f"seeds must be distinct non-negative integers (got {seeds})")
    if jobs < 1:
        raise RecordError(f"jobs must be at least 1 (got {jobs})")
    work = Path(work_dir or Path("runs") / "experiments" / lab)
    manifest_path = work / "sweep.json"
    manifest = _manifest(lab, profile, device)
    if work.exists() and replace:
        for old in work.glob("*.json"):
            old.unlink()
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        if old != manifest:
            raise RecordError(
                f"{work} holds another sweep's cells ({old}); this one is {manifest}: pass "
                "--replace to discard them, or another --work-dir"
            )
    work.mkdir(parents=True, exist_ok=True)
    write_atomically(str(manifest_path), json.dumps(manifest).encode())
    todo = _pending(work, seeds, arms)
    log(f"{lab}: {len(seeds)} seeds x {len(arms)} arms; {sum(len(m) for _, m in todo)} cells "
        f"to run, {jobs} at a time, in {work}")
    t_start = time.perf_counter()
    failed = _run_processes(lab, todo, jobs, work, profile, device, log)
    if failed:
        raise RecordError(f"seeds {failed} failed: see {work}/seed<S>.log; run again to resume")
    log(f"all cells in {time.perf_counter() - t_start:.0f} s")
    return collect(lab, work, seeds, arms, record=record)


def _pending(work: Path, seeds, arms) -> list[tuple[int, list[str]]]:
    """(seed, its arms without a cell file yet); a corrupt cell file stops the sweep here."""
    todo = []
    for seed in seeds:
        missing = [a for a in arms if not (work / _cell_name(a, seed)).exists()]
        for a in arms:
            if a not in missing:
                _read_cell(work / _cell_name(a, seed))
        if missing:
            todo.append((seed, missing))
    return todo


def _run_processes(lab, todo, jobs, work: Path, profile, device, log) -> list[int]:
    """One ``python -m agentic_rl experiment LAB --seed S`` process per seed, ``jobs`` at a time,
    each single-threaded; returns the seeds whose process failed."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    todo, running, failed = list(todo), [], []
    while todo or running:
        while todo and len(running) < jobs:
            seed, missing = todo.pop(0)
            cmd = [sys.executable, "-m", "agentic_rl", "experiment", lab, "--seed", str(seed),
                   *(f"--arm={arm}" for arm in missing), "--profile", profile, "--device",
                   device, "--output", str(work)]
            with open(work / f"seed{seed}.log", "w") as logf:
                proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT)
            running.append((proc, seed, time.perf_counter()))
        time.sleep(0.5)
        for item in list(running):
            proc, seed, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            log(f"  seed {seed}: {status} in {time.perf_counter() - t0:.0f} s")
            if proc.returncode:
                failed.append(seed)
    return failed


def collect(lab: str, work_dir, seeds, arms, *, record=None) -> Path:
    """Gather a sweep's cells into one record, ``labs/results/<lab>.json`` by default. The cells
    must agree on the instruction set, the profile and the source they ran."""
    work = Path(work_dir)
    manifest = json.loads((work / "sweep.json").read_text())
    cells = {a: {} for a in arms}
    for arm in arms:
        for seed in seeds:
            cells[arm][str(seed)] = _read_cell(work / _cell_name(arm, seed))
    every = [c for per_arm in cells.values() for c in per_arm.values()]
    for key in ("instruction_set", "torch"):
        values = {c["provenance"][key] for c in every}
        if len(values) > 1:
            raise RecordError(f"the cells in {work} ran with different {key}: {sorted(values)}")
    sources = {json.dumps(c["source"], sort_keys=True) for c in every}
    if len(sources) > 1:
        raise RecordError(f"the cells in {work} ran different package sources: run them again")
    first = every[0]
    out = {
        "lab": lab,
        "profile": manifest["profile"],
        "device": manifest["device"],
        "arms": list(arms),
        "seeds": list(seeds),
        "provenance": dict(
            first["provenance"],
            commit=manifest["commit"],
            source=first["source"],
            cpu_minutes=round(sum(c["wall_s"] for c in every) / 60, 1),
        ),
        "cells": {
            arm: {
                s: {k: c[k] for k in ("metrics", "curves", "wall_s")} for s, c in per.items()
            }
            for arm, per in cells.items()
        },
    }
    path = Path(record or Path("labs") / "results" / f"{lab}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(str(path), (json.dumps(out, indent=1) + "\n").encode())
    return path


# ------------------------------------------------------------------------------------ the record


@dataclass
class Record:
    """One lab's recorded experiment (``labs/results/<lab>.json``)."""

    path: Path
    data: dict

    @property
    def lab(self) -> str:
        return self.data["lab"]

    @property
    def seeds(self) -> list[int]:
        return list(self.data["seeds"])

    @property
    def arms(self) -> list[str]:
        return list(self.data["arms"])

    @property
    def n(self) -> int:
        return len(self.data["seeds"])

    def values(self, arm: str, key: str) -> list[float]:
        """``key`` of ``arm`` on every recorded seed, in seed order; NaN on a seed that did not
        measure it (an AUROC where one class was absent), an error where no seed did."""
        if arm not in self.data["cells"]:
            raise RecordError(f"{self.path}: no arm {arm!r} (arms: {', '.join(self.arms)})")
        cells = [self.data["cells"][arm][str(s)]["metrics"] for s in self.seeds]
        if not any(key in c for c in cells):
            raise RecordError(f"{self.path}: arm {arm!r} has no metric {key!r}")
        return [c.get(key, math.nan) for c in cells]

    def mean(self, arm: str, key: str) -> float:
        return statistics.mean(self.values(arm, key))

    def paired(self, arm_a: str, arm_b: str, key: str, key_b: str | None = None) -> Paired:
        """``arm_b``'s ``key_b`` (default ``key``) minus ``arm_a``'s ``key``, per seed."""
        return paired(self.values(arm_a, key), self.values(arm_b, key_b or key))

    def histories(self, arm: str, keys) -> list[list[dict]]:
        """``arm``'s recorded curves as one history per seed (rows with ``step``), for plots."""
        out = []
        for s in self.seeds:
            curves = self.data["cells"][arm][str(s)]["curves"]
            n = len(curves[keys[0]])
            out.append([{"step": i + 1, **{k: curves[k][i] for k in keys}} for i in range(n)])
        return out

    def describe(self) -> str:
        """One line: what the record holds and where it was made."""
        p = self.data["provenance"]
        return (
            f"{self.path.name}: {len(self.arms)} arms x {self.n} seeds ({self.data['profile']} "
            f"profile), made {p['date']} on {p['cpu_model']} ({p['instruction_set']}, "
            f"{p['threads']} thread), torch {p['torch']}, commit {p['commit']}, "
            f"{p['cpu_minutes']} CPU-minutes"
        )

    def stale(self) -> list[str]:
        """The package files the record's numbers depend on that changed since it was made."""
        recorded = self.data["provenance"]["source"]
        changed = []
        for rel, digest in recorded.items():
            path = _PACKAGE / rel
            if _digest(path) != digest:
                changed.append(rel)
        return changed

    def interval(self, arm: str, key: str, floor: float = 0.01) -> tuple[float, float]:
        """Where a replicate on another instruction set must fall (the module's rule)."""
        v = self.values(arm, key)
        m, sd = statistics.mean(v), max(statistics.stdev(v) if len(v) > 1 else 0.0, floor)
        return min(min(v), m - 4 * sd), max(max(v), m + 4 * sd)

    def check_replicate(self, cells: dict, keys, *, floors: dict | None = None, log=print) -> bool:
        """Compare a live replicate (``{arm: cell}`` from :func:`run_cells`) with the record's
        cells of the same seed, on ``keys``; raise :class:`ReplicateError` naming every metric
        that disagrees. Returns whether the comparison was exact (same instruction set)."""
        floors = floors or {}
        mine = provenance()
        p = self.data["provenance"]
        exact = mine["instruction_set"] == p["instruction_set"] and mine["torch"] == p["torch"]
        bad = []
        for arm, cell in cells.items():
            seed = str(cell["seed"])
            if seed not in self.data["cells"].get(arm, {}):
                raise RecordError(f"{self.path}: no recorded seed {seed} of arm {arm!r}")
            recorded = self.data["cells"][arm][seed]["metrics"]
            for key in keys:
                if key not in cell["metrics"] and key not in recorded:
                    continue  # a metric this arm does not measure (another environment's)
                if key not in cell["metrics"] or key not in recorded:
                    where = "the live replicate" if key in recorded else "the record"
                    bad.append(f"{arm} seed {seed} {key}: not measured by {where}")
                    continue
                live = cell["metrics"][key]
                if exact:
                    ok = f"{live:.{DIGITS}f}" == f"{recorded[key]:.{DIGITS}f}"
                    rule = f"recorded {recorded[key]:.{DIGITS}f}"
                else:
                    lo, hi = self.interval(arm, key, floors.get(key, 0.01))
                    ok = lo <= live <= hi
                    rule = f"recorded seeds allow {lo:.3f} to {hi:.3f}"
                if not ok or not math.isfinite(live):
                    bad.append(f"{arm} seed {seed} {key}: live {live:.{DIGITS}f}, {rule}")
        how = (
            f"the record's instruction set ({p['instruction_set']}): equal to {DIGITS} decimals"
            if exact
            else f"another instruction set than the record's ({mine['instruction_set']} here, "
            f"{p['instruction_set']} recorded): inside the recorded distribution"
        )
        n_checked = sum(
            1 for arm, c in cells.items() for k in keys
            if k in c["metrics"] or k in self.data["cells"][arm][str(c["seed"])]["metrics"]
        )
        if bad:
            raise ReplicateError(
                f"the live replicate disagrees with {self.path.name} on {len(bad)} of "
                f"{n_checked} metrics ({how}):\n  " + "\n  ".join(bad)
                + "\nA code change moved the results: regenerate the record with "
                f"`python -m agentic_rl experiment {self.lab}`."
            )
        log(f"live replicate: {n_checked} metrics agree with the record; {how}")
        return exact


def load_record(lab: str, folder: str | Path | None = None) -> Record:
    """``lab``'s record: ``<folder>/<lab>.json``, by default from ``results/`` (a lab's own
    folder) or ``labs/results/`` (the repository root). A missing or corrupt record stops with
    one line naming the file."""
    candidates = (
        [Path(folder) / f"{lab}.json"]
        if folder
        else [Path("results") / f"{lab}.json", Path("labs") / "results" / f"{lab}.json"]
    )
    path = next((p for p in candidates if p.exists()), candidates[0])
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("lab") != lab:
            raise ValueError(f"it is not the record of lab {lab!r}")
        for key in ("seeds", "arms", "cells", "provenance", "profile"):
            if key not in data:
                raise ValueError(f"it has no {key!r}")
        for arm in data["arms"]:
            for s in data["seeds"]:
                if "metrics" not in data["cells"].get(arm, {}).get(str(s), {}):
                    raise ValueError(f"it has no cell for arm {arm!r}, seed {s}")
    except FileNotFoundError:
        raise RecordError(
            f"{path}: no record of lab {lab!r}; make it with `python -m agentic_rl experiment "
            f"{lab}`, or fetch labs/results/{lab}.json from the repository"
        ) from None
    except ValueError as err:
        raise RecordError(f"{path}: a corrupt record ({err})") from None
    return Record(path, data)
