"""Can a common instruction set make CPU runs bit-identical across CPU kinds? A measurement.

Runs one recorded cell (a lab's arm on one seed) twice in fresh single-threaded processes: with
the CPU's own kernels, and with every library told to use AVX2 only (the environment variables
below, which torch's ATen, MKL and oneDNN read at start-up). Prints each run's checked metrics
next to the record's, and writes both cells to --out, so that the same command on another CPU
kind gives files to compare (``cmp`` or ``diff``). Adopting the forced ISA in ``utils.setup`` and
``.ci/run`` would only make sense if the forced runs were equal on both kinds.

    python benchmarks/isa_equality.py --lab gigpo --seed 0 --arm GiGPO --out runs/isa
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

FORCED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lab", default="gigpo")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arm", default="GiGPO")
    p.add_argument("--out", default="runs/isa")
    a = p.parse_args()
    from agentic_rl.records import experiment, load_record

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    record = load_record(a.lab, Path(__file__).resolve().parents[1] / "labs" / "results")
    recorded = record.data["cells"][a.arm][str(a.seed)]["metrics"]
    keys = experiment(a.lab).CHECKED
    print(f"record: {record.data['provenance']['instruction_set']}")
    for name, extra in (("native", {}), ("forced-avx2", FORCED)):
        path = out / f"{a.lab}-{a.arm}-seed{a.seed}-{name}.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
        cmd = [sys.executable, "-m", "agentic_rl", "experiment", a.lab, "--seed", str(a.seed),
               "--arm", a.arm, "--output", str(path)]
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        cell = json.loads(path.read_text())
        same = all(cell["metrics"][k] == recorded[k] for k in keys)
        shown = ", ".join(f"{k} {cell['metrics'][k]:.4f}" for k in keys)
        print(f"{name:12s} {cell['provenance']['instruction_set']:22s} bit-equal to the record: "
              f"{same}; {shown}")
    print("recorded    ", ", ".join(f"{k} {recorded[k]:.4f}" for k in keys))


if __name__ == "__main__":
    main()
