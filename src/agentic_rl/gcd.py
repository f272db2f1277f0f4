"""GCD (Liu et al. 2025): why flawed actions survive outcome-reward GRPO; a classification loss.

The paper's argument has three parts, and this module gives each a function:

1. **Lemma 3.1**: an outcome reward does punish a flawed action in expectation. If an action taken
   with probability ``q`` lowers the success probability by ``r``, its expected advantage weight is
   ``E[A 1{a}] = q r (q - 1) < 0`` (:func:`lemma_value`); :func:`simulate_risky_action` checks it by
   Monte Carlo with GRPO's own group advantages (whose group mean includes the sample itself, which
   scales the value by ``(G - 1) / G``).
2. **Theorem 3.2's setting**, a softmax over three actions: :func:`softmax_policy_gradient` follows
   the exact expected policy gradient, where the *squeezing effect* shows (a milder flawed action
   can gain probability while the worst one is pushed down).
3. **Gradient coupling**: measured by :mod:`agentic_rl.coupling` on the probe pairs of
   :func:`coupling_probes` (one action, good after state A, flawed after the near-identical B).

**GCD** (generative classification disentanglement) trains the same model to judge each of its
actions: right after an action's last token, the model's next token is trained to be
``<|good|>`` or ``<|bad|>`` (a *generative* classifier read through a two-token verbalizer: the
cross-entropy of the softmax over those two tokens' logits only, each class weighted to count
equally, eq. gcd-loss), with weight ``lambda`` next to the GRPO loss. The judgement is read from
the same forward pass as the policy loss; the rollout never samples at that position (the
environment's next observation follows the action), so the policy is not asked to emit it.

What is the paper's and what is reconstructed (``reference/algorithms.md`` sections 6 and 15): the
Lemma and the coupling hypothesis are the paper's; the exact GCD loss, its prompt, its labels and
its weight are not published in any source reachable here; the paper's Figure 5 caption says its
action labels "are determined by the consistency of 5 judgments from Deepseek V3", of which the
environment's own flawed-action flag (``judge_labels="oracle"``) is the analogue here. The other
label rules (the episode's outcome, the sign of its advantage) and the position of the judgement
are this book's choices. The paper was withdrawn from ICLR 2026.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import bounds, coupling, runs
from .advantages import group_advantages
from .agent import AgentTrainer
from .bounds import COEF
from .config import (
    GROUP_AGENT_DEFAULTS,
    GROUP_AGENT_FULL,
    AgentFields,
    HouseholdFields,
    defaults,
    param,
)
from .envs import HouseholdEnv
from .envs.household import RECEPTACLES, counterfactual_goal
from .losses import aggregate
from .rollout import Batch, build_segments_batch, sequence_logprobs
from .train import sft_step
from .utils import eval_sampling_seed, fixed_rng, probe_seeds

__all__ = [
    "ARMS",
    "GCDTrainer",
    "COUPLING_KEYS",
    "coupling_probes",
    "judgement_labels",
    "judgement_loss",
    "auroc",
    "judge_metrics",
    "lemma_value",
    "lemma_value_std",
    "measure_coupling",
    "run_arms",
    "simulate_risky_action",
    "softmax_policy_gradient",
    "GCDConfig",
    "CONFIG",
    "TRAINER",
]


@functools.lru_cache(maxsize=1)
def _household_words() -> tuple[str, ...]:
    return tuple(HouseholdEnv().vocabulary())


@dataclass
@defaults(**GROUP_AGENT_DEFAULTS)
class GCDConfig(AgentFields, HouseholdFields):
    """GRPO with GCD: the actor also learns to judge its own actions good or bad."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("household",)
    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(GROUP_AGENT_FULL, num_probes=64),
    }
    # (group-relative only: no CriticFields, so no critic and no critic flags; uses_critic False)
    # --- defaults that differ from the agent fields'
    env: str = param("household", "Environment: 'household' (ALFWorld-style tasks).")
    sft_steps: int = param(500, "SFT steps on the mixed-quality teacher's episodes before RL.")
    sft_learning_rate: float = param(3e-3, "SFT learning rate.")
    max_steps: int = param(30, "RL steps (one rollout batch each).")
    eval_size: int = param(64, "Held-out tasks per split (in domain and out of domain).")
    max_turns: int = param(8, "Cap on an episode's turns (each task's budget: its plan + slack).")
    max_action_tokens: int = param(
        5, "Tokens of one action: 'take mug from table' and the stop word."
    )
    demo_error_rate: float = param(
        0.1,
        "Per turn, the chance that the SFT teacher takes a flawed action (then recovers): the "
        "flawed actions that RL has to unlearn.",
    )
    # --- the environment
    hint: bool = param(
        False,
        "Prompt-based correction: the first observation ends with 'hint : avoid ...', naming the "
        "receptacles that are not the target.",
    )
    # --- GCD
    judge_weight: float = param(
        0.1,
        "lambda: weight of the judgement loss (generative classification of each action as good "
        "or bad); 0 is plain GRPO on the same task. Above 0 the loss's forward pass is the plain "
        "one over every column of every row (share_prompt_prefix and skip_prompt_logits do not "
        "apply): the judgement reads logits at action columns anywhere in the episode, which the "
        "fast paths do not return. The same log-probs up to float summation order.",
        high=1e3,
        why=COEF,
    )
    judge_labels: str = param(
        "outcome",
        "Label of each action for the judgement: 'outcome' (the episode's success), 'advantage' "
        "(the sign of its GRPO advantage; 0: no label) or 'oracle' (the environment's own "
        "flawed-action flag: the analogue of the paper's labels, which its Figure 5 says come "
        "from the consistency of 5 judgments by DeepSeek-V3).",
    )
    judge_balance: bool = param(
        True,
        "Class-balance the judgement loss: weight each class's examples so that both classes "
        "count equally (a judge that always says the majority class no longer wins); false: the "
        "plain mean over the labelled actions.",
    )
    judge_sft_weight: float = param(
        0.0,
        "Weight of a judgement loss in the SFT warm start (0: none): after each of the teacher's "
        "actions, its own label (good, or flawed), class-balanced, next to the SFT loss (the cold "
        "start on critic data that summaries of the paper describe; the paper's is unknown).",
        high=1e3,
        why=COEF,
    )
    good_token: str = param("<|good|>", "The special token of the judgement 'good'.")
    bad_token: str = param("<|bad|>", "The special token of the judgement 'bad'.")
    coupling_every: int = param(
        10, "Measure gradient coupling on the probe pairs every this many RL steps (0: off)."
    )
    num_probes: int = param(16, "Probe pairs (one action, good in one state, flawed in another).")

    def memory_needs(self) -> list[tuple[int, tuple[str, ...], str]]:
        """And the probes: per-sample gradients, two of the model's size per probe pair (tiny
        model), or their sequences (a pretrained one)."""
        tiny, tokens = self.model_name_or_path is None, max(self.min_sequence_tokens(), 1)
        per_probe = 8 * bounds.tiny_parameters(self) if tiny else 8 * tokens
        need = (self.num_probes * per_probe, ("num_probes",), "the coupling probes")
        return [*super().memory_needs(), need]

    def validate(self) -> None:
        super().validate()
        for name in ("judge_weight", "judge_sft_weight"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                self._bad(name, "must be >= 0 and finite")
        if self.judge_labels not in ("outcome", "advantage", "oracle"):
            self._bad("judge_labels", "must be 'outcome', 'advantage' or 'oracle'")
        if self.coupling_every < 0:
            self._bad("coupling_every", "must be >= 0 (0: off)")
        if self.num_probes < 1:
            self._bad("num_probes", "must be >= 1")
        self._check_new_tokens(("good_token", "bad_token"), _household_words())

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "max_turns")

    def min_sequence_tokens(self) -> int:
        # the first observation (at most 37 words with the hint) and one action
        return 38 + self.max_action_tokens


