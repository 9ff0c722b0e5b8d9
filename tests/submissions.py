"""Make submissions for grading tests: the reference, the untouched release, classic
bugs and broken notebooks, all derived from the lesson source (never hand-written)."""
import contextlib
import importlib
import io
import linecache

import nbformat

from grader import paths
from grader.build import solution_notebook, source_notebook, write_notebook


def topic_of(lesson: str) -> str:
    return lesson.split("_", 1)[1]


def lessons_with_bugs() -> list:
    """The lessons that have a classic-bug catalog in tests/bugs/."""
    return [name for name in paths.lesson_names()
            if (paths.REPO / "tests" / "bugs" / f"{topic_of(name)}.py").exists()]


def bugs_of(lesson: str) -> dict:
    return importlib.import_module(f"tests.bugs.{topic_of(lesson)}").BUGS


def cell(nb, grade_id):
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return c
    raise KeyError(f"no cell {grade_id!r}")


def patch(nb, grade_id: str, find: str, replace: str):
    """Replace `find`, which must occur exactly once, in the cell grade_id of nb."""
    target = cell(nb, grade_id)
    count = target.source.count(find)
    if count != 1:
        raise AssertionError(f"{grade_id}: {find!r} found {count} times in:\n{target.source}")
    target.source = target.source.replace(find, replace)
    return nb


def with_bug(lesson: str, bug):
    return patch(solution_notebook(lesson), bug.exercise, bug.find, bug.replace)


def release(lesson: str):
    return nbformat.read(paths.MODULES / lesson / f"{lesson}.ipynb", as_version=4)


def save(nb, folder, student, lesson):
    write_notebook(nb, folder / student / f"{lesson}.ipynb")


def with_hidden_tests(lesson: str, nb):
    """Test cells as nbgrader runs them at autograde: their full source, hidden tests in."""
    source = source_notebook(lesson)
    for c in nb.cells:
        grade_id = c.metadata.get("nbgrader", {}).get("grade_id")
        if c.metadata.get("nbgrader", {}).get("grade"):
            c.source = cell(source, grade_id).source
    return nb


def run_in_process(lesson: str, nb) -> dict:
    """Run the code cells in order in this process, as a kernel would (fast, for tests).

    Returns {test cell grade_id: None if it passed, else "ExceptionName: message"}.
    """
    import matplotlib.pyplot as plt
    namespace, results = {}, {}
    for index, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        grade_id = c.metadata.get("nbgrader", {}).get("grade_id", f"cell{index}")
        # Register the source as IPython does: @triton.jit reads a kernel's source back.
        filename = f"<{lesson}:{grade_id}>"
        linecache.cache[filename] = (len(c.source), None, c.source.splitlines(True), filename)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(c.source, filename, "exec"), namespace)
            error = None
        except Exception as exc:  # a failing cell is recorded; the next one still runs
            error = f"{type(exc).__name__}: {exc}"
        if c.metadata.get("nbgrader", {}).get("grade"):
            results[grade_id] = error
    plt.close("all")
    return results
