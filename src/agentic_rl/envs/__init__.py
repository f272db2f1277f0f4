"""Tasks and environments.

``make_task(name, **kwargs)`` / ``make_env(name, **kwargs)`` build one by name.
"""

from __future__ import annotations

from .arithmetic import AdditionTask
from .bandit import BanditEnv
from .base import EnvWrapper, MultiTurnEnv, Problem, Score, Task
from .filesystem import FileSystemEnv
from .frozenlake import FrozenLakeEnv
from .household import HouseholdEnv
from .multiaction import MultiActionEnv
from .multiply import MultiplyEnv
from .python_tool import PythonToolEnv
from .sokoban import SokobanEnv
from .sums import SumsTask

TASKS = {"addition": AdditionTask, "sums": SumsTask}
ENVS = {
    "bandit": BanditEnv,
    "filesystem": FileSystemEnv,
    "frozenlake": FrozenLakeEnv,
    "household": HouseholdEnv,
    "multiply": MultiplyEnv,
    "python-tool": PythonToolEnv,
    "sokoban": SokobanEnv,
}


def make_task(name: str, **kwargs) -> Task:
    """Build a registered task by name; unknown names raise with the list of known ones."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}: known tasks are {sorted(TASKS)}")
    return TASKS[name](**kwargs)


def make_env(name: str, **kwargs) -> MultiTurnEnv:
    """Build a registered multi-turn environment by name;
    unknown names raise with the list of known ones."""
    if name not in ENVS:
        raise ValueError(f"unknown env {name!r}: known envs are {sorted(ENVS)}")
    return ENVS[name](**kwargs)


__all__ = [
    "AdditionTask",
    "BanditEnv",
    "ENVS",
    "EnvWrapper",
    "FileSystemEnv",
    "FrozenLakeEnv",
    "HouseholdEnv",
    "MultiActionEnv",
    "MultiTurnEnv",
    "MultiplyEnv",
    "PythonToolEnv",
    "SokobanEnv",
    "SumsTask",
    "Problem",
    "Score",
    "Task",
    "TASKS",
    "make_env",
    "make_task",
]
