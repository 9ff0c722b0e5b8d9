"""Module 06 (causal and multi-head variants): the pieces its checks are built from, what
the checks catch, and the reference passing every visible check and hidden test.

On a CPU the kernels run through Triton's interpreter at small sizes; on a GPU the same
tests run compiled (course.testing picks the tolerances).
"""
import math

import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch
import torch.nn.functional as F
import triton
from torch.nn.attention.bias import causal_lower_right

from course import DEVICE, INTERPRET, recorded
from course.checks import attention_variants as checks
from course.testing import CheckFailed, assert_close, count_launches, randn
from grader import answer_key, paths
from solutions import attention_variants as av
from tests.test_flash_forward import assert_named_as_before

answers = paths.lesson_file("06_attention_variants", "answers")

F32, F16 = torch.float32, torch.float16
SHAPES = [(n_q, n_k, bq, bk, causal) for n_q, n_k in [(1, 1), (1, 70), (70, 1), (64, 64), (97, 97),
                                                        (40, 100), (100, 40), (50, 7), (129, 250)]
          for bq, bk in [(16, 16), (32, 16), (16, 32), (128, 64)] for causal in (False, True)]


@pytest.fixture
def keyed():
    """The answer key computes what a check asks: these inputs are none of the visible checks'."""
    with recorded.computing(answer_key.resolve):
        yield


# ---------------------------------------------------------------------------------------
# The checks' own reference and block ranges, against PyTorch and the answer key

@pytest.mark.parametrize("n_q, n_k", [(37, 37), (8, 100), (1, 60)])
def test_reference_is_sdpa_with_bottom_right_mask_and_gqa(n_q, n_k):
    q = randn(2, 6, n_q, 24, dtype=torch.float64, seed=1)
    k, v = (randn(2, 2, n_k, 24, dtype=torch.float64, seed=s) for s in (2, 3))
    o, lse = checks.reference(q, k, v, causal=True, scale=0.3)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n_q, n_k),
                                              scale=0.3, enable_gqa=True)
    assert_close(o, expected, quiet=True)
    s = q @ k.repeat_interleave(3, 1).transpose(-1, -2) * 0.3
    s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1 + n_k - n_q), float("-inf"))
    assert_close(lse, torch.logsumexp(s, -1), quiet=True)


def test_reference_rows_that_see_no_key_are_zero_with_lse_minus_inf():
    q, k, v = (randn(1, 2, n, 16, dtype=torch.float64, seed=n) for n in (9, 4, 4))
    o, lse = checks.reference(q, k, v, causal=True)
    assert (o[:, :, :5] == 0).all() and (o[:, :, 5:] != 0).all()
    assert (lse[:, :, :5] == float("-inf")).all() and torch.isfinite(lse[:, :, 5:]).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_two_formulations_of_the_block_ranges_agree(shape):
    """The classic mistakes' emulator, with no switch, is the answer key; the kernel's
    expected steps add up to block_counts."""
    n_q, n_k, bq, bk, causal = shape
    key = [av.kv_block_range(i, n_q, n_k, bq, bk, causal) for i in range(triton.cdiv(n_q, bq))]
    assert answers._ranges(*shape) == answers.kv_block_ranges(*shape) == key
    unmasked, masked = map(sum, zip(*answers.expected_steps(*shape)))
    assert av.block_counts(*shape)[:2] == (unmasked, masked)


def test_causal_runs_about_half_the_blocks_and_masks_few():
    unmasked, masked, skipped = av.block_counts(16384, 16384, 128, 64, True)
    assert (unmasked, masked, skipped) == (16256, 256, 16256)
    full = av.block_counts(16384, 16384, 128, 64, False)
    assert full == (32768, 0, 0)


def test_padded_layout_puts_nan_after_every_head_s_keys():
    x = randn(2, 3, 7, 16, seed=4)
    view = checks.in_layout(x, "padded")
    assert torch.equal(view, x) and checks._gapped(view)
    after = torch.as_strided(view, (2, 3, checks.KEY_GAP, 16), view.stride(), view.storage_offset() + 7 * 16)
    assert torch.isnan(after).all()


# ---------------------------------------------------------------------------------------
# The reference kernel and wrapper

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k", [(70, 45), (45, 70), (33, 7)])
def test_kernel_counts_the_blocks_kv_block_range_predicts(causal, n_q, n_k):
    q, k, v = checks.variant_inputs(2, 4, 2, n_q, n_k, 32, F32, seed=5)
    steps = torch.full((8, triton.cdiv(n_q, 16), 2), -1, dtype=torch.int32, device=DEVICE)
    o, lse = torch.empty_like(q), torch.empty(2, 4, n_q, device=DEVICE)
    av.attention_kernel[(triton.cdiv(n_q, 16), 8, 1)](
        q, k, v, o, lse, steps, *q.stride(), *k.stride(), *v.stride(), *o.stride(), 4, n_q, n_k,
        av.LOG2E / math.sqrt(32), GROUP=2, HEAD_DIM=32, BLOCK_D=32, BLOCK_Q=16, BLOCK_K=16,
        CAUSAL=causal, COUNT_STEPS=True, DOT_PRECISION="ieee")
    want = torch.tensor(answers.expected_steps(n_q, n_k, 16, 16, causal), dtype=torch.int32)
    assert torch.equal(steps.cpu(), want.expand(8, -1, -1))
    assert_close(o, checks.reference(q, k, v, causal)[0], quiet=True)


