"""The multi-turn agent loop: masks, rewards and turn ids of the Batch; that the log-probs recorded
while sampling (KV cache reused across turns, masked pads in the middle of rows) are the log-probs
the loss recomputes on the compacted batch; that the cached and the naive loop sample the same
tokens; that the rollout's preallocated history and in-place KV cache give bit-identical results to
transformers' own cache; and that malformed, overlong or finished episodes are handled per the
environment.

Everything runs against a small mock environment defined here (a corridor), not a real env module.
"""

from __future__ import annotations

import pytest
import torch

from agentic_rl.envs import MultiTurnEnv
from agentic_rl.models import build_tokenizer
from agentic_rl.multiturn import rollout_multiturn
from agentic_rl.rollout import Batch, sequence_logprobs

from testkit import tiny_model


class Corridor:
    """Positions 0..length-1, start ``seed % 3``; reward 1 and success on reaching the last cell.

    Observations have different lengths (an optional ``you are at`` prefix, a ``wall`` note after a
    bump) so observation chunks need padding. ``strict``: the action must be exactly ``left`` or
    ``right``, anything else is malformed (episode ends, reward -0.1, ``format_ok`` False). Lenient:
    the last ``left``/``right`` word of the action counts, none means "stay". After ``max_turns``
    turns the env truncates. Stepping a finished episode is a test failure.
    """

    name = "corridor"

    def __init__(self, length: int = 5, max_turns: int = 6, strict: bool = False):
        self.length, self.max_turns, self.strict = length, max_turns, strict
        self.done = True
        self.calls = 0

    def vocabulary(self) -> list[str]:
        words = ["you", "are", "at", "pos", "wall", "left", "right", "<action>", "</action>"]
        return words + [str(i) for i in range(self.length)]

    def reset(self, seed: int) -> str:
        self.pos, self.t, self.done, self.calls = seed % 3, 0, False, 0
        return self._obs(bumped=False)

    def _obs(self, bumped: bool) -> str:
        words = ["you", "are", "at"] * (self.pos % 2) + ["wall"] * bumped
        words += ["pos", str(self.pos), "<action>"]
        return " ".join(words)

    def step(self, action_text: str):
        assert not self.done, "step() called on a finished episode"
        self.t += 1
        self.calls += 1
        words = action_text.split()
        if self.strict:
            move = words[0] if len(words) == 1 and words[0] in ("left", "right") else None
            if move is None:
                self.done = True
                return "", -0.1, True, dict(terminated=True, truncated=False, format_ok=False,
                                            success=False)
        else:
            moves = [w for w in words if w in ("left", "right")]
            move = moves[-1] if moves else None
        new = self.pos + {"left": -1, "right": 1, None: 0}[move]
        bumped = not 0 <= new < self.length
        self.pos = min(max(new, 0), self.length - 1)
        if self.pos == self.length - 1:
            self.done = True
            return "", 1.0, True, dict(terminated=True, truncated=False, format_ok=True,
                                       success=True)
        truncated = self.t >= self.max_turns
        self.done = truncated
        return self._obs(bumped), 0.0, truncated, dict(terminated=False, truncated=truncated,
                                                       format_ok=True, success=False)

    def expert_action(self) -> str:
        return "right"


class Biased(torch.nn.Module):
    """A policy that prefers some tokens: the tiny model's logits plus a fixed bias (so episodes
    last)."""

    def __init__(self, model, bias: torch.Tensor):
        super().__init__()
        self.model = model
        self.config = model.config
        self.register_buffer("bias", bias)

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.logits = out.logits + self.bias
        return out


@pytest.fixture(scope="module")
def ctok():
    return build_tokenizer(Corridor().vocabulary())


@pytest.fixture(scope="module")
def raw_model(ctok):
    return tiny_model(ctok)


def _biased(ctok, model, strength=3.0, words=("left", "right", "</action>")):
    bias = torch.zeros(len(ctok))
    for w in words:
        bias[ctok.convert_tokens_to_ids(w)] = strength
    return Biased(model, bias)


@pytest.fixture(scope="module")
def policy(ctok, raw_model):
    return _biased(ctok, raw_model)


def _envs(n, **kw):
    # different turn limits per row, so episodes have different lengths even without reaching the
    # goal
    return [Corridor(max_turns=2 + i % 4, **kw) for i in range(n)]


def _run(model, tok, n=12, seed=0, envs=None, **kw):
    torch.manual_seed(seed)
    envs = envs if envs is not None else _envs(n)
    return rollout_multiturn(model, tok, envs, list(range(len(envs))), **kw), envs


