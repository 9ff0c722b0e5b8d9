"""What module 06's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`)."""
import triton

from course.checks.attention_variants import (ATTENTION_CASES, ATTENTION_GPU_CASES, GPU_BLOCKS,
                                              KERNEL_GPU_CASES)
from solutions.attention_variants import block_counts, kv_block_range  # noqa: F401 (asked by name)

CHECKS = ("check_kv_block_range", "check_block_counts", "check_attention_kernel", "check_attention")


def _shape(case, default_blocks):
    """(n_q, n_k, block_q, block_k, causal) of a check's case."""
    (_, _, _, n_q, n_k, _, _), options = case
    return (n_q, n_k, *options.get("blocks", default_blocks), options.get("causal", False))


# The GPU's cases, and the wrapper's on a GPU's default blocks: the table is recorded on a CPU.
_GPU_KERNEL = [_shape(case, None) for case in KERNEL_GPU_CASES]  # each names its blocks
_GPU_WRAPPER = [_shape(case, GPU_BLOCKS) for case in ATTENTION_CASES + ATTENTION_GPU_CASES]
EXTRA = ([("kv_block_ranges", shape) for shape in _GPU_KERNEL + _GPU_WRAPPER]
         + [("expected_steps", shape) for shape in _GPU_KERNEL])


def kv_block_ranges(n_q, n_k, block_q, block_k, causal):
    """[(full_end, masked_end)] of every query block."""
    return [kv_block_range(i, n_q, n_k, block_q, block_k, causal)
            for i in range(triton.cdiv(n_q, block_q))]


def expected_steps(n_q, n_k, block_q, block_k, causal):
    """[(unmasked, masked)] key blocks each query block's two loops run."""
    return [(full // block_k, triton.cdiv(max(masked - full, 0), block_k))
            for full, masked in kv_block_ranges(n_q, n_k, block_q, block_k, causal)]


# ---------------------------------------------------------------------------------------
# kv_block_range's classic mistakes

def _visible_counts(rows, n_k, causal, shift):
    """How many keys each of the first `rows` query rows sees: all n_k, or (causal) keys
    j <= i + shift, kept between 0 and n_k."""
    if not causal:
        return [n_k] * rows
    return [min(max(i + shift + 1, 0), n_k) for i in range(rows)]


def _ranges(n_q, n_k, block_q, block_k, causal, *, shift=None, full_by_last=False,
            round_full=True, round_masked=False, strict=False):
    """[(full_end, masked_end)] of every query block, from what its rows see (the padding
    rows of a ragged last block included: bottom-right, they see no more than its last real
    row): whole blocks up to the least any row sees run unmasked, keys up to the most any
    row sees run masked. With no switch, kv_block_ranges (a test says so); the switches
    compute classic mistakes."""
    shift = n_k - n_q if shift is None else shift
    padded = triton.cdiv(n_q, block_q) * block_q
    counts = _visible_counts(padded, n_k, causal, shift - 1 if strict else shift)
    result = []
    for start in range(0, n_q, block_q):
        rows = counts[start:start + block_q]
        least, most = (max(rows), max(rows)) if full_by_last else (min(rows), max(rows))
        full = (least // block_k) * block_k if round_full else least
        masked = triton.cdiv(most, block_k) * block_k if round_masked else most
        result.append((full, masked))
    return result


def kv_block_range_mistakes(n_q, n_k, block_q, block_k, causal):
    """{mistake: [(full_end, masked_end)] of every query block} of the classic mistakes
    these inputs can show, keyed as the check's _RANGE_MISTAKES describes them."""
    found = {}
    args = (n_q, n_k, block_q, block_k, causal)
    if causal:
        if n_q != n_k:
            found["top_left"] = _ranges(*args, shift=0)
        found["diagonal_left_out"] = _ranges(*args, strict=True)
        found["row_before_block"] = [(full, min(max(start + n_k - n_q, 0), n_k))
                                     for (full, _), start in zip(_ranges(*args), range(0, n_q, block_q))]
        found["full_from_last_row"] = _ranges(*args, full_by_last=True)
        found["not_clamped"] = [(((start + n_k - n_q + 1) // block_k) * block_k, start + block_q + n_k - n_q)
                                for start in range(0, n_q, block_q)]
    else:
        found["not_causal_rounded"] = \
            [((n_k // block_k) * block_k, (n_k // block_k) * block_k)] * triton.cdiv(n_q, block_q)
    found["full_not_whole_blocks"] = _ranges(*args, round_full=False)
    found["masked_rounded_up"] = _ranges(*args, round_masked=True)
    found["ragged_block_unmasked"] = [(masked, masked) for _, masked in _ranges(*args)]
    return found
