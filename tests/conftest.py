"""Shared test set-up. `import course` first: it selects Triton's interpreter on a CPU
before anything imports triton."""
import os
import sys
import warnings

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")  # lesson plot cells run in-process: no windows

import course  # noqa: E402


@pytest.fixture(autouse=True)
def _warning_filters_as_in_a_learners_kernel():
    """pytest imports this file, and runs each test, under warning filters of its own, so
    the filter `import course` installs is gone by the time tests run: it is installed
    again for each test, as a learner's kernel has it."""
    if course.INTERPRET:
        warnings.filterwarnings("ignore", **course.INTERPRETER_FP_WARNINGS)


@pytest.fixture(autouse=True)
def _no_launch_plans_from_earlier_tests():
    """Each test sees its own calls' launches: a launch plan recorded by an earlier test
    (solutions/flash_tuned.py, `LaunchPlan`) would skip a kernel or a check that this
    test patches."""
    tuned = sys.modules.get("solutions.flash_tuned")
    if tuned is not None:
        tuned._PLANS.clear()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """One lesson's nbgrader run (tests/test_grading.py's `graded`, cached per process)
    stays on one xdist worker: a group mark on a fixture's param does not reach the tests,
    so it is added here, before xdist reads the groups."""
    for item in items:
        lesson = getattr(getattr(item, "callspec", None), "params", {}).get("graded")
        if lesson is not None:
            item.add_marker(pytest.mark.xdist_group(lesson))
