"""Module 05: FlashAttention forward, the teaching kernel.

Read it top to bottom: the launch grid, the online-softmax algorithm in plain PyTorch
(`flash_attention_blocked`), then the same algorithm as one Triton kernel
(`flash_attention`). The fast, tuned version of this kernel lives in
`solutions/flash_tuned.py`; it shares the input checks below.

Shapes: q is [B, H, Nq, D]; k and v are [B, Hkv, Nk, D] with H % Hkv == 0
(grouped-query attention: query head h reads K/V head h // (H // Hkv)).
"""
import math

import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton
import triton.language as tl

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_HEAD_DIM = 16  # the head dims the kernels take: tl.dot needs tiles of at least 16
MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634  # exp(x) == exp2(x * log2(e))
LN2 = tl.constexpr(0.6931471805599453)  # used inside kernels: a constexpr global


def check_attention_inputs(q, k, v):
    """Validate q [B, H, Nq, D], k/v [B, Hkv, Nk, D]; return (B, H, Hkv, Nq, Nk, D).

    Raises TypeError for non-tensors and dtypes, ValueError for shapes and devices.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims [batch, heads, seq, head_dim], "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: fp16, bf16, fp32")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if Bk != B:
        raise ValueError(f"batch mismatch: q has {B}, k/v have {Bk}")
    if Dk != D:
        raise ValueError(f"head_dim mismatch: q has {D}, k/v have {Dk}")
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(f"q heads ({H}) must be a multiple of k/v heads ({Hkv})")
    if min(B, H, Nq, Nk) == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {D} not supported: must be in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]")
    return B, H, Hkv, Nq, Nk, D


def default_scale(sm_scale, head_dim):
    """The usual 1/sqrt(D) unless the caller gives a scale."""
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


def flash_grid(seq_len, batch, heads, block_q):
    """The launch grid: one program per block of block_q queries of each (batch, head).

    Program (i, b*H + h, 0) owns query rows i*block_q ... i*block_q + block_q - 1 of
    batch entry b, head h; a ragged last block of queries gets its program too.
    """
    return (triton.cdiv(seq_len, block_q), batch * heads, 1)


# Answers to the grid questions of module 05 (see the lesson for the options).
grid_axis_answer = "b"
programs_answer = 4
batch_heads_answer = "c"
grid_limit_answer = "d"


def flash_attention_blocked(q, k, v, block_q, block_k, causal=False, sm_scale=None, history=None):
    """FlashAttention's forward algorithm in plain PyTorch, block by block.

    For each query block, walk the key/value blocks once, keeping per row a running max
    m, a running sum l of exp(s - m), and an unnormalised output acc. When m grows, the
    old l and acc were computed against a smaller max: multiply both by
    alpha = exp(m_old - m_new) before adding the new block. Divide by l at the end.

    Scores are (q @ k^T) * sm_scale (1/sqrt(D) when sm_scale is None). With causal=True,
    query i sees keys j <= i only, and key blocks that lie entirely after a query block's
    last row are skipped. Returns O in q's dtype; the statistics are kept in fp32.
    If history is a list, (m, l, acc) is appended after each key block (for the plots).
    """
    B, H, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    scale = default_scale(sm_scale, D)
    # GQA: each K/V head serves H // Hkv consecutive query heads.
    k = k.float().repeat_interleave(H // Hkv, dim=1)
    v = v.float().repeat_interleave(H // Hkv, dim=1)
    out = torch.empty(B, H, Nq, D, dtype=torch.float32, device=q.device)
    for qs in range(0, Nq, block_q):
        qb = q[:, :, qs:qs + block_q].float()
        rows = torch.arange(qs, qs + qb.shape[2], device=q.device)
        m = torch.full(qb.shape[:3], float("-inf"), device=q.device)
        l = torch.zeros(qb.shape[:3], device=q.device)
        acc = torch.zeros_like(qb)
        for ks in range(0, Nk, block_k):
            if causal and ks > rows[-1]:
                break  # every later key is in the future of every row of this block
            s = qb @ k[:, :, ks:ks + block_k].transpose(-1, -2) * scale
            if causal:
                cols = torch.arange(ks, ks + s.shape[-1], device=q.device)
                s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            alpha = torch.exp(m - m_new)  # rescale what was summed against the old max
            p = torch.exp(s - m_new[..., None])
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ v[:, :, ks:ks + block_k]
            m = m_new
            if history is not None:
                history.append((m, l, acc))
        out[:, :, qs:qs + block_q] = acc / l[..., None]
    return out.to(q.dtype)


@triton.jit
def score_max_kernel(
    Q, K, M,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    H, N_Q, N_K, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Worked example: M[b, h, i] = max over keys j of sm_scale * (Q[b, h, i] . K[b, h, j]).

    The first half of FlashAttention's loop, on the same grid: program (i, b*H + h) owns
    query rows i*BLOCK_Q ... of batch b, head h, and walks every key block.
    """
    pair = tl.program_id(1)                  # which (batch, head): pair = batch * H + head
    batch = pair // H
    head = pair % H
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)  # this program's query rows
    lanes = tl.arange(0, BLOCK_D)            # head-dim lanes: D rounded up to a power of two
    keys = tl.arange(0, BLOCK_K)             # key offsets inside one block
    real_lane = lanes < HEAD_DIM
    # The Q tile [BLOCK_Q, BLOCK_D], loaded once. Rows past N_Q and lanes past D read 0,
    # which adds nothing to a dot product.
    q_tile = tl.load(Q + batch * stride_qb + head * stride_qh
                     + rows[:, None] * stride_qn + lanes[None, :] * stride_qd,
                     mask=(rows[:, None] < N_Q) & real_lane[None, :], other=0.0)
    best = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    for first_key in range(0, N_K, BLOCK_K):
        key_ids = first_key + keys
        # A K tile read as its transpose [BLOCK_D, BLOCK_K]: lanes down, keys across. A
        # stride swap, not a copy.
        k_tile_t = tl.load(K + batch * stride_kb + head * stride_kh
                           + lanes[:, None] * stride_kd + key_ids[None, :] * stride_kn,
                           mask=real_lane[:, None] & (key_ids[None, :] < N_K), other=0.0)
        scores = tl.dot(q_tile, k_tile_t, input_precision=DOT_PRECISION) * sm_scale
        # Keys past N_K do not exist: their score must not win the max.
        scores = tl.where(key_ids[None, :] < N_K, scores, float("-inf"))
        best = tl.maximum(best, tl.max(scores, axis=1))
    tl.store(M + pair * N_Q + rows, best, mask=rows < N_Q)


