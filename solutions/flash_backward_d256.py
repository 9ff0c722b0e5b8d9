"""The dK/dV kernel at head dim 256, with the scores queries-along-rows.

Module 08's dK/dV kernel (`solutions/flash_backward.py`) computes the transposed scores
S^T = K Q^T, keys along the rows, so that P^T and dS^T come out of the dots in the layout
dV += P^T dO and dK += dS^T Q need. At D = 256 its tiles hold 64 keys on 8 warps (dK's and
dV's fp32 accumulators, 64 x 256 each, already take 128 registers a thread). Triton lays a
dot whose result feeds another dot out with every warp along its rows: 8 warps of 16 rows
would cover 128, so on 64 key rows both warpgroups compute the whole S^T and dP^T, 1.5x the
products the step needs (solutions/PERF.md 4c).

Here the scores go the other way: S = Q K^T over 128 query rows, so each warpgroup owns 64
of them, and the products P^T dO and dS^T Q take the transposes from shared memory. The
query tiles are twice as tall, so only one stage fits in shared memory (Q and dO, 128 x 256
fp16 each). The walk over query blocks (`_dkdv_stages`), the GQA loop and the contract are
module 08's unfused path; the causal diagonal goes in whole 128-row steps, since 64-row
steps would compute S twice again.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import triton
import triton.language as tl

from solutions.flash_backward import (FP32_SHORTLIST, LOG2E_C, _autotuned, _block_d, _dkdv_stages,
                                      _load_rows)


@triton.jit
def _dkdv_rows_q_blocks(
    dk, dv, k, v, Q, DO, LSE, DELTA, stride_qn,
    offs_n, offs_d, lo, hi, N_Q, N_K, qk_scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Add the query blocks [lo, hi) of one head to this KV block's dK and dV, with the
    scores queries-along-rows. MASK=False: blocks with no causal, ragged-row or ragged-key
    entries only."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in tl.range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        q = _load_rows(Q, offs_m, stride_qn, offs_d, N_Q, HEAD_DIM, BLOCK_D, MASK)
        do = _load_rows(DO, offs_m, HEAD_DIM, offs_d, N_Q, HEAD_DIM, BLOCK_D, MASK)
        if MASK:
            lse = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0)
            delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
        else:
            lse = tl.load(LSE + offs_m)
            delta = tl.load(DELTA + offs_m)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        p = tl.math.exp2(qk * qk_scale - (lse * LOG2E_C)[:, None])
        if MASK:
            keep = (offs_m[:, None] < N_Q) & (offs_n[None, :] < N_K)
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT_PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit(do_not_specialize=["N_Q", "N_K"])
def bwd_dkdv_rows_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    H, H_KV, N_Q, N_K, sm_scale,
    GROUP: tl.constexpr, CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Module 08's `bwd_dkdv_kernel` (unfused: delta from the dQ kernel, no DQ), with the
    query blocks walked by `_dkdv_rows_q_blocks`. Same grid, arguments and contract."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)          # over batch * K/V heads
    b = (pid_bh // H_KV).to(tl.int64)
    h_kv = pid_bh % H_KV
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    k = _load_rows(K + b * stride_kb + h_kv * stride_kh, offs_n, stride_kn, offs_d,
                   N_K, HEAD_DIM, BLOCK_D, True)
    v = _load_rows(V + b * stride_vb + h_kv * stride_vh, offs_n, stride_vn, offs_d,
                   N_K, HEAD_DIM, BLOCK_D, True)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    qk_scale = sm_scale * LOG2E_C

    lo, diag_end, full_end = _dkdv_stages(start_n, N_Q, N_K, CAUSAL, BLOCK_M, BLOCK_N)
    for g in range(GROUP):
        h = h_kv * GROUP + g
        q_base = Q + b * stride_qb + h * stride_qh
        rows = (b * H + h) * N_Q       # first row of this head in dO, lse and delta
        do_base = DO + rows * HEAD_DIM
        # The blocks without masks first, then the ragged tail, then (causal) the diagonal:
        # causal, 4-11% less time than in module 08's order (PERF.md 4d), whose
        # masked loops before this one leave it more registers spilled.
        dk, dv = _dkdv_rows_q_blocks(
            dk, dv, k, v, q_base, do_base, LSE + rows, DELTA + rows, stride_qn,
            offs_n, offs_d, diag_end, full_end, N_Q, N_K, qk_scale,
            False, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_M, DOT_PRECISION)
        dk, dv = _dkdv_rows_q_blocks(
            dk, dv, k, v, q_base, do_base, LSE + rows, DELTA + rows, stride_qn,
            offs_n, offs_d, full_end, N_Q, N_Q, N_K, qk_scale,
            True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_M, DOT_PRECISION)
        if CAUSAL:
            dk, dv = _dkdv_rows_q_blocks(
                dk, dv, k, v, q_base, do_base, LSE + rows, DELTA + rows, stride_qn,
                offs_n, offs_d, lo, diag_end, N_Q, N_K, qk_scale,
                True, CAUSAL, HEAD_DIM, BLOCK_D, BLOCK_M, DOT_PRECISION)

    dk = dk * sm_scale
    out = pid_bh.to(tl.int64) * N_K * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    mask = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=mask)


# The autotuner's list at 256 columns (BLOCK_M, BLOCK_N, num_warps, num_stages): 128 query
# rows on 8 warps, 16 rows a warp, and one stage, as much as fits in shared memory
# (213 KB); fp32 inputs take module 08's small fp32 tile.
SHORTLIST = [(128, 64, 8, 1)]
dkdv_rows_tuned = _autotuned(bwd_dkdv_rows_kernel, {256: SHORTLIST}, FP32_SHORTLIST["dkdv"], _block_d)
