"""Recorded experiments: the statistics, the runner's refusals and resumption, the record, and the
live-replicate rule (same instruction set: equal digits; another: inside the recorded spread)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

from agentic_rl import records
from agentic_rl.records import Record, RecordError, ReplicateError, load_record
from agentic_rl.stats import mde, paired, seeds_needed, t_quantile

# ------------------------------------------------------------------------------------ statistics


@pytest.mark.parametrize(
    "p, df, expected",  # from any t table
    [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 7, 2.3646), (0.975, 9, 2.2622),
     (0.975, 30, 2.0423), (0.8, 7, 0.8960), (0.8, 9, 0.8834), (0.995, 4, 4.6041)],
)
def test_t_quantile_matches_the_table(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-4)


def test_t_quantile_refuses_what_it_cannot_compute():
    for p, df in ((0.4, 5), (1.0, 5), (0.9, 0)):
        with pytest.raises(ValueError, match="t_quantile"):
            t_quantile(p, df)


def test_paired_differences_by_hand():
    a, b = [0.5, 0.6, 0.7, 0.4], [0.6, 0.6, 0.9, 0.5]
    p = paired(a, b)
    d = [0.1, 0.0, 0.2, 0.1]
    assert p.diffs == pytest.approx(d) and p.mean == pytest.approx(0.1)
    sd = math.sqrt(sum((x - 0.1) ** 2 for x in d) / 3)
    assert p.sd == pytest.approx(sd) and p.se == pytest.approx(sd / 2)
    half = 3.1824 * sd / 2  # t(0.975, 3)
    assert (p.low, p.high) == pytest.approx((0.1 - half, 0.1 + half), abs=1e-4)
    assert p.mde == pytest.approx((3.1824 + 0.9785) * sd / 2, abs=1e-4)
    assert p.excludes_zero() == (p.low > 0)
    assert "MDE" in str(p) and "n = 4" in str(p)


def test_paired_refuses_unpaired_or_single_seeds():
    with pytest.raises(ValueError, match="3 and 2 seeds"):
        paired([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2"):
        paired([1], [2])


def test_the_mde_shrinks_with_seeds_and_seeds_needed_reaches_it():
    assert mde(0.03, 3) > mde(0.03, 8) > mde(0.03, 20)
    assert mde(0.03, 1) == math.inf
    n = seeds_needed(0.03, 0.04)
    assert mde(0.03, n) <= 0.04 < mde(0.03, n - 1)
    with pytest.raises(ValueError, match="positive"):
        seeds_needed(0.03, 0.0)


# ------------------------------------------------------------------------------------ a fake lab

FAKE = textwrap.dedent(
    """
    import os, time
    ARMS = {"a": {}, "b, bonus": {"bonus": 0.25}}  # an arm name may hold a comma
    SEEDS = 3
    REPLICATE = ("a", "b, bonus")
    CHECKED = ("score",)
    FLOORS = {}

    class Trained:
        def __init__(self, seed, bonus):
            self.seed, self.bonus = seed, bonus

    def train(seed, arms, *, profile="quick", device="cpu", **overrides):
        if os.environ.get("FAKE_LAB_FAIL") == str(seed):
            raise SystemExit(3)
        return {arm: Trained(seed, ARMS[arm].get("bonus", 0.0)) for arm in arms}

    def measure(trainer, arm, seed):
        score = 0.1 * (seed % 3) + trainer.bonus
        return {"metrics": {"score": score, "seed_twice": 2 * seed},
                "curves": {"score": [0.0, score / 2, score]}}
    """
)


@pytest.fixture
def fake_lab(tmp_path, monkeypatch):
    """A lab named "fake" whose cells are arithmetic: the runner's machinery, without training."""
    (tmp_path / "fake_lab_module.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("AGENTIC_RL_EXPERIMENTS", "fake=fake_lab_module")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(records.EXPERIMENTS, "fake", "fake_lab_module")
    return tmp_path


def _sweep(tmp_path, **kw):
    lines = []
    path = records.sweep("fake", kw.pop("seeds", range(3)), jobs=kw.pop("jobs", 2),
                         work_dir=tmp_path / "work", record=tmp_path / "fake.json",
                         log=lines.append, **kw)
    return path, lines


def test_sweep_runs_every_cell_in_parallel_and_records_provenance(fake_lab):
    path, lines = _sweep(fake_lab)
    assert "6 cells to run, 2 at a time" in lines[0]
    rec = load_record("fake", fake_lab)
    assert rec.path == path and rec.n == 3 and rec.arms == ["a", "b, bonus"]
    assert rec.values("a", "score") == pytest.approx([0.0, 0.1, 0.2])
    assert rec.paired("a", "b, bonus", "score").mean == pytest.approx(0.25)
    prov = rec.data["provenance"]
    for key in ("commit", "cpu_model", "instruction_set", "torch", "transformers", "date",
                "source"):
        assert prov[key], key
    assert rec.histories("b, bonus", ["score"])[1] == [
        {"step": 1, "score": 0.0}, {"step": 2, "score": 0.175}, {"step": 3, "score": 0.35}]
    assert "2 arms x 3 seeds" in rec.describe()


def test_a_killed_sweep_resumes_where_it_stopped(fake_lab, monkeypatch):
    monkeypatch.setenv("FAKE_LAB_FAIL", "1")  # seed 1's process dies
    with pytest.raises(RecordError, match=r"seeds \[1\] failed"):
        _sweep(fake_lab)
    monkeypatch.delenv("FAKE_LAB_FAIL")
    _, lines = _sweep(fake_lab)
    assert "2 cells to run" in lines[0]  # only seed 1's two cells were left


def test_the_runner_refuses_bad_input(fake_lab):
    with pytest.raises(RecordError, match="unknown lab 'nope'"):
        records.sweep("nope", range(2))
    with pytest.raises(RecordError, match="no arm 'c'"):
        _sweep(fake_lab, arms=["a", "c"])
    for seeds in ([], [0, 0], [-1], ["x"]):
        with pytest.raises(RecordError, match="seeds must be"):
            _sweep(fake_lab, seeds=seeds)
    with pytest.raises(RecordError, match="jobs"):
        _sweep(fake_lab, jobs=0)


def test_the_runner_refuses_another_sweeps_folder_unless_told(fake_lab):
    _sweep(fake_lab)
    manifest = fake_lab / "work" / "sweep.json"
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), commit="0123abcd")))
    with pytest.raises(RecordError, match="another sweep's cells.*--replace"):
        _sweep(fake_lab)
    _, lines = _sweep(fake_lab, replace=True)
    assert "6 cells to run" in lines[0]


