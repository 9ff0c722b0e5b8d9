"""What module 06's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`): the key block ranges, the blocks a kernel
runs, and the outputs of the classic mistakes (as signatures), by which a failing check
names the slip."""
import math

import torch
import triton

from course.checks.attention_variants import (ATTENTION_CASES, ATTENTION_GPU_CASES, GPU_BLOCKS,
                                              KERNEL_GPU_CASES, bottom_right, kv_heads,
                                              masked_attention, mistake_questions, reference,
                                              variant_inputs)
from grader import paths
from grader.answer_key import signatures
from solutions.attention_variants import block_counts, kv_block_range  # noqa: F401 (asked by name)

CHECKS = ("check_kv_block_range", "check_block_counts", "check_attention_kernel", "check_attention")
# How module 04 records a tensor's classic mistakes (told apart from one another too).
flash_forward = paths.lesson_file("05_flash_forward", "answers")  # the loop's classic mistakes


def _gpu_questions():
    """The kernel check's GPU cases, and the wrapper's cases on a GPU's default blocks."""
    for case, default_blocks in ([(case, None) for case in KERNEL_GPU_CASES]  # each names its blocks
                                 + [(case, GPU_BLOCKS) for case in ATTENTION_CASES + ATTENTION_GPU_CASES]):
        (B, H, Hkv, n_q, n_k, D, dtype), options = case
        blocks, causal = options.get("blocks", default_blocks), options.get("causal", False)
        if default_blocks is None:
            yield "kv_block_ranges", (n_q, n_k, *blocks, causal)
            yield "expected_steps", (n_q, n_k, *blocks, causal)
        q, k, v = variant_inputs(B, H, Hkv, n_q, n_k, D, dtype, seed=options["seed"],
                                 kind=options.get("kind", "random"),
                                 layouts=options.get("layouts", ("contiguous",) * 3))
        scale = 1.0 / math.sqrt(D) if options.get("sm_scale") is None else options["sm_scale"]
        yield from mistake_questions(q, k, v, blocks, scale, causal)


# The table is recorded on a CPU. A generator: its inputs are made only when a table is
# recorded, not each time the grader loads this file to compute an answer.
EXTRA = _gpu_questions()


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


# ---------------------------------------------------------------------------------------
# The kernel's classic mistakes

def _seen_by_blocks(n_q, n_k, block_q, ranges, block_k, mask_causal=True):
    """[n_q, n_k] bool: what each row sees when query block i walks keys [0, full) unmasked
    and whole blocks from full to masked with masks (the causal one only if mask_causal),
    ranges[i] = (full, masked)."""
    allowed = bottom_right(n_q, n_k)
    seen = torch.zeros(n_q, n_k, dtype=torch.bool, device=allowed.device)
    for i, (full, masked) in enumerate(ranges):
        rows = slice(i * block_q, (i + 1) * block_q)
        stop = min(n_k, full + triton.cdiv(max(masked - full, 0), block_k) * block_k)
        seen[rows, :full] = True
        seen[rows, full:stop] = allowed[rows, full:stop] if mask_causal else True
    return seen


def variant_outputs(q, k, v, block_q, block_k, scale, causal, q_strides):
    """{mistake: O} of the classic mistakes of this module's kernel that these inputs can
    show, then module 05's (on K/V given to every query head), keyed as the check's
    _variant_mistakes describes them; q_strides: those of q (K and V given to every query
    head are contiguous copies)."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    shift = Nk - Nq

    def seeing(visible=None, heads=None, qkv=(q, k, v)):
        return masked_attention(*qkv, scale, visible, heads)[0]

    found = {}
    right_mask = bottom_right(Nq, Nk) if causal else None
    if H != Hkv:
        found["heads_modulo"] = seeing(right_mask, [h % Hkv for h in range(H)])
    if H // Hkv != Hkv and all(h // Hkv < Hkv for h in range(H)):
        found["group_is_hkv"] = seeing(right_mask, [h // Hkv for h in range(H)])
    if causal:
        ranges = kv_block_ranges(Nq, Nk, block_q, block_k, causal)
        if Nq != Nk:
            found["top_left"] = seeing(bottom_right(Nq, Nk, 0))
        found["causal_mask_missing"] = seeing()
        found["causal_diagonal_hidden"] = seeing(bottom_right(Nq, Nk, shift - 1))
        found["diagonal_block_unmasked"] = seeing(_seen_by_blocks(Nq, Nk, block_q, ranges, block_k, False))
        found["stopped_one_block_early"] = \
            seeing(_seen_by_blocks(Nq, Nk, block_q, [(f, m - block_k) for f, m in ranges], block_k))
        found["diagonal_block_in_unmasked_phase"] = \
            seeing(_seen_by_blocks(Nq, Nk, block_q, [((m // block_k) * block_k, m) for _, m in ranges],
                                   block_k))
        if Nq > Nk:
            found["empty_rows_nan"] = reference(q, k, v, causal, scale)[0].clone()
            found["empty_rows_nan"][:, :, :Nq - Nk] = float("nan")
    # Not causal, module 05's mask_applied (below) is the output of a causal mask applied.
    for which, x, count in (("q", q, H), ("k", k, Hkv), ("v", v, Hkv)):
        if B == count and B > 1:
            swapped = {"q": q, "k": k, "v": v, which: x.transpose(0, 1)}
            found[f"{which}_batch_head_swapped"] = \
                seeing(right_mask, qkv=(swapped["q"], swapped["k"], swapped["v"]))
    if B == H and B > 1:
        found["o_batch_head_swapped"] = reference(q, k, v, causal, scale)[0].transpose(0, 1)
    if not causal or Nq == Nk:  # module 05's mistakes, on K/V given every query head
        heads = kv_heads(H, Hkv)
        k_all, v_all = (t.detach().to(torch.float64)[:, heads] for t in (k, v))
        found.update(flash_forward.loop_outputs(q, k_all, v_all, block_q, block_k, scale, causal, True,
                                                [q_strides, list(k_all.stride()), list(v_all.stride())]))
    return found


def variant_mistakes(q, k, v, block_q, block_k, scale, causal, q_strides):
    """{mistake: signature of its O} (see variant_outputs)."""
    return signatures(variant_outputs(q, k, v, block_q, block_k, scale, causal, q_strides),
                      reference(q, k, v, causal, scale)[0])


def lse_outputs(q, k, scale, causal):
    """{mistake: LSE} of the classic slips these inputs can show, keyed as the check's
    _LSE_MISTAKES describes them: the rows that see no key given +inf or 0, then module
    05's mistakes of the base-2 statistics (on K given to every query head)."""
    Nq, Nk = q.shape[2], k.shape[2]
    found = {}
    if causal and Nq > Nk:
        for key, value in (("empty_rows_inf", float("inf")), ("empty_rows_zero", 0.0)):
            found[key] = reference(q, k, k, causal, scale)[1].clone()
            found[key][:, :, :Nq - Nk] = value
    if not causal or Nq == Nk:
        heads = kv_heads(q.shape[1], k.shape[1])
        found.update(flash_forward.lse_outputs(q, k.detach().to(torch.float64)[:, heads], scale, causal))
    return found


def lse_mistakes(q, k, scale, causal):
    """{mistake: signature of its LSE} (see lse_outputs)."""
    return signatures(lse_outputs(q, k, scale, causal), reference(q, k, k, causal, scale)[1])
