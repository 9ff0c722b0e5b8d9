"""Module 08: the FlashAttention backward pass (training kernels).

Read it in this order:
1. `attention_backward_reference`: the gradients of attention in plain PyTorch, the
   formulas every kernel below implements.
2. `bwd_preprocess_kernel`: delta = rowsum(dO * O), one fp32 number per query row.
   (The unfused path computes the same rows inside `bwd_dq_kernel`, launched first:
   one launch fewer, which matters at short sequences.)
3. `bwd_dkdv_kernel`: one program per KV block; it keeps its K and V tiles on chip and
   walks over the query blocks (of every query head of its GQA group), accumulating dK
   and dV. With FUSED_DQ it also adds each block's share of dQ into an fp32 buffer with
   atomics, so no second kernel has to recompute P.
4. `bwd_dq_kernel`: the unfused alternative: one program per query block walks the KV
   blocks and owns its dQ rows outright (no atomics, but P and dP are recomputed). It
   runs before the dK/dV kernel and stores delta for it.
5. `TunedAttentionFunction` and `flash_attention`: the autograd glue around the tuned
   forward of `solutions/flash_tuned.py` and the autotuned backward (head dims such as
   160 go to `solutions/flash_backward_split.py`).
Module 08's lesson also takes from here `softmax_backward`, `_accumulate_dq` (the fused
path's atomic adds), `flash_backward` (the same kernels launched with fixed tiles) and
`autograd_forward` / `autograd_backward` (an autograd Function's two methods).

Notation (per batch and head, scale = sm_scale): S = scale * Q K^T,
P = softmax(S) = exp(S - lse), O = P V. Given dO:
    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - delta),   delta_i = sum_j P_ij dP_ij = rowsum(dO * O)_i
    dQ = scale * dS K
    dK = scale * dS^T Q
The kernels compute P as exp2(scale * log2(e) * Q K^T - log2(e) * lse): one multiply
folds the scale into the base-2 exponent.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton
import triton.language as tl

from solutions import flash_tuned
from solutions.flash_forward import LOG2E, check_attention_inputs, default_scale, dot_precision
from solutions.naive_attention import attention_scores, repeat_kv

LOG2E_C = tl.constexpr(LOG2E)  # the same constant, usable inside kernels


# ---------------------------------------------------------------------------------------
# The lesson's derivation, in PyTorch.

def softmax_backward(p, dp, dim=-1):
    """The gradient dx of a softmax p = softmax(x, dim), given the gradient dp of p:
    dx = p * (dp - sum(p * dp, dim)). Computed in fp32 (float64 stays float64) and
    returned in p's dtype."""
    acc = torch.promote_types(p.dtype, torch.float32)
    p32, dp32 = p.to(acc), dp.to(acc)
    # One row's Jacobian is diag(p) - p p^T; times dp it is this, never formed. In fp16,
    # dp - sum(p * dp) would cancel away the digits that matter when dp is far from zero.
    return (p32 * (dp32 - (p32 * dp32).sum(dim, keepdim=True))).to(p.dtype)


def attention_backward_reference(q, k, v, o, do, lse, causal=False, sm_scale=None):
    """Gradients (dq, dk, dv) of attention, from the forward's o and lse, in float64.

    No autograd: P is rebuilt from lse exactly as the kernels do, then the chain rule
    is applied by hand (formulas in the module docstring). GQA: the dK/dV of the query
    heads that share one K/V head are summed into it.
    """
    B, H, Hkv, _, Nk, D = check_attention_inputs(q, k, v)
    scale, group = default_scale(sm_scale, D), H // Hkv
    q64, do64, o64 = q.double(), do.double(), o.double()
    k64, v64 = repeat_kv(k.double(), H), repeat_kv(v.double(), H)
    s = attention_scores(q64, k64, causal, scale)
    p = torch.exp(s - lse.double()[..., None])           # softmax, without re-normalising
    dv = p.transpose(-1, -2) @ do64
    dp = do64 @ v64.transpose(-1, -2)
    delta = (do64 * o64).sum(-1, keepdim=True)            # = rowsum(P * dP)
    ds = p * (dp - delta)                                  # softmax's Jacobian, row by row
    dq = scale * ds @ k64                                  # d(scale * Q K^T)/dQ
    dk = scale * ds.transpose(-1, -2) @ q64                # the scale again, on dK too
    dk = dk.view(B, Hkv, group, Nk, D).sum(2)
    dv = dv.view(B, Hkv, group, Nk, D).sum(2)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------
# Triton kernels. q, k and v are reached through their strides (any layout whose head_dim
# is contiguous: no copies); o, dO, the gradients, lse and delta are contiguous buffers,
# indexed by shape (see `_backward`).