#: The lab's arms, from the same SFT start: plain GRPO (its untrained judge is the control), GCD
#: with the oracle labels (the analogue of the paper's) and with advantage labels; and the
#: outcome labels as an ablation (the rule whose judge, unbalanced, learned only the base rate).
ARMS: dict[str, dict] = {
    "GRPO": dict(judge_weight=0.0),
    "GCD oracle": dict(judge_weight=0.5, judge_labels="oracle"),
    "GCD advantage": dict(judge_weight=0.5, judge_labels="advantage"),
    "GCD outcome": dict(judge_weight=0.5, judge_labels="outcome"),
    # from a warm start that also taught the judge (judge_sft_weight): GRPO, then GCD
    "GRPO, judged SFT": dict(judge_weight=0.0, judge_labels="oracle", judge_sft_weight=0.1),
    "GCD oracle, judged SFT": dict(judge_weight=0.5, judge_labels="oracle", judge_sft_weight=0.1),
}


# ---------------------------------------------------------------------- Lemma 3.1
def lemma_value(q: float, r: float, group_size: int | None = None) -> float:
    """``E[A 1{a}] = q r (q - 1)`` (Lemma 3.1, eq. gcd-lemma): the expected advantage weight of an
    action taken with probability ``q`` that lowers the success probability by ``r``, for a
    baseline equal to the expected reward. With ``group_size`` G: GRPO's mean-centred
    advantage, whose baseline (the group mean) includes the sample itself, which gives
    ``(G - 1) / G`` of it."""
    value = q * r * (q - 1)
    return value if group_size is None else value * (group_size - 1) / group_size


