"""A multi-turn tool-calling environment in the style of BFCL's multi-turn file system.

BFCL (the Berkeley Function-Calling Leaderboard, v3/v4 multi-turn) gives a model a stateful API,
``GorillaFileSystem`` (``ls``, ``cd``, ``mkdir``, ``touch``, ``cat``, ``mv``, ``cp``, ``rm``, ...),
and a user request; the model answers with function calls, each call's result comes back, and the
episode is scored **by state**: replay the ground-truth calls on a fresh copy of the initial state,
then require (1) the model's final state to equal the replay's (``state_checker``: the public
attributes, i.e. the tree, not the current directory) and (2) every result the replay produced to
be among the model's results (``response_checker``, an unordered multiset inclusion: the calls that
matter were made). This module is a small, dependency-free version of that, recognisably BFCL's
(the functions, their error messages and the scoring follow ``bfcl_eval`` 2026.3.23), sized for a
word-level model trained from scratch:

- **Calls** are written ``name arg1 arg2`` (BFCL's ``mv(source='a', destination='b')`` with
  positional arguments, one word each): ``ls``, ``cd folder``, ``mkdir dir_name``,
  ``touch file_name``, ``cat file_name``, ``mv source destination``, ``cp source destination``,
  ``rm file_name``; ``done`` ends the episode (BFCL's model ends its turn by answering in text).
- **Parsing is strict**: an unknown function, the wrong number of arguments, or an argument of the
  wrong type (every argument is a name: a word with a letter and no ``/``; ``cd`` also takes
  ``..``) is answered with an ``error ...`` observation and ``format_ok = False``; the episode goes
  on, as in BFCL, where an error is just another execution result. ``step`` never raises, also not
  after the episode is over (the answer is then ``error episode over`` with reward 0).
- **Reward**: binary, given when the episode ends (``done``, or the turn limit): 1 if the state
  matches the golden replay's and the golden results are covered, else 0. ``info["success"]``
  says the same.

Tasks are generated per seed: a root with two folders and two files, two files in each folder,
names drawn from small pools (so held-out seeds are unseen combinations). Two families:

========  ===================================================  ===============================
family    goal (words after ``task``)                          golden calls
========  ===================================================  ===============================
easy      ``rename F to N`` / ``copy F to N`` / ``delete F``    one call in the root, e.g.
          / ``make folder D`` / ``show F`` / ``move F into D``  ``mv F N``
hard      ``in S rename F to N`` / ``in S delete F`` /          ``cd S`` first, then one or two
          ``in S show F`` / ``in S make folder D and move F     calls, e.g. ``cd S`` ``mkdir D``
          into it``                                            ``mv F D``
========  ===================================================  ===============================

The scripted expert plays the golden calls then ``done``; :func:`corrupt` makes BFCL's failure
modes from them (a wrong argument, a skipped call, two calls swapped, an extra call) for the
mixed-quality trajectories of the RC-GRPO chapter. A corrupted trajectory is not failed by
construction: it is scored like any other (an extra ``ls`` changes nothing and still succeeds).
"""

from __future__ import annotations

import copy
import random

ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"
#: BFCL GorillaFileSystem functions kept here, with their parameter names (all names).
FUNCTIONS: dict[str, tuple[str, ...]] = {
    "ls": (),
    "cd": ("folder",),
    "mkdir": ("dir_name",),
    "touch": ("file_name",),
    "cat": ("file_name",),
    "mv": ("source", "destination"),
    "cp": ("source", "destination"),
    "rm": ("file_name",),
}
DONE = "done"
FILES = (
    "report.txt notes.txt draft.md data.csv todo.txt log.txt plan.md list.csv memo.txt "
    "budget.csv summary.md ideas.txt"
).split()
FOLDERS = "docs archive temp backup work photos music projects".split()
CONTENTS = "hello budget results draft agenda invoice recipe poem".split()
EASY_GOALS = ("rename", "copy", "delete", "make_folder", "show", "move_into")
HARD_GOALS = ("rename", "delete", "show", "make_folder_move")
CORRUPTIONS = ("wrong_arg", "skip", "swap", "extra")
_MESSAGE_WORDS = (
    "task in rename copy delete make folder show move into and it to result error ok cwd content "
    "moved copied removed created no such file or directory exists not a takes arguments got "
    "unknown function invalid name empty call episode over already root itself many / .. "
    "0 1 2 3 4 5 6 7 8 9"
).split()


