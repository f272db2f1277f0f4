"""The code sandbox (``agentic_rl.sandbox``): normal behaviour, and an adversarial suite.

Every adversarial program is bounded (``timeout_s`` 1 s, ``memory_mb`` 128, 4 KB of output) and
must come back as a :class:`~agentic_rl.sandbox.Result` with ``error`` set, while this process, its
parent and the files around it stay untouched. Programs that try to escape aim at a world-writable
probe folder, so that only the sandbox's guards (not file permissions) can stop them: a file in it
after the run is an escape. The namespace layer is also tested alone, with the audit hook taken out.
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

from agentic_rl import sandbox
from agentic_rl.sandbox import Pool, Result

TIMEOUT_S = 1.0
CAP = 4096
HAS_NAMESPACES = "PID and IPC namespaces" in sandbox.isolation()


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
    if os.geteuid() == 0:
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
        threading.Timer(0.3, os.kill, (zygote, signal.SIGKILL)).start()
        start = time.monotonic()
        r = p.run("import time; time.sleep(4)")
        assert time.monotonic() - start < 2
        assert not r.ok and r.exit_code is None and r.error.startswith("sandbox worker failed")
        assert p.run("print('back')").stdout == "back\n"
        new = p._zygotes[0].proc.pid
        assert new != zygote
        # The orphaned snippet died with its zygote (PR_SET_PDEATHSIG), nothing else is left.
        time.sleep(0.2)
        assert processes_mentioning(p._base) == [new]
        os.kill(new, signal.SIGKILL)  # killed while idle: replaced before the next snippet
        p._zygotes[0].proc.wait()
        assert p.run("print('again')").stdout == "again\n"


def test_close_leaves_no_process_folder_or_zombie():
    p = Pool(2)
    assert p.run("print(1)").ok
    pids, base = [z.proc.pid for z in p._zygotes], p._base
    assert sorted(processes_mentioning(base)) == sorted(pids)
    p.close()
    p.close()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)  # reaped: no zombies
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
    ("setuid root", "import os; os.setuid(0)", refused),
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
    assert sorted(processes_mentioning(pool._base)) == sorted(z.proc.pid for z in pool._zygotes)


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
    assert patched != source
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
    assert processes_mentioning(unhooked._base) == [unhooked._zygotes[0].proc.pid]


@pytest.mark.skipif(not HAS_NAMESPACES, reason="no namespaces on this machine")
def test_namespaces_alone_confine_signals(unhooked):
    # Inside its PID namespace the snippet is PID 1 and sees no other process: check that with
    # the harmless signal 0 before sending anything real.
    code = "import os\ntry:\n    os.kill({}, 0)\nexcept ProcessLookupError:\n    print('none')"
    for target in (-1, os.getpid(), os.getppid()):
        assert unhooked.run(code.format(target)).stdout == "none\n"
    assert unhooked.run("import os; print(os.getpid(), os.getppid())").stdout == "1 0\n"
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
