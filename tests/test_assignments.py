"""The graded assignments' autograders, graded themselves.

Each autograder (``labs/assignments/<chapter>/test_<chapter>_assignment.py``) runs in a subprocess,
as a student runs it, twice: against the student notebook as shipped (stubs that raise
``NotImplementedError``: every check must fail, with one sentence naming the function and no
traceback from the grader) and against the reference solution in ``solutions/`` (every check must
pass). A third run feeds a solution with a planted bug and expects a sentence naming what differs.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import jupytext
import pytest
from jupytext.compare import compare_notebooks

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSIGNMENTS = ROOT / "labs" / "assignments"

#: chapter -> the functions its student notebook must define (each must appear in a failure message)
FUNCTIONS = {
    "grpo": ["group_advantages", "aggregate", "clipped_token_loss"],
    "gae": ["gae", "masked_whiten", "value_loss"],
    "retool": ["tool_output_mask", "spurious_logit_gradient", "resample_on_correct"],
    "starpo": ["reward_std_filter", "distinct_per_group", "expected_bandit_gradient"],
    "rcgrpo": ["draw_conditions", "zero_std_fraction", "expected_group_variance"],
    "gcd": ["risky_advantage_weight", "judgement_labels", "gradient_cosine"],
    "gigpo": ["discounted_returns", "anchor_groups", "gigpo_advantages"],
    "early_experience": ["keep_alternatives", "world_model_row", "reflection_row"],
}

#: a planted bug per chapter (a line of the solution replaced), and what the grader must say
BUGS = {
    "grpo": ("std = s[rows].std() if", "std = s[rows].std(unbiased=False) if",
             "`group_advantages` is wrong for rewards (1, 0, 0, 1) in one group: the std must be "
             "the unbiased one"),
    "gae": ("next_value = torch.where(m[:, t] > 0, values[:, t], next_value)",
            "next_value = values[:, t]",
            "`gae` is wrong for a row with observation tokens (mask 0) between the actions"),
    "retool": ("after_first = sampled.long().cumsum(-1) > 0",
               "after_first = torch.ones_like(sampled)",
               "`tool_output_mask` is wrong for the chapter's right-padded row (prompt, code, "
               "interpreter output, answer, padding): it marks 7 token(s) before the row's first "
               "policy token"),
    "starpo": ("s.std().item() if", "s.std(unbiased=False).item() if",
               "`reward_std_filter` is wrong for top_k 0.5 over a group of 4 (scores 0, 0, 1, 1) "
               "and a group of 2 (scores 0, 1): the std must be the unbiased one (Bessel's "
               "correction, as torch.std), 0.577 against 0.707, so the group of 2 ranks first: it "
               "kept group(s) [0], expected [1]"),
    "rcgrpo": ("return (group_size - 1) / group_size * var", "return var",
               "`expected_group_variance` is wrong for group_size 4, p_high 0.5, success_high 0.9, "
               "success_low 0.2: it gave 0.2475, the exact expectation is 0.185625. It is G / (G - "
               "1) = 4/3 times too large: that is the variance of one reward, m (1 - m) with m = p "
               "qh + (1 - p) ql = 0.55, but sigma^2 is taken around the group's own mean, which "
               "takes 1/G of it away"),
    "gcd": ("return (group_size - 1) / group_size * value", "return value",
            ("`risky_advantage_weight` is wrong for q 0.5, r 0.4, group_size 8: it gave -0.1, eq. "
             "gcd-lemma-group gives -0.0875. It is the expected-reward baseline's q r (q - 1): "
             "GRPO's group mean includes the episode itself, which takes 1/G of its own reward out "
             "of its advantage and leaves (G - 1) / G = 7/8 of the value")),
    "gigpo": ("key = (group, anchor)", "key = anchor",
              "`anchor_groups` is wrong for two episode groups that both reach state 'S': step "
              "groups never cross episode groups (each episode group has its own initial state "
              "and its own step groups)"),
    "early_experience": (
        "if action in seen or next_state == expert_next_state:", "if action in seen:",
        "`keep_alternatives` is wrong for a proposal with another action but the expert's next "
        "state, expert action 'go to shelf': it kept actions ['go to shelf 1', 'go to fridge'], "
        "expected ['go to fridge', 'put potato in fridge']. It kept a proposal whose next state is "
        "the expert's: such a proposal teaches nothing the expert's own transition does not"),
}


def _grade(chapter: str, notebook: pathlib.Path | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ASSIGNMENT_NOTEBOOK", None)
    if notebook is not None:
        env["ASSIGNMENT_NOTEBOOK"] = str(notebook)
    return subprocess.run(
        [sys.executable, "-m", "pytest", f"labs/assignments/{chapter}", "-q", "-n", "0",
         "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )


def _no_grader_traceback(out: str) -> None:
    assert "Traceback" not in out, out
    assert not re.search(r"\.py:\d+: ", out), f"a traceback line of the grader leaked:\n{out}"
    assert "During handling of the above exception" not in out, out


@pytest.mark.parametrize("chapter", sorted(FUNCTIONS))
def test_student_notebook_is_paired_and_unsolved(chapter):
    nb_path = ASSIGNMENTS / chapter / f"{chapter}_assignment.ipynb"
    twin = nb_path.with_suffix(".md")
    compare_notebooks(jupytext.read(twin), jupytext.read(nb_path), fmt="md:myst",
                      allow_expected_differences=True)
    graded = [c.source for c in jupytext.read(nb_path).cells
              if "graded" in c.metadata.get("tags", [])]
    for fn in FUNCTIONS[chapter]:
        cell = next((src for src in graded if f"def {fn}(" in src), None)
        assert cell is not None, f"no graded cell defines {fn}"
        assert "raise NotImplementedError" in cell, f"the student's {fn} must be a stub"


@pytest.mark.parametrize("chapter", sorted(FUNCTIONS))
def test_autograder_fails_the_stubs_by_name(chapter):
    proc = _grade(chapter, None)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert " passed" not in out.splitlines()[-1], f"a check passed on the stubs:\n{out}"
    for fn in FUNCTIONS[chapter]:
        assert f"`{fn}` is not implemented yet" in out, f"{fn} not named:\n{out}"
    _no_grader_traceback(out)


@pytest.mark.parametrize("chapter", sorted(FUNCTIONS))
def test_autograder_passes_the_solution(chapter):
    solution = ASSIGNMENTS / chapter / "solutions" / f"{chapter}_solution.md"
    proc = _grade(chapter, solution)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("chapter", sorted(BUGS))
def test_autograder_names_a_planted_bug(chapter, tmp_path):
    old, new, sentence = BUGS[chapter]
    text = (ASSIGNMENTS / chapter / "solutions" / f"{chapter}_solution.md").read_text()
    assert text.count(old) == 1
    buggy = tmp_path / f"{chapter}_buggy.md"
    buggy.write_text(text.replace(old, new))
    proc = _grade(chapter, buggy)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert sentence in " ".join(out.split()), out
    if chapter == "grpo" and importlib.util.find_spec("agentic_rl.check"):
        # the package's checker names the convention: the std estimator
        assert "std estimator: yours is the biased group std" in " ".join(out.split()), out
    _no_grader_traceback(out)
