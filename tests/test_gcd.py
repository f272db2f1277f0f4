"""GCD: Lemma 3.1 by simulation, the softmax setting of Theorem 3.2, the coupling measurements, the
probe pairs, the judgement loss and the trainer."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from agentic_rl import coupling
from agentic_rl.config import ConfigError
from agentic_rl.gcd import GCDConfig
from agentic_rl.envs import HouseholdEnv
from agentic_rl.envs.household import counterfactual_goal
from agentic_rl.gcd import (
    ARMS,
    COUPLING_KEYS,
    GCDTrainer,
    auroc,
    coupling_probes,
    judge_metrics,
    judgement_labels,
    judgement_loss,
    lemma_value,
    lemma_value_std,
    measure_coupling,
    run_arms,
    simulate_risky_action,
    softmax_policy_gradient,
)
from agentic_rl.models import build_tokenizer
from agentic_rl.rollout import Batch, build_segments_batch, sequence_logprobs

from testkit import tiny, tiny_model


@pytest.fixture(scope="module")
def policy():
    env = HouseholdEnv()
    tok = build_tokenizer(env.vocabulary())
    model = tiny_model(tok)
    return model, tok


# ---------------------------------------------------------------------- Lemma 3.1
def test_lemma_value_is_negative_inside_and_zero_at_the_ends():
    assert lemma_value(0.5, 0.2) == pytest.approx(-0.05)
    assert lemma_value(0.5, 0.2, group_size=8) == pytest.approx(-0.05 * 7 / 8)
    for q in (0.0, 1.0):
        assert lemma_value(q, 0.3) == 0.0
    assert all(lemma_value(q / 10, 0.3) < 0 for q in range(1, 10))


@pytest.mark.parametrize("q", [0.1, 0.3, 0.5, 0.8])
def test_the_lemma_holds_by_monte_carlo(q):
    p, r, g, n = 0.8, 0.4, 8, 100_000
    # the Lemma's own baseline, E[R]: q r (q - 1)
    expected = simulate_risky_action(p, r, q, group_size=g, groups=n, baseline="expected")
    # GRPO's mean-centred group advantage: (G - 1) / G of it
    grouped = simulate_risky_action(p, r, q, group_size=g, groups=n, baseline="group")
    se = math.sqrt(q * 0.25) / math.sqrt(n * g)  # |A 1{a}| <= 1: a generous standard error
    assert expected == pytest.approx(lemma_value(q, r), abs=5 * se)
    assert grouped == pytest.approx(lemma_value(q, r, group_size=g), abs=5 * se)
    # with std normalisation: the closed form conditioned on the group's successes
    scaled = simulate_risky_action(p, r, q, group_size=g, groups=n, scale="group")
    assert scaled < -10 * se
    assert scaled == pytest.approx(lemma_value_std(q, r, p, g), abs=10 * se)


def test_the_std_lemma_closed_form_on_known_values():
    # the review's numbers (p = 0.8, r = 0.4, G = 8), and with sigma_k = 1 it is (G-1)/G q r (q-1)
    assert lemma_value_std(0.5, 0.4, 0.8, 8) == pytest.approx(-0.1760, abs=1e-4)
    assert lemma_value_std(0.1, 0.4, 0.8, 8) == pytest.approx(-0.0687, abs=1e-4)
    assert lemma_value_std(0.3, 0.0, 0.8, 8) == 0.0  # no risk, no signal
    assert lemma_value_std(0.5, 0.5, 1.0, 4) < 0
    assert lemma_value_std(0.0, 0.4, 0.8, 8) == 0.0 and lemma_value_std(1.0, 0.4, 0.8, 8) == 0.0


def test_no_risk_no_signal_and_bad_arguments():
    assert simulate_risky_action(0.7, 0.0, 0.5, groups=50_000) == pytest.approx(0.0, abs=3e-3)
    with pytest.raises(ValueError, match="0 <= r <= p"):
        simulate_risky_action(0.2, 0.5, 0.5)
    with pytest.raises(ValueError, match="baseline"):
        simulate_risky_action(0.5, 0.1, 0.5, baseline="leave-one-out")


# ---------------------------------------------------------------------- Theorem 3.2's setting
def test_softmax_policy_gradient_squeezes_mass_onto_a_milder_flaw_then_finds_the_best():
    success = [1.0, 0.8, 0.2]  # good, mildly flawed, badly flawed
    probs = softmax_policy_gradient([0.0, 1.0, 2.0], success, lr=2.0, steps=200)
    assert probs.shape == (201, 3)
    assert torch.allclose(probs.sum(1), torch.ones(201, dtype=torch.float64))
    mild = probs[:, 1]
    assert mild.max() > mild[0] + 0.3  # the milder flaw gains mass first ...
    assert probs[-1, 0] > 0.99  # ... and the good action wins in the end
    flawed = probs[:, 1] + probs[:, 2]
    assert (flawed[1:] <= flawed[:-1] + 1e-12).all()  # here the flawed total only falls
    # but not from every start: with the mild flaw already the most likely, the good action
    # first loses mass (gradient flow, small steps)
    other = softmax_policy_gradient([0.0, 2.0, 1.0], success, lr=0.01, steps=2000)
    assert other[:, 0].min() < other[0, 0] - 0.004
    with pytest.raises(ValueError, match="same length"):
        softmax_policy_gradient([0.0, 1.0], success)


# ---------------------------------------------------------------------- coupling measurements
def _pairs(tok, n=6):
    env = HouseholdEnv()
    return coupling_probes(tok, list(range(n)), env=env)


def test_probe_pairs_differ_in_one_goal_word_and_train_only_the_decisive_token(policy):
    _, tok = policy
    a, b = _pairs(tok, 8)
    assert a.input_ids.shape == b.input_ids.shape
    for i in range(8):
        diff = (a.input_ids[i] != b.input_ids[i]).nonzero().flatten().tolist()
        assert len(diff) == 1  # the goal's target, in the first observation
        assert torch.equal(a.loss_mask[i], b.loss_mask[i]) and a.loss_mask[i].sum() == 1
        col = int(a.loss_mask[i].nonzero())
        target = tok.convert_ids_to_tokens(int(a.input_ids[i, diff[0]]))
        assert tok.convert_ids_to_tokens(int(a.input_ids[i, col])) == target
        width = a.input_ids.shape[1]
        assert col + 1 == width or a.input_ids[i, col + 1] == tok.pad_token_id


def test_the_probe_action_is_good_in_a_and_flawed_in_b():
    env = HouseholdEnv()
    for seed in range(10):
        pairs = env.demonstration(seed, __import__("random").Random(seed), 0.0)
        task = dict(env.task)
        k = len(pairs) - 1 if seed % 2 == 0 else len(pairs) - 2
        from agentic_rl.envs.household import RECEPTACLES

        other = [r for r in RECEPTACLES if r != task["target"]][seed % 5]
        assert counterfactual_goal(pairs[0][0], task, other) != pairs[0][0]
        for target, kind in ((task["target"], "good"), (other, "flawed")):
            env.reset(seed)
            env.task = dict(task, target=target)
            for _, action in pairs[:k]:
                env.step(action)
            assert env.step(pairs[k][1])[3]["kind"] == kind


def test_per_sample_grads_equal_a_loop_of_backward_passes(policy):
    model, tok = policy
    a, _ = _pairs(tok, 4)
    fast = coupling.per_sample_grads(model, a)
    for i in range(4):
        model.zero_grad()
        row = a.select(torch.tensor([i]))
        coupling.action_logprobs(model, row).sum().backward()
        slow = torch.cat([p.grad.flatten() for p in model.parameters()])
        assert torch.allclose(fast[i], slow, atol=1e-5), (fast[i] - slow).abs().max()
    model.zero_grad()
    last = coupling.last_block_names(model)
    assert last and all("layers.0." not in n and "embed" not in n for n in last)
    assert coupling.per_sample_grads(model, a, last).shape[1] < fast.shape[1]
    with pytest.raises(ValueError, match="not trainable"):
        coupling.per_sample_grads(model, a, ["nope"])


def test_cosines_of_a_pair_with_itself_are_one(policy):
    model, tok = policy
    a, b = _pairs(tok, 4)
    assert torch.allclose(coupling.gradient_cosine(model, a, a), torch.ones(4), atol=1e-5)
    for at in ("action", "state"):
        same = coupling.hidden_cosine(model, a, a, at=at)
        assert torch.allclose(same, torch.ones(4), atol=1e-5)
        assert (coupling.hidden_cosine(model, a, b, at=at) <= 1 + 1e-6).all()
    with pytest.raises(ValueError, match="at must be"):
        coupling.hidden_cosine(model, a, b, at="goal")


def test_spillover_is_first_order_the_gradient_dot_product(policy):
    model, tok = policy
    a, b = _pairs(tok, 4)
    before = copy.deepcopy(model.state_dict())
    lr = 1e-4
    out = coupling.spillover(model, a, b, lr=lr)
    for k, v in model.state_dict().items():  # the model itself is not moved
        assert torch.equal(v, before[k])
    ga = coupling.per_sample_grads(model, a).double()
    gb = coupling.per_sample_grads(model, b).double()
    step = lr * ga.mean(0)
    assert (out["delta_a"] > 0).all()
    assert torch.allclose(out["delta_a"].double(), ga @ step, rtol=0.05, atol=1e-9)
    assert torch.allclose(out["delta_b"].double(), gb @ step, rtol=0.05, atol=1e-8)
    assert out["ratio"] == pytest.approx((out["delta_b"].sum() / out["delta_a"].sum()).item())


def test_measure_coupling_returns_its_keys_in_range(policy):
    model, tok = policy
    a, b = _pairs(tok, 8)
    assert a.extras["probe"] == ["put", "goto"] * 4
    m = measure_coupling(model, (a, b))
    assert set(m) == set(COUPLING_KEYS)
    cosines = [k for k in COUPLING_KEYS if "cos" in k and m[k] is not None]
    assert "grad_cos" in cosines and all(-1 - 1e-6 <= m[k] <= 1 + 1e-6 for k in cosines)
    assert 0 <= m["spill"] <= 1 and 0 <= m["pair_spill"] <= 1
    # the same gradients as gradient_cosine, and the per-type means average to the overall one
    paired = coupling.gradient_cosine(model, a, b)
    assert m["grad_cos"] == pytest.approx(paired.mean().item(), abs=1e-5)
    assert m["grad_cos_put"] == pytest.approx(paired[0::2].mean().item(), abs=1e-5)
    assert m["pair_spill"] == pytest.approx((paired > 0).float().mean().item())
    tokens, kinds = coupling.decisive_tokens(a).tolist(), a.extras["probe"]
    pairs = [(i, j) for i in range(8) for j in range(8) if i != j and kinds[i] == kinds[j]]
    same = sum(tokens[i] == tokens[j] for i, j in pairs)
    assert m["control_pairs"] == same


def test_pair_cosines_against_synthetic_gradients():
    g = torch.eye(4)  # four orthogonal gradients
    tokens = torch.tensor([7, 7, 9, 9])
    out = coupling.pair_cosines(g, g.clone(), tokens)
    assert out["grad_cos"] == pytest.approx(1.0) and out["pair_spill"] == 1.0
    # control: (A_0, B_1), (A_1, B_0), (A_2, B_3), (A_3, B_2): orthogonal, so 0 and no spill
    assert out["control_pairs"] == 4
    assert out["grad_cos_control"] == pytest.approx(0.0) and out["pair_spill_control"] == 0.0
    assert out["grad_cos_other"] == pytest.approx(0.0)
    # B rows that copy their same-token partner in A: the control is 1, the pairs 0
    gb = g[[1, 0, 3, 2]] * 3.0
    out = coupling.pair_cosines(g, gb, tokens, ["put", "put", "goto", "goto"])
    assert out["grad_cos"] == pytest.approx(0.0) and out["pair_spill"] == 0.0
    assert out["grad_cos_control"] == pytest.approx(1.0) and out["pair_spill_control"] == 1.0
    assert out["grad_cos_put"] == pytest.approx(0.0)
    assert out["grad_cos_control_goto"] == pytest.approx(1.0)
    # the control counts only same-token, same-kind pairs i != j; a -1 among other-token pairs
    gb = torch.stack([g[0], g[1], -g[0], g[3]])
    out = coupling.pair_cosines(g, gb, tokens)
    assert out["grad_cos_other"] == pytest.approx(-1 / 8)  # A_0 . B_2 = -1, 8 other pairs
    assert out["grad_cos_control"] == pytest.approx(0.0)
    # same token but another kind is no control pair; a zero gradient gives cosine 0
    out = coupling.pair_cosines(g, torch.zeros(4, 4), tokens, ["put", "goto", "put", "goto"])
    assert out["grad_cos_control"] is None and out["pair_spill_control"] is None
    assert out["control_pairs"] == 0 and out["grad_cos_control_put"] is None
    assert out["grad_cos"] == 0.0 and out["pair_spill"] == 0.0


# ---------------------------------------------------------------------- the judgement
def _fake_batch():
    ids = torch.zeros(3, 10, dtype=torch.long)
    adv = torch.zeros(3, 10)
    adv[0, 2:4], adv[1, 2:4] = 0.5, -0.5  # row 2: a group with no spread
    return Batch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=torch.ones_like(ids),
        token_rewards=torch.zeros(3, 10),
        group_id=torch.zeros(3, dtype=torch.long),
        extras=dict(
            success=torch.tensor([True, False, True]),
            turn_end=[[3, 7], [4], [2, 5, 8]],
            kinds=[["good", "flawed"], ["invalid"], ["good", "good", "malformed"]],
        ),
    ), adv


def test_judgement_labels_by_each_rule():
    batch, adv = _fake_batch()
    rows, cols, good = judgement_labels(batch, "outcome")
    assert list(zip(rows, cols, good)) == [
        (0, 3, True),
        (0, 7, True),
        (1, 4, False),
        (2, 2, True),
        (2, 5, True),
        (2, 8, True),
    ]
    rows, cols, good = judgement_labels(batch, "advantage", adv)
    assert list(zip(rows, cols, good)) == [(0, 3, True), (0, 7, True), (1, 4, False)]
    _, _, good = judgement_labels(batch, "oracle")
    assert good == [True, False, False, True, True, False]
    with pytest.raises(ValueError, match="rule must be"):
        judgement_labels(batch, "process")
    with pytest.raises(ValueError, match="needs the advantages"):
        judgement_labels(batch, "advantage")


def test_the_balanced_judgement_loss_by_hand():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 1] = 2.0  # good example, good logit 2, bad 0
    logits[0, 2, 2] = 1.0  # bad example, bad logit 1, good 0
    rows, cols, good = [0, 0, 0], [0, 1, 2], [True, True, False]  # column 1: logits 0, 0
    loss, m = judgement_loss(logits, rows, cols, good, (1, 2))
    good_ce = (math.log(1 + math.exp(-2)) + math.log(2)) / 2
    bad_ce = math.log(1 + math.exp(-1))
    assert loss.item() == pytest.approx((good_ce + bad_ce) / 2)  # each class counts 1/2
    plain, _ = judgement_loss(logits, rows, cols, good, (1, 2), balance=False)
    assert plain.item() == pytest.approx((2 * good_ce + bad_ce) / 3)
    # says good at column 0 only (column 1 is a tie: not "good"); recalls 1/2 and 1
    assert m["judge_accuracy"] == pytest.approx(2 / 3)
    assert m["judge_balanced_accuracy"] == pytest.approx(0.75)
    assert m["judge_base_rate"] == pytest.approx(2 / 3) and m["judge_auroc"] == pytest.approx(1.0)
    one, m1 = judgement_loss(logits, rows[:2], cols[:2], good[:2], (1, 2))  # one class only
    assert one.item() == pytest.approx(good_ce) and m1["judge_balanced_accuracy"] is None


def test_auroc_and_balanced_accuracy_on_hand_made_cases():
    assert auroc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == pytest.approx(0.75)
    assert auroc([1.0, 1.0, 1.0], [True, False, True]) == pytest.approx(0.5)  # all tied
    assert auroc([2.0, 1.0, 1.0, 0.0], [True, True, False, False]) == pytest.approx(7 / 8)
    assert auroc([0.0, 1.0], [False, True]) == 1.0 and auroc([0.0, 1.0], [True, False]) == 0.0
    assert auroc([0.0, 1.0], [True, True]) is None
    # a constant judge: balanced accuracy 1/2 and AUROC 1/2, whatever the base rate
    pair = torch.tensor([[1.0, 0.0]] * 10)
    labels = torch.tensor([True] * 9 + [False])
    m = judge_metrics(pair, labels)
    assert m["judge_accuracy"] == pytest.approx(0.9) and m["judge_base_rate"] == pytest.approx(0.9)
    assert m["judge_balanced_accuracy"] == 0.5 and m["judge_auroc"] == 0.5
    m = judge_metrics(pair, ~labels, prefix="x_")
    assert m["x_base_rate"] == pytest.approx(0.9) and m["x_good_share"] == pytest.approx(0.1)


def test_judgement_loss_is_the_two_way_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 9, requires_grad=True)
    rows, cols, good = [0, 1, 1], [1, 2, 4], [True, False, True]
    loss, m = judgement_loss(logits, rows, cols, good, (7, 3), balance=False)
    pair = torch.stack([logits[r, c, [7, 3]] for r, c in zip(rows, cols)])
    manual = torch.nn.functional.cross_entropy(pair, torch.tensor([0, 1, 0]))
    assert loss.item() == pytest.approx(manual.item())
    balanced, _ = judgement_loss(logits, rows, cols, good, (7, 3))
    ce = torch.nn.functional.cross_entropy(pair, torch.tensor([0, 1, 0]), reduction="none")
    assert balanced.item() == pytest.approx(((ce[0] + ce[2]) / 2 + ce[1]).item() / 2)
    says = (pair[:, 0] > pair[:, 1]).tolist()
    assert m["judge_accuracy"] == pytest.approx(sum(s == g for s, g in zip(says, good)) / 3)
    assert m["judge_good_share"] == pytest.approx(2 / 3)
    loss.backward()
    touched = logits.grad.abs().sum(-1).nonzero().tolist()
    assert touched == [[0, 1], [1, 2], [1, 4]]  # only where a judgement is read
    assert logits.grad[..., [0, 1, 2, 4, 5, 6, 8]].abs().sum() == 0  # only the two tokens
    empty, m = judgement_loss(logits, [], [], [], (7, 3))
    assert empty.item() == 0.0 and empty.requires_grad and m["judge_accuracy"] is None


# ---------------------------------------------------------------------- the trainer
def test_with_weight_zero_the_loss_is_grpo_and_with_lambda_it_adds_the_judgement():
    trainer = GCDTrainer(tiny("gcd", sft_steps=0, judge_weight=0.0))
    torch.manual_seed(0)
    batch = trainer.rollout()
    adv = trainer.compute_advantages(batch)
    plain, m0 = trainer.compute_loss(batch, adv)
    assert "judge_loss" not in m0
    trainer.config.judge_weight = 0.5
    total, m = trainer.compute_loss(batch, adv)
    assert total.item() == pytest.approx(plain.item() + 0.5 * m["judge_loss"], rel=1e-5)
    # the judgement is read after each action's last token, from the same logits
    _, _, logits = sequence_logprobs(
        trainer.model, batch.input_ids, batch.attention_mask, with_entropy=True, with_logits=True
    )
    rows, cols, good = judgement_labels(batch, "outcome")
    assert len(rows) == int(batch.extras["num_turns"].sum())
    ref, _ = judgement_loss(logits, rows, cols, good, trainer.judge_ids)
    assert m["judge_loss"] == pytest.approx(ref.item(), rel=1e-5)
    width = batch.loss_mask.shape[1]
    for i, cs in enumerate(batch.extras["turn_end"]):  # the column is the action's last token
        for c in cs:
            assert batch.loss_mask[i, c] == 1 and (c + 1 == width or batch.loss_mask[i, c + 1] == 0)
    assert trainer.judge_ids[0] != trainer.judge_ids[1]
    assert trainer.tokenizer.convert_ids_to_tokens(list(trainer.judge_ids)) == [
        "<|good|>",
        "<|bad|>",
    ]


def test_a_short_run_logs_flaws_judgements_and_coupling_and_evaluates_both_splits():
    config = tiny("gcd", judge_weight=0.5, max_steps=4, judge_labels="oracle", eval_samples=2)
    trainer = GCDTrainer(config)
    summary = trainer.train()
    h = trainer.history
    assert [r["grad_cos"] is not None for r in h] == [False, True, False, True]
    for r in h:
        assert 0 <= r["flawed_rate"] <= 1 and 0 <= r["invalid_rate"] <= 1
        assert "judge_loss" in r and math.isfinite(r["judge_loss"])
    for when in ("before", "after"):
        for split in ("id", "ood"):
            keys = ("sampled_success", "greedy_success", "sampled_flawed_rate", "judge_base_rate")
            for key in keys + ("grad_cos", "hidden_cos", "state_cos", "spill", "pair_spill"):
                value = summary[f"{split}_{key}_{when}"]
                assert value is not None and math.isfinite(value), (split, key, when)
            for key in COUPLING_KEYS:
                assert f"{split}_{key}_{when}" in summary
            for rule in ("outcome", "advantage", "oracle"):
                for k in ("balanced_accuracy", "auroc", "base_rate"):
                    assert f"{split}_judge_{rule}_{k}_{when}" in summary
            own = summary[f"{split}_judge_auroc_{when}"]
            # the run's own rule, here the oracle
            assert own == summary[f"{split}_judge_oracle_auroc_{when}"]
            assert 0.5 <= summary[f"{split}_judge_oracle_base_rate_{when}"] <= 1
    assert summary["ood_success_after"] == summary["ood_sampled_success_after"]


def test_evaluation_plays_the_splits_it_names():
    trainer = GCDTrainer(tiny("gcd", sft_steps=0))
    for split in ("train", "ood"):
        envs = [trainer.make_task(split) for _ in range(3)]
        b = trainer.play([1, 2, 3], envs=envs)
        assert len(b.extras["kinds"]) == 3 and {env.split for env in envs} == {split}
        assert all(len(k) == n for k, n in zip(b.extras["kinds"], b.extras["num_turns"].tolist()))


def test_run_arms_shares_one_sft_start_per_judgement_weight_of_the_warm_start():
    arms = run_arms(tiny("gcd", max_steps=1, coupling_every=0), ARMS)
    assert list(arms) == list(ARMS)
    plain = [t for t in arms.values() if t.config.judge_sft_weight == 0]
    judged = [t for t in arms.values() if t.config.judge_sft_weight > 0]
    assert len(plain) == 4 and len(judged) == 2
    for group in (plain, judged):
        before = [t.evals["before"]["id_sampled_success"] for t in group]
        assert len(set(before)) == 1  # the same start, evaluated the same way
        assert all(t.sft_history == group[0].sft_history for t in group)
    assert plain[0].sft_history != judged[0].sft_history  # the judged start is another model
    assert {t.config.judge_weight for t in arms.values()} == {0.0, 0.5}
    assert [t.config.judge_labels for t in plain][1:] == ["oracle", "advantage", "outcome"]
    assert len(plain[0].sft_history) == 3


def test_build_segments_batch_probe_rows_are_right_padded(policy):
    # per_sample_grads relies on it: no attention mask, padding only after the real tokens
    _, tok = policy
    batch = build_segments_batch(tok, [[("at middle", False), ("look", True)], [("look", True)]])
    assert batch.attention_mask[1].tolist() == [1, 1, 0, 0]


def test_a_judgement_token_written_into_an_action_is_a_malformed_action():
    # the policy is never asked to write a judgement; if it does, the environment answers it
    # like any text outside its grammar: a message, reward 0, the episode goes on
    trainer = GCDTrainer(tiny("gcd", sft_steps=0))
    env = trainer.make_task()
    env.reset(0)
    for text in ("<|good|>", "put mug in <|bad|>", "<|good|> look"):
        obs, reward, done, info = env.step(text)
        assert info["kind"] == "malformed" and not info["format_ok"]
        assert obs.startswith("nothing happens") and reward == 0.0 and not done


def test_lora_coupling_leaves_the_model_copyable_and_a_run_finishes():
    """Reliability report, failure 14: with LoRA, torch.func's functional_call left the tied
    trainable-token delta (embedding and head) swapped for a vmap wrapper, and the next deepcopy
    (the second split's spillover) crashed; every parameter is put back."""
    trainer = GCDTrainer(tiny("gcd", use_lora=True, coupling_every=0, sft_steps=2, max_steps=1))
    trainer.sft()
    slots = [(m, k, p) for m in trainer.model.modules() for k, p in m._parameters.items()]
    coupling.per_sample_grads(trainer.model, trainer.probes["train"][0])
    assert all(m._parameters[k] is p for m, k, p in slots)
    copy.deepcopy(trainer.model)
    summary = trainer.train()  # evaluates both splits' coupling, before and after RL
    assert summary["rl_steps"] == 1


def test_judge_balance_is_a_validated_bool_flag_of_the_cli(capsys):
    from agentic_rl.cli import config_from_args

    assert GCDConfig().judge_balance is True
    parsed = config_from_args(GCDConfig, ["--judge-balance", "false"], prog="t")
    assert parsed.judge_balance is False
    with pytest.raises(ValueError, match="judge_balance"):
        GCDConfig(judge_balance="yes")
    with pytest.raises(SystemExit):
        config_from_args(GCDConfig, ["--help"], prog="t")
    out = " ".join(capsys.readouterr().out.split())
    assert "--judge-balance" in out and "both classes count equally" in out
    assert "does not have" not in out and "DeepSeek" in out  # the oracle rule's provenance


# --------------------------------------------------------------------------- the judged warm start


def test_the_warm_start_batch_labels_each_teacher_action_at_its_last_token():
    from agentic_rl.agent import AgentTrainer

    a, b = (GCDTrainer(tiny("gcd", sft_steps=0, sft_batch_size=6)) for _ in range(2))
    batch = a.sft_batch()
    plain = AgentTrainer.sft_batch(b)  # the same rows as the agent trainer's warm start
    assert torch.equal(batch.input_ids, plain.input_ids)
    assert torch.equal(batch.loss_mask, plain.loss_mask)
    flawed = 0
    for i, (cols, good) in enumerate(zip(batch.extras["judge_cols"], batch.extras["judge_good"])):
        assert len(cols) == len(good) > 0
        words = a.tokenizer.convert_ids_to_tokens(batch.input_ids[i, cols].tolist())
        assert set(words) == {"</action>"}  # the column where a rollout's turn_end would be
        flawed += good.count(False)
    assert flawed > 0  # the teacher's flawed actions are labelled bad


def test_a_judged_warm_start_adds_the_weighted_judgement_loss_and_zero_changes_nothing():
    torch.manual_seed(0)
    base = GCDTrainer(tiny("gcd", sft_steps=0, sft_batch_size=8))
    batch = base.sft_batch()
    judged = GCDTrainer(tiny("gcd", sft_steps=0, judge_sft_weight=0.5),
                        model=copy.deepcopy(base.model), tokenizer=base.tokenizer)
    plain = GCDTrainer(tiny("gcd", sft_steps=0), model=copy.deepcopy(base.model),
                       tokenizer=base.tokenizer)
    logprobs, logits = sequence_logprobs(base.model, batch.input_ids, batch.attention_mask,
                                         with_logits=True)
    sft = -(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()
    cols = batch.extras["judge_cols"]
    rows = [i for i, row in enumerate(cols) for _ in row]
    judge, _ = judgement_loss(logits, rows, [c for row in cols for c in row],
                              [g for row in batch.extras["judge_good"] for g in row],
                              base.judge_ids, balance=True)
    assert judged.sft_update(batch) == pytest.approx((sft + 0.5 * judge).item(), rel=1e-5)
    assert plain.sft_update(batch) == pytest.approx(sft.item(), rel=1e-5)
    for field, value in (("judge_sft_weight", -0.1), ("judge_sft_weight", float("nan"))):
        with pytest.raises(ConfigError, match=field):
            tiny("gcd", **{field: value})


def test_a_judged_warm_start_teaches_the_judge_to_separate_flawed_actions():
    torch.manual_seed(0)
    t = GCDTrainer(tiny("gcd", sft_steps=100, judge_sft_weight=1.0, sft_batch_size=32))  # SFT lr
    batch = t.sft_batch()
    good = torch.tensor([g for row in batch.extras["judge_good"] for g in row])
    rows = [i for i, row in enumerate(batch.extras["judge_cols"]) for _ in row]
    cols = [c for row in batch.extras["judge_cols"] for c in row]

    def ranking():
        with torch.no_grad():
            _, logits = sequence_logprobs(t.model, batch.input_ids, batch.attention_mask,
                                          with_logits=True)
        pair = logits[rows, cols][:, list(t.judge_ids)]
        return auroc(pair[:, 0] - pair[:, 1], good)

    before = ranking()
    for _ in range(60):  # the same batch: the judge must fit its labels
        t.sft_update(batch)
    assert ranking() > max(0.65, before + 0.1), (before, ranking())
