"""Early Experience (Zhang et al. 2025): learn from the outcomes of one's own actions, no reward.

Between imitation and RL: in each state an expert visited, the agent's *initial policy* proposes
``K`` alternative actions; each is executed in a copy of the environment put back in that state,
and the **next state** it leads to is recorded (eq. ee-data)::

    D_rollout = {(s_i, a_i^j, s_i^j) : i <= N, j <= K},   each a_i^j other than the expert's a_i

Two ways to learn from it, each a warm start for RL (the chapter's Algorithm 9):

- **implicit world modelling** (IWM, eq. ee-iwm): next-token loss on the next state given the
  state and the action, ``-log p(s_i^j | s_i, a_i^j)``, with the expert's own transitions
  included, as a first stage; then imitation (``world_model_steps`` of the same step budget);
- **self-reflection** (SR, eq. ee-sr): a rationale ``c_i^j`` contrasting the expert's action with
  an alternative by the states they lead to, learned with the expert's action, mixed with the
  expert's episodes.

What is the paper's and what is this book's (``reference/gigpo_early_experience.md`` Part B): the
data, the two losses and the two-stage IWM schedule are the paper's; no code is public. The paper
has the language model write each rationale, *before* its action, and the model reasons at test
time. A model trained from scratch cannot write one, so here the rationale is a **template**
filled from the observed next states (:func:`reflection_text`), with the environment's
distance-to-goal standing in for the language model's judgement of which outcome is better (a
reconstruction, labelled so); and it is placed **after** the action, as a training-only target,
because this policy acts in five tokens and does not reason at test time: the action's context in
training is then exactly its context when acting. The initial policy is a short imitation
(``initial_steps``), the analogue of an instruction-tuned model that knows the action format.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import bounds
from .agent import AgentTrainer
from .checkpoint import rng_state, set_rng_state
from .config import (
    GROUP_AGENT_DEFAULTS,
    GROUP_AGENT_FULL,
    AgentFields,
    HouseholdFields,
    RunError,
    defaults,
    param,
)
from .envs import EnvWrapper, HouseholdEnv
from .envs.household import ACTION_OPEN
from .rollout import Batch, build_segments_batch, sequence_logprobs
from .utils import eval_sampling_seed, fixed_rng, substream, train_seed

__all__ = [
    "STARTS",
    "RATIONALES",
    "VALID",
    "probe_steps",
    "Transition",
    "ExperienceHousehold",
    "expert_transitions",
    "check_replayable",
    "replay_to_state",
    "demo_seeds",
    "collect_alternatives",
    "next_state_text",
    "own_observation",
    "reflection_text",
    "world_model_rows",
    "reflection_rows",
    "imitation_rows",
    "experience_stats",
    "run_starts",
    "EarlyExperienceConfig",
    "EarlyExperienceTrainer",
    "CONFIG",
    "TRAINER",
]

#: The warm starts the lab compares (every one then trained with the same GRPO).
STARTS = ("imitation", "world_model", "reflection")
#: What the reflection rows do with their rationale: train it (eq. ee-sr), leave it untrained
#: (the control: the same rows, the expert's action alone), or train another pair's (a placebo).
RATIONALES = ("trained", "untrained", "shuffled")
#: The labels of the alternatives the environment executes (legal, and possible where it stands).
VALID = ("good", "flawed")
STOP = "</action>"
#: Words of the next-state text of an ending step and of the reflection template.
_EXTRA_WORDS = "success out of turns think gives closer no too impossible not an action , ;".split()
#: The template's judgement of an alternative, by the environment's label of it.
_VERDICT = {
    "good": "closer too",
    "flawed": "no closer",
    "invalid": "impossible",
    "malformed": "not an action",
}


class ExperienceHousehold(HouseholdEnv):
    """The household of the GCD chapter, with the words of the next-state texts and of the
    reflection template in its vocabulary (so every start trains the same tokenizer)."""

    def vocabulary(self) -> list[str]:
        return sorted(set(super().vocabulary()) | set(_EXTRA_WORDS))


@dataclass(frozen=True)
class Transition:
    """One step out of an expert state: the history the policy sees (``state``, ending with the
    action tag), the action taken, the text of the state it led to, and the environment's label
    of the action (good, flawed, invalid, malformed)."""

    state: str
    action: str
    next_state: str
    kind: str


def next_state_text(obs: str, info: dict) -> str:
    """The observed next state as text: the observation without its action tag, or ``success``
    / ``out of turns`` when the step ended the episode (the environment then shows nothing)."""
    if obs:
        return obs.removesuffix(ACTION_OPEN).strip()
    return "success" if info.get("success") else "out of turns"


def demo_seeds(seed: int, n: int) -> list[int]:
    """The episode seeds of D_expert of a run with config seed ``seed``: fixed by it, drawn apart
    from its task stream (``utils.substream``)."""
    rng = substream("early-experience-demos", seed, 0)
    return [train_seed(rng) for _ in range(n)]


def own_observation(state: str) -> str:
    """The last observation of a history (what the environment showed at this step)."""
    return state.rsplit(f"{STOP} ", 1)[-1]


def replay_to_state(env, seed: int, actions: list[str], expected: str | None = None) -> str:
    """Reset ``env`` with ``seed`` and take ``actions``: the expert's state after them. With
    ``expected``, the observation must be the one recorded there, else the environment cannot be
    put back in an expert state (it is not deterministic given its seed and actions)."""
    obs = env.reset(seed)
    for action in actions:
        obs, _, done, _ = env.step(action)
        if done:
            raise RunError(f"env {env.name!r}: the episode of seed {seed} ended while replaying")
    if expected is not None and obs != expected:
        raise RunError(
            f"env {env.name!r} cannot be reset to an expert state: replaying seed {seed} gave "
            f"{obs!r}, not the recorded {expected!r} (early experience needs a deterministic "
            "reset and step)"
        )
    return obs


def check_replayable(env, seed: int) -> None:
    """Refuse, before any compute, an environment that cannot be put back in an expert state: a
    fresh copy must reach every state of the expert's episode of ``seed`` by replaying its
    actions, and must be a separate object (two copies must not share their state)."""
    (episode,) = expert_transitions(env, [seed])
    twin = copy.deepcopy(env)
    if twin is env:
        raise RunError(f"env {env.name!r} cannot be copied (deepcopy returned the same object)")
    for i, step in enumerate(episode):
        replay_to_state(twin, seed, [s.action for s in episode[:i]], own_observation(step.state))


def expert_transitions(env, seeds: list[int]) -> list[list[Transition]]:
    """The expert's episode of each seed, as transitions: ``state`` is the whole history up to
    that step (observations and actions, as the policy reads it)."""
    episodes = []
    for seed in seeds:
        obs, done, history, steps = env.reset(seed), False, "", []
        while not done:
            action = env.expert_action()
            state = f"{history}{obs}"
            obs, _, done, info = env.step(action)
            steps.append(Transition(state, action, next_state_text(obs, info), info["kind"]))
            history = f"{state} {action} {STOP} "
        episodes.append(steps)
    return episodes


class _Branch(EnvWrapper):
    """A one-turn view of an environment: ``reset`` puts a fresh copy of the environment in an
    expert state (replaying the expert's actions from the episode's seed) and shows the history;
    ``step`` executes the alternative there and ends."""

    max_turns = 1

    def __init__(self, env, seed: int, actions: list[str], expected_obs: str, history: str):
        super().__init__(env)
        self.seed, self.actions = seed, actions
        self.expected, self.history = expected_obs, history
        self.outcome: tuple[str, dict] | None = None

    def reset(self, _seed: int) -> str:
        replay_to_state(self.env, self.seed, self.actions, self.expected)
        return self.history

    def step(self, text: str):
        obs, reward, _, info = self.env.step(text)
        self.action, self.outcome = text.strip(), (obs, info)
        return "", reward, True, info


def collect_alternatives(
    trainer,
    seeds: list[int],
    episodes: list[list[Transition]],
    *,
    k: int,
    proposals: int,
    seed: int,
    kinds: tuple[str, ...] | None = None,
    proposed: dict[str, int] | None = None,
) -> list[list[list[Transition]]]:
    """Eq. ee-data: at each expert state, ``proposals`` actions sampled from the current policy
    (``trainer.model``, at its temperature, in a torch stream of its own seeded ``seed``), each
    executed in a fresh copy of the environment replayed to that state; the first ``k`` distinct
    ones whose next state differs from the expert's are kept (the paper's alternatives all differ
    from the expert action). With ``kinds``, only proposals the environment labels so qualify
    (``VALID``: the ones it executes; the policy's proposals conditioned on a legal, possible
    action). ``proposed``, if given, counts the labels of every proposal. Returns, per episode
    and step, the kept alternatives (at most ``k``)."""
    if k < 1:
        raise RunError(f"num_alternatives must be >= 1, got {k}")
    branches, where = [], []
    for e, (ep_seed, steps) in enumerate(zip(seeds, episodes)):
        for i, step in enumerate(steps):
            obs = own_observation(step.state)
            actions = [s.action for s in steps[:i]]
            for _ in range(proposals):
                branches.append(_Branch(trainer.make_task(), ep_seed, actions, obs, step.state))
            where.append((e, i))
    with fixed_rng(seed, trainer.device):
        trainer.play([0] * len(branches), envs=branches)  # one turn each: the alternative
    for branch in branches if proposed is not None else ():  # every proposal, kept or not
        kind = branch.outcome[1]["kind"]
        proposed[kind] = proposed.get(kind, 0) + 1
    out = [[[] for _ in steps] for steps in episodes]
    for n, (e, i) in enumerate(where):
        expert = episodes[e][i]
        seen = {expert.action}
        for branch in branches[n * proposals : (n + 1) * proposals]:
            obs, info = branch.outcome
            after = next_state_text(obs, info)
            if branch.action in seen or after == expert.next_state:
                continue
            if kinds is not None and info["kind"] not in kinds:
                continue
            seen.add(branch.action)
            out[e][i].append(Transition(expert.state, branch.action, after, info["kind"]))
            if len(out[e][i]) == k:
                break
    return out


def reflection_text(expert: Transition, alternative: Transition) -> str:
    """The rationale (a template: the book's reconstruction of the paper's language-model
    rationale): what the alternative led to and what that is worth, then what the expert's
    action led to. The judgement words come from the environment's label of the alternative
    (its distance to the goal did not fall: ``no closer``), standing in for the judgement the
    paper's language model makes from the goal and the two next states."""
    alt = alternative.action or "nothing"
    verdict = _VERDICT[alternative.kind]
    return (
        f"think : {alt} gives {alternative.next_state} , {verdict} ; "
        f"{expert.action} gives {expert.next_state} , closer ."
    )


