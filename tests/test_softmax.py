"""Module 01 reference solutions pass every visible check and every hidden test."""
import pytest
import torch

from grader.paths import lesson_file
from solutions import softmax as ref
from course.checks import softmax as checks


def test_reference_passes_visible_checks():
    checks.check_softmax_naive(ref.softmax_naive)
    checks.check_softmax_stable(ref.softmax_stable)
    checks.check_online_softmax(ref.online_softmax)
    checks.check_softmax_kernel(ref.softmax_kernel)
    checks.check_softmax(ref.softmax, ref.softmax_kernel)


def test_reference_passes_hidden_tests():
    hidden = lesson_file("01_softmax", "hidden")
    hidden.test_softmax_naive(ref.softmax_naive)
    hidden.test_softmax_stable(ref.softmax_stable)
    hidden.test_online_softmax(ref.online_softmax)
    hidden.test_rescale_bug(ref.rescale_bug_answer)
    hidden.test_softmax_kernel(ref.softmax_kernel)
    hidden.test_softmax(ref.softmax, ref.softmax_kernel)


def test_naive_overflows_where_stable_does_not():
    big = torch.tensor([1000.0, 1001.0, 1002.0])
    assert torch.isnan(ref.softmax_naive(big)).all()
    assert torch.allclose(ref.softmax_stable(big), torch.softmax(big, -1))


def test_online_softmax_records_running_statistics():
    history = []
    x = torch.tensor([0.0, 1.0, 5.0, 2.0, 9.0])
    ref.online_softmax(x, 2, history=history)
    assert [m for m, _ in history] == [1.0, 5.0, 9.0]
    assert history[-1][1] == pytest.approx(float(torch.exp(x - 9.0).sum()), rel=1e-6)


def test_softmax_rejects_bad_input():
    with pytest.raises(ValueError, match="2-D"):
        ref.softmax(torch.ones(3))
    with pytest.raises(TypeError, match="float16"):
        ref.softmax(torch.ones(2, 3, dtype=torch.int32))
