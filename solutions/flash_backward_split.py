"""The backward for head dims that are not a power of two, in two column blocks.

Module 08's kernels (`solutions/flash_backward.py`) pad the head dim to the next power of
two, because `tl.arange` needs one: at D = 160 and 192 they compute 256 columns, 60% and
33% more products than the real ones, in 256-wide fp32 accumulators that force small
tiles. The tuned forward already splits such head dims into two power-of-two column
blocks (`flash_tuned.column_blocks`: 160 = 128 + 32, 192 = 128 + 64, 96 = 64 + 32);
these kernels do the same for the backward. Every product over the head dim becomes two
products that add into one tile, every product along it becomes two:
    S  = Q1 K1^T + Q2 K2^T          dP = dO1 V1^T + dO2 V2^T
    dV = [P^T dO1, P^T dO2]         dK = scale * [dS^T Q1, dS^T Q2]
    dQ = scale * [dS K1, dS K2]     delta = rowsum(dO1 * O1) + rowsum(dO2 * O2)
The walks over blocks (module 08's `_dkdv_stages` and `_dq_stages`: causal ranges,
unmasked middle, ragged edges), the autotuning, the contract and the launch order are
module 08's unfused path: the dQ kernel first (it also stores delta), then the dK/dV
kernel. `flash_backward._backward` sends split head dims here.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton
import triton.language as tl

from solutions import flash_tuned
from solutions.flash_backward import (LOG2E_C, _autotuned, _dkdv_stages, _dq_stages, _launcher,
                                      _load_rows, _row_delta)
from solutions.flash_forward import dot_precision


@triton.jit
def _rows_split(base, offs_rows, stride_rows, offs_d, offs_d2, n_rows,
                HEAD_DIM: tl.constexpr, WIDTH: tl.constexpr, CHECK_ROWS: tl.constexpr):
    """The two column blocks of a tile of rows: the first lies inside the head dim (no
    column mask), the second ends at WIDTH = BLOCK_D + BLOCK_D2 (masked where > HEAD_DIM)."""
    a = _load_rows(base, offs_rows, stride_rows, offs_d, n_rows, HEAD_DIM, HEAD_DIM, CHECK_ROWS)
    b = _load_rows(base, offs_rows, stride_rows, offs_d2, n_rows, HEAD_DIM, WIDTH, CHECK_ROWS)
    return a, b


@triton.jit
def _store_split(base, offs_rows, n_rows, x, x2, offs_d, offs_d2, HEAD_DIM: tl.constexpr):
    """Store two column blocks of a contiguous [rows, HEAD_DIM] tensor, in its dtype."""
    row_ok = offs_rows[:, None] < n_rows
    ptrs = base + offs_rows[:, None] * HEAD_DIM
    tl.store(ptrs + offs_d[None, :], x.to(base.dtype.element_ty), mask=row_ok)
    tl.store(ptrs + offs_d2[None, :], x2.to(base.dtype.element_ty),
             mask=row_ok & (offs_d2[None, :] < HEAD_DIM))


@triton.jit
def _dkdv_q_blocks_split(
    dk, dk2, dv, dv2, k, k2, v, v2, Q, DO, LSE, DELTA, stride_qn,
    offs_n, offs_d, offs_d2, lo, hi, N_Q, N_K, qk_scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, WIDTH: tl.constexpr,
    BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Module 08's `_dkdv_q_blocks` (query blocks [lo, hi) into this KV block's dK, dV,
    transposed scores) with every tile in two column blocks."""
    offs_m0 = tl.arange(0, BLOCK_M)
    # As in module 08, the masked loops unpipelined, but only up to width 128: beyond, that
    # costs more registers than it saves (H100, PERF.md 3i).
    for start_m in tl.range(lo, hi, BLOCK_M, num_stages=1 if MASK and WIDTH <= 128 else None):
        offs_m = start_m + offs_m0
        q, q2 = _rows_split(Q, offs_m, stride_qn, offs_d, offs_d2, N_Q, HEAD_DIM, WIDTH, MASK)
        do, do2 = _rows_split(DO, offs_m, HEAD_DIM, offs_d, offs_d2, N_Q, HEAD_DIM, WIDTH, MASK)
        if MASK:
            lse = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0)
            delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
        else:
            lse = tl.load(LSE + offs_m)
            delta = tl.load(DELTA + offs_m)
        qkT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION)
        qkT = tl.dot(k2, tl.trans(q2), qkT, input_precision=DOT_PRECISION)
        pT = tl.math.exp2(qkT * qk_scale - (lse * LOG2E_C)[None, :])
        if MASK:
            keep = (offs_m[None, :] < N_Q) & (offs_n[:, None] < N_K)
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            pT = tl.where(keep, pT, 0.0)
        pT_op = pT.to(do.dtype)
        dv = tl.dot(pT_op, do, dv, input_precision=DOT_PRECISION)
        dv2 = tl.dot(pT_op, do2, dv2, input_precision=DOT_PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dpT = tl.dot(v2, tl.trans(do2), dpT, input_precision=DOT_PRECISION)
        dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk, input_precision=DOT_PRECISION)
        dk2 = tl.dot(dsT, q2, dk2, input_precision=DOT_PRECISION)
    return dk, dk2, dv, dv2