def imitation_rows(episodes: list[list[Transition]]) -> list[list[tuple[str, bool]]]:
    """Eq. ee-il: whole expert episodes, the actions trainable (as the SFT warm start's rows)."""
    rows = []
    for steps in episodes:
        segments = []
        for step in steps:
            segments += [(own_observation(step.state), False), (f"{step.action} {STOP}", True)]
        rows.append(segments)
    return rows


def world_model_rows(transitions: list[Transition]) -> list[list[tuple[str, bool]]]:
    """Eq. ee-iwm: state and action as context, the next state's tokens trainable."""
    return [
        [(t.state, False), (f"{t.action} {STOP}", False), (t.next_state, True)] for t in transitions
    ]


def reflection_rows(
    pairs: list[tuple[Transition, Transition]],
    rationales: list[tuple[Transition, Transition]] | None = None,
    *,
    trained: bool = True,
) -> list[list[tuple[str, bool]]]:
    """Eq. ee-sr: the state as context; the expert's action and then the rationale trainable.
    The two controls of the lab: ``trained=False`` leaves the rationale untrained (context after
    the action, so the rows train the expert's action alone); ``rationales`` writes each row's
    rationale from another pair (the shuffled placebo: rationale-shaped text, wrong content)."""
    rationales = pairs if rationales is None else rationales
    return [
        [(e.state, False), (f"{e.action} {STOP}", True), (reflection_text(*r), trained)]
        for (e, _), r in zip(pairs, rationales, strict=True)
    ]


