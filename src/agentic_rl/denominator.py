"""The token mean's denominator when the environment's tokens are trained.

Training the tokens the environment wrote (ReTool's unmasked interpreter output, RAGEN's later
states) does two things at once: it adds their loss, and it adds them to the token mean's
denominator, which shrinks the weight of every token the policy wrote (and, with clipping, it
changes how often the gradient is clipped). ``loss_denominator="policy"`` keeps the first and
removes the second: the loss is summed over every trained token but divided by the policy's own
tokens, so the policy's tokens keep the weight they have when the environment's are masked. With
the environment's tokens masked the two denominators are the same. One field and one function,
used by the ReTool and StarPO recipes (the control arms of their labs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import distributed as dist
from .config import RLConfig, param

__all__ = ["PolicyDenominatorFields", "over_policy_tokens"]


@dataclass
class PolicyDenominatorFields(RLConfig):
    """``loss_denominator``, for a recipe whose environment tokens can be trained. Last among a
    config's bases (as ``FrozenLakeFields``): a field mixin redeclares RLConfig's fields with
    RLConfig's defaults, which would otherwise override the agent fields' own."""

    loss_denominator: str = param(
        "all",
        "Token-mean denominator: 'all' (every trained token: with the environment's tokens "
        "trained, theirs too) or 'policy' (the policy's own tokens only: the unmasked ablation's "
        "control, whose environment tokens then add to the loss without diluting the weight of "
        "the policy's). With the environment's tokens masked the two are the same. GRPO and "
        "token-mean only.",
    )

    def validate(self) -> None:
        super().validate()
        if self.loss_denominator not in ("all", "policy"):
            self._bad("loss_denominator", "must be 'all' or 'policy'")
        if self.loss_denominator == "all":
            return
        if self.agg_mode != "token-mean":
            why = "'policy' rescales a token mean: use loss_type token-mean"
            self._bad("loss_denominator", why)
        if self.advantage_estimator != "grpo":
            why = "'policy' would rescale the critic's value loss too: use advantage_estimator grpo"
            self._bad("loss_denominator", why)
        if dist.world_size() > 1:
            why = "'policy' rescales each rank's loss by its own token counts: run one process"
            self._bad("loss_denominator", why)


def over_policy_tokens(loss: torch.Tensor, batch) -> torch.Tensor:
    """A token-mean ``loss`` of ``batch`` (one gradient step's rows) re-divided by the policy's
    own tokens: ``sum over trained tokens / number of policy tokens``. The environment's tokens
    are ``batch.extras["env_tokens"]`` (``multiturn.unmask_environment_tokens``); without them
    the loss is returned as it is."""
    env = batch.extras.get("env_tokens")
    if env is None:
        return loss
    trained = batch.loss_mask.bool()
    return loss * (trained.sum() / (trained & ~env).sum().clamp(min=1))
