"""The submission's side of grading: runs inside the jail, never in the grader's process.

Started by ``remote.py`` as ``python -I worker.py`` with its messages on stdin and stdout (one
JSON object a line, :mod:`wire`). It

1. gives up root (when the jail runs it as root) for user ``nobody``, after copying the student
   release's files into its working folder, and limits processes, memory and file sizes;
2. receives the notebook's code cells, runs them in one namespace, as a kernel would (IPython's
   own transformation of ``%magics`` and ``!shell`` lines, which do nothing here; ``otter`` is a
   stand-in whose ``check`` does nothing), and answers with the names of what the notebook
   defines and the error of every cell that raised;
3. then calls the student's functions on the grader's inputs, one request at a time, and sends
   back what they returned (and the arguments they changed in place), or what they raised; the
   gradients of a returned tensor are sent when the grader asks for them.

Nothing here decides a point: a student who rewrites this process only changes what their own
functions are reported to return. The expected values and the comparisons stay in the grader.
"""

import os
import resource
import shutil
import sys
import traceback
import types

NOBODY = 65534
WORKDIR = "/jail/work"


def _protocol_streams():
    """The message streams, moved off fds 0 and 1 so that a notebook's prints go nowhere."""
    inp, out, err = os.dup(0), os.dup(1), os.dup(2)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    return os.fdopen(inp, "rb"), os.fdopen(out, "wb"), os.fdopen(err, "w")


def _others_can_enter(path: str) -> bool:
    """Whether every folder down to ``path`` lets any user in (a Python under /root does not)."""
    path = os.path.realpath(path)
    while True:
        if not os.stat(path).st_mode & 0o001:
            return False
        if path == "/":
            return True
        path = os.path.dirname(path)


def _drop_privileges(workdir: str) -> None:
    if os.getuid() != 0:
        return
    import site

    if not all(_others_can_enter(p) for p in [os.path.dirname(os.__file__),
                                               *site.getsitepackages()] if os.path.isdir(p)):
        return  # (nobody could not import the standard library: stay, and say so)
    for root, dirs, files in os.walk(workdir):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, NOBODY, NOBODY)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    # Processes and threads of user nobody, all jails together (the kernel counts it per user).
    resource.setrlimit(resource.RLIMIT_NPROC, (512, 512))


