"""The learner's copy of the course, for a class: the `course` runtime and the student
notebooks, with its own README, pyproject and run.sh, and nothing that holds an answer
or a hidden test (no solutions/, no grader/, no lesson sources or bug catalogs).

    python -m grader learner-copy DIR

tests/test_learner_copy.py builds one, installs it in a fresh virtual environment, runs
every notebook's setup cell there and searches it for every answer the course has.
"""
import shutil

from grader import paths

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "attention-kernels-course-learner"
version = "0.1.0"
description = "Attention kernels, from softmax to FlashAttention in Triton: the learner's copy"
requires-python = ">=3.11"
dependencies = ["torch>=2.5", "triton>=3.6", "numpy", "matplotlib", "jupyterlab", "ipykernel"]

[tool.setuptools]
packages = ["course", "course.checks"]

[tool.setuptools.package-data]
course = ["explanations.json"]
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
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)
exec .venv/bin/jupyter lab --ServerApp.root_dir="$PWD/modules" "${extra[@]}" "$@"
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

Open `NN_topic/NN_topic.ipynb` in order (`00_foundations` first) and run its first cell
first. Fill in each `raise NotImplementedError()`, then run the check cell under it: it
prints `ok` lines or says what is wrong. The last cell of each notebook shows every
exercise's points and which pass their checks. Hand in the notebook as your instructor
says; it is graded with hidden tests on inputs you have not seen.
"""


def build_learner_copy(target):
    """Write the learner's copy into `target` (a new or empty folder)."""
    import pathlib
    target = pathlib.Path(target)
    if target.exists() and any(target.iterdir()):
        raise SystemExit(f"{target} is not empty: choose a new folder")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    shutil.copytree(paths.REPO / "course", target / "course", ignore=ignore)
    for lesson in paths.lesson_names():
        notebook = paths.MODULES / lesson / f"{lesson}.ipynb"
        (target / "modules" / lesson).mkdir(parents=True)
        shutil.copy2(notebook, target / "modules" / lesson / notebook.name)
    (target / "pyproject.toml").write_text(_PYPROJECT)
    (target / "run.sh").write_text(_RUN_SH)
    (target / "README.md").write_text(_README)
    print(f"learner copy in {target}: `bash run.sh` there sets it up and opens JupyterLab")
    return target
