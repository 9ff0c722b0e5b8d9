"""Module 09: patterns around attention, on top of module 05's FlashAttention kernel.

- A fused QKV projection: one GEMM, then q, k, v as strided views of its output.
- RoPE (rotary position embedding), halves pairing as in GPT-NeoX and Llama: in PyTorch
  (`rope`), as a Triton helper that rotates a tile as it is loaded (`rope_tile`, used by
  `rope_kernel` and by the attention kernel).
- ALiBi: the paper's slope per head (`alibi_slopes`), a bias added to the scores in the kernel.
- Sliding-window attention: the key blocks a query block must visit (`key_block_range`),
  and only those run.
- `pattern_attention_kernel` / `pattern_attention`: module 05's loop with all of them.

Positions: query row i sits at position q_offset + i, key j at position j (a KV cache:
q_offset = Nk - Nq). Every pattern depends on the distance q_offset + i - j.
"""

import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton
import triton.language as tl

from solutions.flash_forward import (LN2, LOG2E, check_attention_inputs, default_scale,
                                     dot_precision, flash_grid)
from solutions.attention_variants import online_softmax_step  # module 06's, rows of no key safe

# log2(e) inside kernels (a constexpr global): a natural-log quantity times it is in base 2.
KERNEL_LOG2E = tl.constexpr(LOG2E)
ROPE_BASE = 10000.0  # RoPE's usual base (Llama 3 uses 500,000)


# ---------------------------------------------------------------------------------------
# 1. Fused QKV projection

