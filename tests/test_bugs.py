"""Every exercise of every module, in process (fast): the reference passes every test
cell, the untouched release fails every one, and each classic bug of the catalog fails
its own test cell with a message that names the problem. tests/test_grading.py runs a
sample of the same submissions through nbgrader itself."""
import functools

import pytest

from tests import submissions as subs

LESSONS = subs.lessons_with_bugs()
CASES = [(lesson, bug) for lesson in LESSONS for bug in subs.bugs_of(lesson)]


@pytest.mark.parametrize("lesson", LESSONS)
def test_reference_passes_every_test_cell(lesson):
    results = subs.run_in_process(lesson, subs.solution_notebook(lesson))
    assert results and all(error is None for error in results.values()), results


@pytest.mark.parametrize("lesson", LESSONS)
def test_untouched_release_fails_every_test_cell(lesson):
    results = subs.run_in_process(lesson, subs.release(lesson))
    assert results and all(results.values()), {k: v for k, v in results.items() if not v}


@functools.lru_cache(maxsize=None)
def _solved(lesson):
    """The namespace of the solved notebook, run once per lesson (and per xdist worker)."""
    return subs.execute(lesson, subs.solution_notebook(lesson))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN-producing bugs warn in numpy
@pytest.mark.parametrize("lesson, name", CASES)
def test_classic_bug_fails_its_test_cell_and_names_the_problem(lesson, name):
    bug = subs.bugs_of(lesson)[name]
    nb = subs.with_bug(lesson, bug)
    # The solved notebook with the bug's cell run again, as a learner re-running one cell
    # (in the same namespace: the other cells' functions look their callees up there),
    # then the reference cell again for the next test.
    namespace = _solved(lesson)
    try:
        subs.execute(lesson, nb, namespace=namespace, only={bug.exercise})
        results = subs.run_in_process(lesson, nb, objects=namespace)
    finally:
        subs.execute(lesson, subs.solution_notebook(lesson), namespace=namespace, only={bug.exercise})
    message = results[bug.test_cell]
    assert message, f"{lesson}: bug {name} passes {bug.test_cell}"
    assert bug.says.lower() in message.lower(), f"{lesson}: bug {name}: {message}"
    elsewhere = {t: e for t, e in results.items() if e and t != bug.test_cell and t not in bug.also}
    assert not elsewhere, f"{lesson}: bug {name} also fails unrelated cells: {elsewhere}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_catalog_has_at_least_five_bugs(lesson):
    assert len(subs.bugs_of(lesson)) >= 5
