"""The token view: what each token of a Batch row gets, as text (terminal) and static HTML."""

from __future__ import annotations

import random

import pytest
import torch

from agentic_rl.advantages import group_advantages
from agentic_rl.losses import policy_loss
from agentic_rl.rollout import Batch, generate_batch
from agentic_rl.tokenview import TokenView, token_view


def multiturn_batch() -> Batch:
    """Two rows: prompt, action (turn 0), observation, action (turn 1), padding."""
    ids = torch.arange(10, 22).repeat(2, 1)
    attn = torch.ones(2, 12, dtype=torch.long)
    attn[1, 10:] = 0
    loss = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0],
                         [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0]])
    turns = torch.where(loss.bool(), torch.tensor([[0] * 5 + [1] * 7] * 2), torch.tensor(-1))
    rewards = torch.zeros(2, 12)
    rewards[0, 4], rewards[0, 8] = 0.5, 1.0
    rewards[1, 9] = -0.1
    old = torch.zeros(2, 12)
    return Batch(input_ids=ids, attention_mask=attn, loss_mask=loss, token_rewards=rewards,
                 group_id=torch.tensor([0, 0]), old_logprobs=old, turn_ids=turns,
                 extras=dict(success=torch.tensor([True, False])))


def test_single_turn_batch_text_and_html(model, tokenizer, task):
    torch.manual_seed(0)
    problems = task.sample(2, random.Random(0))
    batch = generate_batch(model, tokenizer, task, problems, num_generations=3,
                           max_completion_length=5)
    adv = group_advantages(batch.scores, batch.group_id)
    view = token_view(batch, 2, tokenizer, advantages=adv)
    assert isinstance(view, TokenView)
    recs = view.records()
    n_gen = int(batch.loss_mask[2].sum())
    assert sum(r["trainable"] for r in recs) == n_gen
    assert {r["segment"] for r in recs} <= {"prompt", "gen"}
    # the advantage sits on trainable tokens only, equal to the row's
    for r in recs:
        if r["trainable"]:
            assert r["advantage"] == pytest.approx(float(adv[2]))
        else:
            assert r["advantage"] is None
    text = view.text()
    assert str(view) == text
    assert "legend" in text and "adv" in text
    assert all(len(line) <= 100 for line in text.splitlines()[2:])
    assert text.count("[") >= n_gen
    page = view._repr_html_()
    assert "<script" not in page and "max-width: 100ch" in page and "style=" in page


def test_multiturn_turns_rewards_ratio_and_clip():
    batch = multiturn_batch()
    adv = torch.tensor([[0.0, 0, 1, 1, 1, 0, 0, 2, 2, 0, 0, 0],
                        [0.0, 0, 0, -1, -1, 0, 0, 0, -1, -1, 0, 0]])
    logp = torch.zeros(2, 12)
    logp[0, 7] = 0.5  # ratio 1.65 > 1.2 with A > 0: clipped high
    logp[1, 3] = -0.5  # ratio 0.61 < 0.8 with A < 0: clipped low
    logp[1, 4] = 0.5  # ratio 1.65 with A < 0: not clipped (the gradient flows)
    view = token_view(batch, 0, None, advantages=adv, logprobs=logp)
    recs = {r["pos"]: r for r in view.records()}
    assert [recs[p]["segment"] for p in (0, 2, 5, 7)] == ["prompt", "gen", "env", "gen"]
    assert recs[2]["turn"] == 0 and recs[7]["turn"] == 1 and recs[5]["turn"] is None
    assert recs[4]["reward"] == 0.5 and recs[8]["reward"] == 1.0 and recs[3]["reward"] is None
    assert recs[7]["clipped"] == "high" and recs[7]["ratio"] == pytest.approx(1.6487, abs=1e-3)
    assert recs[2]["clipped"] is None
    text = view.text()
    assert "gen1" in text and "1.65^" in text and "| " in text and "rew" in text
    assert "success True" in text
    v1 = token_view(batch, 1, None, advantages=adv, logprobs=logp, epsilon=0.2)
    r1 = {r["pos"]: r for r in v1.records()}
    assert r1[3]["clipped"] == "low" and r1[4]["clipped"] is None
    assert 10 not in r1  # padding hidden by default
    assert 10 in {r["pos"] for r in token_view(batch, 1, show_padding=True).records()}
    assert "&#9660;" in v1.to_html()


