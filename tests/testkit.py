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
