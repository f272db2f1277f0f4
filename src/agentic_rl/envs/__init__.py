"""Tasks and environments. ``make_task(name, **kwargs)`` builds one by name."""

from __future__ import annotations

from .arithmetic import AdditionTask
from .base import Problem, Score, Task

TASKS = {"addition": AdditionTask}


def make_task(name: str, **kwargs) -> Task:
    """Build a registered task by name; unknown names raise with the list of known ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: known tasks are {sorted(TASKS)}")
    return TASKS[name](**kwargs)


__all__ = ["AdditionTask", "Problem", "Score", "Task", "TASKS", "make_task"]
