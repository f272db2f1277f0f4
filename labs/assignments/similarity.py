"""A static similarity check of submitted notebooks: copies of the package's answers, lines that
deserve the instructor's eye, and the most similar pairs of a class (as MOSS does).

Everything here reads text: a student's code is never imported or run.

- :func:`student_cells` / :func:`student_code`: the code cells the student wrote or changed (the
  release notebook's own cells, set-up and ``grader.check`` included, are left out).
- :func:`review_flags`: lines that reach the grader, the file system, the running process or the
  package, or build names and code from strings (tampering, obfuscation, lookups).
- :func:`normalised_tokens`, :func:`similarity`: Python tokens with every name the student chose
  renamed ``_`` (builtins, ``torch``-like modules, attributes and keyword arguments are kept),
  strings ``STR``, docstrings, comments, annotations, imports and input checks (``assert``,
  ``raise`` and an ``if`` left empty without them) removed; then winnowed k-gram fingerprints.
- :func:`package_similarity`: each student function's body against each package function's body
  (a body pasted under the stub's ``def`` line is found), and the package function's body
  *contained* in the student's whole code (a helper split off). :func:`copy_review` is the one-line
  review column of the grades CSV.
- :func:`class_report`: the most similar pairs of submissions, per function and whole code, with
  the release's own code taken out of every fingerprint set (MOSS's base file) and the lines to
  read.

**The measure.** Tokens are hashed in k-grams (``K`` = 5 tokens) and winnowed (window ``W`` = 2:
the smallest hash of every 2 consecutive k-grams, MOSS's algorithm); the similarity of two pieces
of code is the Dice coefficient of their fingerprint sets, ``2 |A & B| / (|A| + |B|)``, and the
containment of a package function in a student's code is ``|P & S| / |P|``. Chosen over
difflib's ratio on the token lists (measured too, in the table): both give every copy 1.00, but
difflib scores honest code higher (0.37-0.94 against 0.23-0.84 below; the master's
``draw_conditions`` 0.94, over any usable threshold), because it rewards every aligned token, as
common as ``_ = _ .`` is; fingerprints need 5 tokens in a row. They are also blind to the order of
the pieces (moved statements or helpers still match), give containment (a function copied into
longer code, or split into helpers), let the release's code be subtracted as a set (MOSS's base
file), and compare a class pair by pair with set operations. K and W were swept (K 4-10, W 1-4):
K = 5, W = 2 keeps every copy at 1.00 with the honest code lowest while a split copy is still
found; K = 10 hardly lowers the honest scores (``masked_whiten`` still 0.82-0.86) and loses the
split copies (0.6).

**Threshold 0.9** (``THRESHOLD``). Measured with ``python tests/test_similarity.py``, each case
against the package function it corresponds to (body against body; containment for the split):

==============================================  ======  ======  ======  ======  ======
case                                            g_adv   aggr    gae     d_ret   draw
==============================================  ======  ======  ======  ======  ======
renamed copy                                    1.00    1.00    1.00    1.00    1.00
copy without annotations (and renamed)          1.00    1.00    1.00    1.00    1.00
package body under the stub's ``def`` line      1.00    1.00    1.00    1.00    1.00
copy with the input checks removed              1.00    1.00    1.00    1.00    1.00
renamed copy, difflib's ratio                   1.00    1.00    1.00    1.00    1.00
copy split into a helper (containment)          0.85    0.96    0.98    0.97    0.95
master's reference solution (honest)            0.23    0.51    0.45    0.55    0.84
master's reference solution, difflib's ratio    0.37    0.70    0.67    0.74    0.94
honest variant written differently (ours)       0.16    0.07    0.18    0.01    0.28
planted bugs of ``cases.json`` (highest)        0.23    0.44    0.49    0.41    0.69
==============================================  ======  ======  ======  ======  ======

g_adv: ``agentic_rl.advantages:group_advantages``; aggr: ``agentic_rl.losses:aggregate``; gae:
``agentic_rl.advantages:gae``; d_ret: ``agentic_rl.gigpo:discounted_returns``; draw:
``agentic_rl.rcgrpo:draw_conditions``. The honest variants: group sums with ``index_add_``
(vectorised), a loop over the rows, a loop over each row's valid positions, episode segments
accumulated backwards, positions drawn with ``rng.sample``. Of the 26 pairs (master solution,
package answer of its question: ``package_answers``) of the eight assignments, the 21 others
score at most 0.55 (body) and 0.70 (the package function contained in all of the master's
solutions), but ``masked_whiten`` 0.86 and ``distinct_per_group`` 1.00.

**What is close.** ``masked_whiten`` (0.86) and ``draw_conditions`` (0.84) are four or five lines
with one natural way to write them: the masters' honest solutions come close, so a class will
hold honest answers near the threshold, and a flag is for the instructor to read, never a
verdict. ``distinct_per_group``'s master solution *is* the package's two statements (1.00): a
score on it tells nothing, so it is not compared (``NOT_TELLING``; a test keeps that list equal to
the answers the masters reach). A split copy of ``group_advantages`` (five statements) loses the
k-grams across both cuts and scores 0.85: below the threshold; its body is found when copied
whole. Cheats score 1.00, honest code at most 0.86: the threshold sits between, at 0.9.

**Review flags** (``FLAGS``): tuned to hit none of the 24 solution cells of the masters, the 33
planted bugs, our honest variants and the release notebooks' own cells, and each kind of
tampering the tests plant. The release's self-check cells import the package's answers to
compare with (``from agentic_rl.advantages import gae as reference_gae``), which no pattern can
tell from a student's import: a line that is a line of a release notebook is never flagged.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import difflib
import hashlib
import json
import keyword
import os
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
THRESHOLD = 0.9
K = 5  # tokens per k-gram
W = 2  # winnowing window (k-grams)
MIN_FINGERPRINTS = 6  # a package function with fewer is too short for the containment test
WHOLE = "(whole code)"  # the student name of a whole-code comparison
#: package answers that tell nothing: the master's own reference solution scores >= THRESHOLD
#: against them (a two-statement function with one natural way to write it); not compared
NOT_TELLING = ("agentic_rl.starpo:distinct_per_group",)
#: names that are kept by the normalisation: builtins and the modules answers are written with
KEEP = frozenset(dir(builtins)) | {"torch", "np", "numpy", "math", "random", "F", "nn", "STR",
                                   "itertools", "collections", "functools", "statistics"}

# --- notebooks ----------------------------------------------------------------------------------


def _read_notebook(nb) -> dict:
    """A notebook as a dict (a path, a JSON text's dict, an nbformat node); {} when unreadable."""
    if isinstance(nb, (str, os.PathLike)):
        try:
            nb = json.loads(pathlib.Path(nb).read_text(encoding="utf-8", errors="replace"))
        except (OSError, ValueError):
            return {}
    return nb if isinstance(nb, dict) else {}


def _source(cell) -> str:
    source = cell.get("source", "") if isinstance(cell, dict) else ""
    if isinstance(source, list):
        source = "".join(s for s in source if isinstance(s, str))
    return source if isinstance(source, str) else ""


def _code_cells(nb) -> list[tuple[int, str]]:
    cells = _read_notebook(nb).get("cells")
    if not isinstance(cells, list):
        return []
    return [(k, _source(c)) for k, c in enumerate(cells, start=1)
            if isinstance(c, dict) and c.get("cell_type") == "code"]


def _same(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def student_cells(notebook, release=None) -> list[tuple[int, str]]:
    """``(k, source)`` of each code cell the student wrote or changed; ``k`` counts the
    notebook's cells from 1, markdown included. A cell equal to one of the release notebook's code
    cells (``release``: its path or its dict; up to trailing spaces) is left out; without
    ``release`` every non-empty code cell counts. An unreadable notebook has no cells."""
    given = {_same(s) for _, s in _code_cells(release)} if release is not None else set()
    return [(k, s) for k, s in _code_cells(notebook) if _same(s) and _same(s) not in given]


def student_code(notebook, release=None) -> list[str]:
    """The sources of :func:`student_cells`."""
    return [source for _, source in student_cells(notebook, release)]


def release_notebook(assignment: str) -> pathlib.Path:
    """The student release of ``assignment`` in this repository."""
    return HERE / assignment / f"{assignment}_assignment.ipynb"


def _numbered(cells) -> list[tuple[int, str]]:
    """Cells given as sources (numbered from 1) or as ``(k, source)`` pairs."""
    out = []
    for n, cell in enumerate(cells or [], start=1):
        if isinstance(cell, (tuple, list)) and len(cell) == 2 and isinstance(cell[0], int):
            out.append((cell[0], cell[1] if isinstance(cell[1], str) else ""))
        else:
            out.append((n, cell if isinstance(cell, str) else ""))
    return out


# --- review flags -------------------------------------------------------------------------------

_ASSIGNMENTS = sorted(p.parent.name for p in HERE.glob("*/answer_key"))
_SHELL = (r"^\s*!.*(?:\b(?:ls|cat|find|grep|head|tail|less|more|strings|unzip|zcat|cp|mv|rm|"
          r"locate|tree|du)\b|\.\./)|^\s*%+(?:load|run|cat|pycat|less|system|sx|sc|env|cd|ls|"
          r"bookmark|store|history|writefile)\b|\bget_ipython\s*\(")
#: (pattern, why): tuned on the masters' solutions and the release notebooks (no hit on either)
_CHECKS = "|".join(_ASSIGNMENTS or ["grpo"])
FLAGS = tuple((re.compile(pattern), why) for pattern, why in (
    (r"(?i)agentic_rl", "uses the package, whose functions are the answers"),
    (r"\bgradelib\b|\bCheckFailed\b|\bFLAGGED\b|\bimport\s+\w+_checks\b|\w+_checks\.py\b|"
     rf"\b(?:{_CHECKS})_checks\b", "names the grader's checks"),
    (r"\botter\s*\.\s*(?!Notebook\s*\()|\bfrom\s+otter\b|\bimport\s+otter\s*\.|\bdoctest\b|"
     r"\bgrader\s*\.\s*(?!(?:check|check_all|export)\s*\()\w|\bgrader\s*\.\s*check\s*=(?!=)",
     "reaches into otter, the grader"),
    (r'(?<!"google\.colab" in )\bsys\s*\.\s*modules\b', "reads or patches loaded modules"),
    (r"\b__import__\b|\bimportlib\b", "imports a module by a computed name"),
    (r"\b(?:getattr|setattr|delattr)\s*\(", "reaches an attribute by a computed name"),
    (r"(?<![\w.])(?:exec|eval|compile)\s*\(", "runs code built from a string"),
    (r"\binspect\b|\b__code__\b|\b__globals__\b|\b__builtins__\b|\bbuiltins\b|\b__dict__\b|"
     r"\b__subclasses__\b|\b_getframe\b|\bf_globals\b|\bf_back\b|\bgc\s*\.\s*get_",
     "introspects the running code"),
    (r"(?<![\w.])(?:globals|locals|vars)\s*\(", "reads or writes the notebook's namespace"),
    (r"_reference\b|\banswer_key\b|\bcases\.json\b|\bautograder\b",
     "looks for the grader's expected values"),
    (r"/proc/|\bos\s*\.\s*(?:_exit|kill|abort)\b|\bsys\s*\.\s*exit\b|\bsignal\b|\batexit\b|"
     r"(?<![\w.])(?:exit|quit)\s*\(", "inspects or ends the grading process"),
    (r"\bos\s*\.\s*(?:listdir|scandir|walk|system|popen|environ|getenv|putenv|chdir|getcwd)\b|"
     r"\bglob\b|\bpathlib\b|(?<![\w.])Path\s*\(|(?<![\w.])open\s*\(|\bshutil\b|\bsubprocess\b|"
     r"\bfnmatch\b|" + _SHELL, "reads the file system, the environment or a shell"),
    (r"(?<![\w.])(?:chr|ord)\s*\(|\bbase64\b|\bcodecs\b|\bfromhex\b|\bmarshal\b|\bpickle\b|"
     r"\bzlib\b|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}", "builds text in an obfuscated way"),
    (r"\b(?:torch|np|numpy|math|random|sys|os|json)(?:\s*\.\s*\w+)+\s*=(?!=)|"
     r"\b(?:AssertionError|Exception|BaseException|print|isinstance|float|len)\s*=(?!=)|"
     r"\bsys\s*\.\s*(?:path|meta_path|settrace|setprofile|excepthook|stdout|stderr)\b",
     "replaces a library function or changes the interpreter"),
    (r"\bsocket\b|\burllib\b|\brequests\s*\.|\bhttp\.client\b", "reaches the network"),
))
_RELEASE_LINES: set[str] | None = None


def _release_lines(release=None) -> set[str]:
    """The stripped code lines of the release notebooks of this repository (and ``release``)."""
    global _RELEASE_LINES
    if _RELEASE_LINES is None:
        _RELEASE_LINES = {line.strip() for path in HERE.glob("*/*_assignment.ipynb")
                          for _, s in _code_cells(path) for line in s.splitlines()}
    extra = set()
    if release is not None:
        cells = release if isinstance(release, (list, tuple)) else [s for _, s in
                                                                   _code_cells(release)]
        extra = {line.strip() for _, s in _numbered(cells) for line in s.splitlines()}
    return (_RELEASE_LINES | extra) - {""}


def _without_comments(source: str) -> str:
    """``source`` with its comments blanked (strings kept: a file name can hide in one)."""
    out, last = [], 0
    for m in _LEX.finditer(source):
        if m.lastgroup == "comment":
            out += [source[last:m.start()], " " * (m.end() - m.start())]
            last = m.end()
    return "".join(out) + source[last:]


def review_flags(cells, release=None) -> list[str]:
    """Lines that deserve the instructor's eye: ``"cell k, line n: `snippet` (why)"``.

    ``cells``: sources (``k`` counts them from 1) or ``(k, source)`` pairs (:func:`student_cells`).
    Comments are not read; a line that is a line of a release notebook (this repository's, or
    ``release``: a notebook or its cells) is never flagged: the set-up cells import ``otter`` and
    some self-check cells import the package's answer to compare with."""
    allowed, found = _release_lines(release), []
    for k, source in _numbered(cells):
        code = _without_comments(source).splitlines()
        for n, (line, original) in enumerate(zip(code, source.splitlines()), start=1):
            if original.strip() in allowed:
                continue
            why = [w for pattern, w in FLAGS if pattern.search(line)]
            if why:
                snippet = original.strip().replace("`", "'")
                snippet = snippet if len(snippet) <= 80 else snippet[:77] + "..."
                found.append(f"cell {k}, line {n}: `{snippet}` ({'; '.join(why)})")
    return found


# --- normalised tokens --------------------------------------------------------------------------

_LEX = re.compile(r"""
 (?P<comment>\#[^\n]*)
|(?P<string>(?:[rRbBuUfF]{1,2})?(?:'''[\s\S]*?(?:'''|\Z)|\"\"\"[\s\S]*?(?:\"\"\"|\Z)
            |'(?:\\.|[^'\\\n])*'?|"(?:\\.|[^"\\\n])*"?))
|(?P<number>0[xXoObB][\da-fA-F_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?[jJ]?)
|(?P<name>[^\W\d]\w*)
|(?P<op>\*\*=?|//=?|>>=?|<<=?|->|:=|\.\.\.|[-+*/%&|^@<>=!]=|[^\s\w])
""", re.X)
_MAGIC = re.compile(r"^\s*(?:!(?!=)|%[%a-zA-Z]|\?|\w[\w.]*\s*\?\??\s*$)")  # not `!=`, `% b`
_KEYWORD_ARG = re.compile(r"\s*=(?!=)")


def _code_text(source: str) -> str:
    """``source`` with IPython magics and shell escapes blanked (their lines kept)."""
    lines = source.splitlines()
    if lines and re.match(r"\s*%%(?!time|timeit|capture)", lines[0]):
        return "\n" * len(lines)  # a cell magic: not Python (%%bash, %%writefile, ...)
    return "\n".join("" if _MAGIC.match(line) else line for line in lines) + "\n"


def _lex(text: str, line0: int = 1, rename: bool = True) -> list[tuple[str, int, int]]:
    """(token, line, column) of ``text``: the fallback of code that does not parse (and the lexer
    of ``ast.unparse``'s output, with ``rename=False``). Strings become ``STR``; a name the code
    chose becomes ``_`` unless it is kept, an attribute or a keyword argument."""
    out, line, start, line_start, depth = [], line0, 0, 0, 0
    for m in _LEX.finditer(text):
        newlines = text.count("\n", start, m.start())
        if newlines:
            line, line_start = line + newlines, text.rfind("\n", start, m.start()) + 1
        start, col = m.start(), m.start() - line_start
        kind, tok = m.lastgroup, m.group()
        if kind == "comment":
            continue
        if kind == "string":
            tok = "STR"
        elif kind == "op":
            depth += (tok in "([{") - (tok in ")]}")
        elif kind == "name" and rename and not keyword.iskeyword(tok) and tok not in KEEP and not (
                out and out[-1][0] == ".") and not (
                depth > 0 and _KEYWORD_ARG.match(text, m.end())):
            tok = "_"
        out.append((tok, line, col))
    return out


class _Strip(ast.NodeTransformer):
    """Names to ``_``, strings to ``STR``; docstrings, annotations, imports, asserts, raises and
    the ``if``s they leave empty removed."""

    def visit_FunctionDef(self, node):
        node.name, node.returns = "_", None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node.name = "_"
        return self.generic_visit(node)

    def visit_arg(self, node):
        node.arg, node.annotation = "_", None
        return node

    def visit_Name(self, node):
        if node.id not in KEEP:
            node.id = "_"
        return node

    def visit_Constant(self, node):
        if isinstance(node.value, (str, bytes)):
            return ast.copy_location(ast.Name("STR", ast.Load()), node)
        return node

    def visit_JoinedStr(self, node):
        return ast.copy_location(ast.Name("STR", ast.Load()), node)

    def visit_AnnAssign(self, node):
        if node.value is None:
            return None
        return self.visit(ast.copy_location(ast.Assign([node.target], node.value), node))

    def visit_ExceptHandler(self, node):
        node.name = "_" if node.name else None
        return self.generic_visit(node)

    def visit_Expr(self, node):  # docstrings, `...`, a bare name shown by the notebook
        if isinstance(node.value, (ast.Constant, ast.Name, ast.Attribute, ast.JoinedStr)):
            return None
        return self.generic_visit(node)

    def visit_If(self, node):
        self.generic_visit(node)
        if not node.body:
            return node.orelse or None
        return node

    def _drop(self, node):
        return None

    visit_Assert = visit_Raise = visit_Import = visit_ImportFrom = visit_Pass = _drop
    visit_Global = visit_Nonlocal = _drop


def _header(node) -> str:
    """The first line of a compound statement, as ``ast.unparse`` writes it; '' when simple."""
    u = ast.unparse
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "".join(f"@{u(d)} " for d in node.decorator_list) + f"def _({u(node.args)}):"
    if isinstance(node, ast.ClassDef):
        return f"class _({', '.join(u(b) for b in node.bases)}):"
    if isinstance(node, (ast.If, ast.While)):
        return f"{'if' if isinstance(node, ast.If) else 'while'} {u(node.test)}:"
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return f"for {u(node.target)} in {u(node.iter)}:"
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return f"with {', '.join(u(i) for i in node.items)}:"
    if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
        return "try:"
    return ""


def _emit(stmts, out: list, line0: int) -> None:
    """Append the tokens of ``stmts`` (transformed) to ``out``, each with its statement's line."""
    for node in stmts:
        line = getattr(node, "lineno", 1) + line0 - 1
        try:
            head = _header(node)
            text = head or ast.unparse(node)
        except (RecursionError, MemoryError):
            raise  # the piece is lexed as it is (_analyse)
        except Exception:  # noqa: BLE001 - a tree unparse cannot write: its tokens are lost
            head = text = ""
        out += [(t, line, 0) for t, _, _ in _lex(text, rename=False)]
        if not head:
            continue
        _emit(node.body, out, line0)
        for handler in getattr(node, "handlers", []):
            out += [(t, line, 0) for t, _, _ in _lex(
                f"except {ast.unparse(handler.type) if handler.type else ''}:", rename=False)]
            _emit(handler.body, out, line0)
        for field, word in (("orelse", "else"), ("finalbody", "finally")):
            if getattr(node, field, None):
                out.append((word, line, 0))
                _emit(getattr(node, field), out, line0)


def _parts(text: str, budget: int = 200):
    """``text`` cut into ``(tree, text, first_line)`` pieces: ``tree`` is None for a piece that
    does not parse. Before each syntax error, the longest prefix that parses; from the error to
    the next top-level statement, a piece lexed as it is. At most ``budget`` parses."""
    lines, pos, out = text.splitlines(keepends=True), 0, []

    def parse(a: int, b: int):
        return ast.parse("".join(lines[a:b])), "".join(lines[a:b]), a + 1

    while pos < len(lines) and budget > 0:
        budget -= 1
        try:
            return out + [parse(pos, len(lines))]
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            bad = pos + max(min((getattr(err, "lineno", None) or 1) - 1, len(lines) - pos - 1), 0)
        end = bad
        while end > pos and budget > 0:
            budget -= 1
            try:
                out.append(parse(pos, end))
                break
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                end -= 1
        nxt = next((i for i in range(bad + 1, len(lines)) if re.match(r"[^\s#)\]}]", lines[i])
                    and not re.match(r"(?:else|elif|except|finally)\b", lines[i])), len(lines))
        out.append((None, "".join(lines[end:nxt]), end + 1))
        pos = nxt
    if pos < len(lines):
        out.append((None, "".join(lines[pos:]), pos + 1))
    return out


def _raw_piece(text: str, line0: int):
    """``(tokens, functions)`` of code that does not parse: :func:`_lex`'s tokens, and the token
    span of the body of each ``def`` at column 0 (to the next line at column 0)."""
    raw, functions = _lex(text, line0), {}
    for i, (tok, line, col) in enumerate(raw):
        if tok == "def" and col == 0:
            name = re.match(r"\s*(\w*)", text.splitlines()[line - line0][3:]).group(1)
            depth, j = 0, i + 1
            while j < len(raw) and not (raw[j][0] == ":" and depth == 0):
                depth += (raw[j][0] in "([{") - (raw[j][0] in ")]}")
                j += 1
            stop = next((m for m in range(j, len(raw)) if raw[m][2] == 0 and raw[m][1] > line),
                        len(raw))
            functions[name] = (min(j + 1, len(raw)), stop)
    return raw, functions


def _tree_piece(tree: ast.Module, line0: int):
    """``(tokens, functions, last)`` of a parsed piece: its normalised tokens, the token span of
    each top-level function's body, and the name of the function it ends with (or None)."""
    names = {id(n): n.name for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    tokens, functions, last = [], {}, None
    for node in _Strip().visit(tree).body:
        out = []
        _emit([node], out, line0)
        last = names.get(id(node))
        if last is not None:
            body = []
            _emit(node.body, body, line0)
            functions[last] = (len(tokens) + len(out) - len(body), len(tokens) + len(out))
        tokens += out
    return tokens, functions, last


def _analyse(source: str, cell: int = 0):
    """``(tokens, functions)``: tokens ``[(token, cell, line)]`` of ``source`` normalised, and
    ``{name: (start, stop)}`` the token span of each top-level function's body."""
    tokens, functions, last = [], {}, None  # last: the function a parsed piece ended in
    for tree, text, line0 in _parts(_code_text(source or "")):
        piece = None
        if tree is not None:
            try:
                piece = _tree_piece(tree, line0)
            except (RecursionError, MemoryError):  # too deep for the transformer: lexed as is
                piece = None
        if piece is None:
            raw, found = _raw_piece(text, line0)
            if last is not None:  # the rest of a function cut by a syntax error
                stop = next((m for m, tok in enumerate(raw) if tok[2] == 0), len(raw))
                functions[last] = (functions[last][0], len(tokens) + stop)
            piece = (raw, found, None)
        out, found, last = piece
        functions.update({name: (a + len(tokens), b + len(tokens))
                          for name, (a, b) in found.items()})
        tokens += [(t, cell, line) for t, line, _ in out]
    return tokens, functions


def normalised_tokens(source: str) -> list[str]:
    """The tokens of ``source`` with the names it chose renamed ``_`` (builtins, ``torch``-like
    modules, attributes and keyword arguments kept), strings ``STR``, docstrings, comments,
    annotations, imports, ``assert``/``raise`` statements and the ``if``s they leave empty
    removed. Code that does not parse is lexed as it is (its names renamed, its strings ``STR``)
    from the line of the syntax error to the next top-level statement."""
    return [tok for tok, _, _ in _analyse(source)[0]]


def _body(source: str) -> list[str]:
    """The tokens of the body of the first function of ``source`` (all of them if none)."""
    tokens, functions = _analyse(source)
    if functions:
        start, stop = next(iter(functions.values()))
        tokens = tokens[start:stop]
    return [t for t, _, _ in tokens]


# --- fingerprints -------------------------------------------------------------------------------


def _fingerprints(tokens, k: int = K, w: int = W) -> dict[int, list[int]]:
    """Winnowed k-gram hashes of ``tokens`` -> the positions of their k-grams (MOSS)."""
    tokens = [t if isinstance(t, str) else t[0] for t in tokens]
    if not tokens:
        return {}
    grams = [" ".join(tokens[i:i + k]) for i in range(max(len(tokens) - k + 1, 1))]
    hashes = [int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "big")
              for g in grams]
    chosen: dict[int, list[int]] = {}
    for i in range(max(len(hashes) - w + 1, 1)):
        window = hashes[i:i + w]
        j = i + max(range(len(window)), key=lambda m: (-window[m], m))  # rightmost minimum
        if j not in chosen.setdefault(hashes[j], []):
            chosen[hashes[j]].append(j)
    return chosen


def _dice(a, b) -> float:
    return 2 * len(set(a) & set(b)) / (len(a) + len(b)) if a and b else 0.0


def _tokens_of(x) -> list[str]:
    return normalised_tokens(x) if isinstance(x, str) else list(x)


def similarity(a, b) -> float:
    """Dice coefficient of the winnowed fingerprints of ``a`` and ``b`` (sources or token lists),
    in [0, 1]: 1.0 for code equal up to names, strings, annotations and input checks; 0.0 when
    either is empty."""
    return _dice(_fingerprints(_tokens_of(a)), _fingerprints(_tokens_of(b)))


def containment(part, whole) -> float:
    """The fraction of ``part``'s fingerprints found in ``whole`` (sources or token lists)."""
    p, w = _fingerprints(_tokens_of(part)), _fingerprints(_tokens_of(whole))
    return len(set(p) & set(w)) / len(p) if p else 0.0


def difflib_ratio(a, b) -> float:
    """difflib's ratio of the two normalised token lists (measured for comparison only)."""
    return difflib.SequenceMatcher(None, _tokens_of(a), _tokens_of(b), autojunk=False).ratio()


# --- the package --------------------------------------------------------------------------------


def package_sources(dotted_names) -> dict[str, str]:
    """``{"module:function": source}`` of the package's functions (``inspect.getsource``); a name
    that cannot be found is left out."""
    import importlib
    import inspect

    out = {}
    for dotted in dotted_names:
        module, _, attr = dotted.partition(":")
        try:
            obj = importlib.import_module(module)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
            out[dotted] = inspect.getsource(obj)
        except (ImportError, AttributeError, OSError, TypeError):
            continue
    return out


def package_answers(assignment: str) -> dict[str, tuple[str, ...]]:
    """``{student function: ("agentic_rl.module:function", ...)}`` read (not imported) from the
    assignment's ``answer_key/<a>_checks.py``: the answers its ``@check(name, ANSWERS)`` name."""
    path = HERE / assignment / "answer_key" / f"{assignment}_checks.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    consts: dict[str, tuple] = {}

    def value(node) -> tuple:
        if isinstance(node, ast.Tuple):
            return tuple(e.value for e in node.elts if isinstance(e, ast.Constant))
        if isinstance(node, ast.Name):
            return consts.get(node.id, ())
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return value(node.left) + value(node.right)
        return ()

    answers: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            consts[node.targets[0].id] = value(node.value)
        for dec in getattr(node, "decorator_list", []):
            if (isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "check"
                    and dec.args and isinstance(dec.args[0], ast.Constant)):
                found = value(dec.args[1]) if len(dec.args) > 1 else ()
                name = dec.args[0].value
                answers[name] = tuple(dict.fromkeys(answers.get(name, ()) + tuple(
                    d for d in found if isinstance(d, str) and d.startswith("agentic_rl"))))
    return answers


def assignment_answers(assignment: str) -> tuple[str, ...]:
    """Every package answer of ``assignment`` (:func:`package_answers`), sorted."""
    return tuple(sorted({d for ds in package_answers(assignment).values() for d in ds}))


def functions_of(cells) -> dict[str, str]:
    """``{name: source}`` of the top-level functions defined in ``cells`` (sources or
    ``(k, source)`` pairs), each to the next top-level statement (a function cut by a syntax error
    keeps its lines); the last definition of a name wins, as when the notebook runs."""
    out = {}
    for _, source in _numbered(cells):
        text = _code_text(source)
        lines = text.splitlines()
        starts = [i for i, line in enumerate(lines) if re.match(r"[^\s#)\]}]", line)]
        defs = []  # (name, first line, last line at least), 0-based
        for tree, chunk, line0 in _parts(text):
            if tree is None:
                defs += [(m.group(1), line0 - 1 + i, line0 - 1 + i)
                         for i, line in enumerate(chunk.splitlines())
                         for m in [re.match(r"(?:async\s+)?def\s+(\w+)", line)] if m]
                continue
            defs += [(node.name, min([node.lineno] + [d.lineno for d in node.decorator_list])
                      + line0 - 2, node.end_lineno + line0 - 2) for node in tree.body
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for name, first, last in defs:
            stop = next((i for i in starts if i > last), len(lines))
            out[name] = "\n".join(lines[first:stop]).rstrip() + "\n"
    return out


def package_similarity(functions, package: dict[str, str], threshold: float = THRESHOLD, *,
                       ignore=NOT_TELLING) -> list[tuple[str, str, float]]:
    """``(student function, "module:function", score)`` for the scores >= ``threshold``, best
    first: each student function's body against each package function's body (similarity), then
    each package function's body contained in the student's whole code (:data:`WHOLE`: a helper
    split off), for a package function not found already.

    ``functions``: ``{name: source}``, or the student's cells (:func:`student_code`), whose
    functions are then :func:`functions_of` and whose whole code is every cell. The package
    functions named in ``ignore`` are not compared (:data:`NOT_TELLING`)."""
    if isinstance(functions, dict):
        chunks = list(functions.values())
    else:
        chunks = [s for _, s in _numbered(functions)]
        functions = functions_of(chunks)
    theirs = {dotted: _fingerprints(_body(src)) for dotted, src in package.items()
              if dotted not in set(ignore or ())}
    found = []
    for name, source in functions.items():
        mine = _fingerprints(_body(source))
        scores = {dotted: _dice(mine, fp) for dotted, fp in theirs.items()}
        found += [(name, d, round(v, 3)) for d, v in scores.items() if v >= threshold]
    everything = set(_fingerprints([t for c in chunks for t in normalised_tokens(c)]))
    for dotted, fp in theirs.items():
        if len(fp) >= MIN_FINGERPRINTS and dotted not in {d for _, d, _ in found}:
            score = len(set(fp) & everything) / len(fp)
            if score >= threshold:
                found.append((WHOLE, dotted, round(score, 3)))
    return sorted(found, key=lambda f: (-f[2], f[0], f[1]))


def copy_review(cells, answers, threshold: float = THRESHOLD) -> str:
    """The review column of the grades CSV: ``"name ~ module:function 0.98; ..."`` for the
    student's code that copies one of ``answers`` (``"module:function"`` names, e.g.
    :func:`assignment_answers`), or ''."""
    found = package_similarity(cells, package_sources(answers), threshold)
    return "; ".join(f"{name} ~ {dotted} {score:.2f}" for name, dotted, score in found)


# --- the class report ---------------------------------------------------------------------------


def _ranges(numbers) -> str:
    numbers, out = sorted(set(numbers)), []
    for n in numbers:
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _where(tokens, fingerprints, shared) -> str:
    """The cells and lines of ``tokens`` that carry the ``shared`` fingerprints."""
    lines: dict[int, set[int]] = {}
    for h in shared:
        for pos in fingerprints[h]:
            for _, cell, line in tokens[pos:pos + K]:
                lines.setdefault(cell, set()).add(line)
    return "; ".join(f"cell {c}, lines {_ranges(ls)}" for c, ls in sorted(lines.items()))


def _prints(cells, base: set) -> dict:
    """``{what: (tokens, fingerprints without the base)}`` of one submission: WHOLE and each
    top-level function (its body)."""
    tokens, spans = [], {}
    for k, source in _numbered(cells):
        cell_tokens, functions = _analyse(source, k)
        spans.update({name: (a + len(tokens), b + len(tokens))
                      for name, (a, b) in functions.items()})
        tokens += cell_tokens
    out = {}
    for what, (a, b) in [(WHOLE, (0, len(tokens)))] + sorted(spans.items()):
        fp = _fingerprints(tokens[a:b])
        out[what] = (tokens[a:b], {h: p for h, p in fp.items() if h not in base})
    return out


def class_report(submissions: dict, top: int = 20, release=None) -> str:
    """Markdown: the ``top`` most similar pairs of submissions (per function, and whole code), with
    their similarity and the lines of each to read side by side.

    ``submissions``: ``{student: cells}`` (sources or ``(k, source)`` pairs: use
    :func:`student_cells`). The fingerprints of the release's code (``release``: its notebook, or
    its cells) are taken out of every submission first, so the stubs, the set-up and a changed
    self-check cell make no pair similar."""
    base_cells = (release if isinstance(release, (list, tuple)) else
                  [s for _, s in _code_cells(release)]) if release is not None else []
    base = set()
    for _, source in _numbered(base_cells):
        base |= set(_fingerprints(_analyse(source)[0]))
    prints = {student: _prints(cells, base) for student, cells in submissions.items()}
    rows = []
    names = sorted(prints)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for fa_name, (ta, fa) in prints[a].items():  # a function renamed is compared too
                for fb_name, (tb, fb) in prints[b].items():
                    score = _dice(fa, fb)
                    if score > 0 and (fa_name == WHOLE) == (fb_name == WHOLE):
                        what = (WHOLE if fa_name == WHOLE else f"`{fa_name}`" if fa_name ==
                                fb_name else f"`{fa_name}` / `{fb_name}`")
                        rows.append((score, a, b, what, ta, fa, tb, fb))
    rows.sort(key=lambda r: (-r[0], r[3] == WHOLE, r[1], r[2], r[3]))
    out = [f"# The most similar pairs of submissions ({len(names)} submissions)", "",
           f"Similarity: the Dice coefficient of winnowed {K}-gram fingerprints of the code with "
           "names, strings, comments, annotations and input checks ignored, the release's own "
           f"code taken out; per function (its body) and for the whole code. From "
           f"{THRESHOLD} up, read the two side by side; honest pairs can score high on a short "
           "function that has one natural way to be written.", "",
           "| # | students | code | similarity | lines to read (first) | lines to read (second) |",
           "|---|---|---|---|---|---|"]
    for n, (score, a, b, what, ta, fa, tb, fb) in enumerate(rows[:top], start=1):
        shared = set(fa) & set(fb)
        out.append(f"| {n} | {a} / {b} | {what} | {score:.2f} | {_where(ta, fa, shared)} | "
                   f"{_where(tb, fb, shared)} |")
    if not rows:
        out.append("| | no two submissions share code | | | | |")
    return "\n".join(out) + "\n"


# --- command line -------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=pathlib.Path, help="notebooks or folders")
    parser.add_argument("--assignment", required=True, choices=_ASSIGNMENTS)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    args = parser.parse_args(argv)
    notebooks, suffix = {}, f"/{args.assignment}_assignment"
    for path in args.paths:  # students named as grade.py names them
        found = [(p.relative_to(path).with_suffix("").as_posix(), p) for p in sorted(
            path.rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts] if path.is_dir() else [
            (path.stem, path)]
        notebooks.update({s.removesuffix(suffix) if s.endswith(suffix) else s: p
                          for s, p in found})
    release = release_notebook(args.assignment)
    package = package_sources(assignment_answers(args.assignment))
    submissions = {}
    for student, path in sorted(notebooks.items()):
        cells = student_cells(path, release)
        submissions[student] = cells
        if not _read_notebook(path):
            print(f"{student}: {path} is not a readable notebook")
        copies = package_similarity(cells, package, args.threshold)
        for line in [f"{n} ~ {d} {s:.2f}" for n, d, s in copies] + review_flags(cells, release):
            print(f"{student}: {line}")
    print(class_report(submissions, args.top, release))
    return 0


if __name__ == "__main__":
    sys.exit(main())
