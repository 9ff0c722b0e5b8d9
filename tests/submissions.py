"""Make submissions for grading tests: the reference, the untouched release, classic
bugs and broken notebooks, all derived from the lesson source (never hand-written)."""
import importlib
import json

import nbformat

from grader import paths
from grader.build import solution_notebook, write_notebook


def topic_of(lesson: str) -> str:
    return lesson.split("_", 1)[1]


def bugs_of(lesson: str) -> dict:
    return importlib.import_module(f"tests.bugs.{topic_of(lesson)}").BUGS


def cell(nb, grade_id):
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return c
    raise KeyError(f"no cell {grade_id!r}")


def with_bug(lesson: str, bug):
    nb = solution_notebook(lesson)
    target = cell(nb, bug.exercise)
    count = target.source.count(bug.find)
    if count != 1:
        raise AssertionError(f"{lesson}/{bug.exercise}: {bug.find!r} found {count} times in:\n{target.source}")
    target.source = target.source.replace(bug.find, bug.replace)
    return nb


def release(lesson: str, modules_dir=None):
    return nbformat.read((modules_dir or paths.MODULES) / lesson / f"{lesson}.ipynb", as_version=4)


def save(nb, folder, student, lesson):
    write_notebook(json.loads(json.dumps(nb)), folder / student / f"{lesson}.ipynb")
