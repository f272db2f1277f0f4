"""``python -m agentic_rl``: help from the config's field docs, argument errors, and a tiny real
run."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from agentic_rl.cli import RECIPES, main
from agentic_rl.cli import config_from_args
from agentic_rl.grpo import GRPOConfig

METRICS = ["step", "reward_mean", "reward_std", "accuracy", "format_rate", "frac_reward_zero_std",
           "completion_length", "loss", "kl", "entropy", "clip_ratio", "grad_norm", "tokens_per_s",
           "step_time", "skipped"]


def _run(*args, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-m", "agentic_rl", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def test_grpo_help_shows_field_docs():
    r = _run("grpo", "--help")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())  # argparse wraps lines
    assert "--num-generations" in out and "rollouts sampled per prompt" in out
    assert "--epsilon-high" in out and "clip-higher" in out
    assert "[default: 8]" in out  # the quick profile's num_generations


def test_help_defaults_follow_the_profile(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["grpo", "--profile", "full", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Tiny model: hidden size. [default: 256]" in out


def test_unknown_recipe_exits_2():
    r = _run("ppo-nope")
    assert r.returncode == 2
    assert "unknown recipe 'ppo-nope'" in r.stderr and "grpo" in r.stderr


def test_no_recipe_prints_usage(capsys):
    assert main([]) == 2
    usage = f"usage: python -m agentic_rl {{{', '.join(sorted(RECIPES))}}}"
    assert usage in capsys.readouterr().out
    assert main(["--help"]) == 0


def test_invalid_value_exits_2_naming_the_field():
    r = _run("grpo", "--num-generations", "1")
    assert r.returncode == 2
    assert "num_generations" in r.stderr and "at least 2" in r.stderr


def test_unknown_profile_exits_nonzero_naming_profile():
    r = _run("grpo", "--profile", "nope")
    assert r.returncode != 0
    assert "profile" in r.stderr and "'nope'" in r.stderr


@pytest.mark.parametrize("argv,expected", [
    (["--epsilon-high", "none"], dict(epsilon_high=None)),
    (["--epsilon-high", "0.28", "--beta", "0.04"], dict(epsilon_high=0.28, beta=0.04)),
    (["--use-lora", "true", "--disable-tqdm", "0"], dict(use_lora=True, disable_tqdm=False)),
    (["--profile", "full", "--seed", "3"], dict(profile="full", seed=3, hidden_size=256)),
    (["--loss-type", "dr_grpo"], dict(output_dir=None, loss_type="dr_grpo")),
])
def test_flags_parse_into_the_config(argv, expected):
    config = config_from_args(GRPOConfig, argv, prog="test")
    for k, v in expected.items():
        assert getattr(config, k) == v


def test_bad_flag_values_are_argparse_errors(capsys):
    for argv in (["--use-lora", "maybe"], ["--num-generations", "four"], ["--no-such-flag", "1"]):
        with pytest.raises(SystemExit) as exc:
            config_from_args(GRPOConfig, argv, prog="test")
        assert exc.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


def _refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        config_from_args(GRPOConfig, argv, prog="test")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("argv", [["--learning", "0.5"], ["--temp", "0.5"], ["--prof", "full"]])
def test_abbreviated_flags_are_refused(capsys, argv):
    """Reliability report, failure 16: argparse's allow_abbrev took ``--learning 0.5`` for
    ``--learning-rate 0.5`` silently."""
    assert _refused(capsys, argv) == f"error: unrecognized arguments: {' '.join(argv)}"


def test_a_repeated_flag_is_refused_naming_it(capsys):
    err = _refused(capsys, ["--beta", "0.1", "--beta", "0.2"])
    assert err == (
        "error: beta: --beta is given more than once; give each flag once (got 0.1, then 0.2)"
    )
    err = _refused(capsys, ["--profile", "full", "--profile", "quick"])
    assert err.startswith("error: profile: --profile is given more than once")
    assert "--learning-rate is given more than once" in _refused(
        capsys, ["--learning-rate=0.5", "--learning-rate", "0.1"]
    )


@pytest.mark.parametrize("word", ["none", "None", "null"])
def test_output_dir_none_is_refused(capsys, word):
    """``--output-dir none`` used to mean "write nothing"; leaving the flag out says that."""
    err = _refused(capsys, ["--output-dir", word])
    assert err.startswith("error: output_dir: is not a folder name here") and word in err


def test_tiny_real_run_writes_metrics_and_summary(tmp_path):
    out = tmp_path / "run"
    r = _run("grpo", "--sft-steps", "20", "--max-steps", "2", "--hidden-size", "32",
             "--num-hidden-layers", "1", "--num-attention-heads", "2", "--num-key-value-heads", "1",
             "--intermediate-size", "64", "--eval-size", "16", "--prompts-per-step", "4",
             "--num-generations", "2", "--disable-tqdm", "true", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr
    with open(out / "metrics.csv") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert set(METRICS) <= set(reader.fieldnames)  # (a recipe may log more)
    assert len(rows) == 2 and [int(x["step"]) for x in rows] == [1, 2]
    with open(out / "summary.json") as fh:
        summary = json.load(fh)
    for key in ("accuracy_before", "accuracy_after", "wall_time_s", "profile",
                "sampled_accuracy_before", "greedy_accuracy_after", "num_parameters", "config"):
        assert key in summary
    assert summary["profile"] == "quick" and summary["rl_steps"] == 2 and summary["wall_time_s"] > 0
    assert 0 <= summary["accuracy_before"] <= 1 and 0 <= summary["accuracy_after"] <= 1
    assert summary["config"]["num_generations"] == 2 and summary["config"]["output_dir"] == str(out)
    assert (out / "checkpoint.pt").exists()
    with open(out / "sft_metrics.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 20
    # stdout is the summary without the config
    printed = json.loads(r.stdout[r.stdout.index("{"):])
    assert "config" not in printed and printed["rl_steps"] == 2
