"""Module 04: attention as PyTorch computes it, then naively in Triton, then what it costs.

`attention_reference` is the answer every kernel of the course is checked against.
`naive_attention` builds attention from the pieces of modules 01-03: a batched GEMM for
the scores S = Q K^T, the row-softmax kernel for P, a batched GEMM for O = P V. S and P
are whole [B, H, Nq, Nk] tensors in DRAM: that is what FlashAttention avoids.
`sp_bytes`, `naive_dram_accesses` and `flash_dram_accesses` put numbers on it.
"""
import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton

from solutions.flash_forward import check_attention_inputs, default_scale
from solutions.softmax import softmax
from solutions.tiling import batched_gemm_strided


# ---------------------------------------------------------------------------------------
# The reference, in PyTorch.

def causal_future(n_q, n_k, device):
    """[n_q, n_k] bool, True where key j is in the future of query i (j > i): top-left
    aligned like torch's SDPA is_causal, for any n_q and n_k."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).triu(1)


def repeat_kv(x, heads):
    """[B, Hkv, N, D] -> [B, heads, N, D]: K/V head j serves the consecutive query heads
    j*g .. j*g+g-1, g = heads // Hkv (query head h reads K/V head h // g)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def attention_scores(q, k, causal=False, sm_scale=None):
    """S = Q K^T * scale for q [B, H, Nq, D] and k [B, Hkv, Nk, D] (Hkv divides H), -inf
    where a key is in a query's future when causal. Computed and returned in fp32 (float64
    for float64 inputs): in fp16 a score near 1000 is rounded to a multiple of 0.5, and a
    Q K^T past 65,504 becomes inf."""
    acc = torch.promote_types(q.dtype, torch.float32)
    keys = repeat_kv(k, q.shape[1]).to(acc)
    s = q.to(acc) @ keys.transpose(-1, -2) * default_scale(sm_scale, q.shape[-1])
    if causal:
        s = s.masked_fill(causal_future(s.shape[-2], s.shape[-1], q.device), float("-inf"))
    return s


def attention_reference(q, k, v, causal=False, sm_scale=None):
    """softmax(Q K^T * scale + mask) V over the keys, computed in fp32 (float64 for float64
    inputs) and returned in q's dtype. Causal is top-left aligned like torch's SDPA
    is_causal: query i sees keys j <= i. K/V may have fewer heads than Q (GQA)."""
    p = torch.softmax(attention_scores(q, k, causal, sm_scale), dim=-1)
    return (p @ repeat_kv(v, q.shape[1]).to(p.dtype)).to(q.dtype)


# ---------------------------------------------------------------------------------------
# Naive attention in Triton: three launches, S and P in DRAM.

def naive_attention(q, k, v, causal=False, sm_scale=None):
    """Attention in three Triton steps, with S and P written to DRAM in between:
    S = Q K^T (batched GEMM), P = softmax(S) (row softmax kernel), O = P V (batched GEMM).
    S and P are fp32, [B, H, Nq, Nk] each. Scaling and the causal mask are applied in
    PyTorch on S, which sits in DRAM anyway."""
    B, H, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    # The GEMM pairs head h of a with head h of b: give every query head its K/V head.
    k, v = repeat_kv(k, H), repeat_kv(v, H)
    # fp32 copies of Q and K make S fp32 (N*D elements each: nothing next to S's N^2).
    s = batched_gemm_strided(q.float(), k.float(), True)  # [B, H, Nq, Nk]
    s.mul_(default_scale(sm_scale, D))
    if causal:
        s.masked_fill_(causal_future(Nq, Nk, q.device), float("-inf"))
    p = softmax(s.view(B * H * Nq, Nk)).view(B, H, Nq, Nk)
    del s  # S's memory is free again before O is allocated
    return batched_gemm_strided(p, v.float(), False).to(q.dtype)


# ---------------------------------------------------------------------------------------
# What it costs: memory and DRAM traffic.

def sp_bytes(B, H, Nq, Nk, dtype):
    """Bytes of S and P together: each is [B, H, Nq, Nk] with elements of `dtype`."""
    return 2 * B * H * Nq * Nk * torch.empty((), dtype=dtype).element_size()


def naive_dram_accesses(N, d):
    """Elements naive attention reads or writes in DRAM for one (batch, head), Nq = Nk = N,
    head dim d, each kernel reading its inputs once:
    S = Q K^T reads Q and K (N d each) and writes S (N^2); the softmax reads S and writes
    P (N^2 each); O = P V reads P (N^2) and V (N d) and writes O (N d)."""
    return 4 * N * d + 4 * N * N


def flash_dram_accesses(N, d, M):
    """Elements FlashAttention's forward reads or writes in DRAM for one (batch, head),
    Nq = Nk = N, head dim d, when a program may keep M elements in SRAM.

    Half of the SRAM holds the program's block of b query rows and its output accumulator
    (2 b d elements, so b = M // (4 d)); the other half holds a block of K, of V and of
    scores. Each program reads its Q block once, reads all of K and V (N d each), and
    writes its O block once; there are ceil(N / b) programs.
    """
    b = M // (4 * d)
    if b < 1:
        raise ValueError(f"an SRAM of {M} elements cannot hold one query row and its "
                         f"accumulator in half of it (4 d = {4 * d})")
    return 2 * N * d + 2 * N * d * triton.cdiv(N, b)


def flash_one_pass_max_n(d, M):
    """The longest sequence for which FlashAttention reads K and V only once, since a
    single block of queries covers it (flash_dram_accesses's model). Up to it the count is
    4 N d, the least any attention can do (read Q, K, V, write O); past it K and V are read
    again for every block of queries, and the count grows as N^2 d^2 / M."""
    return M // (4 * d)


# Naive attention at N = 16384 on an H100 ran at ~20 TFLOPS; FlashAttention at ~400, with
# the same 4 N^2 d flops. What holds naive attention back?
#   a) its GEMMs do not use the tensor cores
#   b) reading and writing S and P in DRAM: it is memory-bound
#   c) launching three kernels from Python instead of one
#   d) computing the exponentials
bottleneck_answer = "b"

# At long sequences, how does doubling the head dim d change FlashAttention's DRAM
# accesses (same SRAM M)? They are multiplied by about
#   a) 1   b) 2   c) 4   d) 8
head_dim_answer = "c"


# ---------------------------------------------------------------------------------------
# Given values.

# An H100 SM has 228 KB of shared memory (SRAM) for the programs it runs.
H100_SRAM_BYTES = 228 * 1024

# Measured on an H100 by the course's benchmark (`python -m grader bench`, 2026-11-23,
# torch 2.11.0+cu130, triton 3.6.0; solutions/perf/bench.csv, solutions/PERF.md): fp16,
# head dim 64, 16 heads, batch * N = 16384, not causal. For each N: the batch B, then the
# peak memory one call added over its inputs (MiB) and the speed (TFLOPS) of naive attention
# (this module's naive_attention) and of the course's FlashAttention forward (module 05, tuned).
H100_MEASURED = {
    # N: (B, naive MiB, naive TFLOPS, flash MiB, flash TFLOPS)
    1024: (16, 2112.0, 20.5, 33.0, 368.2),
    4096: (4, 8256.0, 20.8, 33.0, 407.8),
    16384: (1, 32832.0, 20.6, 33.0, 376.5),
}
