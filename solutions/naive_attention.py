"""Module 04: attention as PyTorch computes it, then naively in Triton.

`attention_reference` is the answer every kernel of the course is checked against.
`naive_attention` builds attention from the pieces of modules 01-03: a batched GEMM for
the scores S = Q K^T, the row-softmax kernel for P, a batched GEMM for O = P V. S and P
are whole [B, H, Nq, Nk] tensors in DRAM: that is what FlashAttention avoids.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch

from solutions.flash_forward import check_attention_inputs, default_scale
from solutions.softmax import softmax
from solutions.tiling import batched_gemm_strided


def repeat_kv(x, heads):
    """[B, Hkv, N, D] -> [B, heads, N, D]: K/V head j serves query heads j*g .. j*g+g-1."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def causal_future(n_q, n_k, device):
    """True where key j is in the future of query i (j > i), top-left aligned like torch's
    SDPA is_causal, for any n_q and n_k."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).triu(1)


def attention_scores(q, k, causal=False, sm_scale=None):
    """S = Q K^T * scale, -inf in the future when causal, in q's dtype; K may have fewer
    heads than Q (GQA)."""
    s = q @ repeat_kv(k, q.shape[1]).transpose(-1, -2) * default_scale(sm_scale, q.shape[-1])
    if causal:
        s = s.masked_fill(causal_future(s.shape[-2], s.shape[-1], q.device), float("-inf"))
    return s


def attention_reference(q, k, v, causal=False, sm_scale=None):
    """softmax(Q K^T * scale + mask) V, in the dtype of q (use float64 inputs for a
    high-precision reference). Causal is top-left aligned like torch's SDPA is_causal:
    query i sees keys j <= i. K/V may have fewer heads than Q (GQA)."""
    return torch.softmax(attention_scores(q, k, causal, sm_scale), dim=-1) @ repeat_kv(v, q.shape[1])


def naive_attention(q, k, v, causal=False, sm_scale=None):
    """Attention in three Triton steps, with S and P written to DRAM in between:
    S = Q K^T (batched GEMM), P = softmax(S) (row softmax kernel), O = P V (batched GEMM).
    Scaling and the causal mask are applied in PyTorch on S, which sits in DRAM anyway."""
    B, H, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    # The GEMM pairs head h of a with head h of b: give every query head its K/V copy.
    k, v = repeat_kv(k, H), repeat_kv(v, H)
    s = batched_gemm_strided(q, k, True).float()  # [B, H, Nq, Nk]: Theta(N^2) bytes
    s.mul_(default_scale(sm_scale, D))
    if causal:
        s.masked_fill_(causal_future(Nq, Nk, q.device), float("-inf"))
    p = softmax(s.view(B * H * Nq, Nk))
    del s
    return batched_gemm_strided(p.view(B, H, Nq, Nk).to(q.dtype), v, False)