def test_a_half_written_cell_is_named(fake_lab):
    _sweep(fake_lab)
    cell = fake_lab / "work" / "b_bonus__seed2.json"
    cell.write_text(cell.read_text()[:40])
    with pytest.raises(RecordError, match=r"b_bonus__seed2.json: a half-written or corrupt"):
        _sweep(fake_lab)


def test_the_command_line_runs_one_cell_and_refuses_bad_labs(fake_lab):
    env = dict(os.environ)
    out = fake_lab / "cell.json"
    cmd = [sys.executable, "-m", "agentic_rl", "experiment"]
    r = subprocess.run([*cmd, "fake", "--seed", "2", "--arm", "b, bonus", "--output", str(out)],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["metrics"]["score"] == pytest.approx(0.45)
    for args, message in (
        (["nope"], "unknown lab 'nope'"),
        (["fake", "--arms", "z"], "no arm 'z'"),
        (["fake", "--seed", "1"], "--seed needs --output"),
        (["fake", "--seed", "1", "--output", "x.json"], "one cell: give one --arm"),
        (["fake", "--jobs", "many"], "jobs"),
    ):
        r = subprocess.run([*cmd, *args], env=env, capture_output=True, text=True)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, args


# ------------------------------------------------------------------------------------ the record


def test_a_missing_or_corrupt_record_fails_with_one_line_naming_the_file(tmp_path):
    with pytest.raises(RecordError, match=r"nope.json: no record of lab 'nope'"):
        load_record("nope", tmp_path)
    (tmp_path / "bad.json").write_text('{"lab": "bad", "seeds": [0')
    with pytest.raises(RecordError, match=r"bad.json: a corrupt record") as err:
        load_record("bad", tmp_path)
    assert "\n" not in str(err.value)
    (tmp_path / "other.json").write_text(json.dumps({"lab": "gigpo"}))
    with pytest.raises(RecordError, match="not the record of lab 'other'"):
        load_record("other", tmp_path)


def _record(isa: str, torch_version: str, scores=(0.50, 0.55, 0.60, 0.52)) -> Record:
    cells = {"a": {str(s): {"metrics": {"score": v}, "curves": {}, "wall_s": 1.0}
                   for s, v in enumerate(scores)}}
    prov = dict(records.provenance(), instruction_set=isa, torch=torch_version, commit="x",
                source={}, cpu_minutes=0.1)
    data = dict(lab="fake", profile="quick", device="cpu", arms=["a"],
                seeds=list(range(len(scores))), provenance=prov, cells=cells)
    return Record(records.Path("fake.json"), data)


def _live(score: float, seed: int = 0) -> dict:
    return {"a": {"seed": seed, "metrics": {"score": score}}}


def test_a_replicate_on_the_records_instruction_set_must_equal_it_to_the_printed_digits():
    import torch

    rec = _record(records.instruction_set(), torch.__version__)
    assert rec.check_replicate(_live(0.5000004), ["score"], log=lambda *_: None) is True
    with pytest.raises(ReplicateError, match=r"live 0\.501, recorded 0\.500"):
        rec.check_replicate(_live(0.501), ["score"])


def test_a_replicate_on_another_instruction_set_must_fall_inside_the_recorded_spread():
    import torch

    rec = _record("AuthenticAMD AVX2-fake", torch.__version__)  # not this machine
    lo, hi = rec.interval("a", "score")
    v = [0.50, 0.55, 0.60, 0.52]
    m = sum(v) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / 3)
    assert (lo, hi) == pytest.approx((m - 4 * sd, m + 4 * sd))
    seen = []
    assert rec.check_replicate(_live(0.45), ["score"], log=seen.append) is False
    assert "another instruction set" in seen[0]
    with pytest.raises(ReplicateError, match="allow") as err:
        rec.check_replicate(_live(m + 4.1 * sd), ["score"])
    assert "python -m agentic_rl experiment fake" in str(err.value)
    flat = _record("AuthenticAMD AVX2-fake", torch.__version__, scores=(1.0, 1.0, 1.0, 1.0))
    flat.check_replicate(_live(0.97), ["score"], log=lambda *_: None)  # sd floored at 0.01
    with pytest.raises(ReplicateError):
        flat.check_replicate(_live(0.95), ["score"])
    with pytest.raises(ReplicateError, match="nan"):
        rec.check_replicate(_live(float("nan")), ["score"])


