"""Module 00 (the foundations quiz): the reference answers are right, and grading is exact.

The notebooks are run in this process, cell by cell, the way nbgrader runs them (a cell
that raises does not stop the next): fast enough to try every classic wrong answer and
prove that it loses exactly its own question, no other. tests/test_grading.py runs the
same lesson through nbgrader itself.
"""
import contextlib
import io
import math
import re

import matplotlib

matplotlib.use("Agg")  # before pyplot: the lesson's plot cells must not open windows

import matplotlib.pyplot as plt
import pytest
import torch

from course.checks import foundations as checks
from course.testing import CheckFailed
from grader.build import source_notebook
from solutions import foundations as ref
from tests import submissions as subs
from tests.bugs.foundations import BUGS

LESSON = "00_foundations"


def test_reference_answers_are_right():
    assert ref.q01_l2_norm == pytest.approx(math.sqrt(3 ** 2 + 4 ** 2)) == pytest.approx(5.0)
    assert ref.q02_dot == pytest.approx(sum(p * q for p, q in zip([1, 2, 3], [4, 5, 6]))) == 32
    a, b = ref.a.tolist(), ref.b.tolist()
    by_hand = [[sum(a[i][k] * b[k][j] for k in range(2)) for j in range(2)] for i in range(2)]
    assert ref.q03_matmul.tolist() == by_hand == [[19, 22], [43, 50]]

    e = torch.exp(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    torch.testing.assert_close(ref.q04_softmax_123.double(), e / e.sum())
    ex = torch.exp(ref.x.double())
    torch.testing.assert_close(ref.q04_softmax_dim0.double(), ex / ex.sum(0, keepdim=True))
    torch.testing.assert_close(ref.q04_softmax_dim1.double(), ex / ex.sum(1, keepdim=True))
    assert ref.q04_softmax_dim0.sum(0).allclose(torch.ones(3))  # columns sum to 1
    assert ref.q04_softmax_dim1.sum(1).allclose(torch.ones(2))  # rows sum to 1
    assert ref.q04_attention_dim == 1

    mask = [[0.0 if j <= i else -math.inf for j in range(4)] for i in range(4)]
    assert ref.q08_causal_mask.tolist() == mask
    weights = [[1 / (i + 1) if j <= i else 0.0 for j in range(4)] for i in range(4)]
    torch.testing.assert_close(ref.q08_causal_weights, torch.tensor(weights))

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 6, 5, generator=g)
    blocked = torch.rand(3, 6, 5, generator=g) < 0.5
    blocked[..., 2] = False  # one open entry per row
    out = ref.q09_masked_softmax(scores, blocked.long())
    expected = torch.where(blocked, 0.0, scores.exp())
    torch.testing.assert_close(out, expected / expected.sum(-1, keepdim=True))
    assert (out[blocked] == 0).all()

    n, fp16_bytes, trips = 1024, 2, 4  # write S, read S, write P, read P
    assert ref.q10_fusion_bytes_saved == n * n * fp16_bytes * trips


def _choice_cells(nb):
    """(variable, preceding markdown) of every multiple-choice question, in notebook order."""
    found, markdown = [], ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            markdown = cell.source
        match = re.match(r'checks\.check_choice\((\w+), name="\1"\)', cell.source)
        if cell.cell_type == "code" and match:
            found.append((match.group(1), markdown))
    return found


def test_four_choices_are_b_b_b_c_with_options_a_to_d():
    choices = _choice_cells(source_notebook(LESSON))
    assert [getattr(ref, name) for name, _ in choices] == ["b", "b", "b", "c"]
    for name, markdown in choices:
        options = re.findall(r"^- \*\*([a-d])\*\*: ", markdown, flags=re.M)
        assert options == ["a", "b", "c", "d"], (name, options)


def test_points_match_the_question_headers():
    nb = source_notebook(LESSON)
    header_points, total = None, 0
    for cell in nb.cells:
        match = re.search(r"### Q\d+ \((\d+) points?\)", cell.source)
        if cell.cell_type == "markdown" and match:
            header_points = int(match.group(1))
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            assert meta["points"] == header_points, meta["grade_id"]
            total += meta["points"]
            header_points = None  # one test cell per question
    assert total == 14


