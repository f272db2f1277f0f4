"""Mixed precision, decided in one place (:func:`agentic_rl.utils.choose_precision`): bf16 where the
GPU computes it natively, else fp16 with a gradient scaler (compute capability 7.0+), else fp32;
the CPU stays fp32 and unchanged. This machine has no GPU: each GPU is faked by monkeypatching
what ``torch.cuda`` reports about it.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from agentic_rl import checkpoint as ckpt
from agentic_rl.models import base_dtype
from agentic_rl.utils import Precision, choose_precision, grad_scaler, mixed_precision

CPU, CUDA = torch.device("cpu"), torch.device("cuda")

#: name: (computes bf16 natively, compute capability)
GPUS = {
    "H100": (True, (9, 0)),
    "A100": (True, (8, 0)),
    "T4": (False, (7, 5)),
    "V100": (False, (7, 0)),
    "P100": (False, (6, 0)),
}


def fake_gpu(monkeypatch, name: str) -> None:
    """Make ``torch.cuda`` describe GPU ``name``. As the real one does, ``is_bf16_supported()``
    says yes on any GPU through emulation unless asked ``including_emulation=False``."""
    native, capability = GPUS[name]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    bf16 = lambda including_emulation=True: native or including_emulation  # noqa: E731
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


def _autocast(ctx) -> torch.dtype | None:
    return ctx.fast_dtype if isinstance(ctx, torch.autocast) else None


def _mixed_precision(device, flag):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available": the GPU is faked
        return mixed_precision(device, flag)


# --------------------------------------------------------------------------- the decision table
@pytest.mark.parametrize(
    "gpu, name, dtype, scaler",
    [
        ("H100", "bf16", torch.bfloat16, False),
        ("A100", "bf16", torch.bfloat16, False),
        ("T4", "fp16", torch.float16, True),  # no native bf16 (emulated only): fp16 + scaler
        ("V100", "fp16", torch.float16, True),
        ("P100", "fp32", None, False),  # 6.0: no tensor cores
    ],
)
def test_each_gpu_gets_its_precision(monkeypatch, gpu, name, dtype, scaler):
    fake_gpu(monkeypatch, gpu)
    p = choose_precision(CUDA)
    assert (p.name, p.autocast_dtype, p.use_grad_scaler) == (name, dtype, scaler)
    assert p.reason and "\n" not in p.reason and len(p.reason) <= 120
    assert _autocast(_mixed_precision(CUDA, True)) == dtype  # the wrapper follows the choice
    if dtype is None:
        assert isinstance(_mixed_precision(CUDA, True), contextlib.nullcontext)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_not_requested_is_fp32_on_any_gpu(monkeypatch, gpu):
    fake_gpu(monkeypatch, gpu)
    p = choose_precision(CUDA, requested=False)
    assert (p.name, p.autocast_dtype, p.use_grad_scaler) == ("fp32", None, False)
    assert "not asked for" in p.reason
    assert isinstance(mixed_precision(CUDA, False), contextlib.nullcontext)


@pytest.mark.parametrize("requested", [True, False])
def test_cpu_and_mps_are_fp32_whatever_the_gpu_says(monkeypatch, requested):
    fake_gpu(monkeypatch, "H100")  # a GPU in the machine changes nothing for a CPU run
    cpu = choose_precision(CPU, requested)
    assert cpu == Precision(
        "fp32",
        None,
        False,
        "CPU: float32 (autocast on CPU is slower here and changes the numbers the tests pin)",
    )
    mps = choose_precision(torch.device("mps"), requested)
    assert (mps.name, mps.autocast_dtype, mps.use_grad_scaler) == ("fp32", None, False)
    assert mps.reason.startswith("MPS: float32")
    assert isinstance(mixed_precision(CPU, requested), contextlib.nullcontext)


def test_cuda_device_without_cuda_is_fp32():
    """This machine, unpatched: a "cuda" device with no CUDA asks nothing of the driver."""
    p = choose_precision(CUDA)
    assert p.name == "fp32" and "not available" in p.reason


def test_precision_is_frozen():
    p = choose_precision(CPU)
    with pytest.raises(Exception):
        p.name = "bf16"


def test_mixed_precision_on_the_cpu_changes_no_bit():
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    plain = layer(x)
    for flag in (True, False):
        ctx = mixed_precision(CPU, flag)
        assert isinstance(ctx, contextlib.nullcontext)
        with ctx:
            out = layer(x)
        assert out.dtype == torch.float32 and torch.equal(out, plain)


# --------------------------------------------------------------------------- the base's dtype
@pytest.mark.parametrize(
    "gpu, lora, dtype",
    [
        ("H100", True, torch.bfloat16),
        ("A100", True, torch.bfloat16),
        ("A100", False, torch.float32),  # full fine-tuning: AdamW needs float32 weights
        ("T4", True, torch.float32),  # fp16 base weights are not trained on: autocast instead
        ("T4", False, torch.float32),
        ("P100", True, torch.float32),
    ],
)
def test_base_dtype_follows_the_choice(monkeypatch, gpu, lora, dtype):
    fake_gpu(monkeypatch, gpu)
    assert base_dtype(CUDA, lora=lora) == dtype
    assert base_dtype(CPU, lora=lora) == torch.float32


# --------------------------------------------------------------------------- the gradient scaler
@pytest.mark.parametrize("gpu, enabled", [("T4", True), ("A100", False), ("P100", False)])
def test_grad_scaler_is_enabled_for_fp16_only(monkeypatch, gpu, enabled):
    fake_gpu(monkeypatch, gpu)
    made, real = [], torch.amp.GradScaler

    def recorder(*args, **kwargs):  # the real CUDA scaler cannot work on this machine
        made.append((args, kwargs))
        return real("cpu", enabled=False)

    monkeypatch.setattr(torch.amp, "GradScaler", recorder)
    grad_scaler(CUDA, True)
    assert made == [(("cuda",), {"enabled": enabled})]


def test_grad_scaler_on_the_cpu_is_disabled_and_saves_nothing():
    scaler = grad_scaler(CPU, True)
    assert not scaler.is_enabled()
    loss = torch.tensor(3.0)
    assert scaler.scale(loss) is loss  # the same tensor: backward is loss.backward()
    assert ckpt.scaler_state(scaler) == {}
    assert ckpt.scaler_state(torch.amp.GradScaler("cpu", init_scale=4.0)) == {
        "scaler": {
            "scale": 4.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": 2000,
            "_growth_tracker": 0,
        }
    }


def _step(scaler, seed=0):
    """One step as train.py takes it: backward through the scaler, unscale, clip, step, update."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(32, 8)
    loss = model(x).pow(2).mean()
    if scaler is None:  # the plain path, as before
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        scaler.step(opt)
        scaler.update()
    return norm, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.amp.GradScaler("cpu", init_scale=1.0),
        lambda: torch.amp.GradScaler("cpu"),  # 2**16: a power of two scales and unscales exactly
        lambda: torch.amp.GradScaler("cuda", enabled=False),  # what a CPU or bf16 run holds
    ],
)
def test_the_scaled_step_is_the_plain_step(make):
    norm, weights = _step(None)
    scaled_norm, scaled_weights = _step(make())
    assert torch.equal(norm, scaled_norm)
    assert all(torch.equal(a, b) for a, b in zip(weights, scaled_weights))