def test_a_metric_an_arm_does_not_measure_is_skipped_and_one_it_lost_is_named():
    import torch

    rec = _record(records.instruction_set(), torch.__version__)
    seen = []
    assert rec.check_replicate(_live(0.5), ["score", "other_env_only"], log=seen.append)
    assert "1 metrics agree" in seen[0]  # measured by neither: not this arm's metric
    with pytest.raises(ReplicateError, match="other_env_only: not measured by the record"):
        live = _live(0.5)
        live["a"]["metrics"]["other_env_only"] = 1.0
        rec.check_replicate(live, ["score", "other_env_only"])
    with pytest.raises(ReplicateError, match="score: not measured by the live replicate"):
        rec.check_replicate({"a": {"seed": 0, "metrics": {}}}, ["score"])


def test_cells_of_trainers_trained_elsewhere_equal_the_runners(fake_lab):
    cells, trainers = records.run_cells("fake", 1, ["a", "b, bonus"])
    again = records.measure_cells("fake", trainers, 1)
    for arm in cells:
        assert again[arm]["metrics"] == cells[arm]["metrics"]
        assert again[arm]["curves"] == cells[arm]["curves"]
    with pytest.raises(RecordError, match="unknown arm|no arm|not an arm"):
        records.measure_cells("fake", {"nope": trainers["a"]}, 1)


def test_a_seed_whose_package_files_changed_while_it_ran_is_refused(fake_lab, monkeypatch):
    """A record names the code its numbers come from by the files' digests at measuring time: a
    file edited between a seed's start and its measurement would be named, but not what ran."""
    at_start = records._package_digests()
    assert at_start["utils.py"] is not None  # run_cells' setup() loads it
    monkeypatch.setattr(records, "_package_digests", lambda: {**at_start, "utils.py": "before"})
    with pytest.raises(RecordError, match=r"seed 1: package files changed while it ran \(utils.py"):
        records.run_cells("fake", 1, ["a"])
    monkeypatch.setattr(records, "_package_digests", lambda: at_start)
    cells, _ = records.run_cells("fake", 1, ["a"])
    assert cells["a"]["source"]["utils.py"] == at_start["utils.py"]


def test_a_record_reports_the_package_files_that_changed_since(tmp_path):
    import agentic_rl.gigpo  # noqa: F401  (loaded, so that it has a hash)

    rec = _record("x", "y")
    rec.data["provenance"]["source"] = {"stats.py": "0" * 16, "gigpo.py": "bogus"}
    assert rec.stale() == ["stats.py", "gigpo.py"]
    current = records.source_hashes(["agentic_rl.gigpo", "agentic_rl.records"])
    assert list(current) == ["gigpo.py"]  # the runner itself cannot change a number
    rec.data["provenance"]["source"] = current
    assert rec.stale() == []


