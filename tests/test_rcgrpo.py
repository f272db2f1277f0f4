"""RC-GRPO: the config, the reward tokens (tokenizer, embedding, LoRA), the token draws, the
zero-std measurements and the variance bound, the reward-conditioned environment, the RCTP / SFT
warm start, the conditioned rollout, the four arms of the lab and the ``rcgrpo`` CLI recipe."""

from __future__ import annotations

import copy
import json
import os
import random

import pytest
import torch
from testkit import tiny, tiny_model, tiny_values

from agentic_rl.cli import main
from agentic_rl.config import ConfigError
from agentic_rl.envs import FileSystemEnv
from agentic_rl.models import add_lora, add_special_tokens, build_tokenizer
from agentic_rl.rcgrpo import (
    ARMS,
    RCGRPOConfig,
    RCGRPOTrainer,
    RewardConditionedEnv,
    draw_conditions,
    run_arms,
    simulate_group_variance,
    variance_lower_bound,
    zero_std_fraction,
)
from agentic_rl.utils import setup

HIGH, LOW = "<|high_reward|>", "<|low_reward|>"


def reward_ids(tokenizer) -> list[int]:
    return tokenizer.convert_tokens_to_ids([HIGH, LOW])


def prompt_words(tokenizer, ids, loss_mask) -> list[str]:
    """The words of a row's first observation (everything before the first generated token)."""
    first = loss_mask.tolist().index(1) if 1 in loss_mask.tolist() else len(ids)
    return tokenizer.convert_ids_to_tokens(ids[:first].tolist())


def row_calls(tokenizer, ids, loss_mask) -> list[str]:
    """The calls of a teacher-forced row: its trainable tokens, cut at every ``</action>``."""
    words = [w for w, m in zip(tokenizer.convert_ids_to_tokens(ids.tolist()), loss_mask) if m]
    calls, call = [], []
    for w in words:
        if w == "</action>":
            calls.append(" ".join(call))
            call = []
        else:
            call.append(w)
    assert not call, words  # every action ends with the stop word
    return calls


# --------------------------------------------------------------------------- config


def test_defaults_profiles_and_arms_are_valid():
    c = RCGRPOConfig()
    assert (c.env, c.uses_critic, c.warm_start, c.conditioning) == (
        "filesystem",
        False,
        "rctp",
        "mixed",
    )
    assert (c.high_token, c.low_token, c.token_assignment, c.p_high) == (
        HIGH,
        LOW,
        "bernoulli",
        0.5,
    )
    for profile in RCGRPOConfig.PROFILES:
        RCGRPOConfig.from_profile(profile).check_environment()
    for fields in ARMS.values():
        tiny("rcgrpo", **fields)
    tiny("rcgrpo", token_assignment="split", p_high=0.25, demo_hard_fraction=None, max_turns=4)


@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(warm_start="rl"), "warm_start"),
        (dict(warm_start_budget="epoch"), "warm_start_budget"),
        (dict(warm_start_budget="rows"), "warm_start_budget"),
        (dict(warm_start_budget=""), "warm_start_budget"),
        (dict(conditioning="low"), "conditioning"),
        (dict(token_assignment="round_robin"), "token_assignment"),
        (dict(p_high=0.0), "p_high"),
        (dict(p_high=1.0), "p_high"),
        (dict(p_high=-0.1), "p_high"),
        (dict(hard_fraction=1.5), "hard_fraction"),
        (dict(hard_fraction=-0.1), "hard_fraction"),
        (dict(demo_hard_fraction=1.5), "demo_hard_fraction"),
        (dict(demo_hard_fraction=-0.1), "demo_hard_fraction"),
        (dict(max_turns=3), "max_turns"),
        (dict(max_action_tokens=3), "max_action_tokens"),
        (dict(high_token="<|high reward|>"), "high_token"),
        (dict(high_token="<|high\treward|>"), "high_token"),
        (dict(high_token=""), "high_token"),
        (dict(low_token=""), "low_token"),
        (dict(high_token="mv"), "high_token"),
        (dict(low_token="</action>"), "low_token"),
        (dict(low_token="report.txt"), "low_token"),
        (dict(high_token="<r>", low_token="<r>"), "low_token"),
        (dict(env="frozenlake"), "env"),
    ],
)
def test_bad_values_are_named_errors(overrides, field):
    with pytest.raises(ConfigError) as exc:
        RCGRPOConfig(**overrides)
    assert exc.value.field == field and str(exc.value).startswith(f"{field}: ")


@pytest.mark.parametrize("token", ["<eos>", "<pad>"])
def test_a_reward_token_that_the_tokenizer_already_has_is_refused(token):
    with pytest.raises(ConfigError, match="^high_token: "):
        RCGRPOConfig(high_token=token)


# --------------------------------------------------------------------------- the reward tokens


