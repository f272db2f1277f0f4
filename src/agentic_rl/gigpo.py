"""GiGPO (Feng et al., 2025; verl-agent): credit for each step from states that recur in a group.

GRPO gives every token of a multi-turn episode one advantage, its episode's. GiGPO keeps GRPO's
critic-free group of N episodes played from the same initial state and nests a second group in it:
every **anchor state** (an environment observation reached more than once in the group, by several
episodes or by one episode several times) groups the steps taken there, and those steps are compared
by their discounted returns from that step on. Equations (GiGPO v3):

- Eq. 2: ``R(tau_i) = sum_t r_t``, the episode's return;
- Eq. 3: ``A^E(tau_i) = (R(tau_i) - mean R) / F_norm``, over the episode group;
- Eq. 4: ``G^S(s) = {(a_t, r_t) : s_t = s}``, the step group of anchor state ``s``;
- Eq. 5: ``R_t = sum_{k >= t} gamma^(k - t) r_k``, the discounted return of a step;
- Eq. 6-7: ``A^S(a_t) = (R_t - mean over G^S) / F_norm``;
- Eq. 8: ``A(a_t) = A^E(tau) + omega * A^S(a_t)``.

:func:`gigpo_advantages` computes all three over *step rows* (one row per step, episodes in order,
steps in time order), the same layout as verl-agent's batch. The conventions are the reference
code's (``gigpo/core_gigpo.py`` of langfengQ/verl-agent as last changed by 29e3e8b; see
``shared/reference/gigpo_early_experience.md``, A2-A5 and A9), where the paper is silent or differs:

===========================  ================================  =================================
convention                   paper (v3)                        code, and this module
===========================  ================================  =================================
episode-level statistics     over the N episodes (Eq. 3)       over the group's step rows
                                                               (``cross_steps=True``, the code's
                                                               only path: an episode of 12 steps
                                                               counts 12 times); ``False``: Eq. 3
F_norm                       std or 1                          ``scale_by_std``: unbiased std
                                                               (n - 1) **plus** ``eps`` = 1e-6;
                                                               ``False``: 1 (``mean_norm``)
episode group of one member  not defined                       mean 0, std 1: A^E = R / (1 + eps)
                                                               (or R), not 0
anchor identity              "the same state"                  exact equality of the raw
                                                               observation (a dict key), within
                                                               one episode group, never across
step group of one member     A^S = 0 "if no state repeats"     A^S = 0 (mean = itself, std 1)
gamma                        in (0, 1]                         every GiGPO script: 0.95
omega                        1, untuned                        ``step_advantage_w`` = 1.0
invalid-action penalty       -                                 code: -0.1 on that step's row
                                                               at both levels; here the
                                                               environment's reward only
precision                    -                                 code: float32 (an all-equal step
                                                               group can get +-0.06, A9.8);
                                                               here float64 and an exact 0
===========================  ================================  =================================

The recipe (``python -m agentic_rl gigpo``): :class:`GiGPOTrainer` plays groups on FrozenLake,
Sokoban or the household, records each step's raw observation as its anchor (as verl-agent's
environment managers set ``anchor``: the observation, not the agent's prompt), gives each turn's
action tokens its step's combined advantage, and logs the anchor statistics
(:func:`anchor_metrics`) every step.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from .agent import AgentTrainer
from .bounds import COEF
from .config import (
    GROUP_AGENT_DEFAULTS,
    GROUP_AGENT_FULL,
    AgentFields,
    FrozenLakeFields,
    defaults,
    param,
)
from .envs import EnvWrapper, FrozenLakeEnv, HouseholdEnv, SokobanEnv
from .rollout import Batch
from .train import check_split
from .utils import substream

__all__ = [
    "discounted_returns",
    "anchor_groups",
    "gigpo_advantages",
    "shuffle_anchors",
    "within_state_auc",
    "anchor_metrics",
    "step_group_size_histogram",
    "AnchorRecorder",
    "GiGPOConfig",
    "GiGPOTrainer",
    "CONFIG",
    "TRAINER",
]


# ---------------------------------------------------------------------- the maths
def _as_rows(values, name: str, dtype) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=dtype)
    if t.ndim != 1:
        raise ValueError(f"{name} must be one value per step row, got shape {tuple(t.shape)}")
    return t


def discounted_returns(step_rewards, episode_ids, gamma: float) -> torch.Tensor:
    """Eq. 5: ``R_t = r_t + gamma * R_{t+1}`` backwards within each episode (rows of one episode
    contiguous and in time order); float64, one value per row."""
    rewards = _as_rows(step_rewards, "step_rewards", torch.float64).tolist()
    episodes = _as_rows(episode_ids, "episode_ids", torch.long).tolist()
    out, running = [0.0] * len(rewards), 0.0
    for row in range(len(rewards) - 1, -1, -1):
        last_of_episode = row == len(rewards) - 1 or episodes[row + 1] != episodes[row]
        running = rewards[row] + (0.0 if last_of_episode else gamma * running)
        out[row] = running
    return torch.tensor(out, dtype=torch.float64)


def anchor_groups(
    anchor_states: Sequence[Hashable], group_ids
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 4 by a hash map, as verl-agent's ``build_step_group``: rows with the same episode group
    and *exactly* equal anchor (``==`` and ``hash``: strings case- and space-sensitive) share a step
    group. Returns ``(step_group, size)``: each row's step-group index (0, 1, ... in order of first
    appearance) and its step group's size. ``None`` or an unhashable anchor is refused."""
    groups = _as_rows(group_ids, "group_ids", torch.long).tolist()
    if len(anchor_states) != len(groups):
        raise ValueError(f"got {len(anchor_states)} anchor_states for {len(groups)} rows")
    index: dict[tuple, int] = {}
    step_group = []
    for row, (group, anchor) in enumerate(zip(groups, anchor_states)):
        if anchor is None:  # verl-agent's to_hashable raises too: every step needs an anchor
            raise ValueError(f"anchor_states[{row}] is None: every step needs an anchor state")
        try:
            step_group.append(index.setdefault((group, anchor), len(index)))
        except TypeError:  # a list or an array: make it a tuple (verl-agent's to_hashable does)
            why = f"anchor_states[{row}] is not hashable ({type(anchor).__name__})"
            raise TypeError(why) from None
    step_group = torch.tensor(step_group, dtype=torch.long)
    sizes = torch.bincount(step_group, minlength=len(index))
    return step_group, sizes[step_group]


