"""The tuned forward's Hopper kernel, written in Gluon (Triton's explicit-layout language).

`flash_tuned.flash_attention_forward` runs it where `flash_tuned.gluon_takes` says (an
H100/H200, Triton 3.6, fp16/bf16, head dim 128, Nq == Nk, contiguous [B, H, N, D]), and
its Triton kernel everywhere else. At D = 128 on the H100 it read 1.04-1.25x the Triton
kernel, and 0.97-1.11x cuDNN at N >= 4096 (PERF.md 3n): Triton's compiler did not overlap
the softmax with the matrix products; here the schedule is written out.

The schedule (FlashAttention-3's, on Hopper's asynchronous units):
- A program owns 128 query rows of one head: two consumer warpgroups of 64 rows each,
  independent (each waits and signals on its own, so one runs its softmax while the
  other's products run), and one producer warp.
- The producer streams K and V blocks of 128 keys by TMA into a ring of two slots, each
  slot refilled when both consumers have freed it (mbarriers: ready and free per slot).
- A consumer issues block j's scores Q K_j^T and block j-1's P_{j-1} V_{j-1} together
  (wgmma is asynchronous; groups complete in order), waits for the scores only, and runs
  block j's softmax while P V runs.
- Causal: a program's 128 rows meet one diagonal block of 128 keys, the only masked one;
  blocks above it are never loaded, and the longest programs run first.
- Any N: descriptors cover [B * H, N, D] in [1, rows, D] blocks, so TMA fills rows past
  N with zeros (their keys are masked) and the O store drops them.
- Grouped-query heads: query head bh reads K/V head bh // GROUP.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from solutions.flash_forward import LOG2E

BLOCK_M = 64   # query rows per consumer warpgroup (a wgmma's M is 64 per warpgroup)
BLOCK_N = 128  # keys per block: with 2 * BLOCK_M query rows, causal programs meet one diagonal block
NUM_BUF = 2    # K/V slots: 3 read 2-5% slower on the H100 (PERF.md 3n)
CONSUMER_REGS = gl.constexpr(232)  # registers per thread of a consumer; the producer warp gets 24
GL_DTYPES = {"torch.float16": gl.float16, "torch.bfloat16": gl.bfloat16}


@gluon.jit
def _wait_after(x, deps):
    """warpgroup_mma_wait(0) that ptxas cannot move ahead of the work that computes x:
    the wait is predicated on x's bits (never all ones), and a branch bounds the
    scheduler. Unpredicated, ptxas hoisted the wait for P V above the softmax that is
    meant to run while P V does (PERF.md 3m)."""
    x = gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $1, -1; @p wgmma.wait_group.sync.aligned 0; mov.b32 $0, $1; }",
        "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)
    return x, warpgroup_mma_wait(num_outstanding=0, deps=deps)


@gluon.jit
def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, kv_bh, n_blocks,
              BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr):
    """K and V blocks into the ring, each slot when both consumers have freed it (a
    fresh barrier passes a wait for parity 1: the first round waits for nothing)."""
    for j in range(n_blocks):
        slot = j % NUM_BUF
        free_phase = ((j // NUM_BUF) & 1) ^ 1
        mbarrier.wait(k_free.index(slot), phase=free_phase)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_bh, j * BLOCK_N, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_free.index(slot), phase=free_phase)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_bh, j * BLOCK_N, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _scores(q_smem, k_smem, slot, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Q K^T, issued (not awaited). Slots are [1, rows, D], the descriptors' blocks."""
    HEAD_D: gl.constexpr = q_smem.shape[2]
    return warpgroup_mma(q_smem.reshape([BLOCK_M, HEAD_D]), k_smem.index(slot).reshape([BLOCK_N, HEAD_D]).permute((1, 0)),
                         gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)


@gluon.jit
def _mask(s, q_start, j, N, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          s_layout: gl.constexpr):
    """-inf for the keys past N (TMA read them as zeros) and, causal, for the keys after
    each query."""
    cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    out = cols[None, :] >= N
    if CAUSAL:
        rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        out = out | (cols[None, :] > rows[:, None])
    return gl.where(out, float("-inf"), s)