def lemma_value_std(q: float, r: float, p: float, group_size: int) -> float:
    """``E[A 1{a}]`` under GRPO's std-normalised advantage (unbiased group std), in closed form.
    Condition on the group's ``k`` successes (``0 < k < G``; other groups give 0): each success
    took the action with probability ``q_s = q (p - r) / eta``, each failure with ``q_f = q (1 - p
    + r) / (1 - eta)``, ``eta = p - q r``; a success's advantage is ``(1 - k/G) / sigma_k``, a
    failure's ``-k/G / sigma_k``, ``sigma_k = sqrt(k (G - k) / (G (G - 1)))``. So

    ``E[A 1{a}] = 1/G sum_k C(G, k) eta^k (1 - eta)^(G-k) k (G - k) (q_s - q_f) / (G sigma_k)``,

    negative whenever ``r > 0`` (then ``q_s < q_f``); with ``sigma_k = 1`` it is eq.
    gcd-lemma-group."""
    g, eta = group_size, p - q * r
    if not 0 < eta < 1:
        return 0.0  # every group is all-success or all-failure: no spread, no advantage
    q_s, q_f = q * (p - r) / eta, q * (1 - p + r) / (1 - eta)
    total = 0.0
    for k in range(1, g):
        sigma = math.sqrt(k * (g - k) / (g * (g - 1)))
        weight = math.comb(g, k) * eta**k * (1 - eta) ** (g - k)
        total += weight * k * (g - k) * (q_s - q_f) / (g * sigma)
    return total / g


def simulate_risky_action(
    p: float,
    r: float,
    q: float,
    *,
    group_size: int = 8,
    groups: int = 20_000,
    baseline: str = "group",
    scale: str = "none",
    seed: int = 0,
) -> float:
    """Monte Carlo estimate of ``E[A 1{a}]``: in each of ``groups`` groups of ``group_size``
    episodes, each episode takes the risky action with probability ``q`` and then succeeds with
    probability ``p - r`` (``p`` without it); reward 1 on success. ``baseline="group"``: GRPO's
    advantage (:func:`agentic_rl.advantages.group_advantages` with ``scale``); ``"expected"``:
    ``R - E[R]`` with the true ``E[R] = p - q r``."""
    if not (0 <= r <= p <= 1 and 0 <= q <= 1):
        raise ValueError(f"need 0 <= r <= p <= 1 and 0 <= q <= 1, got p={p}, r={r}, q={q}")
    gen = torch.Generator().manual_seed(seed)
    risky = torch.rand(groups, group_size, generator=gen, dtype=torch.float64) < q
    chance = torch.where(risky, p - r, p)
    rewards = (torch.rand(groups, group_size, generator=gen, dtype=torch.float64) < chance).double()
    if baseline == "expected":
        advantages = rewards - (p - q * r)
    elif baseline == "group":
        ids = torch.arange(groups).repeat_interleave(group_size)
        advantages = group_advantages(rewards.flatten(), ids, scale=scale).view(groups, group_size)
    else:
        raise ValueError(f"baseline must be 'group' or 'expected', got {baseline!r}")
    return (advantages * risky).mean().item()


