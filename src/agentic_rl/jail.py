"""The kernel's layers around a sandbox zygote (:mod:`agentic_rl.sandbox`): how a zygote starts.

The audit hook inside a snippet's process is a tripwire, not a boundary: anything that pokes at
the interpreter's memory switches it off (the reliability review did it with ``ctypes``, which the
zygote used to import). The boundary is drawn by the kernel, around the zygote, before its
interpreter starts: the zygote is launched through the first of these that works here (probed
once per process, :func:`launcher`):

1. **bubblewrap** (``bwrap``; Debian's and Ubuntu's package ``bubblewrap``): a mount namespace
   whose root holds only the system's program folders (``/usr``, ``/lib*``, ``/bin``), the
   interpreter's own install, the zygote's script, ``/etc/ld.so.cache`` and ``/etc/localtime``,
   all read-only, and a minimal read-only ``/dev``: no ``/proc``, no ``/etc/passwd``, no home
   folder, no checkout. The one writable place is a ``tmpfs`` of ``DISK_MB`` for the snippets'
   folders (the disk quota; its pages are memory, so this also bounds what files can hold).
   Fresh PID (the zygote is PID 1: when it dies, every snippet dies), IPC, UTS, cgroup and
   network (empty) namespaces; ``no_new_privs`` and ``nosuid`` mounts; and a seccomp filter
   (:func:`seccomp_program`) refusing system calls that snippets never need and that reach past
   the other limits: ``memfd_create`` and System V shared memory and message queues (memory
   that ``RLIMIT_AS`` does not count until it is mapped), ``mknod``, ``ptrace`` and
   ``process_vm_*``, new namespaces, mounts, ``io_uring``, ``bpf``, ``userfaultfd``, keyrings,
   kernel modules. As root it uses root's own privileges (so the zygote can still hand each
   snippet to user ``nobody``); as any other user, or as a root without ``CAP_SYS_ADMIN``, it
   works inside a user namespace where the kernel allows one.
2. **unshare** (util-linux, on every Debian and Ubuntu): PID, IPC, UTS and network namespaces
   only; file access is then limited by the audit hook alone, and there is no disk quota.
3. **nothing**: the Python-level guards and resource limits only (some containers allow no
   namespace at all; Colab may be one). :func:`agentic_rl.sandbox.isolation` says which it is.

Only the first is a boundary. Under the other two a snippet that switches off the audit hook
(crafted bytecode does it without ``ctypes``) reads and writes this user's files, reaches the
network and signals the trainer; so model-written code runs only under bubblewrap
(:func:`require_boundary`) unless the user opts in, by name, to running it without
(``allow_uncontained_code`` in a recipe, or the environment variable ``ALLOW_UNCONTAINED``).

None of this code runs in the zygote: it builds a command line.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import struct
import subprocess
import sys
import warnings
from dataclasses import dataclass

from .errors import IsolationError

__all__ = [
    "ALLOW_UNCONTAINED", "DISK_MB", "Launcher", "boundary_problem", "candidates", "interpreter",
    "launcher", "program_command", "require_boundary", "seccomp_program", "works",
]  # fmt: skip

#: The environment variable that, set to ``1``, lets model-written code run without bubblewrap.
ALLOW_UNCONTAINED = "AGENTIC_RL_ALLOW_UNCONTAINED_CODE"
#: Size of each zygote's ``tmpfs`` for its snippets' folders (one snippet at a time per zygote).
DISK_MB = 32
#: Refused by the seccomp filter (with EPERM), wherever the architecture's table has them.
BLOCKED_SYSCALLS = (
    "memfd_create", "shmget", "msgget", "mq_open", "mknod", "mknodat", "ptrace",
    "process_vm_readv", "process_vm_writev", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "unshare",
    "setns", "mount", "umount2", "pivot_root", "fsopen", "fsmount", "move_mount", "open_tree",
    "open_by_handle_at", "name_to_handle_at", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "fanotify_init",
)  # fmt: skip
# From <asm/unistd_64.h> (x86_64) and <asm-generic/unistd.h> (aarch64, which has no mknod).
_X86_64 = dict(zip(BLOCKED_SYSCALLS, (
    319, 29, 68, 240, 133, 259, 101, 310, 311, 323, 425, 426, 427, 321, 298, 250, 248, 249, 272,
    308, 165, 166, 155, 430, 432, 429, 428, 304, 303, 246, 320, 175, 313, 176, 300,
)), clone=56, clone3=435)  # fmt: skip
_AARCH64 = dict(zip(BLOCKED_SYSCALLS, (
    279, 194, 186, 180, None, 33, 117, 270, 271, 282, 425, 426, 427, 280, 241, 219, 217, 218, 97,
    268, 40, 39, 41, 430, 432, 429, 428, 265, 264, 104, 294, 105, 273, 106, 262,
)), clone=220, clone3=435)  # fmt: skip
#: AUDIT_ARCH_* of each table: a system call made through another ABI (i386's int 0x80 on
#: x86_64) would be read against the wrong numbers, so all of those are refused.
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}
_CLONE_NEW = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")  # the loader's cache; the local time zone
_JAILED_SCRIPT = "/sandbox/sandbox.py"  # where the zygote's script is mounted in the jail


@dataclass(frozen=True)
class Launcher:
    """How zygotes start here: ``kind`` is ``"bubblewrap"``, ``"unshare"`` or ``"none"``;
    ``layers`` name what it adds (for :func:`~agentic_rl.sandbox.isolation`); ``nobody``: the
    zygote is really root, so it can run each snippet as user ``nobody``."""

    kind: str
    layers: tuple[str, ...]
    nobody: bool
    userns: bool = False

    @property
    def private_folder(self) -> bool:
        """The snippets' folders live in the zygote's own tmpfs, not on the trainer's disk."""
        return self.kind == "bubblewrap"

    def command(self, script: str | None, base: str) -> tuple[list[str], int | None]:
        """The zygote's command line (``script`` None: a probe that starts Python and exits), and
        the seccomp filter's read end to pass to it (the caller closes it after the start)."""
        inside = _JAILED_SCRIPT if self.kind == "bubblewrap" else script  # (its path in the jail)
        python = [interpreter(), "-I", "-S", *([inside] if script else ["-c", ""])]
        if self.kind == "none":
            return python, None
        if self.kind == "unshare":
            user = ["--user", "--map-root-user"] if self.userns else []
            namespaces = ["--net", "--ipc", "--pid", "--uts", "--fork", "--kill-child"]
            return [shutil.which("unshare"), *user, *namespaces, *python], None
        program, fd = seccomp_program(), None
        if program is not None:
            fd, write_end = os.pipe()
            os.write(write_end, program)  # a few hundred bytes: fits in the pipe's buffer
            os.close(write_end)
        return [*_bwrap_options(script, base, self.userns, fd), *python], fd