def test_wrapper_uses_one_launch_and_keeps_q_s_layout():
    q, k, v = checks.variant_inputs(1, 4, 1, 40, 33, 24, F16, seed=6, layouts=("bnhd",) * 3)
    with count_launches(av.attention_kernel) as launches:
        o, lse = av.attention(q, k, v, causal=True, block_q=16, block_k=32)
    assert launches[0] == 1 and o.dtype == F16 and lse.dtype == F32
    assert o.stride() == torch.empty_like(q).stride() and o.transpose(1, 2).is_contiguous()


def test_wrapper_rejects_blocks_that_are_not_powers_of_two():
    x = torch.ones(1, 2, 8, 16, device=DEVICE)
    for blocks in ({"block_q": 24}, {"block_k": 8}, {"block_q": -16}):
        with pytest.raises(ValueError, match="power of two"):
            av.attention(x, x, x, **blocks)


# ---------------------------------------------------------------------------------------
# What the checks catch, shown with stand-ins

def _fake_kernel(compute, steps=None):
    """Launched like attention_kernel; stores compute(q, k, v, scale, causal) -> (o, lse)
    and, with COUNT_STEPS, steps(n_q, n_k, block_q, block_k, causal) (default: right)."""
    class Kernel:
        __name__ = "fake_kernel"

        def __getitem__(self, grid):
            def launch(q, k, v, o, lse, counted, *args, CAUSAL, COUNT_STEPS, BLOCK_Q, BLOCK_K, **meta):
                out, l = compute(q, k, v, args[-1] / checks.LOG2E, CAUSAL)
                o.copy_(out.to(o.dtype))
                lse.copy_(l.float())
                if COUNT_STEPS:
                    ran = (steps or answers.expected_steps)(q.shape[2], k.shape[2], BLOCK_Q, BLOCK_K, CAUSAL)
                    counted.copy_(torch.tensor(ran, dtype=torch.int32).expand_as(counted))
            return launch
    return Kernel()


def _right(q, k, v, scale, causal):
    return checks.reference(q, k, v, causal, scale)


@pytest.mark.usefixtures("keyed")
def test_kernel_check_passes_a_right_stand_in():
    checks.case_kernel_random(_fake_kernel(_right), 2, 4, 2, 30, 40, 24, F32, seed=1, causal=True,
                              out_layout="bnhd", quiet=True)


@pytest.mark.usefixtures("keyed")
@pytest.mark.parametrize("mistake, heads, align_shift, match", [
    ("gqa modulo", lambda H, Hkv: [h % Hkv for h in range(H)], None, "h % Hkv"),
    ("top-left", None, 0, "top-left"),
])
def test_kernel_check_names_head_and_alignment_mistakes(mistake, heads, align_shift, match):
    def wrong(q, k, v, scale, causal):
        H, Hkv, n_q, n_k = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
        mask = checks.bottom_right(n_q, n_k, align_shift) if causal else None
        return checks.masked_attention(q, k, v, scale, mask, heads(H, Hkv) if heads else None)
    with pytest.raises(CheckFailed, match=match):
        checks.case_kernel_random(_fake_kernel(wrong), 1, 4, 2, 20, 45, 16, F32, seed=2, causal=True,
                                  blocks=(16, 16), quiet=True)


@pytest.mark.usefixtures("keyed")
def test_kernel_check_names_rows_that_came_out_nan():
    def nan_rows(q, k, v, scale, causal):
        o, lse = checks.reference(q, k, v, causal, scale)
        o[:, :, :q.shape[2] - k.shape[2]] = float("nan")
        return o, lse
    with pytest.raises(CheckFailed, match="see no key"):
        checks.case_kernel_random(_fake_kernel(nan_rows), 1, 2, 1, 40, 25, 16, F32, seed=3,
                                  causal=True, quiet=True)


@pytest.mark.usefixtures("keyed")
def test_kernel_check_names_a_read_past_the_keys():
    def past_end(q, k, v, scale, causal):  # what a kernel loading 32 keys of 7 would get
        o, lse = checks.reference(q, k, v, causal, scale)
        return o * float("nan"), lse
    with pytest.raises(CheckFailed, match="past the end"):
        checks.case_kernel_random(_fake_kernel(past_end), 1, 2, 2, 20, 7, 16, F16, seed=4,
                                  layouts=("contiguous", "padded", "padded"), quiet=True)