# --------------------------------------------------------------------------- in the trainer
def _trainer(tiny_config, scaler=None, **overrides):
    from agentic_rl.grpo import GRPOTrainer

    t = GRPOTrainer(tiny_config(**overrides))
    if scaler is not None:
        t.scaler = scaler
    return t


def _loss(model):
    return sum((p.float() ** 2).sum() for p in model.parameters() if p.requires_grad) * 1e-3


def test_a_cpu_trainer_holds_a_disabled_scaler(tiny_config):
    t = _trainer(tiny_config, bf16=True)
    assert not t.scaler.is_enabled()


def test_optimizer_step_through_a_working_scaler_is_the_plain_step(tiny_config):
    plain = _trainer(tiny_config)
    scaled = _trainer(tiny_config, torch.amp.GradScaler("cpu"))
    assert plain.optimizer_step(_loss(plain.model)) == scaled.optimizer_step(_loss(scaled.model))
    for a, b in zip(plain.model.parameters(), scaled.model.parameters()):
        assert torch.equal(a, b)
    assert scaled.scaler.get_scale() == 2.0**16  # no overflow: the scale stays


def test_an_overflow_skips_the_update_and_lowers_the_scale(tiny_config):
    t = _trainer(tiny_config, torch.amp.GradScaler("cpu", init_scale=1e38))
    before = [p.detach().clone() for p in t.model.parameters()]
    loss = 10 * sum(p.sum() for p in t.model.parameters())  # finite; 1e38 times it is not
    with pytest.warns(RuntimeWarning, match="gradient norm"):
        grad_norm, skipped = t.optimizer_step(loss)
    assert skipped and not grad_norm < float("inf")
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters()))
    assert t.scaler.get_scale() == pytest.approx(0.5e38)  # backed off
    grad_norm, skipped = t.optimizer_step(_loss(t.model))  # the next step goes through
    assert not skipped


def test_the_scaler_state_is_checkpointed_only_when_it_works(tiny_config, tmp_path):
    cpu = _trainer(tiny_config)
    state = ckpt.load(cpu.save_checkpoint(str(tmp_path / "cpu.pt")))
    assert "scaler" not in state  # the CPU format is unchanged

    fp16 = _trainer(tiny_config, torch.amp.GradScaler("cpu", init_scale=8.0))
    path = fp16.save_checkpoint(str(tmp_path / "fp16.pt"))
    assert ckpt.load(path)["scaler"]["scale"] == 8.0
    resumed = _trainer(tiny_config, torch.amp.GradScaler("cpu"))
    resumed.load_checkpoint(path)
    assert resumed.scaler.get_scale() == 8.0
    on_cpu = _trainer(tiny_config)  # resumed without fp16: the scale is not needed
    on_cpu.load_checkpoint(path)
    assert not on_cpu.scaler.is_enabled()