def _replay(batch: Batch, tok, envs_fresh, seeds, *, max_action_tokens, max_turns=None,
            stop_word="</action>"):
    """Rebuild every row from the env's own answers to the sampled actions; check the row equals
    it."""
    stop = tok.convert_tokens_to_ids(stop_word)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for i, (env, seed) in enumerate(zip(envs_fresh, seeds)):
        row = batch.input_ids[i].tolist()
        tids = batch.turn_ids[i].tolist()
        limit = max_turns if max_turns is not None else env.max_turns
        ids = tok(env.reset(seed))["input_ids"]
        loss, turn, rew = [0] * len(ids), [-1] * len(ids), [0.0] * len(ids)
        actions, t, ret, fmt = [], 0, 0.0, True
        while True:
            gen = [x for x, k in zip(row, tids) if k == t]
            assert 1 <= len(gen) <= max_action_tokens
            # the action ends at its first stop word / EOS (never earlier), or at max_action_tokens
            ended = gen[-1] in (stop, eos)
            assert all(x not in (stop, eos) for x in gen[:-1])
            assert ended or len(gen) == max_action_tokens
            text = tok.decode(gen[:-1] if ended else gen, skip_special_tokens=False)
            actions.append(text)
            obs, r, done, info = env.step(text)
            ids += gen
            loss += [1] * len(gen)
            turn += [t] * len(gen)
            rew += [0.0] * (len(gen) - 1) + [r]
            ret += r
            fmt = fmt and info["format_ok"]
            t += 1
            terminal = done and not info.get("truncated", False)
            if terminal or ((done or t >= limit) and not obs):
                break
            # not ended, or cut by a turn limit: the (final) observation follows, never in the loss
            o = tok(obs, add_special_tokens=False)["input_ids"]
            ids += o
            loss += [0] * len(o)
            turn += [-1] * len(o)
            rew += [0.0] * len(o)
            if done or t >= limit:
                break
        n = len(ids)
        T = batch.input_ids.shape[1]
        assert row == ids + [pad] * (T - n), f"row {i}"
        assert batch.attention_mask[i].tolist() == [1] * n + [0] * (T - n)
        assert batch.loss_mask[i].tolist() == loss + [0] * (T - n)
        assert tids == turn + [-1] * (T - n)
        assert batch.token_rewards[i].tolist() == pytest.approx(rew + [0.0] * (T - n))
        assert batch.completions[i] == " ; ".join(actions)
        assert batch.extras["num_turns"][i].item() == t
        assert batch.extras["episode_return"][i].item() == pytest.approx(ret)
        assert bool(batch.format_ok[i]) == fmt
        assert bool(batch.correct[i]) == bool(info["success"]) == bool(batch.extras["success"][i])
        # no turn beyond the last one
        assert max(tids) == t - 1


# -------------------------------------------------------------------------------------------------


def test_mock_env_implements_protocol():
    assert isinstance(Corridor(), MultiTurnEnv)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("reuse_cache", [True, False])
def test_recorded_logprobs_equal_sequence_logprobs(ctok, policy, temperature, reuse_cache):
    """The key invariant: what sampling recorded (cached, pads in the middle) is what the loss
    recomputes."""
    batch, _ = _run(policy, ctok, n=16, seed=1, temperature=temperature, reuse_cache=reuse_cache,
                    max_action_tokens=3)
    # the test is only meaningful if episodes really have several turns and different lengths
    turns = batch.extras["num_turns"]
    assert turns.max() >= 3 and len(set(turns.tolist())) >= 2
    with torch.no_grad():
        lp = sequence_logprobs(policy, batch.input_ids, batch.attention_mask,
                               temperature=temperature)
    m = batch.loss_mask.bool()
    torch.testing.assert_close(batch.old_logprobs[m], lp[m], atol=1e-5, rtol=0)
    assert (batch.old_logprobs[~m] == 0).all()
    assert (batch.old_logprobs[m] < 0).all()


def test_batch_layout_matches_replay(ctok, policy):
    """Masks, turn ids, rewards, texts and episode facts, rebuilt independently from the env."""
    for seed in range(3):
        batch, envs = _run(policy, ctok, n=12, seed=seed, max_action_tokens=3)
        assert len(batch) == 12
        assert batch.input_ids.shape == batch.loss_mask.shape == batch.turn_ids.shape
        assert batch.group_id.tolist() == list(range(12))
        assert torch.equal(batch.scores, batch.extras["episode_return"])
        _replay(batch, ctok, _envs(12), list(range(12)), max_action_tokens=3)
        # every env was stepped exactly num_turns times (no step after done)
        assert [e.calls for e in envs] == batch.extras["num_turns"].tolist()


