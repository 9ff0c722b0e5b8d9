"""Autograde submissions, hand back feedback, export grades (through a real gradebook).

A broken submission costs only its own points: every student gets a recorded score,
whatever their notebook does (raise, loop, kill its kernel, delete or edit test cells).
"""
import json
import pathlib
import re
import shutil
import time

import nbformat

from grader import paths
from grader import build
from grader.build import write_notebook
from grader.nbgrader_setup import DEFAULT_TIMEOUT, api as make_api


def _student_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "student"


def find_submissions(lesson: str, path) -> dict:
    """{student_id: notebook path} from one .ipynb or a folder of students."""
    path = pathlib.Path(path).resolve()
    if path.is_file():  # students/alice/01_softmax.ipynb is alice's; alice.ipynb too
        return {_student_id(path.parent.name if path.stem == lesson else path.stem): path}
    if not path.is_dir():
        raise SystemExit(f"{path} is neither a notebook nor a folder")
    found = {}
    for entry in sorted(path.iterdir()):
        if entry.is_file() and entry.suffix == ".ipynb":
            found[_student_id(entry.stem)] = entry
        elif entry.is_dir():
            notebooks = sorted(entry.rglob("*.ipynb"))
            preferred = [nb for nb in notebooks if nb.stem == lesson]
            if preferred or notebooks:
                found[_student_id(entry.name)] = (preferred or notebooks)[0]
    if not found:
        raise SystemExit(f"no notebooks found in {path}")
    return found


def _grade_cells(nb):
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


def restore_missing_test_cells(submitted, release):
    """Put back grade cells the learner deleted (nbgrader would silently skip them).

    Each comes back after the release cell that preceded it; nbgrader then restores its
    full source (hidden tests included) from the gradebook. Returns the restored ids.
    """
    have = {c.metadata.get("nbgrader", {}).get("grade_id") for c in submitted.cells}
    restored = []
    for position, cell in enumerate(release.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if not cell.metadata.get("nbgrader", {}).get("grade") or grade_id in have:
            continue
        previous = [c.metadata.get("nbgrader", {}).get("grade_id") for c in release.cells[:position]]
        index = len(submitted.cells)  # default: at the end
        for prev_id in reversed([p for p in previous if p in have]):
            index = next(i for i, c in enumerate(submitted.cells)
                         if c.metadata.get("nbgrader", {}).get("grade_id") == prev_id) + 1
            break
        submitted.cells.insert(index, nbformat.from_dict(json.loads(json.dumps(cell))))
        have.add(grade_id)
        restored.append(grade_id)
    return restored


def autograde(lesson: str, path, timeout=None, json_path=None) -> dict:
    """Grade every submission found at `path`; return (and save) per-test results."""
    paths.lesson_path(lesson)
    api = make_api(timeout or DEFAULT_TIMEOUT)
    release = build.release(lesson, api)
    tests = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"]
             for c in _grade_cells(release)}
    results = {"lesson": lesson, "max_score": sum(tests.values()), "tests": tests, "students": {}}
    for student, notebook in find_submissions(lesson, path).items():
        started = time.time()
        record = {"score": 0.0, "tests": {t: 0.0 for t in tests}, "notes": []}
        results["students"][student] = record
        try:
            submitted = nbformat.read(notebook, as_version=4)
        except Exception as error:  # not a notebook: graded as the blank release (0 points),
            # so the student still has a row in the gradebook and the export
            record["notes"].append(f"unreadable notebook, graded as blank: {type(error).__name__}: {error}")
            submitted = nbformat.from_dict(json.loads(json.dumps(release)))
        restored = restore_missing_test_cells(submitted, release)
        if restored:
            record["notes"].append("test cells deleted and put back: " + ", ".join(restored))
        folder = paths.COURSE / "submitted" / student / lesson
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(paths.COURSE / "autograded" / student / lesson, ignore_errors=True)
        write_notebook(submitted, folder / f"{lesson}.ipynb")
        outcome = api.autograde(lesson, student, force=True, create=True)
        graded = paths.COURSE / "autograded" / student / lesson / f"{lesson}.ipynb"
        if not outcome["success"] or not graded.exists():
            # nbgrader drops the folder of a notebook whose kernel died.
            record["notes"].append("autograde failed (the kernel died or the notebook could "
                                   "not run): every test scores 0")
        else:
            record["tests"].update(_scores_from_gradebook(api, lesson, student))
            record["score"] = sum(record["tests"].values())
        record["seconds"] = round(time.time() - started, 1)
    out = paths.COURSE / "grades" / f"{lesson}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for target in [out] + ([pathlib.Path(json_path)] if json_path else []):
        target.write_text(json.dumps(results, indent=2) + "\n")
    return results


def _scores_from_gradebook(api, lesson, student):
    from nbgrader.api import Gradebook
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        notebook = gb.find_submission_notebook(lesson, lesson, student)
        return {g.name: float(g.score or 0.0) for g in notebook.grades}


def print_table(results: dict):
    tests = list(results["tests"])
    width = max([len("student")] + [len(s) for s in results["students"]])
    header = f"{'student':<{width}}  " + "  ".join(tests) + "  total"
    print(header)
    print(f"{'(points)':<{width}}  " + "  ".join(f"{results['tests'][t]:>{len(t)}g}" for t in tests)
          + f"  {results['max_score']:>5g}")
    for student, record in results["students"].items():
        print(f"{student:<{width}}  "
              + "  ".join(f"{record['tests'][t]:>{len(t)}g}" for t in tests)
              + f"  {record['score']:>5g}")
        for note in record["notes"]:
            print(f"{'':<{width}}  note: {note}")


def feedback(lesson: str, student=None):
    """HTML feedback per student, without hidden tests; prints where it went."""
    api = make_api()
    result = api.generate_feedback(lesson, student)
    if not result["success"]:
        raise SystemExit(f"generate_feedback failed:\n{result.get('error') or result.get('log')}")
    pattern = f"{student or '*'}/{lesson}/*.html"
    written = sorted((paths.COURSE / "feedback").glob(pattern))
    for html in written:
        print(f"feedback: {html}")
    return written


def export(to: str):
    """All grades in the gradebook to one CSV (nbgrader's own exporter)."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins.export import CsvExportPlugin
    api = make_api()
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gb:
        CsvExportPlugin(to=str(to)).export(gb)
    print(f"grades: {to}")
    return pathlib.Path(to)
