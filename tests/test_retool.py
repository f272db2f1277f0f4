"""ReTool: the interpreter environment, the interleaved rollout, the feedback mask, GRPO-RoC."""

from __future__ import annotations

import random

import pytest
import torch

from agentic_rl import sandbox
from agentic_rl.envs import MultiplyEnv, make_env
from agentic_rl.envs.multiply import render_output, to_source
from agentic_rl.multiturn import rollout_multiturn
from agentic_rl.config import ConfigError
from agentic_rl.losses import policy_loss
from agentic_rl.retool import (
    ReToolTrainer,
    gradient_share,
    interpreter_span,
    interpreter_tokens,
    placebo_signs,
    resample_on_correct,
    unmask_interpreter,
)
from agentic_rl.rollout import build_segments_batch, sequence_logprobs

from testkit import tiny


def _result(**kw):
    base = dict(stdout="", stderr="", exit_code=0, timed_out=False, truncated=False, wall_s=0.0)
    base["error"] = None
    base.update(kw)
    return sandbox.Result(**base)


# --------------------------------------------------------------------------- the environment


def test_code_words_become_a_printed_program():
    assert to_source("3 4 7 * 2 9") == "print(347*29)"
    assert to_source("3 4 * * 2") == "print(34**2)"
    assert to_source("1 2 *") == "12*"  # does not parse: left for the interpreter to report
    assert to_source("") == ""


def test_interpreter_output_is_rendered_cut_and_named():
    assert render_output(_result(stdout="10063\n"), 8) == "<interpreter> 1 0 0 6 3 </interpreter>"
    long = render_output(_result(stdout="1234567890123\n"), 4)
    assert long == "<interpreter> 1 2 3 4 ... </interpreter>"
    bad = _result(exit_code=1, error="SyntaxError: invalid syntax")
    assert render_output(bad, 8) == "<interpreter> SyntaxError </interpreter>"
    odd = _result(exit_code=1, error="RecursionError: too deep")
    assert render_output(odd, 8) == "<interpreter> Error </interpreter>"
    slow = _result(exit_code=None, timed_out=True, error="TimeoutError")
    assert render_output(slow, 8) == "<interpreter> TimeoutError </interpreter>"


def test_an_episode_with_the_real_sandbox():
    env = MultiplyEnv()
    prompt = env.reset(3)
    a, b = env.a, env.b
    assert prompt == f"{' '.join(str(a))} * {' '.join(str(b))} ="
    code = f"<code> {' '.join(str(a))} * {' '.join(str(b))} </code>"
    obs, reward, done, info = env.step(code)
    assert obs == f"<interpreter> {' '.join(str(a * b))} </interpreter>"
    assert (reward, done, env.calls, env.tool_errors) == (0.0, False, 1, 0)
    obs, reward, done, info = env.step(f"<answer> {' '.join(str(a * b))} </answer>")
    assert (obs, reward, done) == ("", 1.0, True) and info["success"] and env.answered


@pytest.mark.parametrize(
    "text,reward,format_ok",
    [
        ("<answer> 1 2 </answer>", -1.0, True),  # wrong
        ("<answer> </answer>", -1.0, False),  # empty
        ("<answer> 1 * 2 </answer>", -1.0, False),  # not digits
        ("<answer> 1 2", -1.0, False),  # unclosed
        ("", -1.0, False),
        ("<code> 1 2", -1.0, False),  # code cut before </code>
        ("</code>", -1.0, False),
        (None, -1.0, False),
        ("<interpreter> " * 500, -1.0, False),
    ],
)
def test_bad_segments_end_the_episode_without_raising(text, reward, format_ok):
    env = MultiplyEnv()
    env.reset(0)
    obs, r, done, info = env.step(text)
    assert (obs, r, done, info["format_ok"]) == ("", reward, True, format_ok)
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step("<answer> 1 </answer>")


