"""Upper bounds: the range of every numeric setting where a run is defined, and what the machine
holds. :class:`~agentic_rl.config.RLConfig` calls these; each refusal is one line,
``<field>: <why> (got X)``, before any compute.

A config field had a lower bound and finiteness; above, a value could pass and then hang (a turn
limit of 10**12, a lake that is almost all holes), run out of memory after the model was built (an
evaluation of 10**12 episodes), overflow float32 in the first update (a learning rate of 1e38, a
coefficient of 1e300: every update skipped) or sample from NaN (a temperature of 1e-300). The bounds
come from what the quantity is:

=======================  =========================================================================
:func:`limits`           each field's fixed range, declared beside the field in its config
                         (``param(..., high=1e3, why=COEF)``): learning rates, temperature, loss and
                         reward coefficients, clip ranges, LoRA, passes and rounds per step
:data:`CONTEXT_BUDGET`   the tokens one sequence may need: a turn limit times a turn's tokens, a
                         completion, an action budget (``validate``)
:func:`lake_problem`     FrozenLake's hole density against the map size: gymnasium draws random
                         lakes until one is solvable (``validate``)
:func:`memory_needs`     what training and evaluation hold at once against the device's memory
                         (a recipe adds its own in ``RLConfig.memory_needs``)
:func:`output_dir_problem`  whether the output folder can really be created and written (a probe,
                         not ``os.access``, which says yes to root under ``/proc``)
=======================  =========================================================================

Step counts and periods (``max_steps``, ``sft_steps``, ``save_steps``, a chapter's measurement
periods) and minibatch sizes have no upper bound: a larger value is a longer run, a rarer
measurement or one gradient step per batch, all defined.
"""

from __future__ import annotations

import os

__all__ = ["limits", "token_fields", "CONTEXT_BUDGET", "check_bounds", "lake_problem",
           "memory_needs", "bytes_per_token", "check_memory", "memory_limit",
           "output_dir_problem", "foreign_symlink"]  # fmt: skip

#: Tokens one sequence may need: the context of SmolLM2 (the pretrained model here), 8192
#: positions. A turn limit, a turn's tokens or a completion beyond it could not be attended to.
CONTEXT_BUDGET = 8192

# Why a field stops where it does: a field declares its range with ``param(..., high=, why=)``.
LR = (
    "AdamW moves each weight by about the learning rate per step: above 10 training is not "
    "defined (and from 1e38 it overflows float32)"
)
COEF = (
    "the other loss and reward terms are O(1): above 1e3 this one is all the update sees, and "
    "toward float32's 3.4e38 the loss overflows and every update is skipped"
)
CLIP = "a ratio bound beyond 100 never acts (the ratio is exp of a log-prob difference)"
TEMPERATURE = (
    "logits / temperature must stay finite in float32 (1e-300 samples from NaN) and not "
    "flatten every distribution to uniform"
)
PASSES = (
    "passes over one rollout batch (PPO uses 1 to 10): past 100 the ratio has long left the "
    "clip range and every pass is wasted compute"
)
LORA_R = "a rank above the width of the layers it adapts adds nothing"
ROUNDS = (
    "a step that needs more rounds to refill its batch has groups whose rewards all agree: "
    "more rounds would hang the run"
)


def _declared(config_cls, key: str) -> dict:
    """field -> its ``key`` metadata (``bounds``, ``tokens``), from the class that declared it
    last with one: a field a recipe declares again keeps its base's."""
    out = {}
    for cls in reversed(config_cls.__mro__):
        for f in getattr(cls, "__dataclass_fields__", {}).values():
            if key in f.metadata:
                out[f.name] = f.metadata[key]
    return out


def limits(config_cls) -> dict[str, tuple[float | None, float | None, str]]:
    """field -> ``(smallest, largest, why)``: the ranges the config's fields declare
    (``param(..., low=, high=, why=)``)."""
    return _declared(config_cls, "bounds")


def token_fields(config_cls) -> list[str]:
    """The fields counted in tokens or turns (``param(..., tokens=True)``): each one at most
    :data:`CONTEXT_BUDGET`."""
    return list(_declared(config_cls, "tokens"))


