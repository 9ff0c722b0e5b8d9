"""The quiz says right or wrong at once, shows each explanation only to the right answer,
and keeps answers and explanations out of the learner's files (course/quiz.py)."""
import json

import pytest
import torch

from course import quiz
from course.checks import foundations as checks
from course.testing import CheckFailed
from grader import build, paths
from solutions import foundations as key

SEALED = json.loads(quiz.SEALED.read_text())


def test_sealed_explanations_equal_a_fresh_build():
    assert SEALED == build.explanations(), "course/explanations.json is stale: run `python -m grader build`"


def test_every_explanation_of_00_is_sealed_and_out_of_the_notebook():
    lesson = "00_foundations"
    whys = [cell.source for _, cell in build._explanation_cells(build._lesson_cells(lesson))]
    assert len(whys) == 11  # one per question
    notebook = (paths.MODULES / lesson / f"{lesson}.ipynb").read_text()
    files = notebook + quiz.SEALED.read_text()
    for why in whys:
        assert why.splitlines()[0] not in files and why.splitlines()[1] not in files


def test_right_answer_shows_its_explanation(capsys):
    checks.check_choice(key.q06_subtract_max.upper() + " ", name="q06_subtract_max")
    out = capsys.readouterr().out
    assert "right" in out and "the factor" in out and "cancels" in out


@pytest.mark.parametrize("wrong", [c for c in "abcd" if c != key.q06_subtract_max])
def test_wrong_answer_fails_without_the_explanation(wrong, capsys):
    with pytest.raises(CheckFailed, match="not right yet") as error:
        checks.check_choice(wrong, name="q06_subtract_max")
    assert "cancels" not in str(error.value) + capsys.readouterr().out


def test_wrong_numbers_fail_and_list_what_was_tried():
    for value in (25.0, 7):
        with pytest.raises(CheckFailed, match="not right yet") as error:
            checks.check_q01_l2_norm(value)
    assert "25, 7" in str(error.value)


@pytest.mark.parametrize("nudge", [1 + 1e-5, 1 - 1e-5])
def test_answers_the_hidden_tests_accept_are_right_for_the_check_too(nudge, capsys):
    """Float32 or float64, a tiny rounding difference, -1 or 1 for the last dim: still right."""
    checks.check_q01_l2_norm(torch.tensor(key.q01_l2_norm * nudge, dtype=torch.float32))
    checks.check_q02_dot(int(key.q02_dot))
    checks.check_q03_matmul(key.q03_matmul.double() * nudge)
    checks.check_q04_softmax(key.q04_softmax_123 * nudge, key.q04_softmax_dim0.double(),
                             key.q04_softmax_dim1, -1)
    checks.check_q08_causal(key.q08_causal_mask, key.q08_causal_weights.double() * nudge)
    checks.check_q09_masked_softmax(lambda s, m: torch.softmax(s.double().masked_fill(m.bool(), -torch.inf), -1))
    checks.check_q10_fusion(float(key.q10_fusion_bytes_saved))
    assert capsys.readouterr().out.count(": right.") == 7


def test_the_progress_table_counts_a_right_answer_without_explaining_it_again(monkeypatch, capsys):
    from course.overview import progress
    shown = []
    monkeypatch.setattr(quiz, "_show", shown.append)
    progress([("q06_subtract_max", 1, lambda: checks.check_choice("b", name="q06_subtract_max")),
              ("q07_tiling", 1, lambda: checks.check_choice("a", name="q07_tiling")),
              ("q11_low_precision", 1, lambda: undefined_name)])  # noqa: F821 (a cell not run)
    table = capsys.readouterr().out
    assert "1 of 3 points pass" in table and "not right yet" in table and "not written yet" in table
    assert shown == []