@triton.jit(do_not_specialize=["N_Q", "N_K"])
def bwd_dkdv_split_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    H, H_KV, N_Q, N_K, sm_scale,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Module 08's `bwd_dkdv_kernel` (unfused), head dim in two column blocks: program
    (j, b * H_KV + h_kv) computes dK and dV of keys j*BLOCK_N ... of one K/V head."""
    WIDTH: tl.constexpr = BLOCK_D + BLOCK_D2
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H_KV).to(tl.int64)
    h_kv = pid_bh % H_KV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
    k, k2 = _rows_split(K + b * stride_kb + h_kv * stride_kh, offs_n, stride_kn, offs_d, offs_d2,
                        N_K, HEAD_DIM, WIDTH, True)
    v, v2 = _rows_split(V + b * stride_vb + h_kv * stride_vh, offs_n, stride_vn, offs_d, offs_d2,
                        N_K, HEAD_DIM, WIDTH, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dk2 = tl.zeros([BLOCK_N, BLOCK_D2], dtype=tl.float32)
    dv2 = tl.zeros([BLOCK_N, BLOCK_D2], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E_C

    lo, diag_end, full_end = _dkdv_stages(start_n, N_Q, N_K, CAUSAL, BLOCK_M, BLOCK_N)
    # Module 08's diagonal in half-height steps and its stage order: with both, ptxas
    # serializes no wgmma here either (with the order alone, widths 144-192 were; PERF.md 3i).
    DIAG_M: tl.constexpr = BLOCK_M // 2 if CAUSAL and BLOCK_M >= 32 else BLOCK_M
    if CAUSAL:
        lo2, hi2, lo3, hi3 = full_end, N_Q, diag_end, full_end
    else:
        lo2, hi2, lo3, hi3 = diag_end, full_end, full_end, N_Q
    for g in range(GROUP):  # GQA: the query heads sharing this K/V head add up here
        h = h_kv * GROUP + g
        q_base = Q + b * stride_qb + h * stride_qh
        rows = (b * H + h) * N_Q
        do_base, lse_base, delta_base = DO + rows * HEAD_DIM, LSE + rows, DELTA + rows
        dk, dk2, dv, dv2 = _dkdv_q_blocks_split(
            dk, dk2, dv, dv2, k, k2, v, v2, q_base, do_base, lse_base, delta_base,
            stride_qn, offs_n, offs_d, offs_d2, lo, diag_end, N_Q, N_K, qk_scale,
            True, CAUSAL, HEAD_DIM, WIDTH, DIAG_M, DOT_PRECISION)
        dk, dk2, dv, dv2 = _dkdv_q_blocks_split(
            dk, dk2, dv, dv2, k, k2, v, v2, q_base, do_base, lse_base, delta_base,
            stride_qn, offs_n, offs_d, offs_d2, lo2, hi2, N_Q, N_K, qk_scale,
            CAUSAL, CAUSAL, HEAD_DIM, WIDTH, BLOCK_M, DOT_PRECISION)
        dk, dk2, dv, dv2 = _dkdv_q_blocks_split(
            dk, dk2, dv, dv2, k, k2, v, v2, q_base, do_base, lse_base, delta_base,
            stride_qn, offs_n, offs_d, offs_d2, lo3, hi3, N_Q, N_K, qk_scale,
            not CAUSAL, CAUSAL, HEAD_DIM, WIDTH, BLOCK_M, DOT_PRECISION)

    out = pid_bh.to(tl.int64) * N_K * HEAD_DIM
    _store_split(DK + out, offs_n, N_K, dk * sm_scale, dk2 * sm_scale, offs_d, offs_d2, HEAD_DIM)
    _store_split(DV + out, offs_n, N_K, dv, dv2, offs_d, offs_d2, HEAD_DIM)


@triton.jit
def _dq_kv_blocks_split(
    dq, dq2, q, q2, do, do2, lse2, delta, K, V, stride_kn, stride_vn,
    offs_m, offs_d, offs_d2, lo, hi, N_K, qk_scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, WIDTH: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Module 08's `_dq_kv_blocks` (KV blocks [lo, hi) into this query block's dQ,
    unscaled) with every tile in two column blocks."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k, k2 = _rows_split(K, offs_n, stride_kn, offs_d, offs_d2, N_K, HEAD_DIM, WIDTH, MASK)
        v, v2 = _rows_split(V, offs_n, stride_vn, offs_d, offs_d2, N_K, HEAD_DIM, WIDTH, MASK)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        s = tl.dot(q2, tl.trans(k2), s, input_precision=DOT_PRECISION)
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASK:
            keep = offs_n[None, :] < N_K
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        dp = tl.dot(do2, tl.trans(v2), dp, input_precision=DOT_PRECISION)
        ds = (p * (dp - delta[:, None])).to(k.dtype)
        dq = tl.dot(ds, k, dq, input_precision=DOT_PRECISION)
        dq2 = tl.dot(ds, k2, dq2, input_precision=DOT_PRECISION)
    return dq, dq2


@triton.jit(do_not_specialize=["N_Q", "N_K"])
def bwd_dq_split_kernel(
    Q, K, V, DO, O, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    H, N_Q, N_K, sm_scale,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Module 08's `bwd_dq_kernel`, head dim in two column blocks: program (i, b * H + h)
    computes dQ of query rows i*BLOCK_M ... and stores their delta for the dK/dV kernel."""
    WIDTH: tl.constexpr = BLOCK_D + BLOCK_D2
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # longest rows first
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    h_kv = h // GROUP
    rows = pid_bh.to(tl.int64) * N_Q
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
    q, q2 = _rows_split(Q + b * stride_qb + h * stride_qh, offs_m, stride_qn, offs_d, offs_d2,
                        N_Q, HEAD_DIM, WIDTH, True)
    do, do2 = _rows_split(DO + rows * HEAD_DIM, offs_m, HEAD_DIM, offs_d, offs_d2, N_Q,
                          HEAD_DIM, WIDTH, True)
    o, o2 = _rows_split(O + rows * HEAD_DIM, offs_m, HEAD_DIM, offs_d, offs_d2, N_Q,
                        HEAD_DIM, WIDTH, True)
    row_ok = offs_m < N_Q
    delta = _row_delta(o, do) + _row_delta(o2, do2)
    tl.store(DELTA + rows + offs_m, delta, mask=row_ok)
    lse2 = tl.load(LSE + rows + offs_m, mask=row_ok, other=0.0) * LOG2E_C
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq2 = tl.zeros([BLOCK_M, BLOCK_D2], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E_C

    full_end, hi = _dq_stages(start_m, N_K, CAUSAL, BLOCK_M, BLOCK_N)
    k_base = K + b * stride_kb + h_kv * stride_kh
    v_base = V + b * stride_vb + h_kv * stride_vh
    dq, dq2 = _dq_kv_blocks_split(dq, dq2, q, q2, do, do2, lse2, delta, k_base, v_base,
                                  stride_kn, stride_vn, offs_m, offs_d, offs_d2, 0, full_end,
                                  N_K, qk_scale, False, CAUSAL, HEAD_DIM, WIDTH, BLOCK_N,
                                  DOT_PRECISION)
    dq, dq2 = _dq_kv_blocks_split(dq, dq2, q, q2, do, do2, lse2, delta, k_base, v_base,
                                  stride_kn, stride_vn, offs_m, offs_d, offs_d2, full_end, hi,
                                  N_K, qk_scale, True, CAUSAL, HEAD_DIM, WIDTH, BLOCK_N,
                                  DOT_PRECISION)
    _store_split(DQ + rows * HEAD_DIM, offs_m, N_Q, dq * sm_scale, dq2 * sm_scale, offs_d,
                 offs_d2, HEAD_DIM)


# ---------------------------------------------------------------------------------------
# Launch configurations, (BLOCK_M, BLOCK_N, num_warps, num_stages) best first, per class
# of tile width (BLOCK_D + BLOCK_D2: 48, 80, 96 in the 128 class, 144-192 in the 192
# class), from a sweep on an H200 (solutions/PERF.md, "3e. The backward in two column blocks");
# the dK/dV lists reordered from H100 timings after the loop order (3i).

SHORTLIST = {
    "dkdv": {128: [(64, 64, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2)],
             192: [(32, 128, 8, 2), (32, 64, 4, 2), (64, 128, 8, 2)]},
    "dq": {128: [(64, 64, 4, 3), (128, 32, 4, 3), (64, 64, 4, 2)],
           192: [(128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 2)]},
}
FP32_SHORTLIST = {"dkdv": [(32, 64, 4, 2)], "dq": [(64, 32, 4, 2)]}  # exact fp32 dots, FMA units


def _width(args):
    return args["BLOCK_D"] + args["BLOCK_D2"]


_dkdv_tuned = _autotuned(bwd_dkdv_split_kernel, SHORTLIST["dkdv"], FP32_SHORTLIST["dkdv"], _width)
_dq_tuned = _autotuned(bwd_dq_split_kernel, SHORTLIST["dq"], FP32_SHORTLIST["dq"], _width)


def backward_split(q, k, v, o, lse, do, causal, scale, columns, config=None):
    """(dq, dk, dv) on checked inputs, as `flash_backward._backward` (unfused) makes them:
    q, k, v with the head dim contiguous, o, do and lse contiguous. columns: the
    (BLOCK_D, BLOCK_D2) of `flash_tuned.column_blocks`. config: as in
    `flash_attention_backward`."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    consts = dict(GROUP=H // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=columns[0],
                  BLOCK_D2=columns[1], DOT_PRECISION=dot_precision(q.dtype))
    delta = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    dq = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    dk = torch.empty(k.shape, device=k.device, dtype=k.dtype)
    dv = torch.empty(v.shape, device=v.device, dtype=v.dtype)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    key = (Nq, Nk, D, causal, H // Hkv, q.dtype)

    launch = _launcher(config, consts, key)
    launch(bwd_dq_split_kernel, _dq_tuned, "dq", lambda c: (flash_tuned.cdiv(Nq, c["BLOCK_M"]), B * H),
           q, k, v, do, o, lse, delta, dq, *strides, H, Nq, Nk, scale)
    launch(bwd_dkdv_split_kernel, _dkdv_tuned, "dkdv",
           lambda c: (flash_tuned.cdiv(Nk, c["BLOCK_N"]), B * Hkv),
           q, k, v, do, lse, delta, dk, dv, *strides, H, Hkv, Nq, Nk, scale)
    return dq, dk, dv
