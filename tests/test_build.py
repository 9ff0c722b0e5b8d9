"""One source of truth: the committed student notebooks equal a fresh build, and no
solution or hidden test reaches them."""
import pytest

from grader import build, paths

LESSONS = paths.lesson_names()
pytestmark = pytest.mark.xdist_group("build")  # one worker builds everything once


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    work = tmp_path_factory.mktemp("build")
    saved, paths.COURSE = paths.COURSE, work / "course"
    try:
        build.build(LESSONS, modules_dir=work / "modules")
    finally:
        paths.COURSE = saved
    return work / "modules"


@pytest.mark.parametrize("lesson", LESSONS)
def test_committed_notebook_equals_fresh_build(fresh, lesson):
    committed = paths.MODULES / lesson / f"{lesson}.ipynb"
    assert committed.exists(), f"run `python -m grader build {lesson}` and commit {committed}"
    assert committed.read_text() == (fresh / lesson / f"{lesson}.ipynb").read_text(), \
        f"{committed} is stale: run `python -m grader build {lesson}`"


@pytest.mark.parametrize("lesson", LESSONS)
def test_student_notebook_holds_no_solution_and_no_hidden_test(lesson):
    text = (paths.MODULES / lesson / f"{lesson}.ipynb").read_text()
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "grader.hidden", "# solution:"):
        assert marker not in text, f"{lesson}: student notebook contains {marker!r}"
    # Each solution body from solutions/ must be absent (only signatures and docstrings stay).
    source = build.source_notebook(lesson)
    for cell in source.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            for chunk in cell.source.split(build.BEGIN)[1:]:
                body = chunk.split(build.END)[0]
                lines = [l.strip() for l in body.split("\n") if l.strip() and not l.strip().startswith("#")]
                leaked = [l for l in lines if len(l) > 12 and l in text]
                assert not leaked, f"{lesson}: solution lines leaked into the student notebook: {leaked[:3]}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_exercise_has_a_graded_test_with_points(lesson):
    nb = build.source_notebook(lesson)
    meta = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    ids = [m.get("grade_id") for m in meta if m]
    assert len(ids) == len(set(ids)), f"{lesson}: duplicate grade ids"
    exercises = [m["grade_id"] for m in meta if m.get("solution")]
    tests = {m["grade_id"]: m.get("points", 0) for m in meta if m.get("grade")}
    assert exercises, lesson
    for exercise in exercises:
        assert tests.get(f"test_{exercise}", 0) > 0, f"{lesson}: exercise {exercise} has no test cell with points"
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert first_code.source.lstrip().startswith("import course"), \
        f"{lesson}: the first code cell must `import course` before triton"
