"""The one recipe registry (``cli.RECIPES``) and the house rules every chapter module keeps.

A new chapter is one module (its config and trainer), one line in ``RECIPES``, its tests and its
book files. These tests check, for every registered recipe, what that line promises: a config,
a trainer that fills in the loop's required hooks, a ``--help`` that lists only the flags the
recipe uses, and a row in the hardening tests.
"""

import ast
import dataclasses
import inspect
import pathlib
import re
import textwrap

import pytest
import test_hardening

from agentic_rl.agent import AgentTrainer
from agentic_rl.cli import RECIPES, main, recipe
from agentic_rl.config import (
    AgentFields, CriticFields, FrozenLakeFields, HouseholdFields, RLConfig,
)  # fmt: skip
from agentic_rl.grpo import GRPOConfig
from agentic_rl.train import Trainer

from testkit import TINY_RECIPE, tiny

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "agentic_rl"
REQUIRED_HOOKS = ("make_task", "make_eval_set", "sft_batch", "rollout", "evaluate")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_registered_recipe_has_a_config_a_trainer_and_help(name, capsys):
    chapter = recipe(name)
    assert issubclass(chapter.CONFIG, RLConfig) and dataclasses.is_dataclass(chapter.CONFIG)
    assert issubclass(chapter.TRAINER, Trainer)
    assert chapter.CONFIG.__doc__.strip(), "the config's first docstring line is the CLI's summary"
    for hook in REQUIRED_HOOKS:
        assert getattr(chapter.TRAINER, hook) is not getattr(Trainer, hook), f"{name}: {hook}"
    chapter.CONFIG.from_profile("quick")  # the defaults are a valid config
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    flags = set(re.findall(r"^  (--[a-z0-9-]+)", capsys.readouterr().out, flags=re.M))
    fields = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(chapter.CONFIG)}
    assert flags == fields  # (argparse's own -h, --help aside)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_registered_recipe_has_hardening_rows(name):
    assert name in test_hardening.TINY_RUNS, f"add a tiny CLI run of {name!r} to TINY_RUNS"
    assert recipe(name).CONFIG in test_hardening.RECIPE_CONFIGS.values()


def _package_source() -> str:
    return "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_flag_of_a_recipe_is_read_by_the_package(name):
    """No dead flag: every field of a recipe's config is read somewhere (``.field`` or
    ``getattr(..., "field"``); and the mixins' fields reach only the recipes that use them."""
    source = _package_source()
    for f in dataclasses.fields(recipe(name).CONFIG):
        read = f".{f.name}" in source or f'"{f.name}"' in source
        assert read, f"{name}: the field {f.name!r} is never read"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_mixin_fields_only_where_the_recipe_uses_them(name):
    """A mixin's fields reach a recipe only where it uses them: FrozenLake's where the recipe runs
    the lake (``RECIPE_ENVS``); the critic's, all of them, where ``'gae'`` trains a critic (the
    :class:`AgentTrainer` builds one when ``uses_critic``)."""
    config = recipe(name).CONFIG
    names = {f.name for f in dataclasses.fields(config)}
    base = {f.name for f in dataclasses.fields(RLConfig)}
    lake = {f.name for f in dataclasses.fields(FrozenLakeFields)} - base
    critic = {f.name for f in dataclasses.fields(CriticFields)} - base
    assert lake == {"map_size", "is_slippery", "p_frozen"}
    assert "gamma" in critic and "vf_coef" in critic
    if "frozenlake" in getattr(config, "RECIPE_ENVS", ()):
        assert lake <= names
    else:
        assert not names & lake
    if names & (critic - {"gamma"}):  # (GiGPO has a gamma of its own, for its step returns)
        assert critic <= names
        assert issubclass(recipe(name).TRAINER, AgentTrainer)
        assert config.from_profile("quick", advantage_estimator="gae").uses_critic
    else:
        assert not issubclass(config, CriticFields)
    # two base chapters: single-turn GRPO, multi-turn agents
    assert issubclass(config, GRPOConfig) != issubclass(config, AgentFields)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_field_mixin_changes_no_default_of_the_base_it_joins(name):
    """A field mixin (a dataclass over RLConfig) redeclares RLConfig's fields with RLConfig's
    defaults: placed before the base chapter among a config's bases, it would silently undo the
    agent or GRPO defaults (the model's size, the learning rate). Every default of RLConfig's
    fields is the one the recipe's own chain of bases gives, mixins left out."""
    config = recipe(name).CONFIG
    chapter = GRPOConfig if issubclass(config, GRPOConfig) else AgentFields
    own = [k for k in config.__mro__ if k is config or issubclass(k, chapter)]
    if len(own) < 2:
        return  # the base chapter itself
    for field in dataclasses.fields(RLConfig):
        got = next(f for f in dataclasses.fields(config) if f.name == field.name)
        if any(field.name in vars(k).get("__annotations__", {}) for k in own[:1]):
            continue  # the recipe sets it itself
        want = next(f for f in dataclasses.fields(own[1]) if f.name == field.name)
        if want.default is not dataclasses.MISSING:
            assert got.default == want.default, f"{name}: {field.name} is {got.default!r}"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_registered_recipe_has_a_tiny_config(name):
    """``testkit.tiny(name)``, the tiny run the unit tests build on, exists for every recipe."""
    assert name in TINY_RECIPE, f"add a row for {name!r} to testkit.TINY_RECIPE"
    config = tiny(name)
    assert type(config) is recipe(name).CONFIG
    assert (config.hidden_size, config.num_hidden_layers, config.device) == (32, 1, "cpu")