def _valid_name(word: str) -> bool:
    """A file or folder name: letters, digits, ``.``, ``_``, ``-``, at least one letter, and not
    a function's name or ``done`` (BFCL refuses ``|/\\?%*:"><`` in names)."""
    return (
        all(c.isalnum() or c in "._-" for c in word)
        and any(c.isalpha() for c in word)
        and word not in FUNCTIONS
        and word != DONE
    )


class FileSystem:
    """The state: a tree of folders (dicts) and files (their content, a word), and the current
    folder. Equality compares the tree only (BFCL compares public attributes; the current
    directory is private there)."""

    def __init__(self, tree: dict):
        self.tree = copy.deepcopy(tree)
        self.path: list[str] = []  # the current folder, from the root

    def __eq__(self, other) -> bool:
        return isinstance(other, FileSystem) and self.tree == other.tree

    @property
    def cwd(self) -> dict:
        folder = self.tree
        for name in self.path:
            folder = folder[name]
        return folder

    # Each function returns its result as words; errors start with "error" (BFCL's messages,
    # shortened to this vocabulary).
    def ls(self) -> str:
        return "result " + (" ".join(sorted(self.cwd)) or "empty")

    def cd(self, folder: str) -> str:
        if folder == "..":
            if not self.path:
                return "error cd already root"
            self.path.pop()
            return "cwd " + (self.path[-1] if self.path else "/")
        if not isinstance(self.cwd.get(folder), dict):
            return f"error cd {folder} no such directory"
        self.path.append(folder)
        return f"cwd {folder}"

    def mkdir(self, dir_name: str) -> str:
        if dir_name in self.cwd:
            return f"error mkdir {dir_name} exists"
        self.cwd[dir_name] = {}
        return f"created {dir_name}"

    def touch(self, file_name: str) -> str:
        if file_name in self.cwd:
            return f"error touch {file_name} exists"
        self.cwd[file_name] = "empty"
        return f"created {file_name}"

    def cat(self, file_name: str) -> str:
        item = self.cwd.get(file_name)
        if not isinstance(item, str):
            return f"error cat {file_name} no such file"
        return f"content {item}"

    def _move(self, fn: str, source: str, destination: str, keep: bool) -> str:
        cwd = self.cwd
        if source == destination:  # BFCL: a folder moved or copied into itself
            return f"error {fn} {source} to itself"
        if source not in cwd:
            return f"error {fn} {source} no such file or directory"
        item = cwd[source]
        target = cwd.get(destination)
        if isinstance(target, dict):  # into an existing folder, under the same name
            if source in target:
                return f"error {fn} {source} exists"
            target[source] = copy.deepcopy(item)
        elif target is not None:
            return f"error {fn} {destination} exists"
        else:  # a new name in the current folder
            cwd[destination] = copy.deepcopy(item)
        if not keep:
            del cwd[source]
        return f"{'copied' if keep else 'moved'} {source} to {destination}"

    def mv(self, source: str, destination: str) -> str:
        return self._move("mv", source, destination, keep=False)

    def cp(self, source: str, destination: str) -> str:
        return self._move("cp", source, destination, keep=True)

    def rm(self, file_name: str) -> str:
        if file_name not in self.cwd:
            return f"error rm {file_name} no such file or directory"
        del self.cwd[file_name]
        return f"removed {file_name}"

    def execute(self, call: str) -> tuple[str, bool]:
        """Run one call written ``name arg ...``: ``(result, well_formed)``; never raises."""
        words = call.split() if isinstance(call, str) else []
        if not words:
            return "error empty call", False
        name, args = words[0], words[1:]
        if name not in FUNCTIONS:
            return f"error unknown function {name}", False
        if len(args) != len(FUNCTIONS[name]):
            got = len(args) if len(args) < 10 else "many"
            return f"error {name} takes {len(FUNCTIONS[name])} arguments got {got}", False
        for arg in args:
            if not (_valid_name(arg) or (name == "cd" and arg == "..")):
                return f"error {name} invalid name {arg}", False
        return getattr(self, name)(*args), True