@pytest.mark.parametrize("lab", sorted(records.EXPERIMENTS))
def test_every_lab_experiment_fulfils_the_contract(lab):
    module = records.experiment(lab)
    assert module.SEEDS >= 8, "a comparison needs at least 8 seeds"
    assert set(module.REPLICATE) <= set(module.ARMS) and module.CHECKED
    assert callable(module.train) and callable(module.measure)
    path = records._PACKAGE.parents[1] / "labs" / "results" / f"{lab}.json"
    rec = load_record(lab, path.parent)
    assert rec.n >= module.SEEDS and rec.arms == list(module.ARMS)
    for arm in module.REPLICATE:
        cells = rec.data["cells"][arm].values()
        # a checked metric an arm does not measure (another environment's) is in none of its cells
        measured = [k for k in module.CHECKED if any(k in c["metrics"] for c in cells)]
        assert measured, f"{lab}: the replicate checks nothing of {arm!r}"
        for key in measured:
            assert all(key in c["metrics"] for c in cells), (lab, arm, key)


def test_stale_records_are_named():
    """A record whose package files changed since it was made is reported by name (a warning: the
    labs' live replicates decide whether its numbers still hold)."""
    import warnings

    for lab in sorted(records.EXPERIMENTS):
        rec = load_record(lab, records._PACKAGE.parents[1] / "labs" / "results")
        if rec.stale():
            warnings.warn(f"labs/results/{lab}.json was made before changes to "
                          f"{', '.join(rec.stale())}: regenerate it with "
                          f"`python -m agentic_rl experiment {lab}`", stacklevel=1)


def test_a_metric_some_seeds_did_not_measure_is_nan_and_one_none_did_is_an_error():
    rec = _record("x", "y")
    del rec.data["cells"]["a"]["2"]["metrics"]["score"]  # e.g. an AUROC with one class absent
    v = rec.values("a", "score")
    assert math.isnan(v[2]) and v[:2] == [0.50, 0.55]
    with pytest.raises(RecordError, match="has no metric 'nothing'"):
        rec.values("a", "nothing")
    with pytest.raises(RecordError, match="no arm 'z'"):
        rec.values("z", "score")


# ------------------------------------------------------- a lab's warm start, kept for its teaching


def test_an_arm_from_a_kept_warm_start_is_the_recorded_arm(tiny_config):
    """The GRPO and GAE labs look at the warm start before RL, then train their main arm from it:
    whatever the teaching cells sample in between, the arm equals the one the runner trains, and
    every arm starts from the same weights, evaluation and task stream."""
    import torch

    from agentic_rl.experiments import arms
    from agentic_rl.grpo import GRPOTrainer
    from agentic_rl.utils import setup

    config = tiny_config(sft_steps=4, max_steps=2, eval_size=8)

    def fresh():
        setup(0)
        start = arms.warm_start(GRPOTrainer, config)
        return start, arms.train_arm(start, num_generations=2, prompts_per_step=2)

    start, runner = fresh()
    setup(0)
    lab_start = arms.warm_start(GRPOTrainer, config)
    torch.manual_seed(123)  # a teaching cell samples from the policy and the task stream
    lab_start.problem_rng.random()
    lab_start.rollout()
    lab = arms.train_arm(lab_start, num_generations=2, prompts_per_step=2)
    assert lab.evals == runner.evals and lab.history[-1]["loss"] == runner.history[-1]["loss"]
    assert all(torch.equal(p, q) for p, q in zip(lab.model.parameters(),
                                                 runner.model.parameters()))
    assert lab.evals["before"] is lab_start.evals["before"]  # not measured again
    import random

    assert start.rl_tasks != random.Random(config.seed).getstate()  # SFT drew from the stream
    assert not all(torch.equal(p, q) for p, q in zip(lab.model.parameters(),
                                                     lab_start.model.parameters()))  # a copy


def test_a_retool_arm_refuses_the_other_cold_start():
    """The GRPO-RoC arms train from the cold start with retry traces, the others from the plain
    one: an arm given the wrong start says which it needs (a silent mix-up would record another
    experiment), and the arms record every gradient step's pre-clip norm."""
    from agentic_rl.experiments import retool

    small = dict(sft_steps=2, max_steps=1, eval_size=4, eval_samples=1, prompts_per_step=2,
                 num_generations=2, tool_workers=1)
    plain = retool.warm_start(0, **small)
    with pytest.raises(ValueError, match=r"retry_traces=True"):
        retool.train_arm(plain, "GRPO-RoC, retry traces")
    arm = retool.train_arm(plain, "unmasked")
    c = arm.config  # one gradient step per minibatch and pass over the batch
    assert len(arm.grad_norms) == c.max_steps * c.num_iterations * c.num_minibatches > 0
    measured = retool.measure(arm, "unmasked", 0)
    assert measured["metrics"]["gradient_steps"] == len(measured["curves"]["pre_clip_norm"])
    plain.close()