def run_notebook(nb):
    """Run the code cells in order; {test cell grade_id: None if it passed, else its message}."""
    namespace, results = {}, {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(cell.source, meta.get("grade_id", "cell"), "exec"), namespace)
            error = None
        except Exception as exc:  # a failing cell is recorded, the next one still runs
            error = f"{type(exc).__name__}: {exc}"
        if meta.get("grade"):
            results[meta["grade_id"]] = error
    plt.close("all")
    return results


def test_reference_passes_every_test_cell():
    results = run_notebook(source_notebook(LESSON))
    assert len(results) == 11
    assert all(error is None for error in results.values()), results


def _with_hidden_tests(nb):
    """Test cells as nbgrader runs them at autograde: hidden tests put back."""
    source = source_notebook(LESSON)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.source = subs.cell(source, cell.metadata.nbgrader.grade_id).source
    return nb


def test_untouched_release_fails_every_test_cell():
    results = run_notebook(_with_hidden_tests(subs.release(LESSON)))
    assert len(results) == 11
    # Unanswered: the variable is undefined, or the function raises NotImplementedError.
    assert all(error and error.split(":")[0] in ("NameError", "NotImplementedError")
               for error in results.values()), results


@pytest.mark.parametrize("name", sorted(BUGS))
def test_each_classic_bug_loses_exactly_its_question(name):
    bug = BUGS[name]
    results = run_notebook(_with_hidden_tests(subs.with_bug(LESSON, bug)))
    failed = {test: error for test, error in results.items() if error}
    assert set(failed) == {bug.test_cell}, failed
    message = failed[bug.test_cell]
    assert message.startswith("CheckFailed"), message
    assert bug.says.lower() in message.lower(), message


def test_visible_checks_accept_any_well_formed_answer():
    """They check the form only: a wrong answer of the right form passes them."""
    with contextlib.redirect_stdout(io.StringIO()):
        for letter in "abcdB ":
            if letter.strip():
                checks.check_choice(letter, "q")
        checks.check_q01_l2_norm(25)
        checks.check_q02_dot(torch.tensor(28.0))
        checks.check_q03_matmul(torch.zeros(2, 2))
        uniform = torch.full((2, 3), 0.5)
        checks.check_q04_softmax(torch.full((3,), 1 / 3), uniform, uniform, 0)
        checks.check_q08_causal(torch.full((4, 4), -math.inf).tril(-1),
                                torch.full((4, 4), 0.25))
        checks.check_q09_masked_softmax(lambda s, m: torch.softmax(s, dim=-1))
        checks.check_q10_fusion(1.0)


@pytest.mark.parametrize("call, says", [
    (lambda: checks.check_choice("e", "q05"), "one letter"),
    (lambda: checks.check_choice(2, "q05"), "string"),
    (lambda: checks.check_q01_l2_norm("5"), "quotes"),
    (lambda: checks.check_q02_dot(None), "number"),
    (lambda: checks.check_q03_matmul(torch.zeros(3, 3)), "shape"),
    (lambda: checks.check_q03_matmul(torch.zeros(2, 2, dtype=torch.long)), "floats"),
    (lambda: checks.check_q04_softmax(torch.ones(3), torch.ones(2, 3), torch.ones(2, 3), 1),
     "sum to 1"),
    (lambda: checks.check_q04_softmax(torch.ones(3) / 3, torch.ones(2, 3), torch.ones(2, 3), 2),
     "dims 0 and 1"),
    (lambda: checks.check_q08_causal(torch.ones(4, 4).triu(1), torch.eye(4)), "-inf"),
    (lambda: checks.check_q08_causal(torch.full((4, 4), -math.inf).triu(0), torch.eye(4)),
     "row 0"),
    (lambda: checks.check_q09_masked_softmax(
        lambda s, m: torch.softmax(s.masked_fill(m, float("-inf")), -1)), "boolean"),
    (lambda: checks.check_q09_masked_softmax(lambda s, m: None), "return"),
    (lambda: checks.check_q10_fusion(-8), "positive"),
])
def test_visible_checks_explain_a_malformed_answer(call, says):
    with pytest.raises(CheckFailed, match=re.escape(says)):
        call()