def test_masks_and_rewards_positions(ctok, policy):
    batch, _ = _run(policy, ctok, n=12, seed=4, max_action_tokens=3)
    lm, tids, am = batch.loss_mask, batch.turn_ids, batch.attention_mask
    # loss_mask == generated == turn id >= 0; never on BOS, observation or padding tokens
    assert torch.equal(lm.bool(), tids >= 0)
    assert (lm <= am).all() and (lm[:, 0] == 0).all()
    assert (batch.input_ids[:, 0] == ctok.bos_token_id).all()
    # observation tokens are never in the loss (an action may sample the same words, so check the
    # layout: every turn starts right after an observation's closing <action>, out of the loss)
    action_tag = ctok.convert_tokens_to_ids("<action>")
    for i in range(len(batch)):
        n = int(am[i].sum())
        row, t = batch.input_ids[i, :n].tolist(), tids[i, :n].tolist()
        for c in range(1, n):
            # first token of a turn: right after an observation's <action>
            if t[c] >= 0 and t[c - 1] < 0:
                assert row[c - 1] == action_tag and lm[i, c - 1] == 0
        # turn ids are non-decreasing along generated tokens and consecutive from 0
        turns = [x for x in t if x >= 0]
        assert turns == sorted(turns)
        assert sorted(set(turns)) == list(range(int(batch.extras["num_turns"][i])))
        # rewards sit on the last generated token of a turn, and the turn_end extras point there
        ends = batch.extras["turn_end"][i]
        assert len(ends) == len(set(turns))
        for k, c in enumerate(ends):
            assert t[c] == k and (c + 1 == n or t[c + 1] != k)
            reward = batch.extras["turn_rewards"][i][k]
            assert batch.token_rewards[i, c].item() == pytest.approx(reward)
        nz = batch.token_rewards[i].nonzero().squeeze(1).tolist()
        assert set(nz) <= set(ends)


def test_reuse_cache_gives_identical_samples(ctok, policy):
    for seed in range(4):
        a, _ = _run(policy, ctok, n=12, seed=seed, reuse_cache=True, max_action_tokens=3)
        b, _ = _run(policy, ctok, n=12, seed=seed, reuse_cache=False, max_action_tokens=3)
        assert torch.equal(a.input_ids, b.input_ids)
        assert torch.equal(a.loss_mask, b.loss_mask) and torch.equal(a.turn_ids, b.turn_ids)
        assert torch.equal(a.token_rewards, b.token_rewards)
        assert a.completions == b.completions
        torch.testing.assert_close(a.old_logprobs, b.old_logprobs, atol=1e-5, rtol=0)


def test_malformed_and_overlong_actions_end_episode_per_env(ctok, raw_model):
    """An untrained policy writes junk: a strict env ends those episodes with a format penalty."""
    envs = [Corridor(strict=True) for _ in range(16)]
    batch, envs = _run(raw_model, ctok, envs=envs, seed=0, max_action_tokens=2)
    _replay(batch, ctok, [Corridor(strict=True) for _ in range(16)], list(range(16)),
            max_action_tokens=2)
    bad = ~batch.format_ok
    assert bad.any()
    assert batch.extras["terminated"][bad].all() and not batch.extras["truncated"][bad].any()
    assert batch.extras["episode_return"][bad].tolist() == pytest.approx([-0.1] * int(bad.sum()))
    # the penalty sits on the last generated token of the malformed turn
    for i in bad.nonzero().squeeze(1).tolist():
        last = batch.extras["turn_end"][i][-1]
        assert batch.token_rewards[i, last].item() == pytest.approx(-0.1)
        assert int(batch.loss_mask[i].nonzero().max()) == last
    # actions cut at max_action_tokens without a stop word are counted, and the env just got the
    # text
    assert batch.extras["missing_stop"].sum() > 0
    with torch.no_grad():
        lp = sequence_logprobs(raw_model, batch.input_ids, batch.attention_mask)
    m = batch.loss_mask.bool()
    torch.testing.assert_close(batch.old_logprobs[m], lp[m], atol=1e-5, rtol=0)


def test_single_token_actions_and_junk_never_crash(ctok, raw_model):
    batch, envs = _run(raw_model, ctok, n=8, seed=3, max_action_tokens=1)
    _replay(batch, ctok, _envs(8), list(range(8)), max_action_tokens=1)
    assert (batch.loss_mask.sum(1) == batch.extras["num_turns"]).all()