def softmax_policy_gradient(logits, success, *, lr: float = 1.0, steps: int = 100) -> torch.Tensor:
    """Theorem 3.2's setting: a softmax policy over K actions with success probabilities
    ``success``, moved by the exact expected policy gradient with the expected reward as baseline,
    ``z <- z + lr * pi * (s - pi . s)`` (eq. gcd-softmax). Returns the probabilities ``[steps + 1,
    K]``, the start included."""
    z = torch.as_tensor(logits, dtype=torch.float64).clone()
    s = torch.as_tensor(success, dtype=torch.float64)
    if z.shape != s.shape or z.ndim != 1:
        raise ValueError("logits and success must be two vectors of the same length")
    out = [torch.softmax(z, 0)]
    for _ in range(steps):
        pi = out[-1]
        z = z + lr * pi * (s - (pi * s).sum())
        out.append(torch.softmax(z, 0))
    return torch.stack(out)


# ---------------------------------------------------------------------- coupling probes
def coupling_probes(
    tokenizer, seeds: list[int], *, env: HouseholdEnv | None = None, device=None
) -> tuple[Batch, Batch]:
    """Probe pairs for :mod:`agentic_rl.coupling`: for each seed, the expert's episode up to an
    action that depends on the goal's target (the final ``put O in T`` for even seeds, the
    ``go to T`` before it for odd ones). Row ``i`` of the first batch is that history and action
    (good); row ``i`` of the second is the same text with only the goal's target changed to
    another receptacle, where the same action is flawed.

    Only the action's decisive token, its last word ``T``, has ``loss_mask`` 1: the words before
    it (``put O in``) are right in both states, and would otherwise dominate ``log pi(a|s)`` with
    a coupling that is no flaw. ``extras["probe"]``: each row's type, ``"put"`` or ``"goto"``."""
    env = env or HouseholdEnv()
    rows_a, rows_b = [], []
    for seed in seeds:
        pairs = env.demonstration(seed, random.Random(seed), 0.0)
        k = len(pairs) - 1 if seed % 2 == 0 else len(pairs) - 2
        target = env.task["target"]
        other = [r for r in RECEPTACLES if r != target][seed % (len(RECEPTACLES) - 1)]
        first_b = counterfactual_goal(pairs[0][0], env.task, other)
        for first, rows in ((pairs[0][0], rows_a), (first_b, rows_b)):
            segments = []
            for j, (obs, action) in enumerate(pairs[:k]):
                segments += [(first if j == 0 else obs, False), (f"{action} </action>", False)]
            *lead, decisive = pairs[k][1].split()
            segments += [(pairs[k][0], False), (" ".join(lead), False), (decisive, True)]
            rows.append(segments)
    a, b = (build_segments_batch(tokenizer, rows, device) for rows in (rows_a, rows_b))
    for batch in (a, b):  # the probe type of each row, for measure_coupling's split
        batch.extras["probe"] = ["put" if seed % 2 == 0 else "goto" for seed in seeds]
    return a, b


#: What :func:`measure_coupling` returns.
COUPLING_KEYS = (
    *("grad_cos", "grad_cos_control", "grad_cos_other", "pair_spill", "pair_spill_control"),
    *("grad_cos_put", "grad_cos_control_put", "grad_cos_goto", "grad_cos_control_goto"),
    *("control_pairs", "hidden_cos", "state_cos", "spill"),
)


