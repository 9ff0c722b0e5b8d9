"""Grade one notebook: its code runs in a worker, its tests run here.

A test cell is one line, the visible check: `checks.check_softmax(softmax, softmax_kernel)`.
Grading it means, in the grader's own process: resolve each argument (a notebook function
or kernel becomes a proxy into the worker, a value comes across as data, a value the lesson
gives comes from solutions/), run that visible check, then the hidden test of the same
name as the cell (`test_softmax` in grader/lessons/<lesson>/hidden.py) with the same
arguments, and check the checks module's static RULES for that cell on the notebook's code.
The cell passes when none of them fails. What they print is the cell's output; a failure
adds one error output whose message says what is wrong (never hidden code).

The same functions grade in process for the test suite (`objects=namespace`): there the
notebook's objects are used directly, with no worker.
"""
import ast
import contextlib
import importlib
import io
import pathlib
import re
import warnings
from dataclasses import dataclass, field

from course import rules
from grader import answer_key, paths
from grader.remote import LearnerError, RemoteFunction, RemoteKernel, Worker, WorkerFailure
from grader.rules import tampering

TEXT_CAP = 200_000           # bytes of learner output kept in one graded notebook
GIVEN = re.compile(r"^\s*# given: (\w+)\.(\w+)\s*$", re.M)


def meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


@dataclass
class TestResult:
    passed: bool
    message: str = ""
    printed: str = ""

    def outputs(self):
        out = [{"output_type": "stream", "name": "stdout", "text": self.printed}] if self.printed else []
        if not self.passed:
            out.append({"output_type": "error", "ename": "CheckFailed", "evalue": self.message,
                        "traceback": [f"CheckFailed: {self.message}"]})
        return out


@dataclass
class Graded:
    outputs: dict = field(default_factory=dict)   # cell index: [nbformat output dicts]
    tests: dict = field(default_factory=dict)     # grade_id: TestResult
    notes: list = field(default_factory=list)


def parse_test_cell(source):
    """`checks.check_x(a, b, name="...")` -> ("check_x", ["a", "b"], {"name": "..."})."""
    tree = ast.parse(source)
    statements = [s for s in tree.body if not isinstance(s, ast.Pass)]
    call = statements[0].value if len(statements) == 1 and isinstance(statements[0], ast.Expr) else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "checks"
            and all(isinstance(a, ast.Name) for a in call.args)
            and all(isinstance(k.value, ast.Constant) and k.arg for k in call.keywords)):
        raise ValueError("a test cell must be one call `checks.check_x(name, ...)` with names as "
                         f"arguments and constants as keywords, not:\n{source}")
    return call.func.attr, [a.id for a in call.args], {k.arg: k.value.value for k in call.keywords}


class Lesson:
    """What grading one lesson needs, loaded once: its test cells, hidden tests, rules and
    given values."""

    def __init__(self, name):
        from grader.build import source_notebook
        self.name, self.topic = name, paths.topic_of(name)
        self.visible = importlib.import_module(f"course.checks.{self.topic}")
        self.hidden = answer_key.hidden(name)  # its tests compute what their checks ask
        self.rules = getattr(self.visible, "RULES", {})  # course/rules.py: the checks apply them too
        text = paths.lesson_path(name).read_text()
        self.given = {var: topic for topic, var in GIVEN.findall(text)}
        self.source = source_notebook(name)
        self.test_cells = {meta(c)["grade_id"]: c.source for c in self.source.cells if meta(c).get("grade")}
        self.kernels = set()
        for topic in {self.topic} | set(self.given.values()):
            module = importlib.import_module(f"solutions.{topic}")
            self.kernels |= {n for n, v in vars(module).items() if type(v).__name__ in ("JITFunction", "InterpretedFunction")}

    def given_value(self, name):
        return getattr(importlib.import_module(f"solutions.{self.given[name]}"), name)

    def run_test(self, grade_id, resolve, code_cells):
        """Run one test cell (visible check, hidden test, static rules) -> TestResult."""
        from course import recorded
        from course.quiz import NotRightYet, forget
        from course.testing import CheckFailed
        check, names, keywords = parse_test_cell(self.test_cells[grade_id])
        forget()
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the grader's own warnings are never scored
                objects = [self.given_value(n) if n in self.given else resolve(n) for n in names]
                try:
                    with recorded.computing(answer_key.resolve, missing_only=True):
                        getattr(self.visible, check)(*objects, **keywords)
                except NotRightYet:  # a quiz answer: the hidden test says which slip it is
                    getattr(self.hidden, grade_id)(*objects)
                    raise
                getattr(self.hidden, grade_id)(*objects)
            problems = rules.problems(self.rules.get(grade_id, []), code_cells)
            if problems:
                return TestResult(False, "; ".join(problems), printed.getvalue())
            return TestResult(True, printed=printed.getvalue())
        except CheckFailed as failure:
            message = str(failure)
        except WorkerFailure as failure:
            message = f"while testing this exercise, {failure}"
        except NotImplementedError as error:
            message = "not written yet: the exercise still raises NotImplementedError" + (
                f" ({error})" if str(error) else "")
        except Exception as error:  # noqa: BLE001 (the notebook's own error is the finding)
            from course.display import _unwrap
            error = _unwrap(error)
            message = f"{type(error).__name__}: {error}" if not isinstance(error, LearnerError) else str(error)
            if "NotImplementedError" in message:  # e.g. a kernel, through Triton's InterpreterError
                message = "not written yet: the exercise still raises NotImplementedError"
            where = getattr(error, "where", None)
            if where:
                message += "\n  in your code: " + "\n  in your code: ".join(where)
        return TestResult(False, message, printed.getvalue())


