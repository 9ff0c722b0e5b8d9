"""The set-up files agree: environment.yml lists exactly pyproject.toml's dependencies,
and CI runs exactly the README's test command."""
import re
import subprocess
import sys
import tomllib

import yaml

from grader import paths


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    project = tomllib.loads((paths.REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((paths.REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(p for p in pip if p != "-e .") == sorted(project)
    assert "-e ." in pip


def test_ci_runs_the_readme_test_command():
    readme = (paths.REPO / "README.md").read_text()
    commands = re.findall(r"^bash run\.sh (\w+)$", readme, flags=re.M)
    assert commands[:2] == ["lab", "test"], commands
    ci = (paths.REPO / ".ci" / "run").read_text()
    assert re.search(r"^bash run\.sh test$", ci, flags=re.M)


def test_an_xdist_group_stays_on_one_worker(tmp_path):
    """Each lesson's grading run is shared by its tests only if they share a worker
    (tests/conftest.py marks them with xdist_group): with pytest 9.2 and xdist 3.8 the
    marks were silently ignored and every lesson was graded twice."""
    (tmp_path / "test_groups.py").write_text(
        "import os, pathlib, pytest\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "@pytest.mark.xdist_group('one')\n"
        "def test_grouped(i):\n"
        "    pathlib.Path(f'worker{i}').write_text(os.environ['PYTEST_XDIST_WORKER'])\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "def test_free(i):\n"
        "    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
                          "-p", "no:cacheprovider", "-o", "addopts=", "test_groups.py"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:]
    workers = {(tmp_path / f"worker{i}").read_text() for i in range(8)}
    assert len(workers) == 1, workers