def test_trainer_adds_both_reward_tokens_as_single_ids():
    t = RCGRPOTrainer(tiny("rcgrpo", sft_steps=0))
    tok = t.tokenizer
    high, low = reward_ids(tok)
    assert high != low and tok.unk_token_id not in (high, low)
    assert {high, low} == {len(tok) - 2, len(tok) - 1}  # appended after the task's words
    ids = tok(f"{HIGH} task rename report.txt to notes.txt <action>")["input_ids"]
    assert ids[:3] == [tok.bos_token_id, high, tok.convert_tokens_to_ids("task")]
    assert len(ids) == 1 + 7  # <bos> and one id per word: the token is never split
    assert tok(f"{LOW} task")["input_ids"][1] == low
    emb = t.model.get_input_embeddings()
    assert emb.num_embeddings == len(tok)
    assert t.model.get_output_embeddings().weight.shape[0] == len(tok)
    assert tok.decode([high, low]) == f"{HIGH} {LOW}"


def test_add_special_tokens_grows_the_embedding_and_keeps_the_old_rows():
    tok = build_tokenizer(FileSystemEnv().vocabulary())
    model = tiny_model(tok, num_hidden_layers=1)
    n = len(tok)
    old = model.get_input_embeddings().weight.detach().clone()
    assert old.shape[0] == n
    ids = add_special_tokens(model, tok, [HIGH, LOW])
    assert ids == [n, n + 1] and len(tok) == n + 2
    weight = model.get_input_embeddings().weight
    assert weight.shape == (n + 2, 32)
    assert torch.equal(weight[:n], old)  # the old rows are untouched
    assert torch.isfinite(weight[n:]).all() and not torch.equal(weight[n], weight[n + 1])
    assert model.get_output_embeddings().weight is weight  # lm_head still tied, so it grew too
    assert model.config.vocab_size == n + 2
    assert model(torch.tensor([[tok.bos_token_id, n + 1]])).logits.shape[-1] == n + 2
    # idempotent: a second call adds nothing and changes nothing
    grown = weight.detach().clone()
    assert add_special_tokens(model, tok, [HIGH, LOW]) == [n, n + 1] and len(tok) == n + 2
    assert torch.equal(model.get_input_embeddings().weight, grown)
    assert add_special_tokens(model, tok, [LOW]) == [n + 1]  # a known token: its id


def test_with_lora_the_reward_token_rows_train_and_the_base_stays_frozen():
    setup(0)
    t = RCGRPOTrainer(tiny("rcgrpo", use_lora=True, sft_steps=3, sft_batch_size=8))
    high, low = reward_ids(t.tokenizer)
    trainable = {n: p for n, p in t.model.named_parameters() if p.requires_grad}
    tokens = {n: p for n, p in trainable.items() if "trainable_tokens" in n}
    assert len(tokens) == 1 and next(iter(tokens.values())).shape == (2, 32)  # the two rows only
    assert all("lora_" in n for n in trainable if n not in tokens)  # the rest: the adapters
    assert t.model.peft_config["default"].trainable_token_indices == {"embed_tokens": [high, low]}
    frozen = {n: p.detach().clone() for n, p in t.model.named_parameters() if not p.requires_grad}
    probe = torch.tensor([[high, low, t.tokenizer.convert_tokens_to_ids("task")]])
    before = t.model.get_input_embeddings()(probe).detach().clone()
    t.sft()  # RCTP rows hold both tokens in their prompts
    after = t.model.get_input_embeddings()(probe).detach()
    moved = (after - before).abs().sum(-1)[0]
    assert moved[0] > 0 and moved[1] > 0 and moved[2] == 0  # the reward rows, not a word's
    assert all(torch.equal(p, frozen[n]) for n, p in t.model.named_parameters() if n in frozen)


def test_add_lora_trains_the_given_token_rows_only():
    def grown():
        tok = build_tokenizer(FileSystemEnv().vocabulary())
        model = tiny_model(tok, num_hidden_layers=1)
        return model, add_special_tokens(model, tok, [HIGH, LOW])

    for ids in (None, []):
        model, _ = grown()
        plain = add_lora(model, trainable_token_ids=ids)
        assert all("lora_" in n for n, p in plain.named_parameters() if p.requires_grad)
    model, ids = grown()
    lora = add_lora(model, trainable_token_ids=ids)
    delta = [p for n, p in lora.named_parameters() if "trainable_tokens" in n and p.requires_grad]
    assert len(delta) == 1 and delta[0].shape == (2, 32)
    # a loss on the two rows reaches the delta, and only through them
    emb = lora.get_input_embeddings()
    emb(torch.tensor([ids])).sum().backward()
    assert delta[0].grad is not None and (delta[0].grad.abs().sum(-1) > 0).all()


def test_a_given_tokenizer_without_the_tokens_is_refused():
    tok = build_tokenizer(FileSystemEnv().vocabulary())
    model = tiny_model(tok, num_hidden_layers=1)
    with pytest.raises(ConfigError, match="^high_token: ") as exc:
        RCGRPOTrainer(tiny("rcgrpo"), model=model, tokenizer=tok)
    assert exc.value.field == "high_token"
    add_special_tokens(model, tok, [HIGH])
    with pytest.raises(ConfigError, match="^low_token: "):
        RCGRPOTrainer(tiny("rcgrpo"), model=model, tokenizer=tok)
    add_special_tokens(model, tok, [LOW])
    t = RCGRPOTrainer(tiny("rcgrpo", sft_steps=0), model=model, tokenizer=tok)  # now it is accepted
    assert t.model is model and reward_ids(t.tokenizer) == [len(tok) - 2, len(tok) - 1]


