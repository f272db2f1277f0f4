"""The static similarity check of submissions (``labs/assignments/similarity.py``).

Copies of the package's answers (renamed, without annotations, the body under the stub's ``def``
line, without the input checks, split into a helper) score at or above the threshold; the masters'
reference solutions, honest answers written differently and the planted bugs of ``cases.json``
score below it; the review regex flags each kind of tampering and no honest line; the class report
ranks a copied pair first; bad input never crashes. ``python tests/test_similarity.py`` prints the
measured table that the module's docstring quotes.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import pathlib
import re
import sys
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSIGNMENTS = ROOT / "labs" / "assignments"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ASSIGNMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = _load("similarity")
#: the package answers measured: (dotted name, assignment, the student's function)
MEASURED = (("agentic_rl.advantages:group_advantages", "grpo", "group_advantages"),
            ("agentic_rl.losses:aggregate", "grpo", "aggregate"),
            ("agentic_rl.advantages:gae", "gae", "gae"),
            ("agentic_rl.gigpo:discounted_returns", "gigpo", "discounted_returns"),
            ("agentic_rl.rcgrpo:draw_conditions", "rcgrpo", "draw_conditions"))
NAMES = [a for a in S._ASSIGNMENTS if (ASSIGNMENTS / a / "answer_key").is_dir()]


# --- the masters' solutions, the planted bugs, the stubs ---------------------------------------


def master_solutions(assignment: str) -> dict[str, str]:
    """``{function: the solution cell}`` of the master, the BEGIN/END SOLUTION lines removed."""
    text = (ASSIGNMENTS / assignment / "answer_key" / f"{assignment}_assignment.md").read_text()
    out = {}
    for cell in re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", text, re.S):
        if "# BEGIN SOLUTION" in cell:
            code = re.sub(r"[ \t]*# (?:BEGIN|END) SOLUTION\n", "", cell)
            for name in re.findall(r"^def (\w+)\(", code, re.M):
                out[name] = code
    return out


def planted_bugs(assignment: str) -> list[tuple[str, str, str]]:
    """``(bug name, function, edited solution cell)`` of ``cases.json``."""
    cases = json.loads((ASSIGNMENTS / assignment / "answer_key" / "cases.json").read_text())
    solutions, out = master_solutions(assignment), []
    for bug in cases["bugs"]:
        source = solutions[bug["function"]]
        edited = bug["replace"] if "replace" in bug else source.replace(bug["old"], bug["new"])
        out.append((bug["name"], bug["function"], edited))
    return out


def stub(assignment: str, function: str) -> str:
    """The release's cell of ``function`` without its ``...`` line: the def line and docstring."""
    for _, source in S._code_cells(S.release_notebook(assignment)):
        if f"def {function}(" in source:
            return re.sub(r"\n\s*\.\.\.\s*$", "\n", source.rstrip()) + "\n"
    raise LookupError(function)


# --- cheats -------------------------------------------------------------------------------------


def _function(source: str) -> ast.FunctionDef:
    return ast.parse(source).body[0]


