"""The nbgrader course directory and its configuration, written from one template.

The same nbgrader_config.py serves our commands (loaded explicitly: NbGraderAPI does not
read it by itself) and instructors who run nbgrader's own CLI inside the course folder.
"""
import os
import pathlib
import shutil
import sys

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer

from grader import paths

_CONFIG = '''# Written by `python -m grader`; edit grader/nbgrader_setup.py instead.
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {exchange!r}
# Autograde runs the notebook's code in a sandboxed worker and decides every test in the
# grader's process (grader/grading.py), instead of nbgrader's Execute: a cell that runs
# longer than the timeout is stopped and recorded as failed; the rest still runs.
c.Autograde.autograde_preprocessors = [
    "grader.nbgrader_setup.GradeInWorker",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.GradeInWorker.timeout = {timeout}
# Feedback never shows hidden tests, nor tracebacks that quote their code.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "grader.feedback.ShortTracebacks",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
'''

DEFAULT_TIMEOUT = 120
COURSE_ID = "attention-kernels"


def exchange_root():
    """nbgrader's exchange: EXCHANGE_DIR, or exchange/ in the course folder (one machine)."""
    return pathlib.Path(os.environ.get("EXCHANGE_DIR") or paths.COURSE / "exchange").resolve()


def write_config(timeout: int = DEFAULT_TIMEOUT):
    """Write the course's nbgrader_config.py (and create the exchange); return its path."""
    exchange = exchange_root()
    if not exchange.is_dir():
        exchange.mkdir(parents=True)
        # Every learner writes into it (nbgrader's release_assignment sets the same mode).
        exchange.chmod(0o777)
    path = paths.COURSE / "nbgrader_config.py"
    path.write_text(_CONFIG.format(root=str(paths.COURSE), course_id=COURSE_ID,
                                   exchange=str(exchange), timeout=int(timeout)))
    return path


def api(timeout: int = DEFAULT_TIMEOUT):
    """An NbGraderAPI on the course directory, its config file written afresh."""
    import warnings
    from sqlalchemy.exc import SAWarning
    warnings.filterwarnings("ignore", category=SAWarning)  # nbgrader's own, harmless, pages of them
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    path = write_config(timeout)
    config = PyFileConfigLoader(path.name, path=str(paths.COURSE)).load_config()
    # Kernels inherit the environment: pick the interpreter before they import triton.
    import course  # noqa: F401  (sets TRITON_INTERPRET when there is no GPU)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # nbgrader runs `alembic` and kernels from PATH: use this environment's, even when
    # the venv is not activated.
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


# Filled by GradeInWorker for grader.autograde: {(lesson, student): grading.Graded}.
RESULTS = {}
# Graded ahead of nbgrader by grader.autograde's parallel processes: {(lesson, student):
# (the notebook's sources, grading.Graded)}; used when the notebook is the same.
PREGRADED = {}


class GradeInWorker(NbGraderPreprocessor):
    """nbgrader's autograde step, done by grader.grading: the notebook's cells run in a
    sandboxed worker; each test cell's outputs are the grader's own verdict (printed `ok`
    lines, and one error output if it failed), which SaveAutoGrades then scores."""

    timeout = Integer(DEFAULT_TIMEOUT, help="seconds per cell and per test").tag(config=True)

    def preprocess(self, nb, resources):
        import nbformat
        lesson, student = resources["nbgrader"]["assignment"], resources["nbgrader"]["student"]
        sources, graded = PREGRADED.pop((lesson, student), (None, None))
        if sources != [c.source for c in nb.cells]:
            graded = grade_one(lesson, student, nb, self.timeout)
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                cell.outputs = [nbformat.from_dict(o) for o in graded.outputs.get(index, [])]
                cell.execution_count = None
        RESULTS[(lesson, student)] = graded
        return nb, resources


def grade_one(lesson, student, nb, timeout):
    """One notebook graded with its code in a sandboxed worker (a scratch folder of its own)."""
    from grader import grading
    scratch = paths.COURSE / "sandbox" / student / lesson
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        return grading.grade_in_worker(lesson, nb, scratch, timeout)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