# --------------------------------------------------------------------------- draw_conditions


def test_bernoulli_draws_are_high_with_probability_p():
    for p in (0.1, 0.5, 0.8):
        high = draw_conditions(1000, 8, p, "bernoulli", random.Random(0))
        assert len(high) == 8000
        assert abs(sum(high) / len(high) - p) < 0.02  # sd sqrt(p(1-p)/8000) <= 0.0056
    # a group may come out all-high or all-low
    groups = [draw_conditions(1, 4, 0.5, "bernoulli", random.Random(s)) for s in range(200)]
    assert any(all(g) for g in groups) and any(not any(g) for g in groups)


@pytest.mark.parametrize(
    "p,G,k",
    [
        (0.5, 8, 4),
        (0.25, 8, 2),
        (0.5, 4, 2),
        (0.3, 4, 1),
        (0.01, 4, 1),
        (0.99, 4, 3),
        (0.01, 2, 1),
        (0.99, 2, 1),
    ],
)
def test_split_draws_exact_counts_with_at_least_one_of_each(p, G, k):
    high = draw_conditions(50, G, p, "split", random.Random(1))
    groups = [high[i : i + G] for i in range(0, len(high), G)]
    assert len(groups) == 50 and all(sum(g) == k for g in groups)
    if G > 2:  # at random positions
        assert len({tuple(g) for g in groups}) > 1


def test_draws_are_reproducible_and_unknown_assignments_refused():
    for assignment in ("bernoulli", "split"):
        a = draw_conditions(20, 4, 0.5, assignment, random.Random(7))
        b = draw_conditions(20, 4, 0.5, assignment, random.Random(7))
        c = draw_conditions(20, 4, 0.5, assignment, random.Random(8))
        assert a == b and a != c
    with pytest.raises(ValueError, match="assignment"):
        draw_conditions(2, 4, 0.5, "round_robin", random.Random(0))


# --------------------------------------------------------------------------- zero std and the bound


def test_zero_std_fraction_by_hand():
    gid = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert zero_std_fraction(scores, gid) == pytest.approx(2 / 3)
    assert zero_std_fraction(torch.ones(4), torch.tensor([0, 0, 1, 1])) == 1.0
    assert zero_std_fraction(torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1])) == 0.0
    # non-binary rewards that are equal
    assert zero_std_fraction(torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7]), gid[:6]) == 1.0
    # the rows mask picks the groups (a group counts once, whichever of its rows is picked)
    rows = torch.tensor([True, False, False, False, False, False, False, False, False])
    assert zero_std_fraction(scores, gid, rows) == 1.0
    rows = torch.tensor([False, False, False, True, True, False, False, False, False])
    assert zero_std_fraction(scores, gid, rows) == 0.0
    rows = torch.tensor([False, False, False, True, False, False, True, True, True])
    assert zero_std_fraction(scores, gid, rows) == 0.5
    assert zero_std_fraction(scores, gid, torch.zeros(9, dtype=torch.bool)) is None
    # group ids need not be contiguous
    assert zero_std_fraction(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([5, 9, 5])) == 1.0


def _bernoulli_variance(G, p, qh, ql):
    """E[population variance] with i.i.d. tokens: the rewards are i.i.d. Bernoulli(m)."""
    m = p * qh + (1 - p) * ql
    return (G - 1) / G * m * (1 - m)


def _split_variance(G, p, qh, ql):
    """E[population variance] with exactly k = round(pG) (clamped to [1, G-1]) high rollouts."""
    k = min(max(round(p * G), 1), G - 1)
    f = k / G
    within = f * qh * (1 - qh) + (1 - f) * ql * (1 - ql)
    return (G - 1) / G * within + f * (1 - f) * (qh - ql) ** 2


# 20k groups of 4: the Monte Carlo standard error of E[sigma^2] is below 1e-3
MC_TOL = 4e-3
GRID = [
    (p, qh, ql)
    for p in (0.25, 0.5, 0.75)
    for qh, ql in ((1.0, 0.0), (0.9, 0.2), (0.6, 0.0), (0.5, 0.5), (0.3, 0.8))
]


@pytest.mark.parametrize("p,qh,ql", GRID)
def test_simulated_group_variance_respects_the_bound(p, qh, ql):
    G = 4
    bound = variance_lower_bound(G, p, qh - ql)
    assert bound == pytest.approx((G - 1) / G * p * (1 - p) * (qh - ql) ** 2)
    bern = simulate_group_variance(G, p, qh, ql)
    split = simulate_group_variance(G, p, qh, ql, assignment="split")
    assert bern >= bound - MC_TOL
    # the simulation agrees with the closed forms (law of total variance)
    assert bern == pytest.approx(_bernoulli_variance(G, p, qh, ql), abs=MC_TOL)
    assert split == pytest.approx(_split_variance(G, p, qh, ql), abs=MC_TOL)
    if (qh, ql) == (1.0, 0.0):  # the reward is the token: the bound is tight
        assert bern == pytest.approx(bound, abs=MC_TOL)
    # With pG an integer the split beats i.i.d. tokens by exactly p(1-p)eps^2 / G: the split's
    # tokens always have population variance p(1-p) in a group, i.i.d. tokens only
    # (G-1)/G * p(1-p) in expectation (a group can even come out all-high or all-low).
    assert split - bern == pytest.approx(p * (1 - p) * (qh - ql) ** 2 / G, abs=MC_TOL)
    assert split >= bern - MC_TOL