class FileSystemEnv:
    """BFCL-style multi-turn file-system tasks as a ``MultiTurnEnv`` (module docstring).

    Args:
        hard_fraction: probability that a seed's task is from the hard family.
        max_turns: calls per episode (``done`` included); at the limit the episode is scored.
    """

    name = "filesystem"

    def __init__(self, *, hard_fraction: float = 0.5, max_turns: int = 5):
        if not 0.0 <= hard_fraction <= 1.0:
            raise ValueError(f"hard_fraction must be in [0, 1], got {hard_fraction!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns!r}")
        self.hard_fraction = float(hard_fraction)
        self.max_turns = int(max_turns)
        self.task: dict | None = None
        self.fs: FileSystem | None = None
        self._done = True

    def vocabulary(self) -> list[str]:
        words = [*FUNCTIONS, DONE, *FILES, *FOLDERS, *CONTENTS, *_MESSAGE_WORDS]
        words += [ACTION_OPEN, ACTION_CLOSE, "empty", "make_folder"]
        return sorted(set(words))

    # ------------------------------------------------------------------ tasks
    def make_task(self, seed: int) -> dict:
        """The task of ``seed``: ``family``, ``goal`` (words), ``tree`` (initial state) and
        ``golden`` (the ground-truth calls)."""
        rng = random.Random(seed)
        folders, files = rng.sample(FOLDERS, 5), rng.sample(FILES, 8)
        contents = [rng.choice(CONTENTS) for _ in files]
        top, (new_folder, *_) = folders[:2], folders[2:]
        tree: dict = {top[0]: {}, top[1]: {}}
        for k, (f, c) in enumerate(zip(files[:6], contents)):
            (tree if k < 2 else tree[top[k % 2]])[f] = c
        new_file = files[6]
        hard = rng.random() < self.hard_fraction
        if not hard:
            kind, f = rng.choice(EASY_GOALS), files[rng.randrange(2)]
            goal, golden = {
                "rename": (f"rename {f} to {new_file}", [f"mv {f} {new_file}"]),
                "copy": (f"copy {f} to {new_file}", [f"cp {f} {new_file}"]),
                "delete": (f"delete {f}", [f"rm {f}"]),
                "make_folder": (f"make folder {new_folder}", [f"mkdir {new_folder}"]),
                "show": (f"show {f}", [f"cat {f}"]),
                "move_into": (f"move {f} into {top[1]}", [f"mv {f} {top[1]}"]),
            }[kind]
        else:
            kind, s = rng.choice(HARD_GOALS), rng.choice(top)
            f = rng.choice([name for name in tree[s]])
            goal, golden = {
                "rename": (f"in {s} rename {f} to {new_file}", [f"mv {f} {new_file}"]),
                "delete": (f"in {s} delete {f}", [f"rm {f}"]),
                "show": (f"in {s} show {f}", [f"cat {f}"]),
                "make_folder_move": (
                    f"in {s} make folder {new_folder} and move {f} into it",
                    [f"mkdir {new_folder}", f"mv {f} {new_folder}"],
                ),
            }[kind]
            golden = [f"cd {s}", *golden]
        return dict(
            family="hard" if hard else "easy", kind=kind, goal=goal, tree=tree, golden=golden
        )

    def task_family(self, seed: int) -> str:
        """``"easy"`` or ``"hard"``: the family of ``seed``'s task."""
        return self.make_task(seed)["family"]

    def golden_replay(self, task: dict) -> tuple[FileSystem, list[str]]:
        """The ground truth: the golden calls on a fresh copy of the initial state
        (the final state and the results)."""
        fs = FileSystem(task["tree"])
        return fs, [fs.execute(call)[0] for call in task["golden"]]

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int) -> str:
        self.task = self.make_task(seed)
        self.fs = FileSystem(self.task["tree"])
        self.results: list[str] = []
        self.calls: list[str] = []
        self._turn, self._done, self.success = 0, False, False
        return f"task {self.task['goal']} {ACTION_OPEN}"

    def score(self) -> bool:
        """BFCL's check: state equal to the golden replay's, and the golden results covered
        (each golden result among the episode's results, counted with multiplicity)."""
        replay, golden_results = self.golden_replay(self.task)
        remaining = list(self.results)
        for result in golden_results:
            if result not in remaining:
                return False
            remaining.remove(result)
        return self.fs == replay

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        if self._done:
            info = dict(terminated=True, truncated=False, format_ok=False, success=False)
            return "error episode over", 0.0, True, info
        self._turn += 1
        call = action_text.strip() if isinstance(action_text, str) else ""
        self.calls.append(call)
        if call == DONE:
            result, format_ok = "", True
        else:
            result, format_ok = self.fs.execute(call)
            self.results.append(result)
        terminated = call == DONE
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        self.success = self._done and self.score()
        info = dict(
            terminated=terminated, truncated=truncated, format_ok=format_ok, success=self.success
        )
        obs = "" if self._done else f"{result} {ACTION_OPEN}"
        return obs, float(self.success), self._done, info

    # ------------------------------------------------------------------ demonstrations
    def expert_action(self) -> str:
        """The scripted expert's next call, for an episode that has followed it so far (the
        golden calls in order, then ``done``)."""
        if self._done:
            return DONE
        calls = [*self.task["golden"], DONE]
        return calls[min(self._turn, len(calls) - 1)]

    def expert_calls(self, seed: int) -> list[str]:
        """The scripted expert: the golden calls, then ``done``."""
        return [*self.make_task(seed)["golden"], DONE]

    def play(self, seed: int, calls: list[str]) -> tuple[list[tuple[str, str]], float]:
        """Reset with ``seed``, make ``calls`` (until the episode ends):
        ``(observation, call)`` pairs and the episode's reward."""
        obs, pairs, reward = self.reset(seed), [], 0.0
        for call in calls:
            pairs.append((obs, call))
            obs, reward, done, _ = self.step(call)
            if done:
                break
        return pairs, reward

    def demonstration(
        self, seed: int, rng: random.Random, error_rate: float = 0.0
    ) -> list[tuple[str, str]]:
        """An expert episode, corrupted (:func:`corrupt`, a random kind) with probability
        ``error_rate``; ``self.success`` holds its outcome afterwards."""
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate!r}")
        calls = self.expert_calls(seed)
        if rng.random() < error_rate:
            calls = corrupt(calls, rng.choice(CORRUPTIONS), rng, self.make_task(seed))
        return self.play(seed, calls)[0]


