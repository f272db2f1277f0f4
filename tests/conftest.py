"""Shared fixtures: offline Hugging Face, one torch thread, a tiny tokenizer/model for the addition task.

The environment variables are set before anything imports ``transformers`` or ``huggingface_hub`` (pytest
imports this file first), so no test can reach the network.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

#: The tiny Llama every unit test uses (about 20k parameters).
TINY_MODEL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)


@pytest.fixture(scope="session")
def task():
    from agentic_rl.envs import AdditionTask

    return AdditionTask()


@pytest.fixture(scope="session")
def tokenizer(task):
    from agentic_rl.models import build_tokenizer

    return build_tokenizer(task.vocabulary())


@pytest.fixture
def model(tokenizer):
    """A fresh tiny model per test (tests may wrap it with LoRA or replace ``generate``)."""
    from agentic_rl.models import build_model

    return build_model(tokenizer, seed=0, **TINY_MODEL)


@pytest.fixture
def tiny_config():
    """Factory for a fast GRPOConfig: tiny model, tiny eval, no progress bars; keyword overrides win."""
    from agentic_rl.config import GRPOConfig

    def make(**overrides):
        base = dict(
            digits=1,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=64,
            sft_steps=0,
            sft_batch_size=16,
            max_steps=2,
            prompts_per_step=4,
            num_generations=4,
            max_completion_length=4,
            eval_size=8,
            eval_samples=1,
            device="cpu",
            disable_tqdm=True,
        )
        base.update(overrides)
        return GRPOConfig(**base)

    return make
