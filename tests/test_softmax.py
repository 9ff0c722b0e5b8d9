"""Module 01 reference solutions pass every visible check and every hidden test."""
import pytest
import torch

from grader import answer_key
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
    hidden = answer_key.hidden("01_softmax")
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


def test_guarded_gaps_catch_a_kernel_that_ignores_a_row_stride():
    """Inputs and outputs with gaps between their rows (course.testing.Guarded): a store that
    uses the input's stride for the output lands in the output's gaps, a load that uses
    n_cols reads the input's NaN gaps."""
    from course import testing
    x = testing.randn(4, 30, seed=0)
    src = testing.guarded_input(x, gaps=(0, 5))
    assert src.stride() == (35, 1) and torch.isnan(src.as_strided((4, 35), (35, 1))[:, 30:]).all()
    with testing.guarded_output((4, 30), torch.float32, "cpu", gaps=(0, 8)) as out:
        ref.softmax_kernel[(4,)](out, src, src.stride(0), out.stride(0), 30, BLOCK_SIZE=32)
    torch.testing.assert_close(out, torch.softmax(x, -1))
    with pytest.raises(testing.CheckFailed, match="between its rows"):
        with testing.guarded_output((4, 30), torch.float32, "cpu", gaps=(0, 8)) as out:
            ref.softmax_kernel[(4,)](out, src, src.stride(0), src.stride(0), 30, BLOCK_SIZE=32)
    with testing.guarded_output((4, 30), torch.float32, "cpu") as out:
        ref.softmax_kernel[(4,)](out, src, 30, out.stride(0), 30, BLOCK_SIZE=32)
    with pytest.raises(testing.CheckFailed, match="stride arguments"):
        testing.explain_nan_from_guards(out, gaps=True)


def test_catalog_has_the_new_classic_bugs():
    bugs = lesson_file("01_softmax", "bugs").BUGS
    for needed in ("global_max", "online_max_starts_at_zero", "kernel_int32_offsets",
                   "kernel_ignores_input_stride", "kernel_ignores_output_stride", "kernel_half_sum",
                   "kernel_no_max_subtraction", "wrapper_caps_block", "wrapper_assumes_contiguous",
                   "wrapper_skips_contiguous", "wrapper_computes_with_torch"):
        assert needed in bugs