def experience_stats(episodes, alternatives) -> dict:
    """How much early experience there is and of what kind: states, alternatives per state, and
    the share of each label among the alternatives."""
    alts = [a for ep in alternatives for step in ep for a in step]
    states = sum(len(ep) for ep in episodes)
    out = dict(
        experience_states=states,
        experience_alternatives=len(alts),
        experience_per_state=len(alts) / max(states, 1),
    )
    for kind in ("good", "flawed", "invalid", "malformed"):
        out[f"experience_{kind}_share"] = sum(a.kind == kind for a in alts) / max(len(alts), 1)
    return out


@dataclass
@defaults(**GROUP_AGENT_DEFAULTS)
class EarlyExperienceConfig(AgentFields, HouseholdFields):
    """Early Experience: imitation, world modelling or self-reflection as the start of GRPO."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("household",)
    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(GROUP_AGENT_FULL, num_demos=256, initial_steps=100, world_model_steps=200),
    }
    # (group-relative only: no CriticFields, so no critic and no critic flags; uses_critic False)
    # --- defaults that differ from the agent fields'
    env: str = param("household", "Environment: 'household' (ALFWorld-style tasks).")
    sft_steps: int = param(
        300, "Warm-start steps, all included: initial_steps, then the start's own (same budget)."
    )
    sft_learning_rate: float = param(3e-3, "Warm-start learning rate.")
    max_steps: int = param(60, "GRPO steps after the warm start.")
    max_action_tokens: int = param(
        5, "Tokens of one action: 'take mug from table' and the stop word."
    )
    demo_error_rate: float = param(
        0.0, "Must be 0: the paper's demonstrations are an expert's (D_expert)."
    )
    # --- early experience
    start: str = param(
        "imitation",
        "The warm start: 'imitation' (SFT on D_expert, eq. ee-il), 'world_model' (implicit world "
        "modelling, then imitation, eq. ee-iwm) or 'reflection' (self-reflection mixed with "
        "imitation, eq. ee-sr).",
    )
    num_demos: int = param(
        32,
        "Expert episodes in D_expert, a fixed set drawn once from the run's seed (the "
        "paper's N counts their states).",
        high=10**6,
        why="expert episodes, built and held in memory at once (ALFWorld has 3,553 training games)",
    )
    initial_steps: int = param(
        30,
        "Imitation steps of the initial policy, which proposes the alternatives (every start "
        "begins with them; the paper's initial policy is the instruction-tuned model).",
    )
    num_alternatives: int = param(
        4,
        "K: alternative actions kept per expert state, each different from the expert's.",
        high=1024,
        why="alternatives per expert state (the paper ablates 1 to 8)",
    )
    proposals: int = param(
        48,
        "Actions sampled from the initial policy per state, of which the first K distinct "
        "non-expert ones that qualify (see alternatives) are kept.",
        high=1024,
        why="actions sampled per expert state, all played at once",
    )
    world_model_steps: int = param(
        25,
        "'world_model': steps of the world-modelling stage (next states of D_rollout and of the "
        "expert's transitions) after initial_steps; imitation takes the rest of sft_steps. 25 "
        "steps of 32 rows are about one pass over the ~800 transitions of the defaults (the "
        "paper's schedule, per a secondary summary: one epoch, then imitation).",
    )
    alternatives: str = param(
        "valid",
        "Which proposals qualify as alternatives: 'valid' (only actions the household executes: "
        "the initial policy's proposals given that they are legal and possible; the paper's "
        "come from a language model that writes plausible actions) or 'any' (malformed and "
        "impossible ones too).",
    )
    world_model_mix: float = param(
        0.0,
        "'world_model': share of each batch of the imitation stage that stays world-model rows "
        "(0: the paper's two stages; > 0: a mixed schedule that keeps training the world model).",
    )
    rationale: str = param(
        "trained",
        "'reflection': 'trained' (eq. ee-sr), 'untrained' (the control: the same rows, the "
        "rationale left as untrained context) or 'shuffled' (a placebo: each row trains the "
        "rationale of another pair).",
    )
    probe_every: int = param(
        15,
        "Warm-start steps between two measurements of the next-state loss (also measured at the "
        "end of the initial policy and of the world-modelling stage); 0: never.",
        high=10**6,
        why="warm-start steps between two probes",
    )
    reflection_share: float = param(
        0.5,
        "'reflection': share of each warm-start batch that is reflection rows (the rest: "
        "expert episodes).",
    )

    def memory_needs(self) -> list[tuple[int, tuple[str, ...], str]]:
        """And the alternatives: ``proposals`` one-turn episodes per expert state, all at once."""
        rows = self.num_demos * 6 * self.proposals  # (an expert episode has <= 6 steps)
        tokens = max(self.min_sequence_tokens(), 1) * bounds.bytes_per_token(self)
        need = (rows * tokens, ("num_demos", "proposals"), "the alternatives")
        return [*super().memory_needs(), need]

    def validate(self) -> None:
        super().validate()
        if self.start not in STARTS:
            self._bad("start", f"must be one of {', '.join(map(repr, STARTS))}")
        if self.demo_error_rate != 0:
            self._bad("demo_error_rate", "must be 0: early experience starts from an expert")
        if self.num_alternatives < 1:
            self._bad("num_alternatives", "must be >= 1 (K alternative actions per state)")
        if self.proposals < self.num_alternatives:
            self._bad("proposals", "must be >= num_alternatives (K are kept out of them)")
        if self.num_demos < 1:
            self._bad("num_demos", "must be >= 1")
        if not 0 <= self.initial_steps < self.sft_steps:
            self._bad("initial_steps", "must be >= 0 and < sft_steps (they are part of it)")
        if self.world_model_steps < 0:
            self._bad("world_model_steps", "must be >= 0 (a world-modelling stage of that many)")
        if self.initial_steps + self.world_model_steps >= self.sft_steps:
            self._bad(
                "world_model_steps",
                "initial_steps + world_model_steps must be < sft_steps (imitation comes last)",
            )
        if not 0.0 < self.reflection_share <= 1.0:
            self._bad("reflection_share", "must be in (0, 1]")
        if self.alternatives not in ("valid", "any"):
            self._bad("alternatives", "must be 'valid' or 'any'")
        if not 0.0 <= self.world_model_mix < 1.0:
            self._bad("world_model_mix", "must be in [0, 1) (a share of each imitation batch)")
        if self.world_model_mix and self.start != "world_model":
            self._bad("world_model_mix", "mixes world-model rows into start='world_model' only")
        if self.rationale not in RATIONALES:
            self._bad("rationale", f"must be one of {', '.join(map(repr, RATIONALES))}")
        if self.rationale != "trained" and self.start != "reflection":
            self._bad("rationale", "changes the reflection rows of start='reflection' only")
        if self.probe_every < 0:
            self._bad("probe_every", "must be >= 0 (0: no probes)")

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "max_turns")

    def min_sequence_tokens(self) -> int:
        # the first observation (at most 34 words) and one action
        return 34 + self.max_action_tokens


class EarlyExperienceTrainer(AgentTrainer):
    """The warm start of ``config.start`` on a fixed set of expert episodes, then GRPO; success
    and next-state loss in domain and out of domain, before and after RL."""

    config: EarlyExperienceConfig

    headline = ("success", "id_sampled_success")
    headline_definition = (
        "success: held-out in-domain tasks, sampling at the training temperature; ood_*: tasks "
        "whose (object, target) pair never occurs in training"
    )

    def __init__(self, config: EarlyExperienceConfig, **kwargs):
        #: per expert episode and step, the kept alternatives (None until collected)
        self.alternatives: list[list[list[Transition]]] | None = None
        #: the next-state loss in domain after each probed warm-start step (``probe_steps``)
        self.probes: dict[int, float] = {}
        self._held_out: dict[str, Batch] = {}  # the next-state loss's rows, per split
        #: the labels of every proposal of the initial policy (``collect_experience``)
        self.proposed: dict[str, int] = {}
        super().__init__(config, **kwargs)
        check_replayable(self.make_task(), self.demo_seeds[0])  # before any compute

    def make_task(self, split: str = "train"):
        c = self.config
        return ExperienceHousehold(
            split=split, clean_fraction=c.clean_fraction, slack=c.slack, max_turns=c.max_turns
        )

    # ------------------------------------------------------------------ the data
    @property
    def demo_seeds(self) -> list[int]:
        return demo_seeds(self.config.seed, self.config.num_demos)

    @property
    def expert_episodes(self) -> list[list[Transition]]:
        if not hasattr(self, "_expert"):
            self._expert = expert_transitions(self.make_task(), self.demo_seeds)
        return self._expert

    def collect_experience(self) -> list[list[list[Transition]]]:
        """Eq. ee-data with the current policy (the initial policy, when called at the end of
        ``initial_steps``)."""
        c = self.config
        seed = substream("early-experience-alternatives", c.seed, 0).randrange(2**31)
        self.proposed = {}
        return collect_alternatives(
            self, self.demo_seeds, self.expert_episodes, k=c.num_alternatives,
            proposals=c.proposals, seed=seed, kinds=VALID if c.alternatives == "valid" else None,
            proposed=self.proposed,
        )  # fmt: skip

    def _pools(self) -> tuple[list[Transition], list[tuple[Transition, Transition]]]:
        """World-model transitions (every alternative and every expert step) and reflection
        pairs (the expert's step, one alternative)."""
        world, pairs = [], []
        for steps, alts in zip(self.expert_episodes, self.alternatives):
            for step, kept in zip(steps, alts):
                world += [step, *kept]
                pairs += [(step, a) for a in kept]
        if not pairs:
            raise RunError(
                "the initial policy proposed no alternative that differs from the expert's "
                f"action (alternatives={self.config.alternatives!r}): raise proposals or "
                "temperature, or lower initial_steps, or let any proposal qualify"
            )
        return world, pairs

    def sft_batch(self) -> Batch:
        """One warm-start batch: expert episodes during ``initial_steps`` and for 'imitation';
        then world-model rows for ``world_model_steps`` ('world_model', and a ``world_model_mix``
        share of the imitation after it), or reflection rows mixed with expert episodes
        ('reflection'). Drawn from a stream of the step (the task stream of RL is the same for
        every start; the three reflection arms draw the same states, actions and episodes)."""
        c, n = self.config, self.config.sft_batch_size
        rng = substream("early-experience-sft", c.seed, self.step)
        stage = self.step - c.initial_steps
        if stage < 0 or c.start == "imitation":
            return self._rows(imitation_rows(rng.choices(self.expert_episodes, k=n)))
        if self.alternatives is None:
            self.alternatives = self.collect_experience()
        world, pairs = self._pools()
        if c.start == "world_model" and stage < c.world_model_steps:
            return self._rows(world_model_rows(rng.choices(world, k=n)))
        if c.start == "world_model":  # the imitation stage, with world-model rows if mixed
            m = round(n * c.world_model_mix)
            rows = imitation_rows(rng.choices(self.expert_episodes, k=n - m))
            return self._rows(rows + world_model_rows(rng.choices(world, k=m)))
        m = round(n * c.reflection_share)  # 'reflection'
        chosen = rng.choices(pairs, k=m)
        others = None  # the placebo's rationales: other pairs, from a stream of their own
        if c.rationale == "shuffled":
            others = substream("early-experience-shuffled", c.seed, self.step).choices(pairs, k=m)
        rows = reflection_rows(chosen, others, trained=c.rationale != "untrained")
        return self._rows(rows + imitation_rows(rng.choices(self.expert_episodes, k=n - m)))

    def _rows(self, rows) -> Batch:
        return build_segments_batch(self.tokenizer, rows, self.device)

    def sft_update(self, batch: Batch) -> float:
        """One warm-start step, then the next-state probe where ``probe_steps`` asks for one."""
        loss = super().sft_update(batch)
        if self.step + 1 in probe_steps(self.config):
            self.probes[self.step + 1] = self.next_state_loss("train")
        return loss

    def extra_state(self) -> dict:
        alts = self.alternatives
        if alts is not None:
            alts = [[[dataclasses.astuple(a) for a in step] for step in ep] for ep in alts]
        return {"alternatives": alts, "probes": dict(self.probes), "proposed": dict(self.proposed)}

    def load_extra_state(self, state: dict) -> None:
        self.probes = dict(state.get("probes", {}))
        self.proposed = dict(state.get("proposed", {}))
        alts = state.get("alternatives")
        if alts is not None:
            alts = [[[Transition(*a) for a in step] for step in ep] for ep in alts]
        self.alternatives = alts

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def next_state_loss(self, split: str) -> float:
        """Mean next-token loss (nats per token) of the next states of held-out expert
        transitions: how well the policy's weights predict the environment (eq. ee-iwm's loss)."""
        if split not in self._held_out:
            episodes = expert_transitions(self.make_task(split), self.eval_problems)
            self._held_out[split] = self._rows(world_model_rows([t for ep in episodes for t in ep]))
        batch = self._held_out[split]
        logprobs = sequence_logprobs(self.model, batch.input_ids, batch.attention_mask)
        mask = batch.loss_mask.float()
        return (-(logprobs * mask).sum() / mask.sum()).item()

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Greedy and sampled success, flawed-action rate and turns on held-out tasks of each
        split (``id_``: in-domain pairs; ``ood_``: held-out pairs), and the next-state loss."""
        c, seeds, out = self.config, self.eval_problems, {}
        with fixed_rng(eval_sampling_seed(c.seed), self.device):
            for split, name in (("train", "id"), ("ood", "ood")):
                for mode, greedy, g in (("greedy", True, 1), ("sampled", False, c.eval_samples)):
                    envs = [self.make_task(split) for _ in range(len(seeds) * g)]
                    b = self.play(seeds, group_size=g, greedy=greedy, envs=envs)
                    kinds = [k for env in envs for k in env.kinds]
                    out[f"{name}_{mode}_success"] = b.extras["success"].float().mean().item()
                    out[f"{name}_{mode}_flawed_rate"] = kinds.count("flawed") / max(len(kinds), 1)
                    out[f"{name}_{mode}_turns"] = b.extras["num_turns"].float().mean().item()
                out[f"{name}_next_state_loss"] = self.next_state_loss(split)
        return out

    def summary(self) -> dict:
        out = super().summary()
        if self.alternatives is not None:
            out.update(experience_stats(self.expert_episodes, self.alternatives))
            total = max(sum(self.proposed.values()), 1)
            out["proposals_valid_share"] = sum(self.proposed.get(k, 0) for k in VALID) / total
        return out


def probe_steps(config: EarlyExperienceConfig) -> list[int]:
    """The warm-start steps after which the next-state loss is measured: every ``probe_every``,
    the end of the initial policy and the end of the world-modelling stage (the same steps for
    every start, so that they compare)."""
    if config.probe_every == 0:
        return []
    every = range(config.probe_every, config.sft_steps + 1, config.probe_every)
    ends = (config.initial_steps, config.initial_steps + config.world_model_steps)
    return sorted({*every, *(s for s in ends if s > 0)})


def run_starts(
    config: EarlyExperienceConfig, arms: dict[str, dict] | tuple[str, ...] = STARTS
) -> dict[str, EarlyExperienceTrainer]:
    """The lab's arms: one initial policy (``initial_steps`` of imitation) and one collection of
    early experience, shared; then each arm's own warm start and GRPO, from a copy of that
    state. ``arms``: names of starts, or arm names mapped to the config fields they change (a
    ``start``, a shorter ``sft_steps`` ...). Each arm is what ``python -m agentic_rl
    early-experience`` computes with those fields (same demonstrations, same early experience,
    same RL task stream). In memory only."""
    if config.output_dir is not None:
        raise RunError("run_starts keeps no checkpoints: run one start per CLI call for that")
    if not isinstance(arms, dict):
        arms = {start: dict(start=start) for start in arms}
    configs = {name: dataclasses.replace(config, **fields) for name, fields in arms.items()}
    for arm in configs.values():
        arm.validate()
        if arm.initial_steps != config.initial_steps:
            raise RunError("the arms of run_starts share their initial policy: same initial_steps")
    base = EarlyExperienceTrainer(dataclasses.replace(config, start="imitation"))
    base.sft(steps=config.initial_steps)
    if any(arm.start != "imitation" for arm in configs.values()):
        base.alternatives = base.collect_experience()
    streams = rng_state(base.problem_rng)  # each arm samples from here, as its own CLI run would
    out = {}
    for name, arm in configs.items():
        trainer = copy.deepcopy(base)
        trainer.config = arm
        set_rng_state(streams, trainer.problem_rng)
        trainer.train()
        out[name] = trainer
    return out


CONFIG, TRAINER = EarlyExperienceConfig, EarlyExperienceTrainer
