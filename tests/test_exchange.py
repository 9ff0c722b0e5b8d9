"""A class on one machine, through nbgrader's own exchange commands and our grader: the
instructor releases module 00, learners fetch and submit it with the `nbgrader` CLI (each in
a home of their own), the instructor collects and autogrades, releases feedback, and each
learner fetches theirs. Then the LMS route: a Canvas-style zip of submissions collected
with nbgrader's zip_collect and graded.

nbgrader 0.9.6 takes a learner's id from the password entry of the process's uid (not from
USER), so the learners here, all root, say who they are with `--student`, nbgrader's own
option; on a class machine each learner is an OS user and needs no option."""
import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

from grader import jupyter_roles, nbgrader_setup
from grader.build import write_notebook
from tests import corpus
from tests import submissions as subs
from tests.test_grading import _feedback_text

pytestmark = pytest.mark.xdist_group("exchange")  # one module fixture, one worker

LESSON = "00_foundations"  # the fastest to grade (~5 s a notebook)
BUG = subs.bugs_of(LESSON)["l2_without_sqrt"]
NBGRADER = pathlib.Path(sys.executable).parent / "nbgrader"


def _instructor(course, *args):
    """python -m grader ARGS on the course folder `course`."""
    env = dict(os.environ, COURSE_DIR=str(course))
    env.pop("EXCHANGE_DIR", None)  # the exchange is course/exchange
    done = subprocess.run([sys.executable, "-m", "grader", *args], env=env, cwd=course.parent,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"grader {args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _learner(home, *args):
    """An nbgrader command as a learner types it: in their home, with their own config."""
    done = subprocess.run([str(NBGRADER), *args], cwd=home, capture_output=True, text=True,
                          timeout=300, env={"HOME": str(home), "PATH": f"{NBGRADER.parent}:/usr/bin:/bin"})
    assert done.returncode == 0, f"nbgrader {args}:\n{done.stderr[-3000:]}"
    return done.stderr  # (nbgrader logs there)


def _submit(home, name, notebook):
    """Put `notebook` in place of the fetched one and submit it."""
    write_notebook(notebook, home / LESSON / f"{LESSON}.ipynb")
    _learner(home, "submit", LESSON, f"--student={name}")


@pytest.fixture(scope="module")
def round_(tmp_path_factory):
    work = tmp_path_factory.mktemp("class")
    course = work / "nbgrader_course"  # (a folder named course/ in the working directory
    # would be imported instead of the `course` package: `python -m` puts that directory first)
    _instructor(course, "release", LESSON)
    exchange = course / "exchange"
    # What each learner submits, in order (cat submits twice: the later one counts).
    plan = {"ann": [subs.solution_notebook(LESSON)],
            "bob": [subs.with_bug(LESSON, BUG)],
            "cat": [subs.release(LESSON), subs.solution_notebook(LESSON)]}
    homes = {}
    for name, notebooks in plan.items():
        homes[name] = home = work / "home" / name
        # Learners' config: the exchange and the course (as a class copy or JupyterHub sets it).
        jupyter_roles.write_learner_config(home / ".jupyter", exchange, nbgrader_setup.COURSE_ID)
        _learner(home, "fetch_assignment", LESSON)
        for notebook in notebooks:
            _submit(home, name, notebook)
    # One worker: for three notebooks, starting a pool costs more than it saves.
    collected = _instructor(course, "collect", LESSON, "--timeout", "25", "--workers", "1")
    released = _instructor(course, "release-feedback", LESSON)
    fetched = {name: _learner(home, "fetch_feedback", LESSON, f"--student={name}")
               for name, home in homes.items()}
    return dict(course=course, homes=homes, plan=plan, collected=collected, released=released,
                fetched=fetched, results=json.loads((course / "grades" / f"{LESSON}.json").read_text()),
                inbound=sorted((exchange / nbgrader_setup.COURSE_ID / "inbound").iterdir()))


def test_every_learner_is_scored_the_later_submission_counting(round_):
    r = round_["results"]
    assert set(r["students"]) == {"ann", "bob", "cat"}, round_["collected"][-3000:]
    assert r["students"]["ann"]["score"] == r["students"]["cat"]["score"] == r["max_score"] > 0
    bob = r["students"]["bob"]["tests"]
    lost = {test for test, points in bob.items() if points < r["tests"][test]}
    assert lost == {BUG.test_cell}, bob  # the bug costs its own question, and only that


def test_nothing_is_lost(round_):
    """Every submission is still in the exchange; every learner has a row in the gradebook."""
    from nbgrader.api import Gradebook
    inbound = round_["inbound"]
    assert sorted(p.name.split("+")[0] for p in inbound) == ["ann", "bob", "cat", "cat"]
    assert all((p / f"{LESSON}.ipynb").is_file() for p in inbound)
    course = round_["course"]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", nbgrader_setup.COURSE_ID) as gb:
        rows = {s.student.id: s.score for s in gb.assignment_submissions(LESSON)}
    assert rows == {s: record["score"] for s, record in round_["results"]["students"].items()}


def _fetched(home):
    """{timestamp folder: feedback text} fetched into a learner's home."""
    return {html.parent.name: _feedback_text(html.read_text())
            for html in (home / LESSON / "feedback").glob(f"*/{LESSON}.html")}


def test_each_learner_fetches_feedback_on_their_latest_submission(round_):
    assert "released to 3 student(s)" in round_["released"]
    for name, home in round_["homes"].items():
        cached = sorted(p.name.split("+")[2] for p in
                        (home / ".local/share/jupyter/nbgrader_cache" / nbgrader_setup.COURSE_ID).iterdir())
        assert len(cached) == len(round_["plan"][name])
        # One feedback, on the submission that was graded: the last one.
        assert list(_fetched(home)) == [cached[-1]], (name, round_["fetched"][name][-2000:])


def test_feedback_names_the_bug_and_shows_no_hidden_test(round_):
    texts = {name: _fetched(home) for name, home in round_["homes"].items()}
    assert BUG.says.lower() in next(iter(texts["bob"].values())).lower()
    secrets = corpus.hidden_lines(LESSON)
    assert len(secrets) > 10
    for name, home in round_["homes"].items():
        html = next((home / LESSON / "feedback").glob(f"*/{LESSON}.html")).read_text()
        assert not [line for line in secrets if line in html], name


@pytest.mark.parametrize("lms, path, student, notebook", [
    ("canvas", "x/leeann_101_9001_00_foundations.ipynb", "101", "00_foundations"),
    ("canvas", "x/smithbob_LATE_102_9002_00_foundations-1.ipynb", "102", "00_foundations"),
    ("moodle", "x/Ann Lee_12_assignsubmission_file_00_foundations.ipynb", "Ann Lee_12", "00_foundations"),
    ("moodle", "x/Ann Lee_12_assignsubmission_file/00_foundations.ipynb", "Ann Lee_12", "00_foundations"),
])
def test_lms_file_names_give_student_and_notebook(lms, path, student, notebook):
    from grader.exchange import LMS_PATTERNS
    found = re.match(LMS_PATTERNS[lms], "/course/downloaded/00_foundations/extracted/" + path)
    assert found and (found["student_id"], found["file_id"]) == (student, notebook)


def test_an_lms_zip_is_collected_and_graded(tmp_path):
    """A Canvas download: lastfirst_[LATE_]userid_submissionid_file[-N].ipynb per student."""
    files = {"leeann_101_9001_00_foundations.ipynb": subs.solution_notebook(LESSON),
             "smithbob_LATE_102_9002_00_foundations-1.ipynb": subs.with_bug(LESSON, BUG),
             "notes.ipynb": subs.solution_notebook(LESSON)}  # no student in its name: skipped
    download = tmp_path / "submissions.zip"
    with zipfile.ZipFile(download, "w") as archive:
        for name, nb in files.items():
            write_notebook(nb, tmp_path / name)
            archive.write(tmp_path / name, name)
    course = tmp_path / "nbgrader_course"
    out = _instructor(course, "collect-zip", LESSON, str(download), "--names", "canvas",
                      "--timeout", "25", "--workers", "1")
    assert "notes.ipynb" in out  # said, not silently dropped
    r = json.loads((course / "grades" / f"{LESSON}.json").read_text())
    assert set(r["students"]) == {"101", "102"}
    assert r["students"]["101"]["score"] == r["max_score"] > 0
    bob = r["students"]["102"]["tests"]
    assert {test for test, points in bob.items() if points < r["tests"][test]} == {BUG.test_cell}