def interpreter() -> str:
    """The interpreter a zygote runs: the base install's (a virtual environment adds nothing to
    ``python -I -S``), with symbolic links resolved, so that it can be mounted in the jail."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(base if os.path.exists(base) else sys.executable)


def _bwrap_options(script: str | None, base: str, userns: bool, seccomp_fd: int | None):
    # No --die-with-parent: its PR_SET_PDEATHSIG counts the *thread* that started bwrap as the
    # parent, and Pool starts extra zygotes from short-lived threads. A zygote stops at the end of
    # its input instead (the trainer gone), and the trainer kills bwrap and zygote as one group.
    options = [*_bwrap_namespaces(userns), "--hostname", "sandbox", *_system_binds()]
    # Folders made first, as 0755: bwrap would make a bound file's missing parents 0700.
    options += ["--dir", "/etc", "--dir", "/sandbox", "--dev", "/dev"]
    options += ["--size", str(DISK_MB << 20), "--tmpfs", base]
    for path in _ETC_FILES:
        options += ["--ro-bind-try", path, path]
    if script:
        options += ["--ro-bind", script, _JAILED_SCRIPT]
    # Read-only from here on: the jail's root and /dev are tmpfs folders that a snippet running
    # as the zygote's own user (in a user namespace) could otherwise fill without any quota.
    options += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/"]
    if seccomp_fd is not None:
        options += ["--seccomp", str(seccomp_fd)]
    return options


def _bwrap_namespaces(userns: bool) -> list[str]:
    options = [shutil.which("bwrap"), "--as-pid-1", "--unshare-ipc"]
    options += ["--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return options + (["--unshare-user"] if userns else [])


def _system_binds(bound: list[str] | None = None, parents: bool = False) -> list[str]:
    """Read-only binds of the system's program folders and this interpreter's install (with
    ``parents``, their missing parent folders made first, readable by any user)."""
    options, bound = [], [] if bound is None else bound
    for folder in _SYSTEM_FOLDERS:
        if os.path.islink(folder):  # merged /usr: /lib -> usr/lib
            options += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            options += ["--ro-bind", folder, folder]
            bound.append(folder + "/")
    python = interpreter()
    for folder in {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(python))}:
        # Never / itself, which would bring the whole tree into the jail: an interpreter there
        # needs only the system folders, or else the probe fails and the next launcher is used.
        if folder != "/" and not (folder + "/").startswith(tuple(bound)) and os.path.isdir(folder):
            for parent in reversed(_parents(folder)) if parents else ():
                options += ["--dir", parent]
            options += ["--ro-bind", folder, folder]
            bound.append(folder + "/")
    return options


def program_command(
    argv: list[str], read_only: dict[str, str], scratch: dict[str, int], chdir: str, env: dict
) -> tuple[list[str], int | None]:
    """A bubblewrap command line that runs ``argv`` (a program of ours, e.g. a grader's worker
    that runs a student's notebook) in the same kind of jail as a zygote: the system's program
    folders and this interpreter, read-only; ``read_only`` (outside path -> path in the jail);
    ``scratch`` (path in the jail -> MiB), size-limited tmpfs folders, the only writable places;
    fresh PID, IPC, UTS and empty network namespaces, the seccomp filter, no ``/proc``, and only
    ``env``. Returns the command and the seccomp filter's read end (the caller passes it to the
    child and closes it). Needs :func:`launcher` to be bubblewrap: call :func:`require_boundary`
    first, or run ``argv`` another way."""
    found = launcher()
    if found.kind != "bubblewrap":
        raise IsolationError(f"program_command needs bubblewrap; this machine has {found.kind}")
    options = [*_bwrap_namespaces(found.userns), "--hostname", "jail", "--clearenv"]
    bound: list[str] = []
    options += _system_binds(bound, parents=True)
    options += ["--dir", "/etc", "--dev", "/dev"]
    for path in _ETC_FILES:
        options += ["--ro-bind-try", path, path]
    for inside, megabytes in scratch.items():  # first: a bound path may lie inside one (/tmp)
        options += ["--perms", "0777", "--size", str(megabytes << 20), "--tmpfs", inside]
    for outside, inside in read_only.items():  # (a path inside an earlier one: binds over it)
        for parent in reversed(_parents(inside)):
            if not (parent + "/").startswith(tuple(bound)):
                options += ["--dir", parent]
        options += ["--ro-bind", outside, inside]
        bound.append(inside + "/")
    for name, value in env.items():
        options += ["--setenv", name, value]
    options += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", chdir]
    program, fd = seccomp_program(), None
    if program is not None:
        fd, write_end = os.pipe()
        os.write(write_end, program)
        os.close(write_end)
        options += ["--seccomp", str(fd)]
    return [*options, "--", *argv], fd


def _parents(path: str) -> list[str]:
    parents, head = [], os.path.dirname(path)
    while head not in ("/", ""):
        parents.append(head)
        head = os.path.dirname(head)
    return parents


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The seccomp filter as classic BPF (what ``bwrap --seccomp`` reads), or None where there is
    no system-call table for this architecture. Refuses ``BLOCKED_SYSCALLS`` with EPERM, ``clone``
    with a namespace flag with EPERM, and ``clone3`` with ENOSYS (its flags sit in memory, out of
    the filter's sight: the C library then falls back to ``clone``); allows everything else."""
    arch = _ARCHES.get(machine or os.uname().machine)
    if arch is None:
        return None
    audit_arch, table = arch
    numbers = [table[name] for name in BLOCKED_SYSCALLS if table.get(name) is not None]
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|..|K, BPF_RET
    allow, deny, nosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    head = [(load, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, deny), (load, 0, 0, 0)]
    if audit_arch == _ARCHES["x86_64"][0]:
        head.append((jge, "deny", 0, 0x40000000))  # the x32 ABI's numbers
    head += [(jeq, "deny", 0, number) for number in numbers]
    head += [(jeq, "nosys", 0, table["clone3"]), (jeq, 0, 2, table["clone"])]
    head += [(load, 0, 0, 16), (jset, "deny", 0, _CLONE_NEW)]  # clone's flags: args[0]'s low word
    program = [*head, (ret, 0, 0, allow), (ret, 0, 0, deny), (ret, 0, 0, nosys)]
    labels = {"deny": len(program) - 2, "nosys": len(program) - 1}
    return b"".join(
        struct.pack(
            "=HBBI", code, *(labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)), k
        )
        for i, (code, jt, jf, k) in enumerate(program)
    )