def code_cells(nb, learner_only=False):
    """The notebook's code cells but its test cells (given code included: a rule may name a
    kernel the lesson hands the learner); with learner_only, the cells whose code the learner
    wrote: solution cells and cells they added."""
    return [rules.Cell(meta(c).get("grade_id") or f"cell {i}", c.source)
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and not meta(c).get("grade")
            and (not learner_only or meta(c).get("solution") or not meta(c))]


def grade(lesson: Lesson, nb, *, objects=None, worker: Worker = None) -> Graded:
    """Grade a (repaired) notebook. With a worker, its cells run there; with `objects`
    (a namespace that already ran the cells), in this process."""
    graded = Graded()
    cells = code_cells(nb)
    tamper = tampering(code_cells(nb, learner_only=True), lesson.kernels)
    if worker is not None:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and not meta(cell).get("grade"):
                graded.outputs[index] = worker.run_cell(index, cell.source)

    def resolve(name):
        if objects is not None:
            if name not in objects:
                from course.testing import fail
                fail(f"{name} is not defined: fill in its exercise and run its cell")
            return objects[name]
        worker.budget(worker.timeout)
        return _remote(worker, name)

    for index, cell in enumerate(nb.cells):
        grade_id = meta(cell).get("grade_id")
        if not meta(cell).get("grade") or grade_id not in lesson.test_cells:
            continue
        if worker is not None:
            worker.budget(worker.timeout)
        if tamper:
            result = TestResult(False, "this notebook changes what the checks rely on, so it "
                                "cannot be graded: " + "; ".join(tamper[:3]))
        else:
            result = lesson.run_test(grade_id, resolve, cells)
        graded.tests[grade_id] = result
        graded.outputs[index] = result.outputs()
    if tamper:
        graded.notes.append("tampering: " + "; ".join(tamper[:5]))
    _cap(graded)
    return graded


def _remote(worker, name):
    from course.testing import fail
    kind = worker.describe(name).get("value") or {}
    if kind.get("kind") == "function":
        return RemoteFunction(worker, name)
    if kind.get("kind") == "kernel":
        return RemoteKernel(worker, name)
    if kind.get("kind") == "value":
        return kind.get("value")
    if kind.get("kind") == "missing":
        fail(f"{name} is not defined: fill in its exercise and run its cell")
    fail(f"{name} is a {kind.get('type', 'value')}, which the grader cannot read")


def _cap(graded):
    """Keep at most TEXT_CAP bytes of learner output in the notebook (figures included)."""
    used = 0
    for index in sorted(graded.outputs):
        kept = []
        for output in graded.outputs[index]:
            size = len(str(output))
            if used + size > TEXT_CAP and output.get("output_type") != "error":
                kept.append({"output_type": "stream", "name": "stdout",
                             "text": "[output not kept: this notebook printed too much]\n"})
                break
            used += size
            kept.append(output)
        graded.outputs[index] = kept


def grade_in_worker(lesson_name, nb, scratch: pathlib.Path, timeout: float) -> Graded:
    """Grade a repaired notebook with its code in a sandboxed worker."""
    lesson = _lesson(lesson_name)
    worker = Worker(scratch, timeout)
    try:
        return grade(lesson, nb, worker=worker)
    finally:
        worker.close()


_LESSONS = {}


def _lesson(name):
    if name not in _LESSONS:
        _LESSONS[name] = Lesson(name)
    return _LESSONS[name]
