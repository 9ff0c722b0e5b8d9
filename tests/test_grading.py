"""The chain from a submitted notebook to a score, through nbgrader, for every module
that has a classic-bug catalog: the reference earns full marks, the untouched release 0,
each classic bug loses points on its own exercise and its feedback names the problem
without showing hidden tests. Module 01 also carries the broken submissions."""
import re

import pytest

from grader import autograde as ag
from grader import paths
from tests import submissions as subs

LESSONS = subs.lessons_with_bugs()
# Through nbgrader (~6 s a notebook) run every bug of module 01 and the first five of the
# other catalogs; tests/test_bugs.py runs every bug of every catalog in process.
BUGS_THROUGH_NBGRADER = {"01_softmax": None}
TIMEOUT = 25  # seconds per cell: the infinite loop costs this much, twice


def _broken_softmax(lesson):
    """Broken notebooks for module 01: {student: (notebook, expected lost test cells)}."""
    def patched(grade_id, find, replace, base=None):
        return subs.patch(base or subs.solution_notebook(lesson), grade_id, find, replace)

    def without(nb, grade_id):
        nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != grade_id]
        return nb

    rescale = subs.bugs_of(lesson)["rescale_order"]
    return {
        "raises": (patched("online_softmax", "def online_softmax", "raise RuntimeError('boom')\ndef online_softmax"),
                   {"test_online_softmax"}),
        "syntax_error": (patched("softmax_stable", "def softmax_stable(x, dim=-1):", "def softmax_stable(x, dim=-1:"),
                         {"test_softmax_stable"}),
        "infinite_loop": (patched("online_softmax", '    x32 = x.to(torch.float32)\n',
                                  '    while True:\n        pass\n'),
                          {"test_online_softmax"}),
        "kills_kernel": (patched("softmax", "    n_rows, n_cols = x.shape\n",
                                 "    import os; os._exit(1)\n"), "all"),
        "tampers_with_checks": (patched(
            "softmax_stable", "def softmax_stable(x, dim=-1):",
            "import course.testing, course.checks.softmax as _c\n"
            "course.testing.assert_close = lambda *a, **k: 0.0\n"
            "_c.assert_close = lambda *a, **k: 0.0\n"
            "_c.check_softmax_stable = lambda f: None\n"
            "checks.check_softmax_stable = lambda f: None\n"
            "def softmax_stable(x, dim=-1):\n    return torch.zeros_like(x)\n"
            "def _unused(x, dim=-1):"), {"test_softmax_stable"}),
        "deletes_test_cell": (without(subs.with_bug(lesson, rescale), "test_online_softmax"),
                              {"test_online_softmax"}),
        "deletes_test_cell_correct": (without(subs.solution_notebook(lesson), "test_softmax_naive"), set()),
        "edits_test_cell": (patched("test_online_softmax", "checks.check_online_softmax(online_softmax)",
                                    "pass", base=subs.with_bug(lesson, rescale)),
                            {"test_online_softmax"}),
    }


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
        subs.save(subs.solution_notebook(lesson), folder, "reference", lesson)
        subs.save(subs.release(lesson), folder, "untouched", lesson)
        bugs = dict(list(subs.bugs_of(lesson).items())[:BUGS_THROUGH_NBGRADER.get(lesson, 5)])
        for name, bug in bugs.items():
            subs.save(subs.with_bug(lesson, bug), folder, f"bug_{name}", lesson)
        broken = _broken_softmax(lesson) if lesson == "01_softmax" else {}
        for name, (nb, _) in broken.items():
            subs.save(nb, folder, f"broken_{name}", lesson)
        if broken:  # a file that is not a notebook at all
            (folder / "broken_not_a_notebook").mkdir()
            (folder / "broken_not_a_notebook" / f"{lesson}.ipynb").write_text("{ this is not json")
        results = ag.autograde(lesson, folder, timeout=TIMEOUT)
        ag.print_table(results)
        feedback = {html.parent.parent.name: html.read_text() for html in ag.feedback(lesson)}
        csv = ag.export(work / "grades.csv").read_text()
        return dict(lesson=lesson, results=results, bugs=bugs, broken=broken, feedback=feedback, csv=csv)
    finally:
        paths.COURSE = saved


# Each lesson's run stays on one xdist worker (its submissions are graded once).
@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.xdist_group(name)) for name in LESSONS])
def graded(request, grade):
    return grade(request.param)


def test_reference_scores_full_marks(graded):
    r = graded["results"]
    assert r["students"]["reference"]["score"] == r["max_score"] > 0, r["students"]["reference"]


def test_untouched_release_scores_zero(graded):
    assert graded["results"]["students"]["untouched"]["score"] == 0


def test_every_classic_bug_loses_points_where_it_belongs(graded):
    r = graded["results"]
    assert len(graded["bugs"]) >= 5
    for name, bug in graded["bugs"].items():
        record = r["students"][f"bug_{name}"]
        assert record["tests"][bug.test_cell] < r["tests"][bug.test_cell], (name, record)
        assert record["score"] < r["max_score"], name


def _feedback_text(html):
    """The words of the feedback page (tags dropped, whitespace and line wraps collapsed)."""
    text = re.sub(r"<[^>]+>", " ", html).replace("&quot;", '"').replace("&#39;", "'").replace("&amp;", "&")
    return " ".join(text.split())


def test_feedback_names_the_problem_and_hides_hidden_tests(graded):
    for name, bug in graded["bugs"].items():
        text = _feedback_text(graded["feedback"][f"bug_{name}"])
        assert bug.says.lower() in text.lower(), f"feedback of bug {name} does not say {bug.says!r}"
    topic = subs.topic_of(graded["lesson"])
    for student, html in graded["feedback"].items():
        for secret in ("BEGIN HIDDEN TESTS", "grader.hidden", f'load("{topic}")', f"load(&quot;{topic}",
                       "grader/hidden"):
            assert secret not in html, f"feedback of {student} shows {secret!r}"


@pytest.mark.xdist_group("01_softmax")
def test_broken_submissions_cost_only_their_own_points(grade):
    graded = grade("01_softmax")
    r = graded["results"]
    for name, (_, lost) in graded["broken"].items():
        record = r["students"][f"broken_{name}"]
        for test, points in r["tests"].items():
            expected = 0 if lost == "all" or test in lost else points
            assert record["tests"][test] == expected, (name, test, record)
    unreadable = r["students"]["broken_not_a_notebook"]
    assert unreadable["score"] == 0 and any("unreadable" in n for n in unreadable["notes"])
    # Every student nbgrader saw has a score in the exported gradebook, the dead one too.
    for student in r["students"]:
        assert f",{student}," in graded["csv"], student
    notes = r["students"]["broken_kills_kernel"]["notes"]
    assert any("kernel died" in n for n in notes)
    assert any("put back" in n for n in r["students"]["broken_deletes_test_cell"]["notes"])