def measure_coupling(model, probes: tuple[Batch, Batch], *, lr: float = 0.01) -> dict:
    """The coupling measurements on probe pairs, averaged over pairs. From one set of per-sample
    gradients (:func:`agentic_rl.coupling.pair_cosines`): ``grad_cos`` (eq. gcd-cos) next to its
    control ``grad_cos_control`` (pairs of different tasks with the same decisive word and probe
    type) and ``grad_cos_other`` (different words), the per-pair first-order spill share
    ``pair_spill`` next to ``pair_spill_control``, and both cosines by probe type (``_put``,
    ``_goto``); ``control_pairs`` counts the control pairs. Then
    ``hidden_cos`` (centred, at the decisive token), ``state_cos`` (centred, at the token it is
    chosen from) and ``spill``: the share of B rows whose flawed action *gained* probability from
    one SGD step on the mean of all A rows (a batch step, eq. gcd-spill with cross-pair terms).
    Shares, not ratios of changes: where the policy is already sure in A, the change there is
    tiny and a ratio says more about that than about coupling."""
    a, b = probes
    moved = coupling.spillover(model, a, b, lr=lr)
    ga, gb = coupling.per_sample_grads(model, a), coupling.per_sample_grads(model, b)
    tokens, kinds = coupling.decisive_tokens(a), a.extras.get("probe")
    return dict(
        **coupling.pair_cosines(ga, gb, tokens, kinds),
        hidden_cos=coupling.hidden_cosine(model, a, b, at="action").mean().item(),
        state_cos=coupling.hidden_cosine(model, a, b, at="state").mean().item(),
        spill=(moved["delta_b"] > 0).float().mean().item(),
    )


# ---------------------------------------------------------------------- the judgement (GCD)
def judgement_labels(
    batch: Batch, rule: str, advantages: torch.Tensor | None = None
) -> tuple[list[int], list[int], list[bool]]:
    """Which actions get a judgement and which one: ``(rows, cols, good)``, where ``cols`` are the
    columns of each action's last token (``extras["turn_end"]``).

    ``"outcome"``: every action of a successful episode is good, of a failed one bad;
    ``"advantage"``: by the sign of the episode's GRPO advantage (``advantages``, ``[B, T]``), no
    label where it is 0 (a group with no spread says nothing); ``"oracle"``: the environment's own
    label (``extras["kinds"]``: only ``good`` actions are good)."""
    if rule not in ("outcome", "advantage", "oracle"):
        raise ValueError(f"rule must be 'outcome', 'advantage' or 'oracle', got {rule!r}")
    if rule == "advantage" and advantages is None:
        raise ValueError("the 'advantage' rule needs the advantages")
    success = batch.extras["success"].tolist()
    row_adv = advantages.sum(1).tolist() if advantages is not None else None
    rows, cols, good = [], [], []
    for i, ends in enumerate(batch.extras["turn_end"]):
        for k, col in enumerate(ends):
            if rule == "outcome":
                label = bool(success[i])
            elif rule == "advantage":
                if row_adv[i] == 0:
                    continue
                label = row_adv[i] > 0
            else:
                label = batch.extras["kinds"][i][k] == "good"
            rows.append(i)
            cols.append(col)
            good.append(label)
    return rows, cols, good


