"""The backward's kernels for Hopper, written in Gluon (Triton 3.6): dK/dV, and dQ.

`flash_backward._backward` runs them instead of `bwd_dkdv_kernel` and `bwd_dq_kernel`
where `flash_backward.gluon_backward_takes` says (an H100/H200, Triton 3.6, fp16/bf16,
D = 64 or 128, N_Q == N_K, contiguous [B, H, N, D] tensors on 16-byte boundaries, enough
work that the launch's host time does not bound the step): dQ first (it also stores
delta = rowsum(dO * O)), at D = 128 only (at D = 64 it read 0.86-1.10x the Triton one),
then dK/dV. On the H100 the backward read 1.04-1.13x the all-Triton one at D = 128
(PERF.md 3p), and the dK/dV kernel's in-order steps at D = 128 gained 4-14% more (3s).

Notation as in solutions/flash_backward.py: S = scale * Q K^T, P = exp(S - lse),
dV = P^T dO, dP = dO V^T, dS = P * (dP - delta), dK = scale * dS^T Q. The kernel works on
the transposed tiles (keys along rows), so P^T and dS^T come out of the products in the
register layout that the next products take as their A operand.

The schedule (the forward's, flash_gluon.py, turned around):
- A program owns 128 keys of one K/V head: two consumer warpgroups of 64 keys each,
  independent (each waits and signals on its own, so one runs its exponentials while the
  other's products run), and one producer warp. K and V stay in shared memory.
- The producer streams (Q_i, dO_i) blocks of BLOCK_M query rows by TMA into a ring of
  NUM_BUF slots, with the rows' lse (times log2(e), or over the scale at D = 128) and
  delta (plain loads, stored into the slot by the producer warp), over the GROUP query
  heads that share the K/V head, in order. A slot's ready barrier takes two arrivals (the TMA's, with its bytes, and the
  producer's after its stores); its free barrier takes one from each consumer.
- At D = 64, per block a consumer issues S^T = K Q^T and dP^T = V dO^T together, waits
  for S^T only, computes P^T while dP^T runs, issues dV += P^T dO, waits for dP^T,
  computes dS^T while dV runs, issues dK += dS^T Q. The blocks without masks go two by
  two: the first one's dV and dK products keep running while the second waits for its
  slot and issues its S^T and dP^T; the second waits for all of them (ptxas serializes
  every wgmma if one stays in flight across a loop's back edge, see `_step`).
- At D = 128 the steps run in order (`_step`'s IN_ORDER), one block at a time: S^T, then
  P^T, then dP^T with dV. Fewer tiles are live at once, so the blocks can have 64 query
  rows (with S^T and dP^T together, 64 rows spilled and 32-row blocks were slower); the
  other warpgroup's products keep the tensor cores busy while this one computes.
- A slot is freed once the products that read it have completed.
- No wait needs the forward's predicated `wait_after`: each wait follows the issue of a
  product that consumes the work before it (P^T feeds dV, dS^T feeds dK), so ptxas cannot
  hoist it above that work (the SASS has the exponentials between `DEPBAR.LE gsb0, 0x1`
  and the dV products).
- Ragged N: rows past N get lse = +inf, so P^T = 0 there (their Q and dO rows are TMA's
  zeros): the last block needs no mask. Keys past N need none either: each key's dK, dV
  row depends on that key alone, and the TMA store drops rows past N.
- Causal: the program's keys [n0, n0 + 128) see query rows >= n0 only, so the walk starts
  at row n0. A consumer with keys [k0, k0 + 64) masks the blocks that start in
  [k0, k0 + 64) (64 / BLOCK_M of them), runs the rest without masks, and skips (waits
  for, then frees) the blocks before k0 that the other consumer needs.
- GQA: K/V head kv_bh = b * H_KV + h_kv is shared by query heads kv_bh * GROUP + g; their
  blocks follow each other in the ring and add into the same dK, dV (no atomics).

The dQ kernel is the forward's schedule with the dQ products: a program owns 128 query
rows of one head (two consumer warpgroups of 64 rows; their Q and dO by TMA, once), a
producer warp streams (K_j, V_j) blocks; per block S and dP are issued together, P's
exponentials run while dP runs (the wait for dP predicated, as the forward's), then
dS = P * (dP - delta) and dQ += dS K, unmasked blocks two by two as above. Each consumer
computes its rows' delta first (plain loads of O and dO while its TMA flies). Causal: a
consumer masks the blocks crossing its diagonal and drains (waits for, frees) the tile's
blocks past it.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from solutions.flash_forward import LOG2E
from solutions.flash_gluon import descriptor, wait_after
from solutions.flash_tuned import launch_compiled

LOG2E_C = gl.constexpr(LOG2E)  # the same constant, usable inside kernels

BLOCK_N = gl.constexpr(128)  # keys per program: two consumer warpgroups of 64
KEYS = gl.constexpr(64)      # keys per consumer warpgroup (a wgmma's M per warpgroup)
# Per head dim: query rows per ring slot, ring slots, and whether a step runs its products
# in order (`_step`'s IN_ORDER). At D = 128, 64-row blocks spill unless in order, and in
# order they read 1.04-1.14x the 32-row blocks with S^T and dP^T issued together, 2 slots
# 0.98-1.06x 3 (PERF.md 3s). At D = 64: 3 slots keep the producer two blocks ahead of
# products that take ~0.5-1 us, about a TMA's latency.
BLOCK_M = {64: 64, 128: 64}
NUM_BUF = {64: 3, 128: 2}
IN_ORDER = {64: False, 128: True}
# The dQ kernel (D = 128): query rows per consumer warpgroup (a wgmma's M), and keys per
# ring block: 128 spilled 268-440 bytes and serialized the wgmma (live at a pair's peak:
# dQ [64, D] and dS in flight, S and dP [64, DQ_BLOCK_N], all fp32 but dS); ring slots.
ROWS = gl.constexpr(64)
DQ_BLOCK_N = 64
DQ_NUM_BUF = 3
# Registers per thread of the worker consumer; Triton gives the default (first) partition
# what is left of 3 x 168 (the launch's share of 64K over 12 warps): 504 - 240 - 24 = 240.
CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _producer(q_desc, do_desc, LSE, DELTA, q_ring, do_ring, lse_ring, delta_ring, ready, free, kv_bh, GROUP, lo_blk,
              n_blk, N, lse_mult, BLOCK_M: gl.constexpr, NUM_BUF: gl.constexpr):
    """(Q_i, dO_i, lse_i * lse_mult, delta_i) of blocks lo_blk .. n_blk - 1 of each query
    head of the group into the ring, position t into slot t % NUM_BUF once both consumers
    freed its previous round (a fresh barrier passes a wait for parity 1: the first round
    waits for nothing). A slot is ready after two arrivals: the TMA's (with its bytes)
    and this warp's, after it stored lse and delta."""
    rows_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    t = 0
    for g in range(GROUP):
        bh = kv_bh * GROUP + g
        for i in range(lo_blk, n_blk):
            slot = t % NUM_BUF
            # lse and delta are loaded before the wait for the slot: their latency then
            # overlaps the wait, where this warp spends its time when it is ahead.
            rows = i * BLOCK_M + gl.arange(0, BLOCK_M, layout=rows_layout)
            offs = bh * N + rows  # 32-bit offsets (the host checks B * H * N < 2^31): fewer registers in this warp
            # Rows past N: lse = +inf makes P^T = exp2(-inf) = 0 there (their Q and dO
            # rows are TMA's zeros), so the ragged last block needs no mask.
            lse2 = gl.load(LSE + offs, mask=rows < N, other=float("inf")) * lse_mult
            delta = gl.load(DELTA + offs, mask=rows < N, other=0.0)
            mbarrier.wait(free.index(slot), phase=((t // NUM_BUF) & 1) ^ 1)
            mbarrier.expect(ready.index(slot), 2 * q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [bh, i * BLOCK_M, 0], ready.index(slot), q_ring.index(slot))
            tma.async_copy_global_to_shared(do_desc, [bh, i * BLOCK_M, 0], ready.index(slot), do_ring.index(slot))
            lse_ring.index(slot).store(lse2)
            delta_ring.index(slot).store(delta)
            mbarrier.arrive(ready.index(slot))
            t += 1


@gluon.jit
def _s_and_dp(a_s, b_s, a_dp, b_dp, s_layout: gl.constexpr):
    """The scores a_s b_s and dP = a_dp b_dp issued together (not awaited; they complete
    in order), fp32 in s_layout. Both kernels' steps start so (dK/dV: S^T = K Q^T,
    dP^T = V dO^T; dQ: S = Q K^T, dP = dO V^T)."""
    shape: gl.constexpr = [a_s.shape[0], b_s.shape[1]]
    s = warpgroup_mma(a_s, b_s, gl.zeros(shape, gl.float32, s_layout), use_acc=False, is_async=True)
    dp = warpgroup_mma(a_dp, b_dp, gl.zeros(shape, gl.float32, s_layout), use_acc=False, is_async=True)
    return s, dp


@gluon.jit
def _barriers(NUM_BUF: gl.constexpr, READY: gl.constexpr):
    """Both kernels' barriers: one per consumer for the tiles it loads once (one arrival),
    and the ring's, per slot: ready (READY arrivals) and free (one from each consumer)."""
    own = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(own.index(i), count=1)
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(i), count=READY)
        mbarrier.init(free.index(i), count=2)
    return own, ready, free


@gluon.jit
def _skip(t, ready, free, NUM_BUF: gl.constexpr):
    """Position t, which this consumer does not need (dK/dV, causal: rows before its keys;
    dQ: blocks past its diagonal or its rows): wait for it (so that the free arrival
    counts for this round), then free it."""
    mbarrier.wait(ready.index(t % NUM_BUF), phase=(t // NUM_BUF) & 1)
    mbarrier.arrive(free.index(t % NUM_BUF))


@gluon.jit
def _rows_start(rows, KEYS: gl.constexpr, BLOCK_M: gl.constexpr, s_layout: gl.constexpr):
    """An accumulator's start in IN_ORDER steps: minus a slot's row values, along the keys."""
    return gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout) - rows.load(gl.SliceLayout(0, s_layout))[None, :]


@gluon.jit
def _step(t, k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring, ready, free, dk, dv, qk_scale,
          DIAG: gl.constexpr, BLOCK_M: gl.constexpr, NUM_BUF: gl.constexpr, IN_ORDER: gl.constexpr,
          s_layout: gl.constexpr, p_layout: gl.constexpr, AFTER: gl.constexpr = False,
          BEFORE: gl.constexpr = False):
    """Position t of the ring: adds its block's part into dK and dV (K and V tiles in
    shared memory, the products' A operand). DIAG >= 0: the block crosses this
    consumer's diagonal (causal) and starts DIAG rows after its first key; -1: no mask.
    BEFORE: returns with its dK and dV products still running (and its slot not freed),
    for the next step, called with AFTER, to retire them with its S^T.
    IN_ORDER (the fewest live registers, what lets 64-row blocks fit at D = 128): S^T
    alone, then P^T, then dP^T with dV, so S^T's and dP^T's fp32 tiles are never live
    together (P^T's exponentials no longer run under this warpgroup's dP^T; the other
    warpgroup's products fill the tensor cores). S^T's accumulator starts at -lse / scale
    and dP^T's at -delta (the slot holds lse / scale), so the products give
    (S - lse) / scale and dP - delta, and the rows' lse and delta need no registers
    beside the tiles; dS^T takes P^T as rounded for dV, whose fp32 registers are then
    free before dP^T's wait."""
    dtype: gl.constexpr = q_ring.dtype
    HEAD_D: gl.constexpr = q_ring.shape[3]
    cols: gl.constexpr = gl.SliceLayout(0, s_layout)  # query rows run along the columns
    slot = t % NUM_BUF
    mbarrier.wait(ready.index(slot), phase=(t // NUM_BUF) & 1)
    q = q_ring.index(slot).reshape([BLOCK_M, HEAD_D])
    do = do_ring.index(slot).reshape([BLOCK_M, HEAD_D])
    if IN_ORDER:
        s = warpgroup_mma(k_tile, q.permute((1, 0)), _rows_start(lse_ring.index(slot), KEYS, BLOCK_M, s_layout),
                          is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        x = s * qk_scale  # (K Q^T - lse / scale) * scale * log2(e)
    else:
        s, dp = _s_and_dp(k_tile, q.permute((1, 0)), v_tile, do.permute((1, 0)), s_layout)
        if AFTER:  # in order: the previous block's dV and dK, then S^T; dP^T may still run
            s, dk, dv = warpgroup_mma_wait(num_outstanding=1, deps=(s, dk, dv))
            mbarrier.arrive(free.index((t + NUM_BUF - 1) % NUM_BUF))
        else:
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))  # dP^T may still run
        # lse and delta from shared memory just before their use: as loads into registers
        # at the top of the step they held 2 * BLOCK_M / 4 registers across the products.
        x = s * qk_scale - lse_ring.index(slot).load(cols)[None, :]  # lse * log2(e), stored so
    if DIAG >= 0:  # query row i sees keys j <= i: m0 + c >= k0 + r, m0 = k0 + DIAG
        c = gl.arange(0, BLOCK_M, layout=cols) + DIAG
        r = gl.arange(0, KEYS, layout=gl.SliceLayout(1, s_layout))
        x = gl.where(c[None, :] >= r[:, None], x, float("-inf"))
    p = gl.exp2(x)
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    if IN_ORDER:
        p = gl.convert_layout(p16, s_layout).to(gl.float32)
        dp = warpgroup_mma(v_tile, do.permute((1, 0)), _rows_start(delta_ring.index(slot), KEYS, BLOCK_M, s_layout),
                           is_async=True)
        dv = warpgroup_mma(p16, do, dv, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp, ))  # dV may still run
        ds = p * dp  # dp holds dP^T - delta
    else:
        dv = warpgroup_mma(p16, do, dv, is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=1, deps=(dp, ))  # dV may still run
        ds = p * (dp - delta_ring.index(slot).load(cols)[None, :])
    dk = warpgroup_mma(gl.convert_layout(ds.to(dtype), p_layout), q, dk, is_async=True)
    # No product stays in flight across a loop's back edge: that made ptxas serialize every
    # wgmma of the kernel (its advisory C7512, "insufficient register resources", at any
    # register limit). Within a loop body (BEFORE, then AFTER) it does not.
    if not BEFORE:
        dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
        mbarrier.arrive(free.index(slot))
    return dk, dv


@gluon.jit
def _consumer(k_desc, v_desc, dk_desc, dv_desc, k_smem, v_smem, kv_bar, q_ring, do_ring, lse_ring, delta_ring, ready,
              free, kv_bh, GROUP, k0, lo_blk, n_blk, N, sm_scale, qk_scale,
              CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr,
              IN_ORDER: gl.constexpr, WG: gl.constexpr, num_warps: gl.constexpr):
    """One warpgroup (WG 0 or 1 of the program, k0 = n0 + 64 WG): dK and dV of keys
    k0 .. k0 + 63 of K/V head kv_bh, over the ring's blocks lo_blk .. n_blk - 1 of each
    query head of the group."""
    dtype: gl.constexpr = k_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_bh, k0, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [kv_bh, k0, 0], kv_bar, v_smem)
    k_tile = k_smem.reshape([KEYS, HEAD_D])
    v_tile = v_smem.reshape([KEYS, HEAD_D])

    # The blocks of each head: [skip, masked, plain). Causal: rows before k0 see none of
    # these keys; the 64 rows from k0 cross the diagonal.
    nb = n_blk - lo_blk
    if CAUSAL:
        # k0 - lo_blk * BLOCK_M = 64 WG (n0 is a multiple of 128): the skip count is a
        # constant but at the sequence's end, fewer live scalars than computing it from k0
        # (at D = 128 those spilled around the loops).
        n_skip = gl.minimum(nb, WG * KEYS // BLOCK_M)
        n_mask = gl.minimum(KEYS // BLOCK_M, nb - n_skip)
    else:
        n_skip = 0
        n_mask = 0
    n_plain = nb - n_skip - n_mask

    mbarrier.wait(kv_bar, phase=0)
    dk = gl.zeros([KEYS, HEAD_D], gl.float32, acc_layout)
    dv = gl.zeros([KEYS, HEAD_D], gl.float32, acc_layout)
    for g in range(GROUP):
        # The ring position from g rather than carried across heads, and k0, kv_bh from the
        # program id again at the end: fewer scalars live around the loops (at D = 128
        # they spilled 24 bytes with GROUP a run-time value).
        t = g * nb
        if CAUSAL:
            for i in range(n_skip):
                _skip(t, ready, free, NUM_BUF)
                t += 1
            # The diagonal blocks, unrolled: each one's mask is then known at compile time
            # but for the thread's position (fewer registers than comparing row numbers).
            for i in gl.static_range(KEYS // BLOCK_M):
                if i < n_mask:
                    dk, dv = _step(t, k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring, ready, free, dk, dv,
                                   qk_scale, i * BLOCK_M, BLOCK_M, NUM_BUF, IN_ORDER, s_layout, p_layout)
                    t += 1
        if IN_ORDER:
            n_single = n_plain
        else:  # the plain blocks two by two: the first one's dK, dV run under the second's start
            for i in range(n_plain // 2):
                dk, dv = _step(t, k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring, ready, free, dk, dv,
                               qk_scale, -1, BLOCK_M, NUM_BUF, IN_ORDER, s_layout, p_layout, False, True)
                dk, dv = _step(t + 1, k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring, ready, free, dk, dv,
                               qk_scale, -1, BLOCK_M, NUM_BUF, IN_ORDER, s_layout, p_layout, True, False)
                t += 2
            n_single = n_plain % 2
        for i in range(n_single):
            dk, dv = _step(t, k_tile, v_tile, q_ring, do_ring, lse_ring, delta_ring, ready, free, dk, dv,
                           qk_scale, -1, BLOCK_M, NUM_BUF, IN_ORDER, s_layout, p_layout)
            t += 1

    k0 = gl.program_id(0) * BLOCK_N + WG * KEYS
    kv_bh = gl.program_id(1)
    if k0 < N:  # rows past N are dropped by the store; a block wholly past N is not stored
        # K's and V's buffers stage dK and dV: every product that read them has completed.
        k_tile.store((dk * sm_scale).to(dtype))  # dK = scale * dS^T Q
        v_tile.store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, [kv_bh, k0, 0], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [kv_bh, k0, 0], v_smem)
        tma.store_wait(pendings=0)


# N is not specialized (flash_gluon.py: a constant 1 folds the loop bounds away).
@gluon.jit(do_not_specialize=["N"])
def bwd_dkdv_kernel(q_desc, do_desc, k_desc, v_desc, dk_desc, dv_desc, LSE, DELTA, N, GROUP, sm_scale, qk_scale,
                    lse_mult, BLOCK_M: gl.constexpr, HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr,
                    CAUSAL: gl.constexpr, IN_ORDER: gl.constexpr, num_warps: gl.constexpr):
    """Program (j, kv_bh): dK and dV of keys [128 j, 128 (j + 1)) of K/V head kv_bh of
    [B * H_KV, N, D]; two consumer warpgroups of 64 keys and a producer warp."""
    dtype: gl.constexpr = q_desc.dtype
    n0 = gl.program_id(0) * BLOCK_N  # causal: the lowest keys see the most rows; they start first
    kv_bh = gl.program_id(1)
    n_blk = (N + BLOCK_M - 1) // BLOCK_M
    if CAUSAL:
        lo_blk = n0 // BLOCK_M  # rows before n0 see none of these keys
    else:
        lo_blk = n0 * 0  # a tensor, as the partitions' arguments must be

    k_smem = gl.allocate_shared_memory(dtype, [2, 1, KEYS, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, 1, KEYS, HEAD_D], v_desc.layout)
    q_ring = gl.allocate_shared_memory(dtype, [NUM_BUF, 1, BLOCK_M, HEAD_D], q_desc.layout)
    do_ring = gl.allocate_shared_memory(dtype, [NUM_BUF, 1, BLOCK_M, HEAD_D], do_desc.layout)
    row_smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # as the barriers: indexed to 1-D rows
    lse_ring = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BLOCK_M], row_smem)
    delta_ring = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BLOCK_M], row_smem)
    kv_bars, ready, free = _barriers(NUM_BUF, 2)  # ready: the TMA's arrival and the producer's

    gl.warp_specialize([
        (_consumer, (k_desc, v_desc, dk_desc, dv_desc, k_smem.index(0), v_smem.index(0), kv_bars.index(0),
                     q_ring, do_ring, lse_ring, delta_ring, ready, free, kv_bh, GROUP, n0, lo_blk, n_blk, N, sm_scale,
                     qk_scale,
                     CAUSAL, BLOCK_M, HEAD_D, NUM_BUF, IN_ORDER, 0, num_warps)),
        (_consumer, (k_desc, v_desc, dk_desc, dv_desc, k_smem.index(1), v_smem.index(1), kv_bars.index(1),
                     q_ring, do_ring, lse_ring, delta_ring, ready, free, kv_bh, GROUP, n0 + KEYS, lo_blk, n_blk, N,
                     sm_scale, qk_scale,
                     CAUSAL, BLOCK_M, HEAD_D, NUM_BUF, IN_ORDER, 1, num_warps)),
        (_producer, (q_desc, do_desc, LSE, DELTA, q_ring, do_ring, lse_ring, delta_ring, ready, free, kv_bh, GROUP,
                     lo_blk, n_blk, N, lse_mult, BLOCK_M, NUM_BUF)),
    ], [num_warps, 1], [CONSUMER_REGS, 24])


def dkdv(q, k, v, do, lse, delta, dk, dv, causal, scale):
    """Write dK, dV (k's shape and dtype) of attention of q [B, H, N, D] over k, v
    [B, H_KV, N, D], given dO (q's shape), lse and delta [B, H, N] fp32 (natural-log lse
    of the forward; delta = rowsum(dO * O)). All contiguous, 16-byte aligned, fp16 or
    bf16, D 64 or 128, B * H * N < 2^31: `flash_backward.gluon_backward_takes` checks that."""
    B, H, N, D = q.shape
    H_KV = k.shape[1]
    block_m = BLOCK_M[D]
    grid = ((N + BLOCK_N.value - 1) // BLOCK_N.value, B * H_KV)
    keys = KEYS.value
    in_order = IN_ORDER[D]
    launch_compiled(bwd_dkdv_kernel, q.device, grid, descriptor(q, block_m), descriptor(do, block_m),
                    descriptor(k, keys), descriptor(v, keys), descriptor(dk, keys), descriptor(dv, keys), lse, delta,
                    N, H // H_KV, scale, scale * LOG2E, 1.0 / scale if in_order else LOG2E,  # the ring's lse: see _step
                    BLOCK_M=block_m, HEAD_D=D, NUM_BUF=NUM_BUF[D], CAUSAL=bool(causal), IN_ORDER=in_order, num_warps=4)


# ---------------------------------------------------------------------------------------
# dQ

@gluon.jit
def _dq_producer(k_desc, v_desc, k_ring, v_ring, ready, free, kv_bh, n_tile,
                 BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
    """K and V blocks 0 .. n_tile - 1 of K/V head kv_bh, block j into slot j % NUM_BUF
    once both consumers freed the slot's previous round (a fresh barrier passes a wait for
    parity 1: the first round waits for nothing)."""
    for j in range(n_tile):
        slot = j % NUM_BUF
        mbarrier.wait(free.index(slot), phase=((j // NUM_BUF) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_bh, j * BLOCK_N, 0], ready.index(slot), k_ring.index(slot))
        tma.async_copy_global_to_shared(v_desc, [kv_bh, j * BLOCK_N, 0], ready.index(slot), v_ring.index(slot))


@gluon.jit
def _dq_step(j, q_t, do_t, k_ring, v_ring, ready, free, dq, lse2, delta, q_start, N, qk_scale,
             MASK: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr,
             s_layout: gl.constexpr, ds_layout: gl.constexpr, AFTER: gl.constexpr = False,
             BEFORE: gl.constexpr = False):
    """Key block j (slot j % NUM_BUF) into dQ (unscaled). MASK: keys past N, and causal keys
    after each row, get P = 0. BEFORE: returns with its dQ product in flight and its slot
    not freed, for the next step, called with AFTER, to retire them with its S."""
    dtype: gl.constexpr = q_t.dtype
    HEAD_D: gl.constexpr = q_t.shape[1]
    BLOCK_M: gl.constexpr = q_t.shape[0]
    slot = j % NUM_BUF
    mbarrier.wait(ready.index(slot), phase=(j // NUM_BUF) & 1)
    k = k_ring.index(slot).reshape([BLOCK_N, HEAD_D])
    v = v_ring.index(slot).reshape([BLOCK_N, HEAD_D])
    s, dp = _s_and_dp(q_t, k.permute((1, 0)), do_t, v.permute((1, 0)), s_layout)
    if AFTER:  # in order: the previous block's dQ, then S; dP may still run
        s, dq = warpgroup_mma_wait(num_outstanding=1, deps=(s, dq))
        mbarrier.arrive(free.index((j + NUM_BUF - 1) % NUM_BUF))
    else:
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
    x = s * qk_scale - lse2[:, None]
    if MASK:
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = cols[None, :] < N
        if CAUSAL:
            rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            keep = keep & (cols[None, :] <= rows[:, None])
        x = gl.where(keep, x, float("-inf"))
    p = gl.exp2(x)
    # the wait for dP predicated (flash_gluon.py's `wait_after`): unpredicated, ptxas
    # hoisted it above all but 2-16 of the block's exponentials (sm_90a SASS)
    delta, dp = wait_after(delta, (dp, ))
    ds = p * (dp - delta[:, None])
    dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), ds_layout), k, dq, is_async=True)
    if not BEFORE:
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
        mbarrier.arrive(free.index(slot))
    return dq


@gluon.jit
def _dq_consumer(q_desc, do_desc, dq_desc, O, DO, LSE, DELTA, q_smem, do_smem, q_bar, k_ring, v_ring, ready,
                 free, bh, q_start, n_tile, N, sm_scale, qk_scale, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
                 HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr, num_warps: gl.constexpr):
    """One warpgroup: dQ and delta of rows q_start .. q_start + 63 of head bh, over the
    tile's key blocks 0 .. n_tile - 1 in the ring."""
    dtype: gl.constexpr = q_desc.dtype
    BLOCK_M: gl.constexpr = ROWS
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, HEAD_D, 16])
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh, q_start, 0], q_bar, q_smem)
    tma.async_copy_global_to_shared(do_desc, [bh, q_start, 0], q_bar, do_smem)

    # delta = rowsum(dO * O) of these rows while the copies fly (dO read again by plain
    # loads: a [64, D] tile, in L2 after the TMA's read or about to be)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [256 // HEAD_D, HEAD_D // 8], [num_warps, 1], [1, 0])
    r = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
    c = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, ld_layout))
    offs = (bh.to(gl.int64) * N + r)[:, None] * HEAD_D + c[None, :]
    ld_mask = (r[:, None] < N) & (c[None, :] < HEAD_D)
    o = gl.load(O + offs, mask=ld_mask, other=0.0).to(gl.float32)
    do = gl.load(DO + offs, mask=ld_mask, other=0.0).to(gl.float32)
    delta = gl.sum(o * do, axis=1)
    gl.store(DELTA + bh * N + r, delta, mask=r < N)  # 32-bit: the host checks B * H * N < 2^31
    delta = gl.convert_layout(delta, rows_layout)
    rows = q_start + gl.arange(0, BLOCK_M, layout=rows_layout)
    # rows past N: lse = +inf makes P = 0 there (their Q and dO are TMA's zeros)
    lse2 = gl.load(LSE + bh * N + rows, mask=rows < N, other=float("inf")) * LOG2E_C

    # The key blocks: [0, n_full) without masks, [n_full, n_mine) masked, [n_mine, n_tile)
    # drained (causal: past this consumer's diagonal; every block when its rows all lie
    # past N).
    n_all = (N + BLOCK_N - 1) // BLOCK_N
    if CAUSAL:
        n_mine = gl.minimum(n_all, (q_start + BLOCK_M + BLOCK_N - 1) // BLOCK_N)
        n_full = gl.minimum((q_start + 1) // BLOCK_N, N // BLOCK_N)
    else:
        n_mine = n_all
        n_full = N // BLOCK_N
    has_rows = q_start < N
    n_mine = gl.where(has_rows, n_mine, 0)
    n_full = gl.where(has_rows, n_full, 0)

    q_t = q_smem.reshape([BLOCK_M, HEAD_D])
    do_t = do_smem.reshape([BLOCK_M, HEAD_D])
    mbarrier.wait(q_bar, phase=0)
    dq = gl.zeros([BLOCK_M, HEAD_D], gl.float32, acc_layout)
    for i in range(n_full // 2):  # the first block's dQ product runs under the second one's start
        dq = _dq_step(2 * i, q_t, do_t, k_ring, v_ring, ready, free, dq, lse2, delta, q_start, N, qk_scale,
                      False, CAUSAL, BLOCK_N, NUM_BUF, s_layout, ds_layout, False, True)
        dq = _dq_step(2 * i + 1, q_t, do_t, k_ring, v_ring, ready, free, dq, lse2, delta, q_start, N, qk_scale,
                      False, CAUSAL, BLOCK_N, NUM_BUF, s_layout, ds_layout, True, False)
    for j in range(n_full - n_full % 2, n_full):
        dq = _dq_step(j, q_t, do_t, k_ring, v_ring, ready, free, dq, lse2, delta, q_start, N, qk_scale,
                      False, CAUSAL, BLOCK_N, NUM_BUF, s_layout, ds_layout)
    for j in range(n_full, n_mine):
        dq = _dq_step(j, q_t, do_t, k_ring, v_ring, ready, free, dq, lse2, delta, q_start, N, qk_scale,
                      True, CAUSAL, BLOCK_N, NUM_BUF, s_layout, ds_layout)

    if has_rows:  # Q's buffer stages dQ: every product that read it has completed
        q_t.store((dq * sm_scale).to(dtype))  # dQ = scale * dS K
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [bh, q_start, 0], q_smem)  # rows past N are dropped
    for j in range(n_mine, n_tile):
        _skip(j, ready, free, NUM_BUF)
    tma.store_wait(pendings=0)  # before the program ends and its shared memory goes


# N and GROUP are not specialized (flash_gluon.py: a constant 1 folds the loop bounds away).
@gluon.jit(do_not_specialize=["N", "GROUP"])
def bwd_dq_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, O, DO, LSE, DELTA, N, GROUP, sm_scale, qk_scale,
                  BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr,
                  num_warps: gl.constexpr):
    """Program (i, bh): dQ and delta of query rows [128 i, 128 (i + 1)) of head bh of
    [B * H, N, D] (causal: the longest tiles first); two consumer warpgroups of 64 rows
    and a producer warp."""
    dtype: gl.constexpr = q_desc.dtype
    pid_m = gl.program_id(0)
    if CAUSAL:  # later tiles see more keys: start them first so the short ones fill the tail
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    m0 = pid_m * (2 * ROWS)
    n_tile = (N + BLOCK_N - 1) // BLOCK_N
    if CAUSAL:  # keys < m0 + 128
        n_tile = gl.minimum(n_tile, (m0 + 2 * ROWS + BLOCK_N - 1) // BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [2, 1, ROWS, HEAD_D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, 1, ROWS, HEAD_D], do_desc.layout)
    k_ring = gl.allocate_shared_memory(dtype, [NUM_BUF, 1, BLOCK_N, HEAD_D], k_desc.layout)
    v_ring = gl.allocate_shared_memory(dtype, [NUM_BUF, 1, BLOCK_N, HEAD_D], v_desc.layout)
    q_bars, ready, free = _barriers(NUM_BUF, 1)  # ready: the producer's expect, with K's and V's bytes

    gl.warp_specialize([
        (_dq_consumer, (q_desc, do_desc, dq_desc, O, DO, LSE, DELTA, q_smem.index(0), do_smem.index(0),
                     q_bars.index(0), k_ring, v_ring, ready, free, bh, m0, n_tile, N, sm_scale, qk_scale,
                     CAUSAL, BLOCK_N, HEAD_D, NUM_BUF, num_warps)),
        (_dq_consumer, (q_desc, do_desc, dq_desc, O, DO, LSE, DELTA, q_smem.index(1), do_smem.index(1),
                     q_bars.index(1), k_ring, v_ring, ready, free, bh, m0 + ROWS, n_tile, N, sm_scale, qk_scale,
                     CAUSAL, BLOCK_N, HEAD_D, NUM_BUF, num_warps)),
        (_dq_producer, (k_desc, v_desc, k_ring, v_ring, ready, free, bh // GROUP, n_tile, BLOCK_N, NUM_BUF)),
    ], [num_warps, 1], [CONSUMER_REGS, 24])


def dq_delta(q, k, v, o, do, lse, delta, dq, causal, scale):
    """Write dQ (q's shape and dtype) and delta = rowsum(dO * O) ([B, H, N] fp32) of
    attention of q [B, H, N, D] over k, v [B, H_KV, N, D], given o, do (q's shape) and the
    forward's lse [B, H, N] fp32 (natural log). All contiguous, 16-byte aligned, fp16 or
    bf16, D = 128, B * H * N < 2^31: `flash_backward.gluon_backward_takes` checks that."""
    B, H, N, D = q.shape
    block_n = DQ_BLOCK_N
    rows = ROWS.value
    grid = ((N + 2 * rows - 1) // (2 * rows), B * H)
    launch_compiled(bwd_dq_kernel, q.device, grid, descriptor(q, rows), descriptor(k, block_n),
                    descriptor(v, block_n), descriptor(do, rows), descriptor(dq, rows), o, do, lse, delta, N,
                    H // k.shape[1], scale, scale * LOG2E,
                    BLOCK_N=block_n, HEAD_D=D, NUM_BUF=DQ_NUM_BUF, CAUSAL=bool(causal), num_warps=4)
