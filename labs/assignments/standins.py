"""The package as a graded notebook sees it: each answer of the assignment replaced by a stand-in.

A student has ``agentic_rl`` installed, and its functions answer the assignment's questions. While
grading, the jail's ``agentic_rl`` is a copy of the package in which every answer function of
that assignment, and every package function it calls (its helpers, e.g. ``group_stats`` for
``group_advantages``), takes any arguments and raises ``NotAvailableWhileGrading``. Importing,
wrapping (``functools.partial``, a class, a dict), ``exec``-ing the source (it is the stand-in's)
or calling a helper then earns nothing, and the grader flags the question: the call raised
``NotAvailableWhileGrading``. Pasted source is the similarity check's (``similarity.py``).

The answers of an assignment are the ``"module:function"`` names its hidden checks list
(``<a>/answer_key/<a>_checks.py``): one place.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import pathlib
import shutil

HERE = pathlib.Path(__file__).resolve().parent
MAX_DEPTH = 3  # helpers of helpers of helpers
#: Modules of general tools (seeded generators, ...): never stood in for, even when an answer
#: calls them.
GENERAL = ("agentic_rl.utils",)
EXCEPTION = '''

class NotAvailableWhileGrading(RuntimeError):
    """Raised by the stand-in of a package function that answers a graded question."""
'''


def answers(assignment: str) -> tuple[str, ...]:
    """The package's functions that answer the assignment's questions, as ``module:function``:
    the ``answers`` of the ``@check`` decorators in its checks module (read as text by
    :func:`similarity.package_answers`)."""
    import similarity

    return similarity.assignment_answers(assignment)


def package_root() -> pathlib.Path:
    spec = importlib.util.find_spec("agentic_rl")
    if spec is None or spec.origin is None:
        raise RuntimeError("agentic_rl is not installed: grading needs the package")
    return pathlib.Path(spec.origin).parent


@functools.cache
def _module_tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text())


def _module_path(module: str) -> pathlib.Path:
    parts = module.split(".")[1:]
    return package_root().joinpath(*parts).with_suffix(".py")


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """Names a module binds to package functions or modules: name -> ``module:function`` or
    ``module``."""
    bound = {}
    package = module.rsplit(".", 1)[0]
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            if not base.startswith("agentic_rl"):
                continue
            for alias in node.names:
                target = f"{base}.{alias.name}"
                is_module = _module_path(target).exists()
                bound[alias.asname or alias.name] = target if is_module else f"{base}:{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("agentic_rl"):
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
    return bound


def _function(tree: ast.Module, name: str):
    return next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == name), None)


def helpers(dotted: str, depth: int = MAX_DEPTH) -> set[str]:
    """``dotted`` and the package functions it calls, transitively to ``depth``."""
    found, todo = set(), [(dotted, 0)]
    while todo:
        name, level = todo.pop()
        if name in found:
            continue
        module, _, function = name.partition(":")
        path = _module_path(module)
        if module in GENERAL or not path.exists():
            continue
        tree = _module_tree(path)
        node = _function(tree, function)
        if node is None:
            continue
        found.add(name)
        if level >= depth:
            continue
        bound = _imports(tree, module)
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            f = call.func
            if isinstance(f, ast.Name):
                if _function(tree, f.id) is not None:
                    todo.append((f"{module}:{f.id}", level + 1))
                elif ":" in bound.get(f.id, ""):
                    todo.append((bound[f.id], level + 1))
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                target = bound.get(f.value.id, "")
                if target and ":" not in target:
                    todo.append((f"{target}:{f.attr}", level + 1))
    return found


def stand_ins(assignment: str) -> tuple[str, ...]:
    """Every package function replaced while grading the assignment: answers and helpers."""
    names = set()
    for dotted in answers(assignment):
        names |= helpers(dotted)
    return tuple(sorted(names))


def _stub(node, dotted: str) -> None:
    message = (f"{dotted} is not available while grading: your function must compute its "
               "answer itself (the package's version is what it is graded against)")
    raise_node = ast.parse("from agentic_rl._grading import NotAvailableWhileGrading\n"
                           f"raise NotAvailableWhileGrading({message!r})").body
    node.body = raise_node
    node.decorator_list, node.returns = [], None  # exec-ing a stand-in's source needs no import
    # Any arguments: a call that reaches it is flagged, whatever it passes.
    node.args = ast.arguments(posonlyargs=[], args=[], vararg=ast.arg("args"), kwonlyargs=[],
                              kw_defaults=[], kwarg=ast.arg("kwargs"), defaults=[])


def graded_copy(assignment: str, target: pathlib.Path) -> pathlib.Path:
    """Write the package with the assignment's stand-ins into ``target`` (its ``agentic_rl``
    folder); returns that folder."""
    source = package_root()
    folder = pathlib.Path(target) / "agentic_rl"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (folder / "_grading.py").write_text(
        '"""What the stand-ins of graded answers raise (written by standins.py)."""' + EXCEPTION)
    by_module: dict[str, list[str]] = {}
    for dotted in stand_ins(assignment):
        module, _, function = dotted.partition(":")
        by_module.setdefault(module, []).append(function)
    for module, functions in by_module.items():
        path = folder.joinpath(*module.split(".")[1:]).with_suffix(".py")
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    node.name in functions):
                _stub(node, f"{module}.{node.name}")
        path.write_text(ast.unparse(tree) + "\n")
    return folder
