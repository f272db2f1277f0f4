"""DAPO: GRPO with four changes, as settings and two functions: the DAPO chapter's recipe.

DAPO (Yu et al., 2025) keeps GRPO's group advantage and changes four things; here each is a
setting of the loop or a few lines:

1. **clip-higher** (eq. dapo-obj): ``epsilon_high`` 0.28 above ``epsilon`` 0.2, a loop setting;
2. **the token-level loss**: ``loss_type="dapo"`` (token-mean over the batch), a loop setting;
3. **dynamic sampling**: groups whose answers are all right or all wrong carry no gradient; more
   prompts are played until the batch is full of groups with both
   (:func:`agentic_rl.filters.dynamic_sampling`, shared with StarPO), and the filter stage drops
   any left;
4. **overlong reward shaping** (eq. dapo-overlong): :func:`overlong_penalty` adds a penalty that
   grows over the last ``overlong_buffer`` tokens of the budget; and, optionally, *overlong
   filtering*: no loss on completions that hit the budget (``mask_truncated``).

No KL term (``beta`` 0, already the loop's default). :class:`DAPOConfig` is
:class:`~agentic_rl.grpo.GRPOConfig` with these defaults and a ``grpo`` preset that turns all four
off on the same task: the chapter's control.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from . import filters
from .bounds import COEF, ROUNDS
from .config import defaults, param
from .grpo import GRPOConfig, GRPOTrainer
from .rollout import Batch

__all__ = ["DAPOConfig", "DAPOTrainer", "overlong_penalty", "CONFIG", "TRAINER"]


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (eq. dapo-overlong), per completion of ``lengths`` tokens
    under a budget of ``max_length``: 0 up to ``max_length - buffer``, then falling linearly to
    -1 at ``max_length`` (and -1 beyond it); ``buffer`` 0: no penalty."""
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    free = max_length - buffer  # L_max - L_cache
    penalty = (free - lengths.float()) / buffer
    return penalty.clamp(min=-1.0, max=0.0)


@dataclass
@defaults(epsilon_high=0.28, loss_type="dapo")
class DAPOConfig(GRPOConfig):
    """DAPO on the GRPO chapter's task: clip-higher, token-level loss, dynamic sampling and
    overlong reward shaping (the ``grpo`` preset turns all four off)."""

    #: The chapter's control: the same task, seeds and budget with GRPO's settings.
    PRESETS: ClassVar[dict[str, dict]] = {
        "dapo": {},
        "grpo": dict(
            epsilon_high=None,
            loss_type="grpo",
            dynamic_sampling=False,
            overlong_buffer=0,
        ),
    }

    preset: str = param(
        "dapo",
        "'dapo' (clip-higher 0.28, token-level loss, dynamic sampling, overlong shaping) or "
        "'grpo' (all four off: the GRPO chapter's settings). Fields you set override it.",
    )
    dynamic_sampling: bool = param(
        True,
        "Refill the batch with groups whose answers are neither all right nor all wrong "
        "(DAPO's dynamic sampling), playing up to max_sample_rounds rounds of prompts.",
    )
    max_sample_rounds: int = param(
        3,
        "Dynamic sampling: at most this many rollout rounds per step to refill the batch.",
        high=100,
        why=ROUNDS,
    )
    overlong_buffer: int = param(
        4,
        "L_cache: the last this many tokens of max_completion_length cost up to "
        "overlong_penalty_factor in reward (DAPO's soft overlong punishment). 0: off.",
        tokens=True,
    )
    overlong_penalty_factor: float = param(
        1.0,
        "Reward cost of a completion that uses the whole budget (DAPO: 1.0).",
        high=1e3,
        why=COEF,
    )
    mask_truncated: bool = param(
        False,
        "Overlong filtering: no loss on completions that hit max_completion_length without "
        "ending (TRL's mask_truncated_completions). Off, as DAPO's final recipe.",
    )

    def validate(self) -> None:
        super().validate()
        if not 0 <= self.overlong_buffer <= self.max_completion_length:
            self._bad("overlong_buffer", "must be in [0, max_completion_length]")
        if self.overlong_penalty_factor < 0:
            self._bad("overlong_penalty_factor", "must be >= 0 (it is a cost)")
        self._at_least(("max_sample_rounds",), 1)

    def check_data_parallel(self, world: int) -> None:
        super().check_data_parallel(world)
        if self.dynamic_sampling:  # (the ranks would refill in different numbers of rounds)
            why = f"(refill rounds differ between ranks) needs one process, not {world} ranks"
            self._bad("dynamic_sampling", why)


def _answers_differ(batch: Batch) -> torch.Tensor:
    """DAPO's criterion for a group: some of its answers right and some wrong."""
    return batch.correct.float()


class DAPOTrainer(GRPOTrainer):
    """GRPO's trainer with DAPO's rollout (refill, overlong shaping) and filter stage."""

    config: DAPOConfig

    rollout_is_sharded = True  # GRPO's rollout; dynamic sampling is refused under torchrun

    def rollout(self) -> Batch:
        """``prompts_per_step`` groups, refilled with groups whose answers differ (dynamic
        sampling), then the overlong penalty on each completion's reward (eq. dapo-overlong)."""
        c = self.config
        self.sample_rounds = 1
        if c.dynamic_sampling:
            batch, self.sample_rounds = filters.dynamic_sampling(
                super().rollout, groups=c.prompts_per_step, group_size=c.num_generations,
                max_rounds=c.max_sample_rounds, pad_token_id=self.tokenizer.pad_token_id,
                signal=_answers_differ,
            )  # fmt: skip
        else:
            batch = super().rollout()
        lengths = batch.loss_mask.sum(1)  # generated tokens, EOS included
        penalty = c.overlong_penalty_factor * overlong_penalty(
            lengths, c.max_completion_length, c.overlong_buffer
        )
        last = batch.loss_mask.shape[1] - 1 - batch.loss_mask.flip(1).argmax(1)
        rows = torch.arange(len(batch), device=lengths.device)
        batch.token_rewards[rows, last] += penalty  # R + R_length, where R sits
        batch.extras["overlong_penalty"] = penalty
        if c.mask_truncated:  # overlong filtering: truncated completions leave the loss
            batch.loss_mask = batch.loss_mask * ~batch.extras["truncated"].unsqueeze(1)
        return batch

    def filter_rows(self, batch: Batch) -> torch.Tensor | None:
        """With dynamic sampling, only groups whose answers differ enter the update (a step whose
        refill ran out of rounds may still hold some that do not)."""
        if not self.config.dynamic_sampling:
            return None
        return filters.nonzero_std_filter(_answers_differ(batch), batch.group_id)

    def rollout_metrics(self, batch: Batch, keep: torch.Tensor | None) -> dict:
        """Rounds played, truncated completions and the mean overlong penalty of the batch."""
        x = batch.extras
        return dict(
            sample_rounds=self.sample_rounds,
            truncated_rate=x["truncated"].float().mean().item(),
            overlong_penalty=x["overlong_penalty"].mean().item(),
        )


CONFIG, TRAINER = DAPOConfig, DAPOTrainer