def auroc(scores, positive) -> float | None:
    """The area under the ROC curve of ``scores`` for the ``positive`` (bool) class, exactly: the
    chance that a random positive scores above a random negative, ties counting 1/2 (ranks of
    the Mann-Whitney U statistic, tied values sharing their average rank). ``None`` if a class is
    absent."""
    s = torch.as_tensor(scores, dtype=torch.float64).flatten()
    y = torch.as_tensor(positive, dtype=torch.bool, device=s.device).flatten()
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return None
    _, inverse, counts = torch.unique(s, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = (ends - (counts - 1) / 2)[inverse]  # 1-based, ties at their average rank
    return ((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)).item()


def judge_metrics(pair: torch.Tensor, is_good: torch.Tensor, prefix: str = "judge_") -> dict:
    """A judge's scores ``pair`` ``[N, 2]`` (logits of good, bad) against labels ``is_good``:
    ``accuracy``, ``good_share``, ``base_rate`` (the share of the majority class: what a judge
    that always says it scores), ``balanced_accuracy`` (the mean of the recalls of the two
    classes; 0.5 for any constant judge) and ``auroc`` (of the logit difference good - bad).
    The last two are ``None`` when a class is absent."""
    says, good = pair[:, 0] > pair[:, 1], is_good.bool()
    both = bool(good.any() and (~good).any())
    share = good.double().mean().item() if len(good) else None
    out = dict(
        accuracy=(says == good).double().mean().item() if len(good) else None,
        good_share=share,
        base_rate=max(share, 1 - share) if share is not None else None,
        balanced_accuracy=(
            (says[good].double().mean() + (~says[~good]).double().mean()).item() / 2
            if both
            else None
        ),
        auroc=auroc(pair[:, 0] - pair[:, 1], good) if both else None,
    )
    return {prefix + k: v for k, v in out.items()}


def judgement_loss(
    logits: torch.Tensor, rows, cols, good, token_ids: tuple[int, int], *, balance: bool = True
) -> tuple[torch.Tensor, dict]:
    """Cross-entropy of the judgement token after each labelled action (eq. gcd-loss): of the
    logits ``[B, T, V]`` at ``(rows, cols)`` (which predict the token after the action), those of
    ``token_ids = (good, bad)``, against the label. The softmax is over the two judgement tokens
    only (a *verbalizer*, as an LLM judge is read): over the whole vocabulary, the loss would also
    raise both tokens against every word, everywhere, and the policy starts writing them into its
    actions. ``balance``: each class's examples weighted so that both classes count equally,
    ``(mean over good + mean over bad) / 2`` (with one class only: its mean); otherwise the plain
    mean, which a judge that always says the majority class minimises nearly as well. Metrics:
    :func:`judge_metrics`. No label: loss 0 (with a graph)."""
    if not rows:
        empty = judge_metrics(logits.new_zeros(0, 2), torch.zeros(0, dtype=torch.bool))
        return logits.sum() * 0.0, dict(judge_loss=0.0, **empty)
    device = logits.device
    picked = logits[torch.tensor(rows, device=device), torch.tensor(cols, device=device)].float()
    is_good = torch.tensor(good, device=device)
    pair = picked[:, list(token_ids)]  # [N, 2]: the logits of good and bad
    ce = torch.nn.functional.cross_entropy(pair, (~is_good).long(), reduction="none")
    if balance and is_good.any() and (~is_good).any():
        loss = (ce[is_good].mean() + ce[~is_good].mean()) / 2  # each class counts 1/2
    else:
        loss = ce.mean()
    return loss, dict(judge_loss=loss.item(), **judge_metrics(pair.detach(), is_good))


# ---------------------------------------------------------------------- the trainer
class GCDTrainer(AgentTrainer):
    """SFT on a mixed-quality teacher, then GRPO on the household tasks, with GCD's judgement loss
    when ``judge_weight`` > 0. Measures flawed actions every step, gradient coupling every
    ``coupling_every`` steps, and success in and out of domain."""

    config: GCDConfig

    headline = ("ood_success", "ood_sampled_success")
    headline_definition = (
        "ood_success: success on held-out tasks whose (object, target) pair never occurs in "
        "training, sampling at the training temperature; id_*: in-domain pairs, unseen seeds"
    )

    @property
    def added_tokens(self) -> tuple[str, ...]:
        return (self.config.good_token, self.config.bad_token)

    @property
    def judge_ids(self) -> tuple[int, int]:
        return tuple(self.tokenizer.convert_tokens_to_ids(t) for t in self.added_tokens)

    def make_task(self, split: str = "train"):
        c = self.config
        return HouseholdEnv(
            split=split,
            clean_fraction=c.clean_fraction,
            slack=c.slack,
            max_turns=c.max_turns,
            hint=c.hint,
        )

    @functools.cached_property
    def probes(self) -> dict[str, tuple[Batch, Batch]]:
        """Fixed probe pairs of each split (seeds apart from training and evaluation)."""
        seeds = probe_seeds(self.config.num_probes)
        return {
            split: coupling_probes(
                self.tokenizer, seeds, env=self.make_task(split), device=self.device
            )
            for split in ("train", "ood")
        }

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        judge = ("judge_loss", "judge_accuracy", "judge_good_share", "judge_balanced_accuracy")
        judge += ("judge_auroc",)
        return super().extra_metrics + (judge if self.config.judge_weight > 0 else ())

    # ------------------------------------------------------------------ rollout and loss
    def play(self, seeds, *, group_size=1, greedy=False, ref_model=None, envs=None):
        """Episodes as :meth:`AgentTrainer.play` (another split's tasks: ``envs`` of
        ``make_task(split)``); ``extras["kinds"]`` holds each episode's action labels (good,
        flawed, invalid, malformed)."""
        if envs is None:
            envs = [self.make_task() for _ in range(len(seeds) * group_size)]
        batch = super().play(
            seeds, group_size=group_size, greedy=greedy, ref_model=ref_model, envs=envs
        )
        batch.extras["kinds"] = [list(env.kinds) for env in envs]
        return batch

    # ------------------------------------------------------------------ warm start
    def sft_batch(self) -> Batch:
        """The teacher's episodes (:meth:`AgentTrainer.sft_batch`), with each action's label for
        a judged warm start: ``extras["judge_cols"]`` (per row, the column of each action's last
        token, as ``turn_end`` in a rollout) and ``extras["judge_good"]`` (the action was good)."""
        batch = super().sft_batch()
        trained = batch.loss_mask.bool()
        ends = trained & ~torch.nn.functional.pad(trained[:, 1:], (0, 1))  # last of each run
        batch.extras["judge_cols"] = [torch.nonzero(e).flatten().tolist() for e in ends]
        kinds = batch.extras["demo_kinds"]
        batch.extras["judge_good"] = [[kind == "good" for kind in row] for row in kinds]
        return batch

    def sft_update(self, batch: Batch) -> float:
        """One SFT step; with ``judge_sft_weight`` > 0, plus that weight times the class-balanced
        judgement loss on the teacher's labels, read from the same forward pass (eq. gcd-loss).
        Returns the weighted sum."""
        c = self.config
        if c.judge_sft_weight == 0:
            return super().sft_update(batch)
        logprobs, logits = sequence_logprobs(
            self.model, batch.input_ids, batch.attention_mask, with_logits=True
        )
        cols = batch.extras["judge_cols"]
        rows = [i for i, row in enumerate(cols) for _ in row]
        flat = [col for row in cols for col in row]
        good = [g for row in batch.extras["judge_good"] for g in row]
        judge, _ = judgement_loss(logits, rows, flat, good, self.judge_ids, balance=True)
        loss = aggregate(-logprobs, batch.loss_mask, "token-mean") + c.judge_sft_weight * judge
        return sft_step(self.model, self.optimizer, batch, max_grad_norm=c.max_grad_norm, loss=loss)

    # ------------------------------------------------------------------ RL loss
    def compute_loss(self, batch, advantages, *, outputs=None):
        """GRPO's loss, plus ``lambda`` times the judgement loss read from the same forward pass
        (eq. gcd-total)."""
        c = self.config
        if c.judge_weight == 0:
            return super().compute_loss(batch, advantages, outputs=outputs)
        logprobs, entropy, logits = sequence_logprobs(
            self.model,
            batch.input_ids,
            batch.attention_mask,
            temperature=c.temperature,
            with_entropy=True,
            with_logits=True,
        )
        loss, metrics = super().compute_loss(batch, advantages, outputs=(logprobs, entropy))
        rows, cols, good = judgement_labels(batch, c.judge_labels, advantages)
        judge, judged = judgement_loss(
            logits, rows, cols, good, self.judge_ids, balance=c.judge_balance
        )
        metrics.update(judged)
        return loss + c.judge_weight * judge, metrics

    def rollout_metrics(self, batch, keep) -> dict:
        """Every step: the share of flawed and of invalid or malformed actions; every
        ``coupling_every`` steps: the coupling measurements on the in-domain probes."""
        kinds = [k for row in batch.extras["kinds"] for k in row]
        out = dict(
            super().rollout_metrics(batch, keep),
            flawed_rate=kinds.count("flawed") / max(len(kinds), 1),
            invalid_rate=(kinds.count("invalid") + kinds.count("malformed")) / max(len(kinds), 1),
        )
        every = self.config.coupling_every
        if every and self.step % every == 0:
            out.update(measure_coupling(self.model, self.probes["train"]))
        else:
            out.update(dict.fromkeys(COUPLING_KEYS))
        return out

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def judge_on(self, batch: Batch) -> dict:
        """The judge on held-out episodes (:func:`judge_metrics`), read as in training (the
        logits after each action's last token), against each label rule: ``judge_<rule>_*`` for
        ``outcome``, ``advantage`` (the signs of GRPO advantages from the batch's own groups)
        and ``oracle``; and ``judge_*`` against the run's own rule. Every arm is measured: with
        ``judge_weight`` 0 the judge is untrained (the control)."""
        ids, mask = batch.input_ids, batch.attention_mask
        _, logits = sequence_logprobs(self.model, ids, mask, with_logits=True)
        scale = self.config.scale_rewards
        advantages = group_advantages(batch.scores, batch.group_id, scale=scale)[:, None]
        out = {}
        for rule in ("outcome", "advantage", "oracle"):
            rows, cols, good = judgement_labels(batch, rule, advantages)
            pair = logits[rows, cols][:, list(self.judge_ids)].float()
            good = torch.tensor(good, dtype=torch.bool, device=pair.device)
            out.update(judge_metrics(pair, good, f"judge_{rule}_"))
        own = f"judge_{self.config.judge_labels}_"
        for key in ("balanced_accuracy", "auroc", "base_rate", "good_share"):
            out[f"judge_{key}"] = out[own + key]
        return out

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Greedy and sampled success and the flawed-action rate on held-out tasks of each split
        (``id_``: in-domain pairs; ``ood_``: the held-out pairs), the judge on the sampled
        episodes (:meth:`judge_on`), and the coupling measurements on each split's probes."""
        c, seeds, out = self.config, self.eval_problems, {}
        with fixed_rng(eval_sampling_seed(c.seed), self.device):
            for split, name in (("train", "id"), ("ood", "ood")):
                for mode, greedy, g in (("greedy", True, 1), ("sampled", False, c.eval_samples)):
                    envs = [self.make_task(split) for _ in range(len(seeds) * g)]
                    b = self.play(seeds, group_size=g, greedy=greedy, envs=envs)
                    kinds = [k for row in b.extras["kinds"] for k in row]
                    out[f"{name}_{mode}_success"] = b.extras["success"].float().mean().item()
                    out[f"{name}_{mode}_flawed_rate"] = kinds.count("flawed") / max(len(kinds), 1)
                    out[f"{name}_{mode}_turns"] = b.extras["num_turns"].float().mean().item()
                # b: the sampled episodes (groups of eval_samples): the judge on them
                out.update({f"{name}_{k}": v for k, v in self.judge_on(b).items()})
        with torch.enable_grad():
            for split, name in (("train", "id"), ("ood", "ood")):
                for key, value in measure_coupling(self.model, self.probes[split]).items():
                    out[f"{name}_{key}"] = value
        return out


def run_arms(config: GCDConfig, arms: dict[str, dict] = ARMS) -> dict[str, GCDTrainer]:
    """The lab's arms from shared SFT starts (:func:`agentic_rl.runs.run_arms`): one per value
    of ``judge_sft_weight``."""
    return runs.run_arms(GCDTrainer, config, arms, start_fields=("judge_sft_weight",))


CONFIG, TRAINER = GCDConfig, GCDTrainer
