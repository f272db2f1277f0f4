"""The StarPO lab's experiment: eight arms on the Bandit and five on slippery FrozenLake.

Per seed and environment, one SFT start (the lab's ``sft_start``), then every arm's RL from a copy
of it with the same seed: on the Bandit StarPO, StarPO-S and StarPO-S without one part at a time,
each with and without a critic where the lab asks, and StarPO with the group mean alone as its
baseline; on FrozenLake (3 x 3, 40 RL steps, a learning rate of 1e-3 to provoke a collapse)
StarPO, StarPO-S, StarPO with the states trained, and that arm's control pair (issue 43): the
states trained with the token mean over the policy's tokens and nothing clipped, and StarPO
unclipped. Per arm
the record holds the evaluations before and after RL, the Echo-Trap indicators (the last ten steps'
means, the half-peak steps, the gradient-norm spikes), the update time, and on FrozenLake what the
lab measures on the final policy: the log-probability of the state tokens (policy and SFT start),
the advantage the update puts on them, and how a KL penalty in the reward acts in tied groups.
"""

from __future__ import annotations

import copy
import math
import statistics

import torch

from ..advantages import group_advantages
from ..filters import group_std
from ..losses import kl_penalty
from ..multiturn import environment_tokens
from ..plotting import collapse_step
from ..rollout import sequence_logprobs
from ..starpo import StarPOConfig, StarPOTrainer
from ..utils import fixed_rng, setup
from . import NO_CLIP

_STARPO, _STARPO_S = dict(preset="starpo"), dict(preset="starpo-s")
#: FrozenLake's arms train at ten times the Bandit's learning rate (the quick profile: 40 steps).
LAKE_RL = dict(learning_rate=1e-3)
ARMS = {
    "Bandit: StarPO": _STARPO,
    "Bandit: StarPO-S": _STARPO_S,
    "Bandit: StarPO-S, no filter": dict(preset="starpo-s", rollout_filter="none"),
    "Bandit: StarPO-S, KL back": dict(preset="starpo-s", beta=0.001, kl_in_reward=True),
    "Bandit: StarPO-S, symmetric clip": dict(preset="starpo-s", epsilon_high=None),
    "Bandit: StarPO, critic": dict(preset="starpo", advantage_estimator="gae"),
    "Bandit: StarPO-S, critic": dict(preset="starpo-s", advantage_estimator="gae"),
    # the group mean without the std (Dr. GRPO's baseline): the minimal test of the std's role
    "Bandit: StarPO, mean baseline": dict(preset="starpo", scale_rewards="none"),
    "Lake: StarPO": dict(_STARPO, **LAKE_RL),
    "Lake: StarPO-S": dict(_STARPO_S, **LAKE_RL),
    "Lake: StarPO, states trained": dict(preset="starpo", mask_observations=False, **LAKE_RL),
    # the states-trained arm's control pair: training the states changes the loss's denominator
    # (more tokens) and how often the gradient is clipped; the control removes both, and StarPO
    # unclipped is its pair with the states masked
    "Lake: StarPO, states trained, control": dict(preset="starpo", mask_observations=False,
                                                  loss_denominator="policy",
                                                  max_grad_norm=NO_CLIP, **LAKE_RL),
    "Lake: StarPO, unclipped": dict(preset="starpo", max_grad_norm=NO_CLIP, **LAKE_RL),
}
SEEDS = 8
#: StarPO against StarPO-S and the critic on the Bandit; StarPO with and without the states
#: trained on FrozenLake (the lab's two sharpest claims; about two minutes on one thread)
REPLICATE = ("Bandit: StarPO", "Bandit: StarPO-S", "Bandit: StarPO, critic", "Lake: StarPO",
             "Lake: StarPO, states trained")
CHECKED = ("before_sampled_success", "after_sampled_success", "in_group_std_last10",
           "state_logprob")
FLOORS: dict[str, float] = {}
#: FrozenLake's quick sizes (the full profile keeps its own).
LAKE_QUICK = dict(max_steps=40, eval_size=64)
#: A gradient norm above this (twice ``max_grad_norm``) counts as a spike.
SPIKE = 2.0
INDICATORS = ("accuracy", "in_group_std", "entropy", "distinct_per_group")
CURVES = ("accuracy", "in_group_std", "entropy", "grad_norm")


def env_of(arm: str) -> str:
    """The environment an arm trains on, from its name."""
    return "bandit" if arm.startswith("Bandit") else "frozenlake"


def _env_fields(env: str, profile: str) -> dict:
    return dict(LAKE_QUICK) if env == "frozenlake" and profile == "quick" else {}


