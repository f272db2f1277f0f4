"""Shared fixtures: offline Hugging Face, one torch thread, a tiny tokenizer/model for the
addition task.

The environment variables are set before anything imports ``transformers`` or
``huggingface_hub`` (pytest imports this file first), so no test can reach the network.
"""

from __future__ import annotations

import functools
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from testkit import tiny, tiny_model  # noqa: E402

from agentic_rl import jail  # noqa: E402

# Model-written code runs only under bubblewrap (jail.require_boundary). Where there is none the
# tests still run the sandbox's other layers, on their own snippets and tiny models: they opt in,
# and say so in the header (the kernel-layer tests skip, saying why).
NO_BOUNDARY = jail.boundary_problem()
if NO_BOUNDARY:
    os.environ[jail.ALLOW_UNCONTAINED] = "1"


def pytest_report_header(config):
    if NO_BOUNDARY:
        return f"UNCONTAINED: {jail.ALLOW_UNCONTAINED}=1 for these tests: {NO_BOUNDARY}"
    return None


#: Test files run first, before the labs (their tests keep their order). Under ``--dist loadfile``
#: a file goes to one worker, in the collection order: tests/test_site.py (the book build, then a
#: minute or more in a browser) would otherwise come last and leave the other worker idle at the
#: end. At the front it builds the book (``built_book``) long before test_book.py and
#: test_course_kit.py need it, so none of them waits on another worker's build.
RUN_FIRST = ("tests/test_site.py",)


def pytest_collection_modifyitems(session, config, items):
    first = [item for item in items if item.nodeid.split("::", 1)[0] in RUN_FIRST]
    if first:
        moved = set(map(id, first))
        items[:] = first + [item for item in items if id(item) not in moved]


@pytest.fixture(scope="session")
def task():
    from agentic_rl.envs import AdditionTask

    return AdditionTask()


@pytest.fixture(scope="session")
def tokenizer(task):
    from agentic_rl.models import build_tokenizer

    return build_tokenizer(task.vocabulary())


@pytest.fixture
def model(tokenizer):
    """A fresh tiny model per test (tests may wrap it with LoRA or replace ``generate``)."""
    return tiny_model(tokenizer)


@pytest.fixture
def tiny_config():
    """Factory for a fast GRPOConfig (``testkit.tiny("grpo", ...)``): tiny model, tiny eval, no
    progress bars; keyword overrides win."""
    return functools.partial(tiny, "grpo")


@pytest.fixture(scope="session")
def built_book(tmp_path_factory):
    """The website, built once per test run (``jupyter-book build -W``, chapters executed): minutes.

    Returns ``(returncode, log, html)``. Under pytest-xdist every worker shares one build: the first
    worker to get here builds into the run's common temp folder while holding a file lock, and the
    others wait for it and reuse it (tests using it also carry ``xdist_group("book")``).
    """
    import collections
    import json
    import pathlib
    import subprocess
    import sys

    from filelock import FileLock

    Build = collections.namedtuple("Build", "returncode log html")
    root = pathlib.Path(__file__).resolve().parents[1]
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the folder every worker of this run shares
    out, done = shared / "book-build", shared / "book-build.json"
    with FileLock(str(done) + ".lock"):
        if not done.exists():
            exe = pathlib.Path(sys.executable).with_name("jupyter-book")
            cmd = [str(exe) if exe.exists() else "jupyter-book", "build", str(root), "-W", "-n",
                   "--keep-going", "--path-output", str(out)]
            env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
            log = proc.stdout + proc.stderr
            done.write_text(json.dumps({"returncode": proc.returncode, "log": log}))
        result = json.loads(done.read_text())
    return Build(result["returncode"], result["log"], out / "_build" / "html")
