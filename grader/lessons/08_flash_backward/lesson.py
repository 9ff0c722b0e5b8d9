# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 The backward pass: training kernels
#
# Training needs more than `O`: it needs the gradients `dQ`, `dK`, `dV` of the loss. PyTorch's
# autograd can differentiate module 04's attention, but it keeps what the backward needs:
# the weights `P`, `B x H x Nq x Nk` numbers, the very matrix FlashAttention never writes.
# FlashAttention's backward keeps only `Q`, `K`, `V`, `O` and one number per query row (the
# log-sum-exp `lse` that module 05's forward returns), and recomputes `P` tile by tile.
#
# In this notebook you will write:
# 1. `softmax_backward`: the gradient of softmax (2 points);
# 2. `attention_backward_reference`: the gradients of attention, in PyTorch (3 points);
# 3. `bwd_preprocess_kernel`: `delta = rowsum(dO * O)`, one number per query row (2 points);
# 4. `bwd_dkdv_kernel`: `dK` and `dV`, one program per block of keys (6 points);
# 5. `bwd_dq_kernel`: `dQ`, one program per block of queries (4 points);
# 6. `_accumulate_dq`: `dQ` inside the `dK`/`dV` kernel, with atomic adds (3 points);
# 7. `flash_backward`: the wrapper that launches them (3 points);
# 8. `FlashAttentionFunction`: the `torch.autograd.Function` that makes all of it trainable
#    (3 points);
# 9. one question on fusing `dQ` or not (1 point);
#
# and then train a tiny model with it.
#
# Run the cells in order. Each exercise is followed by a check that prints `ok` lines when
# your code is right and says what is wrong when it is not. Hidden tests run the same
# checks on inputs you have not seen.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import course  # first: picks the GPU, or Triton's interpreter on a CPU, before triton loads

import math

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl

from course import plots
from course.checks import flash_backward as checks

print(course.describe())

# %% [markdown]
# ## 1. The gradient of softmax
#
# One row: `p = softmax(x)`, `pᵢ = exp(xᵢ) / Σₖ exp(xₖ)`. Each `pᵢ` depends on every `xⱼ`:
#
# $$\frac{\partial p_i}{\partial x_j} = p_i\,(\delta_{ij} - p_j)$$
#
# (`δᵢⱼ` is 1 when `i = j`, else 0): the Jacobian of a row is `diag(p) − p pᵀ`. Given the
# gradient `dp` of the loss with respect to `p`, the chain rule gives
#
# $$dx_j = \sum_i dp_i\, p_i\,(\delta_{ij} - p_j) = p_j \Big(dp_j - \sum_i p_i\, dp_i\Big)$$
#
# so the `N x N` Jacobian is never needed: `dx = p * (dp - sum(p * dp))`, one number per row
# subtracted. The worked example builds the Jacobian of one row of 5 and compares both with
# PyTorch's autograd:

# %% nbgrader={"grade": false, "grade_id": "demo_jacobian", "locked": true, "schema_version": 3, "solution": false, "task": false}
x_row = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0], dtype=torch.float64, requires_grad=True)
p_row = torch.softmax(x_row, dim=0)
dp_row = torch.tensor([0.3, -1.0, 2.0, 0.5, -0.2], dtype=torch.float64)
jacobian = torch.diag(p_row) - torch.outer(p_row, p_row)
p_row.backward(dp_row)
with torch.no_grad():
    by_jacobian = jacobian.T @ dp_row
    by_formula = p_row * (dp_row - (p_row * dp_row).sum())
print("autograd:  ", [round(float(g), 4) for g in x_row.grad])
print("Jacobian:  ", [round(float(g), 4) for g in by_jacobian])
print("p*(dp-Σ):  ", [round(float(g), 4) for g in by_formula])
plots.heatmaps({"Jacobian ∂pᵢ/∂xⱼ = diag(p) − p pᵀ": jacobian.detach()}, annotate=True,
               cmap="coolwarm", figsize_per=4)
plt.show()

# %% [markdown]
# Each row of the Jacobian sums to 0 (the weights always sum to 1, whatever `x` does), so
# adding a constant to `dp` changes nothing. Write `softmax_backward(p, dp, dim=-1)`: the
# gradient `dx` of `p = softmax(x, dim)` for any shape, the sum running over `dim`. Compute
# in fp32 (float64 stays float64) and return `p`'s dtype. No autograd: the function may not
# use `backward`, `grad`, `autograd` or `requires_grad` (the grader reads the code for it).
# The tests use 2-D to 4-D tensors, every `dim`, fp32 and fp16, views (transposed storage),
# and rows of logits far above and far below zero (weights of exactly 0 and nearly 1) with
# `dp` around ±1,000.

# %% nbgrader={"grade": false, "grade_id": "softmax_backward", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: flash_backward.softmax_backward

# %% nbgrader={"grade": true, "grade_id": "test_softmax_backward", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_softmax_backward(softmax_backward)