def sft_start(env: str, seed: int, *, profile="quick", device="cpu", **overrides):
    """The SFT'd policy one seed's arms all start from, and its evaluation."""
    fields = {**_env_fields(env, profile), **overrides}
    config = StarPOConfig.from_profile(profile, env=env, seed=seed, disable_tqdm=True,
                                       device=device, **fields)
    setup(seed)
    start = StarPOTrainer(config)
    start.sft()
    return start, start.evaluate()


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested arms of one seed, each from a copy of its environment's SFT start (trained
    once per environment): trainers by arm. A FrozenLake trainer keeps its start as
    ``sft_model``, the reference its state tokens are measured against."""
    starts, out = {}, {}
    for arm in arms:
        env = env_of(arm)
        if env not in starts:
            starts[env] = sft_start(env, seed, profile=profile, device=device, **overrides)
        start, before = starts[env]
        fields = {**_env_fields(env, profile), **ARMS[arm], **overrides, "sft_steps": 0}
        config = StarPOConfig.from_profile(profile, env=env, seed=seed, disable_tqdm=True,
                                           device=device, **fields)
        setup(seed)
        trainer = StarPOTrainer(config, model=copy.deepcopy(start.model),
                                tokenizer=start.tokenizer)
        trainer.evals["before"] = before
        trainer.train()
        trainer.sft_model = start.model
        out[arm] = trainer
    return out


def _nan(value) -> float:
    return math.nan if value is None else float(value)


def update_seconds(trainer) -> float:
    """Median time of an RL step's update: the step's time minus its rollout's (from the logged
    rollout speed)."""
    c = trainer.config
    rows = c.prompts_per_step * c.num_generations
    return statistics.median(r["step_time"] - r["completion_length"] * rows / r["tokens_per_s"]
                             for r in trainer.history)


@torch.no_grad()
def state_logprobs(trainer, n: int = 64) -> tuple[float, float]:
    """(policy, SFT start): mean log pi per state token, on ``n`` episodes the policy plays
    (fixed seeds and sampling stream)."""
    with fixed_rng(1234, trainer.device):
        b = trainer.play(list(range(900_000, 900_000 + n)), group_size=1)
    states = environment_tokens(b)
    return tuple(float(sequence_logprobs(m, b.input_ids, b.attention_mask)[states].mean())
                 for m in (trainer.model, trainer.sft_model))


@torch.no_grad()
def state_weights(trainer) -> dict:
    """On one fresh rollout batch: the mean advantage on the trained state tokens and on the action
    tokens, and the trained tokens per episode with a negative and a positive advantage."""
    with fixed_rng(4321, trainer.device):
        batch = trainer.rollout()
    adv, states = trainer.compute_advantages(batch), batch.extras["env_tokens"]
    actions = batch.loss_mask.bool() & ~states
    row_adv = adv.sum(1) / batch.loss_mask.sum(1)  # the episode's scalar advantage
    tokens = batch.loss_mask.sum(1).float()
    return {"state_advantage": adv[states].mean().item(),
            "action_advantage": adv[actions].mean().item(),
            "tokens_negative": tokens[row_adv < 0].mean().item(),
            "tokens_positive": tokens[row_adv > 0].mean().item()}


@torch.no_grad()
def kl_in_tied_groups(trainer, beta: float = 0.001) -> dict:
    """On one fresh rollout batch: the groups whose rewards tie, and their mean |advantage| with
    k1 in the loss (0: ties give no advantage) and in the reward (verl's ``use_kl_in_reward``)."""
    with fixed_rng(4321, trainer.device):
        batch = trainer.rollout()
    k1 = kl_penalty(batch.old_logprobs, batch.ref_logprobs, "k1") * batch.loss_mask
    shaped = batch.scores - beta * k1.sum(1)  # r - beta * sum_t k1(t)
    std, index = group_std(batch.scores, batch.group_id)
    tied = (std == 0)[index]
    a_loss = group_advantages(batch.scores, batch.group_id)
    a_reward = group_advantages(shaped, batch.group_id)
    if not tied.any():
        return {"tied_groups": 0.0, "groups": float(len(std)), "tied_adv_kl_loss": math.nan,
                "tied_adv_kl_reward": math.nan, "tied_penalty_span": math.nan}
    return {"tied_groups": float((std == 0).sum()), "groups": float(len(std)),
            "tied_adv_kl_loss": a_loss[tied].abs().max().item(),
            "tied_adv_kl_reward": a_reward[tied].abs().mean().item(),
            "tied_penalty_span": (beta * k1.sum(1)[tied]).abs().max().item()}


def measure(trainer, arm: str, seed: int) -> dict:
    """Everything the lab prints, asserts or plots about one trained arm."""
    h = trainer.history
    metrics = {}
    for when in ("before", "after"):
        for key, value in trainer.evals[when].items():
            if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[f"{when}_{key}"] = _nan(value)
    for key in INDICATORS:
        metrics[f"{key}_last10"] = statistics.mean(r[key] for r in h[-10:])
    for key in ("accuracy", "in_group_std", "entropy"):
        metrics[f"{key}_half_peak_step"] = _nan(collapse_step(h, key))
    peak = max(range(len(h)), key=lambda i: h[i]["grad_norm"])
    metrics["top_grad_norm"], metrics["top_grad_norm_step"] = h[peak]["grad_norm"], h[peak]["step"]
    metrics["spike_steps"] = float(sum(r["grad_norm"] > SPIKE for r in h))
    metrics["update_ms"] = 1000 * update_seconds(trainer)
    if env_of(arm) == "frozenlake":
        metrics["state_logprob"], metrics["state_logprob_sft"] = state_logprobs(trainer)
        if not trainer.config.mask_observations:
            metrics.update(state_weights(trainer))
        if arm == "Lake: StarPO":
            metrics.update(kl_in_tied_groups(trainer))
    return {"metrics": metrics, "curves": {k: [float(r[k]) for r in h] for k in CURVES}}
