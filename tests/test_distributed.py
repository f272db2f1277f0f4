"""Data parallelism under ``torchrun`` (``agentic_rl.distributed``): 2 CPU ranks over gloo.

The key test: two ranks given the two halves of one fixed global batch take, after one optimizer
step, the step one process takes on the whole batch (same gradient, same parameters, same history
row), for several loss aggregations; the token-weighted ones would fail without the ranks' loss
weights (checked too). Then the CLI as a user types it (``torchrun ... -m agentic_rl grpo``): two
ranks write the output folder once and resume it; bad input stops before any compute with one
``error:`` line. The file is also the ranks' script: ``torchrun ... test_distributed.py DIR``.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed

from testkit import tiny

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed with the gloo backend (CPU ranks)",
)

#: What these tests change of ``testkit.tiny("grpo")``.
TINY = dict(max_steps=1, max_completion_length=6, eval_size=4)

#: One global batch, several losses: config overrides (and whether a filter keeps only group 0,
#: which leaves rank 1 with no rows: its gradient steps carry none).
CASES = {
    "grpo": dict(),  # seq-mean-token-mean: every rank's weight is 1
    "token-mean": dict(loss_type="token-mean", beta=0.04),  # weights W n_r / N, the KL term too
    "token-sum": dict(loss_type="token-sum"),  # weight W
    "dr_grpo": dict(loss_type="dr_grpo"),  # seq-mean-token-sum-norm
    "filtered": dict(loss_type="token-mean"),
}
ROW_KEYS = ("reward_mean", "reward_std", "accuracy", "format_rate", "frac_reward_zero_std",
            "completion_length", "loss", "grad_norm", "skipped")  # fmt: skip


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                TOKENIZERS_PARALLELISM="false")  # fmt: skip


def _torchrun(*args, timeout=180):
    """``torchrun --standalone --nproc_per_node 2 ARGS`` (a free port of its own)."""
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return subprocess.run(
        [*run, *args], check=False, capture_output=True, text=True, env=_env(), timeout=timeout
    )


def _trainer(name):
    from agentic_rl.grpo import GRPOTrainer

    t = GRPOTrainer(tiny("grpo", **{**TINY, **CASES[name]}))
    if name == "filtered":
        t.filter_rows = lambda batch: batch.group_id == 0
    return t


def _one_step(name, batch, state):
    """One ``rl_step`` on ``batch`` from the weights ``state``: the parameters after it, the
    gradient the optimizer stepped with (after the all-reduce and clipping), the history row."""
    t = _trainer(name)
    t.model.load_state_dict(state)
    t.rollout = lambda: batch
    seen, step = {}, t.optimizer.step

    def record(*args, **kwargs):
        seen["grad"] = torch.cat(
            [p.grad.flatten() for g in t.optimizer.param_groups for p in g["params"]]
        )
        return step(*args, **kwargs)

    t.optimizer.step = record
    row = t.rl_step()
    params = torch.cat([p.detach().flatten() for p in t.model.parameters()])
    return params, seen["grad"], row


def _half(batch, rank):
    """Rank ``rank``'s half of the global batch: groups 0-1 or 2-3, whole."""
    return batch.select(((batch.group_id >= 2) == bool(rank)).nonzero().flatten())


def _worker(folder):
    """One rank (under torchrun): each case's step on this rank's half of the global batch."""
    from agentic_rl import distributed as dist

    for name in CASES:
        case = torch.load(os.path.join(folder, f"{name}.pt"), weights_only=False)
        params, grad, row = _one_step(name, _half(case["batch"], dist.rank()), case["state"])
        torch.save(
            dict(params=params, grad=grad, row=row),
            os.path.join(folder, f"{name}.rank{dist.rank()}.pt"),
        )