def test_max_turns_below_env_limit_truncates(ctok, policy):
    # the goal is out of reach in 2 turns
    envs = [Corridor(length=50, max_turns=10) for _ in range(6)]
    batch, envs = _run(policy, ctok, envs=envs, seed=0, max_turns=2, max_action_tokens=3)
    assert batch.extras["num_turns"].tolist() == [2] * 6
    assert batch.extras["truncated"].all() and not batch.extras["terminated"].any()
    assert not batch.correct.any()
    assert [e.calls for e in envs] == [2] * 6
    _replay(batch, ctok, [Corridor(length=50, max_turns=10) for _ in range(6)], list(range(6)),
            max_action_tokens=3, max_turns=2)


def test_env_truncation_and_success_flags(ctok, policy):
    batch, envs = _run(policy, ctok, n=16, seed=2, max_action_tokens=3)
    limits = torch.tensor([e.max_turns for e in envs])
    nt = batch.extras["num_turns"]
    assert (nt <= limits).all()
    succ, trunc = batch.extras["success"], batch.extras["truncated"]
    term = batch.extras["terminated"]
    assert torch.equal(succ, batch.correct)
    assert not (trunc & term).any() and (trunc | term).all()
    assert (nt[trunc] == limits[trunc]).all()
    assert succ.any() and trunc.any()  # both outcomes occur with this seed


def test_eos_ends_an_action(ctok, raw_model):
    """A row that samples EOS ends its action there: EOS is in the loss, not in the action text."""
    policy = _biased(ctok, raw_model, strength=4.0, words=("right", "<eos>"))
    batch, _ = _run(policy, ctok, n=12, seed=0, max_action_tokens=4)
    eos = ctok.eos_token_id
    assert ((batch.input_ids == eos) & (batch.loss_mask == 1)).any()
    assert not ((batch.input_ids == eos) & (batch.loss_mask == 0)).any()
    assert all("<eos>" not in c for c in batch.completions)
    _replay(batch, ctok, _envs(12), list(range(12)), max_action_tokens=4)


