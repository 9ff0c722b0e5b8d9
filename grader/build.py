"""Lesson source (jupytext) -> instructor notebook -> student release.

See ARCHITECTURE.md. The only inputs are grader/lessons/NN_topic/lesson.py and solutions/.
Two directives bring code from solutions/topic.py into a cell, so it exists once:
`# solution: topic.name` (an exercise: the body becomes the solution region) and
`# given: topic.NAME` (a value or function the lesson hands the learner, pasted as it is).
"""
import ast
import contextlib
import importlib
import io
import json
import re

import jupytext
import nbformat

from grader import paths

_DIRECTIVE = re.compile(r"^(\s*)# (solution|given): (\w+)\.(\w+)\s*$")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
WHY = "**Why.**"  # a markdown cell starting so, right after a test cell, is sealed (course/quiz.py)


def _solution_code(topic: str, name: str) -> str:
    """`name` from solutions/topic.py, its body wrapped in solution markers."""
    path = paths.SOLUTIONS / f"{topic}.py"
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            first = node.body[0]
            has_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                and isinstance(first.value.value, str)
            if has_doc and len(node.body) == 1:
                raise ValueError(f"{topic}.{name} has a docstring and no body")
            body_start = (first.end_lineno if has_doc else first.lineno - 1)
            indent = re.match(r"\s*", lines[node.body[1 if has_doc else 0].lineno - 1]).group(0)
            return "\n".join(lines[start:body_start] + [indent + BEGIN]
                             + lines[body_start:node.end_lineno] + [indent + END])
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return "\n".join([BEGIN] + lines[node.lineno - 1:node.end_lineno] + [END])
    raise ValueError(f"solutions/{topic}.py defines no function or variable {name!r}")


def _given_code(topic: str, name: str) -> str:
    """The statement that assigns `name` in solutions/topic.py, or the whole function
    `name` (decorators included), with the comment above it."""
    source = (paths.SOLUTIONS / f"{topic}.py").read_text()
    lines = source.splitlines()
    for node in ast.parse(source).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
        if is_function or any(isinstance(n, ast.Name) and n.id == name  # a, b = ... too
                              for t in targets for n in ast.walk(t)):
            start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno]) - 1
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            return "\n".join(lines[start:node.end_lineno])
    raise ValueError(f"solutions/{topic}.py defines no {name!r}")


def _fill(cell_source: str, solution: bool) -> str:
    out = []
    for line in cell_source.split("\n"):
        match = _DIRECTIVE.match(line)
        if match:
            indent, kind, topic, name = match.groups()
            if (kind == "solution") != solution:
                raise ValueError(f"`# {kind}:` in a{' solution' if solution else ' locked'} cell: "
                                 "solutions go in solution cells, given values in locked ones")
            code = _solution_code(topic, name) if kind == "solution" else _given_code(topic, name)
            out.append("\n".join(indent + l if l else l for l in code.split("\n")))
        else:
            out.append(line)
    return "\n".join(out)


def _lesson_cells(name: str):
    return jupytext.read(paths.lesson_path(name), fmt="py:percent")


def _explanation_cells(nb):
    """(test cell, explanation) pairs: the "**Why.**" markdown cells after test cells."""
    for before, cell in zip(nb.cells, nb.cells[1:]):
        if (cell.cell_type == "markdown" and cell.source.startswith(WHY)
                and before.metadata.get("nbgrader", {}).get("grade")):
            yield before, cell


def explanations(names=None) -> dict:
    """Every lesson's sealed explanations, for course/explanations.json.

    Each test cell followed by an explanation is run on the answer key (its line, with the
    names of solutions/topic.py) while course.quiz records the canonical answer it judges;
    the explanation is then sealed with that answer.
    """
    from course import quiz
    sealed = {}
    for name in names or paths.lesson_names():
        topic = paths.topic_of(name)
        for test, why in _explanation_cells(_lesson_cells(name)):
            namespace = dict(vars(importlib.import_module(f"solutions.{topic}")),
                             checks=importlib.import_module(f"course.checks.{topic}"))
            quiz._recording = recorded = {}
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # the checks' ok lines
                    exec(test.source, namespace)
            finally:
                quiz._recording = None
            if len(recorded) != 1:
                raise ValueError(f"{name}: the check before an explanation must judge one "
                                 f"answer with course.quiz.judge; it judged {sorted(recorded)}")
            (question, canon), = recorded.items()
            if question in sealed:
                raise ValueError(f"{name}: question name {question!r} is used twice")
            sealed[question] = quiz.seal(question, canon, why.source)
    return dict(sorted(sealed.items()))


