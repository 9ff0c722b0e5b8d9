"""Module 06: causal and multi-head variants of the FlashAttention forward.

Module 05's kernel masked every key block and stopped after the diagonal. This one splits
each program's loop in two phases: whole key blocks that every row of the query block may
see run with no key mask and no causal mask; only the blocks that cross the causal
boundary or the end of the keys run masked; blocks after them are never visited
(`kv_block_range` says which is which, `block_counts` counts them).

The causal mask is aligned **bottom-right** here, like FlashAttention's own library
(and unlike PyTorch's `is_causal`, which is top-left): query i sees keys
j <= i + (Nk - Nq), so the last query sees every key, what decoding with a KV cache
needs. With Nq > Nk the first Nq - Nk queries see no key at all: their output is 0 and
their log-sum-exp -inf (the log of an empty sum).

Shapes: q [B, H, Nq, D]; k and v [B, Hkv, Nk, D], H a multiple of Hkv (grouped-query
attention; Hkv = 1 is multi-query): query head h reads K/V head h // (H // Hkv). Every
tensor is addressed through its own strides: views such as a [B, N, H, D] projection seen
as [B, H, N, D] need no copy.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton
import triton.language as tl

from solutions.flash_forward import (LN2, LOG2E, check_attention_inputs, default_scale,
                                     dot_precision, flash_grid)


# ---------------------------------------------------------------------------------------
# Which key blocks a query block visits, and how

def kv_block_range(q_block, n_q, n_k, block_q, block_k, causal):
    """(full_end, masked_end) for query block `q_block` (rows q_block * block_q ...).

    Keys [0, full_end) come in whole blocks that every row of the block may see: no mask.
    Keys [full_end, masked_end) are visited with masks. Keys from masked_end on are skipped.
    full_end is a multiple of block_k; masked_end is the number of keys the block's last
    row sees (n_k when not causal). Causal is bottom-right aligned: row i sees keys
    j <= i + (n_k - n_q); a block whose rows see no key gets (0, 0).
    """
    if not causal:
        return (n_k // block_k) * block_k, n_k
    shift = n_k - n_q  # row i sees keys j <= i + shift
    first_row = q_block * block_q
    seen_by_first = min(max(first_row + shift + 1, 0), n_k)
    seen_by_last = min(max(first_row + block_q + shift, 0), n_k)
    return (seen_by_first // block_k) * block_k, seen_by_last


def block_counts(n_q, n_k, block_q, block_k, causal):
    """(unmasked, masked, skipped): how many (query block, key block) pairs of one
    (batch, head) run with no mask, run with masks, and are never visited."""
    query_blocks, key_blocks = triton.cdiv(n_q, block_q), triton.cdiv(n_k, block_k)
    unmasked = masked = 0
    for q_block in range(query_blocks):
        full_end, masked_end = kv_block_range(q_block, n_q, n_k, block_q, block_k, causal)
        unmasked += full_end // block_k
        masked += triton.cdiv(masked_end, block_k) - full_end // block_k
    return unmasked, masked, query_blocks * key_blocks - unmasked - masked


# Answers to the alignment questions (see the lesson for the options).
decode_align_answer = "b"
sdpa_causal_answer = "b"


# ---------------------------------------------------------------------------------------
# The kernel

# Module 05's update for one key block, with one change: a row that has seen no key yet.
@triton.jit
def online_softmax_step(m_i, l_i, acc, s, v, DOT_PRECISION: tl.constexpr):
    """Fold one block into the running (m_i, l_i, acc) and return them.

    s: the block's scores [BLOCK_Q, BLOCK_K], in base 2, -inf where a key is hidden;
    v: its V tile [BLOCK_K, BLOCK_D]. A row whose scores have all been -inf so far keeps
    m = -inf, l = 0 and acc = 0: its exponentials are taken against 0 instead of its max,
    since exp2(-inf - (-inf)) would be NaN.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def attend_kv_blocks(m_i, l_i, acc, q, kT_base, v_base, stride_kn, stride_vn, offs_q, d_ok,
                     start, end, N_K, shift, qk_scale,
                     BLOCK_K: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
    """Fold the key blocks that start at start, start + BLOCK_K, ... (before end) into
    (m_i, l_i, acc), and return them.

    kT_base / v_base point at key 0 of this (batch, K/V head), head-dim lanes included;
    key n lies n * stride_kn (stride_vn) further. MASKED=False: whole blocks that every
    row sees, loaded and used with no key mask and no causal mask (only the head-dim lanes
    past HEAD_DIM are masked, as d_ok says). MASKED=True: keys >= N_K are not loaded and
    score -inf, and with CAUSAL so do keys j > row + shift. Returns (m_i, l_i, acc, steps),
    steps = how many blocks the loop ran.
    """
    offs_k = tl.arange(0, BLOCK_K)
    steps = 0
    for start_k in range(start, end, BLOCK_K):
        cols = start_k + offs_k
        if MASKED:
            kT = tl.load(kT_base + cols[None, :] * stride_kn,
                         mask=d_ok[:, None] & (cols[None, :] < N_K), other=0.0)
            v = tl.load(v_base + cols[:, None] * stride_vn,
                        mask=(cols[:, None] < N_K) & d_ok[None, :], other=0.0)
        else:  # every key of the block exists and is visible: nothing to test
            kT = tl.load(kT_base + cols[None, :] * stride_kn, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_base + cols[:, None] * stride_vn, mask=d_ok[None, :], other=0.0)
        s = tl.dot(q, kT, input_precision=DOT_PRECISION) * qk_scale
        if MASKED:
            visible = cols[None, :] < N_K
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_q[:, None] + shift)
            s = tl.where(visible, s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, s, v, DOT_PRECISION)
        steps += 1
    return m_i, l_i, acc, steps


