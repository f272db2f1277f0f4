"""Command line: ``python -m agentic_rl <recipe> [--profile quick|full] [--key value ...]``.

Every config field is a flag (``--num-generations 4``, ``--beta 0.04``, ``--epsilon-high none``);
the help text is the field's documentation (``python -m agentic_rl grpo --help``).

Every check runs before any compute (``agentic_rl.runs.preflight``): a bad value, a missing device,
an unwritable folder, a folder another run is using, or a corrupt or mismatched checkpoint ends the
command with status 2 (a bad flag or config) or 1 (the folder or checkpoint) and one line,
``error: <field>: <why> (got X)``, never a traceback. A run that is already complete says so and
changes nothing on disk, unless its end files are missing or damaged: it rewrites them from its
checkpoint and says which. A run whose every update was skipped ends with status 1.

:data:`RECIPES` is the one registry: a recipe's name and the chapter module that holds its config
(``CONFIG``) and trainer (``TRAINER``). A new chapter adds one line here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import sys

from .config import _TYPE_WORDS, ConfigError, RunError

__all__ = ["RECIPES", "recipe", "main", "add_dataclass_arguments", "config_from_args"]

#: The recipes: name -> the chapter module exporting ``CONFIG`` (its config class) and
#: ``TRAINER`` (its trainer class).
RECIPES = {
    "dapo": "agentic_rl.dapo",
    "early-experience": "agentic_rl.early_experience",
    "gcd": "agentic_rl.gcd",
    "gigpo": "agentic_rl.gigpo",
    "grpo": "agentic_rl.grpo",
    "ppo": "agentic_rl.agent",
    "rcgrpo": "agentic_rl.rcgrpo",
    "retool": "agentic_rl.retool",
    "starpo": "agentic_rl.starpo",
}
USAGE = (
    "usage: python -m agentic_rl {%s} [--profile quick|full] [--seed N] [--output-dir DIR] "
    "[--key value ...]"
)


def recipe(name: str):
    """The chapter module of recipe ``name`` (its ``CONFIG`` and ``TRAINER``)."""
    return importlib.import_module(RECIPES[name])


# --------------------------------------------------------------------------------------------------
# A CLI from the dataclass: one flag per field, help from the field's doc.


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false (got {text!r})")


def _parse_number(kind):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            why = f"must be {_TYPE_WORDS[kind]} (got {text!r})"
            raise argparse.ArgumentTypeError(why) from None

    parse.__name__ = kind.__name__
    return parse


def _optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "null") else kind(text)

    parse.__name__ = kind.__name__
    return parse


def _output_dir(text: str) -> str:
    if text.lower() in ("none", "null"):
        why = "is not a folder name here: leave --output-dir out to keep nothing on disk"
        raise argparse.ArgumentTypeError(f"{why} (got {text!r})")
    return text


class _Once(argparse.Action):
    """Store a flag's value; a flag given twice is an error that names it (argparse would keep
    the last value silently)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if hasattr(namespace, self.dest):
            old = getattr(namespace, self.dest)
            why = f"{option_string} is given more than once; give each flag once"
            raise argparse.ArgumentError(self, f"{why} (got {old!r}, then {values!r})")
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line: ``error: <field>: <why> (got X)`` and exit status 2.

    No abbreviations (``--learning 0.5`` is an unknown flag, not ``--learning-rate``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        m = re.match(r"argument --([\w-]+)(?:/-\w)?: (.*)", message, re.S)
        if m:
            message = f"{m.group(1).replace('-', '_')}: {m.group(2)}"
        self.exit(2, f"error: {' '.join(message.split())}\n")


def add_dataclass_arguments(
    parser: argparse.ArgumentParser, cls, defaults: dict | None = None
) -> None:
    """One ``--field-name`` flag per dataclass field, typed, with the field's help text."""
    defaults = defaults or {}
    types = cls._field_types()
    parsers = {bool: _parse_bool, int: _parse_number(int), float: _parse_number(float), str: str}
    for f in dataclasses.fields(cls):
        base, optional = types[f.name]
        kind = _optional(parsers[base]) if optional else parsers[base]
        kind = _output_dir if f.name == "output_dir" else kind
        default = defaults.get(f.name, f.default)
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=kind,
            action=_Once,
            default=argparse.SUPPRESS,
            metavar=base.__name__.upper(),
            help=f"{f.metadata.get('help', '')} [default: {default}]",
        )


def config_from_args(cls, argv: list[str] | None, prog: str):
    """Parse ``argv`` into ``cls.from_profile(profile, **given flags)``.

    A bad flag or value exits with status 2 and one line, ``error: <field>: <why> (got X)``.
    """
    pre = _Parser(add_help=False, prog=prog)
    pre.add_argument("--profile", default="quick")
    known, _ = pre.parse_known_args(argv)
    if known.profile not in cls.PROFILES:
        choices = sorted(cls.PROFILES)
        pre.error(f"profile: unknown profile; choose one of {choices} (got {known.profile!r})")
    parser = _Parser(prog=prog, description=cls.__doc__)
    add_dataclass_arguments(parser, cls, cls.PROFILES[known.profile])
    given = vars(parser.parse_args(argv))
    given.pop("profile", None)
    try:
        return cls.from_profile(known.profile, **given)
    except ValueError as err:
        parser.error(str(err))


# --------------------------------------------------------------------------------------------------
# python -m agentic_rl