def write_explanations():
    from course import quiz
    quiz.SEALED.write_text(json.dumps(explanations(), indent=1) + "\n")
    return quiz.SEALED


def _progress_cells(nb):
    """The closing cells of every notebook: each exercise's check, its points, run again
    by course.overview.progress (written from the test cells, so it never goes stale)."""
    entries = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            exercise = meta["grade_id"].removeprefix("test_")
            entries.append(f"    ({exercise!r}, {meta['points']}, lambda: {cell.source.strip()}),")
    text = nbformat.v4.new_markdown_cell(
        "## Your progress\n\nEvery exercise's check again, quietly, with its points. Run it "
        "whenever you like; the grade comes from the hidden tests.")
    code = nbformat.v4.new_code_cell("\n".join(
        ["from course.overview import progress", "", "progress(["] + entries + ["])"]))
    code.metadata["nbgrader"] = {"grade": False, "grade_id": "progress", "locked": True,
                                 "schema_version": 3, "solution": False, "task": False}
    return [text, code]


def source_notebook(name: str) -> nbformat.NotebookNode:
    """The instructor's notebook: lesson cells with solutions filled in from solutions/;
    explanations sealed by the quiz leave it (the check shows them to a right answer)."""
    nb = _lesson_cells(name)
    sealed = [id(cell) for _, cell in _explanation_cells(nb)]
    nb.cells = [cell for cell in nb.cells if id(cell) not in sealed]
    nb.cells += _progress_cells(nb)
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code":
            cell.source = _fill(cell.source, bool(meta.get("solution")))
        if cell.cell_type == "code" and meta.get("grade_id") != "setup":
            # JupyterLab's Run All goes on past a cell that fails (an exercise not written
            # yet, a failed check): every later cell says what it needs, and the closing
            # progress table is reached.
            cell.metadata["tags"] = ["raises-exception"]
        # Deterministic ids, so that a rebuild gives the same bytes.
        cell.id = f"{index:03d}-{meta.get('grade_id', cell.cell_type)}"[:64]
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def _strip_between(text: str, begin: str, end: str) -> str:
    """text without its marker lines."""
    return "\n".join(line for line in text.split("\n") if begin not in line and end not in line)


def solution_notebook(name: str) -> nbformat.NotebookNode:
    """What a learner who solved everything would submit: solutions in, markers out."""
    nb = source_notebook(name)
    for cell in nb.cells:
        cell.source = _strip_between(cell.source, BEGIN, END)
    return nb


def write_notebook(nb, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def release(name: str, api) -> nbformat.NotebookNode:
    """Write the instructor source, let nbgrader generate the student release (and record
    the grade cells in the gradebook), and return the release."""
    write_notebook(source_notebook(name), paths.COURSE / "source" / name / f"{name}.ipynb")
    result = api.generate_assignment(name, force=True, create=True)
    if not result["success"]:
        raise SystemExit(f"nbgrader generate_assignment {name} failed:\n"
                         f"{result.get('error') or result.get('log')}")
    return nbformat.read(paths.COURSE / "release" / name / f"{name}.ipynb", as_version=4)


def build(names=None, modules_dir=None):
    """Generate the releases and copy them to modules/ (or modules_dir)."""
    from grader.nbgrader_setup import api as make_api

    names = names or paths.lesson_names()
    modules_dir = modules_dir or paths.MODULES
    api = make_api()
    for name in names:
        target = modules_dir / name / f"{name}.ipynb"
        write_notebook(release(name, api), target)
        print(f"built {target}")
    if modules_dir == paths.MODULES:
        print(f"wrote {write_explanations()}")
        from grader import answer_key
        for name in set(names) & set(answer_key.lessons()):
            print(f"wrote {answer_key.write(name)}")
    return names
