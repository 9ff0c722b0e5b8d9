"""What a learner sees in their own Jupyter kernel (nbclient runs the notebooks in a real
one): a solved notebook runs clean, with no warning; a wrong launch grid gives a message
and the kernel lives; a failed check shows its message first, in a few lines, not a
traceback through course/; an unfilled notebook, run top to bottom, says "Not written
yet" wherever an exercise is missing, draws nothing half and prints nothing on stderr."""
import importlib
import os

import nbclient
import nbformat
import pytest

from grader import paths
from tests import submissions as subs

WRONG_GRIDS = {  # lesson: (exercise cell, reference text, the same launch on a wrong grid)
    "01_softmax": ("softmax", "softmax_kernel[(n_rows,)]", "softmax_kernel[(n_cols,)]"),
    "02_masking": ("masked_softmax", "masked_softmax_kernel[(M, B)]", "masked_softmax_kernel[(4 * M, B)]"),
    "03_tiling": ("batched_gemm_strided", "grid = (H, triton.cdiv(M, TILE), B)",
                  "grid = (B + 3, triton.cdiv(M, TILE), H + 2)"),
}


def _run(nb, lesson):
    """Execute like JupyterLab does (errors do not stop the run); returns the notebook."""
    env_backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        nbclient.NotebookClient(nb, kernel_name="python3", allow_errors=True, timeout=600,
                                resources={"metadata": {"path": str(paths.MODULES / lesson)}}).execute()
    finally:
        if env_backend is None:
            os.environ.pop("MPLBACKEND")
        else:
            os.environ["MPLBACKEND"] = env_backend
    return nb


def _errors(cell):
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def _stderr(cell):
    return [o.text for o in cell.get("outputs", []) if o.output_type == "stream" and o.name == "stderr"]


def _cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _points(nb):
    return sum(c.metadata["nbgrader"]["points"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))


@pytest.mark.parametrize("lesson", paths.lesson_names())
def test_a_solved_notebook_runs_clean_with_no_warning(lesson):
    """Every check passes and nothing is printed on stderr: a correct solution never shows
    a learner a warning (module 08's answer key used to show NumPy's overflow warning from
    the interpreter; `import course` hides those, course/__init__.py says why)."""
    nb = _run(subs.solution_notebook(lesson), lesson)
    for cell in nb.cells:
        assert not _errors(cell), (cell.metadata.get("nbgrader", {}).get("grade_id"), _errors(cell))
        assert not _stderr(cell), (cell.metadata.get("nbgrader", {}).get("grade_id"), _stderr(cell))
    table = "".join(o.get("text", "") for o in _cell(nb, "progress").outputs)
    assert f"{_points(nb)} of {_points(nb)} points pass" in table, table


@pytest.mark.parametrize("lesson", sorted(WRONG_GRIDS))
def test_a_wrong_grid_gives_a_message_and_the_kernel_lives(lesson):
    exercise, right, wrong = WRONG_GRIDS[lesson]
    nb = subs.patch(subs.solution_notebook(lesson), exercise, right, wrong)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "progress"]
    nb = _run(nb, lesson)
    errors = _errors(_cell(nb, f"test_{exercise}"))
    assert errors, "the wrong grid went unnoticed"
    shown = "\n".join(errors[0].traceback)
    assert len(errors[0].traceback) <= 3, shown
    assert "grid" in shown, shown
    # The kernel survived: the cells after it ran (the last one compiles the kernels).
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert last.get("execution_count") is not None and not _errors(last), last


def test_a_failed_check_shows_its_message_first_in_a_few_lines():
    lesson = "01_softmax"
    bug = subs.bugs_of(lesson)["rescale_order"]
    nb = _run(subs.with_bug(lesson, bug), lesson)
    errors = _errors(_cell(nb, bug.test_cell))
    assert len(errors) == 1
    lines = errors[0].traceback
    assert lines[0].startswith("CheckFailed: ") and len(lines) <= 3, lines
    assert "course/" not in "\n".join(lines)


@pytest.mark.parametrize("lesson", paths.lesson_names())
def test_an_unfilled_notebook_says_fill_in_first_and_draws_nothing_half(lesson):
    nb = _run(nbformat.read(paths.MODULES / lesson / f"{lesson}.ipynb", as_version=4), lesson)
    failed = 0
    for cell in nb.cells:
        assert not _stderr(cell), (cell.metadata.get("nbgrader", {}).get("grade_id"), _stderr(cell))
        errors = _errors(cell)
        if not errors:
            continue
        failed += 1
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        assert len(errors[0].traceback) == 1 and errors[0].traceback[0].startswith("Not written yet:"), \
            (grade_id, errors[0].traceback)
        assert not [o for o in cell.outputs if o.output_type == "display_data"], f"{grade_id} drew half"
    assert failed > 0
    # The last cell lists every exercise with its points, none of them passing yet.
    table = "".join(o.get("text", "") for o in _cell(nb, "progress").outputs)
    assert f"0 of {_points(nb)} points pass" in table and table.count("not written yet") >= 1, table


# Catalog bugs whose numbers are right but whose code breaks a rule of the test cell
# (course/rules.py): the grader reads the code, so the visible check must read it too.
RULE_BUGS = {"01_softmax": ("wrapper_computes_with_torch", "test_softmax"),
             "02_masking": ("wrapper_masks_with_torch", "test_masked_softmax")}


@pytest.mark.parametrize("lesson", RULE_BUGS)
def test_a_rule_the_grader_reads_fails_the_visible_check_too(lesson):
    name, test_cell = RULE_BUGS[lesson]
    bug = subs.bugs_of(lesson)[name]
    nb = _run(subs.with_bug(lesson, bug), lesson)
    errors = _errors(_cell(nb, test_cell))
    assert errors and bug.says in errors[0].evalue and "reads your code" in errors[0].evalue, \
        [o.get("text", o.get("evalue")) for o in _cell(nb, test_cell).outputs]
    table = "".join(o.get("text", "") for o in _cell(nb, "progress").outputs)
    assert f"{bug.exercise} " in table and "fails" in table, table


def test_every_test_cells_rules_run_in_its_visible_check():
    """The rules the grader reads for a test cell (the checks module's RULES) name a test
    cell of the lesson, whose visible check (check_X for test_X) applies them."""
    for lesson in paths.lesson_names():
        checks = importlib.import_module(f"course.checks.{paths.topic_of(lesson)}")
        rules = getattr(checks, "RULES", {})
        cells = {c.metadata["nbgrader"]["grade_id"]: c.source for c in subs.solution_notebook(lesson).cells
                 if c.metadata.get("nbgrader", {}).get("grade")}
        for cell in rules:
            check = "check_" + cell.removeprefix("test_")
            assert f"checks.{check}(" in cells.get(cell, ""), f"{lesson}: no test cell {cell} calling {check}"
            assert getattr(getattr(checks, check), "__wrapped__", None), f"{lesson}: {check} does not apply {cell}'s rules"