def test_split_can_lose_to_bernoulli_when_pG_is_not_an_integer():
    # round(0.3 * 4) = 1: the split runs at share 1/4, not 0.3, and with qh = 0.5, ql = 0 the
    # lost within-token variance of the high rollouts outweighs the gain (closed forms:
    # 0.09375 for the split, 0.095625 for i.i.d. tokens). So "split >= bernoulli" holds only
    # when p * G is a whole number.
    G, p, qh, ql = 4, 0.3, 0.5, 0.0
    assert _split_variance(G, p, qh, ql) < _bernoulli_variance(G, p, qh, ql)
    split = simulate_group_variance(G, p, qh, ql, assignment="split", groups=100_000)
    bern = simulate_group_variance(G, p, qh, ql, groups=100_000)
    assert split < bern
    assert split >= variance_lower_bound(G, p, qh - ql)  # the bound still holds for both


def test_simulation_is_seeded():
    a = simulate_group_variance(4, 0.5, 0.8, 0.3, groups=2000, seed=3)
    assert a == simulate_group_variance(4, 0.5, 0.8, 0.3, groups=2000, seed=3)
    assert a != simulate_group_variance(4, 0.5, 0.8, 0.3, groups=2000, seed=4)
    assert simulate_group_variance(4, 0.5, 1.0, 1.0, groups=100) == 0.0  # no spread at all


# --------------------------------------------------------------------------- the environment


def test_reward_conditioned_env_prefixes_the_first_observation_only():
    bare, plain = FileSystemEnv(), RewardConditionedEnv(FileSystemEnv(), None)
    high = RewardConditionedEnv(FileSystemEnv(), HIGH)
    for seed in (0, 1, 7):
        obs = bare.reset(seed)
        assert plain.reset(seed) == obs and high.reset(seed) == f"{HIGH} {obs}"
        calls = [*bare.expert_calls(seed)[:-1], "ls", "cat nothing.txt", "done"]
        for call in calls:
            want = bare.step(call)
            assert high.step(call) == want and plain.step(call) == want
            if want[2]:
                break
        assert high.success == bare.success  # the wrapped env's attributes show through
    assert high.max_turns == bare.max_turns and high.vocabulary() == bare.vocabulary()
    assert high.task_family(3) == bare.task_family(3)


def test_reward_conditioned_env_can_be_copied():
    env = RewardConditionedEnv(FileSystemEnv(), HIGH)
    env.reset(0)
    clone = copy.deepcopy(env)
    assert clone.token == HIGH and clone.env.task == env.env.task


# --------------------------------------------------------------------------- the warm start


def _recording(trainer) -> list[tuple[int, bool]]:
    """Record ``(seed, success)`` of every demonstration ``sft_batch`` draws, in order."""
    env, seen = trainer.demo_env, []
    original = env.demonstration

    def demonstration(seed, rng, error_rate=0.0):
        pairs = original(seed, rng, error_rate=error_rate)
        seen.append((seed, env.success))
        return pairs

    env.demonstration = demonstration
    return seen


def test_rctp_rows_carry_the_token_of_their_outcome():
    setup(0)
    t = RCGRPOTrainer(tiny("rcgrpo", sft_batch_size=24, demo_hard_fraction=0.5))
    high, low = reward_ids(t.tokenizer)
    seen = _recording(t)
    b = t.sft_batch()
    # RCTP keeps every trajectory; the batch ends at 24 successes (the paper's convention)
    assert len(b) == len(seen) > 24 and sum(s for _, s in seen) == 24
    replay = FileSystemEnv(hard_fraction=t.demo_env.hard_fraction)
    families = set()
    for (seed, success), ids, mask in zip(seen, b.input_ids, b.loss_mask):
        assert ids[0] == t.tokenizer.bos_token_id and ids[1] == (high if success else low)
        assert mask[1] == 0  # the token is read, never trained on
        words = prompt_words(t.tokenizer, ids, mask)
        assert words[2:] == replay.reset(seed).split()  # then the task's first observation
        # the row's calls, replayed on the task, give the outcome its token says
        _, reward = replay.play(seed, row_calls(t.tokenizer, ids, mask))
        assert reward == float(success)
        assert int(torch.isin(ids, torch.tensor([high, low])).sum()) == 1
        families.add(replay.task_family(seed))
    assert {s for _, s in seen} == {True, False} and families == {"easy", "hard"}


