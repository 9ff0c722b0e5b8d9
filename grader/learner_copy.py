"""The learner's copy of the course, for a class: the `course` runtime and the student
notebooks, with its own README, pyproject and run.sh, and nothing that holds an answer
or a hidden test (no solutions/, no grader/, no lesson sources or bug catalogs).

    python -m grader learner-copy DIR            self-paced: the notebooks are in modules/
    python -m grader learner-copy DIR --class    a class: JupyterLab with nbgrader's learner
        tools only (grader/jupyter_roles.py); notebooks come from the exchange (Assignments tab)

tests/test_learner_copy.py builds one, installs it in a fresh virtual environment, runs
every notebook's setup cell there and searches it for every answer the course has;
tests/test_jupyter_roles.py opens a class copy's JupyterLab.
"""
import importlib.metadata
import shutil

from grader import jupyter_roles, paths

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "attention-kernels-course-learner"
version = "0.1.0"
description = "Attention kernels, from softmax to FlashAttention in Triton: the learner's copy"
requires-python = ">=3.11"
dependencies = ["torch>=2.5", "triton>=3.6", "numpy", "matplotlib", "jupyterlab", "ipykernel"{extra}]

[tool.setuptools]
packages = ["course", "course.checks"]

[tool.setuptools.package-data]
course = ["explanations.json", "recorded/*.json"]
"""

_RUN_SH = """\
#!/usr/bin/env bash
# bash run.sh: set up .venv (first time only, a few minutes) and open JupyterLab.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    echo "Creating .venv and installing the course (first time only)..."
    "${PYTHON:-python3}" -m venv .venv
    .venv/bin/python -m pip install --upgrade pip
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        # No NVIDIA GPU: the CPU build of torch (PyPI alone would pull gigabytes of CUDA).
        .venv/bin/python -m pip install torch --index-url https://download.pytorch.org/whl/cpu
    fi
    .venv/bin/python -m pip install -e .
fi
{jupyter_config}extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
cd modules
exec ../.venv/bin/jupyter lab --ServerApp.root_dir="$PWD" "${extra[@]}" "$@"
"""

_README = """\
# Attention kernels, from softmax to FlashAttention in Triton

You write softmax, masks, tiled matrix products, naive attention, a FlashAttention kernel
in Triton and its backward pass, in JupyterLab notebooks with checks that tell you what is
wrong. No GPU needed: on a CPU every kernel runs through Triton's interpreter.

## Start

```
bash run.sh
```

The first run creates `.venv/` and installs the course (a few minutes; without an NVIDIA
GPU it takes the CPU build of PyTorch), then opens JupyterLab on `modules/`. Later runs
open JupyterLab at once.

## Work

{get} and run its first cell first. Fill in each `raise
NotImplementedError()`, then run the check cell under it: it prints `ok` lines or says
what is wrong. The last cell of each notebook shows every exercise's points and which pass
their checks. {hand_in}; it is graded with hidden tests on inputs you have not seen.
"""

_SELF_PACED = dict(
    get="Open `NN_topic/NN_topic.ipynb` in order (`00_foundations` first)",
    hand_in="Hand in the notebook as your instructor says")
_CLASS = dict(
    get="Your instructor releases the notebooks one by one: open the Assignments tab (menu\n"
        "Nbgrader > Assignment List), press Fetch next to the released one and open\n"
        "`NN_topic/NN_topic.ipynb`",
    hand_in="Press Submit in the Assignments tab (submit again as often as you like: the\n"
            "last submission counts); once your instructor returns feedback, Fetch Feedback\n"
            "puts it in `NN_topic/feedback/`")
# The class copy's JupyterLab reads jupyter/ first: nbgrader's learner tools only, and the
# exchange's location (grader/jupyter_roles.py). nbgrader's assignment list fetches into
# the server's working directory (not its root_dir), which run.sh makes modules/.
_JUPYTER_CONFIG = """\
export JUPYTER_CONFIG_PATH="$PWD/jupyter${JUPYTER_CONFIG_PATH:+:$JUPYTER_CONFIG_PATH}"
"""


def build_learner_copy(target, exchange_root=None):
    """Write the learner's copy into `target` (a new or empty folder). With exchange_root,
    the copy for a class: nbgrader's learner tools on that exchange, no notebooks."""
    import pathlib
    from grader.nbgrader_setup import COURSE_ID
    target = pathlib.Path(target)
    if target.exists() and any(target.iterdir()):
        raise SystemExit(f"{target} is not empty: choose a new folder")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    shutil.copytree(paths.REPO / "course", target / "course", ignore=ignore)
    in_class = exchange_root is not None
    if in_class:
        # The version that wrote the exchange reads it.
        extra = f', "nbgrader=={importlib.metadata.version("nbgrader")}"'
        jupyter_roles.write_learner_config(target / "jupyter", exchange_root, COURSE_ID)
        (target / "modules").mkdir()  # fetched assignments go here
    else:
        extra = ""
        for lesson in paths.lesson_names():
            notebook = paths.MODULES / lesson / f"{lesson}.ipynb"
            (target / "modules" / lesson).mkdir(parents=True)
            shutil.copy2(notebook, target / "modules" / lesson / notebook.name)
    (target / "pyproject.toml").write_text(_PYPROJECT.format(extra=extra))
    (target / "run.sh").write_text(_RUN_SH.replace("{jupyter_config}", _JUPYTER_CONFIG if in_class else ""))
    (target / "README.md").write_text(_README.format(**(_CLASS if in_class else _SELF_PACED)))
    print(f"learner copy in {target}: `bash run.sh` there sets it up and opens JupyterLab"
          + (f" (nbgrader's learner tools, exchange {exchange_root})" if in_class else ""))
    return target
