"""The tuned forward's Hopper kernel, written in Gluon (Triton's explicit-layout language).

`flash_tuned.flash_attention_forward` runs it where `flash_tuned.gluon_forward_takes`
says (an H100/H200, Triton 3.6, fp16/bf16, head dim 128, or 64 causal or short; Nq == Nk,
contiguous [B, H, N, D]), and its Triton kernel everywhere else. On the H100 at D = 128 it read 0.92-1.15x cuDNN
(PERF.md 3n, 3o, 3p): Triton's compiler did not overlap the softmax with the matrix
products; here the schedule is written out.

The schedule (FlashAttention-3's, on Hopper's asynchronous units):
- A tile is 128 query rows of one head: two consumer warpgroups of 64 rows each,
  independent (each waits and signals on its own, so one runs its softmax while the
  other's products run), and one producer warp.
- The producer streams K and V blocks of 128 keys by TMA into a ring of slots (NUM_BUF), each
  slot refilled when both consumers have freed it (mbarriers: ready and free per slot).
- A consumer issues block j's scores Q K_j^T and block j-1's P_{j-1} V_{j-1} together
  (wgmma is asynchronous; groups complete in order), waits for the scores only, and runs
  block j's softmax while P V runs.
- Persistent: one program per SM walks tiles pid, pid + nprog, ... The ring's count of
  uses runs on across tiles, so the producer loads the next tile's keys while the
  consumers finish this one; the next tile's Q loads into a second buffer while this one
  runs; O leaves through its own buffer by TMA, awaited only when that buffer is written
  again a tile later. With one program per tile, each tile's start and end were exposed
  at short N (N = 1024: 2048 programs of 8 key blocks on 132 SMs; PERF.md 3o).
- Causal: a tile's 128 rows meet one diagonal block of 128 keys, the only masked one;
  blocks above it are never loaded. The first warpgroup's rows see only the block's
  first 64 keys, so it computes those alone (PERF.md 4f: 3-6% at N = 1024).
- Causal tiles go in pairs of one head, its longest tile with its shortest: every pair
  costs the same, so programs get equal work, and programs running together share a
  few heads' K/V in L2. (An order that balanced the programs' work better but spread
  each round over all heads ran 0.3-16% slower: PERF.md 4f.)
- Any N: descriptors cover [B * H, N, D] in [1, rows, D] blocks, so TMA fills rows past
  N with zeros (their keys are masked) and the O store drops them.
- Grouped-query heads: query head bh reads K/V head bh // GROUP.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from solutions.flash_forward import LOG2E
from solutions.flash_tuned import launch_compiled

BLOCK_M = 64   # query rows per consumer warpgroup (a wgmma's M is 64 per warpgroup)
BLOCK_N = 128  # keys per block: with 2 * BLOCK_M query rows, causal programs meet one diagonal block
# K/V slots per head dim: at D = 128, 3 read 2-5% slower on the H100 (PERF.md 3n); at
# D = 64 (H200) 3 read 1.5% faster at N = 1024 causal, level or 1% slower at 4096 (4f)
NUM_BUF = {64: 3, 128: 2}
CONSUMER_REGS = gl.constexpr(232)  # registers per thread of a consumer; the producer warp gets 24
GL_DTYPES = {"torch.float16": gl.float16, "torch.bfloat16": gl.bfloat16}


@gluon.jit
def wait_after(x, deps):
    """warpgroup_mma_wait(0) that ptxas cannot move ahead of the work that computes x:
    the wait is predicated on x's bits (never all ones), and a branch bounds the
    scheduler. Unpredicated, ptxas hoisted the wait for P V above the softmax that is
    meant to run while P V does (PERF.md 3m)."""
    x = gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $1, -1; @p wgmma.wait_group.sync.aligned 0; mov.b32 $0, $1; }",
        "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)
    return x, warpgroup_mma_wait(num_outstanding=0, deps=deps)


@gluon.jit
def _kv_blocks(q_tile, N, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Key blocks that the 2 * BLOCK_M query rows from q_tile meet."""
    n_blocks = (N + BLOCK_N - 1) // BLOCK_N
    if CAUSAL:
        n_blocks = gl.minimum(n_blocks, (q_tile + 2 * BLOCK_M + BLOCK_N - 1) // BLOCK_N)
    return n_blocks


@gluon.jit
def _produce(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, kv_bh, n_blocks, base,
             BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
    """K and V blocks 0..n_blocks-1 of K/V head kv_bh into the ring, as its uses base,
    base + 1, ...: each slot when both consumers have freed it (a fresh barrier passes a
    wait for parity 1: the first round waits for nothing)."""
    for j in range(n_blocks):
        use = base + j
        slot = use % NUM_BUF
        free_phase = ((use // NUM_BUF) & 1) ^ 1
        mbarrier.wait(k_free.index(slot), phase=free_phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_bh, j * BLOCK_N, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_free.index(slot), phase=free_phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_bh, j * BLOCK_N, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _rows(smem, slot, rows: gl.constexpr):
    """The first `rows` rows of ring slot `slot` ([1, BLOCK_N, D], the descriptors'
    block) as a [rows, D] matrix."""
    block = smem.index(slot).reshape([smem.shape[2], smem.shape[3]])
    if rows < smem.shape[2]:
        block = block.slice(0, rows)
    return block


@gluon.jit
def _scores(q_smem, k_smem, slot, BLOCK_M: gl.constexpr, KEYS: gl.constexpr, s_layout: gl.constexpr):
    """Q K^T over the first KEYS keys of a slot, issued (not awaited). Slots are [1, rows, D]."""
    HEAD_D: gl.constexpr = q_smem.shape[2]
    return warpgroup_mma(q_smem.reshape([BLOCK_M, HEAD_D]), _rows(k_smem, slot, KEYS).permute((1, 0)),
                         gl.zeros([BLOCK_M, KEYS], gl.float32, s_layout), use_acc=False, is_async=True)


@gluon.jit
def _mask(s, q_start, j, N, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          KEYS: gl.constexpr, s_layout: gl.constexpr):
    """-inf for the keys past N (TMA read them as zeros) and, causal, for the keys after
    each query; s holds the first KEYS keys of block j."""
    cols = j * BLOCK_N + gl.arange(0, KEYS, layout=gl.SliceLayout(0, s_layout))
    out = cols[None, :] >= N
    if CAUSAL:
        rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        out = out | (cols[None, :] > rows[:, None])
    return gl.where(out, float("-inf"), s)


@gluon.jit
def _step(j, base, q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, m_i, l_i, acc, p16, q_start, N,
          qk_scale, MASK: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          KEYS: gl.constexpr, NUM_BUF: gl.constexpr, p_layout: gl.constexpr, o_rows: gl.constexpr,
          num_warps: gl.constexpr):
    """Block j's scores (its first KEYS keys) and block j-1's P V issued together; block
    j's softmax while P V runs. MASK: block j is the masked last one. Block j is the
    ring's use base + j."""
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _mma_layout(KEYS, num_warps)
    # the row statistics travel in the full block's row layout; rows sit in the same
    # threads at any width, so the conversions move no data
    m_i = gl.convert_layout(m_i, gl.SliceLayout(1, s_layout))
    l_i = gl.convert_layout(l_i, gl.SliceLayout(1, s_layout))
    use = base + j
    slot = use % NUM_BUF
    prev = (use - 1) % NUM_BUF
    mbarrier.wait(k_ready.index(slot), phase=(use // NUM_BUF) & 1)
    s = _scores(q_smem, k_smem, slot, BLOCK_M, KEYS, s_layout)
    mbarrier.wait(v_ready.index(prev), phase=((use - 1) // NUM_BUF) & 1)
    acc = warpgroup_mma(p16, _rows(v_smem, prev, p16.shape[1]), acc, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
    mbarrier.arrive(k_free.index(slot))
    if MASK:
        s = _mask(s, q_start, j, N, CAUSAL, BLOCK_M, BLOCK_N, KEYS, s_layout)
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    l_i, acc = wait_after(l_i, (acc, ))
    mbarrier.arrive(v_free.index(prev))
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
    rows: gl.constexpr = gl.SliceLayout(1, _mma_layout(BLOCK_N, num_warps))
    return gl.convert_layout(m_new, rows), gl.convert_layout(l_i, rows), acc, p16


@gluon.constexpr_function
def _mma_layout(cols, num_warps):
    """Register layout of a wgmma result [64 rows, cols] over a warpgroup."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, cols, 16])


@gluon.jit
def _first(q_smem, k_smem, k_ready, k_free, base, q_start, N, qk_scale, MASK, CAUSAL: gl.constexpr,
           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, KEYS: gl.constexpr, HEAD_D: gl.constexpr,
           NUM_BUF: gl.constexpr, p_layout: gl.constexpr, num_warps: gl.constexpr):
    """Block 0's scores (its first KEYS keys) alone, with no P V to run under them yet;
    MASK (known when compiling, or not): block 0 is the masked last one. Returns the
    running max, sum, O (zeros) and P."""
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = _mma_layout(KEYS, num_warps)
    first = base % NUM_BUF
    mbarrier.wait(k_ready.index(first), phase=(base // NUM_BUF) & 1)
    s = _scores(q_smem, k_smem, first, BLOCK_M, KEYS, s_layout)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_free.index(first))
    if MASK:
        s = _mask(s, q_start, 0, N, CAUSAL, BLOCK_M, BLOCK_N, KEYS, s_layout)
    m_i = gl.max(s, axis=1) * qk_scale
    p = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(p, axis=1)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, _mma_layout(HEAD_D, num_warps))
    rows: gl.constexpr = gl.SliceLayout(1, _mma_layout(BLOCK_N, num_warps))
    return gl.convert_layout(m_i, rows), gl.convert_layout(l_i, rows), acc, gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def _attend(q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, base, q_start, N, n_blocks, qk_scale,
            CAUSAL: gl.constexpr, LAST_KEYS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr, num_warps: gl.constexpr):
    """One warpgroup's BLOCK_M query rows from q_start (in q_smem, loaded) against key
    blocks 0..n_blocks-1 (the ring's uses base...); the last one is masked when it holds
    the diagonal (causal) or keys past N. Causal, the rows see only the first LAST_KEYS
    keys of the diagonal block, and only those are computed. Returns the running max,
    sum, O and the last block's P, whose P V is left to `_last_pv`. Every product it
    issued is complete."""
    o_layout: gl.constexpr = _mma_layout(HEAD_D, num_warps)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    # the unmasked blocks first, then the last one if it must be masked
    if CAUSAL:
        n_plain = n_blocks - 1
        if n_plain == 0:  # block 0 is the diagonal
            m_i, l_i, acc, p16 = _first(q_smem, k_smem, k_ready, k_free, base, q_start, N, qk_scale, True, CAUSAL,
                                        BLOCK_M, BLOCK_N, LAST_KEYS, HEAD_D, NUM_BUF, p_layout, num_warps)
        else:
            m_i, l_i, acc, p = _first(q_smem, k_smem, k_ready, k_free, base, q_start, N, qk_scale, False, CAUSAL,
                                      BLOCK_M, BLOCK_N, BLOCK_N, HEAD_D, NUM_BUF, p_layout, num_warps)
            for j in range(1, n_plain):
                m_i, l_i, acc, p = _step(j, base, q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, m_i,
                                         l_i, acc, p, q_start, N, qk_scale, False, CAUSAL, BLOCK_M, BLOCK_N,
                                         BLOCK_N, NUM_BUF, p_layout, o_rows, num_warps)
            # the diagonal block, always last: its P is narrower where the rows see fewer keys
            m_i, l_i, acc, p16 = _step(n_plain, base, q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free,
                                       m_i, l_i, acc, p, q_start, N, qk_scale, True, CAUSAL, BLOCK_M, BLOCK_N,
                                       LAST_KEYS, NUM_BUF, p_layout, o_rows, num_warps)
    else:
        n_plain = N // BLOCK_N
        # block 0 masked only when it is the last and ragged
        m_i, l_i, acc, p16 = _first(q_smem, k_smem, k_ready, k_free, base, q_start, N, qk_scale, n_plain == 0,
                                    CAUSAL, BLOCK_M, BLOCK_N, BLOCK_N, HEAD_D, NUM_BUF, p_layout, num_warps)
        for j in range(1, n_plain):
            m_i, l_i, acc, p16 = _step(j, base, q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, m_i, l_i,
                                       acc, p16, q_start, N, qk_scale, False, CAUSAL, BLOCK_M, BLOCK_N, BLOCK_N,
                                       NUM_BUF, p_layout, o_rows, num_warps)
        for j in range(gl.maximum(n_plain, 1), n_blocks):  # the ragged last block (none if it was block 0)
            m_i, l_i, acc, p16 = _step(j, base, q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, m_i, l_i,
                                       acc, p16, q_start, N, qk_scale, True, CAUSAL, BLOCK_M, BLOCK_N, BLOCK_N,
                                       NUM_BUF, p_layout, o_rows, num_warps)
    return m_i, l_i, acc, p16


@gluon.jit
def _last_pv(p16, acc, v_smem, v_ready, base, n_blocks, NUM_BUF: gl.constexpr):
    """The last block's P V, awaited."""
    last_use = base + n_blocks - 1
    last = last_use % NUM_BUF
    mbarrier.wait(v_ready.index(last), phase=(last_use // NUM_BUF) & 1)
    acc = warpgroup_mma(p16, _rows(v_smem, last, p16.shape[1]), acc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))


@gluon.jit
def _normalize(acc, m_i, l_i, LSE, bh, q_start, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               HEAD_D: gl.constexpr, num_warps: gl.constexpr):
    """O / l, and the rows' log-sum-exp stored (natural log; rows past N dropped)."""
    s_layout: gl.constexpr = _mma_layout(BLOCK_N, num_warps)
    o_rows: gl.constexpr = gl.SliceLayout(1, _mma_layout(HEAD_D, num_warps))
    acc = acc / gl.convert_layout(l_i, o_rows)[:, None]
    rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(LSE + bh * N + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=rows < N)  # natural log
    return acc


@gluon.jit
def _n_tiles(pid, nprog, BH, n_m, CAUSAL: gl.constexpr):
    """How many tiles program pid of nprog runs: units pid, pid + nprog, ... of
    `n_units`; causal, the pairs come first (two tiles each), then the middle tiles of
    odd counts."""
    if CAUSAL:
        n = (BH * ((n_m + 1) // 2) - pid + nprog - 1) // nprog
        n += (BH * (n_m // 2) - pid + nprog - 1) // nprog  # each pair's second tile; pid < nprog keeps it >= 0
    else:
        n = (BH * n_m - pid + nprog - 1) // nprog
    return n


@gluon.jit
def _tile(i, pid, nprog, BH, n_m, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr):
    """(head bh, first query row) of program pid's tile i, the same in every partition.
    Any i (the one past the last gives coordinates that are not used)."""
    if CAUSAL:
        half = n_m // 2
        n_pairs = BH * half
        my_pairs = (n_pairs - pid + nprog - 1) // nprog
        if i < 2 * my_pairs:  # tile i % 2 of pair pid + (i // 2) nprog: longest block k, then shortest k
            u = pid + (i // 2) * nprog
            bh = u // gl.maximum(half, 1)
            k = u % gl.maximum(half, 1)
            mb = k + (1 - i % 2) * (n_m - 1 - 2 * k)
        else:  # an odd count's middle tile, after all pairs
            bh = pid + (i - my_pairs) * nprog - n_pairs
            mb = half
    else:  # one head's tiles together: programs running at once share its K/V in L2
        u = pid + i * nprog
        bh = u // n_m
        mb = u % n_m
    return bh, mb * 2 * BLOCK_M


@gluon.jit
def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, pid, nprog, BH, N, GROUP,
              CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
    """Every tile's K and V blocks into the ring, whose count of uses runs on across tiles:
    the next tile's first blocks load while the consumers finish this one."""
    n_m = (N + 2 * BLOCK_M - 1) // (2 * BLOCK_M)
    base = 0
    for i in range(_n_tiles(pid, nprog, BH, n_m, CAUSAL)):
        bh, q_tile = _tile(i, pid, nprog, BH, n_m, CAUSAL, BLOCK_M)
        n_blocks = _kv_blocks(q_tile, N, CAUSAL, BLOCK_M, BLOCK_N)
        _produce(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, bh // GROUP, n_blocks, base,
                 BLOCK_N, NUM_BUF)
        base += n_blocks


@gluon.jit
def _load_q(q_desc, q_smem, q_bars, bh, q_start, i, pred):
    """Tile i's Q into buffer i % 2 (if pred)."""
    buf = i % 2
    mbarrier.expect(q_bars.index(buf), q_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [bh, q_start, 0], q_bars.index(buf), q_smem.index(buf), pred=pred)


@gluon.jit
def _consumer(q_desc, o_desc, LSE, q_smem, q_bars, o_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free,
              pid, nprog, BH, N, qk_scale, ROW0: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr, num_warps: gl.constexpr):
    """One warpgroup: rows ROW0..ROW0 + BLOCK_M of each of program pid's tiles.
    q_smem [2, 1, BLOCK_M, D] and q_bars [2, 1]: tile i's Q is in buffer i % 2, its
    barrier's use i // 2. o_smem [1, BLOCK_M, D]: O's staging."""
    dtype: gl.constexpr = q_desc.dtype
    # Causal, the tile's diagonal block holds keys q_tile..q_tile + BLOCK_N and these rows
    # see its first ROW0 + BLOCK_M: the first warpgroup computes half the block.
    gl.static_assert(not CAUSAL or BLOCK_N == 2 * BLOCK_M)
    LAST_KEYS: gl.constexpr = ROW0 + BLOCK_M if CAUSAL else BLOCK_N
    n_m = (N + 2 * BLOCK_M - 1) // (2 * BLOCK_M)
    n_tiles = _n_tiles(pid, nprog, BH, n_m, CAUSAL)
    bh, q_tile = _tile(0, pid, nprog, BH, n_m, CAUSAL, BLOCK_M)
    _load_q(q_desc, q_smem, q_bars, bh, q_tile + ROW0, 0, n_tiles > 0)
    base = 0  # the ring's uses before this tile
    for i in range(n_tiles):
        # the coordinates are recomputed, not carried: fewer registers live across the tile
        bh, q_tile = _tile(i, pid, nprog, BH, n_m, CAUSAL, BLOCK_M)
        # the next Q's buffer held tile i - 1's Q, whose products are all complete
        next_bh, next_q = _tile(i + 1, pid, nprog, BH, n_m, CAUSAL, BLOCK_M)
        _load_q(q_desc, q_smem, q_bars, next_bh, next_q + ROW0, i + 1, i + 1 < n_tiles)
        q_start = q_tile + ROW0
        n_blocks = _kv_blocks(q_tile, N, CAUSAL, BLOCK_M, BLOCK_N)  # both warpgroups: the 128-row tile's
        # N itself, but not provably so (q_tile < N): the keys-past-N mask of block 0 would
        # otherwise be hoisted out of the tile loop, its predicates held across it (spills)
        n_keys = gl.maximum(N, q_tile)
        mbarrier.wait(q_bars.index(i % 2), phase=(i // 2) & 1)
        m_i, l_i, acc, p16 = _attend(q_smem.index(i % 2), k_smem, v_smem, k_ready, v_ready, k_free, v_free, base,
                                     q_start, n_keys, n_blocks, qk_scale, CAUSAL, LAST_KEYS, BLOCK_M, BLOCK_N, HEAD_D,
                                     NUM_BUF, num_warps)
        acc = _last_pv(p16, acc, v_smem, v_ready, base, n_blocks, NUM_BUF)
        mbarrier.arrive(v_free.index((base + n_blocks - 1) % NUM_BUF))  # the ring goes on: free the last V too
        acc = _normalize(acc, m_i, l_i, LSE, bh, q_start, N, BLOCK_M, BLOCK_N, HEAD_D, num_warps)
        tma.store_wait(pendings=0)  # the previous tile's O has left o_smem
        o_smem.reshape([BLOCK_M, HEAD_D]).store(acc.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [bh, q_start, 0], o_smem)  # rows past N are dropped
        base += n_blocks
    tma.store_wait(pendings=0)  # before the program ends and its shared memory goes


# N, GROUP, BH are not specialized: as a constant 1, `N // BLOCK_N` folds to a Python
# value and the loop bounds fail to compile (seen on the H100), and one compile then
# serves every shape.
@gluon.jit(do_not_specialize=["N", "GROUP", "BH"])
def attn_fwd_kernel(q_desc, k_desc, v_desc, o_desc, LSE, N, GROUP, BH, qk_scale,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                    num_warps: gl.constexpr, NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr):
    """Program pid of nprog: tiles pid, pid + nprog, ... of [B * H, N, D] (`_tile`), two
    consumer warpgroups and a producer warp. Shared memory at D = 128: 224 KB (two Q
    buffers and one O buffer per consumer, two K/V slots), under the H100's 227 KB; at
    D = 64, 144 KB with three."""
    dtype: gl.constexpr = q_desc.dtype
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)

    q0_smem = gl.allocate_shared_memory(dtype, [2, 1, BLOCK_M, HEAD_D], q_desc.layout)
    q1_smem = gl.allocate_shared_memory(dtype, [2, 1, BLOCK_M, HEAD_D], q_desc.layout)
    o_smem = gl.allocate_shared_memory(dtype, [2, 1, BLOCK_M, HEAD_D], o_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, 1, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, 1, BLOCK_N, HEAD_D], v_desc.layout)
    q0_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q1_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q0_bars.index(i), count=1)
        mbarrier.init(q1_bars.index(i), count=1)
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)  # both consumers free a slot
        mbarrier.init(v_free.index(i), count=2)

    gl.warp_specialize([
        (_consumer, (q_desc, o_desc, LSE, q0_smem, q0_bars, o_smem.index(0), k_smem, v_smem, k_ready, v_ready,
                     k_free, v_free, pid, nprog, BH, N, qk_scale, 0, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, NUM_BUF,
                     num_warps)),
        (_consumer, (q_desc, o_desc, LSE, q1_smem, q1_bars, o_smem.index(1), k_smem, v_smem, k_ready, v_ready,
                     k_free, v_free, pid, nprog, BH, N, qk_scale, BLOCK_M, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D,
                     NUM_BUF, num_warps)),
        (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, pid, nprog, BH, N, GROUP,
                     CAUSAL, BLOCK_M, BLOCK_N, NUM_BUF)),
    ], [num_warps, 1], [CONSUMER_REGS, 24])


_LAYOUTS = {}  # (block, dtype) -> its shared-memory layout


def descriptor(t, rows):
    """A TMA descriptor over t [B, heads, N, D] (contiguous) viewed as [B * heads, N, D],
    in [1, rows, D] blocks: each head's rows end at N, so TMA zero-fills reads past it and
    drops writes past it. Host time matters: a training step makes 15 of these, and at
    N = 1024 the step is bound by its host time (PERF.md 3r). So the layout is made once
    per block and dtype, and the fields are set directly: Triton's constructor checks
    them at every call (alignment, strides, block shape), which `gluon_takes` has checked
    for q, k, v, and the other tensors are buffers the wrappers made."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    B, H, N, D = t.shape
    block = (1, rows, D)
    layout = _LAYOUTS.get((block, t.dtype))
    if layout is None:
        layout = _LAYOUTS[(block, t.dtype)] = gl.NVMMASharedLayout.get_default_for(
            list(block), GL_DTYPES[str(t.dtype)])
    desc = object.__new__(TensorDescriptor)
    desc.base, desc.shape, desc.strides, desc.block_shape = t, [B * H, N, D], [N * D, D, 1], list(block)
    desc.layout, desc.padding = layout, "zero"
    return desc


_SM_COUNT = {}


def sm_count(device):
    """The device's SM count (cached: the query costs host time at every call)."""
    index = device.index if device.index is not None else 0
    n = _SM_COUNT.get(index)
    if n is None:
        n = _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n


def n_units(BH, N, causal):
    """The kernel's units of work (tiles; causal, pairs of tiles): the most programs that
    get work."""
    n_m = (N + 2 * BLOCK_M - 1) // (2 * BLOCK_M)
    return BH * ((n_m + 1) // 2) if causal else BH * n_m


def forward(q, k, v, o, lse, causal, scale, programs=None):
    """Write attention of q [B, H, N, D] over k, v [B, H_KV, N, D] into o (q's shape and
    dtype) and lse [B, H, N] (fp32, natural log). All contiguous, 16-byte aligned, fp16
    or bf16, D 64 or 128: `flash_tuned.gluon_forward_takes` checks that before calling. The grid
    is min(units of work, SMs) programs; `programs` caps it lower (tests: several tiles
    per program at small sizes)."""
    B, H, N, D = q.shape
    BH = B * H
    grid = (min(n_units(BH, N, causal), programs or sm_count(q.device)), )
    launch_compiled(attn_fwd_kernel, q.device, grid, descriptor(q, BLOCK_M), descriptor(k, BLOCK_N),
                    descriptor(v, BLOCK_N), descriptor(o, BLOCK_M), lse, N, H // k.shape[1], BH, scale * LOG2E,
                    BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_D=D, num_warps=4, NUM_BUF=NUM_BUF[D], CAUSAL=bool(causal))