def test_tool_errors_budget_and_switching_the_tool_off():
    env = MultiplyEnv(max_tool_calls=2)
    env.reset(0)
    obs, r, done, _ = env.step("<code> 1 2 * </code>")
    assert obs == "<interpreter> SyntaxError </interpreter>" and not done and env.tool_errors == 1
    obs, r, done, _ = env.step("<code> 9 * * 9 9 9 </code>")  # 9**999: cut at 8 tokens
    assert obs.endswith("... </interpreter>") and len(obs.split()) == 2 + 8 + 1
    obs, r, done, _ = env.step("<code> 1 * 2 </code>")  # a third call: over the budget
    assert (obs, r, done) == ("", -1.0, True) and env.calls == 2

    off = MultiplyEnv(tool_enabled=False)
    off.reset(0)
    obs, r, done, _ = off.step("<code> 1 * 2 </code>")
    assert (obs, r, done) == ("", 0.0, False)
    off.step("<interpreter> 2 </interpreter> <answer> 2 </answer>")
    assert off.hallucinated and off.answered

    flaky = MultiplyEnv(tool_error_rate=1.0)
    flaky.reset(0)
    assert flaky.step("<code> 1 * 2 </code>")[0] == "<interpreter> Error </interpreter>"


def test_a_hung_snippet_is_a_tool_error_within_its_deadline():
    env = MultiplyEnv(timeout_s=0.5)
    env.reset(0)
    obs, _, done, _ = env.step("<code> 9 9 * * 9 9 * * 9 9 </code>")  # runs for ever
    assert obs == "<interpreter> TimeoutError </interpreter>" and not done


def test_demonstrations_mask_the_interpreter_and_are_consistent():
    env, rng = MultiplyEnv(), random.Random(0)
    kinds = set()
    for seed in range(40):
        segs = env.demonstration(seed, rng, tool_fraction=0.5, error_rate=0.5)
        assert segs[0] == (env.prompt, False)
        if len(segs) == 4:
            kinds.add("tool")
            assert [t for _, t in segs] == [False, True, False, True]
            a, b = segs[1][0].split(" * ")
            product = int("".join(a.split()[1:])) * int("".join(b.split()[:-1]))
            assert segs[2][0] == f"<interpreter> {' '.join(str(product))} </interpreter>"
            assert segs[3][0] == f"<answer> {' '.join(str(product))} </answer>"
        else:
            kinds.add("direct")
            assert segs[1] == (f"<answer> {env.answer} </answer>", True)
    assert kinds == {"tool", "direct"}


# --------------------------------------------------------------------------- rollout and mask


@pytest.fixture(scope="module")
def trained():
    """A tiny policy after a short cold start: it writes code and answers."""
    torch.manual_seed(0)
    config = tiny("retool", sft_steps=150, hidden_size=64, intermediate_size=128)
    trainer = ReToolTrainer(config)
    trainer.sft()
    yield trainer
    trainer.close()


def test_interleaved_rollout_runs_code_and_masks_its_output(trained):
    batch = trained.play(list(range(8)), group_size=2)
    tool = interpreter_tokens(batch)
    assert int(batch.extras["tool_calls"].sum()) > 0 and bool(tool.any())
    tok = trained.tokenizer
    for row in range(len(batch)):
        ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        text = tok.decode(ids, skip_special_tokens=False).split()
        masks = batch.loss_mask[row][batch.attention_mask[row].bool()].tolist()
        # every <interpreter> ... </interpreter> block is the environment's: loss 0
        words = tok.convert_ids_to_tokens(ids)
        inside = False
        for w, m in zip(words, masks):
            if w == "<interpreter>" and m == 0:
                inside = True
            if inside:
                assert m == 0, (row, text)
            if w == "</interpreter>":
                inside = False
    # what interpreter_tokens marks is exactly the non-sampled text after the prompt
    assert not bool((tool & batch.loss_mask.bool()).any())


def test_recorded_logprobs_equal_re_encoding_the_whole_row(trained):
    """The KV cache kept across tool pauses gives the log-probs of re-encoding every row."""
    batch = trained.play(list(range(8)), group_size=2)
    again = sequence_logprobs(trained.model, batch.input_ids, batch.attention_mask)
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(batch.old_logprobs[mask], again[mask], atol=1e-5, rtol=1e-5)