def check_projection_inputs(x, w_qkv, heads, kv_heads):
    """Validate x [B, N, C] and w_qkv [(heads + 2 * kv_heads) * D, C]; return D.

    Raises TypeError for non-tensors and dtypes, ValueError for shapes, head counts and
    devices.
    """
    for name, t in (("x", x), ("w_qkv", w_qkv)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must hold floats, got {t.dtype}")
    if x.dtype != w_qkv.dtype:
        raise TypeError(f"x and w_qkv must share one dtype, got {x.dtype} and {w_qkv.dtype}")
    if x.device != w_qkv.device:
        raise ValueError(f"x and w_qkv must be on one device, got {x.device} and {w_qkv.device}")
    if x.dim() != 3 or w_qkv.dim() != 2:
        raise ValueError(f"x must be [batch, seq, channels] and w_qkv [rows, channels], got "
                         f"shapes {tuple(x.shape)} and {tuple(w_qkv.shape)}")
    if w_qkv.shape[1] != x.shape[2]:
        raise ValueError(f"w_qkv has {w_qkv.shape[1]} columns but x has {x.shape[2]} channels")
    if not all(isinstance(n, int) and n >= 1 for n in (heads, kv_heads)) or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
    parts = heads + 2 * kv_heads
    if w_qkv.shape[0] % parts:
        raise ValueError(f"w_qkv has {w_qkv.shape[0]} rows, not a multiple of heads + 2 * kv_heads "
                         f"= {parts} (one block of D rows per q, k and v head)")
    return w_qkv.shape[0] // parts


def qkv_projection(x, w_qkv, heads, kv_heads=None):
    """q, k and v from one GEMM, split with views: no copy.

    x [B, N, C]; w_qkv [(heads + 2 * kv_heads) * D, C] holds the rows of W_q (heads * D),
    then those of W_k and of W_v (kv_heads * D each), each head's D rows together
    (kv_heads defaults to heads). Returns q [B, heads, N, D] and k, v [B, kv_heads, N, D],
    three strided views of the one [B, N, (heads + 2 * kv_heads) * D] product.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    D = check_projection_inputs(x, w_qkv, heads, kv_heads)
    B, N, _ = x.shape
    qkv = x @ w_qkv.T  # [B, N, (heads + 2 kv_heads) D]: the one GEMM
    qkv = qkv.view(B, N, heads + 2 * kv_heads, D)  # one slot per head, a view
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, N, D] views


# ---------------------------------------------------------------------------------------
# 2. RoPE in PyTorch

def rope(x, offset=0, base=ROPE_BASE):
    """Rotary position embedding, halves pairing (GPT-NeoX, Llama).

    x [..., N, D] with D even; row n sits at position offset + n. Lane i < D/2 and lane
    i + D/2 form pair i, which turns by the angle position * base^(-2i/D):
    (x_i, x_{i+D/2}) -> (x_i cos - x_{i+D/2} sin, x_{i+D/2} cos + x_i sin).
    The angles are computed in float64 (positions in the thousands keep their precision),
    the rotation in fp32; returns a new tensor in x's dtype.
    """
    D = x.shape[-1]
    if D % 2:
        raise ValueError(f"RoPE turns pairs of lanes: the head dim must be even, got {D}")
    half = D // 2
    freq = base ** (-2.0 * torch.arange(half, dtype=torch.float64, device=x.device) / D)
    positions = offset + torch.arange(x.shape[-2], dtype=torch.float64, device=x.device)
    angle = positions[:, None] * freq  # [N, D/2]
    cos, sin = angle.cos().float(), angle.sin().float()
    x1, x2 = x[..., :half].float(), x[..., half:].float()  # pair i: lanes i and i + D/2
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


# Q: after RoPE, the score of the query at position m and the key at position n depends on
# (see the lesson for the options).
relative_answer = "b"


# ---------------------------------------------------------------------------------------
# 3. RoPE in Triton: helpers every kernel of this module uses, then the rotation

@triton.jit
def load_tile(base, rows, n_rows, stride_n, stride_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows `rows` of one [N, D] matrix at `base`: a [len(rows), BLOCK_D] tile in the
    matrix's dtype, 0 past n_rows and past HEAD_DIM (0 adds nothing to a dot product)."""
    lanes = tl.arange(0, BLOCK_D)
    return tl.load(base + rows[:, None] * stride_n + lanes[None, :] * stride_d,
                   mask=(rows[:, None] < n_rows) & (lanes[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def store_tile(base, rows, n_rows, stride_n, stride_d, tile, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """Store a [len(rows), BLOCK_D] tile into rows `rows` of one [N, D] matrix at `base`, in
    the matrix's dtype: only rows < n_rows and lanes < HEAD_DIM."""
    lanes = tl.arange(0, BLOCK_D)
    tl.store(base + rows[:, None] * stride_n + lanes[None, :] * stride_d,
             tile.to(base.dtype.element_ty), mask=(rows[:, None] < n_rows) & (lanes[None, :] < HEAD_DIM))


# Worked example: a kernel built from the two helpers above.
@triton.jit
def copy_heads_kernel(X, Y, stride_xb, stride_xh, stride_xn, stride_xd,
                      stride_yb, stride_yh, stride_yn, stride_yd, H, N,
                      HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Y[b, h] = X[b, h] for [B, H, N, D] tensors in any layout. Program (i, b*H + h)
    copies rows i*BLOCK_N ... of batch b, head h: module 05's grid, with BLOCK_N rows."""
    pair = tl.program_id(1)  # which (batch, head): pair = b * H + h
    b = pair // H
    h = pair % H
    first_row = tl.program_id(0) * BLOCK_N
    rows = first_row + tl.arange(0, BLOCK_N)
    tile = load_tile(X + b * stride_xb + h * stride_xh, rows, N, stride_xn, stride_xd, HEAD_DIM, BLOCK_D)
    store_tile(Y + b * stride_yb + h * stride_yh, rows, N, stride_yn, stride_yd, tile, HEAD_DIM, BLOCK_D)


@triton.jit
def rope_tile(base, rows, positions, n_rows, stride_n, stride_d, rope_base,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows `rows` of one [N, D] matrix at `base`, rotated by RoPE as they are loaded: row r
    sits at positions[r]; halves pairing (lane i < D/2 with lane i + D/2), pair i turning
    by positions[r] * rope_base^(-2i/D). Returns an fp32 [len(rows), BLOCK_D] tile, 0 past
    n_rows and past HEAD_DIM."""
    lane = tl.arange(0, BLOCK_D)
    half = HEAD_DIM // 2
    first = lane < half
    partner = tl.where(first, lane + half, lane - half)  # the other lane of each pair
    pair = tl.where(first, lane, lane - half)
    sign = tl.where(first, -1.0, 1.0)  # x_i cos - x_{i+D/2} sin, x_{i+D/2} cos + x_i sin
    x = load_tile(base, rows, n_rows, stride_n, stride_d, HEAD_DIM, BLOCK_D).to(tl.float32)
    # The same rows again, each lane reading its partner: a second load, no shuffle.
    real = (rows[:, None] < n_rows) & (lane[None, :] < HEAD_DIM)
    x_partner = tl.load(base + rows[:, None] * stride_n + partner[None, :] * stride_d, mask=real,
                        other=0.0).to(tl.float32)
    freq = tl.exp2(pair.to(tl.float32) * (-2.0 / HEAD_DIM) * tl.log2(rope_base))
    angle = positions[:, None].to(tl.float32) * freq[None, :]
    return x * tl.cos(angle) + sign[None, :] * x_partner * tl.sin(angle)


@triton.jit
def rope_kernel(X, Y, stride_xb, stride_xh, stride_xn, stride_xd,
                stride_yb, stride_yh, stride_yn, stride_yd, H, N, pos_offset, rope_base,
                HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Y[b, h] = RoPE(X[b, h]) for [B, H, N, D] tensors in any layout, row n at position
    pos_offset + n. Program (i, b*H + h) rotates rows i*BLOCK_N ... of batch b, head h."""
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    turned = rope_tile(X + b * stride_xb + h * stride_xh, rows, pos_offset + rows, N,
                       stride_xn, stride_xd, rope_base, HEAD_DIM, BLOCK_D)
    store_tile(Y + b * stride_yb + h * stride_yh, rows, N, stride_yn, stride_yd, turned, HEAD_DIM, BLOCK_D)


# ---------------------------------------------------------------------------------------
# 4. ALiBi

def alibi_slopes(heads):
    """ALiBi's slope of each head (Press, Smith and Lewis, 2022), a float32 tensor [heads].

    For a power of two H, the geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^(-8): head h
    gets 2^(-8(h+1)/H). Otherwise, with P the largest power of two below H: the P slopes
    of P heads, then the slopes of 2P heads at odd ranks (the 1st, 3rd, 5th, ...), until
    there are H.
    """
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"heads must be a positive int, got {heads!r}")

    def geometric(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    p = 1 << (heads.bit_length() - 1)  # the largest power of two <= heads
    slopes = geometric(p) + geometric(2 * p)[0::2][:heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


# ---------------------------------------------------------------------------------------
# 5. Sliding window: the key blocks a query block visits

def key_block_range(q_block, n_q, n_k, block_q, block_k, *, q_offset=0, causal=False, window=None):
    """(first, stop): query block q_block visits key blocks first ... stop - 1, the blocks
    that hold a key one of its queries sees.

    Query i sits at position q_offset + i, key j at j. Causal: query at p sees keys j <= p.
    A window W (always causal) also hides keys j <= p - W: each query sees W keys, itself
    included. Only the block's real queries (i < n_q) count.
    """
    first, stop = 0, triton.cdiv(n_k, block_k)
    if causal or window is not None:
        first_pos = q_offset + q_block * block_q  # position of the block's first query
        last_pos = q_offset + min(n_q, (q_block + 1) * block_q) - 1  # and of its last real one
        stop = min(n_k - 1, last_pos) // block_k + 1
        if window is not None:
            first = max(0, first_pos - window + 1) // block_k  # partly visible blocks count
    return first, stop


# Q: N = 4096 tokens, blocks of 64 queries and 64 keys, a window of 512: how many key blocks
# does the query block that starts at token 2048 visit? (see the lesson for the options)
window_blocks_answer = "b"


# ---------------------------------------------------------------------------------------
# 6. The attention kernel with every pattern

@triton.jit
def finish_rows(acc, m_i, l_i):
    """(O, LSE) of each row: acc / l and the natural-log log-sum-exp (m + log2 l) * ln 2.
    A padding row past N_Q may have seen no key at all (its window can lie past the last
    key): l = 0 there, so it gets O = 0 and LSE = -inf instead of 0 / 0. Its stores are
    masked anyway."""
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    return acc / l_safe[:, None], (m_i + tl.log2(l_safe)) * LN2


@triton.jit
def pattern_attention_kernel(
    Q, K, V, O, LSE, SLOPES, BLOCKS_RUN,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    H, N_Q, N_K, qk_scale, q_offset, window, rope_base,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
    CAUSAL: tl.constexpr, ROPE: tl.constexpr, ALIBI: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Module 05's FlashAttention loop, with positions: query row i sits at q_offset + i,
    key j at j, and distance = q_offset + i - j.

    ROPE: q and k are rotated by rope_tile as they are loaded (base rope_base).
    ALIBI: -SLOPES[h] * |distance| is added to the scaled scores of head h.
    CAUSAL: a query sees keys with 0 <= distance < window, and the loop visits only the
    key blocks that hold one; BLOCKS_RUN[b, h, i] counts the key blocks program
    (i, b*H + h) visited ([B, H, cdiv(N_Q, BLOCK_Q)], int32, contiguous).
    O and LSE as in module 05 (LSE: [B, H, N_Q] contiguous, fp32); K/V head h // GROUP.
    """
    pid_q = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    q_base = Q + b * stride_qb + h * stride_qh
    k_base = K + b * stride_kb + (h // GROUP) * stride_kh
    v_base = V + b * stride_vb + (h // GROUP) * stride_vh
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    q_pos = q_offset + rows  # where these queries sit in the sequence
    if ROPE:
        q = rope_tile(q_base, rows, q_pos, N_Q, stride_qn, stride_qd, rope_base, HEAD_DIM,
                      BLOCK_D).to(Q.dtype.element_ty)
    else:
        q = load_tile(q_base, rows, N_Q, stride_qn, stride_qd, HEAD_DIM, BLOCK_D)
    if ALIBI:
        slope = tl.load(SLOPES + h) * KERNEL_LOG2E  # the bias in base 2, like the scores

    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
    lo = 0
    hi = N_K
    if CAUSAL:  # only the key blocks that hold a key some query of this block sees
        first_pos = q_offset + pid_q * BLOCK_Q
        last_pos = q_offset + tl.minimum(N_Q, (pid_q + 1) * BLOCK_Q) - 1
        hi = tl.minimum(N_K, last_pos + 1)
        lo = tl.maximum(first_pos - window + 1, 0) // BLOCK_K * BLOCK_K  # a partly visible block runs
    visited = 0
    for start in range(lo, hi, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        if ROPE:
            k = rope_tile(k_base, cols, cols, N_K, stride_kn, stride_kd, rope_base, HEAD_DIM,
                          BLOCK_D).to(K.dtype.element_ty)
        else:
            k = load_tile(k_base, cols, N_K, stride_kn, stride_kd, HEAD_DIM, BLOCK_D)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        distance = q_pos[:, None] - cols[None, :]
        if ALIBI:
            s = s - slope * tl.abs(distance)
        visible = cols[None, :] < N_K
        if CAUSAL:
            visible = visible & (distance >= 0) & (distance < window)
        s = tl.where(visible, s, float("-inf"))
        v = load_tile(v_base, cols, N_K, stride_vn, stride_vd, HEAD_DIM, BLOCK_D)
        m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, s, v, DOT_PRECISION)
        visited += 1

    o, lse = finish_rows(acc, m_i, l_i)
    store_tile(O + b * stride_ob + h * stride_oh, rows, N_Q, stride_on, stride_od, o, HEAD_DIM, BLOCK_D)
    tl.store(LSE + pid_bh * N_Q + rows, lse, mask=rows < N_Q)
    tl.store(BLOCKS_RUN + pid_bh * tl.cdiv(N_Q, BLOCK_Q) + pid_q, visited)


# ---------------------------------------------------------------------------------------
# 7. The wrapper

def check_pattern_options(q, k, *, causal, window, rope, q_offset, alibi_slopes):
    """Validate the options of pattern_attention (q, k already checked by
    check_attention_inputs). Raises TypeError or ValueError with the reason."""
    H, Nq, D = q.shape[1], q.shape[2], q.shape[3]
    Nk = k.shape[2]
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise ValueError(f"q_offset must be an int >= 0 (the position of query 0), got {q_offset!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or an int >= 1 (keys each query sees), got {window!r}")
    if (causal or window is not None) and q_offset + Nq > Nk:
        raise ValueError(f"causal: queries at positions {q_offset} ... {q_offset + Nq - 1} need keys "
                         f"up to there, but there are {Nk} keys (q_offset + Nq must be <= Nk)")
    if rope and D % 2:
        raise ValueError(f"RoPE turns pairs of lanes: the head dim must be even, got {D}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32:
            raise TypeError("alibi_slopes must be a float32 tensor [heads]")
        if tuple(alibi_slopes.shape) != (H,) or alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes must be [{H}] (one slope per query head) on {q.device}, "
                             f"got {tuple(alibi_slopes.shape)} on {alibi_slopes.device}")


def pattern_attention(q, k, v, *, causal=False, window=None, rope=False, rope_base=ROPE_BASE,
                      q_offset=0, alibi_slopes=None, sm_scale=None, block_q=None, block_k=None):
    """FlashAttention forward with this module's patterns, in one launch of
    pattern_attention_kernel. Returns (o, lse, blocks_run).

    Query i sits at position q_offset + i, key j at j. rope: rotate q and k (halves
    pairing, base rope_base). alibi_slopes: a float32 [H] tensor (alibi_slopes(H)), bias
    -slope * |distance|. causal: key position <= query position; window W (causal too):
    only the W keys up to the query's position. blocks_run [B, H, cdiv(Nq, block_q)]
    (int32): the key blocks each program visited. Blocks as in module 05.
    """
    B, H, _, Nq, Nk, D = check_attention_inputs(q, k, v)
    check_pattern_options(q, k, causal=causal, window=window, rope=rope, q_offset=q_offset,
                          alibi_slopes=alibi_slopes)
    causal = causal or window is not None  # a sliding window is causal
    if window is None:
        window = q_offset + Nq  # longer than any distance: plain causal
    block_d = max(16, triton.next_power_of_2(D))
    if q.is_cuda:
        block_q = block_q or (64 if block_d > 128 else 128)
        block_k = block_k or (32 if block_d > 128 else 64)
    else:  # small tiles keep the interpreter's per-block cost low
        block_q, block_k = block_q or 32, block_k or 32
    o = torch.empty_like(q)
    lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    blocks_run = torch.empty(B, H, triton.cdiv(Nq, block_q), device=q.device, dtype=torch.int32)
    pattern_attention_kernel[flash_grid(Nq, B, H, block_q)](
        q, k, v, o, lse, alibi_slopes, blocks_run,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, Nq, Nk, default_scale(sm_scale, D) * LOG2E, q_offset, window, float(rope_base),
        GROUP=H // k.shape[1], HEAD_DIM=D, BLOCK_D=block_d, BLOCK_Q=block_q, BLOCK_K=block_k,
        CAUSAL=causal, ROPE=bool(rope), ALIBI=alibi_slopes is not None,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=8 if block_d == 128 else 4, num_stages=2 if block_d > 128 else 3,  # GPU only
    )
    return o, lse, blocks_run
