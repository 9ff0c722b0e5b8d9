"""The learner's copy for a class (python -m grader learner-copy): installed in a fresh
virtual environment it runs every notebook's setup cell, and no answer, solution body,
hidden-test line or sealed explanation is anywhere in it, files or installed package."""
import json
import pathlib
import subprocess
import sys
import sysconfig
import textwrap

import pytest

from grader import build, paths
from grader.learner_copy import build_learner_copy

pytestmark = pytest.mark.xdist_group("build")  # reads every lesson, like tests/test_build.py


def _secrets():
    """Lines only instructors may read: solution bodies, hidden tests, explanations (less
    the lines the notebooks show anyway, in given code and text)."""
    found, public = set(), []
    for lesson in paths.lesson_names():
        for cell in build.source_notebook(lesson).cells:
            if not cell.metadata.get("nbgrader", {}).get("solution"):
                public.append(cell.source)
            for chunk in cell.source.split(build.BEGIN)[1:]:
                found.update(chunk.split(build.END)[0].splitlines())
        hidden = (paths.LESSONS / lesson / "hidden.py").read_text()
        found.update(hidden.splitlines())
        for _, why in build._explanation_cells(build._lesson_cells(lesson)):
            found.update(why.source.splitlines())
    # Long, specific lines only: `return out` or `import torch` prove nothing.
    public = "\n".join(public)
    return {line.strip() for line in found
            if len(line.strip()) > 24 and line.strip() not in public
            and not line.strip().startswith(("#", "import ", "from ", '"""'))}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("learner")
    copy = build_learner_copy(work / "copy")
    listing = sorted(p.name for p in copy.iterdir())  # before pip builds in it
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # pip, setuptools, torch, triton, matplotlib from this environment (a .pth line adds a folder but runs
    # none of its .pth files, so the repository's editable install stays out of sight).
    site = pathlib.Path(site)
    (site / "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", str(copy)], check=True, cwd=work)
    return copy, python, site, listing


def test_the_copy_holds_notebooks_runtime_and_nothing_else(installed):
    copy, _, _, listing = installed
    assert listing == ["README.md", "course", "modules", "pyproject.toml", "run.sh"], listing
    assert sorted(p.name for p in (copy / "modules").iterdir()) == paths.lesson_names()


def test_every_setup_cell_runs_in_a_fresh_environment(installed):
    copy, python, site, _ = installed
    setups = [json.loads((copy / "modules" / l / f"{l}.ipynb").read_text())["cells"]
              for l in paths.lesson_names()]
    sources = ["".join(next(c for c in cells if c["cell_type"] == "code")["source"]) for cells in setups]
    program = textwrap.dedent("""
        import importlib.util, json, sys
        for source in json.loads(sys.argv[1]):
            exec(source, {})
        import course
        assert course.__file__.startswith(sys.argv[2]), course.__file__
        for name in ("solutions", "grader"):
            assert importlib.util.find_spec(name) is None, name + " is importable"
        print("setup cells ok")
        """)
    result = subprocess.run([python, "-c", program, json.dumps(sources), str(site)],
                            capture_output=True, text=True, cwd=copy / "modules",
                            env={"PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg", "HOME": str(copy)})
    assert "setup cells ok" in result.stdout, result.stderr[-3000:]


def test_no_answer_is_anywhere_in_the_copy_or_the_installed_package(installed):
    copy, _, site, _ = installed
    secrets = _secrets()
    assert len(secrets) > 500  # the search looks for something
    files = [p for root in (copy, site / "course") for p in root.rglob("*")
             if p.is_file() and p.suffix in (".py", ".ipynb", ".json", ".md", ".toml", ".sh", ".txt")]
    assert any(p.suffix == ".ipynb" for p in files) and any(site in p.parents for p in files)
    for path in files:
        text = path.read_text()
        leaked = [line for line in secrets if line in text]
        assert not leaked, f"{path} holds {leaked[:3]}"