def test_sft_rows_have_no_token_and_only_successful_trajectories():
    setup(0)
    t = RCGRPOTrainer(tiny("rcgrpo", warm_start="sft", conditioning="none", sft_batch_size=12))
    seen = _recording(t)
    b = t.sft_batch()
    kept = [seed for seed, success in seen if success]
    assert len(b) == len(kept) == 12 and len(seen) > 12  # the failures were dropped
    assert not torch.isin(b.input_ids, torch.tensor(reward_ids(t.tokenizer))).any()
    replay = FileSystemEnv(hard_fraction=t.demo_env.hard_fraction)
    for seed, ids, mask in zip(kept, b.input_ids, b.loss_mask):
        assert prompt_words(t.tokenizer, ids, mask)[1:] == replay.reset(seed).split()
        assert replay.play(seed, row_calls(t.tokenizer, ids, mask))[1] == 1.0


@pytest.mark.parametrize("step", [0, 7])
def test_success_matched_rctp_sees_every_success_sft_sees_plus_the_failures(step):
    setup(0)
    batches = {}
    for warm in ("sft", "rctp"):
        conditioning = "none" if warm == "sft" else "high"
        t = RCGRPOTrainer(
            tiny("rcgrpo", warm_start=warm, conditioning=conditioning, sft_batch_size=16)
        )
        t.step = step
        seen = _recording(t)
        batches[warm] = (t.sft_batch(), seen)
    (sft, sft_seen), (rctp, rctp_seen) = batches["sft"], batches["rctp"]
    assert sft_seen == rctp_seen  # the same demonstrations, drawn from the step's own stream
    assert len(sft) == 16 and len(rctp) == len(rctp_seen) > 16
    ok = [i for i, (_, success) in enumerate(rctp_seen) if success]
    rctp_rows = rctp.input_ids[ok][:, 2:]  # without BOS and the reward token
    width = min(rctp_rows.shape[1], sft.input_ids.shape[1] - 1)
    assert torch.equal(rctp_rows[:, :width], sft.input_ids[:, 1 : 1 + width])


def test_step_matched_rctp_sees_as_many_trajectories_as_sft_and_fewer_successes():
    setup(0)
    t = RCGRPOTrainer(tiny("rcgrpo", warm_start_budget="steps", sft_batch_size=16))
    seen = _recording(t)
    assert len(t.sft_batch()) == len(seen) == 16 and 0 < sum(s for _, s in seen) < 16


def test_a_warm_start_that_never_succeeds_is_refused_naming_the_field():
    setup(0)
    t = RCGRPOTrainer(tiny("rcgrpo", sft_batch_size=2))
    original = t.demo_env.demonstration

    def failing(seed, rng, error_rate=0.0):
        pairs = original(seed, rng, error_rate=error_rate)
        t.demo_env.success = False
        return pairs

    t.demo_env.demonstration = failing
    with pytest.raises(ConfigError, match="demo_error_rate: 0 successes in 200"):
        t.sft_batch()


# ------------------------------------------------------- the epoch-matched warm start (review M1)


def _updates(monkeypatch) -> list[list[list[int]]]:
    """Record every warm-start gradient step: its rows' tokens, padding cut off."""
    import agentic_rl.train

    steps, original = [], agentic_rl.train.sft_step

    def recording(model, optimizer, batch, **kw):
        steps.append([ids[m.bool()].tolist() for ids, m in zip(batch.input_ids,
                                                                batch.attention_mask)])
        return original(model, optimizer, batch, **kw)

    monkeypatch.setattr(agentic_rl.train, "sft_step", recording)
    return steps


def _warm(warm="rctp", budget="successes", **kw) -> RCGRPOTrainer:
    setup(0)
    conditioning = "none" if warm == "sft" else "high"
    fields = {**dict(sft_steps=4, sft_batch_size=8, max_steps=1), **kw}
    config = tiny("rcgrpo", warm_start=warm, warm_start_budget=budget, conditioning=conditioning,
                  **fields)
    return RCGRPOTrainer(config)


def test_epochs_is_a_budget_of_both_warm_starts_and_its_help_says_what_it_matches():
    import dataclasses

    for warm in ("sft", "rctp"):
        RCGRPOConfig(warm_start=warm, warm_start_budget="epochs").check_environment()
    field = next(f for f in dataclasses.fields(RCGRPOConfig) if f.name == "warm_start_budget")
    assert "'epochs'" in field.metadata["help"] and "'epochs' is 'successes'" in field.metadata[
        "help"]