def renamed(source: str) -> str:
    """Every name the function binds (its own, its parameters, its variables) renamed, by token."""
    fn = _function(source)
    bound = {fn.name} | {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)} | {
        n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    new = {name: f"my_{name[::-1]}" for name in bound}
    lines = source.splitlines(keepends=True)
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for k in range(len(toks) - 1, -1, -1):
        tok = toks[k]
        if tok.type == tokenize.NAME and tok.string in new and toks[k - 1].string != ".":
            (row, a), (_, b) = tok.start, tok.end
            lines[row - 1] = lines[row - 1][:a] + new[tok.string] + lines[row - 1][b:]
    return "".join(lines)


def without_annotations(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, ast.FunctionDef):
            node.returns = None
    return ast.unparse(tree) + "\n"


def _body_lines(source: str) -> list[str]:
    fn = _function(source)
    return source.splitlines(keepends=True)[fn.body[0].lineno - 1:]


def under_stub(source: str, stub_cell: str) -> str:
    """The package function's body (docstring and all) pasted under the stub's def and docstring."""
    return stub_cell + "".join(_body_lines(source))


def without_checks(source: str) -> str:
    """The input checks (``if ...: raise``) and asserts deleted from the function's lines."""
    fn, lines = _function(source), source.splitlines(keepends=True)
    drop = set()
    for node in fn.body:
        if isinstance(node, ast.Assert) or (isinstance(node, ast.If) and all(
                isinstance(s, ast.Raise) for s in node.body) and not node.orelse):
            drop |= set(range(node.lineno - 1, node.end_lineno))
    return "".join(line for k, line in enumerate(lines) if k not in drop)


def split_helper(source: str) -> str:
    """The body cut in two: its first half in a helper that returns what it bound, the second
    half in the function, which calls the helper (a helper split off)."""
    fn = _function(source)
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(
        s.value, ast.Constant))]
    half = max(len(body) // 2, 1)
    bound = sorted({n.id for s in body[:half] for n in ast.walk(s)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}) or ["_"]
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    seg = [ast.get_source_segment(source, s, padded=True) + "\n" for s in body]
    helper = (f"def _first_part({', '.join(params)}):\n" + "".join(seg[:half])
              + f"    return {', '.join(bound)}\n")
    main = (f"def {fn.name}({', '.join(params)}):\n"
            f"    {', '.join(bound)}, = _first_part({', '.join(params)})\n" + "".join(seg[half:]))
    return helper + "\n\n" + main


CHEATS = {"renamed copy": renamed,
          "copy without annotations (and renamed)": lambda s: renamed(without_annotations(s)),
          "package body under the stub's def line": None,  # needs the stub: see cheats()
          "copy with the input checks removed": without_checks}


def cheats(dotted: str, assignment: str, function: str) -> dict[str, str]:
    source = S.package_sources([dotted])[dotted]
    out = {kind: build(source) for kind, build in CHEATS.items() if build}
    out["package body under the stub's def line"] = under_stub(source, stub(assignment, function))
    return out


# --- honest answers written differently (ours) --------------------------------------------------

HONEST = {
    "agentic_rl.advantages:group_advantages": '''
def group_advantages(scores, group_ids, scale="group", eps=1e-6):
    """Vectorised: group sums with index_add_."""
    x = scores.to(torch.float64)
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    means = torch.zeros(len(counts), dtype=x.dtype).index_add_(0, inv, x) / counts
    dev = x - means[inv]
    sq = torch.zeros_like(means).index_add_(0, inv, dev ** 2)
    stds = torch.sqrt(sq / (counts - 1).clamp(min=1))
    if scale == "none":
        return dev.to(scores.dtype)
    spread = stds[inv] if scale == "group" else x.std()
    return (dev / (spread + eps)).to(scores.dtype)
''',
    "agentic_rl.losses:aggregate": '''
def aggregate(loss_mat, mask, mode, norm_constant=None):
    """A loop over the rows."""
    total, count, per_row = 0.0, 0, []
    L = loss_mat.shape[1] if norm_constant is None else norm_constant
    for row, keep in zip(loss_mat, mask.bool()):
        if not keep.any():
            continue
        s = row[keep].sum()
        total, count = total + s, count + int(keep.sum())
        per_row.append(s / int(keep.sum()) if mode == "seq-mean-token-mean" else s / L)
    if mode == "token-mean":
        return total / max(count, 1)
    return torch.stack(per_row).mean() if per_row else loss_mat.sum() * 0
''',
    "agentic_rl.advantages:gae": '''
def gae(token_rewards, values, mask, gamma, lam):
    """Per row, over the list of its valid positions."""
    adv = torch.zeros_like(values)
    for b in range(values.shape[0]):
        running, after = 0.0, 0.0
        for t in reversed(mask[b].nonzero().flatten().tolist()):
            running = token_rewards[b, t] + gamma * after - values[b, t] + gamma * lam * running
            adv[b, t] = running
            after = values[b, t]
    return adv, (adv + values) * mask
''',
    "agentic_rl.gigpo:discounted_returns": '''
def discounted_returns(step_rewards, episode_ids, gamma):
    """Episode by episode, forwards over the reversed segment."""
    rewards, ids, out, start = [float(r) for r in step_rewards], list(episode_ids), [], 0
    while start < len(ids):
        end = start
        while end < len(ids) and ids[end] == ids[start]:
            end += 1
        acc, seg = 0.0, []
        for r in reversed(rewards[start:end]):
            acc = r + gamma * acc
            seg.append(acc)
        out.extend(reversed(seg))
        start = end
    return out
''',
    "agentic_rl.rcgrpo:draw_conditions": '''
def draw_conditions(num_groups, group_size, p_high, assignment, rng):
    """The high positions drawn with rng.sample."""
    if assignment == "bernoulli":
        tokens = []
        for _ in range(num_groups * group_size):
            tokens.append(rng.random() < p_high)
        return tokens
    n_high = max(1, min(group_size - 1, int(round(p_high * group_size))))
    result = []
    for g in range(num_groups):
        high = set(rng.sample(range(group_size), n_high))
        result += [i in high for i in range(group_size)]
    return result
''',
}


# --- measurements -------------------------------------------------------------------------------


def _score(function_source: str, dotted: str) -> float:
    package = S.package_sources([dotted])
    return S.similarity(S._body(function_source), S._body(package[dotted]))


def measure() -> dict:
    """Every number of the module's table, by package function."""
    out = {}
    for dotted, assignment, function in MEASURED:
        package = S.package_sources([dotted])
        row = {kind: _score(code, dotted) for kind, code in cheats(dotted, assignment,
                                                                   function).items()}
        row["difflib, renamed copy"] = S.difflib_ratio(S._body(cheats(
            dotted, assignment, function)["renamed copy"]), S._body(package[dotted]))
        split = split_helper(package[dotted])
        row["split into a helper: whole-code containment"] = S.containment(
            S._body(package[dotted]), S.normalised_tokens(split))
        master = master_solutions(assignment)[function]
        row["master's solution"] = _score(master, dotted)
        row["difflib, master's solution"] = S.difflib_ratio(S._body(master),
                                                            S._body(package[dotted]))
        row["honest variant"] = _score(HONEST[dotted], dotted)
        bugs = [_score(code, dotted) for _, f, code in planted_bugs(assignment) if f == function]
        row["planted bugs (max)"] = max(bugs) if bugs else None
        out[dotted] = row
    return out


def measure_masters() -> list[tuple[str, str, float, float]]:
    """Each master solution against each package answer of its question, and the master's whole
    code (every solution) contained in... : (assignment, function, score, whole containment)."""
    rows = []
    for assignment in NAMES:
        answers = S.package_answers(assignment)
        solutions = master_solutions(assignment)
        whole = S.normalised_tokens("\n\n".join(solutions.values()))
        package = S.package_sources(sorted({d for ds in answers.values() for d in ds}))
        for function, source in solutions.items():
            for dotted in answers.get(function, ()):
                if dotted in package:
                    rows.append((f"{assignment}:{function}", dotted,
                                 S.similarity(S._body(source), S._body(package[dotted])),
                                 S.containment(S._body(package[dotted]), whole)))
    return rows


# --- tests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured():
    return measure()


@pytest.mark.parametrize("dotted", [m[0] for m in MEASURED])
def test_each_cheat_is_flagged_and_each_honest_answer_is_not(measured, dotted):
    row = measured[dotted]
    for kind in CHEATS:
        assert row[kind] >= S.THRESHOLD, (dotted, kind, row[kind])
    split = row["split into a helper: whole-code containment"]
    # a 5-statement body loses the k-grams across both cuts: documented in the module
    assert split >= (0.8 if dotted.endswith(":group_advantages") else S.THRESHOLD), split
    for kind in ("master's solution", "honest variant", "planted bugs (max)"):
        assert row[kind] is None or row[kind] < S.THRESHOLD, (dotted, kind, row[kind])


def test_package_similarity_finds_each_cheat_in_the_students_cells():
    dotted, assignment, function = MEASURED[0]
    package = S.package_sources([a for a, _, _ in MEASURED])
    for kind, code in cheats(dotted, assignment, function).items():
        found = S.package_similarity([code], package)
        assert found and found[0][1] == dotted and found[0][2] >= S.THRESHOLD, (kind, found)
    gae = MEASURED[2][0]
    split = split_helper(package[gae])
    assert (S.WHOLE, gae) in [(n, d) for n, d, _ in S.package_similarity([split], package)]
    helpers = S.package_sources(["agentic_rl.advantages:group_stats",
                                 "agentic_rl.advantages:_group_index"])
    assert len(helpers) == 2  # the review's case: the answer and its helpers, renamed, no hints
    cells = [renamed(without_annotations(src)) for src in [package[dotted], *helpers.values()]]
    found = S.package_similarity(cells, package)
    assert [(d, v) for _, d, v in found] == [(dotted, 1.0)], found
    honest = [master_solutions(a)[f] for _, a, f in MEASURED] + list(HONEST.values())
    assert S.package_similarity(honest, package) == []
    review = S.copy_review([cheats(dotted, assignment, function)["renamed copy"]], [dotted])
    assert review.startswith(f"my_{function[::-1]} ~ {dotted} 1.00")


def test_no_master_solution_reaches_the_threshold_but_the_untelling_ones():
    rows = measure_masters()
    assert len(rows) >= 15
    high = {dotted for _, dotted, score, whole in rows if max(score, whole) >= S.THRESHOLD}
    assert high == set(S.NOT_TELLING), rows
    review = S.copy_review([master_solutions("starpo")["distinct_per_group"]],
                           ["agentic_rl.starpo:distinct_per_group"])
    assert review == ""


TAMPERING = {
    "patched gradelib.check": "import gradelib\ngradelib.check = lambda *a: (lambda f: f)\n",
    "otter's run_doctest reassigned": (
        "from otter.test_files import abstract_test\n"
        "abstract_test.TestFile.run_doctest = lambda *a, **k: None\n"),
    "otter reached through the grader": "grader._otter.test_files.OKTestFile.run = print\n",
    "reading the expected values": "REF = json.load(open('grpo' + '_reference.json'))\n",
    "importlib with a split name": "m = importlib.import_module('agen' + 'tic_rl.advantages')\n",
    "__import__ with a split name": "m = __import__('agen' + 'tic_rl', fromlist=['x'])\n",
    "getattr with a split name": "group_advantages = getattr(m, 'group_' + 'advantages')\n",
    "exec of the package source": "exec(inspect.getsource(m.group_advantages))\n",
    "/proc/": "cmd = open('/proc/self/cmdline').read()\n",
    "os._exit": "import os\nos._exit(0)\n",
    "listing other files": "print(os.listdir('..'))\n",
    "glob of other notebooks": "names = glob.glob('../*/*.ipynb')\n",
    "a shell command": "!ls ../ && cat ../bob/*.ipynb\n",
    "the namespace rewritten": "globals()['group_advantages'] = m.group_advantages\n",
    "characters built one by one": "name = ''.join(chr(c) for c in (103, 114, 97, 100))\n",
    "torch.allclose replaced": "torch.allclose = lambda *a, **k: True\n",
    "the package imported": "from agentic_rl.advantages import group_stats\n",
    "sys.modules patched": "sys.modules['grpo_checks'].many_groups = lambda *a: None\n",
}


def test_review_flags_each_kind_of_tampering():
    for kind, code in TAMPERING.items():
        cell = "def group_advantages(scores, group_ids):\n    return scores\n\n" + code
        flags = S.review_flags([cell])
        assert flags, kind
        assert all(f.startswith("cell 1, line ") for f in flags)
        assert any(int(f.split(",")[1].split()[1].rstrip(":")) >= 4 for f in flags), (
            kind, flags)
    flags = S.review_flags([(7, "x = 1\nexec(code)  # run it\n")])
    assert flags == ["cell 7, line 2: `exec(code)  # run it` (runs code built from a string)"]


def test_review_flags_no_honest_line():
    honest = [code for a in NAMES for code in master_solutions(a).values()]
    honest += [code for a in NAMES for _, _, code in planted_bugs(a)] + list(HONEST.values())
    assert S.review_flags(honest) == []
    for assignment in NAMES:  # the release's own cells: set-up, grader.check, self-checks
        cells = S._code_cells(S.release_notebook(assignment))
        assert cells and S.review_flags(cells) == [], assignment
    assert S.review_flags(["# importlib, getattr(x) and exec(y) are only mentioned here\n"]) == []


def test_student_code_leaves_the_release_out(tmp_path):
    release = S.release_notebook("grpo")
    nb = json.loads(release.read_text())
    assert S.student_code(nb, release) == []
    assert len(S.student_code(nb)) == len(S._code_cells(release))
    k = next(i for i, c in enumerate(nb["cells"]) if "def group_advantages(" in "".join(
        c["source"]))
    nb["cells"][k]["source"] = master_solutions("grpo")["group_advantages"]
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [],
                        "execution_count": None, "source": ["print(1)\n", "x = 2"]})
    path = tmp_path / "alice.ipynb"
    path.write_text(json.dumps(nb))
    cells = S.student_cells(path, release)
    assert [k for k, _ in cells] == [k + 1, len(nb["cells"])]
    assert cells[1][1] == "print(1)\nx = 2"
    gae = json.loads(S.release_notebook("gae").read_text())  # a self-check cell, changed
    cell = next(c for c in gae["cells"] if "reference_gae" in "".join(c["source"]))
    cell["source"] = "".join(cell["source"]) + "\nprint('mine')\n"
    changed = S.student_cells(gae, S.release_notebook("gae"))
    assert len(changed) == 1 and "import gae as reference_gae" in changed[0][1]
    assert S.review_flags(changed) == []
    assert S.review_flags([changed[0][1] + "from agentic_rl.advantages import gae\n"])