@pytest.fixture(scope="module")
def global_batch():
    """One fixed batch of 4 groups of 4, and the weights it starts from.

    Random rewards give every group a spread (an untrained policy scores 0 everywhere), and rank
    0's half scores fewer tokens than rank 1's (its first group's completions cut to 2 tokens),
    so that a token-weighted loss differs from the mean of the two halves' losses."""
    t = _trainer("grpo")
    t.make_ref_model()  # reference log-probs in the batch (the KL case uses them)
    batch = t.rollout()
    g = torch.Generator().manual_seed(0)
    last = (batch.loss_mask * torch.arange(batch.loss_mask.shape[1])).argmax(1)
    batch.token_rewards = torch.zeros_like(batch.token_rewards)
    batch.token_rewards[torch.arange(len(batch)), last] = torch.rand(len(batch), generator=g)
    first = batch.group_id == 0
    batch.loss_mask[first] = batch.loss_mask[first] * (batch.loss_mask[first].cumsum(1) <= 2)
    tokens = [int(_half(batch, r).loss_mask.sum()) for r in (0, 1)]
    assert tokens[0] != tokens[1], tokens
    state = {k: v.clone() for k, v in t.model.state_dict().items()}
    return batch, state


@pytest.fixture(scope="module")
def two_ranks(global_batch, tmp_path_factory):
    """Each case's step on 2 ranks (one torchrun), read back: ``{case: [rank 0's, rank 1's]}``."""
    batch, state = global_batch
    folder = tmp_path_factory.mktemp("ranks")
    for name in CASES:
        torch.save(dict(batch=batch, state=state), folder / f"{name}.pt")
    r = _torchrun(__file__, str(folder))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {
        name: [torch.load(folder / f"{name}.rank{k}.pt", weights_only=False) for k in (0, 1)]
        for name in CASES
    }


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_take_the_one_process_step(name, global_batch, two_ranks):
    batch, state = global_batch
    params, grad, row = _one_step(name, batch, state)  # one process, the whole batch
    rank0, rank1 = two_ranks[name]
    assert torch.equal(rank0["params"], rank1["params"])  # the ranks never drift apart
    torch.testing.assert_close(rank0["grad"], grad, atol=1e-6, rtol=1e-5)
    # Adam's first step is ~ lr * sign(g): 1e-4 per weight, whatever the gradient's float noise
    torch.testing.assert_close(rank0["params"], params, atol=1e-6, rtol=0)
    assert not torch.equal(params, torch.cat([v.flatten() for v in state.values()]))  # it moved
    for key in ROW_KEYS:  # rank 0's history row describes the global batch
        assert rank0["row"][key] == pytest.approx(row[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("name", ["token-mean", "token-sum"])
def test_without_the_rank_weights_the_gradient_would_differ(name, global_batch):
    """What the key test guards: averaging the halves' unweighted gradients (DDP alone) is not
    the whole batch's gradient for a token-weighted loss."""
    batch, state = global_batch
    t = _trainer(name)
    t.model.load_state_dict(state)

    def grad(b):
        t.model.zero_grad(set_to_none=True)
        loss, _ = t.compute_loss(b, t.compute_advantages(b))
        loss.backward()
        return torch.cat([p.grad.flatten() for p in t.model.parameters() if p.requires_grad])

    whole, halves = grad(batch), (grad(_half(batch, 0)) + grad(_half(batch, 1))) / 2
    assert (whole - halves).abs().max() > 1e-3 * whole.abs().max()


def _cli_args(folder, steps):
    return ["-m", "agentic_rl", "grpo", "--profile", "quick", "--max-steps", str(steps),
            "--output-dir", str(folder), "--sft-steps", "2", "--sft-batch-size", "8",
            "--prompts-per-step", "4", "--num-generations", "4", "--max-completion-length", "6",
            "--hidden-size", "32", "--num-hidden-layers", "1", "--intermediate-size", "64",
            "--eval-size", "4", "--eval-samples", "1", "--save-steps", "1"]  # fmt: skip


def _rows(folder, name="metrics.csv"):
    with open(folder / name) as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def torchrun_cli(tmp_path_factory):
    """The CLI's 2-step run under torchrun, run once for the two tests that check it: ``(the
    finished torchrun, its output folder, the metrics rows it wrote)``. The first test resumes the
    folder; the second compares Accelerate's run with the rows, read before any resume."""
    out = tmp_path_factory.mktemp("torchrun") / "run"
    r = _torchrun(*_cli_args(out, 2))
    return r, out, _rows(out) if (out / "metrics.csv").exists() else None


def test_cli_under_torchrun_writes_once_and_resumes(torchrun_cli):
    from agentic_rl import checkpoint as ckpt
    from agentic_rl.cli import config_from_args
    from agentic_rl.grpo import GRPOConfig
    from agentic_rl.runs import preflight

    r, out, _ = torchrun_cli
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads(r.stdout)  # rank 0's summary only: one JSON document on stdout
    assert summary["rl_steps"] == 2
    assert r.stderr.count("wrote to") == 1
    before = _rows(out)
    assert [row["step"] for row in before] == ["1", "2"]
    assert len(_rows(out, "sft_metrics.csv")) == 2
    state = ckpt.load(str(out / "checkpoint.pt"))
    rngs = state["rank_rng"]  # every rank's RNG streams: the ranks sample differently
    assert len(rngs) == 2 and not torch.equal(rngs[0]["torch"], rngs[1]["torch"])
    assert rngs[0]["problems"] == rngs[1]["problems"]  # one task stream

    r = _torchrun(*_cli_args(out, 3))  # resume: one more step
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads(r.stdout)["rl_steps"] == 3
    rows = _rows(out)
    assert [row["step"] for row in rows] == ["1", "2", "3"] and rows[:2] == before
    assert json.loads((out / "summary.json").read_text())["rl_steps"] == 3

    # the checkpoint holds two ranks' streams: one process may not continue it
    config = config_from_args(GRPOConfig, _cli_args(out, 4)[3:], prog="agentic_rl grpo")
    with pytest.raises(
        ckpt.ConfigMismatchError, match=r"torchrun --nproc_per_node.*2 in the checkpoint \(got 1\)"
    ):
        preflight(config)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_accelerate_launch_runs_the_same_two_ranks(tmp_path, torchrun_cli):
    """Accelerate's launcher (``--multi_gpu`` on a CPU-only machine: two gloo ranks; its ``--cpu``
    flag would start one process) runs what torchrun runs, digit for digit (torchrun's run is
    ``torchrun_cli``'s)."""
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
                  "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                  "--dynamo_backend", "no", "--main_process_port", str(_free_port())]  # fmt: skip
    r = subprocess.run(
        [*accelerate, *_cli_args(tmp_path / "acc", 2)],
        check=False, capture_output=True, text=True, env=_env(), timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stderr.count("wrote to") == 1  # rank 0 alone writes
    from agentic_rl import checkpoint as ckpt

    assert len(ckpt.load(str(tmp_path / "acc" / "checkpoint.pt"))["rank_rng"]) == 2
    r, _, torchrun_rows = torchrun_cli
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    timing = ("step_time", "tokens_per_s")  # wall-clock columns: everything else equal

    def numbers(rows):
        return [{k: v for k, v in row.items() if k not in timing} for row in rows]

    assert numbers(_rows(tmp_path / "acc")) == numbers(torchrun_rows)


def test_cli_under_torchrun_refuses_prompts_that_do_not_divide(tmp_path):
    r = _torchrun(
        "-m", "agentic_rl", "grpo", "--prompts-per-step", "3", "--output-dir", str(tmp_path / "run")
    )
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert lines == [
        "error: prompts_per_step: does not divide across 2 ranks (each rank plays an equal share "
        "of a step's prompts, each with its whole group); use a multiple of 2 (got 3)"
    ]  # fmt: skip
    assert "exitcode  : 2" in r.stderr  # the ranks' status; torchrun itself exits 1
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


@pytest.mark.parametrize(
    "overrides, field",
    [(dict(prompts_per_step=3), "prompts_per_step"),
     (dict(prompts_per_step=2, num_generations=2, num_minibatches=3), "num_minibatches"),
     (dict(scale_rewards="batch"), "scale_rewards")],
)  # fmt: skip
def test_what_does_not_split_across_ranks_is_refused_before_compute(monkeypatch, overrides, field):
    from agentic_rl.config import ConfigError
    from agentic_rl.distributed import check_data_parallel

    config = tiny("grpo", **{**TINY, "prompts_per_step": 4, **overrides})
    check_data_parallel(config)  # one process: anything goes
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as err:
        check_data_parallel(config)
    assert err.value.field == field and "2 ranks" in str(err.value)


def test_every_recipe_shards_and_a_rollout_that_does_not_is_refused(monkeypatch):
    from agentic_rl.agent import AgentTrainer
    from agentic_rl.config import ConfigError
    from agentic_rl.starpo import StarPOConfig
    from agentic_rl.gcd import GCDTrainer
    from agentic_rl.rcgrpo import RCGRPOTrainer
    from agentic_rl.retool import ReToolTrainer
    from agentic_rl.starpo import StarPOTrainer
    from agentic_rl.distributed import check_data_parallel
    from agentic_rl.grpo import GRPOTrainer

    class PlaysEverything(GRPOTrainer):  # a new recipe that draws and plays a whole step
        def rollout(self):
            return super().rollout()

    monkeypatch.setenv("WORLD_SIZE", "2")
    config = tiny("grpo", **TINY)
    trainers = (GRPOTrainer, AgentTrainer, StarPOTrainer, RCGRPOTrainer, ReToolTrainer, GCDTrainer)
    for cls in trainers:
        check_data_parallel(config, cls)
    with pytest.raises(ConfigError, match="nproc_per_node: .*PlaysEverything.rollout"):
        check_data_parallel(config, PlaysEverything)
    with pytest.raises(ConfigError, match="rollout_filter: 'dynamic'"):
        check_data_parallel(StarPOConfig(rollout_filter="dynamic"), StarPOTrainer)


@pytest.mark.parametrize(
    "recipe, flags",
    [("rcgrpo", ["--sft-steps", "2"]), ("retool", ["--sft-steps", "2"])],
)
def test_recipes_that_draw_their_own_tasks_run_on_two_ranks(tmp_path, recipe, flags):
    """RC-GRPO (the reward tokens go with their tasks) and ReTool (each rank its own sandbox
    workers) under torchrun: one RL step on two ranks, one set of files."""
    out = tmp_path / recipe
    tiny = ["--hidden-size", "32", "--num-hidden-layers", "1", "--intermediate-size", "64",
            "--prompts-per-step", "4", "--num-generations", "2", "--eval-size", "4"]  # fmt: skip
    r = _torchrun("-m", "agentic_rl", recipe, "--max-steps", "1", "--output-dir", str(out),
                  *tiny, *flags)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads(r.stdout)["rl_steps"] == 1
    assert [row["step"] for row in _rows(out)] == ["1"]
    assert len(ckpt_ranks(out)) == 2


def ckpt_ranks(folder):
    from agentic_rl import checkpoint as ckpt

    return ckpt.load(str(folder / "checkpoint.pt"))["rank_rng"]


def test_one_process_is_untouched():
    """Without torchrun every helper hands its input back (the labs stay bit-identical)."""
    from agentic_rl import distributed as dist

    assert dist.world_size() == 1 and dist.rank() == 0 and dist.is_main()
    items, x = [1, 2, 3], torch.arange(3)
    assert dist.shard(items) is items and dist.gather_rows(x) is x
    assert dist.sum_over_ranks([3, 1.5]) == [3, 1.5] and dist.all_gather_object("a") == ["a"]
    steps, metrics = [None], {"loss": 1.0}
    assert dist.pad_to_longest(steps) is steps and dist.mean_over_ranks(metrics) is metrics
    assert not torch.distributed.is_initialized()


if __name__ == "__main__":  # one rank of the key test, under torchrun
    torch.set_num_threads(1)
    _worker(sys.argv[1])
