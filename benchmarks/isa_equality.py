"""Can a common instruction set make CPU runs bit-identical across CPU kinds? A measurement.

Runs one recorded cell (a lab's arm on one seed) twice in fresh single-threaded processes: with
the CPU's own kernels, and with every library told to use AVX2 only (the environment variables
below, which torch's ATen, MKL and oneDNN read at start-up). Prints each run's checked metrics
next to the record's, and writes both cells to --out, so that the same command on another CPU
kind gives files to compare (``cmp`` or ``diff``). Adopting the forced ISA in ``utils.setup`` and
``.ci/run`` would only make sense if the forced runs were equal on both kinds.

    python benchmarks/isa_equality.py --lab gigpo --seed 0 --arm "GiGPO long" --out runs/isa

``--smoke``: a check that the whole script runs in seconds: both processes run the cell as the
command line does (``records.run_cells``, the cell written as JSON) with the lab's config cut to
one SFT step and one RL step of the smallest tiny model on a 2 x 2 batch (``smoke_fields``), and
write to a temporary folder unless ``--out`` is given. Such a cell is not the record's: it is
printed as not equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FORCED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}

#: What ``python -m agentic_rl experiment LAB --seed S --arm A --output FILE.json`` does, with
#: config overrides (which the command line does not take): argv is lab, seed, arm, file, JSON.
CELL_WITH_OVERRIDES = (
    "import json, sys\n"
    "from agentic_rl import records\n"
    "lab, seed, arm, path, overrides = sys.argv[1:]\n"
    "cells, _ = records.run_cells(lab, int(seed), [arm], profile='quick', device='cpu',\n"
    "                             **json.loads(overrides))\n"
    "with open(path, 'w') as fh:\n"
    "    json.dump(cells[arm], fh, indent=1)\n"
)


def smoke_fields() -> dict:
    """``--smoke``'s config fields for the lab's ``train`` (``records.run_cells`` passes them on):
    one SFT and one RL step of the smallest tiny model on a 2 x 2 batch."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_grpo import SMOKE_BATCH, SMOKE_MODEL  # (it imports torch: only here)

    return dict(SMOKE_MODEL, **SMOKE_BATCH, sft_steps=1, max_steps=1)


def cell_command(lab: str, seed: int, arm: str, path: Path, overrides: dict) -> list[str]:
    """The command that runs one cell in a fresh process and writes it to ``path``."""
    if not overrides:
        return [sys.executable, "-m", "agentic_rl", "experiment", lab, "--seed", str(seed),
                "--arm", arm, "--output", str(path)]  # fmt: skip
    args = [lab, str(seed), arm, str(path), json.dumps(overrides)]
    return [sys.executable, "-c", CELL_WITH_OVERRIDES, *args]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lab", default="gigpo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arm", default="GiGPO long")
    p.add_argument("--out", default=None, help="folder for the two cells [runs/isa]")
    p.add_argument("--smoke", action="store_true",
                   help="a check that the script runs, in seconds: the cells cut to one SFT and "
                        "one RL step of a tiny model, written to a temporary folder")
    a = p.parse_args()
    overrides = smoke_fields() if a.smoke else {}
    if a.smoke and a.out is None:
        with tempfile.TemporaryDirectory() as folder:
            measure(a, Path(folder), overrides)
    else:
        measure(a, Path(a.out or "runs/isa"), overrides)


def measure(a, out: Path, overrides: dict) -> None:
    """Both runs of the cell into ``out``, each against the record; ``overrides``: config fields
    (``--smoke``)."""
    from agentic_rl.records import experiment, load_record

    out.mkdir(parents=True, exist_ok=True)
    record = load_record(a.lab, Path(__file__).resolve().parents[1] / "labs" / "results")
    recorded = record.data["cells"][a.arm][str(a.seed)]["metrics"]
    keys = experiment(a.lab).CHECKED
    print(f"record: {record.data['provenance']['instruction_set']}")
    for name, extra in (("native", {}), ("forced-avx2", FORCED)):
        path = out / f"{a.lab}-{a.arm}-seed{a.seed}-{name}.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
        cmd = cell_command(a.lab, a.seed, a.arm, path, overrides)
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        cell = json.loads(path.read_text())
        same = all(cell["metrics"][k] == recorded[k] for k in keys)
        shown = ", ".join(f"{k} {cell['metrics'][k]:.4f}" for k in keys)
        print(f"{name:12s} {cell['provenance']['instruction_set']:22s} bit-equal to the record: "
              f"{same}; {shown}")
    print("recorded    ", ", ".join(f"{k} {recorded[k]:.4f}" for k in keys))


if __name__ == "__main__":
    main()