@triton.jit
def _load_rows(base, offs_rows, stride_rows, offs_d, n_rows,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """A [rows, BLOCK_D] tile (head_dim contiguous), zero outside the tensor. Masks only
    where needed."""
    ptrs = base + offs_rows[:, None] * stride_rows + offs_d[None, :]
    if CHECK_ROWS:
        mask = offs_rows[:, None] < n_rows
        if BLOCK_D != HEAD_DIM:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        return tl.load(ptrs, mask=mask, other=0.0)
    elif BLOCK_D != HEAD_DIM:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _row_delta(o, do):
    """delta of each row of two [rows, BLOCK_D] tiles of O and dO, in fp32."""
    # delta_i = sum_j P_ij dP_ij = dO_i . O_i: one dot per row instead of an N-long sum.
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)


@triton.jit
def bwd_preprocess_kernel(
    O, DO, DELTA, N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """delta for BLOCK_M rows of one (batch, head). The unfused path computes delta in
    the dQ kernel instead (one launch fewer); the fused one needs it before dK/dV."""
    pid_m = tl.program_id(0)
    rows = tl.program_id(1).to(tl.int64) * N_Q  # first row of this (batch, head)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)  # head-dim lanes, HEAD_DIM rounded up
    o = _load_rows(O + rows * HEAD_DIM, offs_m, HEAD_DIM, offs_d, N_Q, HEAD_DIM, BLOCK_D, True)
    do = _load_rows(DO + rows * HEAD_DIM, offs_m, HEAD_DIM, offs_d, N_Q, HEAD_DIM, BLOCK_D, True)
    tl.store(DELTA + rows + offs_m, _row_delta(o, do), mask=offs_m < N_Q)


@triton.jit
def _accumulate_dq(DQ, dsT, k, offs_m, offs_d, N_Q, sm_scale,
                   HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Add this KV block's part of dQ = scale * dS K to the rows offs_m of DQ (fp32,
    contiguous [N_Q, HEAD_DIM] rows of one head)."""
    # Every KV block adds its part to the same rows, several programs at once on a GPU:
    # the adds must be atomic (a load, add and store would lose some of them).
    dq = tl.dot(tl.trans(dsT.to(k.dtype)), k, input_precision=DOT_PRECISION) * sm_scale
    dq_ptrs = DQ + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    dq_mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM)
    tl.atomic_add(dq_ptrs, dq, mask=dq_mask, sem="relaxed")


@triton.jit
def _dkdv_q_blocks(
    dk, dv, k, v, Q, DO, LSE, DELTA, DQ, stride_qn,
    offs_n, offs_d, lo, hi, N_Q, N_K, qk_scale, sm_scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, FUSED_DQ: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Add the query blocks [lo, hi) of one head to this KV block's dK and dV.

    Works on the transposed scores (keys along rows) so that P^T and dS^T come out of
    the dots directly in the layout dV += P^T dO and dK += dS^T Q need.
    MASK=False is the fast path for blocks with no causal, ragged-row or ragged-key
    entries; the caller only sends such blocks there.
    """
    offs_m0 = tl.arange(0, BLOCK_M)
    # Masked loops (the diagonal, one ragged block) are short: not pipelining them is also
    # part of what keeps ptxas from serializing the wgmma (PERF.md 3h, 3i).
    for start_m in tl.range(lo, hi, BLOCK_M, num_stages=1 if MASK else None):
        offs_m = start_m + offs_m0
        q = _load_rows(Q, offs_m, stride_qn, offs_d, N_Q, HEAD_DIM, BLOCK_D, MASK)
        do = _load_rows(DO, offs_m, HEAD_DIM, offs_d, N_Q, HEAD_DIM, BLOCK_D, MASK)
        if MASK:
            lse = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0)
            delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
        else:
            lse = tl.load(LSE + offs_m)
            delta = tl.load(DELTA + offs_m)
        # P^T = exp2(scale*log2e * K Q^T - log2e * lse): the forward's probabilities.
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        pT = tl.math.exp2(qkT * qk_scale - (lse * LOG2E_C)[None, :])
        if MASK:
            keep = (offs_m[None, :] < N_Q) & (offs_n[:, None] < N_K)
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])  # query i sees keys j <= i
            pT = tl.where(keep, pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do, input_precision=DOT_PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        # delta is per query row: a column of the transposed tile.
        dsT = pT * (dpT - delta[None, :])
        dk += tl.dot(dsT.to(q.dtype), q, input_precision=DOT_PRECISION)
        if FUSED_DQ:
            _accumulate_dq(DQ, dsT, k, offs_m, offs_d, N_Q, sm_scale, HEAD_DIM, DOT_PRECISION)
    return dk, dv


@triton.jit
def _dkdv_stages(start_n, N_Q, N_K, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """(lo, diag_end, full_end): the query blocks [lo, N_Q) that the keys start_n ...
    start_n + BLOCK_N - 1 need, in three stages: [lo, diag_end) masked, [diag_end,
    full_end) without masks, [full_end, N_Q) masked."""
    # Causal: rows i < start_n see none of these keys, so the walk starts at the query
    # block holding row start_n (skipping the blocks above the diagonal); the blocks that
    # cross the diagonal need the causal mask. After them come full blocks without masks,
    # then the ragged last query block. A ragged KV block (past N_K) masks every block.
    n_q_ceil = tl.cdiv(N_Q, BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        diag_end = tl.minimum(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, n_q_ceil)
    else:
        lo = 0
        diag_end = 0
    full_end = tl.where(start_n + BLOCK_N <= N_K, (N_Q // BLOCK_M) * BLOCK_M, diag_end)
    full_end = tl.maximum(full_end, diag_end)
    return lo, diag_end, full_end


@triton.jit(do_not_specialize=["N_Q", "N_K"])  # lengths only bound loops and masks
def bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    H, H_KV, N_Q, N_K, sm_scale,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr, FUSED_DQ: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Program (j, b * H_KV + h_kv) computes dK and dV of keys j*BLOCK_N ... of batch b,
    K/V head h_kv, walking the query blocks of the GROUP query heads that share it.

    Q, K, V through their strides (head dim contiguous); DO, DQ [B, H, N_Q, HEAD_DIM] and
    LSE, DELTA [B, H, N_Q] contiguous; DK, DV contiguous [B, H_KV, N_K, HEAD_DIM], stored
    in their dtype. CAUSAL: query i sees keys j <= i. FUSED_DQ: also adds each block's
    part of dQ = sm_scale * dS K into DQ (fp32).
    """
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)          # over batch * K/V heads
    b = (pid_bh // H_KV).to(tl.int64)
    h_kv = pid_bh % H_KV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)  # head-dim lanes, HEAD_DIM rounded up

    k = _load_rows(K + b * stride_kb + h_kv * stride_kh, offs_n, stride_kn, offs_d,
                   N_K, HEAD_DIM, BLOCK_D, True)
    v = _load_rows(V + b * stride_vb + h_kv * stride_vh, offs_n, stride_vn, offs_d,
                   N_K, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E_C

    lo, diag_end, full_end = _dkdv_stages(start_n, N_Q, N_K, CAUSAL, BLOCK_M, BLOCK_N)
    # Causal: the diagonal blocks in steps of half as many rows. Masked steps cost more
    # than the others, and more, smaller ones cost less than two large ones (PERF.md 3h).
    DIAG_M: tl.constexpr = BLOCK_M // 2 if CAUSAL and BLOCK_M >= 32 else BLOCK_M
    # Then the blocks without masks and the ragged tail, in the order that keeps ptxas from
    # serializing every wgmma of the kernel (its advisory C7515, PERF.md 3h, 3i): the loop
    # without masks last when causal, first when not.
    if CAUSAL:
        lo2, hi2, lo3, hi3 = full_end, N_Q, diag_end, full_end
    else:
        lo2, hi2, lo3, hi3 = diag_end, full_end, full_end, N_Q

    # GQA: this K/V head serves GROUP query heads; their contributions add up here, so
    # dK and dV need neither atomics nor a reduction afterwards.
    for g in range(GROUP):
        h = h_kv * GROUP + g
        q_base = Q + b * stride_qb + h * stride_qh
        rows = (b * H + h) * N_Q       # first row of this head in dO, dQ, lse and delta
        do_base = DO + rows * HEAD_DIM
        dq_base = DQ + rows * HEAD_DIM
        dk, dv = _dkdv_q_blocks(
            dk, dv, k, v, q_base, do_base, LSE + rows, DELTA + rows, dq_base, stride_qn,
            offs_n, offs_d, lo, diag_end, N_Q, N_K, qk_scale, sm_scale,
            True, CAUSAL, FUSED_DQ, HEAD_DIM, BLOCK_D, DIAG_M, DOT_PRECISION)
        dk, dv = _dkdv_q_blocks(
            dk, dv, k, v, q_base, do_base, LSE + rows, DELTA + rows, dq_base, stride_qn,
            offs_n, offs_d, lo2, hi2, N_Q, N_K, qk_scale, sm_scale,
            CAUSAL, CAUSAL, FUSED_DQ, HEAD_DIM, BLOCK_D, BLOCK_M, DOT_PRECISION)
        dk, dv = _dkdv_q_blocks(
            dk, dv, k, v, q_base, do_base, LSE + rows, DELTA + rows, dq_base, stride_qn,
            offs_n, offs_d, lo3, hi3, N_Q, N_K, qk_scale, sm_scale,
            not CAUSAL, CAUSAL, FUSED_DQ, HEAD_DIM, BLOCK_D, BLOCK_M, DOT_PRECISION)

    dk = dk * sm_scale  # dK = scale * dS^T Q: the scale of S = scale * Q K^T, once
    out = pid_bh.to(tl.int64) * N_K * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    mask = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=mask)


@triton.jit
def _dq_kv_blocks(
    dq, q, do, lse2, delta, K, V, stride_kn, stride_vn,
    offs_m, offs_d, lo, hi, N_K, qk_scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Add the KV blocks [lo, hi) to this query block's dQ (unscaled)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k = _load_rows(K, offs_n, stride_kn, offs_d, N_K, HEAD_DIM, BLOCK_D, MASK)
        v = _load_rows(V, offs_n, stride_vn, offs_d, N_K, HEAD_DIM, BLOCK_D, MASK)
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
                         - lse2[:, None])
        if MASK:
            keep = offs_n[None, :] < N_K
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _dq_stages(start_m, N_K, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(full_end, hi): the key blocks that the query rows start_m ... start_m + BLOCK_M - 1
    need, [0, full_end) without masks, then [full_end, hi) masked."""
    # KV blocks entirely at or below every row's diagonal (and inside N_K) go unmasked;
    # causal: the walk stops after the block holding key start_m + BLOCK_M - 1.
    if CAUSAL:
        hi = tl.minimum(N_K, start_m + BLOCK_M)
        full_end = tl.minimum(((start_m + 1) // BLOCK_N) * BLOCK_N, (N_K // BLOCK_N) * BLOCK_N)
    else:
        hi = N_K
        full_end = (N_K // BLOCK_N) * BLOCK_N
    return full_end, hi


@triton.jit(do_not_specialize=["N_Q", "N_K"])
def bwd_dq_kernel(
    Q, K, V, DO, O, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    H, N_Q, N_K, sm_scale,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Program (i, b * H + h) computes dQ of query rows i*BLOCK_M ... of batch b, head h
    (K/V head h // GROUP), walking the KV blocks, and stores these rows' delta =
    rowsum(dO * O) into DELTA for the dK/dV kernel.

    Q, K, V through their strides (head dim contiguous); DO, O, DQ [B, H, N_Q, HEAD_DIM]
    and LSE, DELTA [B, H, N_Q] contiguous; DQ stored in its dtype. CAUSAL: query i sees
    keys j <= i.
    """
    pid_m = tl.program_id(0)
    if CAUSAL:
        # Later query blocks see more keys: start them first so the short ones fill the tail.
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)  # b * H + h
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H  # the query head, reading K/V head h // GROUP
    h_kv = h // GROUP  # (GQA)
    rows = pid_bh.to(tl.int64) * N_Q   # first row of this head in dO, O, dQ, lse and delta
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)  # head-dim lanes, HEAD_DIM rounded up

    q = _load_rows(Q + b * stride_qb + h * stride_qh, offs_m, stride_qn, offs_d,
                   N_Q, HEAD_DIM, BLOCK_D, True)
    do = _load_rows(DO + rows * HEAD_DIM, offs_m, HEAD_DIM, offs_d, N_Q, HEAD_DIM, BLOCK_D, True)
    o = _load_rows(O + rows * HEAD_DIM, offs_m, HEAD_DIM, offs_d, N_Q, HEAD_DIM, BLOCK_D, True)
    row_ok = offs_m < N_Q
    # The preprocessing step, done here: these rows' delta, stored for the dK/dV kernel
    # that runs next (it needs delta of every query row it visits).
    delta = _row_delta(o, do)
    tl.store(DELTA + rows + offs_m, delta, mask=row_ok)
    lse2 = tl.load(LSE + rows + offs_m, mask=row_ok, other=0.0) * LOG2E_C
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E_C

    full_end, hi = _dq_stages(start_m, N_K, CAUSAL, BLOCK_M, BLOCK_N)
    # Causal: the masked key blocks (the diagonal) in steps of a quarter as many keys, for
    # the dK/dV kernel's reason (a quarter measured faster here, half there: PERF.md 3h).
    DIAG_N: tl.constexpr = BLOCK_N // 4 if CAUSAL and BLOCK_N >= 64 else BLOCK_N
    k_base = K + b * stride_kb + h_kv * stride_kh
    v_base = V + b * stride_vb + h_kv * stride_vh  # (the head dim is contiguous)
    dq = _dq_kv_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                       offs_m, offs_d, 0, full_end, N_K, qk_scale,
                       False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION)
    dq = _dq_kv_blocks(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
                       offs_m, offs_d, full_end, hi, N_K, qk_scale,
                       True, CAUSAL, HEAD_DIM, BLOCK_D, DIAG_N, DOT_PRECISION)

    dq = dq * sm_scale  # dQ = scale * dS K
    tl.store(DQ + (rows + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


# ---------------------------------------------------------------------------------------
# Launch configurations. The interpreter takes one small config (it cannot autotune);
# on a GPU each kernel is autotuned over a shortlist per head-dim bucket, taken from
# sweeps on an H100 (buckets 64, 128; the unfused 256 bucket again, PERF.md 3h; the
# unfused dK/dV 64 and 128 buckets again after the loop order, 3i) and an H200 (bucket
# 256: D = 160, 192, 256) (solutions/PERF.md, "## Backward"). Entries are (BLOCK_M,
# BLOCK_N, num_warps, num_stages), best first.

INTERPRET_CONFIG = dict(BLOCK_M=32, BLOCK_N=32)
SHORTLIST = {
    "dkdv": {64: [(64, 64, 4, 4), (64, 64, 4, 3), (32, 128, 4, 4)],
             128: [(64, 64, 4, 2), (32, 64, 4, 3), (64, 128, 8, 2)],
             256: [(64, 64, 8, 2), (64, 32, 8, 3)]},
    # The fused kernel also holds a [BLOCK_M, D] dQ tile per step, so it likes other tiles.
    "dkdv_fused": {64: [(64, 128, 8, 3), (64, 64, 4, 3)],
                   128: [(64, 128, 8, 2), (32, 128, 8, 3)],
                   256: [(64, 64, 8, 1), (32, 64, 4, 2)]},
    "dq": {64: [(128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)],
           128: [(64, 64, 4, 2), (64, 32, 4, 3)],
           256: [(128, 32, 8, 3), (64, 64, 4, 2), (128, 64, 8, 1)]},
}
# Exact fp32 dots (input_precision="ieee") run on the FMA units: small tiles, quick compiles.
FP32_SHORTLIST = {"dkdv": [(32, 64, 4, 2)], "dkdv_fused": [(32, 64, 4, 2)], "dq": [(64, 32, 4, 2)]}


def _zero_dq(nargs):
    nargs["DQ"].zero_()  # fused dQ accumulates: every trial (and the real run) starts at 0


def _autotuned(kernel, buckets, fp32, width_of, hook=None):
    """The kernel autotuned over the shortlist of `buckets` (tile width -> configs) whose
    width is the smallest >= each call's `width_of(arguments)`; `fp32` for fp32 inputs.
    (Also used by solutions/flash_backward_split.py.)"""
    shapes = {c for bucket in buckets.values() for c in bucket} | set(fp32)
    configs = [triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn), num_warps=w, num_stages=st, pre_hook=hook)
               for bm, bn, w, st in sorted(shapes)]

    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        if args["Q"].element_size() == 4:
            wanted = fp32
        else:
            width = width_of(args)
            wanted = buckets[min(b for b in buckets if b >= width)]
        by_shape = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages): c
                    for c in configs}
        return [by_shape[w] for w in wanted]

    return triton.autotune(configs, key=["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "GROUP"],
                           prune_configs_by={"early_config_prune": prune},
                           do_bench=flash_tuned.timed_once)(kernel)


def _block_d(args):
    return args["BLOCK_D"]


_dkdv_tuned = _autotuned(bwd_dkdv_kernel, SHORTLIST["dkdv"], FP32_SHORTLIST["dkdv"], _block_d)
# A config's pre_hook runs before every trial and before the chosen run, on every Triton
# version: it keeps the atomically accumulated dQ right while tuning.
_dkdv_fused_tuned = _autotuned(bwd_dkdv_kernel, SHORTLIST["dkdv_fused"], FP32_SHORTLIST["dkdv_fused"],
                               _block_d, hook=_zero_dq)
_dq_tuned = _autotuned(bwd_dq_kernel, SHORTLIST["dq"], FP32_SHORTLIST["dq"], _block_d)

# Measured on an H100 (PERF.md, "## Backward"): the separate dQ kernel beat the atomics
# in 18 of 24 fwd+bwd cases (by up to 16%; the atomics won by up to 9% at D = 64 causal
# N >= 4096 and at D = 128 N = 16384) and needs no fp32 dQ buffer.
FUSED_DEFAULT = False


def check_backward_inputs(q, k, v, o, lse, do):
    """Validate the backward's inputs (q, k, v as check_attention_inputs wants them; o and
    do of q's shape and dtype; lse fp32 [B, H, Nq]; one device); return
    (B, H, Hkv, Nq, Nk, D)."""
    B, H, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    for name, t in (("o", o), ("lse", lse), ("do", do)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if o.shape != q.shape or do.shape != q.shape:
        raise ValueError(f"o {tuple(o.shape)} and do {tuple(do.shape)} must have q's shape "
                         f"{tuple(q.shape)}")
    if lse.shape != (B, H, Nq) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be fp32 of shape {(B, H, Nq)}, got {lse.dtype} {tuple(lse.shape)}")
    if o.dtype != q.dtype or do.dtype != q.dtype:
        raise ValueError(f"o and do must have q's dtype {q.dtype}, got {o.dtype} and {do.dtype}")
    if not (o.device == do.device == lse.device == q.device):
        raise ValueError(f"q, k, v, o, do and lse must be on one device, got q on {q.device}, "
                         f"o on {o.device}, do on {do.device}, lse on {lse.device}")
    return B, H, Hkv, Nq, Nk, D


def flash_backward(q, k, v, o, lse, do, causal=False, sm_scale=None, *, fused=False,
                   block_m=None, block_n=None):
    """The backward pass with the kernels above, fixed tiles: (dq, dk, dv) in the dtypes
    of q, k, v. (The lesson's wrapper; `flash_attention_backward` is the autotuned one.)

    o, lse: the forward's outputs; do: the gradient of o. fused=False: the dQ kernel
    (which also stores delta), then the dK/dV kernel; fused=True: the preprocessing
    kernel, then the dK/dV kernel adding dQ into an fp32 buffer with atomics.
    block_m, block_n: query and key rows per tile; by default 32 in the interpreter, and
    on a GPU 64, 32 or 16 as [block, D] tiles grow (they must fit in shared memory), at
    most 32 in fp32.
    """
    B, H, Hkv, Nq, Nk, D = check_backward_inputs(q, k, v, o, lse, do)
    sm_scale = default_scale(sm_scale, D)  # 1/sqrt(D) when None
    row_bytes = q.element_size() * D
    block = (64 if row_bytes <= 256 else 32 if row_bytes <= 512 else 16) if q.is_cuda else 32
    if q.dtype == torch.float32:  # exact fp32 dots unroll on the FMA units: on an H100 the
        block = min(block, 32)    # 64-row kernels took 12-44 s each to compile, 32-row 1-5 s
    block_m, block_n = block_m or block, block_n or block
    # The kernels take q, k, v through their strides (head dim contiguous), and o, dO,
    # lse and every buffer made here as contiguous tensors.
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o, do, lse = o.contiguous(), do.contiguous(), lse.contiguous()
    delta = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    block_d = max(16, triton.next_power_of_2(D))  # a power of two for tl.arange
    meta = dict(GROUP=H // Hkv, CAUSAL=bool(causal), HEAD_DIM=D, BLOCK_D=block_d,
                BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=dot_precision(q.dtype))
    if fused:
        bwd_preprocess_kernel[(triton.cdiv(Nq, block_m), B * H)](
            o, do, delta, Nq, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=block_m)
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)  # the atomics add into it
    else:
        dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
        bwd_dq_kernel[(triton.cdiv(Nq, block_m), B * H)](
            q, k, v, do, o, lse, delta, dq, *strides, H, Nq, Nk, sm_scale, **meta)
    bwd_dkdv_kernel[(triton.cdiv(Nk, block_n), B * Hkv)](  # one program per KV block
        q, k, v, do, lse, delta, dk, dv, dq, *strides, H, Hkv, Nq, Nk, sm_scale,
        FUSED_DQ=bool(fused), **meta)
    return dq.to(q.dtype), dk, dv


def flash_attention_backward(q, k, v, o, lse, do, causal=False, sm_scale=None,
                             fused=FUSED_DEFAULT, config=None):
    """Gradients (dq, dk, dv) of FlashAttention, in the dtypes of q, k, v.

    o, lse: the forward's outputs; do: the gradient of o (any strides).
    fused=True computes dQ inside the dK/dV kernel with atomics (one kernel fewer, an
    fp32 dQ buffer more); fused=False runs the separate dQ kernel.
    config: {"dkdv": {...}, "dq": {...}} of BLOCK_M, BLOCK_N, num_warps, num_stages to
    bypass the autotuner (tuning sweeps; tests of every shortlisted config, which the
    interpreter runs too); None uses the autotuner on a GPU, small tiles in the interpreter.
    """
    B, H, Hkv, Nq, Nk, D = check_backward_inputs(q, k, v, o, lse, do)
    return _backward(q, k, v, o, lse.contiguous(), do, bool(causal), default_scale(sm_scale, D),
                     bool(fused), config)


def _launcher(config, consts, key):
    """launch(kernel, tuned, which, grid, *args, **kwargs): the kernel with config[which]
    where a config is given (sweeps, tests; the interpreter too), else the interpreter's
    small tiles, else the autotuned kernel `tuned` through flash_tuned.launch_tuned.
    grid(meta) makes the grid of a config's meta-parameters."""
    def launch(kernel, tuned, which, grid, *args, **kwargs):
        if config is not None:
            kernel[grid(config[which])](*args, **kwargs, **consts, **config[which])
        elif course.INTERPRET:
            kernel[grid(INTERPRET_CONFIG)](*args, **kwargs, **consts, **INTERPRET_CONFIG)
        else:
            flash_tuned.launch_tuned(tuned, grid, key, *args, **kwargs, **consts)
    return launch


def _backward(q, k, v, o, lse, do, causal, scale, fused, config=None):
    """The launches, on inputs already checked (the autograd path skips the checks: the
    forward made them, and the host time matters at short sequences; see PERF.md)."""
    inputs = (q, k, v, o, lse, do)
    signature = None if fused or config is not None else flash_tuned.plan_signature(
        "backward", inputs, causal, scale, GLUON_BACKWARD_MIN_WORK, GLUON_BACKWARD_HEAD_DIMS, GLUON_DQ_HEAD_DIMS)
    made = flash_tuned.run_plan(signature, inputs)
    if made is not None:  # a call of this signature ran before: its launches again
        return made
    B, H, Nq, D = q.shape
    slices = flash_tuned.batch_slices(B, H)
    if slices:
        return flash_tuned.by_batch_slices(
            slices, lambda *t: _backward(*t, causal, scale, fused, config), q, k, v, o, lse, do)
    Hkv, Nk = k.shape[1], k.shape[2]
    block_d = max(16, flash_tuned.next_power_of_2(D))
    consts = dict(GROUP=H // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=block_d,
                  DOT_PRECISION=dot_precision(q.dtype))

    # The kernels' layout contract: q, k, v in any strides with head_dim contiguous (as
    # the forward takes them); o, dO and every buffer made here contiguous, indexed by
    # shape: fewer kernel arguments, and each costs host time at every launch (PERF.md).
    q, k, v = (flash_tuned.kernel_input(t) for t in (q, k, v))
    o, do = (flash_tuned.kernel_input(t, contiguous=True) for t in (o, do))
    columns = flash_tuned.column_blocks(D)
    if columns[1] and flash_tuned.SPLIT_D and not fused:
        # A head dim like 160 or 192: two power-of-two column blocks instead of one padded
        # to 256 (solutions/flash_backward_split.py; imported here, since it imports this
        # module). The fused path keeps module 08's padded kernel.
        from solutions.flash_backward_split import backward_split
        return backward_split(q, k, v, o, lse, do, causal, scale, columns, config)
    delta = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    key = (Nq, Nk, D, causal, H // Hkv, q.dtype)  # the autotuners' key, and the dtype

    launch = _launcher(config, consts, key)

    def dkdv_grid(c):
        return flash_tuned.cdiv(Nk, c["BLOCK_N"]), B * Hkv

    def launch_dkdv(dq):
        if block_d == 256 and not fused and flash_tuned.ROWS_D256:
            # 256 columns: the dK/dV kernel with the scores queries-along-rows, which
            # computes them once, not once per warpgroup (imported here, since it
            # imports this module).
            from solutions import flash_backward_d256 as d256
            launch(d256.bwd_dkdv_rows_kernel, d256.dkdv_rows_tuned, "dkdv", dkdv_grid,
                   q, k, v, do, lse, delta, dk, dv, *strides, H, Hkv, Nq, Nk, scale)
            return
        launch(bwd_dkdv_kernel, _dkdv_fused_tuned if fused else _dkdv_tuned, "dkdv", dkdv_grid,
               q, k, v, do, lse, delta, dk, dv, dq, *strides, H, Hkv, Nq, Nk, scale,
               FUSED_DQ=fused)

    if fused:
        # delta first, then dK/dV adds dQ into an fp32 buffer with atomics.
        pre_block = 64
        bwd_preprocess_kernel[(flash_tuned.cdiv(Nq, pre_block), B * H)](
            o, do, delta, Nq, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=pre_block)
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        launch_dkdv(dq)
        return dq.to(q.dtype), dk, dv
    # The dQ kernel also stores delta (the preprocessing), then dK/dV reads it.
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)

    def launch_dq():
        launch(bwd_dq_kernel, _dq_tuned, "dq", lambda c: (flash_tuned.cdiv(Nq, c["BLOCK_M"]), B * H),
               q, k, v, do, o, lse, delta, dq, *strides, H, Nq, Nk, scale)

    with flash_tuned.recording(signature, inputs) as recorded:
        if config is None and gluon_backward_takes(q, k, v, scale):
            from solutions import flash_gluon_backward as gb  # imported here: the interpreter has no Gluon
            if D in GLUON_DQ_HEAD_DIMS:
                gb.dq_delta(q, k, v, o, do, lse, delta, dq, causal, scale)
            else:
                launch_dq()
            gb.dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale)
        else:
            launch_dq()
            launch_dkdv(dq)
    recorded.keep(returned=(dq, dk, dv), buffers=(delta,))
    return dq, dk, dv


# The backward's Gluon kernels (solutions/flash_gluon_backward.py) run at these head dims
# where flash_tuned.gluon_takes allows (dQ at D = 128 only: at D = 64 it read 0.86-1.10x
# the Triton dQ kernel), for steps of at least this much work (B * H * N^2 * D): below it
# (D = 64, N = 1024, B * H = 256) the eager training step is bound by the host's launch
# time, and the Gluon launches' TMA descriptors cost more host time than their kernels
# save (PERF.md 3p; measured before 3r made those launches cheaper, not measured since).
GLUON_BACKWARD_HEAD_DIMS = (64, 128)
GLUON_DQ_HEAD_DIMS = (128,)
GLUON_BACKWARD_MIN_WORK = 2 ** 35


def gluon_backward_takes(q, k, v, scale):
    """Whether the unfused backward runs its Gluon kernels: the Gluon forward's conditions
    (Hopper, Triton 3.6, fp16/bf16, N_Q == N_K, contiguous, aligned) at a head dim of
    GLUON_BACKWARD_HEAD_DIMS, enough work, fewer than 2^31 rows of lse (the kernels
    index them with 32-bit offsets), and a scale of at least 2^-100 in magnitude: the
    dK/dV kernel at D = 128 starts its scores from lse / scale (its IN_ORDER steps), which
    a scale of 0 (or one so small that lse / scale overflows) would break."""
    B, H, N, D = q.shape  # the work first: the cheapest test, and the one short steps fail
    return (B * H * N * N * D >= GLUON_BACKWARD_MIN_WORK and B * H * N < 2 ** 31 and abs(scale) >= 2.0 ** -100
            and flash_tuned.gluon_takes(q, k, v, GLUON_BACKWARD_HEAD_DIMS))


class TunedAttentionFunction(torch.autograd.Function):
    """Autograd glue: the tuned forward saves (o, lse); the backward kernels use them."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, fused):
        o, lse = flash_tuned.flash_attention_forward(q, k, v, causal=causal, sm_scale=sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.fused = bool(causal), bool(fused)
        ctx.scale = default_scale(sm_scale, q.shape[-1])
        ctx.mark_non_differentiable(lse)  # a statistic for the backward, not an output to train
        ctx.set_materialize_grads(False)  # lse's gradient stays None: no zeros to allocate and fill
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        # do comes from autograd with o's shape, dtype and device (any strides, even 0).
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.fused)
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, causal=False, sm_scale=None, *, fused=FUSED_DEFAULT):
    """FlashAttention with gradients: returns (o, lse), differentiable in q, k, v."""
    return TunedAttentionFunction.apply(q, k, v, causal, sm_scale, fused)


# ---------------------------------------------------------------------------------------
# The lesson's autograd exercise: FlashAttentionFunction's two methods as functions (the
# notebook makes its class of them, as below), and one training step's gradients through
# it. In the notebook, `flash_attention` is module 05's forward and `flash_backward` the
# learner's wrapper; here they are the tuned forward and the wrapper above, with the same
# contract: so the backward launches module 08's kernels, as the lesson's check demands.

def autograd_forward(ctx, q, k, v, causal, sm_scale, fused):
    """FlashAttentionFunction.forward: (o, lse) from FlashAttention's forward, and on ctx
    what the backward needs (q, k, v, o, lse and the three settings)."""
    o, lse = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.sm_scale, ctx.fused = causal, sm_scale, fused
    ctx.mark_non_differentiable(lse)  # a statistic for the backward, not an output to train
    return o, lse  # the Function's outputs, as the forward's


def autograd_backward(ctx, do, dlse):
    """FlashAttentionFunction.backward: one gradient per input of forward, from the
    gradient do of o (dlse, lse's, is unused: lse is not differentiable)."""
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = flash_backward(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale, fused=ctx.fused)
    return dq, dk, dv, None, None, None  # causal, sm_scale and fused have no gradient


class FlashAttentionFunction(torch.autograd.Function):
    """The lesson's Function (the notebook builds the same): apply(q, k, v, causal,
    sm_scale, fused). Training code uses `flash_attention` (TunedAttentionFunction)."""
    forward = staticmethod(autograd_forward)
    backward = staticmethod(autograd_backward)


def attention_gradients(q, k, v, do, causal=False, sm_scale=None, fused=False):
    """One forward and backward through FlashAttentionFunction, as a training step makes
    them, on leaf copies of q, k, v: returns (o, lse, dq, dk, dv) for the gradient do of o."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o, lse = FlashAttentionFunction.apply(q, k, v, causal, sm_scale, fused)
    o.backward(do)
    return o.detach(), lse, q.grad, k.grad, v.grad


# Forward + backward TFLOPS measured on an H100 (80GB HBM3), solutions/PERF.md, "## Backward",
# "Final: fwd+bwd through the public API": fp16, H = 16, B * N = 16384, 3.5 x 4 B H N^2 D
# operations per step (the backward does 2.5x the forward's matrix products), half of that
# when causal; `flash_attention(q, k, v, causal)[0].backward(do)` with the separate dQ
# kernel and with the fused one (atomic dQ), against PyTorch's FlashAttention-2 backend.
H100_TRAIN_SEQ_LENS = (1024, 4096, 16384)
H100_TRAIN_TFLOPS = {  # (head dim D, causal): {implementation: TFLOPS at each length}
    (64, False): {"dQ kernel": (267, 316, 343), "fused, atomic dQ": (232, 298, 320),
                  "sdpa-flash": (202, 267, 288)},
    (64, True): {"dQ kernel": (178, 273, 311), "fused, atomic dQ": (166, 278, 338),
                 "sdpa-flash": (136, 220, 273)},
    (128, False): {"dQ kernel": (278, 371, 373), "fused, atomic dQ": (256, 348, 378),
                   "sdpa-flash": (220, 293, 321)},
    (128, True): {"dQ kernel": (187, 294, 349), "fused, atomic dQ": (162, 253, 316),
                  "sdpa-flash": (155, 251, 300)},
}

# The trade-off question of module 08 (see the lesson for the options).
fused_tradeoff_answer = "c"
