"""Where things live. Every command works from any working directory."""
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
    return sorted(p.stem for p in LESSONS.glob("[0-9][0-9]_*.py"))


def lesson_path(name: str) -> pathlib.Path:
    path = LESSONS / f"{name}.py"
    if not path.exists():
        raise SystemExit(f"no lesson named {name!r}; lessons: {', '.join(lesson_names())}")
    return path