@gluon.jit
def _step(j, q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, m_i, l_i, acc, p16, q_start, N, qk_scale,
          MASK: gl.constexpr, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          NUM_BUF: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr, o_rows: gl.constexpr):
    """Block j's scores and block j-1's P V issued together; block j's softmax while
    P V runs. MASK: block j is the masked last one."""
    dtype: gl.constexpr = q_smem.dtype
    slot = j % NUM_BUF
    prev = (j - 1) % NUM_BUF
    mbarrier.wait(k_ready.index(slot), phase=(j // NUM_BUF) & 1)
    s = _scores(q_smem, k_smem, slot, BLOCK_M, BLOCK_N, s_layout)
    mbarrier.wait(v_ready.index(prev), phase=((j - 1) // NUM_BUF) & 1)
    acc = warpgroup_mma(p16, v_smem.index(prev).reshape([BLOCK_N, v_smem.shape[3]]), acc, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
    mbarrier.arrive(k_free.index(slot))
    if MASK:
        s = _mask(s, q_start, j, N, CAUSAL, BLOCK_M, BLOCK_N, s_layout)
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    l_i, acc = _wait_after(l_i, (acc, ))
    mbarrier.arrive(v_free.index(prev))
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
    return m_new, l_i, acc, p16


@gluon.jit
def _consumer(q_desc, o_desc, LSE, q_smem, q_bar, k_smem, v_smem, k_ready, v_ready, k_free, v_free, bh,
              q_start, N, n_blocks, qk_scale, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              HEAD_D: gl.constexpr, NUM_BUF: gl.constexpr, num_warps: gl.constexpr):
    """One warpgroup: BLOCK_M rows of Q from row q_start of head bh, against every K/V
    block they may see; the last one is masked when it holds the diagonal (causal) or
    keys past N."""
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh, q_start, 0], q_bar, q_smem)
    mbarrier.wait(q_bar, phase=0)

    # the unmasked blocks first, then the last one if it must be masked
    if CAUSAL:
        n_plain = n_blocks - 1
    else:
        n_plain = N // BLOCK_N

    # block 0: its scores alone (no P V yet), masked when it is the last and must be
    mbarrier.wait(k_ready.index(0), phase=0)
    s = _scores(q_smem, k_smem, 0, BLOCK_M, BLOCK_N, s_layout)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    mbarrier.arrive(k_free.index(0))
    if n_plain == 0:
        s = _mask(s, q_start, 0, N, CAUSAL, BLOCK_M, BLOCK_N, s_layout)
    m_i = gl.max(s, axis=1) * qk_scale
    p = gl.exp2(s * qk_scale - m_i[:, None])
    l_i = gl.sum(p, axis=1)
    p16 = gl.convert_layout(p.to(dtype), p_layout)
    acc = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)

    for j in range(1, n_plain):
        m_i, l_i, acc, p16 = _step(j, q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, m_i, l_i, acc,
                                   p16, q_start, N, qk_scale, False, CAUSAL, BLOCK_M, BLOCK_N, NUM_BUF, s_layout,
                                   p_layout, o_rows)
    for j in range(gl.maximum(n_plain, 1), n_blocks):  # the masked last block (none if it was block 0)
        m_i, l_i, acc, p16 = _step(j, q_smem, k_smem, v_smem, k_ready, v_ready, k_free, v_free, m_i, l_i, acc,
                                   p16, q_start, N, qk_scale, True, CAUSAL, BLOCK_M, BLOCK_N, NUM_BUF, s_layout,
                                   p_layout, o_rows)

    last = (n_blocks - 1) % NUM_BUF
    mbarrier.wait(v_ready.index(last), phase=((n_blocks - 1) // NUM_BUF) & 1)
    acc = warpgroup_mma(p16, v_smem.index(last).reshape([BLOCK_N, HEAD_D]), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    acc = acc / gl.convert_layout(l_i, o_rows)[:, None]
    rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(LSE + bh * N + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=rows < N)  # natural log
    q_smem.reshape([BLOCK_M, HEAD_D]).store(acc.to(dtype))  # Q's buffer stages O: the last product has read Q
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [bh, q_start, 0], q_smem)  # rows past N are dropped
    tma.store_wait(pendings=0)


# N is not specialized: as a constant 1, `N // BLOCK_N` folds and the loop bounds fail to
# compile (seen on the H100), and one compile then serves every length.
@gluon.jit(do_not_specialize=["N"])
def attn_fwd_kernel(q_desc, k_desc, v_desc, o_desc, LSE, N, GROUP, qk_scale,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                    num_warps: gl.constexpr, NUM_BUF: gl.constexpr, CAUSAL: gl.constexpr):
    """Program (i, bh): query rows [2 i BLOCK_M, 2 (i + 1) BLOCK_M) of head bh of
    [B * H, N, D], two consumer warpgroups and a producer warp."""
    dtype: gl.constexpr = q_desc.dtype
    pid_m = gl.program_id(0)
    if CAUSAL:  # the longest programs first
        pid_m = gl.num_programs(0) - 1 - pid_m
    bh = gl.program_id(1)
    kv_bh = bh // GROUP  # b * H + h with H = GROUP * H_KV maps to b * H_KV + h // GROUP
    q_start = pid_m * 2 * BLOCK_M
    n_blocks = (N + BLOCK_N - 1) // BLOCK_N
    if CAUSAL:
        n_blocks = gl.minimum(n_blocks, (q_start + 2 * BLOCK_M + BLOCK_N - 1) // BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [2, 1, BLOCK_M, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, 1, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, 1, BLOCK_N, HEAD_D], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)  # both consumers free a slot
        mbarrier.init(v_free.index(i), count=2)

    gl.warp_specialize([
        (_consumer, (q_desc, o_desc, LSE, q_smem.index(0), q_bars.index(0), k_smem, v_smem, k_ready, v_ready,
                     k_free, v_free, bh, q_start, N, n_blocks, qk_scale, CAUSAL, BLOCK_M, BLOCK_N, HEAD_D,
                     NUM_BUF, num_warps)),
        (_consumer, (q_desc, o_desc, LSE, q_smem.index(1), q_bars.index(1), k_smem, v_smem, k_ready, v_ready,
                     k_free, v_free, bh, q_start + BLOCK_M, N, n_blocks, qk_scale, CAUSAL, BLOCK_M, BLOCK_N,
                     HEAD_D, NUM_BUF, num_warps)),
        (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, v_ready, k_free, v_free, kv_bh, n_blocks,
                     BLOCK_N, NUM_BUF)),
    ], [num_warps, 1], [CONSUMER_REGS, 24])


def forward(q, k, v, o, lse, causal, scale):
    """Write attention of q [B, H, N, D] over k, v [B, H_KV, N, D] into o (q's shape and
    dtype) and lse [B, H, N] (fp32, natural log). All contiguous, 16-byte aligned, fp16
    or bf16, D 64 or 128: `flash_tuned.gluon_takes` checks that before calling."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    B, H, N, D = q.shape
    dtype = GL_DTYPES[str(q.dtype)]

    def desc(t, rows):  # over [B * heads, N, D]: each head's rows end at N
        block = [1, rows, D]
        return TensorDescriptor.from_tensor(t.view(-1, N, D), block,
                                            gl.NVMMASharedLayout.get_default_for(block, dtype))

    grid = ((N + 2 * BLOCK_M - 1) // (2 * BLOCK_M), B * H)  # triton.cdiv costs host time
    attn_fwd_kernel[grid](desc(q, BLOCK_M), desc(k, BLOCK_N), desc(v, BLOCK_N), desc(o, BLOCK_M), lse, N,
                          H // k.shape[1], scale * LOG2E, BLOCK_M, BLOCK_N, D,
                          NUM_BUF=NUM_BUF, CAUSAL=bool(causal), num_warps=4)
