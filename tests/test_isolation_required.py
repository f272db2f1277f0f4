"""Model-written code runs only inside bubblewrap (issue 41, part 1): without a working one, the
sandbox and the ReTool recipe refuse to start, in one line naming what is missing and how to
install it, unless the user opts in by name; and a run's summary records the isolation it had.

The machine's launcher is replaced by a fake one (``unshare`` or none) for these tests.
"""

from __future__ import annotations

import json
import warnings

import pytest

from agentic_rl import jail, sandbox
from agentic_rl.errors import IsolationError, RunError


@pytest.fixture(params=["unshare", "none"])
def no_bubblewrap(request, monkeypatch):
    """This machine as one where bubblewrap is missing: zygotes start plainly (``none``, which
    works anywhere), while the boundary check sees the fallback named by the parameter."""
    weak = jail.Launcher(request.param, jail._layers(request.param, False), False)
    monkeypatch.setattr(jail, "launcher", lambda: weak)
    monkeypatch.setattr(jail.Launcher, "command", _plain_command)
    monkeypatch.setattr(jail.shutil, "which", lambda tool: None if tool == "bwrap" else "/x")
    monkeypatch.delenv(jail.ALLOW_UNCONTAINED, raising=False)
    return weak


def _plain_command(self, script, base):
    return [jail.interpreter(), "-I", "-S", *([script] if script else ["-c", ""])], None


def test_a_pool_refuses_to_run_model_code_without_bubblewrap(no_bubblewrap):
    with pytest.raises(IsolationError) as err:
        sandbox.Pool(1)
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, RunError)
    assert "bubblewrap is not installed" in message and "apt-get install bubblewrap" in message
    assert "allow_uncontained_code" in message and jail.ALLOW_UNCONTAINED in message
    with pytest.raises(IsolationError):
        sandbox.run("print(1)")


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_an_explicit_opt_in_runs_it_and_says_so(no_bubblewrap, monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv(jail.ALLOW_UNCONTAINED, "1")
    with pytest.warns(RuntimeWarning, match="UNCONTAINED"):
        with sandbox.Pool(1, allow_uncontained=how == "argument") as pool:
            assert pool.run("print(6 * 7)").stdout == "42\n"
            assert "no mount namespace" in pool.isolation


def test_the_opt_in_is_exactly_1(no_bubblewrap, monkeypatch):
    monkeypatch.setenv(jail.ALLOW_UNCONTAINED, "yes")
    with pytest.raises(IsolationError):
        sandbox.Pool(1)


def test_bubblewrap_that_cannot_start_is_named(no_bubblewrap, monkeypatch):
    monkeypatch.setattr(jail.shutil, "which", lambda tool: "/usr/bin/" + tool)
    assert "cannot create its namespaces here" in jail.boundary_problem()


def _retool_argv():
    import test_hardening

    return test_hardening._with(test_hardening.TINY_RUNS["retool"], "--max-steps", "1")


def test_the_retool_recipe_refuses_before_any_compute(no_bubblewrap, capsys):
    from agentic_rl.cli import main

    assert main(["retool", *_retool_argv()]) not in (0, None)
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: allow_uncontained_code:") and "\n" not in err
    assert "apt-get install bubblewrap" in err


def test_with_the_opt_in_the_summary_records_the_isolation(no_bubblewrap, tmp_path, capsys):
    from agentic_rl.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        main(["retool", *_retool_argv(), "--allow-uncontained-code", "true",
              "--output-dir", str(tmp_path)])  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["sandbox"]["launcher"] == no_bubblewrap.kind
    assert "no mount namespace" in summary["sandbox"]["layers"]
    assert summary["config"]["allow_uncontained_code"] is True


@pytest.mark.skipif(jail.launcher().kind != "bubblewrap", reason="no working bubblewrap here")
def test_here_the_summary_says_bubblewrap(tmp_path):
    from agentic_rl.cli import main

    main(["retool", *_retool_argv(), "--output-dir", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["sandbox"]["launcher"] == "bubblewrap"
    assert "mount namespace (read-only" in summary["sandbox"]["layers"]