def corrupt(calls: list[str], kind: str, rng: random.Random, task: dict) -> list[str]:
    """One of BFCL's failure modes applied to an expert's ``calls`` (``done`` last):

    - ``wrong_arg``: one argument replaced by another name of the task's tree or pools;
    - ``skip``: one call dropped;
    - ``swap``: two adjacent calls swapped (a one-call task: the call comes after ``done``,
      i.e. it is skipped);
    - ``extra``: one call inserted before ``done`` (``ls``, or a ``rm`` / ``mkdir`` / ``touch``
      of some name).

    A kind that does not apply to ``calls`` (``wrong_arg`` with no argument to change, ``skip``
    or ``swap`` with no call) inserts an extra call instead.
    """
    if kind not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {kind!r}; choose one of {CORRUPTIONS}")
    body, names = list(calls[:-1]), _task_names(task)
    # a kind that does not apply (no call with an argument, or no call at all) adds a call
    if (kind == "wrong_arg" and not any(len(c.split()) > 1 for c in body)) or (
        kind in ("skip", "swap") and not body
    ):
        kind = "extra"
    if kind == "wrong_arg":
        i = rng.choice([k for k, c in enumerate(body) if len(c.split()) > 1])
        words = body[i].split()
        j = rng.randrange(1, len(words))
        words[j] = rng.choice([n for n in names if n != words[j]])
        body[i] = " ".join(words)
    elif kind == "skip":
        del body[rng.randrange(len(body))]
    elif kind == "swap":
        seq = body + [DONE]
        i = rng.randrange(len(seq) - 1)
        seq[i], seq[i + 1] = seq[i + 1], seq[i]
        return seq
    else:
        extra = rng.choice(
            [
                "ls",
                f"rm {rng.choice(names)}",
                f"mkdir {rng.choice(FOLDERS)}",
                f"touch {rng.choice(FILES)}",
            ]
        )
        body.insert(rng.randrange(len(body) + 1), extra)
    return body + [DONE]


def _task_names(task: dict) -> list[str]:
    names, stack = set(), [task["tree"]]
    while stack:
        folder = stack.pop()
        for name, item in folder.items():
            names.add(name)
            if isinstance(item, dict):
                stack.append(item)
    return sorted(names | {w for w in task["goal"].split() if w in FILES or w in FOLDERS})
