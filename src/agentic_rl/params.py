"""A config field and its facts, declared in one place: the ground floor of every config.

:func:`param` declares a field: its default and help text (the CLI's ``--help``) and, where it
has them, its range (``low``, ``high``, ``why``: checked by :func:`agentic_rl.bounds.check_bounds`)
and whether it counts tokens or turns (``tokens``: at most the context budget). :func:`defaults`
gives an inherited field a new default in a recipe, keeping its help and range. A chapter's
knowledge about its own fields so lives in its own config, and ``bounds`` names none of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

__all__ = ["defaults", "param"]


def param(default, help: str, *, low=None, high=None, why: str = "", tokens: bool = False):
    """A config field: ``default``, ``help`` and, optionally, the range where a run is defined
    (``low`` / ``high``, ``why`` it stops there) and ``tokens=True`` for a length in tokens."""
    metadata = {"help": help}
    if low is not None or high is not None:
        metadata["bounds"] = (low, high, why)
    if tokens:
        metadata["tokens"] = True
    return field(default=default, metadata=metadata)


def defaults(**values):
    """Class decorator, under ``@dataclass``: new defaults for inherited fields, which keep their
    type and help text (a recipe writes only what differs from the fields it inherits)."""

    def apply(cls):
        inherited = {}
        for base in cls.__mro__[1:]:
            if dataclasses.is_dataclass(base):
                for f in dataclasses.fields(base):
                    inherited.setdefault(f.name, f)
        own = cls.__dict__.get("__annotations__")
        if own is None:
            own = {}
            cls.__annotations__ = own
        for name, value in values.items():
            if name in own:  # the class declares the field itself (with its own help): it wins
                continue
            if name not in inherited:
                raise TypeError(f"{cls.__name__}: no inherited field {name!r} to give a default")
            own[name] = inherited[name].type
            setattr(cls, name, field(default=value, metadata=inherited[name].metadata))
        return cls

    return apply