def test_cache_reuse_and_re_encoding_sample_the_same_tokens(trained):
    outs = []
    for reuse in (True, False):
        envs = [trained.make_task(pool=trained.pool) for _ in range(8)]
        torch.manual_seed(7)
        b = rollout_multiturn(
            trained.model,
            trained.tokenizer,
            envs,
            list(range(8)),
            max_action_tokens=10,
            stop_word="</code>",
            keep_stop_word=True,
            reuse_cache=reuse,
        )
        outs.append(b)
    assert torch.equal(outs[0].input_ids, outs[1].input_ids)
    assert sum(e for e in outs[0].extras["num_turns"].tolist()) > 8  # some tool calls happened


def _logit_grads(trainer, batch):
    """The gradient of the RL loss with respect to each position's logits (on the plain path,
    whose language-model head runs over every column, so that columns map to positions)."""
    import dataclasses

    captured = {}
    config = trainer.config
    trainer.config = dataclasses.replace(
        config, share_prompt_prefix=False, skip_prompt_logits=False
    )

    def keep(module, inputs, output):
        output.retain_grad()
        captured["logits"] = output

    advantages = trainer.compute_advantages(batch)
    head = trainer.model.get_output_embeddings()
    handle = head.register_forward_hook(keep)
    try:
        trainer.model.zero_grad()
        loss, _ = trainer.compute_loss(batch, advantages)
        loss.backward()
    finally:
        handle.remove()
        trainer.config = config
    # logits at column t-1 predict token t
    g = captured["logits"].grad.abs().sum(-1)
    return torch.nn.functional.pad(g[:, :-1], (1, 0))


def _mixed_batch(trainer):
    """Teacher-forced tool traces (half of them miscopy a digit: wrong), two groups of four."""
    env, rng, eos = trainer.task, random.Random(0), trainer.tokenizer.eos_token
    rows, rewards = [], []
    for seed in range(8):
        segs = env.demonstration(seed, rng, tool_fraction=1.0, error_rate=0.5)
        rewards.append(1.0 if segs[-1][0] == f"<answer> {env.answer} </answer>" else -1.0)
        rows.append(segs[:-1] + [(f"{segs[-1][0]} {eos}", True)])
    batch = build_segments_batch(trainer.tokenizer, rows)
    last = batch.attention_mask.sum(1) - 1
    batch.token_rewards[torch.arange(8), last] = torch.tensor(rewards)
    batch.group_id = torch.arange(8) // 4
    assert all(len(set(rewards[g * 4 : g * 4 + 4])) == 2 for g in (0, 1)), rewards
    with torch.no_grad():
        batch.old_logprobs = sequence_logprobs(trainer.model, batch.input_ids, batch.attention_mask)
    batch.extras = dict(
        tool_calls=torch.ones(8, dtype=torch.long),
        tool_errors=torch.zeros(8, dtype=torch.long),
        num_turns=torch.full((8,), 2),
        success=torch.tensor(rewards) > 0,
        policy_error_rate=0.0,
    )
    return batch


def test_no_interpreter_token_receives_gradient_when_masked(trained):
    batch = _mixed_batch(trained)
    tool = interpreter_tokens(batch)
    grads = _logit_grads(trained, batch)
    assert float(grads[tool].abs().max()) == 0.0
    assert float(grads[batch.loss_mask.bool()].abs().sum()) > 0  # the policy's tokens do
    assert gradient_share(trained, batch, trained.compute_advantages(batch)) == 0.0


