"""Autograde submissions, hand back feedback, export grades (through a real gradebook).

Each submission is repaired against the release (grader/repair.py), then nbgrader's
autograde runs with grader.nbgrader_setup.GradeInWorker in place of its Execute step:
the notebook's code runs in a sandboxed worker, the tests decide in this process
(grader/grading.py). A broken or hostile submission costs only its own points: every
student gets a recorded score, written as soon as it is known, and the grader's own files
are fingerprinted before and after the run.
"""
import hashlib
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


# Files nbgrader's exchange writes next to a submitted notebook.
EXCHANGE_FILES = ("timestamp.txt", "submission_secret.txt")


def _student_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "student"


def _skipped(path: pathlib.Path) -> bool:
    """Editor leftovers are never a submission: .ipynb_checkpoints and hidden folders."""
    return any(part.startswith(".") for part in path.parts)


def find_submissions(lesson: str, path) -> dict:
    """{student_id: notebook path} from one .ipynb or a folder of students. Two entries
    whose names give one id ("ann lee" and "ann_lee") are refused: one would overwrite
    the other's grades."""
    path = pathlib.Path(path).resolve()
    if path.is_file():  # students/alice/01_softmax.ipynb is alice's; alice.ipynb too
        return {_student_id(path.parent.name if path.stem == lesson else path.stem): path}
    if not path.is_dir():
        raise SystemExit(f"{path} is neither a notebook nor a folder")
    found, names = {}, {}
    for entry in sorted(path.iterdir()):
        if _skipped(entry.relative_to(path)):
            continue
        if entry.is_file() and entry.suffix == ".ipynb":
            notebook = entry
            student = _student_id(entry.stem)
        elif entry.is_dir():
            notebooks = [nb for nb in sorted(entry.rglob("*.ipynb"))
                         if not _skipped(nb.relative_to(path))]
            preferred = [nb for nb in notebooks if nb.stem == lesson]
            if not (preferred or notebooks):
                continue
            notebook, student = (preferred or notebooks)[0], _student_id(entry.name)
        else:
            continue
        if student in found:
            raise SystemExit(f"{names[student]!r} and {entry.name!r} both give the student id "
                             f"{student!r}: rename one of them, nothing was graded")
        found[student], names[student] = notebook, entry.name
    if not found:
        raise SystemExit(f"no notebooks found in {path}")
    return found


def _grade_cells(nb):
    return [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]