def check_bounds(config) -> None:
    """Every field's declared range (:func:`limits`) and the context budget (:func:`token_fields`);
    ``config._bad`` on the first violation (``RLConfig.validate``, after types and lower bounds)."""
    for name, (low, high, why) in limits(type(config)).items():
        value = getattr(config, name)
        if value is None:
            continue
        if high is not None and value > high:
            config._bad(name, f"must be <= {high:g}: {why}")
        if low is not None and value < low:
            config._bad(name, f"must be >= {low:g}: {why}")
    for name in token_fields(type(config)):
        if getattr(config, name) > CONTEXT_BUDGET:
            config._bad(name, f"must be <= {CONTEXT_BUDGET} (the tokens a sequence may need)")
    if hasattr(config, "max_turns") and hasattr(config, "max_action_tokens"):
        tokens = config.max_turns * config.max_action_tokens
        if tokens > CONTEXT_BUDGET:
            config._bad(
                "max_turns",
                f"an episode could generate max_turns * max_action_tokens = {tokens} tokens, "
                f"more than the {CONTEXT_BUDGET} a sequence may hold",
            )
    tiny = config.model_name_or_path is None
    if config.use_lora and tiny and config.lora_r > config.hidden_size:
        config._bad("lora_r", f"must be <= hidden_size ({config.hidden_size}): {LORA_R}")
    problem = lake_problem(config)
    if problem:
        config._bad("p_frozen", problem)


#: Site percolation's threshold on the square lattice is 0.593: above 0.6, random lakes of any size
#: up to 32 x 32 are solvable often enough (measured: at least 2.5 % of draws).
_PERCOLATING = 0.6


def lake_problem(config) -> str | None:
    """Why FrozenLake's random lakes of this config would (almost) never be solvable, or None.

    gymnasium's ``generate_random_map`` draws maps until one has a path from start to goal, so a
    density of holes that leaves no path hangs the run (``p_frozen`` 1e-300). A draw is solvable
    with probability at least ``p_frozen ** (2 * map_size - 3)`` (the tiles of one L-shaped path);
    above :data:`_PERCOLATING`, long paths exist at any size."""
    if not hasattr(config, "p_frozen") or getattr(config, "env", "frozenlake") != "frozenlake":
        return None
    p, n = config.p_frozen, config.map_size
    if p >= _PERCOLATING or p ** (2 * n - 3) >= 1e-3:
        return None
    return (
        f"a random {n} x {n} lake this full of holes almost never has a path to the goal, and "
        f"the map generator draws until one does (it would hang); use p_frozen >= {_PERCOLATING} "
        f"or a smaller map (needs p_frozen ** (2 * map_size - 3) >= 1e-3)"
    )


#: A limit at or above this many bytes (an exbibyte) means "unlimited": cgroup v1 writes
#: 2**63 rounded down to a page, and a machine with that much memory does not exist.
_UNLIMITED = 1 << 60


def memory_limit() -> tuple[int, str]:
    """``(bytes, what)``: the smallest of the machine's RAM, the process's address-space limit
    (``ulimit -v``) and its cgroup's memory limit (a container's), with the words for the memory
    error; ``(0, "memory")`` when none is known. The RAM alone let a run under a 6 GB
    ``ulimit -v`` pass the memory check and die in the allocator minutes later."""
    limits = []
    try:
        limits.append((os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "memory"))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY and 0 < soft < _UNLIMITED:
            limits.append((soft, "memory under the address-space limit (ulimit -v)"))
    except (ImportError, ValueError, OSError, AttributeError):  # (no resource on Windows)
        pass
    cgroup = _cgroup_memory_limit()
    if cgroup:
        limits.append((cgroup, "memory under the cgroup's memory limit (a container's)"))
    limits = [(n, what) for n, what in limits if n > 0]
    return min(limits, key=lambda limit: limit[0]) if limits else (0, "memory")


def _cgroup_memory_limit(proc: str = "/proc/self/cgroup", mount: str = "/sys/fs/cgroup") -> int:
    """The smallest memory limit of this process's cgroup and its ancestors (each one's applies),
    v2 (``memory.max``) or v1 (``memory.limit_in_bytes``); 0 when none is set or readable."""
    try:
        with open(proc) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return 0
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and not parts[1]:
            root, name = mount, "memory.max"
        elif "memory" in parts[1].split(","):
            root, name = f"{mount}/memory", "memory.limit_in_bytes"
        else:
            continue
        # in a container the path may be the host's: walking up reaches the container's root
        path = parts[2].rstrip("/")
        while True:
            try:
                with open(f"{root}{path}/{name}") as fh:
                    value = fh.read().strip()
                if value.isdigit() and 0 < int(value) < _UNLIMITED:  # ("max": no limit)
                    found.append(int(value))
            except (OSError, ValueError):
                pass
            if not path:
                break
            path = path.rsplit("/", 1)[0]
    return min(found, default=0)


