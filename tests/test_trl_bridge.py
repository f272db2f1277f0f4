"""The TRL bridge: TRL's ``GRPOTrainer`` trains on this package's tasks with this package's reward
and settings (``agentic_rl.trl_bridge``).

TRL is an optional peer (``requirements.txt``): the tests that run it skip without it; the loss
mapping is checked against the reference cases (TRL 1.16.0's reductions), which need no TRL.
"""

from __future__ import annotations

import math
import random
import sys

import pytest
import torch

from testkit import fake_generate, tiny_model

from agentic_rl.grpo import GRPOConfig
from agentic_rl.envs import AdditionTask, SumsTask
from agentic_rl.losses import aggregate
from agentic_rl.trl_bridge import TRL_LOSS_TYPES, trl_config_kwargs, trl_task

# ------------------------------------------------------------------------------ without TRL


def test_package_imports_without_trl_and_says_how_to_install(monkeypatch):
    import subprocess

    code = (
        "import sys; sys.modules['trl'] = sys.modules['datasets'] = None\n"  # not installed
        "import agentic_rl.trl_bridge, agentic_rl.train, agentic_rl.cli\n"
        "from agentic_rl.grpo import GRPOConfig\n"
        "agentic_rl.trl_bridge.trl_config_kwargs(GRPOConfig())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "trl", None)
    assert trl_config_kwargs(GRPOConfig())["loss_type"] == "grpo"  # needs no TRL
    with pytest.raises(ImportError, match=r"pip install trl==1\.16\.0"):
        trl_task(AdditionTask(), 4)


# ------------------------------------------------------------------------------ the settings


@pytest.mark.parametrize(
    "loss_type, trl_loss",
    [
        ("grpo", "grpo"),
        ("seq-mean-token-mean", "grpo"),
        ("bnpo", "bnpo"),
        ("dapo", "bnpo"),  # token-mean: TRL's "dapo" differs from it with several minibatches
        ("token-mean", "bnpo"),
        ("dr_grpo", "dr_grpo"),
        ("seq-mean-token-sum-norm", "dr_grpo"),
    ],
)
def test_loss_type_maps_to_the_trl_loss_that_computes_it(loss_type, trl_loss):
    assert trl_config_kwargs(GRPOConfig(loss_type=loss_type))["loss_type"] == trl_loss


@pytest.mark.parametrize("loss_type", ["token-sum", "seq-mean-token-sum"])
def test_loss_types_trl_lacks_are_refused(loss_type):
    with pytest.raises(ValueError, match="has no TRL loss_type"):
        trl_config_kwargs(GRPOConfig(loss_type=loss_type))


def test_mapped_aggregations_equal_trl_reductions_on_the_reference_cases():
    """Each mapped mode, computed by ``losses.aggregate``, equals TRL 1.16.0's reduction of the
    loss_type it maps to (the reference cases; TRL's ``dr_grpo`` constant is the padded width).

    Cases with a row of no valid token are left out: TRL's seq-means count such a row, this
    package does not, and a rollout never has one (every completion has at least one token)."""
    from agentic_rl.check import load_reference_cases

    cases = load_reference_cases()["kinds"]["aggregate"]["cases"]
    checked = 0
    for case in cases:
        loss_mat = torch.tensor(case["inputs"]["loss_mat"], dtype=torch.float64)
        mask = torch.tensor(case["inputs"]["mask"])
        if not mask.any(1).all():
            continue
        for mode, trl_loss in TRL_LOSS_TYPES.items():
            index = case["refs"].get(f"trl-{trl_loss}")
            if index is None or case["outputs"][index] is None:
                continue
            ours = aggregate(loss_mat, mask, mode, norm_constant=mask.shape[1]).item()
            want = case["outputs"][index][0]
            assert math.isclose(ours, want, rel_tol=1e-6, abs_tol=1e-7), (case["name"], mode)
            checked += 1
    assert checked >= 2 * len(TRL_LOSS_TYPES)  # two cases without an empty row


def test_settings_pin_trl_defaults_and_split_minibatches():
    c = GRPOConfig(
        prompts_per_step=8,
        num_generations=4,
        num_minibatches=2,
        num_iterations=3,
        epsilon_high=0.28,
        dual_clip=3.0,
        learning_rate=3e-4,
        device="cpu",
    )
    kw = trl_config_kwargs(c)
    assert kw["per_device_train_batch_size"] == 16 and kw["steps_per_generation"] == 2
    assert kw["num_iterations"] == 3 and kw["num_generations"] == 4
    assert (kw["epsilon"], kw["epsilon_high"], kw["delta"]) == (0.2, 0.28, 3.0)
    assert kw["bf16"] is False and kw["fp16"] is False and kw["use_cpu"] is True
    assert kw["lr_scheduler_type"] == "constant" and kw["weight_decay"] == 0.0
    assert kw["optim"] == "adamw_torch" and kw["shuffle_dataset"] is False
    assert "max_steps" not in kw and "output_dir" not in kw  # the caller's
    assert trl_config_kwargs(c, logging_steps=5)["logging_steps"] == 5
    assert trl_config_kwargs(GRPOConfig())["epsilon_high"] == 0.2  # None: symmetric
    with pytest.raises(ValueError, match="divide the batch"):
        trl_config_kwargs(GRPOConfig(prompts_per_step=3, num_generations=2, num_minibatches=4))
    with pytest.raises(ValueError, match="k3"):
        trl_config_kwargs(GRPOConfig(beta=0.04, kl_estimator="k1"))
    with pytest.raises(ValueError, match="token-mean"):
        trl_config_kwargs(GRPOConfig(entropy_coeff=0.01))  # loss_type "grpo": seq-mean
    assert trl_config_kwargs(GRPOConfig(entropy_coeff=0.01, loss_type="dapo"))["entropy_coef"]
    with pytest.raises(ValueError, match="delta"):
        trl_config_kwargs(GRPOConfig(dual_clip=1.1))


def test_every_setting_is_a_trl_grpo_config_field(tmp_path):
    trl = pytest.importorskip("trl")
    c = GRPOConfig(prompts_per_step=4, num_generations=4, num_minibatches=2, device="cpu")
    args = trl.GRPOConfig(output_dir=str(tmp_path), max_steps=1, **trl_config_kwargs(c))
    assert args.generation_batch_size == 16 and args.steps_per_generation == 2
    assert args.per_device_train_batch_size == 8
    assert args.bf16 is False and args.gradient_checkpointing is False
    assert args.loss_type == "grpo" and args.scale_rewards == "group" and args.beta == 0.0
    assert args.top_k == 0 and args.top_p == 1.0 and args.temperature == 1.0
    assert args.lr_scheduler_type == "constant" and args.learning_rate == 1e-4


# ------------------------------------------------------------------------------ the reward



def test_reward_equals_the_package_rollout_score(model, tokenizer):
    """Right, wrong, malformed, truncated: the bridge's reward of TRL's completion ids is the
    reward ``generate_batch`` gives the same tokens."""
    pytest.importorskip("datasets")
    from agentic_rl.rollout import generate_batch

    task = AdditionTask()
    problem = task.make_problem(47, 38)  # answer "5 8" (least-significant digit first)
    eos, pad = tokenizer.eos_token, tokenizer.pad_token
    completions = [
        ["5", "8", eos],  # right and well formed: 1 + 0.1
        ["5", "9", eos],  # wrong, well formed: 0.1
        ["5", "+", "8", eos],  # malformed
        ["5", pad, "8", eos],  # a stray special token: malformed here (TRL's text reads "5 8")
        ["5", "8", "1", "1"],  # no EOS: truncated, a format failure
    ]
    model.generate = fake_generate(tokenizer, completions)
    batch = generate_batch(
        model, tokenizer, task, [problem], num_generations=len(completions), max_completion_length=4
    )
    _, reward_fn = trl_task(task, 1, tokenizer=tokenizer)
    n = len(completions)
    # what TRL hands a reward function: ids cut after the first EOS, text without special tokens
    ids = [tokenizer.convert_tokens_to_ids(c) for c in completions]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    rows = {"question": [problem.prompt] * n, "answer": [problem.answer] * n, "meta": ["{}"] * n}
    rewards = reward_fn(texts, completion_ids=ids, prompts=[problem.prompt] * n, **rows)
    assert rewards == pytest.approx(batch.scores.tolist())
    assert rewards == pytest.approx([1.1, 0.1, 0.0, 0.0, 0.0])
    # without the tokenizer it can only read TRL's text: the stray <pad> and the truncation vanish
    _, text_only = trl_task(task, 1)
    assert text_only(texts, **rows) == pytest.approx([1.1, 0.1, 0.0, 1.1, 0.0])


def test_dataset_rows_are_the_trainers_problem_stream(tiny_config):
    pytest.importorskip("datasets")
    from agentic_rl.grpo import GRPOTrainer

    config = tiny_config(seed=3)
    trainer = GRPOTrainer(config)
    dataset, _ = trl_task(trainer.task, 2 * config.prompts_per_step, seed=config.seed)
    assert set(dataset.column_names) == {"prompt", "question", "answer", "meta"}
    rng = random.Random(config.seed)  # GRPOTrainer.problem_rng, sft_steps = 0
    stream = [p for _ in range(2) for p in trainer.task.sample(config.prompts_per_step, rng)]
    assert dataset["prompt"] == [p.prompt for p in stream]
    assert dataset["answer"] == [p.answer for p in stream]


def test_chat_task_prompts_and_reward():
    """The sums task (``chat = True``): user turns that TRL templates itself; the reward is the
    task's, bare number or not."""
    pytest.importorskip("datasets")
    task = SumsTask(format_weight=0.5)
    dataset, reward_fn = trl_task(task, 3, seed=0)
    problems = task.sample(3, random.Random(0))
    assert dataset["prompt"][0] == [{"role": "user", "content": problems[0].prompt}]
    p = problems[0]
    total = str(p.meta["a"] + p.meta["b"])
    answers = [total, f"The answer is {total}.", str(int(total) + 1), "I cannot say."]
    completions = [[{"role": "assistant", "content": a}] for a in answers]  # TRL's chat form
    n = len(answers)
    rows = {"question": [p.prompt] * n, "answer": [p.answer] * n, "meta": [dataset["meta"][0]] * n}
    rewards = reward_fn(completions, **rows)
    assert rewards == [task.score(p, a).reward for a in answers] == [1.5, 1.0, 0.5, 0.0]


# ------------------------------------------------------------------------------ TRL trains


def _sums_tokenizer():
    """A word-level tokenizer for the sums prompts (the tiny model's kind), for a TRL smoke test
    without a pretrained model."""
    from agentic_rl.models import build_tokenizer

    words = {w for p in SumsTask().sample(64, random.Random(0)) for w in p.prompt.split()}
    return build_tokenizer(sorted(words | {str(n) for n in range(19)}))


@pytest.mark.parametrize("task_name", ["addition", "sums"])
def test_trl_grpo_trainer_trains_on_the_bridge(task_name, tmp_path, tiny_config):
    """Two TRL steps from a saved model: the parameters move, the logged reward is in the task's
    range, and TRL's prompt tokens are the package's (plain text with BOS; a chat turn through the
    template, no second BOS)."""
    trl = pytest.importorskip("trl")
    from agentic_rl.rollout import chat_prompt, encode_prompts
    from agentic_rl.grpo import GRPOTrainer

    config = tiny_config(max_completion_length=4, learning_rate=1e-2)
    if task_name == "addition":  # a short SFT, so that some answers are right and groups spread
        trainer = GRPOTrainer(tiny_config(sft_steps=40, sft_learning_rate=3e-3))
        trainer.sft()
        model, tokenizer, task = trainer.model, trainer.tokenizer, trainer.task
    else:
        tokenizer, task = _sums_tokenizer(), SumsTask()
        model = tiny_model(tokenizer, num_hidden_layers=1)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}

    dataset, reward_fn = trl_task(task, 2 * config.prompts_per_step, tokenizer=tokenizer)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, **trl_config_kwargs(config)
    )
    trl_trainer = trl.GRPOTrainer(
        model=str(tmp_path / "model"),
        reward_funcs=reward_fn,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,  # else TRL calls AutoProcessor.from_pretrained on the folder
    )
    # the prompt tokens TRL generates from (1.16.0's _tokenize_prompts) are the package's
    prompts = dataset["prompt"][:4]
    trl_ids = trl_trainer._tokenize_prompts(prompts)[0]
    chat = task_name == "sums"
    texts = [chat_prompt(tokenizer, q) if chat else q for q in dataset["question"][:4]]
    enc = encode_prompts(tokenizer, texts, add_special_tokens=not chat)
    ours = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], enc["attention_mask"])]
    assert [list(ids) for ids in trl_ids] == ours

    trl_trainer.train()
    rewards = [row["reward"] for row in trl_trainer.state.log_history if "reward" in row]
    assert len(rewards) == 2
    top = 1.0 + task.format_weight
    assert all(math.isfinite(r) and 0.0 <= r <= top for r in rewards)
    if task_name == "addition":  # groups with reward spread: a gradient, so the weights move
        after = trl_trainer.model.state_dict()
        assert any(not torch.equal(after[k].cpu(), v) for k, v in start.items())
