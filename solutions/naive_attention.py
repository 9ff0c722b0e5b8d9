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


def attention_reference(q, k, v, causal=False, sm_scale=None):
    """softmax(Q K^T * scale + mask) V, in the dtype of q (use float64 inputs for a
    high-precision reference). Causal is top-left aligned like torch's SDPA is_causal:
    query i sees keys j <= i. K/V may have fewer heads than Q (GQA)."""
    H, D = q.shape[1], q.shape[-1]
    k, v = repeat_kv(k, H), repeat_kv(v, H)
    s = q @ k.transpose(-1, -2) * default_scale(sm_scale, D)
    if causal:
        Nq, Nk = s.shape[-2:]
        future = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(future, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


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
        future = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).triu(1)
        s.masked_fill_(future, float("-inf"))  # top-left aligned: row i sees keys j <= i
    p = softmax(s.view(B * H * Nq, Nk))
    del s
    return batched_gemm_strided(p.view(B, H, Nq, Nk).to(q.dtype), v, False)