def tiny_parameters(config) -> int:
    """Parameters of the tiny from-scratch model (vocabulary aside: ~1000 x hidden_size)."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = h // config.num_attention_heads * config.num_key_value_heads
    return layers * (2 * h * h + 2 * h * kv + 3 * h * inter) + 1000 * h


def memory_needs(config) -> list[tuple[int, tuple[str, ...], str]]:
    """What a run holds at once, rough lower bounds: ``(bytes, the fields that set it, what)``.

    - training, tiny model only: weights x 9 (policy, reference, gradient, two AdamW moments, as
      much again for a critic) and one layer-stack of activations for the larger of the SFT and RL
      batches at the shortest sequence a rollout can have;
    - evaluation, any model: ``eval_size * eval_samples`` sequences of at least that length, 8
      bytes a token (the ids; the agents play them all at once), and the tiny model's KV cache.

    A recipe adds what only it holds in its config's ``memory_needs`` (``RLConfig``)."""
    tiny = config.model_name_or_path is None
    tokens = max(config.min_sequence_tokens(), 1)
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    needs = []
    if tiny:
        batch = max(config.sft_batch_size, config.prompts_per_step * config.num_generations)
        activations = batch * tokens * layers * (4 * h + 2 * inter)
        sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "prompts_per_step",
                 "num_generations", "sft_batch_size") + config._size_fields  # fmt: skip
        weights = 9 * tiny_parameters(config)
        needs.append((4 * (weights + activations), sizes, "the model and batches"))
    per_token = bytes_per_token(config)
    sequences = config.eval_size * config.eval_samples
    needs.append((sequences * tokens * per_token, ("eval_size", "eval_samples"), "evaluation"))
    return needs


def bytes_per_token(config) -> int:
    """What one token of a sequence held for evaluation costs: its id, and the tiny model's KV
    cache (a recipe's own memory needs count their sequences with it)."""
    tiny = config.model_name_or_path is None
    return 8 + (8 * config.num_hidden_layers * config.hidden_size if tiny else 0)


def check_memory(config, needs, total: int, where: str) -> None:
    """Refuse a config whose ``needs`` (:func:`memory_needs`) exceed ``total`` bytes, blaming the
    most inflated of the fields that set the need (relative to the class's defaults)."""
    import dataclasses

    if not total:
        return
    base = {f.name: f.default for f in dataclasses.fields(config)}
    for need, fields, what in needs:
        if need > total:
            field = max(fields, key=lambda k: getattr(config, k) / max(base[k], 1))
            config._bad(
                field,
                f"{what} need at least ~{need / 2**30:.1f} GiB, more than this machine's "
                f"{total / 2**30:.1f} GiB of {where}",
            )


def output_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be a run's output folder, or None.

    Beyond ``os.access`` (which says yes to root under ``/proc``), a probe creates and removes a
    temporary file in the folder, or a temporary folder in its nearest existing parent. A symbolic
    link in the path that another user owns is refused (:func:`foreign_symlink`)."""
    import tempfile

    link = foreign_symlink(path)
    if link:
        return link
    if os.path.lexists(path) and not os.path.exists(path):
        return f"is a symbolic link to {os.readlink(path)!r}, which does not exist"
    if os.path.exists(path):
        if not os.path.isdir(path):
            return "exists and is not a folder"
        if not os.access(path, os.W_OK | os.X_OK):
            return "is not writable"
        try:
            fd, probe = tempfile.mkstemp(dir=path, prefix=".agentic-rl-probe.")
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            return f"is not writable ({err.strerror or err})"
        return None
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        if os.path.lexists(parent):
            return f"cannot be created: {parent} is a symbolic link to a missing folder"
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot be created: {parent} is a file"
    longest = max(len(part.encode()) for part in os.path.abspath(path).split(os.sep))
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    if longest > name_max:
        return f"cannot be created: a name in it is {longest} bytes, over the {name_max} allowed"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not writable"
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".agentic-rl-probe."))
    except OSError as err:
        return f"cannot be created: {parent} takes no new folder ({err.strerror or err})"
    return None


def foreign_symlink(path: str) -> str | None:
    """Why a symbolic link in ``path`` (the folder itself or a folder above it) is not to be
    followed, or None: one owned by another user than this process's (root's are trusted).

    Another user who may write in a shared folder (mode 777, no sticky bit, where the kernel's
    ``protected_symlinks`` does not act) can plant ``run1`` there as a link to a folder of ours:
    a run told ``--output-dir shared/run1`` would then replace that folder's ``metrics.csv`` and
    add its files there. The components are checked as written (``a/link/..`` resolves through
    ``link``, as the kernel would)."""
    import stat

    if not hasattr(os, "geteuid"):  # (Windows: no owners to compare)
        return None
    here = os.sep if os.path.isabs(path) else os.getcwd()  # (getcwd has no symlinks in it)
    trusted = (os.geteuid(), 0)
    for part in path.split(os.sep):
        if part in ("", "."):
            continue
        here = os.path.join(here, part)
        try:
            info = os.lstat(here)
        except OSError:  # missing from here on: nothing more to follow
            return None
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in trusted:
            return (
                f"{here} is a symbolic link owned by another user (uid {info.st_uid}), which "
                "could point the run's files anywhere; give the real folder "
                f"({os.path.realpath(here)}) if it is meant, or another --output-dir"
            )
    return None
