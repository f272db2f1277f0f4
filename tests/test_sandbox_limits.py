"""Per-snippet resource control in the sandbox (issue 41, part 2; reliability review 2, failure 3).

``RLIMIT_AS`` counts per process, so a snippet that could start children would hold ``memory_mb``
in each. Snippets get ``RLIMIT_NPROC`` 0: the kernel then refuses every fork and thread start,
even with the audit hook taken out, for every user but the real root (whom it exempts: a
container's root in a user namespace). And bubblewrap's tmpfs counts bytes, not inodes: the zygote
counts the snippet's files and stops it past ``MAX_FILES``. Checked with bubblewrap, and with no
launcher at all (the weakest setup, which model-written code gets only by opting in).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest
from testkit import jail_is_expected

from agentic_rl import jail, sandbox

JAIL_EXPECTED = jail_is_expected()
needs_jail = pytest.mark.skipif(not JAIL_EXPECTED, reason="no bubblewrap jail here")
FILES_ERROR = f"FileLimitError: killed after {sandbox.MAX_FILES} files"
FLOOD = "for i in range(10**6):\n    open(f'f{i}', 'w').close()"


@pytest.fixture(params=["bubblewrap", "none"])
def launcher(request, monkeypatch):
    """The launcher the Pools of the test use: the machine's bubblewrap, or none at all."""
    if request.param == "bubblewrap":
        if not JAIL_EXPECTED:
            pytest.skip("no bubblewrap jail here")
        found = jail.launcher()
        assert found.kind == "bubblewrap", found
        return found
    none = jail.Launcher("none", jail._layers("none", False), os.geteuid() == 0)
    monkeypatch.setattr(jail, "launcher", lambda: none)
    # Without bubblewrap the Pool refuses model-written code unless opted in; these are ours.
    monkeypatch.setenv("AGENTIC_RL_ALLOW_UNCONTAINED_CODE", "1")
    return none


def exempt(launcher: jail.Launcher) -> bool:
    """The snippet runs as the real root (the kernel's uid 0, in a user namespace or not), whom
    RLIMIT_NPROC exempts: a root trainer whose snippets cannot become nobody."""
    return os.geteuid() == 0 and not launcher.nobody


@pytest.fixture(scope="module")
def unhooked_module(tmp_path_factory):
    """A copy of the sandbox without the audit hook: only the kernel's checks remain."""
    source = pathlib.Path(sandbox.__file__).read_text()
    patched = source.replace("    sys.addaudithook(_audit_hook(workdir))\n", "    pass\n")
    assert patched != source
    path = tmp_path_factory.mktemp("unhooked_limits") / "sandbox_unhooked_limits.py"
    path.write_text(patched)
    os.chmod(path.parent, 0o755)
    spec = importlib.util.spec_from_file_location("sandbox_unhooked_limits", path)
    module = sys.modules["sandbox_unhooked_limits"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    del sys.modules["sandbox_unhooked_limits"]


# (_thread is what threading starts threads with: nobody cannot import threading where the
# standard library is unreadable to others, as with this machine's pyenv in root's home.)
NO_THREAD = (
    "import _thread, resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC))\n"
    "_thread.start_new_thread(print, ())"
)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the one for running without bubblewrap)
def test_snippet_can_start_no_thread(launcher):
    if exempt(launcher):
        pytest.skip("the snippet is the real root here, which RLIMIT_NPROC exempts")
    with sandbox.Pool(1, timeout_s=5) as pool:
        r = pool.run(NO_THREAD)
        assert r.stdout == "(0, 0)\n", r
        assert r.error == "RuntimeError: can't start new thread", r
        assert pool.run("print('alive')").stdout == "alive\n"


FORK = (
    "import os\ntry:\n    pid = os.fork()\nexcept OSError as err:\n    print(err.errno)\n"
    "else:\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n    print('forked')"
)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_kernel_refuses_fork_without_the_audit_hook(launcher, unhooked_module):
    if exempt(launcher):
        pytest.skip("the snippet is the real root here, which RLIMIT_NPROC exempts")
    with unhooked_module.Pool(1, timeout_s=5) as pool:
        r = pool.run(FORK)
        assert r.stdout == "11\n", r  # EAGAIN, from the kernel: no hook saw it
        # A thread is a process to the kernel's count too.
        assert pool.run(NO_THREAD).error == "RuntimeError: can't start new thread"


@needs_jail
def test_file_flood_is_stopped_and_the_pool_goes_on():
    with sandbox.Pool(1, timeout_s=10) as pool:
        r = pool.run(FLOOD)
        assert r.error == FILES_ERROR, r
        assert r.exit_code is None and not r.timed_out
        assert r.wall_s < 5, r  # well before the deadline (here: about 0.05 s)
        r = pool.run("import os; print(os.listdir('.')); open('x', 'w').write('ok')")
        assert r.ok and r.stdout == "[]\n", r


@needs_jail
def test_max_files_is_allowed():
    code = f"for i in range({sandbox.MAX_FILES}):\n    open(f'f{{i}}', 'w').close()\nprint('made')"
    with sandbox.Pool(1, timeout_s=10) as pool:
        r = pool.run(code)
        assert r.ok and r.stdout == "made\n", r


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_snippet_writes_a_few_files(launcher):
    code = (
        "import os\nos.mkdir('sub')\nfor name in ('a', 'b', 'sub/c'):\n"
        "    with open(name, 'w') as fh:\n        fh.write(name * 3)\n"
        "print(sorted(os.listdir('.')), open('sub/c').read())"
    )
    with sandbox.Pool(1, timeout_s=5) as pool:
        r = pool.run(code)
        assert r.ok and r.stdout == "['a', 'b', 'sub'] sub/csub/csub/c\n", r


@needs_jail
def test_the_jail_does_not_show_the_host_name():
    # the probe's §9: the jail showed the host's hostname; its own UTS namespace names it
    with sandbox.Pool(1, timeout_s=5) as pool:
        assert pool.run("import os; print(os.uname().nodename)").stdout == "sandbox\n"
    assert os.uname().nodename != "sandbox"