def test_greedy_is_deterministic(ctok, policy):
    a, _ = _run(policy, ctok, n=8, seed=0, greedy=True, max_action_tokens=3)
    b, _ = _run(policy, ctok, n=8, seed=123, greedy=True, max_action_tokens=3)
    c, _ = _run(policy, ctok, n=8, seed=5, greedy=True, reuse_cache=False, max_action_tokens=3)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.input_ids, c.input_ids)
    # each greedy token is the argmax of the policy given its context in the compacted batch
    with torch.no_grad():
        position_ids = (a.attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = policy(input_ids=a.input_ids, attention_mask=a.attention_mask,
                        position_ids=position_ids).logits
    m = a.loss_mask[:, 1:].bool()
    assert torch.equal(logits[:, :-1].argmax(-1)[m], a.input_ids[:, 1:][m])


def test_sampling_depends_on_seed(ctok, policy):
    a, _ = _run(policy, ctok, n=12, seed=0, max_action_tokens=3)
    b, _ = _run(policy, ctok, n=12, seed=0, max_action_tokens=3)
    c, _ = _run(policy, ctok, n=12, seed=1, max_action_tokens=3)
    assert torch.equal(a.input_ids, b.input_ids)
    assert a.input_ids.shape != c.input_ids.shape or not torch.equal(a.input_ids, c.input_ids)


def test_gradient_only_through_generated_tokens(ctok, raw_model):
    """A loss built on the batch gets no gradient from observation positions."""
    policy = _biased(ctok, raw_model)
    batch, _ = _run(policy, ctok, n=8, seed=0, max_action_tokens=3)
    policy.train()
    logp = sequence_logprobs(policy, batch.input_ids, batch.attention_mask)
    logp.retain_grad()
    loss = (logp * batch.loss_mask).sum()
    loss.backward()
    g = logp.grad
    assert (g[batch.loss_mask == 0] == 0).all()
    assert (g[batch.loss_mask == 1] == 1).all()
    grads = [p.grad for p in raw_model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(x).all() for x in grads)
    assert any(x.abs().sum() > 0 for x in grads)
    raw_model.zero_grad(set_to_none=True)
    policy.eval()


def test_model_mode_restored_and_ref_logprobs(ctok):
    model, ref = tiny_model(ctok, seed=1), tiny_model(ctok, seed=2)
    model.train()
    ref.train()
    batch, _ = _run(model, ctok, n=6, seed=0, ref_model=ref, temperature=0.8,
                    group_ids=[0, 0, 0, 1, 1, 1], max_action_tokens=2)
    assert model.training and ref.training
    assert batch.group_id.tolist() == [0, 0, 0, 1, 1, 1]
    with torch.no_grad():
        expected = sequence_logprobs(ref, batch.input_ids, batch.attention_mask, temperature=0.8)
        expected = expected * batch.loss_mask
    torch.testing.assert_close(batch.ref_logprobs, expected)
    # the same model as reference gives the recorded old log-probs
    batch2, _ = _run(model, ctok, n=6, seed=0, ref_model=model, temperature=0.8,
                     max_action_tokens=2)
    torch.testing.assert_close(batch2.ref_logprobs, batch2.old_logprobs, atol=1e-5, rtol=0)


def test_extras_are_row_tensors(ctok, policy):
    batch, _ = _run(policy, ctok, n=5, seed=0, max_action_tokens=3)
    for k in ("success", "num_turns", "terminated", "truncated", "episode_return", "missing_stop"):
        assert isinstance(batch.extras[k], torch.Tensor) and batch.extras[k].shape == (5,)
    assert batch.correct.dtype == torch.bool and batch.format_ok.dtype == torch.bool
    assert len(batch.completions) == 5


def test_multi_token_stop_word(ctok, policy):
    """A stop word of several tokens (as with a BPE tokenizer) ends the action when all of it is
    emitted."""
    torch.manual_seed(0)
    envs = _envs(8)
    batch = rollout_multiturn(policy, ctok, envs, list(range(8)), stop_word="</action> </action>",
                              max_action_tokens=4)
    stop = ctok.convert_tokens_to_ids("</action>")
    for i in range(8):
        row, t = batch.input_ids[i].tolist(), batch.turn_ids[i].tolist()
        for k in range(int(batch.extras["num_turns"][i])):
            gen = [x for x, j in zip(row, t) if j == k]
            pairs = [gen[j : j + 2] == [stop, stop] for j in range(len(gen) - 1)]
            # a double stop can only occur at the very end of an action
            assert not any(pairs[:-1])
            assert len(gen) == 4 or gen[-2:] == [stop, stop] or gen[-1] == ctok.eos_token_id


def test_validation_errors(ctok, policy):
    with pytest.raises(ValueError):
        rollout_multiturn(policy, ctok, [Corridor()], [0, 1])
    with pytest.raises(ValueError):
        rollout_multiturn(policy, ctok, [Corridor()], [0], max_action_tokens=0)
    with pytest.raises(ValueError):
        rollout_multiturn(policy, ctok, [Corridor()], [0], temperature=0.0)


def test_buffer_grows_and_keeps_position_ids():
    """The preallocated history: appends past its capacity keep every field, and the incremental
    position ids are the cumulative-mask ones of the whole history."""
    from agentic_rl.multiturn import _Buffer
    from agentic_rl.rollout import _position_ids

    gen = torch.Generator().manual_seed(0)
    buf = _Buffer(3, 2, torch.device("cpu"))
    ids, attn = [], []
    for n in (2, 1, 3, 1, 1, 4):
        x = torch.randint(5, 20, (3, n), generator=gen)
        a = (torch.rand(3, n, generator=gen) > 0.3).long()
        buf.append(x, a, loss=a, turn=a * 7 - 1, logp=-a.float())
        ids.append(x)
        attn.append(a)
    ids, attn = torch.cat(ids, 1), torch.cat(attn, 1)
    assert buf.width == 12 and torch.equal(buf.ids, ids) and torch.equal(buf.attn, attn)
    assert torch.equal(buf.pos, _position_ids(attn))
    assert torch.equal(buf.loss, attn) and torch.equal(buf.turn, attn * 7 - 1)
    assert torch.equal(buf.logp, -attn.float()) and not buf.reward.any()


def test_growing_cache_is_bit_identical_to_the_stock_cache(ctok, policy, monkeypatch):
    """The rollout's in-place KV cache gives exactly the samples and log-probs of transformers'
    ``DynamicCache`` (which concatenates at every step)."""
    import agentic_rl.multiturn as mt

    layers = mt._new_cache(policy.config, torch.device("cpu"), 8).layers
    assert layers and all(isinstance(layer, mt._GrowingLayer) for layer in layers)
    out = []
    for stock in (False, True):
        if stock:
            stock_cache = lambda config, device, capacity: mt.DynamicCache(config=config)
            monkeypatch.setattr(mt, "_new_cache", stock_cache)
        batch, _ = _run(policy, ctok, n=12, seed=3, max_action_tokens=3)
        out.append(batch)
    assert torch.equal(out[0].input_ids, out[1].input_ids)
    assert torch.equal(out[0].old_logprobs, out[1].old_logprobs)
    assert torch.equal(out[0].token_rewards, out[1].token_rewards)
