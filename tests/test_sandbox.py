"""The code sandbox (``agentic_rl.sandbox``): normal behaviour, and an adversarial suite.

Every adversarial program is bounded (``timeout_s`` 1 s, ``memory_mb`` 128, 4 KB of output) and
must come back as a :class:`~agentic_rl.sandbox.Result` with ``error`` set, while this process, its
parent and the files around it stay untouched. Programs that try to escape aim at a world-writable
probe folder, so that only the sandbox's guards (not file permissions) can stop them: a file in it
after the run is an escape. The namespace layer is also tested alone, with the audit hook taken out,
and so are the kernel's layers (the bubblewrap jail, its seccomp filter and disk quota) against
every attack of the reliability review, from a fresh interpreter that may import ``ctypes``.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace

import pytest
from testkit import BWRAP, jail_is_expected

from agentic_rl import sandbox
from agentic_rl.sandbox import Pool, Result

TIMEOUT_S = 1.0
CAP = 4096
HAS_NAMESPACES = "PID and IPC namespaces" in sandbox.isolation()
# Root without CAP_SYS_ADMIN (a container's root): bubblewrap works inside a user namespace, where
# the zygote and its snippets are that namespace's root (no other user is mapped: no nobody).
IN_USER_NAMESPACE = "user namespace" in sandbox.isolation()
# ... as are snippets started through util-linux's unshare --map-root-user (the fallback).
NAMESPACE_ROOT = IN_USER_NAMESPACE and sandbox.run("import os; print(os.getuid())").stdout == "0\n"


@pytest.fixture(scope="module")
def pool():
    with Pool(2, timeout_s=TIMEOUT_S, memory_mb=128, max_output_bytes=CAP) as p:
        yield p


@pytest.fixture
def probe():
    """A world-writable folder outside the sandbox; it must stay empty."""
    folder = os.path.realpath(tempfile.mkdtemp(prefix="agentic_rl_sandbox_probe_"))
    os.chmod(folder, 0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (a Pool's folder is in its zygotes' command line,
    and so in their forked children's)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if text.encode() in fh.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def zygote_pid(pool, index: int = 0) -> int:
    """The zygote's own process (its launcher's child, where a launcher starts it)."""
    started = pool._zygotes[index].proc.pid
    if pool._launcher.kind == "none":
        return started
    return next(pid for pid in processes_mentioning(pool._base) if parent(pid) == started)


def zygote_processes(pool) -> set[int]:
    """A Pool's zygotes, and their launchers (bwrap or unshare) where one starts them: any other
    process that mentions the Pool's folder is a snippet's, or something a snippet left."""
    started = {zygote.proc.pid for zygote in pool._zygotes}
    if pool._launcher.kind == "none":
        return started
    return started | {pid for pid in processes_mentioning(pool._base) if parent(pid) in started}


# ---- Normal behaviour ----


def test_run_prints_the_product():
    r = sandbox.run("print(347*29)")
    assert r == Result("10063\n", "", 0, False, False, r.wall_s, None)
    assert r.ok and 0 < r.wall_s < TIMEOUT_S


def test_stderr_exit_codes_and_exceptions_are_reported(pool):
    r = pool.run("import sys; print('out'); print('warn', file=sys.stderr)")
    assert (r.stdout, r.stderr, r.ok) == ("out\n", "warn\n", True)
    r = pool.run("import sys; sys.exit(3)")
    assert (r.exit_code, r.error, r.ok) == (3, "exit code 3", False)
    assert pool.run("import sys; sys.exit(0)").ok
    r = pool.run("raise ValueError('boom')")
    assert (r.exit_code, r.error) == (1, "ValueError: boom")
    assert r.stderr.startswith("Traceback") and 'File "<snippet>", line 1' in r.stderr
    r = pool.run("print(")
    assert r.exit_code == 1 and r.error.startswith("SyntaxError: '(' was never closed")


def test_output_is_truncated_at_the_cap():
    with Pool(1, max_output_bytes=10) as p:
        r = p.run("print('x' * 5)")
        assert (r.stdout, r.truncated, r.ok) == ("xxxxx\n", False, True)
        r = p.run("print('x' * 100)")
        assert (r.stdout, r.truncated, r.ok) == ("x" * 10, True, False)
        assert r.error.startswith("OutputLimitError")
        r = p.run("import sys; sys.stderr.write('e' * 11)")
        assert (r.stderr, r.truncated) == ("e" * 10, True)


def test_wall_time_and_output_before_a_timeout(pool):
    r = pool.run("import time; time.sleep(0.2); print('slept')")
    assert r.ok and r.stdout == "slept\n" and 0.2 <= r.wall_s < TIMEOUT_S
    r = pool.run("import time; print('started'); time.sleep(60)")
    assert r.timed_out and r.stdout == "started\n" and TIMEOUT_S <= r.wall_s < TIMEOUT_S + 0.5


def test_snippets_can_use_their_folder_and_the_preloaded_modules(pool):
    code = (
        "import fractions, statistics, math\n"
        "open('notes.txt', 'w').write(str(fractions.Fraction(1, 3)))\n"
        "print(open('notes.txt').read(), statistics.mean([1, 2]), math.comb(5, 2))"
    )
    assert pool.run(code).stdout == "1/3 1.5 10\n"
    r = pool.run("import random; print(random.random())")
    assert r.stdout != pool.run("import random; print(random.random())").stdout  # reseeded


def test_folder_is_fresh_and_deleted_afterwards(pool):
    first = pool.run("import os; print(os.getcwd(), os.listdir('.')); open('x', 'w')").stdout
    second = pool.run("import os; print(os.getcwd(), os.listdir('.'))").stdout
    (folder1, listing1), (folder2, listing2) = (s.split(" ", 1) for s in (first, second))
    assert folder1 != folder2 and listing1 == listing2 == "[]\n"
    assert not os.path.exists(folder1)


def test_one_off_run_leaves_no_folder():
    folder = sandbox.run("import os; print(os.getcwd())").stdout.strip()
    assert folder and not os.path.exists(folder) and not os.path.exists(os.path.dirname(folder))


def test_environment_is_empty(monkeypatch):
    monkeypatch.setenv("AGENTIC_RL_TEST_SECRET", "hunter2")
    r = sandbox.run("import os; print(dict(os.environ))")
    assert r.ok and r.stdout == "{}\n"


def test_root_runs_snippets_as_nobody():
    r = sandbox.run("import os; print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())")
    if os.geteuid() == 0 and not IN_USER_NAMESPACE:
        assert r.stdout == "65534 65534 65534 []\n"
        assert "runs as nobody" in sandbox.isolation()
    else:
        assert r.ok


def test_isolation_names_the_layers():
    text = sandbox.isolation()
    assert all(layer in text for layer in ("own session", "rlimits", "audit hook", "empty env"))
    assert ("PID and IPC namespaces" in text) != ("no PID namespace" in text)
    assert ("empty network namespace" in text) != ("no network namespace" in text)


def test_map_keeps_the_order():
    with Pool(2) as p:
        results = p.map([f"print({i} * {i})" for i in range(20)])
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(20)]
    assert all(r.ok for r in results)


def test_map_runs_concurrently():
    with Pool(2, timeout_s=3) as p:
        p.map(["pass", "pass"])
        start = time.monotonic()
        results = p.map(["import time; time.sleep(0.5)"] * 4)
        elapsed = time.monotonic() - start
    assert all(r.ok for r in results)
    assert elapsed < 1.7, f"4 x 0.5 s on 2 workers took {elapsed:.2f} s (serial: 2 s)"


def test_pool_continues_after_a_timeout(pool):
    results = pool.map(["while True: pass", "print('next')", "print('and next')"])
    assert results[0].timed_out and results[1].stdout == "next\n" and results[2].ok


def test_pool_survives_a_killed_zygote():
    with Pool(1, timeout_s=5) as p:
        zygote = p._zygotes[0].proc.pid
        threading.Timer(0.3, os.kill, (zygote_pid(p), signal.SIGKILL)).start()
        start = time.monotonic()
        r = p.run("import time; time.sleep(4)")
        assert time.monotonic() - start < 2
        assert not r.ok and r.exit_code is None and r.error.startswith("sandbox worker failed")
        assert p.run("print('back')").stdout == "back\n"
        new = p._zygotes[0].proc.pid
        assert new != zygote
        # The orphaned snippet died with its zygote (the zygote was PID 1 of their namespace),
        # nothing else is left.
        time.sleep(0.2)
        if HAS_NAMESPACES:
            assert set(processes_mentioning(p._base)) == zygote_processes(p)
        os.kill(new, signal.SIGKILL)  # killed while idle: replaced before the next snippet
        p._zygotes[0].proc.wait()
        assert p.run("print('again')").stdout == "again\n"


def test_close_leaves_no_process_folder_or_zombie():
    p = Pool(2)
    assert p.run("print(1)").ok
    pids, base, started = zygote_processes(p), p._base, [z.proc.pid for z in p._zygotes]
    assert set(processes_mentioning(base)) == pids
    p.close()
    p.close()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in started)  # reaped: no zombies
    # (A zygote under a launcher is the launcher's child: once that is gone, init reaps it.)
    deadline = time.monotonic() + 2
    while any(os.path.exists(f"/proc/{pid}") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    assert processes_mentioning(base) == [] and not os.path.exists(base)
    with pytest.raises(ValueError, match="closed"):
        p.run("print(1)")


def test_a_killed_trainer_leaves_nothing_behind():
    # The trainer dies (SIGKILL: no clean-up) while a snippet sleeps: its zygotes see the end of
    # their input, the snippet dies at its deadline, and the last zygote deletes the Pool's folder.
    trainer = (
        "import os, threading, time\nfrom agentic_rl import sandbox\n"
        "p = sandbox.Pool(2, timeout_s=1)\nprint(p._base, flush=True)\n"
        "threading.Thread(target=p.run, args=('import time; time.sleep(60)',)).start()\n"
        "time.sleep(0.3)\nos.kill(os.getpid(), 9)"
    )
    command = [sys.executable, "-c", trainer]
    out = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    base = out.stdout.split()[0]
    deadline = time.monotonic() + TIMEOUT_S + 3
    while (processes_mentioning(base) or os.path.exists(base)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(base) == [] and not os.path.exists(base)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sandbox.run(b"print(1)"), "code must be a str, got bytes"),
        (lambda: sandbox.run(None), "code must be a str, got NoneType"),
        (lambda: sandbox.run("1", timeout_s=0), "timeout_s must be"),
        (lambda: sandbox.run("1", timeout_s=-1), "timeout_s must be"),
        (lambda: sandbox.run("1", timeout_s=float("nan")), "timeout_s must be"),
        (lambda: sandbox.run("1", timeout_s="1"), "timeout_s must be"),
        (lambda: sandbox.run("1", timeout_s=True), "timeout_s must be"),
        (lambda: sandbox.run("1", memory_mb=16), "memory_mb must be an int >= 64"),
        (lambda: sandbox.run("1", memory_mb=128.0), "memory_mb must be an int"),
        (lambda: sandbox.run("1", max_output_bytes=0), "max_output_bytes must be an int >= 1"),
        (lambda: Pool(0), "workers must be an int >= 1"),
        (lambda: Pool(1.5), "workers must be an int >= 1"),
    ],
)
def test_bad_arguments_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_map_checks_every_snippet_first(pool):
    with pytest.raises(ValueError, match="code must be a str, got int"):
        pool.map(["print(1)", 2])


# ---- Adversarial programs ----


def timed_out(r: Result) -> None:
    assert r.timed_out and r.exit_code is None and r.error.startswith("TimeoutError")
    assert TIMEOUT_S <= r.wall_s < TIMEOUT_S + 0.5


def blocked(event: str):
    def check(r: Result) -> None:
        assert not r.ok and r.error == f"blocked: {event}", r.error

    return check


def refused(r: Result) -> None:
    """Refused one way or another: by the audit hook, or earlier (e.g. ``import pty`` fails when the
    snippet's user cannot read the standard library)."""
    assert not r.ok and r.error and not r.timed_out, r


def refused_unless_namespace_root(r: Result) -> None:
    """As root of a user namespace (see NAMESPACE_ROOT), setuid(0) changes nothing."""
    if not NAMESPACE_ROOT:
        refused(r)


def failed(prefix: str):
    def check(r: Result) -> None:
        assert not r.ok and r.error.startswith(prefix), r.error

    return check


def flooded(stream: str):
    def check(r: Result) -> None:
        assert r.truncated and r.error.startswith("OutputLimitError") and r.exit_code is None
        assert len(getattr(r, stream)) == CAP and r.wall_s < TIMEOUT_S

    return check


DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(0.5)
        open("PROBE/daemon", "w").write("escaped")
    os._exit(0)
"""

# fmt: off
ADVERSARIAL = [
    ("busy loop", "while True: pass", timed_out),
    ("sleep forever", "import time; time.sleep(10**6)", timed_out),
    ("SIGTERM ignored", ("import signal\nfor s in (signal.SIGTERM, signal.SIGINT):\n"
                         "    signal.signal(s, signal.SIG_IGN)\nwhile True: pass"), timed_out),
    ("fork bomb", "import os\nwhile True: os.fork()", blocked("os.fork")),
    ("daemon (double fork + setsid)", DAEMON, blocked("os.fork")),
    ("subprocess shell", "import subprocess; subprocess.run('touch PROBE/x', shell=True)", refused),
    ("os.system", "import os; os.system('touch PROBE/x')", blocked("os.system")),
    ("os.popen", "import os; os.popen('touch PROBE/x').read()", refused),
    ("os.exec", "import os; os.execv('/bin/touch', ['touch', 'PROBE/x'])", blocked("os.exec")),
    ("os.posix_spawn", "import os; os.posix_spawn('/bin/touch', ['touch', 'PROBE/x'], {})",
     blocked("os.posix_spawn")),
    ("pty.spawn", "import pty; pty.spawn(['/bin/sh', '-c', 'touch PROBE/x'])", refused),
    ("multiprocessing", "import multiprocessing as m\np = m.Process(target=print)\np.start()",
     refused),
    ("ctypes libc system", "import ctypes; ctypes.CDLL(None).system(b'touch PROBE/x')",
     blocked("import ctypes")),
    ("ctypes through the sandbox's own globals",
     "import sys; sys._getframe(1).f_globals['_LIBC'].system(b'touch PROBE/x')", refused),
    ("unaudited fork_exec", "import sys; sys.modules['_posixsubprocess'].fork_exec", refused),
    ("pidfd signal to the test process",
     "import os, signal; signal.pidfd_send_signal(os.pidfd_open(TESTPID), 0)", refused),
    ("memory bomb: bytearray", "x = bytearray(1 << 30)", failed("MemoryError")),
    ("memory bomb: growing list", "x = []\nwhile True: x.append(' ' * 10**6)",
     failed("MemoryError")),
    ("stdout flood", "while True: print('x' * 10**6)", flooded("stdout")),
    ("stderr flood", "import sys\nwhile True: sys.stderr.write('x' * 10**5)", flooded("stderr")),
    ("huge line without newline", "import sys; sys.stdout.write('y' * 10**7)", flooded("stdout")),
    ("write to PROBE", "open('PROBE/x', 'w').write('escaped')", blocked("open PROBE/x")),
    ("write to the home folder", "open('/root/agentic_rl_sandbox_escape', 'w')",
     blocked("open /root/agentic_rl_sandbox_escape")),
    ("../ escape", "import os\nrel = os.path.relpath('PROBE/x')\nopen(rel, 'w').write('x')",
     blocked("open PROBE/x")),
    ("symlink trick", "import os; os.symlink('PROBE/x', 'link'); open('link', 'w')",
     blocked("os.symlink")),
    ("os.open for writing", "import os; os.open('PROBE/x', os.O_CREAT | os.O_WRONLY)",
     blocked("open PROBE/x")),
    ("rename out of the folder", "open('f', 'w').close()\nimport os; os.rename('f', 'PROBE/x')",
     blocked("os.rename PROBE/x")),
    ("directory fd for dir_fd tricks", "import os; fd = os.open('.', os.O_RDONLY)",
     failed("blocked: open /")),
    ("read /proc/self/environ", "print(open('/proc/self/environ').read())",
     blocked("open /proc/self/environ")),
    ("read the test process's environ", "print(open('/proc/TESTPID/environ').read())",
     blocked("open /proc/TESTPID/environ")),
    ("read /proc/1/cmdline", "print(open('/proc/1/cmdline').read())",
     blocked("open /proc/1/cmdline")),
    ("read /etc/shadow", "print(open('/etc/shadow').read())", blocked("open /etc/shadow")),
    ("read this test file", "print(open('TESTFILE').read())", blocked("open TESTFILE")),
    ("kill the parent", "import os; os.kill(os.getppid(), 9)", blocked("os.kill")),
    ("kill the test process", "import os; os.kill(TESTPID, 9)", blocked("os.kill")),
    ("kill the process group", "import os; os.killpg(0, 9)", blocked("os.killpg")),
    ("recursion bomb", "def f(): return f()\nf()", failed("RecursionError")),
    ("deep eval nesting", "eval('(' * 10**5 + ')' * 10**5)", refused),
    ("deep exec nesting", "def f(n): exec('f(n + 1)', {'f': f, 'n': n})\nf(0)",
     failed("RecursionError")),
    ("raise the limits back", ("import resource\n"
     "resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)"),
     blocked("resource.setrlimit")),
    ("many threads", ("import _thread, time\nfor _ in range(1000):\n"
                      "    _thread.start_new_thread(time.sleep, (5,))"), failed("RuntimeError")),
    ("setuid root", "import os; os.setuid(0)", refused_unless_namespace_root),
    ("chroot and write", "import os; os.chroot('/tmp'); open('/x', 'w')", refused),
    ("rebind builtins to fool the hook", ("import builtins\nbuiltins.str = bytes\n"
     "builtins.isinstance = lambda *a: False\nprint(open('/etc/hostname').read())"),
     blocked("open /etc/hostname")),
    ("str subclass path", ("class S(str):\n    def startswith(self, *a): return True\n"
     "    def split(self, *a): return ['tmp']\nopen(S('PROBE/x'), 'w')"), blocked("open PROBE/x")),
    ("sys.addaudithook", "import sys; sys.addaudithook(lambda *a: None)\nimport os; os.fork()",
     blocked("sys.addaudithook")),
    ("find the hook with gc", "import gc; gc.get_objects()", blocked("gc.get_objects")),
    ("craft a code object", "(lambda: 0).__code__.replace(co_consts=(1,))",
     blocked("code.__new__")),
    ("trace the hook", "import sys; sys.settrace(lambda *a: None)", blocked("sys.settrace")),
    ("segfault", "import faulthandler; faulthandler._read_null()",
     failed("killed by signal 11 (Segmentation fault)")),
]
# fmt: on


@pytest.mark.parametrize(
    "code, check", [c[1:] for c in ADVERSARIAL], ids=[c[0] for c in ADVERSARIAL]
)
def test_adversarial_program_is_contained(pool, probe, code, check):
    parent = os.getppid()
    code = code.replace("PROBE", probe).replace("TESTPID", str(os.getpid()))
    code = code.replace("TESTFILE", os.path.abspath(__file__))
    start = time.monotonic()
    r = pool.run(code)
    assert time.monotonic() - start < TIMEOUT_S + 2
    # Name the test's own paths as the table does.
    error = (r.error or "").replace(probe, "PROBE").replace(os.path.abspath(__file__), "TESTFILE")
    check(replace(r, error=error.replace(f"/proc/{os.getpid()}/", "/proc/TESTPID/")))
    assert os.listdir(probe) == [], "the snippet wrote outside its folder"
    assert os.getppid() == parent and os.path.exists(f"/proc/{parent}")
    assert pool.run("print('alive')").stdout == "alive\n"


def test_daemon_does_not_outlive_the_run(pool, probe):
    r = pool.run(DAEMON.replace("PROBE", probe))
    assert r.error == "blocked: os.fork"
    time.sleep(1.0)
    assert os.listdir(probe) == []
    assert set(processes_mentioning(pool._base)) == zygote_processes(pool)


def test_kill_everything_is_blocked(pool):
    # Checked with the harmless signal 0 first; only then the real thing.
    assert pool.run("import os; os.kill(-1, 0)").error == "blocked: os.kill"
    for code in ("import os; os.kill(-1, 9)", "import os; os.killpg(os.getpgid(0), 9)"):
        r = pool.run(code)
        assert r.error.startswith("blocked: os.kill"), r.error
    assert pool.run("print('alive')").ok


def test_network_is_unreachable(pool):
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        tcp.settimeout(0.3)
        udp.settimeout(0.3)
        tcp_port, udp_port = tcp.getsockname()[1], udp.getsockname()[1]
        udp_send = "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b'x', ADDRESS)"
        results = pool.map(
            [
                f"import socket; socket.create_connection(('127.0.0.1', {tcp_port}), timeout=0.5)",
                "import socket\n" + udp_send.replace("ADDRESS", f"('127.0.0.1', {udp_port})"),
                "import _socket; _socket.socket()",
            ]
        )
        for r in results:
            refused(r)
        with pytest.raises(TimeoutError):
            tcp.accept()
        with pytest.raises(TimeoutError):
            udp.recv(10)


def test_snippet_sees_a_fresh_main_module(pool):
    r = pool.run("import __main__, sys; print(sorted(k for k in vars(__main__) if k[0] != '_'))")
    assert r.stdout == "['sys']\n"


# ---- The namespace layer alone (the audit hook taken out of a copy of the module) ----


@pytest.fixture(scope="module")
def unhooked(tmp_path_factory):
    source = pathlib.Path(sandbox.__file__).read_text()
    patched = source.replace("    sys.addaudithook(_audit_hook(workdir))\n", "    pass\n")
    # ... and the kernel's no-fork limit (tests/test_sandbox_limits.py): these tests need a fork.
    unforked = patched.replace("resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))", "pass")
    assert source != patched != unforked
    patched = unforked
    path = tmp_path_factory.mktemp("unhooked") / "sandbox_unhooked.py"
    path.write_text(patched)
    os.chmod(path.parent, 0o755)
    spec = importlib.util.spec_from_file_location("sandbox_unhooked", path)
    module = sys.modules["sandbox_unhooked"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with module.Pool(1, timeout_s=TIMEOUT_S, memory_mb=128) as p:
        assert "PID and IPC namespaces" in p.isolation or not HAS_NAMESPACES
        yield p
    del sys.modules["sandbox_unhooked"]


@pytest.mark.skipif(not HAS_NAMESPACES, reason="no namespaces on this machine")
def test_namespaces_alone_end_daemons_with_the_run(unhooked, probe):
    assert unhooked.run("import os; os.fork()").ok  # no hook: the fork happens
    r = unhooked.run(DAEMON.replace("PROBE", probe))
    assert r.ok, r
    time.sleep(1.0)
    assert os.listdir(probe) == [], "a daemon outlived the run"
    assert set(processes_mentioning(unhooked._base)) == zygote_processes(unhooked)


@pytest.mark.skipif(not HAS_NAMESPACES, reason="no namespaces on this machine")
def test_namespaces_alone_confine_signals(unhooked):
    # Inside the zygote's PID namespace the snippet sees no process but itself and the zygote
    # (PID 1, which kill(-1) skips): check that with the harmless signal 0 before anything real.
    code = "import os\ntry:\n    os.kill({}, 0)\nexcept ProcessLookupError:\n    print('none')"
    for target in (-1, os.getpid(), os.getppid()):
        assert unhooked.run(code.format(target)).stdout == "none\n"
    # Its parent is the zygote, PID 1 of the namespace (the zygote's launcher made it).
    assert unhooked.run("import os; print(os.getppid())").stdout == "1\n"
    unhooked.run("import os; os.kill(-1, 9)")
    unhooked.run("import os; os.killpg(0, 9)")
    assert unhooked.run("print('alive')").ok and os.path.exists(f"/proc/{os.getppid()}")


@pytest.mark.skipif("no network namespace" in sandbox.isolation(), reason="no network namespace")
def test_network_namespace_alone_has_no_network(unhooked):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        r = unhooked.run(
            "import socket\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            "except OSError as err:\n    print(type(err).__name__)"
        )
        if "No module named" in (r.error or ""):
            pytest.skip("the snippet's user cannot import socket here")
        assert r.ok and r.stdout.strip() in {"ConnectionRefusedError", "OSError", "TimeoutError"}
        with pytest.raises(TimeoutError):
            listener.accept()


# ---- The reliability review's attacks (shared/reviews/reliability.md, failures 1, 2, 6, 15, 17)
#
# Each ran against the sandbox before the kernel layers existed, and escaped or leaked. The report's
# repro is the test where one was given. The first group goes through the whole sandbox (the
# audit hook included); the second takes the hook out and execs a fresh interpreter with ctypes,
# an attacker who already got past every Python-level guard: only the kernel's layers remain.

needs_bwrap = pytest.mark.skipif(
    BWRAP is None,
    reason="bubblewrap (bwrap) is not installed: no mount namespace, no seccomp filter",
)
JAILED = "mount namespace" in sandbox.isolation()
REPORT_CTYPES = (  # the report's repro of failure 1, as printed there
    "import sys,os\ng=sys._getframe(1).f_globals;c=g[\"ctypes\"];a=c.c_ssize_t(0);p=c.pointer(a)\n"
    "b=next(id(a)+8+8*k for k in range(1,16) if p[-k]==id(type(a)))\n"
    "p[(id(g[\"_BLOCKED\"])+16-b)//8]=0\nos.system(\"head -c 32 /etc/passwd; touch PROBE/x\")"
)
SUBCLASS_CTYPES = """
import sys, os
seen, todo = {}, [object]
while todo:
    for sub in type.__subclasses__(todo.pop()):
        if sub.__name__ not in seen:
            seen[sub.__name__] = sub
            todo.append(sub)
if 'LP_c_char' not in seen:
    raise LookupError('no ctypes class in reach')
a = seen['c_char'](b'x')
p = seen['LP_c_char'](a)
word = lambda at: int.from_bytes(b''.join(p[at + i] for i in range(8)), 'little')
b = next(id(a) + 8 + 8 * k for k in range(1, 16) if word(-8 * k) == id(type(a)))
at = id(sys._getframe(1).f_globals['_BLOCKED']) + 16 - b
for i in range(8):
    p[at + i] = b'\\0'
os.system('head -c 32 /etc/passwd; touch PROBE/x')
"""


JAIL_EXPECTED = jail_is_expected()


def test_isolation_uses_bubblewrap_where_it_works():
    if not JAIL_EXPECTED:
        pytest.skip("bubblewrap is missing or cannot make namespaces here")
    text = sandbox.isolation()
    assert "mount namespace" in text and "seccomp" in text and "disk quota" in text, text


@pytest.mark.parametrize("attack", [REPORT_CTYPES, SUBCLASS_CTYPES], ids=["frame", "subclasses"])
def test_report_ctypes_hook_bypass_is_contained(pool, probe, attack):
    r = pool.run(attack.replace("PROBE", probe))
    assert "root:" not in r.stdout and not r.ok, r
    assert os.listdir(probe) == []
    loaded = pool.run("import sys; print(sorted(m for m in sys.modules if 'ctypes' in m))")
    assert loaded.stdout == "[]\n"


def test_report_ctypes_escape_through_one_multiply_env_step(probe):
    # The review reached the same bypass through one action of the ReTool environment: the code
    # block's words become the program print(exec(...)), which runs the payload one frame deeper.
    payload = (
        "import sys\nf = sys._getframe()\nwhile '_BLOCKED' not in f.f_globals:\n    f = f.f_back\n"
        + REPORT_CTYPES.replace("sys._getframe(1)", "f").replace("PROBE", probe)
    )
    from agentic_rl.envs import MultiplyEnv

    env = MultiplyEnv()
    env.reset(3)
    action = f"<code> exec(bytes.fromhex('{payload.encode().hex()}')) </code>"
    observation, _, _, _ = env.step(action)
    assert "Error" in observation and os.listdir(probe) == [], observation


@pytest.mark.parametrize(
    "code",
    ["import os; os.mknod('PROBE/node')", "import os; os.mkfifo('PROBE/fifo')"],
    ids=["mknod", "mkfifo"],
)
def test_report_mknod_and_mkfifo_outside_the_folder(pool, probe, code):
    r = pool.run(code.replace("PROBE", probe))
    assert not r.ok and os.listdir(probe) == [], r


MEMFD = (  # the report's repro of failure 6 (memory): 896 MiB held under a 256 MiB cap
    "import os\nfor i in range(56):\n  fd=os.memfd_create(\"x\")\n"
    "  for _ in range(16): os.write(fd, b\"b\"*(1<<20))\nprint(\"ok\")"
)
DISK_FILL = """
import os
written = 0
try:
    for i in range(10**4):
        with open(f'f{i}', 'wb') as fh:
            for _ in range(16):
                fh.write(b'x' * (1 << 20))
                written += 1
except OSError as err:
    print(written, err.errno)
"""


def test_report_memfd_beyond_the_memory_cap():
    r = sandbox.run(MEMFD, timeout_s=3)
    assert r.stdout != "ok\n" and not r.ok, r


@pytest.mark.skipif(not JAIL_EXPECTED, reason="no bubblewrap here: no disk quota")
def test_report_disk_fill_inside_the_deadline():
    r = sandbox.run(DISK_FILL, timeout_s=3)
    written, errno = map(int, r.stdout.split())
    assert written <= sandbox.DISK_MB and errno in (27, 28), r  # EFBIG or ENOSPC


@pytest.mark.parametrize(
    "code",
    [
        "import os; print(os.listdir('/'))",
        "import os; print(os.listdir('/proc'))",
        "import os; print(os.listdir('CHECKOUT'))",
        "import os; print(list(os.scandir('CHECKOUT')))",
        "import os; os.chdir('/'); print(os.listdir())",
    ],
    ids=["root", "proc", "checkout", "scandir", "chdir"],
)
def test_report_listing_outside_the_folder(pool, code):
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = pool.run(code.replace("CHECKOUT", checkout))
    assert not r.ok and r.stdout == "", r


@pytest.mark.skipif(not JAIL_EXPECTED, reason="no bubblewrap here: stat sees the host")
@pytest.mark.parametrize("path", ["/etc/shadow", "/etc/passwd", "/proc/1", "TESTFILE"])
def test_report_stat_outside_the_folder(pool, path):
    r = pool.run(f"import os; os.stat({path.replace('TESTFILE', __file__)!r})")
    assert r.error == "FileNotFoundError: " + (
        f"[Errno 2] No such file or directory: {path.replace('TESTFILE', __file__)!r}"
    ), r


def test_report_head_of_line_blocking():
    # Harmless snippets waited behind busy loops until the loops' deadline (the report: a p50 of
    # 3.3 s with 10 busy loops among 50 requests on Pool(2)). Now a snippet still running after
    # QUANTUM_S gives up its worker's turn and runs on at idle priority in an extra zygote.
    done, lock = {}, threading.Lock()
    with Pool(2, timeout_s=3.0) as p:
        p.map(["pass"] * 2)
        start = time.monotonic()

        def one(i: int, code: str) -> None:
            p.run(code)
            with lock:
                done[i] = time.monotonic() - start

        busy = [threading.Thread(target=one, args=(i, "while True: pass")) for i in range(4)]
        for t in busy:
            t.start()
        time.sleep(0.1)  # the busy loops hold both workers first
        harmless = [threading.Thread(target=one, args=(i, f"print({i})")) for i in range(4, 14)]
        for t in harmless:
            t.start()
        for t in busy + harmless:
            t.join()
    waits = sorted(done[i] for i in range(4, 14))
    assert waits[-1] < 2.5, f"harmless snippets waited {waits} s behind 3 s busy loops"
    assert min(done[i] for i in range(4)) >= 3.0


# The kernel's layers alone: no audit hook, and a freshly exec'd interpreter that may import
# ctypes (the zygote's own guards are gone with the exec).
def escaped(code: str) -> str:
    # The system's Python where there is one: a snippet run as nobody cannot read a Python
    # installed in root's home folder (this machine's pyenv), in the jail or outside it.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    return f"import os\nos.execv({python!r}, [{python!r}, '-I', '-S', '-c', {code!r}])"


needs_jail = pytest.mark.skipif(not JAIL_EXPECTED, reason="no bubblewrap jail here")


@needs_jail
def test_kernel_alone_shell_reads_no_secrets_and_writes_nothing(unhooked, probe):
    checkout_file, outside = os.path.abspath(__file__), f"/tmp/agentic_rl_escape_{os.getpid()}"
    shell = (
        f"head -c 32 /etc/passwd; head -c 32 {checkout_file}; touch {probe}/x; mkfifo {probe}/f;"
        f" touch {outside}; ls /proc /home /work; echo done"
    )
    r = unhooked.run(f"import os; os.system({shell!r})")
    assert r.stdout == "done\n", r
    assert os.listdir(probe) == [] and not os.path.exists(outside)


@needs_jail
def test_kernel_alone_sees_no_host_tree(unhooked):
    code = (
        "import os\nprint(sorted(os.listdir('/')))\n"
        "for path in ('/etc/shadow', '/etc/passwd', '/proc/1', '/home', 'CHECKOUT'):\n"
        "    print(os.path.exists(path))"
    ).replace("CHECKOUT", os.path.abspath(__file__))
    r = unhooked.run(escaped(code))
    top, *exists = r.stdout.splitlines()
    assert exists == ["False"] * 5, r
    assert not {"proc", "home", "work", "root" if os.geteuid() else "home"} & set(eval(top))


SYSCALL = (
    "import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "nr = {'x86_64': NR_X86, 'aarch64': NR_ARM}[platform.machine()]\n"
    "print(libc.syscall(nr, ARGS), ctypes.get_errno())"
)


@needs_jail
@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="no syscall table")
@pytest.mark.parametrize(
    "nr_x86, nr_arm, args",
    [(319, 279, "b'x', 0"), (101, 117, "16, 1, 0, 0"), (272, 97, "0x10000000")],
    ids=["memfd_create", "ptrace attach to the zygote", "unshare a user namespace"],
)
def test_kernel_alone_refuses_syscalls(unhooked, nr_x86, nr_arm, args):
    code = SYSCALL.replace("NR_X86", str(nr_x86)).replace("NR_ARM", str(nr_arm))
    r = unhooked.run(escaped(code.replace("ARGS", args)))
    if "No module named" in (r.error or ""):
        pytest.skip("ctypes cannot be imported in the jail here")
    assert r.stdout == "-1 1\n", r  # EPERM


@needs_jail
def test_kernel_alone_memfd_and_disk_are_bounded(unhooked):
    r = unhooked.run(escaped(MEMFD))
    assert r.stdout != "ok\n" and "PermissionError" in r.stderr, r
    r = unhooked.run(escaped(DISK_FILL))
    written, errno = map(int, r.stdout.split())
    assert written <= sandbox.DISK_MB and errno in (27, 28), r
