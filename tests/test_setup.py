"""The set-up files agree: environment.yml lists exactly pyproject.toml's dependencies,
and CI runs exactly the README's test command."""
import re
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