def test_epoch_matched_rctp_trains_success_matched_demonstrations_in_sft_sized_batches(
    monkeypatch,
):
    """The same rows as success-matched RCTP, in the same order, cut into batches of
    sft_batch_size rows (the last one smaller): as many successes as SFT, more gradient steps."""
    runs = {}
    for warm, budget in (("sft", "successes"), ("rctp", "successes"), ("rctp", "epochs")):
        steps = _updates(monkeypatch)
        t = _warm(warm, budget)
        t.sft()
        assert t.phase == "rl" and len(t.sft_history) == 4 and t.warm_carry == ([], [])
        runs[budget if warm == "rctp" else "sft"] = t, list(steps)
    (sft, sft_steps), (rctp, rctp_steps), (epoch, epoch_steps) = runs.values()
    assert sft.warm_seen == {"updates": 4, "rows": 32, "successes": 32}
    assert epoch.warm_seen["successes"] == rctp.warm_seen["successes"] == 32
    assert epoch.warm_seen["rows"] == rctp.warm_seen["rows"] > 32  # the failures too
    assert [len(s) for s in sft_steps] == [8] * 4 and rctp.warm_seen["updates"] == 4
    sizes = [len(s) for s in epoch_steps]
    assert set(sizes[:-1]) == {8} and 0 < sizes[-1] <= 8 and len(sizes) > 4
    assert epoch.warm_seen["updates"] == len(sizes) == -(-epoch.warm_seen["rows"] // 8)
    flat = [row for step in epoch_steps for row in step]
    assert flat == [row for step in rctp_steps for row in step]  # the same rows, in order
    # the RL phase starts from it as from any warm start: fresh optimizer, step 0
    assert epoch.step == 0 and not epoch.optimizer.state


def test_without_failed_demonstrations_epochs_is_successes():
    t, u = _warm("rctp", "epochs", demo_error_rate=0.0), _warm("rctp", "successes",
                                                                 demo_error_rate=0.0)
    t.sft(), u.sft()
    assert t.warm_seen == u.warm_seen == {"updates": 4, "rows": 32, "successes": 32}
    assert all(torch.equal(p, q) for p, q in zip(t.model.parameters(), u.model.parameters()))


def test_for_sft_epochs_is_successes():
    t, u = _warm("sft", "epochs"), _warm("sft", "successes")
    t.sft(), u.sft()
    assert not t.epoch_matched and t.sft_history == u.sft_history
    assert all(torch.equal(p, q) for p, q in zip(t.model.parameters(), u.model.parameters()))


def test_an_epoch_matched_warm_start_resumes_with_its_carried_rows(tmp_path):
    whole = _warm("rctp", "epochs")
    whole.sft()
    part = _warm("rctp", "epochs", output_dir=str(tmp_path), save_steps=1)
    part.sft(2)
    assert part.warm_carry[0]  # rows wait for a full batch across the checkpoint
    resumed = _warm("rctp", "epochs", output_dir=str(tmp_path), save_steps=1)
    resumed.load_checkpoint(str(tmp_path / "checkpoint.pt"))
    assert resumed.warm_carry == part.warm_carry and resumed.warm_seen == part.warm_seen
    resumed.sft()
    assert resumed.sft_history == whole.sft_history and resumed.warm_seen == whole.warm_seen
    assert all(torch.equal(p, q) for p, q in zip(resumed.model.parameters(),
                                                 whole.model.parameters()))


def test_the_warm_start_curve_changes_no_weight_and_no_stream():
    """Evaluating every 2 steps (a partial last chunk, rows carried across chunks) leaves the
    weights, the RNG streams and the task stream as one uninterrupted warm start leaves them;
    the last point is the evaluation the arm records before RL."""
    from agentic_rl.experiments.rcgrpo import warm_start_with_curve

    states = []
    for every in (None, 2):
        t = _warm("rctp", "epochs", sft_steps=5, eval_size=8, eval_samples=2)
        curve = warm_start_with_curve(t, every)
        states.append((t, curve, torch.get_rng_state(), random.getstate(),
                       t.problem_rng.getstate()))
    (plain, none, *streams), (curved, curve, *streams2) = states
    assert none == [] and [p["step"] for p in curve] == [2, 4, 5]
    assert curve[-1]["updates"] == curved.warm_seen["updates"] == plain.warm_seen["updates"]
    assert torch.equal(streams[0], streams2[0]) and streams[1:] == streams2[1:]
    assert all(torch.equal(p, q) for p, q in zip(plain.model.parameters(),
                                                 curved.model.parameters()))
    ev = curved.evaluate()
    assert curve[-1]["sampled_success"] == ev["sampled_success"]
    assert curve[-1]["low_success"] == ev["low_success"]
    assert curve[-1]["sampled_success_hard"] == ev["sampled_success_hard"]


def test_the_curve_changes_nothing_the_record_measures_and_is_recorded():
    from agentic_rl.experiments import rcgrpo as lab

    arms = ("SFT -> GRPO", "RCTPepoch -> GRPO")
    values = {k: v for k, v in tiny_values("rcgrpo", sft_steps=3, max_steps=1).items()
              if k not in ("device", "disable_tqdm")}
    cells = []
    for every in (None, 2):
        setup(0)
        trainers = lab.train(0, arms, curve_every=every, **values)
        cells.append({a: lab.measure(t, a, 0) for a, t in trainers.items()})
    off, on = cells
    for arm in arms:
        warm = {k for k in on[arm]["curves"] if k.startswith("warm_")}
        assert warm == {f"warm_{k}" for k in lab.WARM_CURVE}
        assert on[arm]["curves"]["warm_step"] == [2.0, 3.0] and not off[arm]["curves"].keys() & warm
        assert {k: v for k, v in on[arm]["curves"].items() if k not in warm} == off[arm]["curves"]
        assert str(on[arm]["metrics"]) == str(off[arm]["metrics"])  # (NaN == NaN as text)
        curve = on[arm]["curves"]
        assert curve["warm_sampled_success"][-1] == on[arm]["metrics"]["before_sampled_success"]
    epoch, sft = on["RCTPepoch -> GRPO"]["metrics"], on["SFT -> GRPO"]["metrics"]
    assert epoch["warm_successes"] == sft["warm_successes"] == sft["warm_rows"] == 3 * 4
    assert epoch["warm_updates"] > sft["warm_updates"] == 3


def test_the_epoch_matched_arms_differ_from_their_success_matched_siblings_only_in_budget():
    for rl in ("GRPO", "RC-GRPO"):
        epoch, sibling = dict(ARMS[f"RCTPepoch -> {rl}"]), ARMS[f"RCTP -> {rl}"]
        assert epoch.pop("warm_start_budget") == "epochs" and "warm_start_budget" not in sibling
        assert epoch == sibling
        step = dict(ARMS[f"RCTPstep -> {rl}"])
        assert step.pop("warm_start_budget") == "steps" and step == sibling


def test_arms_share_their_task_stream_whatever_the_warm_start_and_the_token_draw():
    seeds = {}
    for arm, fields in ARMS.items():
        if fields.get("beta") or "RCTPstep" in arm:
            continue
        setup(0)
        t = RCGRPOTrainer(tiny("rcgrpo", sft_steps=3, max_steps=2, **fields))
        t.sft()
        drawn = []
        t.play = lambda s, **kw: drawn.append(list(s)) or RCGRPOTrainer.play(t, s, **kw)
        t.rollout()
        t.step += 1
        t.rollout()
        seeds[arm] = drawn
    assert len(seeds) == 6 and all(v == seeds["SFT -> GRPO"] for v in seeds.values())


def test_warm_start_draws_hard_tasks_at_demo_hard_fraction():
    setup(0)
    for share, expected in ((0.0, {"easy"}), (1.0, {"hard"})):
        t = RCGRPOTrainer(tiny("rcgrpo", sft_batch_size=8, demo_hard_fraction=share))
        seen = _recording(t)
        t.sft_batch()
        assert {t.demo_env.task_family(seed) for seed, _ in seen} == expected


@pytest.mark.parametrize("hard_fraction", [0.0, 1.0])
def test_warm_start_with_a_single_family_ends(hard_fraction):
    # the warm start draws its tasks from its own env (demo_hard_fraction), whatever RL's mix is
    setup(0)
    t = RCGRPOTrainer(tiny("rcgrpo", hard_fraction=hard_fraction, sft_batch_size=64))
    assert len(t.sft_batch()) >= 64
    assert t.demo_env.hard_fraction == t.config.demo_hard_fraction
    batch = t.rollout()
    assert batch.extras["hard"].all() if hard_fraction == 1.0 else not batch.extras["hard"].any()


# --------------------------------------------------------------------------- the rollout


def _check_conditioning(t, batch, expect_high):
    """The prompt of every row holds the token ``extras['high']`` says (or none), read only."""
    for ids, mask, high in zip(batch.input_ids, batch.loss_mask, batch.extras["high"].tolist()):
        words = prompt_words(t.tokenizer, ids, mask)
        assert words[0] == "<bos>" and mask[1] == 0
        if expect_high is None:
            assert words[1] == "task" and HIGH not in words and LOW not in words
            assert not high
        else:
            assert words[1] == (HIGH if high else LOW) and words[2] == "task"
            assert words.count(HIGH) + words.count(LOW) == 1
            if expect_high != "mixed":
                assert high == expect_high
    # (A reward token elsewhere in a row is the policy's own sample, loss_mask 1, or an observation
    # echoing one, "error unknown function <|high_reward|>": nothing keeps the tokens out of the
    # policy's action distribution, and an untrained policy does write them.)


@pytest.mark.parametrize("assignment", ["bernoulli", "split"])
def test_mixed_rollout_tokens_match_extras(assignment):
    setup(0)
    c = tiny("rcgrpo", sft_steps=0, prompts_per_step=4, token_assignment=assignment, p_high=0.25)
    t = RCGRPOTrainer(c)
    b = t.rollout()
    assert len(b) == 16 and b.group_id.tolist() == [g for g in range(4) for _ in range(4)]
    _check_conditioning(t, b, "mixed")
    high = b.extras["high"]
    if assignment == "split":
        assert all(int(high[b.group_id == g].sum()) == 1 for g in range(4))  # round(0.25 * 4)
    # hard rows are the tasks whose goal starts with "in <folder>"
    for ids, mask, hard in zip(b.input_ids, b.loss_mask, b.extras["hard"].tolist()):
        words = prompt_words(t.tokenizer, ids, mask)
        assert (words[words.index("task") + 1] == "in") == hard
    # the chapter's measurements of this batch
    m = t.rollout_metrics(b, None)
    ok = b.extras["success"].float()
    assert m["high_success"] == (ok[high].mean().item() if high.any() else None)
    assert m["low_success"] == (ok[~high].mean().item() if (~high).any() else None)
    hard = b.extras["hard"]
    assert m["zero_std_easy"] == zero_std_fraction(b.scores, b.group_id, ~hard)
    assert m["zero_std_hard"] == zero_std_fraction(b.scores, b.group_id, hard)
    assert m["mean_abs_advantage"] >= 0.0


def test_high_and_none_rollouts():
    setup(0)
    t = RCGRPOTrainer(tiny("rcgrpo", sft_steps=0, conditioning="high"))
    b = t.rollout()
    assert b.extras["high"].all()
    _check_conditioning(t, b, True)
    t = RCGRPOTrainer(tiny("rcgrpo", sft_steps=0, warm_start="sft", conditioning="none"))
    assert not t.uses_tokens
    b = t.rollout()
    assert not b.extras["high"].any()
    _check_conditioning(t, b, None)
    # evaluation under the token only when the run uses tokens
    b = t.play([1, 2], group_size=2)
    _check_conditioning(t, b, None)
    t = RCGRPOTrainer(tiny("rcgrpo", sft_steps=0, warm_start="sft", conditioning="mixed"))
    assert t.uses_tokens
    _check_conditioning(t, t.play([1, 2], group_size=2), True)
    _check_conditioning(t, t.play([1, 2], envs=t.conditioned_envs([LOW, LOW])), False)


def test_rollout_metrics_and_frac_reward_zero_std_in_a_training_row():
    setup(0)
    t = RCGRPOTrainer(tiny("rcgrpo", sft_steps=0))
    row = t.rl_step()
    for key in (
        "zero_std_easy",
        "zero_std_hard",
        "mean_abs_advantage",
        "high_success",
        "low_success",
        "frac_reward_zero_std",
    ):
        assert key in row
    for key in ("zero_std_easy", "zero_std_hard", "high_success", "low_success"):
        assert row[key] is None or 0.0 <= row[key] <= 1.0


# --------------------------------------------------------------------------- the lab's four arms

HISTORY_KEYS = {
    "zero_std_easy",
    "zero_std_hard",
    "mean_abs_advantage",
    "high_success",
    "low_success",
    "frac_reward_zero_std",
}


def test_run_arms_trains_the_arms_from_shared_warm_starts():
    setup(0)
    c = tiny("rcgrpo", sft_steps=3)
    arms = run_arms(c)
    assert list(arms) == list(ARMS)
    for name, t in arms.items():
        assert (t.config.warm_start, t.config.conditioning) == (
            ARMS[name]["warm_start"],
            ARMS[name]["conditioning"],
        )
        assert len(t.history) == c.max_steps and t.step == c.max_steps
        assert all(HISTORY_KEYS <= set(row) for row in t.history)
        assert len(t.sft_history) == c.sft_steps
        for when in ("before", "after"):
            ev = t.evals[when]
            if name == "SFT -> GRPO":
                assert ev["separation"] is None and "low_success" not in ev
            else:
                assert ev["separation"] == pytest.approx(ev["sampled_success"] - ev["low_success"])
    # one warm start per kind, shared: the same SFT losses and the same starting policy
    rctp, rc = arms["RCTP -> GRPO"], arms["RCTP -> RC-GRPO"]
    assert rctp.sft_history == rc.sft_history
    assert arms["SFT -> GRPO"].sft_history == arms["SFT -> RC-GRPO"].sft_history
    assert rctp.sft_history != arms["SFT -> GRPO"].sft_history
    assert rctp.evals["before"] == rc.evals["before"]
    # each arm holds what its warm start trained on; the epoch-matched pair shares one
    epoch, epoch_rc = arms["RCTPepoch -> GRPO"], arms["RCTPepoch -> RC-GRPO"]
    sft = arms["SFT -> GRPO"]
    assert epoch.warm_seen == epoch_rc.warm_seen and epoch.sft_history == epoch_rc.sft_history
    assert epoch.warm_seen["successes"] == sft.warm_seen["successes"] == c.sft_steps * 4
    assert epoch.warm_seen["updates"] > sft.warm_seen["updates"] == c.sft_steps
    assert rctp.warm_seen["rows"] == epoch.warm_seen["rows"]
    with pytest.raises(ConfigError, match="^output_dir: ") as exc:
        run_arms(tiny("rcgrpo", output_dir="somewhere"))
    assert exc.value.field == "output_dir"
    assert not os.path.exists("somewhere")


def test_run_arms_with_a_subset_of_arms():
    setup(0)
    arms = run_arms(
        tiny("rcgrpo", max_steps=1), {"mine": dict(warm_start="sft", conditioning="high")}
    )
    assert list(arms) == ["mine"] and arms["mine"].evals["after"]["separation"] is not None


# --------------------------------------------------------------------------- the CLI


def test_cli_runs_the_rcgrpo_recipe_and_a_finished_run_changes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["rcgrpo", "--output-dir", str(out), "--token-assignment", "split"]
    for k, v in tiny_values("rcgrpo").items():
        argv += [f"--{k.replace('_', '-')}", str(v).lower() if isinstance(v, bool) else str(v)]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and summary["task"] == "filesystem"
    assert summary["config"]["token_assignment"] == "split"
    for key in ("success_before", "success_after", "separation_after", "low_success_after"):
        assert key in summary
    assert json.loads(stdout[stdout.index("{") :])["rl_steps"] == 2
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert HISTORY_KEYS <= set(header)
    assert (out / "sft_metrics.csv").exists() and (out / "checkpoint.pt").exists()
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "already complete" in err and "nothing was changed" in err
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
