"""The sandbox's attack table again, with the zygote started by a second Python build.

The reliability review found that which escapes open depends on the interpreter: Debian's Python
hands out a fresh ``_posixsubprocess.fork_exec`` where pyenv's does not, and the audit hook's
coverage differs between builds. The boundary must not depend on that: every attack of
``test_sandbox.py``'s table (and the two ctypes hook bypasses of the review) is run here by a
zygote of another Python build found on the machine (the system's ``/usr/bin/python3*`` when the
tests run under another one), with bubblewrap where it works and with no launcher at all.
Skipped, saying so, where the machine has one Python build only.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
import test_sandbox
from test_sandbox import ADVERSARIAL, REPORT_CTYPES, SUBCLASS_CTYPES
from testkit import jail_is_expected

from agentic_rl import jail
from agentic_rl.sandbox import Pool


def _version(python: str) -> tuple[int, int] | None:
    command = [python, "-I", "-S", "-c", "import sys; print(*sys.version_info[:2])"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return tuple(map(int, done.stdout.split())) if done.returncode == 0 else None


def other_python() -> str | None:
    """A Python build other than the one the zygotes use by default, of a version the sandbox
    supports (this one's major.minor: the zygote's script is written for it)."""
    ours = os.path.realpath(jail.interpreter())
    for path in sorted(glob.glob("/usr/bin/python3*") + glob.glob("/usr/local/bin/python3*")):
        real = os.path.realpath(path)
        if real == ours or not os.access(real, os.X_OK) or real.endswith("-config"):
            continue
        if _version(real) == tuple(sys.version_info[:2]):
            return real
    return None


OTHER = other_python()
pytestmark = pytest.mark.skipif(OTHER is None, reason="one Python build only on this machine")


@pytest.fixture(scope="module", params=["bubblewrap", "none"])
def pool(request):
    """A pool whose zygotes run the other Python build, jailed by bubblewrap or not at all."""
    patch = pytest.MonkeyPatch()
    patch.setattr(jail, "interpreter", lambda: OTHER)
    if request.param == "bubblewrap":
        if not jail_is_expected():
            patch.undo()
            pytest.skip("no bubblewrap jail here")
    else:
        none = jail.Launcher("none", jail._layers("none", False), os.geteuid() == 0)
        patch.setattr(jail, "launcher", lambda: none)
        patch.setenv("AGENTIC_RL_ALLOW_UNCONTAINED_CODE", "1")
    limits = dict(memory_mb=128, max_output_bytes=test_sandbox.CAP)
    with Pool(2, timeout_s=test_sandbox.TIMEOUT_S, **limits) as p:
        yield p
    patch.undo()


probe = test_sandbox.probe  # the same fixture: an empty folder a snippet must not write into


def test_the_zygote_runs_the_other_build(pool):
    r = pool.run("import sys; print(sys.executable, *sys.version_info[:3])")
    assert r.stdout.split()[0] == OTHER, r
    assert pool.run("print(6 * 7)").stdout == "42\n"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the one for running without bubblewrap)
@pytest.mark.parametrize(
    "code, check", [c[1:] for c in ADVERSARIAL], ids=[c[0] for c in ADVERSARIAL]
)
def test_adversarial_program_is_contained(pool, probe, code, check):
    test_sandbox.test_adversarial_program_is_contained(pool, probe, code, check)


@pytest.mark.parametrize("attack", [REPORT_CTYPES, SUBCLASS_CTYPES], ids=["frame", "subclasses"])
def test_report_ctypes_hook_bypass_is_contained(pool, probe, attack):
    test_sandbox.test_report_ctypes_hook_bypass_is_contained(pool, probe, attack)