# %% [markdown]
# ## 2. The gradients of attention
#
# Per (batch, head): `S = scale · Q Kᵀ`, `P = softmax(S)` row by row, `O = P V`. Given `dO`:
#
# | step | forward | backward |
# | --- | --- | --- |
# | output | `O = P V` | `dV = Pᵀ dO`, `dP = dO Vᵀ` |
# | weights | `P = softmax(S)` | `dS = P ∘ (dP − δ)`, `δᵢ = Σⱼ Pᵢⱼ dPᵢⱼ` (section 1, row by row) |
# | scores | `S = scale · Q Kᵀ` | `dQ = scale · dS K`, `dK = scale · dSᵀ Q` |
#
# (`∘` is the elementwise product.) Three facts make this FlashAttention's backward:
#
# - **`P` from `lse`.** The forward returned `lse` = log Σⱼ exp(Sᵢⱼ) per row, so
#   `Pᵢⱼ = exp(Sᵢⱼ − lseᵢ)`: one subtraction and one exponential per score, no max and no sum
#   to redo. With `causal`, `P` is 0 where key `j > i`, as in the forward.
# - **`δ` from `O`.** `δᵢ = Σⱼ Pᵢⱼ dPᵢⱼ = Σⱼ Pᵢⱼ (dOᵢ · Vⱼ) = dOᵢ · Σⱼ Pᵢⱼ Vⱼ = dOᵢ · Oᵢ`: a
#   dot product of two rows of `D` numbers, instead of a sum over all `Nk` keys of `P ∘ dP`.
#   It can be computed once, before any tile of `P` exists.
# - **The scale twice.** `S = scale · Q Kᵀ`, so both `dQ` and `dK` get the factor `scale`.
#
# With grouped-query attention (module 04: `H` query heads, `Hkv` K/V heads, head `h` reads
# K/V head `h // (H // Hkv)`), a K/V head is used by several query heads: its `dK` and `dV` are
# the **sums** over the query heads of its group. The numbers, on one causal head:

# %% nbgrader={"grade": false, "grade_id": "given_attention", "locked": true, "schema_version": 3, "solution": false, "task": false}
# From modules 04 and 05: input checks, the scale, the causal mask, GQA, the reference.
# given: flash_forward.SUPPORTED_DTYPES
# given: flash_forward.MIN_HEAD_DIM
# given: flash_forward.MAX_HEAD_DIM
# given: flash_forward.check_attention_inputs
# given: flash_forward.default_scale
# given: naive_attention.causal_future
# given: naive_attention.repeat_kv
# given: naive_attention.attention_scores
# given: naive_attention.attention_reference

# %% nbgrader={"grade": false, "grade_id": "demo_delta", "locked": true, "schema_version": 3, "solution": false, "task": false}
torch.manual_seed(0)
q_d, k_d, v_d, do_d = (torch.randn(1, 1, 6, 16, dtype=torch.float64) for _ in range(4))
s_d = attention_scores(q_d, k_d, causal=True)
p_d = torch.softmax(s_d, dim=-1)
o_d = p_d @ v_d
dp_d = do_d @ v_d.transpose(-1, -2)
print("δ = rowsum(P ∘ dP):", [round(float(x), 4) for x in (p_d * dp_d).sum(-1).flatten()])
print("δ = rowsum(dO ∘ O):", [round(float(x), 4) for x in (do_d * o_d).sum(-1).flatten()])
lse_d = torch.logsumexp(s_d, dim=-1)
print("P from lse, max error:", float((torch.exp(s_d - lse_d[..., None]) - p_d).abs().max()))
plots.heatmaps({"P (causal)": p_d[0, 0], "dP = dO Vᵀ": dp_d[0, 0],
                "dS = P ∘ (dP − δ)": (p_d * (dp_d - (do_d * o_d).sum(-1, keepdim=True)))[0, 0]},
               cmap="coolwarm")
plt.show()

# %% [markdown]
# `dS` is 0 wherever `P` is (the masked future), and each of its rows sums to 0.
#
# Write `attention_backward_reference(q, k, v, o, do, lse, causal=False, sm_scale=None)`: the
# table above in PyTorch, in **float64** (convert every input with `.double()` first),
# returning `(dq, dk, dv)` in float64: the reference your kernels will be measured against.
#
# - `q` is `[B, H, Nq, D]`, `k` and `v` `[B, Hkv, Nk, D]`; `o` and `do` like `q`; `lse`
#   `[B, H, Nq]` (fp32, natural log). Use the given `check_attention_inputs` and
#   `default_scale`; `repeat_kv` gives every query head its K/V head, and `attention_scores`
#   gives `S` (with the causal mask, top-left aligned: query `i` sees keys `j <= i`, for any
#   `Nq` and `Nk`).
# - `P = exp(S − lse)`, not a softmax of `S` again; `δ = rowsum(dO ∘ O)`.
# - `dk` and `dv` have `k`'s shape: sum over the query heads of each group (a
#   `.view(B, Hkv, H // Hkv, Nk, D)` of the per-query-head result, summed over dim 2).
# - No autograd (the rule of section 1).
#
# The tests try: `Nq != Nk`, causal and not, GQA and MQA (`Hkv = 1`), an explicit `sm_scale`,
# fp32 and fp16 inputs, views (`[B, N, H, D]` viewed as `[B, H, N, D]`, transposed matrices,
# slices of longer rows), rows of scores far above and far below zero (±128 and more after
# the scale), and `V` around ±2,000.

# %% nbgrader={"grade": false, "grade_id": "attention_backward_reference", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: flash_backward.attention_backward_reference

# %% nbgrader={"grade": true, "grade_id": "test_attention_backward_reference", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_attention_backward_reference(attention_backward_reference)

# %% [markdown]
# What autograd would keep for the backward of module 04's attention, against what
# FlashAttention keeps (`Q`, `K`, `V`, `O` and `lse`), for one batch entry of 16 heads with
# `D = 64` in fp32. Autograd's figure is measured (the tensors it saves, at `N = 256`) and
# grows as `N²`:

