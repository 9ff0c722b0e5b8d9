"""Module 00 (the foundations quiz): the reference answers are right, and the visible
checks judge only the form of an answer. tests/test_bugs.py proves that each classic
wrong answer loses exactly its own question; tests/test_grading.py runs the lesson
through nbgrader itself.
"""
import contextlib
import io
import math
import re

import pytest
import torch

from course import quiz
from course.checks import foundations as checks
from course.testing import CheckFailed
from grader.build import source_notebook
from solutions import foundations as ref

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
    far = torch.tensor([[-2e30, -1e30, -1.5e30], [1e30, 3e30, 2e30]])  # scores far from zero
    out = ref.q09_masked_softmax(far.t().contiguous().t(), torch.tensor([[0, 1, 0], [1, 0, 1]]))
    assert out.tolist() == [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]

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


WELL_FORMED_WRONG = [
    lambda: checks.check_choice("a", "q05_sram_vs_dram"),
    lambda: checks.check_q01_l2_norm(25),
    lambda: checks.check_q02_dot(torch.tensor(28.0)),
    lambda: checks.check_q03_matmul(torch.zeros(2, 2)),
    lambda: checks.check_q04_softmax(torch.full((3,), 1 / 3), torch.full((2, 3), 0.5),
                                     torch.full((2, 3), 0.5), 0),
    lambda: checks.check_q08_causal(torch.full((4, 4), -math.inf).tril(-1), torch.full((4, 4), 0.25)),
    lambda: checks.check_q09_masked_softmax(lambda s, m: torch.softmax(s, dim=-1)),
    lambda: checks.check_q10_fusion(1.0),
]


def test_form_checks_accept_any_well_formed_answer(monkeypatch):
    """Without sealed answers the checks look at the form only."""
    monkeypatch.setattr(quiz, "SEALED", quiz.SEALED.with_name("no-such-file.json"))
    with contextlib.redirect_stdout(io.StringIO()):
        for letter in "abcdB ":
            if letter.strip():
                checks.check_choice(letter, "q")
        for call in WELL_FORMED_WRONG:
            call()


@pytest.mark.parametrize("call", WELL_FORMED_WRONG)
def test_well_formed_wrong_answers_are_not_right_yet(call):
    with pytest.raises(CheckFailed, match="not right yet"):
        call()


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
    (lambda: checks.check_q09_masked_softmax(  # exp of the raw scores: inf / inf on large rows
        lambda s, m: (lambda e: e / e.sum(-1, keepdim=True))(s.masked_fill(m.bool(), -math.inf).exp())),
     "NaN"),
    (lambda: checks.check_q10_fusion(-8), "positive"),
])
def test_visible_checks_explain_a_malformed_answer(call, says):
    with pytest.raises(CheckFailed, match=re.escape(says)):
        call()
