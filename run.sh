#!/usr/bin/env bash
# The two commands of the README:
#   bash run.sh lab    set everything up, then open JupyterLab on the course
#   bash run.sh test   set everything up, then run the test suite
# Setting up = a virtual environment in .venv with this project and its dependencies.
set -euo pipefail
cd "$(dirname "$0")"

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

stamp=".venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    echo "run.sh: setting up .venv (first time only, a few minutes)"
    python -m pip install --quiet --upgrade pip
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        # No NVIDIA GPU: pinned, so pip takes the CPU build where one is on its path (a
        # local wheel folder, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu);
        # an unpinned torch pulls GBs of CUDA.
        echo "run.sh: installing PyTorch 2.13.0 (no NVIDIA GPU here: the CPU build)"
        python -m pip install "torch==2.13.0"
    fi
    echo "run.sh: installing the course and its dependencies (triton, jupyterlab, nbgrader, ...)"
    python -m pip install --quiet -e .
    touch "$stamp"
    echo "run.sh: set up"
fi

case "${1:-lab}" in
    lab)
        # JupyterLab on modules/, with nbgrader's formgrader on the course (grader/lab.py)
        exec python -m grader lab "${@:2}"
        ;;
    test)
        exec python -m pytest "${@:2}"
        ;;
    *)
        echo "usage: bash run.sh [lab|test] [extra arguments]" >&2
        exit 2
        ;;
esac
