"""The GiGPO lab's experiment: GRPO (omega = 0) and GiGPO (omega = 1) from one SFT start per seed.

Per seed, one SFT start on the household (15 % of the demonstrations' actions flawed) and the same
RL task stream for both arms (:func:`agentic_rl.runs.run_arms`), so the arms differ only in
omega; then, per arm, what the lab reports: success before and after (64 held-out tasks, 4
sampled episodes each, and greedily), the turns a solved episode takes beyond the optimal plan,
the anchor statistics over training, and on one fresh rollout batch of the final policy how often
the step level is non-zero and how often it contradicts the episode level.
"""

from __future__ import annotations

import numpy as np
import torch

from ..advantages import group_advantages
from ..envs import HouseholdEnv
from ..gigpo import GiGPOConfig, GiGPOTrainer, anchor_groups, gigpo_advantages
from ..runs import run_arms
from ..utils import fixed_rng

ARMS = {"GRPO": dict(step_advantage_weight=0.0), "GiGPO": dict(step_advantage_weight=1.0)}
SEEDS = 10
REPLICATE = ("GRPO", "GiGPO")
CHECKED = ("before_sampled_success", "after_sampled_success", "solved_excess_turns",
           "recurring_share_mean")
FLOORS: dict[str, float] = {}
#: The quick profile's sizes (a first profile of one seed, both arms, took 71 s on one thread).
QUICK = dict(sft_steps=300, max_steps=40)
#: The anchor statistics logged every RL step, with the lab's names for them.
ANCHOR_KEYS = {
    "recurring_share": "steps in step groups > 1",
    "mean_step_group_size": "step group size",
    "singleton_group_share": "step groups of one step",
    "step_episode_corr": "corr(A^S, A^E)",
}
CURVES = ("success_rate", "recurring_share", "step_episode_corr")


def config(seed: int, *, profile: str = "quick", device: str = "cpu", **overrides) -> GiGPOConfig:
    """The lab's config for one seed (before an arm's fields)."""
    sizes = dict(QUICK) if profile == "quick" else {}
    sizes.update(overrides)
    return GiGPOConfig.from_profile(
        profile, env="household", seed=seed, disable_tqdm=True, device=device, max_turns=8,
        max_action_tokens=5, demo_error_rate=0.15, **sizes,
    )


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """Both arms of one seed from one SFT start and one task stream: trainers by arm."""
    return run_arms(GiGPOTrainer, config(seed, profile=profile, device=device, **overrides),
                    {arm: ARMS[arm] for arm in arms})


def optimal_length(task_seed: int) -> int:
    """The number of actions of the task's shortest plan."""
    env = HouseholdEnv(max_turns=8)
    env.reset(task_seed)
    return len(env.plan())


@torch.no_grad()
def solved_turns(trainer, samples: int = 4) -> tuple[float, float]:
    """(turns per solved episode, excess turns over the optimal plan per solved episode), on the
    held-out tasks x ``samples`` episodes, one fixed sampling stream."""
    with fixed_rng(2468, trainer.device):
        b = trainer.play(trainer.eval_problems, group_size=samples)
    solved = b.extras["success"].bool()
    turns = b.extras["num_turns"].double()
    best = torch.tensor(
        [optimal_length(s) for s in trainer.eval_problems for _ in range(samples)],
        dtype=torch.float64,
    )
    return turns[solved].mean().item(), (turns - best)[solved].mean().item()


@torch.no_grad()
def fresh_batch(trainer):
    """One rollout batch of the final policy on a fixed stream, and its step rows."""
    with fixed_rng(4321, trainer.device):
        batch = trainer.rollout()
    return trainer.step_rows(batch), batch


def step_level_stats(rows: dict, batch) -> dict:
    """On one batch: steps in step groups > 1; the share of steps with A^S != 0 and with A^S
    against A^E's sign; and max |A(omega = 0, per-episode statistics) - GRPO's advantage|."""
    a_e, a_s, _ = gigpo_advantages(**rows, gamma=0.95, omega=1.0)
    _, sizes = anchor_groups(rows["anchor_states"], rows["group_ids"])
    nonzero = a_s.abs() > 1e-9
    per_episode = gigpo_advantages(**rows, gamma=0.95, omega=0.0, cross_steps=False)[2]
    grpo = group_advantages(batch.scores.double(), batch.group_id)
    per_row = grpo[torch.tensor(rows["episode_ids"])]
    return {
        "fresh_recurring_share": (sizes > 1).double().mean().item(),
        "fresh_informative_share": nonzero.double().mean().item(),
        "fresh_disagree_share": (nonzero & (a_e * a_s < 0)).double().mean().item(),
        "fresh_omega0_gap": (per_episode - per_row).abs().max().item(),
    }


def measure(trainer, arm: str, seed: int) -> dict:
    """Everything the lab reports about one trained arm."""
    metrics = {}
    for when in ("before", "after"):
        for key, value in trainer.evals[when].items():
            if isinstance(value, (int, float)):
                metrics[f"{when}_{key}"] = value
    h = trainer.history
    metrics["first_success_rate"] = h[0]["success_rate"]
    metrics["first_recurring_share"] = h[0]["recurring_share"]
    metrics["solved_turns"], metrics["solved_excess_turns"] = solved_turns(trainer)
    for key in ANCHOR_KEYS:
        metrics[f"{key}_first10"] = float(np.nanmean([r[key] for r in h[:10]]))
        metrics[f"{key}_last10"] = float(np.nanmean([r[key] for r in h[-10:]]))
        metrics[f"{key}_mean"] = float(np.nanmean([r[key] for r in h]))
    metrics.update(step_level_stats(*fresh_batch(trainer)))
    return {"metrics": metrics, "curves": {k: [r[k] for r in h] for k in CURVES}}