def _usage() -> str:
    lines = [USAGE % ", ".join(sorted(RECIPES)), "", "recipes:"]
    width = max(map(len, RECIPES)) + 2
    for name in sorted(RECIPES):
        doc = recipe(name).CONFIG.__doc__ or ""
        lines.append(f"  {name:<{width}}{doc.strip().splitlines()[0]}")
    lines += [
        "",
        "python -m agentic_rl <recipe> --help lists the recipe's flags.",
        "python -m agentic_rl experiment LAB [--seeds N] [--jobs J] records a lab's arms x seeds"
        " (--help: its flags).",
    ]
    return "\n".join(lines)


def _error(err: Exception) -> int:
    print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
    return 2 if isinstance(err, ConfigError) else 1


def _report(trainer, summary: dict) -> None:
    """Where the run's files are (stderr), and its summary as JSON (stdout)."""
    from .runs import OUTPUT_FILES

    config, out = trainer.config, trainer.config.output_dir
    rewritten = getattr(trainer, "rewritten", [])
    if trainer.was_complete:
        done = (
            f"rewrote {', '.join(rewritten)} from its checkpoint (missing or different)"
            if rewritten
            else "nothing was changed"
        )
        print(
            f"the run in {out} is already complete ({trainer.step} of {config.max_steps} RL "
            f"steps); {done}. Give a larger --max-steps to continue it, or another --output-dir.",
            file=sys.stderr,
        )
    if out:
        files = [os.path.join(out, f) for f in OUTPUT_FILES]
        verb = "files in" if trainer.was_complete and not rewritten else "wrote to"
        shown = [f"  {p}" for p in files if os.path.exists(p)]
        print(f"{verb} {os.path.abspath(out)}:", *shown, sep="\n", file=sys.stderr)
    else:
        print("no --output-dir: nothing was written to disk", file=sys.stderr)
    rounded = {
        k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items() if k != "config"
    }
    print(json.dumps(rounded, indent=2))


def experiment_main(argv: list[str]) -> int:
    """``python -m agentic_rl experiment LAB``: a lab's arms x seeds, recorded
    (:mod:`agentic_rl.records`)."""
    from .records import EXPERIMENTS

    p = _Parser(
        prog="python -m agentic_rl experiment",
        description="Run a lab's arms x seeds as independent processes and record them in "
        "labs/results/<lab>.json; or, with --seed, one seed of it (its cells only).",
    )
    p.add_argument("lab", help=f"the lab: {', '.join(EXPERIMENTS)}")
    p.add_argument("--seeds", type=_parse_number(int), default=None,
                   help="seeds 0..N-1 (default: the lab's own number)")
    p.add_argument("--seed", type=_parse_number(int), default=None,
                   help="run this one seed here and write its cells to --output")
    p.add_argument("--arms", default=None, help="comma-separated arms (default: all)")
    p.add_argument("--arm", action="append", default=None,
                   help="one arm (repeat it for several; for names that hold a comma)")
    p.add_argument("--jobs", type=_parse_number(int), default=os.cpu_count() or 1,
                   help="processes at a time (default: one per core)")
    p.add_argument("--profile", choices=("quick", "full"), default="quick")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--output", default=None,
                   help="with --seed: a folder for its cells, or a .json file for one arm's cell")
    p.add_argument("--work-dir", default=None, help="the sweep's cells (runs/experiments/LAB)")
    p.add_argument("--record", default=None, help="the record (labs/results/LAB.json)")
    p.add_argument("--replace", action="store_true",
                   help="discard cells of another sweep found in the work folder")
    a = p.parse_args(argv)
    from . import records

    arms = (a.arms.split(",") if a.arms else []) + (a.arm or []) or None
    try:
        if a.lab not in EXPERIMENTS:
            raise records.RecordError(
                f"unknown lab {a.lab!r}; labs with an experiment: {', '.join(EXPERIMENTS)}"
            )
        if a.seed is not None:
            if a.output is None:
                raise records.RecordError("--seed needs --output (a folder, or a .json file)")
            if a.output.endswith(".json") and len(arms or ()) != 1:
                raise records.RecordError("a .json --output holds one cell: give one --arm")
            cells, _ = records.run_cells(a.lab, a.seed, arms, profile=a.profile, device=a.device)
            if a.output.endswith(".json"):
                from .checkpoint import write_atomically

                cell = next(iter(cells.values()))
                write_atomically(a.output, json.dumps(cell, indent=1).encode())
                print(a.output)
            else:
                print(*records.write_cells(cells, a.output), sep="\n")
            return 0
        n = a.seeds if a.seeds is not None else records.experiment(a.lab).SEEDS
        path = records.sweep(
            a.lab, range(n), arms, jobs=a.jobs, profile=a.profile, device=a.device,
            work_dir=a.work_dir, record=a.record, replace=a.replace,
        )
    except RunError as err:
        return _error(err)
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "experiment":
        return experiment_main(argv[1:])
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
    name, rest = argv[0], argv[1:]
    chapter = recipe(name)
    config = config_from_args(chapter.CONFIG, rest, prog=f"python -m agentic_rl {name}")
    try:
        from .runs import preflight, run_recipe

        preflight(config)  # every check, before any compute
        from .utils import setup  # heavy imports after argument errors are reported

        setup(config.seed, threads=1 if config.device in ("auto", "cpu") else None)
        trainer = chapter.TRAINER(config)
        try:
            summary = run_recipe(trainer)
        finally:
            trainer.close()
    except RunError as err:
        return _error(err)
    _report(trainer, summary)
    return 0
