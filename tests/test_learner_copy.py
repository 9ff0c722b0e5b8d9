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


def _long(lines, public=""):
    """Long, specific lines only (`return out` proves nothing), less what the notebooks
    show anyway (given code, text)."""
    return {line.strip() for line in lines
            if len(line.strip()) > 24 and line.strip() not in public
            and not line.strip().startswith(("#", "import ", "from ", '"""'))}


def _secrets():
    """(solution-body lines, lines of hidden test functions and sealed explanations)."""
    bodies, hidden, public = [], [], []
    for lesson in paths.lesson_names():
        for cell in build.source_notebook(lesson).cells:
            if not cell.metadata.get("nbgrader", {}).get("solution"):
                public.append(cell.source)
            for chunk in cell.source.split(build.BEGIN)[1:]:
                bodies += chunk.split(build.END)[0].splitlines()
        # A hidden test module is known by its test functions (its helpers may well share
        # lines with the visible checks, as the checks try the same kinds of input).
        text = (paths.LESSONS / lesson / "hidden.py").read_text()
        hidden += [line for line in text.splitlines() if line.startswith("def test_")]
        for _, why in build._explanation_cells(build._lesson_cells(lesson)):
            hidden += why.source.splitlines()
    public = "\n".join(public)
    return _long(bodies, public), _long(hidden, public)


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


def test_the_installed_checks_read_every_recorded_answer(installed):
    """The visible checks' recorded answers (course/recorded.py) are installed with them."""
    copy, python, site, _ = installed
    from course import recorded
    tables = {p.stem: json.loads(p.read_text()) for p in recorded.FOLDER.glob("*.json")}
    assert tables
    program = textwrap.dedent("""
        import json, sys
        from course import recorded
        assert recorded.__file__.startswith(sys.argv[2]), recorded.__file__
        for topic, table in json.loads(open(sys.argv[1]).read()).items():
            table.pop(recorded.FINGERPRINTS, None)
            for name, values in table.items():
                for args, value in values.items():
                    assert recorded.answer(topic, name, *json.loads(args)) == value, (topic, name, args)
        print("recorded answers ok")
        """)
    listing = copy.parent / "tables.json"  # megabytes: too long for a command line
    listing.write_text(json.dumps(tables))
    result = subprocess.run([python, "-c", program, str(listing), str(site)], capture_output=True,
                            text=True, cwd=copy.parent, env={"PATH": "/usr/bin:/bin", "HOME": str(copy)})
    assert "recorded answers ok" in result.stdout, result.stderr[-3000:]


def _texts(root):
    return {p: p.read_text() for p in root.rglob("*")
            if p.is_file() and p.suffix in (".py", ".ipynb", ".json", ".md", ".toml", ".sh", ".txt")}


def test_no_hidden_test_or_explanation_is_anywhere_in_the_copy_or_the_installed_package(installed):
    copy, _, site, _ = installed
    _, hidden = _secrets()
    assert len(hidden) > 100  # the search looks for something
    texts = {**_texts(copy), **_texts(site / "course")}
    assert any(p.suffix == ".ipynb" for p in texts) and any(site in p.parents for p in texts)
    for path, text in texts.items():
        leaked = [line for line in hidden if line in text]
        assert not leaked, f"{path} holds {leaked[:3]}"


# Solution lines a visible check must share: it launches the learner's kernel as the
# wrapper would, and reads a matrix product's shapes as the wrapper does.
SHARED_WITH_THE_CHECKS = {"BLOCK_SIZE=triton.next_power_of_2(N))", "(M, K), N = a.shape, b.shape[1]"}


def test_no_solution_body_is_anywhere_in_the_copy_or_the_installed_package(installed):
    """Visible checks included: what they need of the answer key is recorded data
    (course/recorded.py), never the code."""
    copy, _, site, _ = installed
    bodies, _ = _secrets()
    assert len(bodies) > 300
    texts = {**_texts(copy), **_texts(site / "course")}
    assert any("checks" in p.parts for p in texts)
    for path, text in texts.items():
        leaked = [line for line in bodies - SHARED_WITH_THE_CHECKS if line in text]
        assert not leaked, f"{path} holds {leaked[:3]}"