def _normalise(values, keys, *, scale_by_std: bool, eps: float, singleton: str) -> torch.Tensor:
    """``(v - mean) / F_norm`` within each key's members (float64). A key with one member gets
    mean 0 and std 1 (``singleton="raw"``: verl-agent's episode level) or mean itself and std 1
    (``"zero"``: its step level, A^S = 0)."""
    n = int(keys.max()) + 1 if len(keys) else 0
    count = torch.bincount(keys, minlength=n).to(torch.float64)
    # the mean as min + mean(v - min): a group whose values are all equal gets exactly v - mean = 0
    low = torch.full((n,), math.inf, dtype=torch.float64).scatter_reduce(0, keys, values, "amin")
    shift = values - low[keys]
    mean = low + torch.zeros(n, dtype=torch.float64).index_add(0, keys, shift) / count
    square = torch.zeros(n, dtype=torch.float64).index_add(0, keys, (values - mean[keys]) ** 2)
    std = (square / (count - 1).clamp(min=1)).sqrt()  # unbiased, as torch.std
    one = count == 1
    mean = torch.where(one, torch.zeros_like(mean) if singleton == "raw" else mean, mean)
    std = torch.where(one, torch.ones_like(std), std)
    centred = values - mean[keys]
    return centred / (std[keys] + eps) if scale_by_std else centred


