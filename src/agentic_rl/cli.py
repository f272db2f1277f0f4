"""Command line: ``python -m agentic_rl <recipe> [--profile quick|full] [--key value ...]``.

Every config field is a flag (``--num-generations 4``, ``--beta 0.04``, ``--epsilon-high none``);
the help text is the field's documentation (``python -m agentic_rl grpo --help``).

Every check runs before any compute (``agentic_rl.train.preflight``): a bad value, a missing device,
an unwritable folder, a folder another run is using, or a corrupt or mismatched checkpoint ends the
command with status 2 (a bad flag or config) or 1 (the folder or checkpoint) and one line,
``error: <field>: <why> (got X)``, never a traceback. A run that is already complete says so and
changes nothing on disk.
"""

from __future__ import annotations

import json
import os
import sys

from .config import (
    ConfigError,
    GCDConfig,
    GRPOConfig,
    PPOConfig,
    RCGRPOConfig,
    ReToolConfig,
    RunError,
    StarPOConfig,
    config_from_args,
)

RECIPES = {
    "gcd": GCDConfig,
    "grpo": GRPOConfig,
    "ppo": PPOConfig,
    "rcgrpo": RCGRPOConfig,
    "retool": ReToolConfig,
    "starpo": StarPOConfig,
}
USAGE = (
    "usage: python -m agentic_rl {%s} [--profile quick|full] [--seed N] [--output-dir DIR] "
    "[--key value ...]"
)


def _usage() -> str:
    lines = [USAGE % ", ".join(sorted(RECIPES)), "", "recipes:"]
    for name, cls in sorted(RECIPES.items()):
        lines.append(f"  {name:<8}{(cls.__doc__ or '').strip().splitlines()[0]}")
    lines += ["", "python -m agentic_rl <recipe> --help lists the recipe's flags."]
    return "\n".join(lines)


def _error(err: Exception) -> int:
    print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
    return 2 if isinstance(err, ConfigError) else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in RECIPES:
        if argv and argv[0] not in ("-h", "--help"):
            known = ", ".join(sorted(RECIPES))
            print(
                f"{_usage()}\nerror: unknown recipe {argv[0]!r}; known recipes: {known}",
                file=sys.stderr,
            )
            return 2
        print(_usage())
        return 0 if argv else 2
    recipe, rest = argv[0], argv[1:]
    config = config_from_args(RECIPES[recipe], rest, prog=f"python -m agentic_rl {recipe}")
    try:
        from .train import OUTPUT_FILES, preflight

        preflight(config)  # every check, before any compute
        from .utils import setup  # heavy imports after argument errors are reported

        setup(config.seed, threads=1 if config.device in ("auto", "cpu") else None)
        if recipe == "grpo":
            from .train import GRPOTrainer as Trainer
        elif recipe == "ppo":
            from .agent import AgentTrainer as Trainer
        elif recipe == "retool":
            from .retool import ReToolTrainer as Trainer
        elif recipe == "rcgrpo":
            from .rcgrpo import RCGRPOTrainer as Trainer
        elif recipe == "gcd":
            from .gcd import GCDTrainer as Trainer
        else:
            from .starpo import StarPOTrainer as Trainer
        from .train import run_recipe

        trainer = Trainer(config)
        try:
            summary = run_recipe(trainer)
        finally:
            trainer.close()
    except RunError as err:
        return _error(err)
    out = config.output_dir
    if trainer.was_complete:
        print(
            f"the run in {out} is already complete ({trainer.step} of {config.max_steps} RL "
            "steps); nothing was changed. Give a larger --max-steps to continue it, or another "
            "--output-dir.",
            file=sys.stderr,
        )
    if out:
        written = [
            os.path.join(out, f) for f in OUTPUT_FILES if os.path.exists(os.path.join(out, f))
        ]
        verb = "files in" if trainer.was_complete else "wrote to"
        print(
            f"{verb} {os.path.abspath(out)}:",
            *(f"  {p}" for p in written),
            sep="\n",
            file=sys.stderr,
        )
    else:
        print("no --output-dir: nothing was written to disk", file=sys.stderr)
    shown = {
        k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items() if k != "config"
    }
    print(json.dumps(shown, indent=2))
    return 0