def score_max(q, k, sm_scale=None, block_q=32, block_k=32):
    """Launch score_max_kernel: the largest scaled score of every query row, [B, H, Nq]."""
    B, H, _, N_Q, N_K, D = check_attention_inputs(q, k, k)
    m = torch.empty(B, H, N_Q, device=q.device, dtype=torch.float32)
    score_max_kernel[flash_grid(N_Q, B, H, block_q)](
        q, k, m, *q.stride(), *k.stride(), H, N_Q, N_K, default_scale(sm_scale, D),
        HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_Q=block_q,
        BLOCK_K=block_k, DOT_PRECISION=dot_precision(q.dtype))
    return m


@triton.jit
def flash_attention_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_K, qk_scale,
    GROUP: tl.constexpr,        # H // Hkv query heads share one K/V head
    HEAD_DIM: tl.constexpr,     # the real D
    BLOCK_D: tl.constexpr,      # D rounded up to a power of two (tl.arange needs one)
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program (i, b*H + h) computes query rows i*BLOCK_Q ... of batch b, head h.

    O[b, h, row] = softmax_j(S[row, j]) @ V[b, g, j] with S = Q[b, h] . K[b, g]^T * sm_scale
    and K/V head g = h // GROUP, and LSE[(b*H + h) * N_Q + row] = the natural-log
    log-sum-exp of the row's scaled scores. qk_scale is sm_scale * log2(e): scores come
    out in base 2, for exp2. Running max, running sum and accumulator stay in fp32; O is
    stored in O's dtype. CAUSAL: query row i sees keys j <= i, and key blocks after the
    query block are skipped. Every tensor but LSE is addressed through its strides.
    """
    pid_q = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    h_kv = h // GROUP

    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM  # padded head-dim columns load as 0 and add nothing to dots

    # Strides, not shapes, locate every element: any layout (e.g. [B, N, H, D] viewed
    # as [B, H, N, D]) works without a copy.
    q_ptrs = (Q + b * stride_qb + h * stride_qh
              + offs_q[:, None] * stride_qn + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=(offs_q[:, None] < N_Q) & d_ok[None, :], other=0.0)
    # K is read transposed ([D, BLOCK_K]) so that q @ kT is a plain tl.dot.
    kT_base = K + b * stride_kb + h_kv * stride_kh + offs_d[:, None] * stride_kd
    v_base = V + b * stride_vb + h_kv * stride_vh + offs_d[None, :] * stride_vd

    # Statistics and accumulator in fp32 whatever the input dtype.
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)

    # Causal (top-left aligned: query i sees keys j <= i): blocks that start after this
    # query block's last row are entirely in the future, so the loop stops before them.
    hi = N_K
    if CAUSAL:
        hi = tl.minimum(N_K, (pid_q + 1) * BLOCK_Q)
    for start_k in range(0, hi, BLOCK_K):
        cols = start_k + offs_k
        kT = tl.load(kT_base + cols[None, :] * stride_kn,
                     mask=d_ok[:, None] & (cols[None, :] < N_K), other=0.0)
        # qk_scale = sm_scale * log2(e): scores come out in base 2, ready for exp2.
        s = tl.dot(q, kT, input_precision=DOT_PRECISION) * qk_scale
        valid = cols[None, :] < N_K  # tail keys of the last block do not exist
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_q[:, None])
        s = tl.where(valid, s, float("-inf"))
        # Block 0 always holds key 0, visible to every row, so m_new is finite from the
        # first iteration on and exp2(m_i - m_new) never sees -inf - (-inf).
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * stride_vn,
                    mask=(cols[:, None] < N_K) & d_ok[None, :], other=0.0)
        # P goes to the tensor cores in the input dtype; the sum stays in fp32.
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / l_i[:, None]
    q_ok = offs_q < N_Q
    o_ptrs = (O + b * stride_ob + h * stride_oh
              + offs_q[:, None] * stride_on + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=q_ok[:, None] & d_ok[None, :])
    # log-sum-exp of the scaled scores in natural log: log(2^m * l) = (m + log2 l) * ln 2.
    # The backward recomputes P = exp(S * scale - lse) from it.
    tl.store(LSE + pid_bh * N_Q + offs_q, (m_i + tl.log2(l_i)) * LN2, mask=q_ok)


def dot_precision(dtype):
    """fp32 inputs get exact fp32 dots: Triton's default would be TF32 on a GPU."""
    return "ieee" if dtype == torch.float32 else "tf32"


