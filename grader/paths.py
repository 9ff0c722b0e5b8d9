"""Where things live. Every command works from any working directory.

A module's instructor-only files live together in grader/lessons/NN_topic/: lesson.py
(the one lesson source), hidden.py (hidden tests) and bugs.py (classic bugs that must
lose points). Its importable reference code is solutions/topic.py, its visible checks
course/checks/topic.py.
"""
import importlib.util
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
LESSONS = REPO / "grader" / "lessons"
SOLUTIONS = REPO / "solutions"
MODULES = REPO / "modules"
# The nbgrader course directory (source/, release/, submitted/, gradebook.db, ...).
COURSE = pathlib.Path(os.environ.get("COURSE_DIR", REPO / "build" / "course")).resolve()


def lesson_names():
    """Lesson names in course order, e.g. ["00_foundations", "01_softmax", ...]."""
    return sorted(p.parent.name for p in LESSONS.glob("[0-9][0-9]_*/lesson.py"))


def lesson_path(name: str) -> pathlib.Path:
    path = LESSONS / name / "lesson.py"
    if not path.exists():
        raise SystemExit(f"no lesson named {name!r}; lessons: {', '.join(lesson_names())}")
    return path


def topic_of(lesson: str) -> str:
    """"01_softmax" -> "softmax": the name of its solutions/ and course/checks/ files."""
    return lesson.split("_", 1)[1]


def lesson_file(lesson: str, name: str):
    """grader/lessons/<lesson>/<name>.py as a module (hidden, bugs), loaded by path: the
    folder names start with digits, so they are not importable packages."""
    path = lesson_path(lesson).parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"grader.lessons._{lesson}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