@functools.cache
def launcher() -> Launcher:
    """The first of :func:`candidates` that starts Python here (probed once per process), or
    ``"none"``."""
    found = next((candidate for candidate in candidates() if works(candidate)), None)
    return found or Launcher("none", _layers("none", False), os.geteuid() == 0)


def candidates() -> list[Launcher]:
    """The launchers whose tool is installed, best first. Root first tries each without a user
    namespace (that needs CAP_SYS_ADMIN): then it stays the real root, which can hand each snippet
    to nobody."""
    root = os.geteuid() == 0
    return [
        Launcher(kind, _layers(kind, userns), root and not userns, userns)
        for kind, tool in (("bubblewrap", "bwrap"), ("unshare", "unshare"))
        if shutil.which(tool)
        for userns in ((False, True) if root else (True,))
    ]


def works(candidate: Launcher) -> bool:
    """Whether the launcher starts this interpreter here (kernels and containers differ)."""
    command, fd = candidate.command(None, "/tmp/agentic_rl_sandbox_probe")
    fds = () if fd is None else (fd,)
    try:
        done = subprocess.run(
            command, env={}, capture_output=True, timeout=60, pass_fds=fds, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        if fd is not None:
            os.close(fd)
    return done.returncode == 0


def _layers(kind: str, userns: bool) -> tuple[str, ...]:
    missing = "no mount namespace (no working bubblewrap: files limited by the audit hook)"
    if kind == "none":
        return missing, "no disk quota", "no seccomp filter", "no network namespace (not permitted)"
    if kind == "unshare":
        layers = [missing, "no disk quota", "no seccomp filter"]
    else:
        layers = [
            "mount namespace (read-only system folders and Python; no /proc, /etc, home, checkout)",
            f"disk quota ({DISK_MB} MiB tmpfs)",
            "seccomp filter" if seccomp_program() else "no seccomp filter (unknown architecture)",
        ]
    return (*layers, "empty network namespace", *(["user namespace"] if userns else []))


def boundary_problem(allow_uncontained: bool = False) -> str | None:
    """Why model-written code may not run here, in one line; None: it runs inside bubblewrap, or
    the caller or the environment (``ALLOW_UNCONTAINED=1``) opts in to weaker isolation."""
    found = launcher()
    if found.kind == "bubblewrap" or allow_uncontained or os.environ.get(ALLOW_UNCONTAINED) == "1":
        return None
    if shutil.which("bwrap") is None:
        why = "bubblewrap is not installed (Debian, Ubuntu: apt-get install bubblewrap)"
    else:  # installed, but the probe could not start Python in it
        why = (
            f"bubblewrap ({shutil.which('bwrap')}) cannot create its namespaces here (a container "
            "without user namespaces?: run where it can, e.g. a VM)"
        )
    return (
        f"model-written code runs only inside bubblewrap, and {why}; to run it anyway with "
        f"{found.kind if found.kind != 'none' else 'no namespace'} and the audit hook only, "
        "which a snippet can switch off (it can then read and write your files, reach the "
        f"network and kill processes), opt in with allow_uncontained_code or {ALLOW_UNCONTAINED}=1"
    )


def require_boundary(allow_uncontained: bool = False) -> Launcher:
    """The launcher for model-written code: bubblewrap, or :class:`IsolationError` (one line
    naming what is missing and how to install it) unless the caller or the environment
    (``ALLOW_UNCONTAINED=1``) opts in to weaker isolation, which is then said in a warning."""
    problem = boundary_problem(allow_uncontained)
    if problem is not None:
        raise IsolationError(problem)
    if launcher().kind == "bubblewrap":
        return launcher()
    warnings.warn(
        f"UNCONTAINED: model-written code runs without bubblewrap ({launcher().kind} and the "
        "audit hook only); a snippet that switches off the hook reaches your files and network",
        RuntimeWarning,
        stacklevel=3,
    )
    return launcher()
