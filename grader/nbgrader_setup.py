"""The nbgrader course directory and its configuration, written from one template.

The same nbgrader_config.py serves our commands (loaded explicitly: NbGraderAPI does not
read it by itself) and instructors who run nbgrader's own CLI inside the course folder.
"""
import os
import sys

from grader import paths

_CONFIG = '''# Written by `python -m grader`; edit grader/nbgrader_setup.py instead.
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = "attention-kernels"
c.Exchange.root = {exchange!r}
# A cell that runs longer is stopped and recorded as failed; the rest still runs.
c.Execute.timeout = {timeout}
c.Execute.interrupt_on_timeout = True
# Feedback never shows hidden tests, nor tracebacks that quote their code.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "grader.feedback.ShortTracebacks",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
'''

DEFAULT_TIMEOUT = 120


def api(timeout: int = DEFAULT_TIMEOUT):
    """An NbGraderAPI on the course directory, its config file written afresh."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    (paths.COURSE / "exchange").mkdir(parents=True, exist_ok=True)
    path = paths.COURSE / "nbgrader_config.py"
    path.write_text(_CONFIG.format(root=str(paths.COURSE), exchange=str(paths.COURSE / "exchange"),
                                   timeout=int(timeout)))
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