# %% nbgrader={"grade": false, "grade_id": "demo_saved", "locked": true, "schema_version": 3, "solution": false, "task": false}
saved = {}


def keep(t):
    saved[t.data_ptr()] = t  # a tensor saved twice is kept once
    return t


q_m, k_m, v_m = (torch.randn(1, 16, 256, 64, requires_grad=True) for _ in range(3))
with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
    attention_reference(q_m, k_m, v_m)
square = sum(t.numel() * t.element_size() for t in saved.values() if t.shape[-2:] == (256, 256))
per_pair = square / (16 * 256 ** 2)  # bytes per (query, key) pair and head
lengths = [1024, 4096, 16384]
autograd_mib = [(per_pair * 16 * n * n + 3 * 16 * n * 64 * 4) / 2 ** 20 for n in lengths]
flash_mib = [(4 * 16 * n * 64 * 4 + 16 * n * 4) / 2 ** 20 for n in lengths]
print(f"autograd keeps {per_pair:g} bytes per (query, key) pair and head (P), beside Q, K and V")
plots.lines(lengths, {"autograd through attention_reference": autograd_mib,
                      "FlashAttention: Q, K, V, O, lse": flash_mib},
            title="memory kept for the backward, B = 1, H = 16, D = 64, fp32",
            xlabel="sequence length N", ylabel="MiB", logx=True, logy=True)
plt.show()

# %% [markdown]
# ## 3. The plan: who computes what
#
# `dV` and `dK` of a key `j` are sums over the **queries** (`dVⱼ = Σᵢ Pᵢⱼ dOᵢ`); `dQ` of a
# query `i` is a sum over the **keys**. So the backward walks the tiles of `S` in both
# directions:
#
# - the **dK/dV kernel** gives each program a block of `BLOCK_N` keys of one (batch, K/V head):
#   it loads its `K` and `V` tiles once, keeps `dK` and `dV` in fp32 registers, and walks the
#   query blocks (of every query head of its GQA group), recomputing each tile of `P`;
# - the **dQ kernel** gives each program a block of `BLOCK_M` queries and walks the key blocks,
#   recomputing `P` and `dP` again; or the dK/dV kernel adds each tile's part of `dQ` into
#   memory itself, with atomic adds (section 7).
#
# With `causal`, the tiles above the diagonal are all zero: the dK/dV program of key block
# `j` starts at the query block that holds row `j · BLOCK_N`, and the dQ program of query
# block `i` stops after the key block holding its last row. Only tiles that cross the
# diagonal (or the ragged ends) need masks.

# %% nbgrader={"grade": false, "grade_id": "plot_tiles", "locked": true, "schema_version": 3, "solution": false, "task": false}
def backward_tiles(ax, blocks, column=None, row=None, causal=True):
    """Tiles of S (query blocks down, key blocks across; blocks as tall as wide) that the
    program owning key block `column` (or query block `row`) visits, numbered in order."""
    import matplotlib.colors as mcolors
    grid = torch.zeros(blocks, blocks)
    if causal:
        grid.masked_fill_(causal_future(blocks, blocks, "cpu"), -1)  # skipped
    cells = [(i, column) for i in range(blocks)] if column is not None else \
        [(row, j) for j in range(blocks)]
    cells = [(i, j) for i, j in cells if grid[i, j] == 0]
    for step, (i, j) in enumerate(cells):
        grid[i, j] = 2 if causal and i == j else 1  # the diagonal tile is masked inside
        ax.text(j, i, f"{step}", ha="center", va="center")
    ax.imshow(grid.numpy(), cmap=mcolors.ListedColormap(["#d9d9d9", "white", "#9ecae1", "#c6dbef"]),
              vmin=-1.5, vmax=2.5)
    ax.set_xticks(range(blocks))
    ax.set_yticks(range(blocks))
    ax.set(xlabel="key block", ylabel="query block")


fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
backward_tiles(axes[0], 5, column=1)
axes[0].set_title("dK/dV program of key block 1:\nwalks the query blocks, from the diagonal on",
                  fontsize=10)
backward_tiles(axes[1], 5, row=3)
axes[1].set_title("dQ program of query block 3:\nwalks the key blocks, up to the diagonal",
                  fontsize=10)