def fingerprint() -> dict:
    """{path: sha256} of the grader's own files (code, lessons, answers, release), to prove
    that grading a class changed none of them."""
    import hashlib
    files = {}
    for folder in ("grader", "solutions", "course", "modules"):
        for f in sorted((paths.REPO / folder).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                files[str(f.relative_to(paths.REPO))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return files


def _read(notebook, release, record):
    try:
        submitted = nbformat.read(notebook, as_version=4)
        if not isinstance(submitted.get("cells"), list):
            raise ValueError("it has no list of cells")
        return submitted
    except Exception as error:  # not a notebook: graded as the blank release (0 points),
        # so the student still has a row in the gradebook and the export
        record["notes"].append(f"unreadable notebook, graded as blank: {type(error).__name__}: "
                               f"{str(error)[:200]}")
        return nbformat.from_dict(json.loads(json.dumps(release)))


def _digest(notebook) -> str:
    return hashlib.sha1(pathlib.Path(notebook).read_bytes()).hexdigest()


def _pregrade(course, lesson, student, nb, timeout):
    """In a pool process: grade one repaired notebook ahead of nbgrader (the costly part)."""
    from grader import nbgrader_setup
    paths.COURSE = course
    started = time.time()
    return nbgrader_setup.grade_one(lesson, student, nb, timeout), time.time() - started


def autograde(lesson: str, path, timeout=None, json_path=None, workers=1, regrade=False) -> dict:
    """Grade every submission found at `path`; return (and save, after each student) the
    per-test results.

    workers > 1 grades that many notebooks at once in separate processes (each with its
    sandboxed worker) and records them in the gradebook one by one as they finish. A run
    that was interrupted starts again where it stopped: a student whose submission is
    unchanged since their recorded grade is not graded again (unless `regrade`).
    """
    from grader import repair, sandbox
    from grader.nbgrader_setup import PREGRADED, RESULTS
    paths.lesson_path(lesson)
    submissions = find_submissions(lesson, path)
    before = fingerprint()
    timeout = timeout or DEFAULT_TIMEOUT
    api = make_api(timeout)
    release = build.release(lesson, api)
    reference = build.source_notebook(lesson)
    tests = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"]
             for c in _grade_cells(release)}
    results = {"lesson": lesson, "max_score": sum(tests.values()), "tests": tests,
               "sandbox": sandbox.level(), "students": {}}
    out = paths.COURSE / "grades" / f"{lesson}.json"
    earlier = json.loads(out.read_text())["students"] if out.exists() and not regrade else {}
    todo = {}
    for student, notebook in submissions.items():
        kept = earlier.get(student)
        if kept and kept.get("submission_sha1") == _digest(notebook) and "seconds" in kept:
            results["students"][student] = kept  # graded before this run was interrupted
        else:
            todo[student] = notebook
    print(f"grading {len(todo)} submission(s) of {lesson} with {workers} worker process(es)"
          + (f" ({len(submissions) - len(todo)} already graded and unchanged)" if len(todo) < len(submissions) else "")
          + f"; notebook code runs in a sandbox of level {results['sandbox']!r} (grader/sandbox.py)")
    repaired = {}
    for student, notebook in todo.items():
        record = {"score": 0.0, "tests": {t: 0.0 for t in tests}, "notes": [], "messages": {},
                  "submission_sha1": _digest(notebook)}
        results["students"][student] = record
        repaired[student], notes = repair.repair(_read(notebook, release, record), release, reference)
        record["notes"] += notes
    progress = _Progress(len(todo))
    for student, pregraded, seconds in _graded_in_turn(lesson, repaired, timeout, workers):
        record, submitted = results["students"][student], repaired[student]
        folder = paths.COURSE / "submitted" / student / lesson
        # What nbgrader's exchange or zip_collect left beside the notebook travels with it:
        # the submission time (late penalty) and the secret that names the feedback file
        # fetch_feedback looks for. Read first: the notebook may come from `folder` itself.
        exchange_files = {name: todo[student].parent / name for name in EXCHANGE_FILES}
        exchange_files = {name: f.read_bytes() for name, f in exchange_files.items() if f.is_file()}
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(paths.COURSE / "autograded" / student / lesson, ignore_errors=True)
        write_notebook(submitted, folder / f"{lesson}.ipynb")
        for name, data in exchange_files.items():
            (folder / name).write_bytes(data)
        RESULTS.pop((lesson, student), None)
        started = time.time()
        if pregraded is not None:
            PREGRADED[(lesson, student)] = ([c.source for c in submitted.cells], pregraded)
        outcome = api.autograde(lesson, student, force=True, create=True)
        PREGRADED.pop((lesson, student), None)
        graded = paths.COURSE / "autograded" / student / lesson / f"{lesson}.ipynb"
        if not outcome["success"] or not graded.exists():
            record["notes"].append("autograde failed, every test scores 0: "
                                   + _last_error(outcome.get("log") or outcome.get("error") or ""))
        else:
            record["tests"].update(_scores_from_gradebook(api, lesson, student))
            record["score"] = sum(record["tests"].values())
        done = RESULTS.pop((lesson, student), None)
        if done is not None:
            record["notes"] += done.notes
            record["messages"] = {t: r.message for t, r in done.tests.items() if not r.passed}
        record["seconds"] = round(seconds + time.time() - started, 1)
        _write(results, [out] + ([pathlib.Path(json_path)] if json_path else []))
        progress.done(student, record, results["max_score"])
    after = fingerprint()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    results["grader_files_changed"] = changed
    if changed:
        print("WARNING: grader files changed during grading: " + ", ".join(changed))
    _write(results, [out] + ([pathlib.Path(json_path)] if json_path else []))
    return results


def _graded_in_turn(lesson, repaired, timeout, workers):
    """(student, Graded or None, seconds) as each is ready: with one worker nothing is
    graded ahead (nbgrader's step grades it); with more, a pool grades them in parallel."""
    if workers <= 1 or len(repaired) <= 1:
        for student in repaired:
            yield student, None, 0.0
        return
    import concurrent.futures
    import multiprocessing
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_pregrade, paths.COURSE, lesson, student, nb, timeout): student
                   for student, nb in repaired.items()}
        for future in concurrent.futures.as_completed(futures):
            try:
                graded, seconds = future.result()
            except Exception:  # noqa: BLE001 (nbgrader's own step grades it again, in this process)
                graded, seconds = None, 0.0
            yield futures[future], graded, seconds
    finally:
        pool.shutdown(cancel_futures=True)


class _Progress:
    """One line per graded student: how many are done, the score, the time left."""

    def __init__(self, total):
        self.total, self.count, self.start = total, 0, time.time()

    def done(self, student, record, max_score):
        self.count += 1
        elapsed = time.time() - self.start
        left = elapsed / self.count * (self.total - self.count)
        eta = f"about {left / 60:.0f} min left" if left >= 90 else f"about {left:.0f} s left"
        print(f"[{self.count}/{self.total}] {student}: {record['score']:g}/{max_score:g} "
              f"({record['seconds']:.1f} s)" + (f"; {eta}" if self.count < self.total else ""),
              flush=True)


def _last_error(log: str) -> str:
    lines = [l for l in str(log).splitlines() if l.strip()]
    return lines[-1][:300] if lines else "no log"


def _write(results, targets):
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=2) + "\n")
        tmp.replace(target)


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