@triton.jit
def attention_kernel(
    Q, K, V, O, LSE, STEPS,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_K, qk_scale,
    GROUP: tl.constexpr,        # query heads per K/V head, H // Hkv
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    CAUSAL: tl.constexpr,
    COUNT_STEPS: tl.constexpr,  # store each program's block counts in STEPS (to measure)
    DOT_PRECISION: tl.constexpr,
):
    """Program (i, b*H + h) computes query rows i*BLOCK_Q ... of batch b, head h, against
    K/V head h // GROUP: O (in O's dtype, through O's strides) and LSE[(b*H + h) * N_Q + row]
    (natural log, fp32). qk_scale is sm_scale * log2(e). CAUSAL is bottom-right aligned:
    row i sees keys j <= i + N_K - N_Q; a row that sees no key gets O = 0, LSE = -inf.
    The key loop runs in two phases: whole visible blocks unmasked, then the blocks that
    need masks; blocks after those are skipped. With COUNT_STEPS, STEPS (int32
    [B*H, cdiv(N_Q, BLOCK_Q), 2]) gets, at [b*H + h, i], the blocks each phase ran.
    """
    pid_q = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    h_kv = h // GROUP  # the GROUP consecutive query heads j*GROUP ... share K/V head j

    q0 = pid_q * BLOCK_Q
    offs_q = q0 + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q = tl.load(Q + b * stride_qb + h * stride_qh
                + offs_q[:, None] * stride_qn + offs_d[None, :] * stride_qd,
                mask=(offs_q[:, None] < N_Q) & d_ok[None, :], other=0.0)
    kT_base = K + b * stride_kb + h_kv * stride_kh + offs_d[:, None] * stride_kd
    v_base = V + b * stride_vb + h_kv * stride_vh + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)

    # kv_block_range, for this program's query block.
    shift = N_K - N_Q
    if CAUSAL:
        full_end = tl.minimum(tl.maximum(q0 + shift + 1, 0), N_K) // BLOCK_K * BLOCK_K
        masked_end = tl.minimum(tl.maximum(q0 + BLOCK_Q + shift, 0), N_K)
    else:
        full_end = N_K // BLOCK_K * BLOCK_K
        masked_end = N_K
    m_i, l_i, acc, unmasked = attend_kv_blocks(
        m_i, l_i, acc, q, kT_base, v_base, stride_kn, stride_vn, offs_q, d_ok, 0, full_end,
        N_K, shift, qk_scale, BLOCK_K=BLOCK_K, MASKED=False, CAUSAL=CAUSAL,
        DOT_PRECISION=DOT_PRECISION)
    m_i, l_i, acc, masked = attend_kv_blocks(
        m_i, l_i, acc, q, kT_base, v_base, stride_kn, stride_vn, offs_q, d_ok, full_end,
        masked_end, N_K, shift, qk_scale, BLOCK_K=BLOCK_K, MASKED=True, CAUSAL=CAUSAL,
        DOT_PRECISION=DOT_PRECISION)
    if COUNT_STEPS:
        counts = STEPS + (pid_bh * tl.num_programs(0) + pid_q) * 2
        tl.store(counts, unmasked)
        tl.store(counts + 1, masked)

    # A row that saw no key has m = -inf, l = 0, acc = 0: dividing by 1 instead of 0 gives
    # it O = 0, and LSE = (m + log2 1) * ln 2 = -inf, the log of an empty sum.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    row_ok = offs_q < N_Q
    tl.store(O + b * stride_ob + h * stride_oh
             + offs_q[:, None] * stride_on + offs_d[None, :] * stride_od,
             (acc / l_safe[:, None]).to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE + pid_bh * N_Q + offs_q, (m_i + tl.log2(l_safe)) * LN2, mask=row_ok)


def attention(q, k, v, causal=False, sm_scale=None, *, block_q=None, block_k=None):
    """Attention forward in one launch of attention_kernel. Returns (o, lse).

    q [B, H, Nq, D]; k, v [B, Hkv, Nk, D] with Hkv dividing H; any strides (no copy is
    made). causal is bottom-right aligned. o has q's shape, dtype and layout (the strides
    torch.empty_like(q) gives); lse [B, H, Nq] is fp32. Blocks: block_q / block_k when
    given (powers of two, at least 16), else 32 x 32 in the interpreter and on a GPU
    128 x 64 (64 x 32 when D > 128).
    """
    B, H, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    wide = D > 128  # 256-wide rows: smaller tiles, or they do not fit in shared memory
    gpu_blocks = (64, 32) if wide else (128, 64)
    block_q = block_q or (gpu_blocks[0] if q.is_cuda else 32)
    block_k = block_k or (gpu_blocks[1] if q.is_cuda else 32)
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(block, int) or block < 16 or block & (block - 1):
            raise ValueError(f"{name} must be a power of two of at least 16 (tl.arange needs a "
                             f"power of two, tl.dot a side of 16), got {block!r}")
    o = torch.empty_like(q)  # a permuted q gives a permuted o: it comes back in q's layout
    lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    block_d = max(16, triton.next_power_of_2(D))
    attention_kernel[flash_grid(Nq, B, H, block_q)](
        q, k, v, o, lse, lse,  # STEPS: not used without COUNT_STEPS
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, Nq, Nk, default_scale(sm_scale, D) * LOG2E,
        GROUP=H // Hkv, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_Q=block_q, BLOCK_K=block_k,
        CAUSAL=bool(causal), COUNT_STEPS=False, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=8 if block_d == 128 else 4, num_stages=2 if wide else 3,  # GPU only
    )
    return o, lse
