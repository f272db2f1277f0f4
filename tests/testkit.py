"""What the test files share besides fixtures: import it as ``from testkit import ...``.

(Not ``from conftest import ...``: pytest collects ``labs/`` first, and ``labs/assignments`` has a
``conftest.py`` of its own, which would then own the module name ``conftest``.)
"""

from __future__ import annotations

import shutil
import subprocess

import torch

#: The tiny Llama every unit test uses (about 20k parameters).
TINY_MODEL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    intermediate_size=64,
)  # fmt: skip

#: What every tiny run sets: the tiny model with one layer, two RL steps, one sample per eval
#: prompt, the CPU, no progress bars.
TINY_RUN = dict(
    TINY_MODEL, num_hidden_layers=1, max_steps=2, eval_samples=1, device="cpu", disable_tqdm=True
)

_GRPO = dict(
    digits=1, sft_steps=0, sft_batch_size=16, prompts_per_step=4, num_generations=4,
    max_completion_length=4, eval_size=8,
)  # fmt: skip

#: What each recipe of ``cli.RECIPES`` adds to :data:`TINY_RUN` to be tiny: the values its
#: chapter's tests were measured with (change one and that chapter's asserted numbers move).
TINY_RECIPE = {
    "grpo": _GRPO,  # 1-digit addition
    "dapo": dict(_GRPO, sft_steps=30),  # a short warm start: a group's answers can differ
    "ppo": dict(sft_steps=0, sft_batch_size=16, prompts_per_step=8, eval_size=8, map_size=3),
    "starpo": dict(sft_steps=0, prompts_per_step=4, num_generations=4, mini_batch_size=4,
                   eval_size=4),
    "rcgrpo": dict(sft_steps=2, sft_batch_size=4, prompts_per_step=2, num_generations=4,
                   eval_size=4, eval_samples=2),
    "retool": dict(sft_steps=0, prompts_per_step=4, num_generations=2, eval_size=4),
    "gcd": dict(sft_steps=3, sft_batch_size=4, prompts_per_step=2, num_generations=4, eval_size=4,
                num_probes=4, coupling_every=2),
    "gigpo": dict(sft_steps=0, max_steps=1, prompts_per_step=2, num_generations=4, eval_size=2),
    "early-experience": dict(sft_steps=6, sft_batch_size=4, initial_steps=2, world_model_steps=2,
                             num_demos=3, num_alternatives=2, proposals=4, prompts_per_step=2,
                             num_generations=4, eval_size=2, alternatives="any"),
}  # fmt: skip


def tiny_values(name: str, **overrides) -> dict:
    """The fields :func:`tiny` sets for recipe ``name`` (to spell them as CLI flags, say)."""
    return {**TINY_RUN, **TINY_RECIPE[name], **overrides}


def tiny(name: str, **overrides):
    """A tiny config of recipe ``name`` (``cli.RECIPES``): its quick profile, with
    :data:`TINY_RUN` and the recipe's :data:`TINY_RECIPE` row; keyword overrides win."""
    from agentic_rl.cli import recipe

    return recipe(name).CONFIG.from_profile("quick", **tiny_values(name, **overrides))


def tiny_model(tokenizer, seed: int = 0, **overrides):
    """A fresh :data:`TINY_MODEL` for ``tokenizer``; keyword overrides win
    (``num_hidden_layers=1``: the one-layer model of :data:`TINY_RUN`)."""
    from agentic_rl.models import build_model

    return build_model(tokenizer, seed=seed, **{**TINY_MODEL, **overrides})


def fake_generate(tokenizer, completions, width=None):
    """A ``generate`` that returns the given completions (lists of tokens) after the prompt,
    right-padded to ``width`` (default: the longest completion)."""
    width = width or max(len(c) for c in completions)

    def generate(input_ids, attention_mask, **kwargs):
        rows = []
        for c in completions:
            ids = tokenizer.convert_tokens_to_ids(c)
            rows.append(ids + [tokenizer.pad_token_id] * (width - len(ids)))
        return torch.cat([input_ids, torch.tensor(rows, dtype=input_ids.dtype)], dim=1)

    return generate


#: bubblewrap, where it is installed.
BWRAP = shutil.which("bwrap")


def jail_is_expected() -> bool:
    """Whether bubblewrap can make namespaces here (it cannot in some containers): then the
    sandbox must use it."""
    if BWRAP is None:
        return False
    for extra in ([], ["--unshare-user"]):
        command = [BWRAP, *extra, "--unshare-net", "--ro-bind", "/", "/", "true"]
        if subprocess.run(command, capture_output=True, check=False).returncode == 0:
            return True
    return False