def test_segments_labels_and_extra_rows():
    batch = multiturn_batch()
    tool = torch.zeros(2, 12, dtype=torch.bool)
    tool[:, 5:7] = True
    view = token_view(batch, 0, lambda i: f"t{i}", segments={"tool": tool},
                      extra={"ret": torch.ones(2, 12)})
    recs = view.records()
    assert [r["segment"] for r in recs if r["pos"] in (5, 6)] == ["tool", "tool"]
    assert recs[0]["text"] == "t10" and recs[0]["extra"] == {"ret": 1.0}
    assert "tool" in view.text() and "ret" in view.text()
    labels = [None] * 12
    labels[0] = "sys"
    assert token_view(batch, 0, segments=labels).records()[0]["segment"] == "sys"


def test_wraps_long_rows():
    B, T = 1, 80
    batch = Batch(input_ids=torch.arange(T).unsqueeze(0) % 7, attention_mask=torch.ones(B, T),
                  loss_mask=torch.ones(B, T, dtype=torch.long), token_rewards=torch.zeros(B, T),
                  group_id=torch.zeros(B, dtype=torch.long))
    text = token_view(batch, 0, lambda i: "word" * (i % 3 + 1),
                      advantages=torch.randn(B)).text()
    lines = text.splitlines()
    assert len(lines) > 8 and all(len(line) <= 100 for line in lines[2:])


@pytest.mark.parametrize("kwargs, name", [
    (dict(row=5), "row"),
    (dict(row=0, advantages=torch.zeros(3, 12)), "advantages"),
    (dict(row=0, logprobs=torch.zeros(2, 11)), "logprobs"),
    (dict(row=0, logprobs=torch.zeros(2, 12), old_logprobs=torch.zeros(2)), "old_logprobs"),
    (dict(row=0, segments=["a"] * 3), "segments"),
    (dict(row=0, epsilon=0.3, epsilon_high=0.1), "epsilon"),
])
def test_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        token_view(multiturn_batch(), **kwargs)


def test_clipped_marks_are_the_tokens_policy_loss_clips():
    # the view uses losses.clip_region, the rule policy_loss's clip metrics count: per row, the
    # tokens marked low / high are the fractions policy_loss reports on that row alone
    g = torch.Generator().manual_seed(5)
    B, T = 3, 40
    batch = Batch(input_ids=torch.randint(0, 9, (B, T), generator=g),
                  attention_mask=torch.ones(B, T, dtype=torch.long),
                  loss_mask=(torch.rand(B, T, generator=g) > 0.3).long(),
                  token_rewards=torch.zeros(B, T), group_id=torch.tensor([0, 0, 1]),
                  old_logprobs=-torch.rand(B, T, generator=g))
    logp = batch.old_logprobs + 0.5 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    for row in range(B):
        recs = token_view(batch, row, advantages=adv, logprobs=logp, epsilon=0.1,
                          epsilon_high=0.28).records()
        sl = slice(row, row + 1)
        _, m = policy_loss(logp[sl], batch.old_logprobs[sl], adv[sl], batch.loss_mask[sl],
                           epsilon=0.1, epsilon_high=0.28)
        n = sum(r["trainable"] for r in recs)
        low = sum(r["clipped"] == "low" for r in recs)
        high = sum(r["clipped"] == "high" for r in recs)
        assert low > 0 and high > 0
        assert (m["clip_ratio_low"], m["clip_ratio_high"]) == pytest.approx((low / n, high / n))
