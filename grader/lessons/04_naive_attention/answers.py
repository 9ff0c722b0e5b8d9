"""What module 04's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`)."""
import math

import torch
import triton

from course.checks.naive_attention import GPU_CASES, attention_inputs, expected_attention
from grader.answer_key import signatures
from solutions.naive_attention import (flash_dram_accesses, flash_one_pass_max_n,  # noqa: F401 (asked by name)
                                       naive_dram_accesses, sp_bytes)

CHECKS = ("check_sp_bytes", "check_dram_accesses", "check_attention_reference", "check_naive_attention")


def _gpu_questions():
    """What the attention checks ask for their GPU-only cases."""
    for shape, options in GPU_CASES:
        D, sm_scale = shape[5], options.get("sm_scale")
        scale = 1 / math.sqrt(D) if sm_scale is None else sm_scale
        inputs = attention_inputs(*shape, seed=options["seed"], scale=scale,
                                  kind=options.get("kind", "random"), layout=options.get("layout", "bhnd"))
        yield "attention_mistakes", (*inputs, options.get("causal", False), scale, sm_scale is None)


# The table is recorded on a CPU. A generator: its inputs are made only when a table is
# recorded, not each time the grader loads this file to compute an answer.
EXTRA = _gpu_questions()


def sp_bytes_mistakes(B, H, Nq, Nk, dtype):
    """The byte counts of the classic slips, in the order of the check's descriptions:
    elements instead of bytes, one matrix, one matrix in elements."""
    elements = B * H * Nq * Nk
    return [2 * elements, elements * torch.empty((), dtype=dtype).element_size(), elements]


def naive_dram_accesses_mistakes(N, d):
    """In the order of the check's descriptions: S and P written but not read back, one of
    the four N^2 accesses left out, Q K V O left out, O left out."""
    return [4 * N * d + 2 * N * N, 4 * N * d + 3 * N * N, 4 * N * N, 2 * N * d + 4 * N * N]


def flash_dram_accesses_mistakes(N, d, M):
    """In the order of the check's descriptions: full query blocks only, one of K and V per
    block, Q and O left out, b from all of the SRAM."""
    b = M // (4 * d)
    blocks = triton.cdiv(N, b)
    return [2 * N * d + 2 * N * d * (N // b), 2 * N * d + N * d * blocks, 2 * N * d * blocks,
            2 * N * d + 2 * N * d * triton.cdiv(N, max(M // (2 * d), 1))]


def flash_one_pass_max_n_mistakes(d, M):
    """b from all of the SRAM instead of half of it."""
    return [M // (2 * d)]


# ---------------------------------------------------------------------------------------
# attention_reference and naive_attention's classic mistakes

def attention64(q, k, v, causal, scale, *, softmax_dim=-1, transpose_k=True, mask="top-left",
                kv_heads="consecutive"):
    """Attention in float64 from the same inputs; the keywords make classic mistakes."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    H, Hkv = q.shape[1], k.shape[1]
    if kv_heads == "consecutive":
        k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    else:  # query head h reads K/V head h % Hkv
        k, v = (t.repeat(1, H // Hkv, 1, 1) for t in (k, v))
    s = q @ (k.transpose(-1, -2) if transpose_k else k) * scale
    if causal and mask is not None:
        n_q, n_k = s.shape[-2:]
        first_hidden = {"top-left": 1, "diagonal": 0, "bottom-right": 1 + n_k - n_q}[mask]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(first_hidden), float("-inf"))
    return torch.softmax(s, dim=softmax_dim) @ v


def attention_mistakes(q, k, v, causal, scale, default):
    """{mistake: signature of its output} of the classic mistakes these inputs can show,
    keyed as the check's _MISTAKES describes them (default: sm_scale was None)."""
    D, Nq, Nk = q.shape[-1], q.shape[-2], k.shape[-2]
    found = {"no_scale": attention64(q, k, v, causal, 1.0),
             "scale_twice": attention64(q, k, v, causal, scale * scale),
             "softmax_over_queries": attention64(q, k, v, causal, scale, softmax_dim=-2)}
    if default:
        found["divided_by_d"] = attention64(q, k, v, causal, 1 / D)
    else:
        found["sm_scale_ignored"] = attention64(q, k, v, causal, 1 / math.sqrt(D))
    if Nk == D:
        found["k_not_transposed"] = attention64(q, k, v, causal, scale, transpose_k=False)
    if causal:
        found["mask_missing"] = attention64(q, k, v, causal, scale, mask=None)
        found["diagonal_hidden"] = attention64(q, k, v, causal, scale, mask="diagonal")
        if Nq != Nk:
            found["bottom_right"] = attention64(q, k, v, causal, scale, mask="bottom-right")
    if k.shape[1] not in (1, q.shape[1]):
        found["heads_modulo"] = attention64(q, k, v, causal, scale, kv_heads="modulo")
    return signatures(found, expected_attention(q, k, v, causal, scale))
