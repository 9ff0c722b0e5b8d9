"""Make submissions for grading tests: the reference, the untouched release, classic
bugs and broken notebooks, all derived from the lesson source (never hand-written)."""
import contextlib
import io
import linecache

import nbformat

from grader import grading, paths
from grader.build import solution_notebook, write_notebook


def lessons_with_bugs() -> list:
    """The lessons that have a classic-bug catalog (grader/lessons/<lesson>/bugs.py)."""
    return [name for name in paths.lesson_names()
            if (paths.lesson_path(name).parent / "bugs.py").exists()]


def bugs_of(lesson: str) -> dict:
    return paths.lesson_file(lesson, "bugs").BUGS


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


def execute(lesson: str, nb, namespace=None, only=None) -> dict:
    """Run the notebook's code cells except the test cells, in order, in this process, as
    a kernel would; returns the namespace. A failing cell is the notebook's problem: the
    next one still runs. With `namespace` and `only` (grade ids), run just those cells in
    a namespace where the rest already ran, as a learner re-running one cell."""
    import matplotlib.pyplot as plt
    # A kernel's module name is read when Triton compiles it for a GPU, as in a kernel.
    namespace = {"__name__": "__main__"} if namespace is None else namespace
    for index, c in enumerate(nb.cells):
        if c.cell_type != "code" or c.metadata.get("nbgrader", {}).get("grade"):
            continue
        grade_id = c.metadata.get("nbgrader", {}).get("grade_id", f"cell{index}")
        if grade_id == "progress" or (only is not None and grade_id not in only):
            continue  # (the progress cell re-runs every check: tests/test_learner_view.py runs it)
        # Register the source as IPython does: @triton.jit reads a kernel's source back.
        filename = f"<{lesson}:{grade_id}>"
        linecache.cache[filename] = (len(c.source), None, c.source.splitlines(True), filename)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(c.source, filename, "exec"), namespace)
        except Exception:  # noqa: BLE001
            pass
    plt.close("all")
    return namespace


def run_in_process(lesson: str, nb, objects=None) -> dict:
    """Run the notebook in this process (execute), then grade its test cells with the
    notebook's objects directly (fast, for tests; the grader runs the same tests with the
    code in a sandboxed worker). `objects`: a namespace where it already ran.

    Returns {test cell grade_id: None if it passed, else its failure message}.
    """
    objects = execute(lesson, nb) if objects is None else objects
    graded = grading.grade(grading.Lesson(lesson), nb, objects=objects)
    return {grade_id: None if r.passed else r.message for grade_id, r in graded.tests.items()}
