"""Early Experience: the data builder (alternatives really executed, next states as the
environment gives them), the masks of the three kinds of rows, the reflection template, the
config's refusals, the recipe from the CLI, and the lab's shared start against a fresh run."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
from testkit import tiny, tiny_values

from agentic_rl.cli import main
from agentic_rl.config import ConfigError, RunError
from agentic_rl.early_experience import (
    VALID,
    EarlyExperienceConfig,
    EarlyExperienceTrainer,
    ExperienceHousehold,
    Transition,
    check_replayable,
    collect_alternatives,
    demo_seeds,
    expert_transitions,
    imitation_rows,
    next_state_text,
    own_observation,
    probe_steps,
    reflection_rows,
    reflection_text,
    replay_to_state,
    run_starts,
    world_model_rows,
)
from agentic_rl.models import build_tokenizer
from agentic_rl.rollout import build_segments_batch
from agentic_rl.utils import setup


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(ExperienceHousehold().vocabulary())


@pytest.fixture(scope="module")
def trainer():
    setup(0)
    t = EarlyExperienceTrainer(tiny("early-experience"))
    t.sft(steps=2)
    return t


def masked_text(tokenizer, rows) -> list[str]:
    batch = build_segments_batch(tokenizer, rows)
    out = []
    for ids, mask in zip(batch.input_ids, batch.loss_mask):
        out.append(" ".join(tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())))
    return out


# ---------------------------------------------------------------------- the data
def test_expert_transitions_are_the_environments_own_steps():
    env = ExperienceHousehold()
    (episode,) = expert_transitions(env, [7])
    obs = env.reset(7)
    for step in episode:
        assert step.state.endswith(obs) and own_observation(step.state) == obs
        assert step.action == env.expert_action() and step.kind == "good"
        obs, _, done, info = env.step(step.action)
        assert step.next_state == next_state_text(obs, info)
    assert done and episode[-1].next_state == "success"
    # the state is the whole history the policy reads: observations and actions with their stop
    second = episode[1].state
    assert second == f"{episode[0].state} {episode[0].action} </action> {own_observation(second)}"


def test_next_state_text_of_a_step_that_ends_the_episode():
    assert next_state_text("at fridge : egg . hold nothing <action>", {}) == (
        "at fridge : egg . hold nothing"
    )
    assert next_state_text("", {"success": True}) == "success"
    assert next_state_text("", {"success": False}) == "out of turns"


def test_alternatives_are_really_executed_and_differ_from_the_expert(trainer):
    seeds = trainer.demo_seeds
    episodes = trainer.expert_episodes
    alts = collect_alternatives(trainer, seeds, episodes, k=2, proposals=4, seed=3)
    assert len(alts) == len(episodes)
    count = 0
    for seed, steps, kept_per_step in zip(seeds, episodes, alts):
        for i, (step, kept) in enumerate(zip(steps, kept_per_step)):
            assert len(kept) <= 2 and len({a.action for a in kept}) == len(kept)
            for alt in kept:
                count += 1
                assert alt.state == step.state and alt.action != step.action
                assert alt.next_state != step.next_state
                env = trainer.make_task()
                before = [s.action for s in steps[:i]]
                replay_to_state(env, seed, before, own_observation(step.state))
                obs, _, _, info = env.step(alt.action)  # the environment's own answer
                assert alt.next_state == next_state_text(obs, info) and alt.kind == info["kind"]
    assert count > 0


def test_valid_alternatives_are_the_executed_proposals_in_sampling_order(trainer):
    seeds, episodes = trainer.demo_seeds, trainer.expert_episodes
    tally = {}
    every = collect_alternatives(trainer, seeds, episodes, k=8, proposals=8, seed=5,
                                 proposed=tally)
    valid = collect_alternatives(trainer, seeds, episodes, k=8, proposals=8, seed=5, kinds=VALID)
    assert sum(tally.values()) == 8 * sum(len(ep) for ep in episodes)  # every proposal counted
    assert set(tally) <= {"good", "flawed", "invalid", "malformed"}
    for all_kept, valid_kept in zip(every, valid):
        for a, v in zip(all_kept, valid_kept):
            assert v == [t for t in a if t.kind in VALID]  # the same proposals, filtered
    assert any(t.kind not in VALID for ep in every for step in ep for t in step)


def test_collecting_twice_with_one_seed_gives_the_same_data_and_leaves_torch_alone(trainer):
    import torch

    before = torch.random.get_rng_state()
    a = trainer.collect_experience()
    assert torch.equal(before, torch.random.get_rng_state())
    assert a == trainer.collect_experience()


def test_an_environment_that_cannot_return_to_an_expert_state_is_refused():
    class Drifting(ExperienceHousehold):
        def reset(self, seed):  # a different task on every reset: not reproducible
            return super().reset(random.randrange(10**6))

    env = Drifting()
    (episode,) = expert_transitions(ExperienceHousehold(), [3])
    with pytest.raises(RunError, match="cannot be reset to an expert state"):
        for _ in range(20):  # (the same task by chance, at most a few times)
            replay_to_state(env, 3, [episode[0].action], own_observation(episode[1].state))
    with pytest.raises(RunError, match="cannot be reset to an expert state"):
        for _ in range(20):
            check_replayable(env, 3)  # the trainer's check, before any compute
    check_replayable(ExperienceHousehold(), 3)  # the household is replayable

    class Shared(ExperienceHousehold):
        def __deepcopy__(self, memo):
            return self

    with pytest.raises(RunError, match="cannot be copied"):
        check_replayable(Shared(), 3)
    with pytest.raises(RunError, match="num_alternatives must be >= 1"):
        collect_alternatives(None, [3], [episode], k=0, proposals=2, seed=0)


# ---------------------------------------------------------------------- the rows and their masks
STATE = "goal : put egg in fridge . egg is in table . at middle . hold nothing <action>"
EXPERT = Transition(STATE, "go to table", "at table : egg . hold nothing", "good")
ALT = Transition(STATE, "go to drawer", "at drawer : empty . hold nothing", "flawed")


def test_imitation_rows_train_the_actions_only(tokenizer):
    (episode,) = expert_transitions(ExperienceHousehold(), [5])
    (text,) = masked_text(tokenizer, imitation_rows([episode]))
    assert text == " ".join(f"{s.action} </action>" for s in episode)


def test_world_model_rows_train_the_next_state_only(tokenizer):
    (text,) = masked_text(tokenizer, world_model_rows([ALT]))
    assert text == ALT.next_state
    batch = build_segments_batch(tokenizer, world_model_rows([ALT]))
    first = batch.loss_mask[0].nonzero()[0].item()  # the state and the action are context
    context = tokenizer.convert_ids_to_tokens(batch.input_ids[0, :first].tolist())
    assert context[-4:] == ["go", "to", "drawer", "</action>"]


def test_reflection_rows_train_the_experts_action_then_the_rationale(tokenizer):
    (text,) = masked_text(tokenizer, reflection_rows([(EXPERT, ALT)]))
    assert text == f"go to table </action> {reflection_text(EXPERT, ALT)}"
    assert "go to drawer" not in text.split("</action>")[0]  # the alternative is not the action


def test_the_reflection_controls_untrain_or_shuffle_the_rationale(tokenizer):
    (text,) = masked_text(tokenizer, reflection_rows([(EXPERT, ALT)], trained=False))
    assert text == "go to table </action>"  # the control: the expert's action alone
    other = (dataclasses.replace(EXPERT, action="take egg from table", next_state="hold egg"),
             dataclasses.replace(ALT, action="go to fridge"))
    (text,) = masked_text(tokenizer, reflection_rows([(EXPERT, ALT)], [other]))
    assert text == f"go to table </action> {reflection_text(*other)}"  # another pair's
    with pytest.raises(ValueError):
        reflection_rows([(EXPERT, ALT)], [other, other])


def test_reflection_template_contrasts_the_two_next_states():
    assert reflection_text(EXPERT, ALT) == (
        "think : go to drawer gives at drawer : empty . hold nothing , no closer ; "
        "go to table gives at table : egg . hold nothing , closer ."
    )
    bad = dataclasses.replace(ALT, action="", next_state="nothing happens . at middle . hold "
                              "nothing", kind="malformed")  # fmt: skip
    assert reflection_text(EXPERT, bad).startswith(
        "think : nothing gives nothing happens . at middle . hold nothing , not an action ;"
    )


@pytest.mark.parametrize("kind", ["good", "flawed", "invalid", "malformed"])
def test_every_word_of_the_template_is_in_the_vocabulary(tokenizer, kind):
    alt = dataclasses.replace(ALT, kind=kind, next_state="out of turns")
    for text in (reflection_text(EXPERT, alt), "success"):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.unk_token_id not in ids and len(ids) == len(text.split())


# ---------------------------------------------------------------------- the config and the runs
@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(num_alternatives=0), "num_alternatives"),
        (dict(world_model_steps=-1), "world_model_steps"),
        (dict(world_model_steps=400), "world_model_steps"),
        (dict(proposals=2), "proposals"),
        (dict(start="dpo"), "start"),
        (dict(demo_error_rate=0.1), "demo_error_rate"),
        (dict(reflection_share=0.0), "reflection_share"),
        (dict(num_demos=0), "num_demos"),
        (dict(max_action_tokens=4), "max_action_tokens"),
        (dict(alternatives="some"), "alternatives"),
        (dict(start="world_model", world_model_mix=1.0), "world_model_mix"),
        (dict(start="imitation", world_model_mix=0.25), "world_model_mix"),
        (dict(start="reflection", rationale="none"), "rationale"),
        (dict(start="world_model", rationale="untrained"), "rationale"),
        (dict(probe_every=-1), "probe_every"),
    ],
)
def test_bad_config_values_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        EarlyExperienceConfig.from_profile("quick", **overrides)


def _trained_words(trainer, batch) -> list[list[str]]:
    convert = trainer.tokenizer.convert_ids_to_tokens
    return [convert(ids[mask.bool()].tolist()) for ids, mask in zip(batch.input_ids,
                                                                    batch.loss_mask)]


def test_the_arms_batches_differ_only_where_their_control_says():
    setup(0)
    base = EarlyExperienceTrainer(tiny("early-experience", sft_batch_size=8))
    base.sft(steps=base.config.initial_steps)
    base.alternatives = base.collect_experience()
    base.step = base.config.initial_steps + base.config.world_model_steps  # the imitation stage

    def batch(**fields):
        base.config = dataclasses.replace(base.config, **fields)
        return base.sft_batch()

    trained = batch(start="reflection", rationale="trained")
    untrained = batch(start="reflection", rationale="untrained")
    shuffled = batch(start="reflection", rationale="shuffled")
    assert torch.equal(trained.input_ids, untrained.input_ids)  # the same rows
    assert (untrained.loss_mask <= trained.loss_mask).all()
    assert untrained.loss_mask.sum() < trained.loss_mask.sum()
    t, s = _trained_words(base, trained), _trained_words(base, shuffled)
    assert t[4:] == s[4:]  # the same expert episodes (reflection_share 0.5 of 8 rows)
    assert [w[: w.index("</action>") + 1] for w in t[:4]] == \
        [w[: w.index("</action>") + 1] for w in s[:4]]  # the same actions, other rationales
    mixed = _trained_words(base, batch(start="world_model", rationale="trained",
                                       world_model_mix=0.25))
    assert sum("</action>" not in w for w in mixed) == 2  # a quarter: next states only
    plain = _trained_words(base, batch(world_model_mix=0.0))
    assert all("</action>" in w for w in plain)  # the paper's two stages: imitation only


def test_the_next_state_probes_measure_without_changing_the_run():
    runs = {}
    for every in (0, 3):
        setup(0)
        runs[every] = EarlyExperienceTrainer(tiny("early-experience", start="world_model",
                                                  probe_every=every))
        runs[every].train()
    quiet, probed = runs[0], runs[3]
    assert quiet.probes == {} and probe_steps(quiet.config) == []
    assert sorted(probed.probes) == probe_steps(probed.config) == [2, 3, 4, 6]
    assert probed.sft_history == quiet.sft_history  # probing trains nothing, draws nothing
    drop = ("tokens_per_s", "step_time")
    rows = [[{k: v for k, v in r.items() if k not in drop} for r in t.history]
            for t in (quiet, probed)]
    assert repr(rows[0]) == repr(rows[1])
    # the last probe is the evaluation's own measurement, on the same weights
    assert probed.probes[6] == pytest.approx(probed.evals["before"]["id_next_state_loss"])
    state = probed.extra_state()
    twin = EarlyExperienceTrainer(probed.config)
    twin.load_extra_state(state)  # (a checkpoint keeps them)
    assert twin.probes == probed.probes and twin.proposed == probed.proposed


def test_every_start_sees_the_same_rl_task_stream():
    setup(0)
    states = []
    for start in ("imitation", "world_model", "reflection"):
        t = EarlyExperienceTrainer(tiny("early-experience", start=start))
        t.sft()
        states.append(t.problem_rng.getstate())
        if start != "imitation":
            assert t.alternatives is not None
    assert states[0] == states[1] == states[2]


@pytest.mark.parametrize("start", ["world_model", "reflection"])
def test_the_labs_shared_start_is_a_fresh_run_of_that_start(start):
    config = tiny("early-experience", start=start)
    setup(0)
    fresh = EarlyExperienceTrainer(config)
    fresh.train()
    setup(0)
    # (imitation first: the arm after it must not inherit the random streams it used)
    starts = {"imitation": dict(start="imitation"), "arm": dict(start=start)}
    arm = run_starts(config, starts)["arm"]
    assert arm.alternatives == fresh.alternatives
    assert arm.sft_history == fresh.sft_history
    drop = ("tokens_per_s", "step_time")
    rows = [
        [{k: v for k, v in r.items() if k not in drop} for r in t.history] for t in (arm, fresh)
    ]
    assert repr(rows[0]) == repr(rows[1])  # (kl is NaN with beta 0)
    assert arm.evals == fresh.evals


def test_recipe_runs_tiny_from_the_cli_and_writes_the_summary(tmp_path):
    out = tmp_path / "run"
    argv = ["early-experience", "--start", "reflection", "--output-dir", str(out)]
    for key, value in tiny_values("early-experience").items():
        argv += [f"--{key.replace('_', '-')}", str(value).lower()]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and summary["config"]["start"] == "reflection"
    for key in ("success", "id_sampled_success", "ood_sampled_success", "id_next_state_loss"):
        assert f"{key}_before" in summary and f"{key}_after" in summary
    assert summary["experience_states"] == sum(
        len(ep)
        for ep in expert_transitions(ExperienceHousehold(), demo_seeds(summary["seed"], 3))
    )
    assert 0 < summary["experience_per_state"] <= 2