def _limits(memory_mb: int, file_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _Shell:
    """What ``get_ipython()`` returns to a cell: magics and shell lines do nothing, but a
    ``%%time``-style cell magic still runs its cell."""

    def __init__(self, ns: dict):
        self.ns = ns

    def run_line_magic(self, *args, **kwargs):
        return None

    def run_cell_magic(self, name, line, cell):
        if name in ("time", "timeit", "capture", "prun"):
            exec(compile(cell, "<cell magic>", "exec"), self.ns)

    def system(self, *args, **kwargs):
        return None

    getoutput = system


def _fake_otter() -> types.ModuleType:
    otter = types.ModuleType("otter")

    class Notebook:
        def __init__(self, *args, **kwargs):
            pass

        def __getattr__(self, name):
            return lambda *args, **kwargs: None

    otter.Notebook = Notebook
    return otter


def _transform(source: str) -> str:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # no IPython (Gradescope's image): a magic or shell line does nothing
        lines = source.splitlines()
        if lines and lines[0].startswith("%%"):  # a cell magic: %%time and the like run the cell
            lines = lines[1:] if lines[0][2:].split()[:1] in (["time"], ["capture"]) else []
        out, continued = [], False
        for ln in lines:
            if continued:  # the rest of a shell line continued with a backslash
                continued = ln.rstrip().endswith("\\")
            elif ln.lstrip().startswith(("%", "!")):
                out.append(ln[: len(ln) - len(ln.lstrip())] + "pass")
                continued = ln.rstrip().endswith("\\")
            else:
                out.append(ln)
        return "\n".join(out)
    return TransformerManager().transform_cell(source)


def _where(tb, prefix: str = "<cell ") -> int | None:
    lines = [f.lineno for f in traceback.extract_tb(tb) if f.filename.startswith(prefix)]
    return lines[-1] if lines else None


def _raised(err: BaseException) -> dict:
    return {"type": type(err).__name__, "message": str(err)[:2000],
            "line": _where(err.__traceback__),
            "standin": type(err).__name__ == "NotAvailableWhileGrading"}


def run_cells(cells: list, ns: dict) -> list:
    errors = []
    for k, source in enumerate(cells):
        try:
            code = compile(_transform(source), f"<cell {k}>", "exec")
            exec(code, ns)
        except BaseException as err:  # noqa: BLE001 (SystemExit too: a cell may call exit())
            errors.append({"cell": k, **_raised(err)})
    return errors


def _mutable(value) -> bool:
    import random

    import torch

    return isinstance(value, (list, dict, set, torch.Tensor, torch.Generator, random.Random))


def serve(inp, out, ns: dict, wire) -> None:
    import torch

    graphs = {}  # call id -> (inputs that require grad, outputs), for the grader's backward

    def send(message):
        out.write(wire.dumps(message))
        out.flush()

    for line in inp:
        request = wire.loads(line)
        if "call" in request:
            ident = request["id"]
            args = [wire.decode(a) for a in request["args"]]
            kwargs = {k: wire.decode(v) for k, v in request["kwargs"]}
            fn = ns.get(request["call"])
            try:
                with torch.enable_grad():
                    result = fn(*args, **kwargs)
                reply = {"id": ident, "result": wire.encode(result)}
            except BaseException as err:  # noqa: BLE001
                reply = {"id": ident, "raised": _raised(err)}
            else:
                leaves = [a for a in [*args, *kwargs.values()]
                          if isinstance(a, torch.Tensor) and a.requires_grad]
                outputs = [r for r in (result if isinstance(result, (tuple, list)) else [result])
                           if isinstance(r, torch.Tensor) and r.requires_grad]
                if leaves and outputs:
                    graphs[ident] = (leaves, outputs)
            changed = [[i, wire.encode(a)] for i, a in enumerate(args) if _mutable(a)]
            changed += [[k, wire.encode(v)] for k, v in kwargs.items() if _mutable(v)]
            reply["after"] = changed
            send(reply)
        elif "grad" in request:
            leaves, outputs = graphs[request["grad"]]
            upstream = [wire.decode(g, False) for g in request["upstream"]]
            pairs = [(o, g) for o, g in zip(outputs, upstream) if g is not None]
            try:
                grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                            allow_unused=True, retain_graph=True)
                send({"grads": [None if g is None else wire.encode(g) for g in grads]})
            except BaseException as err:  # noqa: BLE001
                send({"raised": _raised(err)})
        elif "bye" in request:
            return


def main(inp, out) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import wire

    sys.path.remove(here)  # (without a jail, this folder holds the grader's modules)
    setup = wire.loads(inp.readline())
    workdir, release = setup.get("workdir", WORKDIR), setup.get("release")
    sys.path[:0] = [*setup.get("path", []), workdir]  # (the stand-in package, without a jail)
    if release and os.path.isdir(release):
        for name in os.listdir(release):
            src = os.path.join(release, name)
            copy = shutil.copytree if os.path.isdir(src) else shutil.copy
            copy(src, os.path.join(workdir, name))
    os.chdir(workdir)
    _drop_privileges(workdir)
    _limits(setup["memory_mb"], setup["file_mb"])
    import torch  # before the notebook: its import must not count against the cells

    torch.set_num_threads(1)
    sys.modules["otter"] = _fake_otter()
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    ns["get_ipython"] = lambda: _Shell(ns)
    out.write(wire.dumps({"started": True, "uid": os.getuid()}))
    out.flush()
    errors = run_cells(setup["cells"], ns)
    names = sorted(k for k, v in ns.items() if callable(v) and not k.startswith("__"))
    out.write(wire.dumps({"ready": True, "callables": names, "errors": errors}))
    out.flush()
    serve(inp, out, ns, wire)


if __name__ == "__main__":
    streams = _protocol_streams()
    try:
        main(*streams[:2])
    except BaseException:  # the worker's own failure (not a cell's): the grader shows its tail
        streams[2].write(traceback.format_exc()[-2000:])
        streams[2].flush()
        raise SystemExit(3) from None
