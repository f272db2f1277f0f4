"""The package's errors about what a user asked for: the ground floor every module may import.

A :class:`RunError` is an error in the input (a config, a folder, a checkpoint, the machine), not
a bug: the CLI prints it as one line, ``error: <message>``, with no traceback. This module
imports nothing from the package, so that any module can raise these without an import circle.
"""

from __future__ import annotations

__all__ = ["ConfigError", "IsolationError", "RunError"]


class RunError(Exception):
    """An error in what the user asked for (a config, a folder, a checkpoint), not a bug.

    The CLI prints these as one line, ``error: <message>``, with no traceback.
    """


class ConfigError(RunError, ValueError):
    """A config field with a bad value: ``str(err)`` is ``"<field>: <why> (got <value>)"``."""

    def __init__(self, field: str, why: str, value=None):
        self.field, self.why, self.value = field, why, value
        super().__init__(f"{field}: {why} (got {value!r})")


class IsolationError(RunError):
    """Model-written code would run without the kernel's boundary around it (no working
    bubblewrap here) and the user did not opt in (:func:`agentic_rl.jail.require_boundary`)."""