def test_class_report_ranks_a_copied_pair_first():
    dotted, assignment, function = MEASURED[0]
    release = S.release_notebook(assignment)
    stub_cell = stub(assignment, function)
    honest = {"alice": master_solutions(assignment)[function], "bob": HONEST[dotted],
              "carol": stub_cell + "    import torch\n    out = torch.zeros_like(scores)\n"
              "    for g in set(group_ids.tolist()):\n        rows = group_ids == g\n"
              "        out[rows] = scores[rows] - scores[rows].mean()\n"
              "        if scale == 'group' and rows.sum() > 1:\n"
              "            out[rows] /= scores[rows].std() + eps\n    return out\n"}
    copied = renamed(honest["bob"]).replace("counts", "sizes")
    submissions = {name: [(4, code)] for name, code in honest.items()}
    submissions["dave"] = [(4, copied), (9, "print('done')\n")]
    report = S.class_report(submissions, top=5, release=release)
    table = [line for line in report.splitlines() if line.startswith("| 1 ")]
    assert table and "bob / dave" in table[0], report
    assert float(table[0].split("|")[4]) >= S.THRESHOLD, table  # return_counts= became sizes
    assert "cell 4, lines" in table[0]
    assert len([line for line in report.splitlines() if re.match(r"\| \d", line)]) <= 5
    assert "no two submissions" in S.class_report({"a": [], "b": ["x = 1\n"]})