def test_unmasked_interpreter_tokens_do_receive_gradient(trained):
    batch = _mixed_batch(trained)
    tool = unmask_interpreter(batch, trained.model)
    assert bool(batch.loss_mask.bool()[tool].all())
    # their "old" log-probs are the current policy's: the ratio starts at 1
    now = sequence_logprobs(trained.model, batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(batch.old_logprobs[tool], now[tool], atol=1e-5, rtol=1e-5)
    grads = _logit_grads(trained, batch)
    advantaged = tool & (trained.compute_advantages(batch) != 0)
    assert bool(advantaged.any()) and float(grads[advantaged].min()) > 0
    share = gradient_share(trained, batch, trained.compute_advantages(batch))
    assert 0.0 < share < 1.0


def test_interpreter_span_from_the_tags_agrees_with_the_mask(trained):
    """Two independent definitions of the interpreter's tokens: the tags' span and the masks."""
    tok = trained.tokenizer
    batch = trained.play(list(range(8)), group_size=2)
    span = interpreter_span(batch, tok)
    assert bool(span.any()) and torch.equal(span, interpreter_tokens(batch))
    assert int(batch.loss_mask[span].sum()) == 0
    # by hand: two calls (one output cut at 8 tokens and marked ...), a direct answer, padding
    rows = [
        [("2 3 7 * 8 2 =", False), ("<code> 2 3 7 * * 8 2 </code>", True),
         ("<interpreter> 1 2 3 4 5 6 7 8 ... </interpreter>", False),
         ("<code> 2 3 7 * 8 2 </code>", True),
         ("<interpreter> 1 9 4 3 4 </interpreter>", False),
         ("<answer> 1 9 4 3 4 </answer>", True)],
        [("9 8 3 * 1 7 =", False), ("<answer> 1 6 7 1 1 </answer>", True)],
    ]  # fmt: skip
    hand = build_segments_batch(tok, rows)
    span = interpreter_span(hand, tok)
    assert torch.equal(span, interpreter_tokens(hand))
    assert span.sum(1).tolist() == [11 + 7, 0]
    # a policy that writes the tag itself: the tags' span now covers sampled tokens, the masks'
    # definition does not; the check tells them apart
    rows[1][1] = ("<interpreter> 1 6 7 1 1 </interpreter>", True)
    hand = build_segments_batch(tok, rows)
    span = interpreter_span(hand, tok)
    assert not torch.equal(span, interpreter_tokens(hand)) and int(span[1].sum()) == 7


# --------------------------------------------------------------------------- loss denominator


@pytest.mark.parametrize(
    "override, field",
    [
        (dict(loss_denominator="tools"), "loss_denominator"),
        (dict(loss_denominator="policy", advantage_estimator="gae", num_generations=1),
         "loss_denominator"),
        (dict(loss_denominator="policy", loss_type="seq-mean-token-mean"), "loss_denominator"),
    ],
)  # fmt: skip
def test_loss_denominator_refuses_what_it_does_not_support(override, field):
    with pytest.raises(ConfigError) as err:
        tiny("retool", **override)
    assert err.value.field == field
    config = tiny("retool")
    with pytest.raises(ConfigError):  # a bad assignment is undone, before any compute
        config.loss_denominator = "tools"
    assert config.loss_denominator == "all"


def test_policy_denominator_needs_one_process(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="one process"):
        tiny("retool", loss_denominator="policy")


def test_policy_denominator_divides_by_the_policy_tokens_only(trained):
    """Unmasked, 'all': sum over policy + interpreter tokens / their number; 'policy': the same
    sum / the policy's tokens, so the policy's tokens weigh what they weigh in the masked arm."""
    import dataclasses

    masked = _mixed_batch(trained)
    unmasked = _mixed_batch(trained)
    tool = unmask_interpreter(unmasked, trained.model)
    own = masked.loss_mask.bool()
    assert torch.equal(own, unmasked.loss_mask.bool() & ~tool)
    # GRPO advantages sum to 0 over a group, and so would the interpreter tokens' part of the
    # loss at ratio 1: shift them, so that every part of the loss has a size to check
    advantages = {}
    for name, b in (("masked", masked), ("unmasked", unmasked)):
        advantages[name] = trained.compute_advantages(b) + 0.5 * b.loss_mask
    config, losses = trained.config, {}
    try:
        for denominator in ("all", "policy"):
            trained.config = dataclasses.replace(config, loss_denominator=denominator)
            for name, b in (("masked", masked), ("unmasked", unmasked)):
                losses[name, denominator] = trained.compute_loss(b, advantages[name])[0].detach()
    finally:
        trained.config = config
    # with the mask on there is nothing to rescale
    torch.testing.assert_close(losses["masked", "all"], losses["masked", "policy"])
    n_all, n_own = float(unmasked.loss_mask.sum()), float(own.sum())
    torch.testing.assert_close(
        losses["unmasked", "policy"], losses["unmasked", "all"] * n_all / n_own
    )
    # = the masked arm's loss plus the interpreter tokens' own sum over the same denominator
    with torch.no_grad():
        logprobs, _ = trained.policy_logprobs(unmasked)
    tool_sum, _ = policy_loss(
        logprobs, unmasked.old_logprobs, advantages["unmasked"], tool.long(),
        epsilon=config.epsilon, agg="token-sum",
    )  # fmt: skip
    torch.testing.assert_close(
        losses["unmasked", "policy"], losses["masked", "all"] + tool_sum / n_own
    )
    assert n_own < n_all and float(tool_sum.abs()) > 0


# --------------------------------------------------------------------------- the placebo


def _placebo_config(trained, placebo, **fields):
    """The lab's control arm (``interpreter_placebo`` as given) on the trained policy's config."""
    import dataclasses

    from agentic_rl.experiments import retool as lab

    arm = dict(lab.ARMS["control"], interpreter_placebo=placebo)
    return dataclasses.replace(trained.config, **arm, **fields)


def test_placebo_signs_the_interpreter_advantages_and_keeps_the_policy_ones(trained):
    """On one batch: the placebo's advantages are the control's on the policy's tokens, and
    plus or minus the control's, one sign per episode, both signs, on the interpreter's (all
    still in the loss)."""
    batch = _mixed_batch(trained)
    tool = unmask_interpreter(batch, trained.model)
    config, adv = trained.config, {}
    try:
        for placebo in (False, True):
            trained.config = _placebo_config(trained, placebo)
            adv[placebo] = trained.compute_advantages(batch)
        share = gradient_share(trained, batch, adv[True])
    finally:
        trained.config = config
    policy = batch.loss_mask.bool() & ~tool
    assert torch.equal(adv[True][policy], adv[False][policy])
    control, placebo = adv[False][tool], adv[True][tool]
    assert torch.equal(placebo.abs(), control.abs()) and bool((control != 0).all())
    flips = adv[True] * adv[False] < 0  # [B, T]: where the placebo flipped the control's sign
    rows = tool.any(1)
    assert bool((flips.any(1) == (flips | ~tool).all(1))[rows].all())  # a row flips as one
    assert 0 < int(flips.any(1)[rows].sum()) < int(rows.sum())  # some rows flipped, not all
    assert 0.0 < share < 1.0  # the interpreter tokens still carry gradient


def test_placebo_signs_are_their_own_reproducible_stream():
    tool = torch.rand(16, 40, generator=torch.Generator().manual_seed(0)) < 0.3
    state, python_state = torch.get_rng_state(), random.getstate()
    signs = placebo_signs(tool, 0, 3)
    assert torch.equal(torch.get_rng_state(), state) and random.getstate() == python_state
    assert torch.equal(signs, placebo_signs(tool, 0, 3))  # every call of a step: the same
    assert bool((signs[~tool] == 1).all()) and set(signs[tool].tolist()) == {-1, 1}
    for row, mask in zip(signs, tool):  # one sign per episode, on all its interpreter tokens
        assert len(set(row[mask].tolist())) <= 1
    for seed, step in ((0, 4), (1, 3)):
        assert not torch.equal(signs, placebo_signs(tool, seed, step))


def _rewarded(batch):
    """A rollout whose groups (of two, in generation order) have a row above the other, and so
    advantages (the tiny policy answers every problem wrong)."""
    batch.token_rewards[::2, -1] += 2.0
    return batch


def test_placebo_leaves_the_tasks_and_the_sampling_unchanged(trained):
    """An RL step of the control and of its placebo from the same weights and task stream: the
    same rollout, then the same task stream and torch stream (the signs draw from neither); the
    placebo's advantages differ from the control's on that rollout in sign only."""
    import copy

    start, out = trained.problem_rng.getstate(), {}
    for placebo in (False, True):
        config = _placebo_config(trained, placebo, sft_steps=0, grad_share_every=1)
        t = ReToolTrainer(config, model=copy.deepcopy(trained.model), tokenizer=trained.tokenizer)
        t.problem_rng.setstate(start)
        t.start_rl()
        seen, play, rollout = [], t.play, t.rollout
        t.play = lambda *a, **k: _rewarded(play(*a, **k))
        t.rollout = lambda: seen.append(rollout()) or seen[-1]
        torch.manual_seed(0)
        try:
            t.rl_step()
        finally:
            t.close()
        out[placebo] = seen[0], t.problem_rng.getstate(), torch.get_rng_state(), t
    (batch, tasks, state, t0), (batch1, tasks1, state1, t1) = out[False], out[True]
    assert torch.equal(batch.input_ids, batch1.input_ids)
    assert bool(batch1.extras["env_tokens"].any())
    assert tasks == tasks1 and torch.equal(state, state1)
    assert t1.history[0]["grad_share"] > 0
    t1.step = 0  # the step's signs again (the same on every call)
    adv, adv1 = t0.compute_advantages(batch1), t1.compute_advantages(batch1)
    assert torch.equal(adv1.abs(), adv.abs()) and not torch.equal(adv1, adv)


def test_placebo_needs_the_interpreter_tokens_in_the_loss():
    with pytest.raises(ConfigError, match="mask_interpreter") as err:
        tiny("retool", interpreter_placebo=True)
    assert err.value.field == "interpreter_placebo"
    assert tiny("retool", interpreter_placebo=True, mask_interpreter=False).interpreter_placebo


def test_the_placebo_arm_is_the_control_with_the_placebo_on():
    from agentic_rl.experiments import retool as lab

    arms = list(lab.ARMS)
    assert arms[arms.index("control") + 1] == "control, placebo"
    assert lab.ARMS["control, placebo"] == dict(lab.ARMS["control"], interpreter_placebo=True)


# --------------------------------------------------------------------------- GRPO-RoC


def test_resample_on_correct_keeps_clean_positives_and_some_negatives():
    # one group of 8 (keep 4): 4 positives with error rates 1/2, 0, no calls (0.5), 1/1
    scores = torch.tensor([1.0, -1, 1, -1, 1, -1, 1, -1])
    calls = torch.tensor([2, 1, 1, 1, 0, 1, 1, 1])
    errors = torch.tensor([1, 0, 0, 1, 0, 0, 1, 0])
    gid = torch.zeros(8, dtype=torch.long)
    keep = resample_on_correct(scores, gid, calls, errors, 4, torch.Generator().manual_seed(0))
    assert len(keep) == 4 and len(set(keep.tolist())) == 4
    kept_pos = [i for i in keep.tolist() if scores[i] > 0]
    assert len(kept_pos) == 2 and 2 in kept_pos and 0 in kept_pos  # error rate 0, then 0.5 (first)
    # all negative or all positive groups still keep `keep` rows
    for s in (-torch.ones(8), torch.ones(8)):
        assert len(resample_on_correct(s, gid, calls, errors, 4)) == 4
    two = torch.cat([gid, gid + 1])
    assert (
        len(
            resample_on_correct(
                torch.cat([scores, -scores]), two, calls.repeat(2), errors.repeat(2), 4
            )
        )
        == 8
    )


# --------------------------------------------------------------------------- the recipe


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_recipe_steps_with_both_estimators_and_both_arms(estimator):
    for mask in (True, False):
        extra = dict(num_generations=1) if estimator == "gae" else {}
        config = tiny(
            "retool",
            **extra,
            advantage_estimator=estimator,
            mask_interpreter=mask,
            grad_share_every=1,
            resample_on_correct=estimator == "grpo",
        )
        trainer = ReToolTrainer(config)
        try:
            summary = trainer.train()
        finally:
            trainer.close()
        assert summary["rl_steps"] == 2 and len(trainer.history) == 2
        for key in ("accuracy_before", "accuracy_after", "hallucination_rate_after"):
            assert 0.0 <= summary[key] <= 1.0
        assert {"code_ratio", "tool_calls", "grad_share"} <= set(trainer.history[0])


def test_env_is_registered():
    assert isinstance(make_env("multiply"), MultiplyEnv)