def gigpo_advantages(
    step_rewards,
    anchor_states: Sequence[Hashable],
    group_ids,
    episode_ids,
    *,
    gamma: float,
    omega: float,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    cross_steps: bool = True,
    discount_episodes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GiGPO's advantages of every step row: ``(episode_level, step_level, combined)``, float64.

    Rows are steps: ``step_rewards[j]`` the reward of row ``j``, ``anchor_states[j]`` the raw
    observation it acted on, ``group_ids[j]`` its episode group (N episodes from one initial state),
    ``episode_ids[j]`` its episode; an episode's rows contiguous and in time order. Conventions
    (module docstring's table): the episode's return is the sum of its rewards (Eq. 2); A^E over the
    group's rows (``cross_steps=True``, the code) or its episodes (``False``, Eq. 3); R_t
    discounted by ``gamma`` within the episode (Eq. 5); step groups by exact anchor equality within
    an episode group (Eq. 4); A^S over the step group (Eq. 6-7), 0 for a singleton; ``combined =
    A^E + omega * A^S`` (Eq. 8). ``scale_by_std``: F_norm = unbiased std + ``eps``, else 1.
    ``discount_episodes`` (a control, not GiGPO): the episode level compares each episode's return
    discounted to its start, ``R_1`` of Eq. 5 (``gamma^(T-1) R`` for a reward at the end only).
    """
    if not (0.0 < gamma <= 1.0):
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    if not (omega >= 0 and math.isfinite(omega)):
        raise ValueError(f"omega must be >= 0 and finite, got {omega!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    rewards = _as_rows(step_rewards, "step_rewards", torch.float64)
    groups = _as_rows(group_ids, "group_ids", torch.long)
    episodes = _as_rows(episode_ids, "episode_ids", torch.long)
    if not len(rewards) == len(groups) == len(episodes):
        raise ValueError("step_rewards, group_ids and episode_ids must have one value per row")
    if not torch.isfinite(rewards).all():
        raise ValueError("step_rewards must be finite")
    # episodes as contiguous blocks 0..E-1, each inside one group
    starts = torch.ones_like(episodes, dtype=torch.bool)
    starts[1:] = episodes[1:] != episodes[:-1]
    block = starts.long().cumsum(0) - 1
    if len(episodes) and len(torch.unique(episodes)) != int(block[-1]) + 1:
        raise ValueError("episode_ids: each episode's rows must be contiguous")
    first_row = starts.nonzero().flatten()
    if (groups != groups[first_row][block]).any():
        raise ValueError("group_ids: all rows of an episode must be in the same group")

    returns = discounted_returns(rewards, block, gamma)  # Eq. 5
    # Eq. 2-3: the episode's return on each of its rows; statistics over rows or episodes
    episode_return = torch.zeros(len(first_row), dtype=torch.float64).index_add(0, block, rewards)
    if discount_episodes:  # the control: R_1, the return discounted to the episode's start
        episode_return = returns[first_row]
    norm = dict(scale_by_std=scale_by_std, eps=eps)
    _, group_index = torch.unique(groups, return_inverse=True)
    if cross_steps:
        episode_level = _normalise(episode_return[block], group_index, singleton="raw", **norm)
    else:
        per_episode = _normalise(episode_return, group_index[first_row], singleton="raw", **norm)
        episode_level = per_episode[block]
    # Eq. 4, 6-7: discounted returns compared within each anchor's step group
    step_group, _ = anchor_groups(anchor_states, groups)
    step_level = _normalise(returns, step_group, singleton="zero", **norm)
    return episode_level, step_level, episode_level + omega * step_level  # Eq. 8


# ---------------------------------------------------------------------- anchor statistics
def step_group_size_histogram(sizes) -> dict[int, float]:
    """Share of step *groups* of each size (``sizes``: each row's group size, as returned by
    :func:`anchor_groups`): a group of size k has k rows, so it is counted once, not k times."""
    sizes = torch.as_tensor(sizes, dtype=torch.long).tolist()
    groups = Counter({k: c / k for k, c in Counter(sizes).items()})
    total = sum(groups.values())
    return {k: groups[k] / total for k in sorted(groups)} if total else {}


def anchor_metrics(
    step_level: torch.Tensor, episode_level: torch.Tensor, sizes: torch.Tensor
) -> dict[str, float]:
    """What a reader needs to see whether anchors did anything (GiGPO v3 §5.5):

    - ``recurring_share``: the share of steps in step groups of size > 1;
    - ``singleton_group_share``: the share of step groups of size 1 (the paper's Fig. 5);
    - ``mean_step_group_size``: over groups;
    - ``step_episode_corr``: the Pearson correlation of A^S and A^E over the rows; NaN when either
      is constant over the batch (when no state recurs, A^S is all 0 and GiGPO is the
      episode-level advantage alone).
    """
    sizes = torch.as_tensor(sizes, dtype=torch.float64)
    hist = step_group_size_histogram(sizes)
    a, b = step_level.to(torch.float64), episode_level.to(torch.float64)
    a, b = a - a.mean(), b - b.mean()
    denominator = (a.square().sum() * b.square().sum()).sqrt()
    corr = (a * b).sum() / denominator if denominator > 0 else torch.tensor(math.nan)
    return dict(
        recurring_share=(sizes > 1).double().mean().item(),
        singleton_group_share=hist.get(1, 0.0),
        mean_step_group_size=sum(k * p for k, p in hist.items()),
        step_episode_corr=corr.item(),
    )


def shuffle_anchors(anchor_states: Sequence[Hashable], group_ids, rng) -> list:
    """A placebo for Eq. 4: the anchors permuted among the step rows of each episode group
    (``rng``: a :class:`random.Random`). Every step-group *size* is kept (each group holds the
    same anchors, moved), while which steps share a group is random: what is left of GiGPO
    without the information that two steps were taken in the same state."""
    groups = _as_rows(group_ids, "group_ids", torch.long).tolist()
    if len(anchor_states) != len(groups):
        raise ValueError(f"got {len(anchor_states)} anchor_states for {len(groups)} rows")
    rows_of: dict[int, list[int]] = {}
    for row, group in enumerate(groups):
        rows_of.setdefault(group, []).append(row)
    out = list(anchor_states)
    for rows in rows_of.values():
        moved = [anchor_states[r] for r in rows]
        rng.shuffle(moved)
        for r, anchor in zip(rows, moved):
            out[r] = anchor
    return out


def within_state_auc(values, anchor_states, group_ids, kinds) -> tuple[float, int]:
    """How well per-step ``values`` (advantages) rank the good actions above the others **taken
    in the same state**: over every pair (a good step, a step of another kind) of one step group
    (same episode group, same anchor), the share in which the good step's value is higher, a tie
    counting one half: the area under the ROC curve, within states. ``kinds``: each step's label
    from the environment (the household's ``good``, ``flawed``, ``invalid``, ``malformed``).
    Returns ``(AUC, pairs)``; the AUC is NaN when no state saw both a good and another action.
    0.5 is a coin's ranking; GRPO's one advantage per episode can still rank, across the
    episodes that passed through the state."""
    if len(kinds) != len(anchor_states):
        raise ValueError(f"got {len(kinds)} kinds for {len(anchor_states)} steps")
    step_group, _ = anchor_groups(anchor_states, group_ids)
    v = _as_rows(values, "values", torch.float64)
    good = torch.tensor([k == "good" for k in kinds], dtype=torch.bool)
    wins, pairs = 0.0, 0
    for g in torch.unique(step_group[good]).tolist():
        here = step_group == g
        diff = v[here & good].unsqueeze(1) - v[here & ~good].unsqueeze(0)
        wins += (diff > 0).sum().item() + 0.5 * (diff == 0).sum().item()
        pairs += diff.numel()
    return (wins / pairs if pairs else math.nan), pairs


# ---------------------------------------------------------------------- the recipe
class AnchorRecorder(EnvWrapper):
    """An environment that keeps the raw observation each step acts on (``anchors``): the reset
    observation, then each observation the episode goes on from. Everything else is the wrapped
    environment's (verl-agent's environment managers return it as ``anchor``, beside the prompt)."""

    def __init__(self, env):
        super().__init__(env)
        self.anchors: list[str] = []
        self.labels: list[str | None] = []  # each step's kind, where the environment labels it

    def reset(self, seed: int) -> str:
        obs = self.env.reset(seed)
        self.anchors, self.labels = [obs], []
        return obs

    def step(self, action_text: str):
        obs, reward, done, info = self.env.step(action_text)
        self.labels.append((info or {}).get("kind"))
        if not done:
            self.anchors.append(obs)
        return obs, reward, done, info


@dataclass
@defaults(**GROUP_AGENT_DEFAULTS)
class GiGPOConfig(AgentFields, FrozenLakeFields):
    """GiGPO: GRPO's episode group plus step groups of recurring states (no critic)."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("frozenlake", "sokoban", "household")
    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(GROUP_AGENT_FULL, map_size=6, max_turns=14),
    }
    # (group-relative only: no CriticFields, so no critic and no critic flags; uses_critic False)
    # --- defaults that differ from the agent fields'
    env: str = param(
        "frozenlake",
        "Environment whose states recur: 'frozenlake' (deterministic lakes), 'sokoban' or "
        "'household'. The anchor of a step is the raw observation it acts on.",
    )
    sft_steps: int = param(200, "SFT steps on demonstrations before RL (0: skip).")
    max_steps: int = param(40, "RL steps (one rollout batch each).")
    demo_error_rate: float = param(
        0.5, "Fraction of demonstration actions replaced by another (a weak start leaves room)."
    )
    # --- GiGPO
    gamma: float = param(
        0.95, "Discount of the step-level return R_t (Eq. 5), in (0, 1]; every GiGPO script: 0.95."
    )
    step_advantage_weight: float = param(
        1.0,
        "omega of Eq. 8: A = A^E + omega * A^S, >= 0 (paper: 1, untuned); 0 is GRPO.",
        high=1e3,
        why=COEF,
    )
    scale_by_std: bool = param(
        True,
        "F_norm = unbiased std + 1e-6 at both levels (verl-agent's mean_std_norm, its ALFWorld "
        "choice); false: F_norm = 1 (mean_norm, WebShop and Sokoban).",
    )
    cross_steps: bool = param(
        True,
        "Episode-level mean and std over the group's step rows (verl-agent's only path); false: "
        "over its episodes (the paper's Eq. 3).",
    )
    discount_episode_return: bool = param(
        False,
        "A control, not GiGPO: the episode level compares returns discounted to the start "
        "(gamma^(T-1) R for a reward at the end), so that GRPO (omega = 0) prefers short "
        "episodes as the step level does: discounting without anchors.",
    )
    shuffle_anchors: bool = param(
        False,
        "A placebo, not GiGPO: the anchors are permuted among the steps of each episode group "
        "before the step groups are formed (every group size kept, membership random).",
    )
    room_size: int = param(6, "Sokoban: side of the room, walls included.")
    slack: int = param(
        2,
        "Household: turns beyond the optimal plan in each task's budget (the horizon: more "
        "slack, longer episodes that can still succeed after detours).",
        low=0,
        high=20,
        why="0 to 20 turns beyond the plan: fewer is no budget, more is another task",
    )

    def validate(self) -> None:
        super().validate()
        if self.num_generations < 2:
            self._bad("num_generations", "GiGPO compares episodes of a group: needs at least 2")
        if not 0.0 < self.gamma <= 1.0:
            self._bad("gamma", "must be in (0, 1]")
        if not (self.step_advantage_weight >= 0 and math.isfinite(self.step_advantage_weight)):
            self._bad("step_advantage_weight", "must be >= 0 and finite")
        if self.kl_in_reward:
            self._bad("kl_in_reward", "GiGPO keeps the KL in the loss (verl-agent's use_kl_loss)")
        if self.shuffle_anchors and self.step_advantage_weight == 0:
            self._bad("shuffle_anchors", "with step_advantage_weight 0 no anchor is used")
        if self.scale_rewards != "group":
            self._bad("scale_rewards", "GiGPO's scaling is scale_by_std (both levels); leave this")
        if not 5 <= self.room_size <= 10:
            self._bad("room_size", "must be between 5 and 10")
        if self.env == "household":
            if self.max_turns < 6 + self.slack:
                self._bad(
                    "max_turns",
                    f"the household needs >= 6 + slack = {6 + self.slack} (a plan of up to 6 "
                    "actions and the slack)",
                )
            if self.max_action_tokens < 5:
                self._bad("max_action_tokens", "the household needs >= 5 (four words + stop)")
        elif self.max_action_tokens < 2:
            self._bad("max_action_tokens", "must be >= 2 (an action word and the stop word)")

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "map_size", "room_size")

    def min_sequence_tokens(self) -> int:
        side = {"frozenlake": self.map_size, "sokoban": self.room_size}.get(self.env)
        first = 38 if side is None else side * (side + 1) + 3  # the household: <= 38 words
        return first + self.max_action_tokens


class GiGPOTrainer(AgentTrainer):
    """GRPO on a multi-turn environment with GiGPO's advantage: each turn's action tokens get
    ``A^E + omega * A^S`` of their step; the anchor statistics are logged every step."""

    config: GiGPOConfig

    def make_task(self, split: str = "train"):
        check_split(split)
        c = self.config
        if c.env == "frozenlake":
            return FrozenLakeEnv(
                c.map_size, is_slippery=c.is_slippery, p_frozen=c.p_frozen, max_turns=c.max_turns
            )
        if c.env == "sokoban":
            return SokobanEnv(c.room_size, max_turns=c.max_turns)
        return HouseholdEnv(max_turns=c.max_turns, slack=c.slack)

    def play(self, seeds, *, group_size=1, greedy=False, ref_model=None, envs=None) -> Batch:
        """Episodes as :meth:`AgentTrainer.play`; ``extras["anchors"]`` holds, per episode, the
        raw observation of each of its steps, and ``extras["kinds"]`` each step's label where the
        environment labels its actions (the household: good, flawed, ...), else ``None``s."""
        if envs is None:
            envs = [self.make_task() for _ in range(len(seeds) * group_size)]
        recorders = [AnchorRecorder(env) for env in envs]
        batch = super().play(
            seeds, group_size=group_size, greedy=greedy, ref_model=ref_model, envs=recorders
        )
        turns = batch.extras["num_turns"].tolist()
        batch.extras["anchors"] = [r.anchors[:n] for r, n in zip(recorders, turns)]
        batch.extras["kinds"] = [r.labels[:n] for r, n in zip(recorders, turns)]
        return batch

    def step_rows(self, batch: Batch) -> dict:
        """The batch as GiGPO's step rows: rewards, anchors, group and episode of each step."""
        rewards, anchors, groups, episodes = [], [], [], []
        gids = batch.group_id.tolist()
        for i, (turn_rewards, row_anchors) in enumerate(
            zip(batch.extras["turn_rewards"], batch.extras["anchors"])
        ):
            rewards += turn_rewards
            anchors += row_anchors
            groups += [gids[i]] * len(turn_rewards)
            episodes += [i] * len(turn_rewards)
        if len(anchors) != len(rewards):
            raise RuntimeError("the rollout's anchors and steps disagree (play records them)")
        return dict(
            step_rewards=rewards, anchor_states=anchors, group_ids=groups, episode_ids=episodes
        )

    def compute_advantages(self, batch: Batch) -> torch.Tensor:
        """Eq. 8 per step, put on that turn's action tokens (``turn_ids``) of the trajectory-level
        row; observation and padding tokens get 0."""
        c = self.config
        rows = self.step_rows(batch)
        anchors = rows["anchor_states"]
        if c.shuffle_anchors:  # the placebo: same step-group sizes, random membership
            rng = substream("gigpo-anchors", c.seed, self.step)
            rows = dict(rows, anchor_states=shuffle_anchors(anchors, rows["group_ids"], rng))
        episode_level, step_level, combined = gigpo_advantages(
            **rows, gamma=c.gamma, omega=c.step_advantage_weight, scale_by_std=c.scale_by_std,
            cross_steps=c.cross_steps, discount_episodes=c.discount_episode_return,
        )  # fmt: skip
        # per episode and turn: [B, max turns], then each token reads its turn's value
        turns = batch.extras["num_turns"].tolist()
        per_turn = torch.zeros(len(batch), max(max(turns), 1), dtype=torch.float64)
        rows_of = torch.tensor(rows["episode_ids"], dtype=torch.long)
        turn_of = torch.tensor([k for n in turns for k in range(n)], dtype=torch.long)
        per_turn[rows_of, turn_of] = combined
        turn_ids = batch.turn_ids.cpu()
        token_adv = per_turn.gather(1, turn_ids.clamp(min=0)) * (turn_ids >= 0)
        _, sizes = anchor_groups(anchors, rows["group_ids"])
        metrics = anchor_metrics(step_level, episode_level, sizes)
        # credit against the environment's labels, in the true states (NaN without labels)
        kinds = [k for row in batch.extras["kinds"] for k in row]
        labelled = any(k is not None for k in kinds)
        for name, values in (("state_auc", combined), ("state_auc_episode", episode_level)):
            auc, pairs = within_state_auc(values, anchors, rows["group_ids"], kinds)
            metrics[name] = auc if labelled else math.nan
        metrics["state_auc_pairs"] = float(pairs) if labelled else 0.0
        batch.extras["anchor_metrics"] = metrics
        mask = batch.loss_mask
        return token_adv.to(device=mask.device, dtype=torch.float32) * mask

    def rollout_metrics(self, batch: Batch, keep) -> dict:
        """The anchor statistics of this step's batch (:func:`anchor_metrics`), success, turns;
        ``state_auc``: :func:`within_state_auc` of the advantage trained on (``_episode``: of
        its episode level alone), in the true anchor states, from the environment's labels."""
        return dict(super().rollout_metrics(batch, keep), **batch.extras["anchor_metrics"])


CONFIG, TRAINER = GiGPOConfig, GiGPOTrainer