def flash_attention(q, k, v, causal=False, sm_scale=None, *, block_q=None, block_k=None):
    """FlashAttention forward in one Triton kernel. Returns (o, lse).

    o has q's shape and dtype; lse [B, H, Nq] (fp32) is the natural-log log-sum-exp of
    the scaled scores of each query row. block_q / block_k override the default tiles:
    32 x 32 in the interpreter; on a GPU 128 x 64, or 64 x 32 when D > 128.
    """
    B, H, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    scale = default_scale(sm_scale, D)
    block_d = max(16, triton.next_power_of_2(D))
    big_d = block_d > 128  # tiles of 256-wide rows must shrink to fit in shared memory
    if q.is_cuda:
        block_q = block_q or (64 if big_d else 128)
        block_k = block_k or (32 if big_d else 64)
        # Triton 3.6 on an H100 gets K stored key-major ([.., D, N], head dim strided) wrong
        # with these tiles when D <= 32 in fp16: errors near 1, or an illegal address
        # (ARCHITECTURE.md, "Known gaps"). A contiguous copy of such a K is always right.
        if k.stride(-1) != 1:
            k = k.contiguous()
    else:  # small tiles keep the interpreter's per-block cost low
        block_q, block_k = block_q or 32, block_k or 32
    o = torch.empty_like(q)
    lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    flash_attention_kernel[flash_grid(Nq, B, H, block_q)](
        q, k, v, o, lse,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, Nq, Nk, scale * LOG2E,
        GROUP=H // Hkv, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_Q=block_q, BLOCK_K=block_k,
        CAUSAL=bool(causal), DOT_PRECISION=dot_precision(q.dtype),
        num_warps=8 if block_d == 128 else 4, num_stages=2 if big_d else 3,  # GPU only
    )
    return o, lse


# Forward TFLOPS measured on an H100 (80GB HBM3) by the course's own benchmark,
# `python -m grader bench` (2026-11-23; torch 2.11.0+cu130, triton 3.6.0): fp16, H = 16,
# B * N = 16384, TFLOPS = 4 B H N^2 D / time (half of that when causal), median time of
# triton.testing.do_bench, each call made from Python. "teaching" is the kernel of this
# notebook, "tuned" the course's tuned version of it (module 07), "naive" module 04's
# attention (S and P written to DRAM); the sdpa-* rows are PyTorch's
# scaled_dot_product_attention backends (sdpa-flash is FlashAttention-2).
H100_SEQ_LENS = (1024, 4096, 16384)
H100_FORWARD_TFLOPS = {  # (head dim D, causal): {implementation: TFLOPS at each length}
    (64, False): {"teaching": (331.1, 377.6, 394.4), "tuned": (368.2, 407.8, 376.5),
                  "sdpa-flash": (274.7, 303.3, 309.2), "sdpa-cudnn": (410.4, 436.9, 464.9),
                  "sdpa-efficient": (124.4, 127.6, 130.4), "naive": (20.5, 20.8, 20.6)},
    (64, True): {"teaching": (205.8, 256.1, 280.5), "tuned": (256.5, 363.0, 400.6),
                 "sdpa-flash": (199.0, 266.9, 284.2), "sdpa-cudnn": (309.9, 385.2, 412.5),
                 "sdpa-efficient": (106.0, 117.9, 121.9), "naive": (8.1, 8.0, 7.9)},
    (128, False): {"teaching": (368.8, 435.9, 409.3), "tuned": (399.1, 454.9, 475.9),
                   "sdpa-flash": (311.7, 361.2, 337.4), "sdpa-cudnn": (533.0, 582.0, 617.3),
                   "sdpa-efficient": (159.9, 167.6, 178.2), "naive": (36.7, 37.2, 35.5)},
    (128, True): {"teaching": (249.7, 325.8, 360.1), "tuned": (287.4, 404.5, 454.1),
                  "sdpa-flash": (241.2, 308.4, 306.5), "sdpa-cudnn": (403.7, 493.0, 531.5),
                  "sdpa-efficient": (136.7, 156.6, 170.6), "naive": (14.8, 14.7, 14.1)},
}
