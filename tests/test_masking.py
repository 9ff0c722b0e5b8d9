"""Module 02 (masking): the reference solutions agree with PyTorch (through Triton's
interpreter on a CPU, compiled on a GPU), the visible checks and hidden tests accept them,
and the catalog holds the classic bugs (tests/test_bugs.py runs each of them).
"""
import contextlib
import io

import pytest
import torch
import torch.nn.functional as F

import course
from course.checks import masking as checks
from course.testing import CheckFailed
from grader import answer_key
from grader.paths import lesson_file
from solutions import masking as ref

DEVICE = course.DEVICE
NEG_INF = float("-inf")


def _blocked(M, N, causal, lengths=None):
    """[B or 1, M, N] bool, True where blocked, written from the definitions."""
    blocked = torch.zeros(1, M, N, dtype=torch.bool)
    if causal:
        blocked = blocked | torch.ones(M, N, dtype=torch.bool).triu(1)
    if lengths is not None:
        blocked = blocked | (torch.arange(N) >= torch.tensor(lengths)[:, None, None])
    return blocked.to(DEVICE)


def _sdpa_with_scores_fn(weights_fn, q, k, v):
    """weights_fn(scores) @ v, with the scores SDPA would compute (scale 1/sqrt(D))."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return weights_fn(scores) @ v


@pytest.mark.parametrize("n", [1, 5, 33])
def test_causal_masks_match_sdpa_is_causal(n):
    q, k, v = (torch.randn(2, 3, n, 16, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    additive = _sdpa_with_scores_fn(lambda s: torch.softmax(s + ref.causal_mask(n, torch.float64), -1), q, k, v)
    boolean = _sdpa_with_scores_fn(lambda s: torch.softmax(ref.apply_mask(s, ref.causal_mask_bool(n)), -1), q, k, v)
    torch.testing.assert_close(additive, expected)
    torch.testing.assert_close(boolean, expected)
    assert ref.causal_mask_bool(n).dtype == torch.bool
    assert ref.causal_mask(n, torch.float16).dtype == torch.float16


def test_apply_mask_matches_sdpa_attn_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    blocked = torch.rand(2, 1, 6, 6, generator=g) < 0.4
    blocked[..., 0] = False  # SDPA gives NaN on fully masked rows
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=~blocked)  # SDPA: True = attend
    for mask in (blocked, blocked.float(), blocked.to(torch.uint8)):
        out = _sdpa_with_scores_fn(lambda s: torch.softmax(ref.apply_mask(s, mask), -1), q, k, v)
        torch.testing.assert_close(out, expected)


def test_padding_and_causal_match_sdpa():
    lengths, n = [5, 3, 1], 5
    pad = ref.padding_mask(lengths, n)
    assert pad.shape == (3, 1, n) and pad.dtype == torch.bool
    both = pad | ref.causal_mask_bool(n)
    assert torch.equal(both, _blocked(n, n, True, lengths).cpu())
    q, k, v = (torch.randn(3, 2, n, 8, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=~both[:, None])
    out = _sdpa_with_scores_fn(lambda s: torch.softmax(ref.apply_mask(s, both[:, None]), -1), q, k, v)
    torch.testing.assert_close(out, expected)


def test_safe_softmax_zeros_fully_masked_rows_and_keeps_gradients_finite():
    scores = torch.randn(4, 7, dtype=torch.float64).masked_fill(_blocked(4, 7, True, [7, 0, 3, 5])[:, 0].cpu(), NEG_INF)
    scores.requires_grad_(True)
    out = ref.safe_softmax(scores)
    full = torch.softmax(scores.detach(), -1)
    torch.testing.assert_close(out[[0, 2, 3]], full[[0, 2, 3]])
    assert torch.equal(out[1], torch.zeros(7, dtype=torch.float64))
    (out * torch.randn_like(out)).sum().backward()
    assert torch.isfinite(scores.grad).all()


DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
WRAPPER_CASES = [  # (shape, causal, lengths)
    ((2, 7, 37), True, [37, 0]),
    ((3, 5, 300), False, [300, 17, 1]),
    ((2, 12, 9), True, None),
    ((2, 9, 40), True, [40, 3]),
    ((6, 61), False, None),
    ((5, 20), True, [7]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, causal, lengths", WRAPPER_CASES)
def test_masked_softmax_matches_pytorch(shape, causal, lengths, dtype):
    x = torch.randn(*shape, device=DEVICE).to(dtype) * 4
    x3 = x if x.dim() == 3 else x[None]
    expected = torch.softmax(x3.double().masked_fill(_blocked(*x3.shape[1:], causal, lengths), NEG_INF), -1)
    out = ref.masked_softmax(x, causal=causal, lengths=lengths)
    assert out.shape == x.shape and out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    # torch gives NaN on fully masked rows; the kernel must give 0 there.
    torch.testing.assert_close(out.double(), expected.nan_to_num(0.0).reshape(shape), atol=tol, rtol=tol)


@pytest.mark.parametrize("M, N", [(5, 11), (11, 5)])
def test_non_square_causal_is_top_left_like_sdpa(M, N):
    q = torch.randn(2, M, 16, device=DEVICE)
    k, v = torch.randn(2, N, 16, device=DEVICE), torch.randn(2, N, 16, device=DEVICE)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = _sdpa_with_scores_fn(lambda s: ref.masked_softmax(s, causal=True), q, k, v)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_masked_softmax_reads_a_transposed_view():
    x = torch.randn(2, 50, 8, device=DEVICE).transpose(1, 2)
    expected = torch.softmax(x.masked_fill(_blocked(8, 50, True, [50, 20]), NEG_INF), -1)
    torch.testing.assert_close(ref.masked_softmax(x, causal=True, lengths=[50, 20]), expected)


CALLS = {  # exercise: arguments of its check and hidden test
    "causal_mask_bool": (ref.causal_mask_bool,), "causal_mask": (ref.causal_mask,),
    "apply_mask": (ref.apply_mask,), "padding_mask": (ref.padding_mask,),
    "safe_softmax": (ref.safe_softmax,), "masked_softmax_kernel": (ref.masked_softmax_kernel,),
    "masked_softmax": (ref.masked_softmax, ref.masked_softmax_kernel),
}


@pytest.mark.parametrize("exercise", sorted(CALLS))
def test_visible_checks_and_hidden_tests_pass_the_reference(exercise):
    with contextlib.redirect_stdout(io.StringIO()):
        getattr(checks, f"check_{exercise}")(*CALLS[exercise])
        getattr(answer_key.hidden("02_masking"), f"test_{exercise}")(*CALLS[exercise])


SAFE_SOFTMAX_MISTAKES = {  # what the check says: safe_softmax gone that way
    "NaN on fully masked rows": lambda scores, dim: torch.softmax(scores, dim=dim),
    "equal weights 1/N": lambda scores, dim: torch.softmax(
        scores.masked_fill(torch.isneginf(scores).all(dim, keepdim=True), 0.0), dim=dim),
}


@pytest.mark.parametrize("says", SAFE_SOFTMAX_MISTAKES)
def test_safe_softmax_check_names_each_recorded_mistake(says):
    """A classic mistake fails the visible check, which reads the recorded signatures,
    naming it, and fails the hidden test, which computes them."""
    def wrong(scores, dim=-1):
        return SAFE_SOFTMAX_MISTAKES[says](scores, dim)
    with pytest.raises(CheckFailed, match=says):
        checks.check_safe_softmax(wrong)
    with pytest.raises(CheckFailed):
        answer_key.hidden("02_masking").test_safe_softmax(wrong)


def _stand_in(weights):
    """A masked_softmax_kernel that writes weights(x [B, M, N] float64, causal, lengths) in
    PyTorch."""
    class Kernel:
        def __getitem__(self, grid):
            def launch(out, x, lengths, *strides_and_n, CAUSAL, HAS_LENGTHS, BLOCK_SIZE):
                lens = lengths.tolist() if HAS_LENGTHS else None
                out.copy_(weights(x.double(), CAUSAL, lens).to(out.dtype))
            return launch
    return Kernel()


def _keys(x, causal, lengths, **mistake):
    return checks.visible_keys(*x.shape[1:], causal=causal, lengths=lengths, device=x.device, **mistake)


KERNEL_MISTAKES = {  # what the check says: the kernel's weights gone that way
    "the diagonal is masked": lambda x, causal, lengths: checks.masked_reference(
        x, _keys(x, causal, lengths, strict=True)),
    "padding applied to the queries": lambda x, causal, lengths: checks.masked_reference(
        x, _keys(x, causal, lengths, pad_queries=True)),
    "NaN on fully masked rows": lambda x, causal, lengths: torch.softmax(
        x.masked_fill(~_keys(x, causal, lengths), NEG_INF), -1),
}


@pytest.mark.parametrize("says", KERNEL_MISTAKES)
def test_kernel_check_names_each_recorded_mistake(says):
    kernel = _stand_in(KERNEL_MISTAKES[says])
    with pytest.raises(CheckFailed, match=says):
        checks.check_masked_softmax_kernel(kernel)
    with pytest.raises(CheckFailed):
        answer_key.hidden("02_masking").test_masked_softmax_kernel(kernel)


def test_catalog_has_the_classic_bugs():
    bugs = lesson_file("02_masking", "bugs").BUGS
    for needed in ("mask_polarity_inverted", "causal_off_by_one", "nan_on_fully_masked_rows",
                   "missing_load_mask", "load_other_zero", "padding_on_queries", "nan_to_num_fix_up",
                   "kernel_ignores_input_strides", "kernel_ignores_batch_stride",
                   "kernel_ignores_output_strides", "kernel_half_sum", "wrapper_caps_block",
                   "wrapper_assumes_contiguous", "wrapper_masks_with_torch"):
        assert needed in bugs


def test_kernel_honours_strides_that_differ_between_input_and_output():
    """The reference kernel on slices of wider rows and taller batch entries (the layout the
    checks use), against PyTorch."""
    x = torch.randn(2, 5, 50, device=DEVICE)
    wide_in = torch.full((2, 7, 55), float("nan"), device=DEVICE)
    wide_out = torch.full((2, 6, 58), 7.0, device=DEVICE)
    wide_in[:, :5, :50] = x
    src, out = wide_in[:, :5, :50], wide_out[:, :5, :50]
    lengths = torch.tensor([50, 9], dtype=torch.int32, device=DEVICE)
    ref.masked_softmax_kernel[(5, 2)](out, src, lengths, src.stride(0), src.stride(1), out.stride(0),
                                      out.stride(1), 50, CAUSAL=True, HAS_LENGTHS=True, BLOCK_SIZE=64)
    expected = torch.softmax(x.masked_fill(_blocked(5, 50, True, [50, 9]), NEG_INF), -1)
    torch.testing.assert_close(out, expected)
    untouched = torch.ones_like(wide_out, dtype=torch.bool)
    untouched[:, :5, :50] = False
    assert (wide_out[untouched] == 7.0).all()


def test_safe_softmax_rule_refuses_a_nan_fix_up():
    from course import rules
    fixed_up = rules.Cell("safe_softmax", "def safe_softmax(scores, dim=-1):\n"
                                          "    return torch.softmax(scores, dim=dim).nan_to_num(0.0)\n")
    assert rules.problems(checks.RULES["test_safe_softmax"], [fixed_up])
    import inspect
    clean = rules.Cell("safe_softmax", inspect.getsource(ref.safe_softmax))
    assert not rules.problems(checks.RULES["test_safe_softmax"], [clean])
