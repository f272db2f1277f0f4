"""Command line: ``python -m agentic_rl <recipe> [--profile quick|full] [--seed N] [--output-dir DIR] [--key value ...]``.

Every config field is a flag (``--num-generations 4``, ``--beta 0.04``, ``--epsilon-high none``); the
help text is the field's documentation (``python -m agentic_rl grpo --help``).
"""

from __future__ import annotations

import json
import sys

from .config import GRPOConfig, PPOConfig, config_from_args

RECIPES = {"grpo": GRPOConfig, "ppo": PPOConfig}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in RECIPES:
        known = ", ".join(sorted(RECIPES))
        msg = f"usage: python -m agentic_rl {{{known}}} [--profile quick|full] [--seed N] [--output-dir DIR] [--key value ...]"
        if argv and argv[0] not in ("-h", "--help"):
            print(f"{msg}\nerror: unknown recipe {argv[0]!r}; known recipes: {known}", file=sys.stderr)
            return 2
        print(msg)
        return 0 if argv else 2
    recipe, rest = argv[0], argv[1:]
    config = config_from_args(RECIPES[recipe], rest, prog=f"python -m agentic_rl {recipe}")
    from .utils import setup  # heavy imports after argument errors are reported

    setup(config.seed, threads=1 if config.device in ("auto", "cpu") else None)
    if recipe == "grpo":
        from .train import run_grpo as run
    else:
        from .agent import run_ppo as run
    summary = run(config)
    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items() if k != "config"}
    print(json.dumps(shown, indent=2))
    return 0