def _chapter_fields() -> set[str]:
    """The fields only a chapter's own config declares (not RLConfig's, nor a shared mixin's)."""
    shared = {
        f.name
        for cls in (RLConfig, AgentFields, CriticFields, FrozenLakeFields, HouseholdFields)
        for f in dataclasses.fields(cls)
    }
    declared = {f.name for name in RECIPES for f in dataclasses.fields(recipe(name).CONFIG)}
    return declared - shared


@pytest.mark.parametrize("module", ["bounds.py", "distributed.py"])
def test_the_machinery_names_no_chapter_field(module):
    """A chapter's bounds, memory needs and data-parallel limits live in its own config
    (``param(..., high=, why=)``, ``memory_needs``, ``check_data_parallel``): the mechanism
    names none of its fields, so a new chapter never edits it."""
    text = (PACKAGE / module).read_text()
    named = sorted(n for n in _chapter_fields() if re.search(rf"""(\.|["'`]){n}\b""", text))
    assert not named, f"{module} names chapter fields: {named}"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_no_chapter_overrides_an_underscored_method(name):
    trainer = recipe(name).TRAINER
    for cls in trainer.__mro__:
        if cls is Trainer or not issubclass(cls, Trainer):
            continue
        for attr in vars(cls):
            if attr.startswith("_") and not attr.startswith("__"):
                assert not hasattr(Trainer, attr), f"{cls.__name__} overrides {attr}"


def test_the_hook_table_lists_every_public_hook():
    documented = set(re.findall(r"``(?:self\.)?(\w+)", _train_doc()))
    public = {
        n for n, v in vars(Trainer).items() if not n.startswith("_") and n not in _NOT_HOOKS
    }
    assert public <= documented, sorted(public - documented)


#: Trainer members that are the loop or its machinery, not hooks a recipe overrides.
_NOT_HOOKS = {
    "train", "rl_step", "sft", "save_checkpoint", "load_checkpoint", "summary", "is_complete",
    "num_parameters", "chat", "optimizer_step", "mixed_precision", "make_ref_model",
}  # fmt: skip


def _train_doc() -> str:
    import agentic_rl.train as train

    return train.__doc__


def test_the_rl_step_fits_on_a_page():
    """The loop the GRPO chapter prints: at most 60 lines, and it reads as the pseudocode."""
    source = inspect.getsource(Trainer.rl_step)
    assert len(source.splitlines()) <= 60
    nodes = [
        n
        for n in ast.walk(ast.parse(textwrap.dedent(source)))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    ]
    calls = [n.func.attr for n in sorted(nodes, key=lambda n: (n.lineno, n.col_offset))]
    order = ["rollout", "compute_advantages", "filter_rows", "minibatches", "compute_loss",
             "optimizer_step", "rollout_metrics"]  # fmt: skip
    positions = [max(i for i, call in enumerate(calls) if call == c) for c in order]
    assert positions == sorted(positions), calls


def _imports() -> dict[str, set[str]]:
    """Each package module's imports of other package modules, at any depth of its code (an
    import inside a function closes a circle as surely as one at the top)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: set() for name in names}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = [node.module] if node.module else []
                target = ".".join(base + module) if node.level else node.module
                targets = [target, *(f"{target}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in names and t != name}
    return graph


def test_the_import_graph_has_no_circle():
    """errors.py is the ground floor: no module needs one that needs it back."""
    graph = _imports()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    circles = sorted((a, b) for a in graph for b in graph[a] if reaches(b, a))
    assert not circles, f"import circles through these arrows: {circles}"
    assert not graph["agentic_rl.errors"], "errors.py imports nothing from the package"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_hooks_keep_one_signature(name):
    """``make_task(self, split="train", ...)`` everywhere, and one ``play`` for the multi-turn
    chapters: another split, a reward token or the tool off travels in ``envs``."""
    trainer = recipe(name).TRAINER
    params = list(inspect.signature(trainer.make_task).parameters.values())
    assert [p.name for p in params[:2]] == ["self", "split"] and params[1].default == "train"
    assert all(p.kind is p.KEYWORD_ONLY for p in params[2:]), params
    if issubclass(trainer, AgentTrainer):
        def shape(play):
            params = inspect.signature(play).parameters.values()
            return [(p.name, p.kind, p.default) for p in params]

        assert shape(trainer.play) == shape(AgentTrainer.play), name
