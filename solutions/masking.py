"""Module 02, reference solutions: masks that hide keys from softmax.

Convention used everywhere in the course: a boolean mask holds True where a key is
BLOCKED (hidden from a query), like the `attn_mask` of torch's MultiheadAttention.
An additive mask holds 0 where a key is visible and -inf where it is blocked; adding it
to the scores turns blocked scores into -inf, and exp(-inf) = 0 gives them no weight.

Shapes: scores are [..., M, N] (M queries, N keys). A query i of a causal model sees the
keys j <= i (top-left aligned, like torch SDPA's `is_causal`, also when M != N).
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton
import triton.language as tl


def causal_mask_bool(n, device="cpu"):
    """[n, n] bool mask, True above the diagonal: query i may not see the keys j > i.

    The diagonal stays visible (a token sees itself): only the strict upper triangle
    is blocked.
    """
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(diagonal=1)


def causal_mask(n, dtype=torch.float32, device="cpu"):
    """[n, n] additive causal mask: 0 on and below the diagonal, -inf above it."""
    mask = torch.zeros(n, n, dtype=dtype, device=device)
    return mask.masked_fill(causal_mask_bool(n, device=device), float("-inf"))


def apply_mask(scores, mask):
    """Scores with every blocked entry set to -inf, so that softmax gives it weight 0.

    `mask` is bool (True = blocked) or numeric (1 = blocked, 0 = visible) and broadcasts
    against `scores`, e.g. an [M, N] mask over [B, H, M, N] scores. `.bool()` turns any
    nonzero entry into True, so an additive mask (0 / -inf) works too.
    """
    return scores.masked_fill(mask.bool(), float("-inf"))


def padding_mask(lengths, n):
    """[B, 1, n] bool mask for a batch of sequences padded to n tokens: True at the key
    positions j >= lengths[b], which are padding.

    Padding hides KEYS (the last dim): no query may attend to a pad token. The middle
    dim of size 1 broadcasts over the queries, so the mask combines with scores
    [B, n, n] and with a causal [n, n] mask: `padding_mask(lengths, n) | causal_mask_bool(n)`
    is [B, n, n]. The rows of pad QUERIES stay unmasked: their outputs are ignored later.
    """
    lengths = torch.as_tensor(lengths)
    keys = torch.arange(n, device=lengths.device)
    return (keys[None, :] >= lengths[:, None])[:, None, :]


def safe_softmax(scores, dim=-1):
    """Softmax along `dim` that gives 0 (not NaN) on slices where every entry is -inf.

    A fully masked row has max -inf, and -inf - (-inf) is NaN. Such rows are given
    scores of 0 (any finite value would do) before the softmax and zeroed after it, so
    no NaN is ever computed (not even in the backward pass) and no warning is raised.
    """
    blocked = torch.isneginf(scores).all(dim=dim, keepdim=True)
    probs = torch.softmax(scores.masked_fill(blocked, 0.0), dim=dim)
    return probs.masked_fill(blocked, 0.0)


@triton.jit
def masked_softmax_kernel(out_ptr, in_ptr, lengths_ptr,
                          in_stride_b, in_stride_m, out_stride_b, out_stride_m,
                          n_keys, CAUSAL: tl.constexpr, HAS_LENGTHS: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr):
    """Masked softmax of one row of scores [B, M, N]: the grid is (M, B), and program
    (i, b) handles query row i of batch entry b. BLOCK_SIZE is a power of two >= n_keys.

    Key j is visible to query i if j <= i (when CAUSAL) and j < lengths[b] (when
    HAS_LENGTHS; lengths_ptr points to B int32). A row with no visible key gets zeros.
    """
    i = tl.program_id(0)
    b = tl.program_id(1)
    cols = tl.arange(0, BLOCK_SIZE)
    in_row = cols < n_keys
    row_in = in_ptr + b * in_stride_b + i * in_stride_m
    # Lanes past the end of the row are never read; -inf keeps them out of max and sum.
    x = tl.load(row_in + cols, mask=in_row, other=-float("inf"))
    x = x.to(tl.float32)  # statistics in fp32, whatever the input dtype
    if CAUSAL:
        x = tl.where(cols <= i, x, -float("inf"))
    if HAS_LENGTHS:
        x = tl.where(cols < tl.load(lengths_ptr + b), x, -float("inf"))
    row_max = tl.max(x, axis=0)
    # A fully masked row has max -inf and -inf - (-inf) is NaN: shift it by 0 instead,
    # so every exp is exp(-inf) = 0 ...
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    e = tl.exp(x - row_max)
    total = tl.sum(e, axis=0)
    # ... and divide its zeros by 1, not by 0.
    y = e / tl.where(total == 0.0, 1.0, total)
    row_out = out_ptr + b * out_stride_b + i * out_stride_m
    tl.store(row_out + cols, y.to(out_ptr.dtype.element_ty), mask=in_row)


def masked_softmax(scores, causal=True, lengths=None):
    """Softmax over the last dim of scores [B, M, N] or [M, N] with the Triton kernel.

    causal: query i sees the keys j <= i (top-left aligned, also when M != N).
    lengths: valid key count per batch entry (B ints, or one int for 2-D scores); the
    keys j >= lengths[b] are padding. Rows with no visible key come out as zeros.
    """
    if not isinstance(scores, torch.Tensor) or scores.dim() not in (2, 3):
        raise ValueError("masked_softmax expects scores [B, M, N] or [M, N], got shape "
                         f"{tuple(getattr(scores, 'shape', ()))}")
    if scores.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"masked_softmax supports float16, bfloat16 and float32, not {scores.dtype}")
    x = scores if scores.dim() == 3 else scores[None]
    if x.stride(-1) != 1:
        x = x.contiguous()  # the kernel walks a row with unit stride
    B, M, N = x.shape
    if lengths is not None:
        lengths = torch.as_tensor(lengths, device=x.device).to(torch.int32).reshape(-1)
        if lengths.numel() != B:
            raise ValueError(f"lengths must hold one length per batch entry ({B}), got {lengths.numel()}")
    out = torch.empty_like(x)
    masked_softmax_kernel[(M, B)](
        out, x, lengths, x.stride(0), x.stride(1), out.stride(0), out.stride(1), N,
        CAUSAL=bool(causal), HAS_LENGTHS=lengths is not None,
        BLOCK_SIZE=triton.next_power_of_2(N))
    return out.reshape(scores.shape)