def test_bad_input_never_crashes(tmp_path):
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{not json")
    assert S.student_code(broken) == [] and S.student_code(tmp_path / "missing.ipynb") == []
    assert S.student_code({"cells": [{"cell_type": "code"}, 3, {"source": None}]}) == []
    assert S.student_code({"cells": "nope"}) == [] and S.student_code(None) == []
    source = S.package_sources(["agentic_rl.advantages:gae"])["agentic_rl.advantages:gae"]
    tail = source.rstrip() + "\n    return (\n"  # a syntax error in the last line
    assert S.similarity(S._body(tail), S._body(source)) >= S.THRESHOLD
    assert "gae" in S.functions_of([tail])
    middle = source.replace("    B, T = values.shape\n", "    B, T = = values.shape\n")
    assert S.similarity(S._body(middle), S._body(source)) > 0.5
    assert S.similarity(S._body(middle), S._body(source)) >= S.THRESHOLD
    deep = "x = " + "+".join(["a"] * 900) + "\n"  # parses, too deep for the transformer
    cases = ["", "\n", "def", "(((", "'''", "%%bash\nls\n", "!ls\n%time x = 1\n", "\x00", "@\n",
            "def f(:\n  pass\n" * 50, "if x:\n" + "    y = (\n" * 30, "lambda: (yield)", deep]
    assert len(S.normalised_tokens(deep)) == 1801
    for junk in cases:
        S.normalised_tokens(junk)
        S.review_flags([junk])
        S.functions_of([junk])
        S.package_similarity([junk], {"a:b": source})
    assert S.similarity("", source) == 0.0 and S.class_report({}).startswith("# The most")
    assert S.review_flags([None, 3]) == []
    assert S.package_sources(["agentic_rl.nowhere:x", "agentic_rl.advantages:nothing"]) == {}


def test_normalisation_ignores_what_it_says():
    a = ("def f(x: int, y: float = 1.0) -> int:\n    '''Doc.'''\n    assert x > 0, 'positive'\n"
         "    if y < 0:\n        raise ValueError(f'bad {y}')  # no\n    import math\n"
         "    total: float = x * y\n    return math.floor(total + len('abc'))\n")
    b = "def g(p, q=1.0):\n    s = p * q\n    return math.floor(s + len('xyz'))\n"
    assert S.normalised_tokens(a) == S.normalised_tokens(b)
    assert S.normalised_tokens("torch.sum(x, dim=1)") == ["torch", ".", "sum", "(", "_", ",",
                                                          "dim", "=", "1", ")"]
    assert S.similarity(a, b) == 1.0
    assert S.package_answers("grpo")["group_advantages"] == (
        "agentic_rl.advantages:group_advantages",)


def main() -> None:
    """Print the measured table (the module's docstring quotes it)."""
    rows = measure()
    kinds = list(next(iter(rows.values())))
    print(f"{'case':50s} " + " ".join(f"{d.split(':')[1][:12]:>12s}" for d in rows))
    for kind in kinds:
        print(f"{kind:50s} " + " ".join(
            f"{'--' if rows[d][kind] is None else format(rows[d][kind], '.2f'):>12s}"
            for d in rows))
    print("\nmaster solution vs package answer: body similarity, whole-code containment")
    for name, dotted, score, whole in measure_masters():
        print(f"{name:40s} {dotted:45s} {score:.2f} {whole:.2f}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
