"""The chain from a submitted notebook to a score, through nbgrader, for every module
that has a classic-bug catalog: the reference earns full marks, the untouched release 0,
each classic bug loses points on its own exercise and its feedback names the problem
without showing hidden tests. Module 01 is also graded with the adversarial corpus of
tests/corpus.py, through the real CLI."""
import re

import pytest

from grader import autograde as ag
from grader import paths
from tests import corpus, grade_lessons
from tests import submissions as subs

LESSONS = subs.lessons_with_bugs()
# Through nbgrader (6-40 s a notebook) run the first two bugs of each catalog: the chain
# (repair, worker, verdict, gradebook, feedback) is the same for every bug, and module
# 01's corpus runs one per test cell; tests/test_bugs.py runs every bug of every catalog
# in process. (Five a lesson kept CI over its 25 minutes.)
BUGS_THROUGH_NBGRADER = 2
TIMEOUT = 25  # seconds per cell


_RUNS = {}


@pytest.fixture(scope="session")
def grade(tmp_path_factory):
    """grade(lesson): autograde every submission of one lesson in one run (cached)."""
    def run(lesson):
        if lesson not in _RUNS:
            _RUNS[lesson] = _run(lesson, tmp_path_factory.mktemp(lesson))
        return _RUNS[lesson]
    return run


def _run(lesson, work):
    saved, paths.COURSE = paths.COURSE, work / "course"
    try:
        folder = work / "submitted_by_students"
        bugs = grade_lessons.write_submissions(lesson, folder, BUGS_THROUGH_NBGRADER)
        results = ag.autograde(lesson, folder, timeout=TIMEOUT)
        ag.print_table(results)
        feedback = {html.parent.parent.name: html.read_text() for html in ag.feedback(lesson)}
        csv = ag.export(work / "grades.csv").read_text()
        return dict(lesson=lesson, results=results, bugs=bugs, feedback=feedback, csv=csv)
    finally:
        paths.COURSE = saved


# Each lesson's run stays on one xdist worker (tests/conftest.py groups them by lesson).
@pytest.fixture(params=[name for name in LESSONS if name != corpus.LESSON])
def graded(request, grade):
    return grade(request.param)


def test_reference_scores_full_marks(graded):
    r = graded["results"]
    assert r["students"]["reference"]["score"] == r["max_score"] > 0, r["students"]["reference"]


def test_untouched_release_scores_zero(graded):
    assert graded["results"]["students"]["untouched"]["score"] == 0


def test_every_classic_bug_loses_points_where_it_belongs(graded):
    r = graded["results"]
    assert len(graded["bugs"]) == BUGS_THROUGH_NBGRADER
    rows = grade_lessons.verdicts(r, graded["bugs"])
    for name in graded["bugs"]:
        score, expected, right = rows[f"bug_{name}"]
        assert right, (name, score, expected, r["students"][f"bug_{name}"])


def _feedback_text(html):
    """The words of the feedback page (tags dropped, whitespace and line wraps collapsed)."""
    text = re.sub(r"<[^>]+>", " ", html).replace("&quot;", '"').replace("&#39;", "'").replace("&amp;", "&")
    return " ".join(text.split())


def test_feedback_names_the_problem_and_hides_hidden_tests(graded):
    for name, bug in graded["bugs"].items():
        text = _feedback_text(graded["feedback"][f"bug_{name}"])
        assert bug.says.lower() in text.lower(), f"feedback of bug {name} does not say {bug.says!r}"
    secrets = corpus.hidden_lines(graded["lesson"])
    for student, html in graded["feedback"].items():
        assert not [line for line in secrets if line in html], student
    for student in graded["results"]["students"]:
        assert f",{student}," in graded["csv"], student


@pytest.fixture(scope="session")
def adversarial(tmp_path_factory):
    facts = corpus.run(tmp_path_factory.mktemp("corpus"))
    assert facts["graded"].returncode == 0, facts["graded"].stderr[-3000:]
    return facts, corpus.counts(facts)


@pytest.mark.xdist_group(corpus.LESSON)
@pytest.mark.parametrize("count", ["false_full_marks", "false_deductions", "successful_cheats",
                                   "not_scored", "files_changed", "hidden_lines_in_feedback",
                                   "stray_processes"])
def test_adversarial_corpus_count_is_zero(adversarial, count):
    facts, counts = adversarial
    assert counts[count] == [], counts[count]


@pytest.mark.xdist_group(corpus.LESSON)
def test_adversarial_corpus_covers_every_kind_and_bounds_feedback(adversarial):
    facts, counts = adversarial
    kinds = {e.kind for e in facts["expect"].values()}
    assert kinds == {"correct", "mangled", "bug", "cheat", "attack", "broken", "victim"}
    assert counts["submissions"] >= 45
    assert counts["largest_feedback_bytes"] < 1_000_000  # one student printed 50 MB
    assert facts["results"]["sandbox"] != "none"
    notes = facts["results"]["students"]["broken_not_a_notebook"]["notes"]
    assert any("unreadable" in n for n in notes)
    assert any("tampering" in n for n in facts["results"]["students"]["cheat_patched_torch"]["notes"])
    # Feedback says why a cheat scored 0, naming the line, and names each bug's problem.
    assert "torch.allclose" in _feedback_text(facts["feedback"]["cheat_patched_torch"])
    assert {bug.test_cell for bug in corpus.bug_sample().values()} == \
        {bug.test_cell for bug in subs.bugs_of(corpus.LESSON).values()}
    for name, bug in corpus.bug_sample().items():
        text = _feedback_text(facts["feedback"][f"bug_{name}"])
        assert bug.says.lower() in text.lower(), f"feedback of bug {name} does not say {bug.says!r}"


def test_colliding_student_ids_are_refused(tmp_path):
    for name in ("ann lee", "ann_lee"):
        subs.save(subs.release(corpus.LESSON), tmp_path, name, corpus.LESSON)
    with pytest.raises(SystemExit, match="both give the student id"):
        ag.find_submissions(corpus.LESSON, tmp_path)


def test_parallel_and_resumed_runs_score_every_student_once(tmp_path, capsys):
    """Two worker processes give the scores one gives; a second run grades only the
    submission that changed since (an interrupted run resumes where it stopped)."""
    lesson = "00_foundations"
    saved, paths.COURSE = paths.COURSE, tmp_path / "course"
    try:
        folder = tmp_path / "submitted_by_students"
        subs.save(subs.solution_notebook(lesson), folder, "reference", lesson)
        subs.save(subs.release(lesson), folder, "untouched", lesson)
        bugs = list(subs.bugs_of(lesson).values())[:2]
        for i, bug in enumerate(bugs):
            subs.save(subs.with_bug(lesson, bug), folder, f"bug{i}", lesson)
        first = ag.autograde(lesson, folder, timeout=TIMEOUT, workers=2)
        scores = {s: r["score"] for s, r in first["students"].items()}
        assert scores["reference"] == first["max_score"] > scores["bug0"] > 0 == scores["untouched"]
        assert scores["bug1"] < first["max_score"]
        subs.save(subs.solution_notebook(lesson), folder, "untouched", lesson)  # resubmitted
        capsys.readouterr()
        again = ag.autograde(lesson, folder, timeout=TIMEOUT, workers=2)["students"]
        assert "grading 1 submission(s)" in capsys.readouterr().out
        assert {s: r["score"] for s, r in again.items()} == dict(scores, untouched=scores["reference"])
    finally:
        paths.COURSE = saved