@pytest.mark.usefixtures("keyed")
@pytest.mark.parametrize("steps, match", [
    (lambda *a: [(0, u + m) for u, m in answers.expected_steps(*a)], "unmasked phase"),
    (lambda n_q, n_k, bq, bk, c: [(u, triton.cdiv(n_k, bk) - u)
                                  for u, _ in answers.expected_steps(n_q, n_k, bq, bk, c)], "skipped"),
])
def test_kernel_check_sees_blocks_masked_or_run_that_need_not_be(steps, match):
    with pytest.raises(CheckFailed, match=match):
        checks.case_kernel_random(_fake_kernel(_right, steps), 1, 2, 2, 64, 64, 16, F32, seed=5,
                                  causal=True, blocks=(16, 16), quiet=True)


@pytest.mark.usefixtures("keyed")
def test_range_check_names_the_top_left_alignment():
    def top_left(q_block, n_q, n_k, block_q, block_k, causal):
        return av.kv_block_range(q_block, n_k, n_k, block_q, block_k, causal)  # shift 0
    with pytest.raises(CheckFailed, match="top-left"):
        checks.case_kv_block_range(top_left, 40, 100, 16, 32, True)


def test_wrapper_check_refuses_an_output_not_in_q_s_layout():
    def copying(q, k, v, causal=False, sm_scale=None, **blocks):
        return av.attention(q.contiguous(), k, v, causal, sm_scale, **blocks)
    with pytest.raises(CheckFailed, match="q's layout"):
        checks.case_output_layout(copying, 1, 4, 2, 20, 30, 16, F32, seed=7)


@pytest.mark.parametrize("case", checks.ATTENTION_CASES)
def test_recorded_mistakes_are_named_as_their_whole_outputs_would_be(case):
    """Each classic mistake's O and LSE, compared as the wrapper check's case compares, is
    named from the recorded signatures (no answer computed) as the first mistake whose
    whole output it matches."""
    (B, H, Hkv, Nq, Nk, D, dtype), options = case
    q, k, v = checks.variant_inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=options["seed"],
                                    kind=options.get("kind", "random"),
                                    layouts=options.get("layouts", ("contiguous",) * 3))
    scale = 1.0 / math.sqrt(D) if options.get("sm_scale") is None else options["sm_scale"]
    blocks, causal = options.get("blocks", checks.ff.INTERPRETER_BLOCKS), options.get("causal", False)
    mistakes = checks._mistakes(q, k, v, blocks, scale, causal)
    o, lse = checks.reference(q, k, v, causal, scale)

    def compare(out, lse_out=lse.float()):
        checks._check_result(out, lse_out, q, k, v, name="o", causal=causal, scale=scale,
                             kind=options.get("kind", "random"), mistakes=mistakes, hint=None, quiet=True)
    outputs = answers.variant_outputs(q, k, v, *blocks, scale, causal, list(q.stride()))
    lse_outputs = answers.lse_outputs(q, k, scale, causal)
    named = [assert_named_as_before(compare, wrong.to(dtype), outputs, checks._variant_mistakes(q, k, v))
             for wrong in outputs.values()]
    named += [assert_named_as_before(lambda out: compare(o.to(dtype), out), wrong.float(), lse_outputs,
                                     checks._LSE_MISTAKES) for wrong in lse_outputs.values()]
    assert any(named)


# ---------------------------------------------------------------------------------------
# The reference passes every visible check and hidden test

CHECKED = {  # test cell -> (visible check, the reference objects it takes)
    "test_decode_align": ("check_choice", (av.decode_align_answer,)),
    "test_sdpa_causal": ("check_choice", (av.sdpa_causal_answer,)),
    "test_kv_block_range": ("check_kv_block_range", (av.kv_block_range,)),
    "test_block_counts": ("check_block_counts", (av.block_counts,)),
    "test_attention_kernel": ("check_attention_kernel", (av.attention_kernel,)),
    "test_attention": ("check_attention", (av.attention, av.attention_kernel)),
}


@pytest.mark.parametrize("test_cell", CHECKED)
def test_reference_passes_visible_checks_and_hidden_tests(test_cell):
    check, args = CHECKED[test_cell]
    extra = {"name": test_cell[5:] + "_answer"} if check == "check_choice" else {}
    getattr(checks, check)(*args, **extra)
    getattr(answer_key.hidden("06_attention_variants"), test_cell)(*args)


def test_wrong_answers_fail():
    hidden = answer_key.hidden("06_attention_variants")
    for test_cell, right in (("test_decode_align", av.decode_align_answer),
                             ("test_sdpa_causal", av.sdpa_causal_answer)):
        for wrong in set("abcd") - {right}:
            with pytest.raises(CheckFailed, match="not the right choice"):
                getattr(hidden, test_cell)(wrong)


def test_sdpa_is_causal_is_top_left():
    """The answer to the SDPA question, from PyTorch itself: one query sees key 0 only."""
    q, k, v = randn(1, 1, 1, 16, seed=8), randn(1, 1, 100, 16, seed=9), randn(1, 1, 100, 16, seed=10)
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, is_causal=True), v[:, :, :1])


@pytest.mark.skipif(not INTERPRET, reason="on a GPU the kernels compile when they run")
def test_kernel_compiles_for_gpu():
    checks.compile_kernel_for_gpu(av.attention_kernel)