fig.suptitle("causal: grey tiles are skipped, the diagonal tile (pale) is masked inside", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Layout, and what is given
#
# The kernels read `q`, `k` and `v` through their strides (a `[B, N, H, D]` projection viewed
# as `[B, H, N, D]` needs no copy) but read each row's `D` numbers as one contiguous vector,
# so the head dim must have stride 1 (the wrapper copies the rare tensor whose head dim is
# not contiguous). `o`, `dO`, `lse`, `delta` and the gradients are contiguous tensors the
# wrapper makes, addressed by shape: row `r` of (batch `b`, head `h`) of `dO` starts at
# `DO + ((b · H + h) · N_Q + r) · HEAD_DIM`, and its `lse` is at `LSE + (b · H + h) · N_Q + r`.
# Fewer arguments, and each kernel argument costs host time at every launch.
#
# Given: module 05's forward (it returns `o` and `lse`; you will not change it), the constant
# `LOG2E_C` (log₂ e as a `tl.constexpr`, usable inside kernels), and `_load_rows`, which
# loads a `[rows, BLOCK_D]` tile whose row `r` starts at `base + r · stride_rows`, with 0 in
# every row `>= n_rows` and lane `>= HEAD_DIM`. Its `CHECK_ROWS=False` skips the row mask, for
# blocks known to lie inside the tensor (the lane mask stays when `BLOCK_D != HEAD_DIM`).
#
# Every kernel and `@triton.jit` helper you write is one function, defined once (the grader
# reads the code for it, as in module 05).

# %% nbgrader={"grade": false, "grade_id": "given_forward", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: flash_forward.LOG2E
# given: flash_forward.LN2
# given: flash_forward.dot_precision
# given: flash_forward.flash_grid
# given: flash_forward.flash_attention_kernel
# given: flash_forward.flash_attention
# given: flash_backward.LOG2E_C
# given: flash_backward._load_rows
# given: flash_backward.check_backward_inputs

# %% [markdown]
# ## 4. Preprocessing: δ
#
# Every tile of the dK/dV kernel needs `δ` of its query rows, and `δ` of a row needs that
# whole row of `dO` and `O`: so it is computed first, by its own small kernel, into an fp32
# `[B, H, Nq]` tensor.
#
# Write `_row_delta(o, do)`: for two `[rows, BLOCK_D]` tiles, the fp32 sum over each row of
# `o · do` (convert both to fp32 before multiplying: in fp16, the product of an `o` near 2,000
# and a `do` near 1 is already rounded to a whole number). Then `bwd_preprocess_kernel`: program
# `(i, b · H + h)` loads rows `i · BLOCK_M ...` of `O` and `DO` with `_load_rows` (row
# stride `HEAD_DIM`; the first row of the pair is `(b · H + h) · N_Q`: make that number with
# `tl.program_id(1).to(tl.int64)`, since `rows · HEAD_DIM` passes 2³¹ in long sequences) and
# stores their `δ` at `DELTA + (b · H + h) · N_Q + row`, masked.
#
# The check launches it on `(cdiv(Nq, BLOCK_M), B · H)` with ragged `Nq`, `D` not a power of
# two (`BLOCK_D` is `D` rounded up), fp32 and fp16, and `O` around +2,000 or −2,000.

# %% nbgrader={"grade": false, "grade_id": "bwd_preprocess_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: flash_backward._row_delta
# solution: flash_backward.bwd_preprocess_kernel

# %% nbgrader={"grade": true, "grade_id": "test_bwd_preprocess_kernel", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_bwd_preprocess_kernel(bwd_preprocess_kernel)

# %% [markdown]
# ## 5. The dK/dV kernel
#
# One program per key block: program `(j, b · H_KV + h_kv)`, keys `start_n = j · BLOCK_N ...`.
# It works on **transposed** tiles, keys down and queries across, because then `Pᵀ` and
# `dSᵀ` come out of the products already in the layout `dV += Pᵀ dO` and `dK += dSᵀ Q` want.
# Per query block of `BLOCK_M` rows (`offs_m`), `_dkdv_q_blocks` does:
#
# ```
# q, do      = the Q and dO tiles of these rows          [BLOCK_M, BLOCK_D]
# lse, delta = their lse and δ                           [BLOCK_M]
# pT   = exp2(tl.dot(k, tl.trans(q)) · qk_scale − lse · LOG2E_C)   [BLOCK_N, BLOCK_M]
# pT   = 0 where the query row >= N_Q, the key >= N_K, or (CAUSAL) query < key
# dv  += tl.dot(pT in do's dtype, do)
# dpT  = tl.dot(v, tl.trans(do))
# dsT  = pT · (dpT − delta[None, :])                      δ is per query: a column here
# dk  += tl.dot(dsT in q's dtype, q)
# (FUSED_DQ: _accumulate_dq(...), section 7)
# ```
#
# `Q` tiles load with `_load_rows` through `stride_qn`, `dO` tiles through `HEAD_DIM` (it is
# contiguous), `lse` and `δ` with `mask=offs_m < N_Q, other=0.0`. `qk_scale = sm_scale · log₂e`
# puts the scores in base 2, as in the forward; `lse` is a natural log, so it needs the factor
# `LOG2E_C` too. Pass `input_precision=DOT_PRECISION` to every `tl.dot`. `MASK=False` may
# skip the three masks (and load with `CHECK_ROWS=False`): the caller only uses it for
# blocks that need none.
#
# `bwd_dkdv_kernel` then:
#
# 1. loads its `K` and `V` tiles once (`_load_rows` through `stride_kn`, `stride_vn`, from
#    `K + b · stride_kb + h_kv · stride_kh`; make `b` an int64), and zeroes fp32 `dk`, `dv`;
# 2. picks the query blocks: all of them, or with `CAUSAL` those from
#    `lo = (start_n // BLOCK_M) · BLOCK_M` on (earlier rows see none of these keys);
# 3. for each query head `h = h_kv · GROUP + g` of its group (`for g in range(GROUP)`), calls
#    `_dkdv_q_blocks` with that head's pointers (`Q + b · stride_qb + h · stride_qh`, and
#    `DO`, `LSE`, `DELTA`, `DQ` at that head's first row `(b · H + h) · N_Q`);
# 4. multiplies `dk` by `sm_scale` once, at the end, and stores `dk` and `dv` in `DK`'s and
#    `DV`'s dtype at row `(b · H_KV + h_kv) · N_K + key`, masked.
#
# The simplest right kernel calls `_dkdv_q_blocks` once per head, over `[lo, N_Q)` with
# `MASK=True`. A faster one splits that range: the blocks crossing the diagonal (causal), then
# the blocks needing no mask, then the ragged last block; when this program's key block is
# itself ragged (`start_n + BLOCK_N > N_K`), every block needs the key mask. Both pass. The
# cell has a place for the split, `_dkdv_stages`, returning the three boundaries; a kernel that
# does not split never calls it, and may leave it as it is. (The answer key goes further.
# With `CAUSAL` it walks the diagonal blocks in steps of `BLOCK_M // 2` rows (16 or more):
# masked steps cost more than the others on a GPU, and more, smaller ones cost less than two
# large ones. With `CAUSAL` it walks the unmasked blocks last, and it never pipelines its
# masked loops: the sums change only by rounding, but the GPU compiler overlaps the matrix
# multiplications of these loops only when they come that way. Neither changes what the
# check accepts.)
#
# The check launches it on `(cdiv(Nk, BLOCK_N), B · Hkv)` with `FUSED_DQ=False` (it must then
# leave `DQ` alone), blocks of 16 or 32 (not always equal), `Nq != Nk` both ways and ragged,
# `D` from 16 to 64 (not always a power of two), GQA and MQA, causal and not, `q`, `k`, `v` as
# views (`[B, N, H, D]` viewed as `[B, H, N, D]`, slices of longer rows), fp32 and fp16, rows of
# scores far above and far below zero, and `V` around ±2,000. On a GPU also bf16 and lengths
# of several hundred.

# %% nbgrader={"grade": false, "grade_id": "bwd_dkdv_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: flash_backward._dkdv_q_blocks
# solution: flash_backward._dkdv_stages
# solution: flash_backward.bwd_dkdv_kernel

# %% nbgrader={"grade": true, "grade_id": "test_bwd_dkdv_kernel", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
checks.check_bwd_dkdv_kernel(bwd_dkdv_kernel)

# %% [markdown]
# ## 6. The dQ kernel
#
# One program per query block: program `(i, b · H + h)`, rows `start_m = i · BLOCK_M ...`, K/V
# head `h // GROUP`. It loads its `Q`, `dO` and `O` tiles once, computes their `δ` with
# `_row_delta` and **stores** it into `DELTA` (so the dK/dV kernel, launched after it, needs no
# preprocessing launch), and loads `lse` once, times `LOG2E_C`. Then `_dq_kv_blocks` walks the
# key blocks, in the untransposed layout:
#
# ```
# k, v = the K and V tiles of these keys                            [BLOCK_N, BLOCK_D]
# p    = exp2(tl.dot(q, tl.trans(k)) · qk_scale − lse2[:, None])    [BLOCK_M, BLOCK_N]
# p    = 0 where the key >= N_K or (CAUSAL) query < key
# dp   = tl.dot(do, tl.trans(v))
# ds   = p · (dp − delta[:, None])
# dq  += tl.dot(ds in k's dtype, k)
# ```
#
# and the kernel stores `dq · sm_scale` in `DQ`'s dtype. With `CAUSAL` the walk stops at
# `min(N_K, start_m + BLOCK_M)`; key blocks that end at or before the block's first row
# (`start_m`) and lie inside `N_K` need no mask (`MASK=False`): `_dq_stages` is the place for
# those two boundaries (optional, as `_dkdv_stages` is; the answer key also walks the masked
# blocks of a causal program in steps of `BLOCK_N // 4` keys where `BLOCK_N` >= 64). Causal
# programs of later query blocks have more keys to walk: starting them first
# (`pid_m = tl.num_programs(0) − 1 − tl.program_id(0)`) shortens the GPU's last wave; it
# changes no result.
#
# The check launches it on `(cdiv(Nq, BLOCK_M), B · H)` with the inputs of section 5, and
# compares the `δ` it stores too.

# %% nbgrader={"grade": false, "grade_id": "bwd_dq_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: flash_backward._dq_kv_blocks
# solution: flash_backward._dq_stages
# solution: flash_backward.bwd_dq_kernel

# %% nbgrader={"grade": true, "grade_id": "test_bwd_dq_kernel", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
checks.check_bwd_dq_kernel(bwd_dq_kernel)

# %% [markdown]
# ## 7. Fusing dQ into the dK/dV kernel: atomic adds
#
# The dQ kernel recomputes `P` and `dP` that the dK/dV kernel had already made (7 matrix
# products per tile instead of 5). The dK/dV kernel could instead add each tile's part
# `scale · dS K` into `dQ` itself. But `dQ` of a query row receives a part from **every** key
# block, and on a GPU those programs run at the same time. A plain update
#
# ```
# old = tl.load(dq_ptrs)            # programs A and B both read the same old value
# tl.store(dq_ptrs, old + part)     # B's store overwrites A's: A's part is lost
# ```
#
# is a race. `tl.atomic_add(dq_ptrs, part, mask=...)` does the read, the add and the write as
# one operation that no other program can split: every part arrives. The buffer is fp32 (an
# fp16 sum of many parts would lose digits), zeroed before the launch and converted to `q`'s
# dtype after it.
#
# **Why the grader reads your code for this.** Triton's interpreter runs the programs of a
# launch one after another, so on a CPU the racy version gives exactly the right sum, and no
# run can tell the two apart; on a GPU it gives wrong gradients, differently from run to run.
# So besides running your kernel, the grader follows the `DQ` argument of `bwd_dkdv_kernel`
# through your code: through assignments (`dq_ptrs = DQ + ...`) and into every function it is
# passed to (under whatever name). **Every write through a pointer computed from `DQ` must be
# `tl.atomic_add`** (a `tl.store` there fails), and there must be at least one. The visible
# check reads your notebook's code the same way.
#
# Write `_accumulate_dq` (its arguments are in the cell): `dsT` is this tile's
# `[BLOCK_N, BLOCK_M]` transposed `dS` (fp32), `k` its `K` tile. Compute the
# `[BLOCK_M, BLOCK_D]` part `tl.dot(tl.trans(dsT in k's dtype), k) · sm_scale` and add it
# atomically at `DQ + row · HEAD_DIM + lane` (`DQ` points at this head's first row), masked to
# rows `< N_Q` and lanes `< HEAD_DIM`. (`sem="relaxed"` tells the GPU that the adds need no
# ordering with other memory operations: the fastest kind.) Your `_dkdv_q_blocks` calls it
# when `FUSED_DQ` is set. The check launches the dK/dV kernel with `FUSED_DQ=True` on the
# inputs of section 5, once with a `DQ` that does not start at zero (the kernel adds to it).

# %% nbgrader={"grade": false, "grade_id": "accumulate_dq", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: flash_backward._accumulate_dq

# %% nbgrader={"grade": true, "grade_id": "test_accumulate_dq", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_accumulate_dq(bwd_dkdv_kernel)

# %% [markdown]
# ## 8. The wrapper
#
# `flash_backward(q, k, v, o, lse, do, causal=False, sm_scale=None, *, fused=False,
# block_m=None, block_n=None)` returns `(dq, dk, dv)`, each in its input's dtype:
#
# - check the inputs with the given `check_backward_inputs` (it returns
#   `B, H, Hkv, Nq, Nk, D` and raises `ValueError` or `TypeError` for a wrong shape, dtype,
#   device or head dim); the kernels take the scale `default_scale(sm_scale, D)`;
# - blocks: `block_m` and `block_n` when given; otherwise 32 in the interpreter, and on a GPU
#   64, 32 or 16 as a row of `D` elements takes at most 256, 512 or more bytes (tiles of
#   `[block, D]` must fit in shared memory), and at most 32 for fp32 inputs (exact fp32
#   dots unroll on the FMA units: a 64-row kernel takes Triton up to 40 s to compile);
#   `BLOCK_D = max(16, next_power_of_2(D))`;
# - `q`, `k`, `v` as they are when their head dim is contiguous (`.contiguous()` otherwise);
#   `o`, `do` and `lse` contiguous; allocate `delta` (fp32 `[B, H, Nq]`), `dk` and `dv` (like
#   `k` and `v`) with `torch.empty`;
# - `fused=False`: `dq = torch.empty` in `q`'s dtype; launch `bwd_dq_kernel` on
#   `(cdiv(Nq, block_m), B · H)`, then `bwd_dkdv_kernel` on `(cdiv(Nk, block_n), B · Hkv)` with
#   `FUSED_DQ=False`;
# - `fused=True`: launch `bwd_preprocess_kernel` on `(cdiv(Nq, block_m), B · H)`; `dq =
#   torch.zeros` in **fp32**; launch `bwd_dkdv_kernel` with `FUSED_DQ=True`; return `dq`
#   converted to `q`'s dtype.
#
# Strides: `*q.stride()[:3], *k.stride()[:3], *v.stride()[:3]`;
# `DOT_PRECISION = dot_precision(q.dtype)`. The check watches the dK/dV launch (its grid and
# blocks) and refuses PyTorch softmax, attention and matrix products during the call; the
# grader also reads the code: `flash_backward` must launch all three kernels. The inputs are
# those of the kernel checks, plus `q`, `k`, `v` whose head dim is not contiguous, and `o`
# and `do` as views.

# %% nbgrader={"grade": false, "grade_id": "flash_backward", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: flash_backward.flash_backward

# %% nbgrader={"grade": true, "grade_id": "test_flash_backward", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_flash_backward(flash_backward, bwd_dkdv_kernel)

# %% [markdown]
# Your backward against PyTorch's autograd through `attention_reference`, causal, with GQA
# (4 query heads, 2 K/V heads), both ways of computing `dQ`:

# %% nbgrader={"grade": false, "grade_id": "demo_compare", "locked": true, "schema_version": 3, "solution": false, "task": false}
q_c, do_c = (torch.randn(2, 4, 70, 64, device=course.DEVICE) for _ in range(2))
k_c, v_c = (torch.randn(2, 2, 70, 64, device=course.DEVICE) for _ in range(2))
o_c, lse_c = flash_attention(q_c, k_c, v_c, causal=True)
grads_c = {fused: flash_backward(q_c, k_c, v_c, o_c, lse_c, do_c, causal=True, fused=fused)
           for fused in (False, True)}
leaves = [t.clone().requires_grad_() for t in (q_c, k_c, v_c)]
attention_reference(*leaves, causal=True).backward(do_c)
for fused, grads in grads_c.items():
    errors = [f"{name} {float((g - t.grad).abs().max()):.1e}"
              for name, g, t in zip(("dq", "dk", "dv"), grads, leaves)]
    print(f"fused={fused}: max error against autograd:", ", ".join(errors))

# %% [markdown]
# ## 9. `FlashAttentionFunction`: gradients for autograd
#
# A `torch.autograd.Function` tells autograd how to differentiate an operation it cannot see
# into: `forward(ctx, *inputs)` computes the outputs and keeps on `ctx` what the backward will
# need; `backward(ctx, *grad_outputs)` returns one gradient per input of `forward` (`None` for
# inputs that have none). `FlashAttentionFunction.apply(q, k, v, causal, sm_scale, fused)`
# then behaves like any PyTorch operation: `loss.backward()` reaches your kernels.
#
# Write the two methods as functions (the cell makes the class of them):
#
# - `autograd_forward(ctx, q, k, v, causal, sm_scale, fused)`: `o, lse =
#   flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)` (module 05's forward, given);
#   save `q`, `k`, `v`, `o` and `lse` with `ctx.save_for_backward` (tensors go there, so that
#   autograd can check that nobody changed them in between); the three settings as plain
#   attributes of `ctx`;
#   `ctx.mark_non_differentiable(lse)` (a statistic, not an output to train); return
#   `(o, lse)`;
# - `autograd_backward(ctx, do, dlse)`: `dlse` is `None` (or zeros); read back the saved
#   tensors (`ctx.saved_tensors`), call your `flash_backward`, and return
#   `(dq, dk, dv, None, None, None)`;
# - `attention_gradients(q, k, v, do, causal=False, sm_scale=None, fused=False)`: what one
#   training step computes: leaf copies of `q`, `k`, `v` that require gradients
#   (`t.detach().requires_grad_()`), `FlashAttentionFunction.apply` on them, `backward` of
#   `o` with the gradient `do`, and return `(o.detach(), lse, q.grad, k.grad, v.grad)`.
#
# The check calls `attention_gradients` (it cannot reach autograd otherwise) and compares all
# five with float64 autograd through attention; one backward must launch your dK/dV kernel
# once. The grader reads the code too: `autograd_forward` must launch module 05's
# `flash_attention_kernel` (through `flash_attention`) and `autograd_backward` your dK/dV
# kernel (through `flash_backward`), neither with a PyTorch matrix product.

# %% nbgrader={"grade": false, "grade_id": "flash_attention_function", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: flash_backward.autograd_forward
# solution: flash_backward.autograd_backward


class FlashAttentionFunction(torch.autograd.Function):
    """FlashAttention as one autograd operation: apply(q, k, v, causal, sm_scale, fused)."""
    forward = staticmethod(autograd_forward)
    backward = staticmethod(autograd_backward)


# solution: flash_backward.attention_gradients

# %% nbgrader={"grade": true, "grade_id": "test_flash_attention_function", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_flash_attention_function(attention_gradients, bwd_dkdv_kernel)

# %% [markdown]
# ### A tiny training run
#
# Queries, keys and values as trainable tensors, learning to reproduce the causal attention
# output of other, hidden ones: 40 steps of Adam, through your `FlashAttentionFunction`, and
# the same steps through autograd and `attention_reference`. The two losses should fall
# together.

# %% nbgrader={"grade": false, "grade_id": "demo_training", "locked": true, "schema_version": 3, "solution": false, "task": false}
def train(attend, steps=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = [torch.randn(1, 2, 48, 16, generator=g).to(course.DEVICE) for _ in range(3)]
    target = attention_reference(*hidden, causal=True)
    params = [torch.randn(1, 2, 48, 16, generator=g).to(course.DEVICE).requires_grad_() for _ in range(3)]
    optimizer = torch.optim.Adam(params, lr=0.05)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((attend(*params) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


yours = train(lambda q, k, v: FlashAttentionFunction.apply(q, k, v, True, None, False)[0])
reference_losses = train(lambda q, k, v: attention_reference(q, k, v, causal=True))
print(f"loss: {yours[0]:.4f} -> {yours[-1]:.4f} (autograd through attention_reference: "
      f"{reference_losses[0]:.4f} -> {reference_losses[-1]:.4f})")
plots.lines(range(1, len(yours) + 1), {"FlashAttentionFunction (your kernels)": yours,
                                       "autograd, attention_reference": reference_losses},
            title="training loss", xlabel="step", ylabel="mean squared error", logy=True, marker="")
plt.show()

# %% [markdown]
# ## 10. Fuse dQ or not?
#
# Per tile, the fused kernel does 5 matrix products (`S`, `dP`, `dV`, `dK`, `dQ`) where the
# two kernels do 7 (`S` and `dP` twice), and it saves a launch. It pays elsewhere: each `dQ`
# element receives one atomic fp32 add per key block (`Nk / BLOCK_N` of them, all through the
# L2 cache), and it needs an fp32 `dQ` buffer of `4 · B · H · Nq · D` bytes, zeroed before and
# converted after, where the unfused path writes `dQ` once in `q`'s dtype. Which is faster is
# a measurement. The course's tuned kernels (module 07 tunes the blocks; same code as yours),
# forward plus backward on an H100, fp16:

# %% nbgrader={"grade": false, "grade_id": "h100_figures", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: flash_backward.H100_TRAIN_SEQ_LENS
# given: flash_backward.H100_TRAIN_TFLOPS

# %% nbgrader={"grade": false, "grade_id": "plot_h100", "locked": true, "schema_version": 3, "solution": false, "task": false}
fig, axes = plt.subplots(2, 2, figsize=(13, 7))
for ax, ((D, causal), rows) in zip(axes.flat, H100_TRAIN_TFLOPS.items()):
    plots.tflops_figure(H100_TRAIN_SEQ_LENS, rows, ax=ax,
                        title=f"H100 (measured), fwd + bwd, fp16, D = {D}{', causal' if causal else ''}")
fig.tight_layout()
plt.show()
q_bytes = 1 * 16 * 16384 * 128 * 2
print(f"B = 1, H = 16, N = 16384, D = 128: q is {q_bytes / 2 ** 20:.0f} MiB in fp16; the fused "
      f"path's fp32 dQ buffer {2 * q_bytes / 2 ** 20:.0f} MiB more")

# %% [markdown]
# **Question.** Set `fused_tradeoff_answer` to one letter:
#
# - **a**: the fused kernel is always faster: it runs fewer matrix products and one kernel
#   fewer;
# - **b**: the separate dQ kernel needs atomic adds too, since several of its programs write
#   each row of `dQ`;
# - **c**: fusing saves the recomputation of `P` and `dP` and a launch, but costs an fp32 `dQ`
#   buffer and one atomic add per key block for every `dQ` element; on the H100 above the
#   separate dQ kernel was faster in 9 of the 12 cases;
# - **d**: the fused kernel needs no extra memory: its atomic adds go straight into the `dQ`
#   it returns, in `q`'s dtype.

# %% nbgrader={"grade": false, "grade_id": "fused_tradeoff", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: fused_tradeoff_answer = "x"  (one letter)
# solution: flash_backward.fused_tradeoff_answer

# %% nbgrader={"grade": true, "grade_id": "test_fused_tradeoff", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(fused_tradeoff_answer, name="fused_tradeoff_answer")

# %% [markdown]
# **Why.** Fusing trades work for traffic and memory. It skips the dQ kernel's second
# computation of `P` and `dP`, but every element of `dQ` then receives `Nk / BLOCK_N` atomic
# fp32 adds (128 at `N = 16,384` with 128-key blocks), all through the L2 cache, and the fp32
# buffer takes twice the bytes of an fp16 `dQ` (a is wrong). The separate kernel's programs
# each own their rows of `dQ` outright: no atomics (b is wrong). The atomics cannot add into
# an fp16 `dQ` without losing digits, hence the fp32 buffer (d is wrong). On the H100, the
# fused path won only at `D = 64` causal from `N = 4,096`, and at `D = 128` non-causal at
# `N = 16,384`: measure on your own GPU before choosing.

# %% [markdown]
# **Past these kernels.** The figures above are your kernels' design with tuned blocks. On
# Hopper the course's answer key has gone one step further, as its forward did (module 07,
# step 8): where a step has enough work, its dK/dV kernel at `D = 64` and `128` and its dQ
# kernel at `D = 128` are written in Gluon, Triton's lower-level language. In each, one warp
# streams the tiles into shared memory (`Q`, `dO`, `lse` and `δ` for dK/dV; `K` and `V` for
# dQ) while two warpgroups compute, and each product is issued before the previous one's
# result is needed, so the exponentials run while the tensor cores work (at `D = 128`
# the dK/dV kernel issues `dPᵀ` with `dV`'s product, after `Sᵀ`, so that two fp32 score tiles
# never fill the registers at once). Forward and backward together at `N ≥ 4,096`: 0.88-1.01x
# cuDNN and 1.29-1.72x FlashAttention-2 on the H100 (`solutions/PERF.md`, steps 3p and 3s).
# At `N = 1,024` a step takes about as long to launch from Python as to run on the GPU
# (module 07, step 5).
#
# **At `D = 256`, your layout meets a compiler rule.** `dK` and `dV` (64 x 256 fp32 each)
# fill half the registers of 8 warps, so the dK/dV tile holds 64 keys on 8 warps. Triton
# lays out a product whose result feeds another product (`Sᵀ` feeds `dV`'s) with every
# warp along its rows, 16 rows a warp: 8 warps cover 128 rows, so on 64 key rows both
# halves of the program computed the same `Sᵀ` and `dPᵀ`, 1.5x the products needed. The
# answer key's tuned kernel at that width turns the scores back: `S = Q Kᵀ` over 128 query
# rows, and `dV += Pᵀ dO`, `dK += dSᵀ Q` with the transposes taken from shared memory. Its backward ran 1.29-1.40x faster on an H200, and
# forward and backward together 0.87-0.95x cuDNN (`solutions/PERF.md`, steps 4c and 4d).

# %% [markdown]
# ## 11. Will it compile on a GPU?
#
# The interpreter runs some code a GPU compiler rejects. This cell compiles your dK/dV kernel
# (fused, GQA, causal) and your dQ kernel for an H100 (sm_90) with fp16 inputs and 64 x 64
# tiles, without running them. (It takes a few seconds.)

# %% nbgrader={"grade": false, "grade_id": "compile_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
checks.compile_kernels_for_gpu(bwd_dkdv_kernel, bwd_dq_kernel)

# %% [markdown]
# ## What you built
# - Softmax's gradient without its Jacobian: `dx = p ∘ (dp − Σ p ∘ dp)`; attention's
#   `dS = P ∘ (dP − δ)` with `δ = rowsum(dO ∘ O)`, and the scale on both `dQ` and `dK`.
# - A backward that keeps `O(N)` memory: `P` recomputed tile by tile from `lse`, never stored.
# - One program per key block for `dK` and `dV` (summed over the query heads of a GQA group),
#   one per query block for `dQ`, causal tiles above the diagonal skipped.
# - The fused alternative, where `dQ` arrives by atomic fp32 adds: a race if written with a
#   plain store, invisible to an interpreter that runs programs one at a time.
# - `FlashAttentionFunction`: your kernels behind `loss.backward()`, training a model.
