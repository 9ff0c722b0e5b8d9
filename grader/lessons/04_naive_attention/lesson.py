# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 Naive attention
#
# Modules 01-03 built the pieces: a softmax kernel, masks, batched matrix products. Here
# they become **attention**, the operation at the heart of every transformer:
#
# $$O = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{D}}\right) V$$
#
# and then we measure what the obvious way of computing it costs. That cost is the reason
# FlashAttention (module 05) exists. In this notebook you will write:
#
# 1. `causal_future`: the causal mask when queries and keys differ in number (1 point);
# 2. `repeat_kv`: grouped-query attention, where several query heads share one K/V head (1 point);
# 3. `attention_reference`: attention in PyTorch, checked against PyTorch's own (3 points);
# 4. `naive_attention`: the same in Triton, from the pieces of modules 01 and 03 (4 points);
# 5. `sp_bytes`: the memory that attention's two big intermediate matrices take (2 points);
# 6. `naive_dram_accesses`, `flash_dram_accesses`, `flash_one_pass_max_n`: the DRAM
#    traffic of naive attention and of FlashAttention (3 points);
# 7. two questions on what limits each (1 point each).
#
# Run the cells in order; the last cell shows each exercise's points and your progress.
# Each exercise is followed by a check that prints `ok` lines when
# your code is right and says what is wrong when it is not. Hidden tests run the same
# checks on inputs you have not seen.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import course  # first: picks the GPU, or Triton's interpreter on a CPU, before triton loads

import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from course import plots
from course.checks import naive_attention as checks
from course.testing import count_launches

print(course.describe())

# %% [markdown]
# ## 1. The formula
#
# One head of attention takes three matrices: queries `Q` `[Nq, D]`, keys `K` `[Nk, D]` and
# values `V` `[Nk, D]` (`D` is the head dim). Then:
#
# - **scores** `S = Q Kᵀ · scale`: `S[i, j]` is the dot product of query `i` with key `j`;
# - **weights** `P = softmax(S)` over each row: query `i` splits a weight of 1 among the keys;
# - **output** `O = P V`: row `i` of `O` is the average of the rows of `V`, weighted by row
#   `i` of `P`.
#
# A model runs this for every batch entry and every head at once: in this course `Q` is
# `[B, H, Nq, D]` and `K`, `V` are `[B, Hkv, Nk, D]` (section 3 says why `Hkv` may differ
# from `H`).

# %% [markdown]
# A worked example: one head, 4 queries, 6 keys, `D = 16`, step by step.

# %% nbgrader={"grade": false, "grade_id": "demo_formula", "locked": true, "schema_version": 3, "solution": false, "task": false}
g = torch.Generator().manual_seed(0)
q_demo = torch.randn(1, 1, 4, 16, generator=g)   # [B, H, Nq, D]
k_demo = torch.randn(1, 1, 6, 16, generator=g)   # [B, H, Nk, D]
v_demo = torch.randn(1, 1, 6, 16, generator=g)
s_demo = q_demo @ k_demo.transpose(-1, -2) / math.sqrt(16)   # [1, 1, 4, 6]
p_demo = torch.softmax(s_demo, dim=-1)                       # over the keys
o_demo = p_demo @ v_demo                                     # [1, 1, 4, 16]
print("S:", tuple(s_demo.shape), " P:", tuple(p_demo.shape), " O:", tuple(o_demo.shape))
print("each row of P sums to", p_demo.sum(-1).flatten().tolist())
plots.heatmaps({"S = Q Kᵀ / √D": s_demo[0, 0], "P = softmax(S), row by row": p_demo[0, 0]},
               unit=["P = softmax(S), row by row"],
               annotate=True)
plt.show()

# %% [markdown]
# **Why divide by √D?** A dot product of two random vectors with `D` entries of variance 1
# has variance `D`. Without the scale, scores grow with the head dim, and softmax turns
# into a one-hot pick of the largest score (whose gradient is almost zero everywhere).
# Dividing by `√D` keeps the scores around ±1 for any `D`. The picture: the largest weight
# of a row, averaged over 256 random queries against 256 random keys.

# %% nbgrader={"grade": false, "grade_id": "demo_scale", "locked": true, "schema_version": 3, "solution": false, "task": false}
dims = [16, 32, 64, 128, 256, 512]
largest = {"no scale": [], "scale 1/√D": []}
for D in dims:
    qs, ks = torch.randn(256, D, generator=g), torch.randn(256, D, generator=g)
    for label, scale in (("no scale", 1.0), ("scale 1/√D", 1 / math.sqrt(D))):
        largest[label].append(float(torch.softmax(qs @ ks.T * scale, dim=-1).amax(-1).mean()))
plots.lines(dims, largest, title="largest weight of a row of P (1/256 would be uniform)",
            xlabel="head dim D", ylabel="weight", logx=True)
plt.show()

# %% [markdown]
# ## 2. The causal mask, for any Nq and Nk
#
# Module 02 hid the future from each query of a square `[n, n]` score matrix. Attention
# also meets rectangles: `Nq != Nk`. This course follows PyTorch's
# `scaled_dot_product_attention(..., is_causal=True)`: the mask is aligned **top-left**,
# query `i` sees keys `j <= i` whatever the sizes. For `Nq = 3`, `Nk = 5`, and `Nq = 4`,
# `Nk = 2`:
#
# ```
#          key j:  0  1  2  3  4                key j:  0  1
# query 0          .  X  X  X  X       query 0          .  X
# query 1          .  .  X  X  X       query 1          .  .
# query 2          .  .  .  X  X       query 2          .  .
#                                      query 3          .  .
# ```
#
# (`X` = hidden, True; `.` = visible, False.) Decoding with a KV cache aligns the last query
# with the last key instead ("bottom-right", FlashAttention's own library does it); here,
# as in PyTorch, it is top-left.
#
# Write `causal_future(n_q, n_k, device)`: a `[n_q, n_k]` `torch.bool` tensor on `device`,
# True exactly where key `j` is in the future of query `i` (`j > i`).

# %% nbgrader={"grade": false, "grade_id": "causal_future", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: naive_attention.causal_future

# %% nbgrader={"grade": true, "grade_id": "test_causal_future", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_causal_future(causal_future)

# %% nbgrader={"grade": false, "grade_id": "plot_causal", "locked": true, "schema_version": 3, "solution": false, "task": false}
plots.masks({"causal_future(3, 5)": causal_future(3, 5, "cpu"),
             "causal_future(4, 2)": causal_future(4, 2, "cpu")})
plt.show()

# %% [markdown]
# ## 3. Grouped-query attention
#
# During generation a model keeps every past token's K and V in memory (the **KV cache**),
# for every head. To shrink it, many models give several query heads **one shared K/V
# head**: `H` query heads, `Hkv` K/V heads, `H` a multiple of `Hkv` (grouped-query
# attention, GQA; `Hkv = 1` is multi-query attention). With `g = H // Hkv`, the
# **consecutive** query heads `j·g ... j·g + g - 1` share K/V head `j`: query head `h` reads
# K/V head `h // g`. For `H = 6`, `Hkv = 2`:
#
# ```
# query head:  0  1  2  3  4  5
# K/V head:    0  0  0  1  1  1
# ```
#
# Write `repeat_kv(x, heads)`: `x` is `[B, Hkv, N, D]`; return `[B, heads, N, D]` in `x`'s
# dtype, where query head `h` finds its K/V head (`torch.repeat_interleave` helps). The
# tests pass views (`[B, N, H, D]` tensors viewed as `[B, H, N, D]`, matrices stored
# transposed) in fp32 and fp16.

# %% nbgrader={"grade": false, "grade_id": "repeat_kv", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: naive_attention.repeat_kv

# %% nbgrader={"grade": true, "grade_id": "test_repeat_kv", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_repeat_kv(repeat_kv)

# %% [markdown]
# ## 4. The reference, in PyTorch
#
# Every kernel of this course is checked against one function. Write it in two parts:
#
# - `attention_scores(q, k, causal=False, sm_scale=None)`: `S = Q Kᵀ · scale` for `q`
#   `[B, H, Nq, D]` and `k` `[B, Hkv, Nk, D]` (use `repeat_kv`), with `-inf` where
#   `causal_future` says when `causal`. The scale is `sm_scale`, or `1/√D` when it is
#   `None`: `default_scale` below does exactly that.
# - `attention_reference(q, k, v, causal=False, sm_scale=None)`: `softmax(S) V`, the
#   softmax over the **keys** (the last dim), returned `[B, H, Nq, D]` in `q`'s dtype.
#
# **Compute in fp32** (float64 inputs stay float64: `torch.promote_types(q.dtype,
# torch.float32)`): convert the inputs first, convert the output back at the end. In fp16,
# a score near 1000 is rounded to a multiple of 0.5, and a raw `Q Kᵀ` past 65,504 is `inf`.
#
# `torch.softmax` and `@` are welcome here; PyTorch's own attention
# (`F.scaled_dot_product_attention`, `nn.MultiheadAttention`) is not: the checks compare
# your function with it, and make it raise while yours runs.
#
# The tests try: one query and key up to hundreds, `Nq != Nk` both ways, head dims that are
# not powers of two, several batch entries and heads, grouped heads (GQA and `Hkv = 1`),
# causal and not, scales from 0.01 to 1.3 and the default, fp32 and fp16 (bf16 and
# sequences of a thousand too on a GPU), inputs that
# are views (`[B, N, H, D]` viewed as `[B, H, N, D]`, matrices stored transposed, one K/V
# head shared by all heads with head stride 0), scores around +100 and -100 (fp32) or
# +1000 and -1000 (fp16) with a spread of a few units, and fp16 inputs whose `Q Kᵀ` passes
# 65,504 before scaling.

# %% nbgrader={"grade": false, "grade_id": "given_scale", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: flash_forward.default_scale

# %% nbgrader={"grade": false, "grade_id": "attention_reference", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: naive_attention.attention_scores

# solution: naive_attention.attention_reference

# %% nbgrader={"grade": true, "grade_id": "test_attention_reference", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_attention_reference(attention_reference)

# %% [markdown]
# Yours against PyTorch's, on a causal GQA example (`enable_gqa=True` asks SDPA for
# grouped heads):

# %% nbgrader={"grade": false, "grade_id": "demo_reference", "locked": true, "schema_version": 3, "solution": false, "task": false}
q_demo = torch.randn(2, 8, 100, 64, generator=g)
k_demo, v_demo = torch.randn(2, 2, 120, 64, generator=g), torch.randn(2, 2, 120, 64, generator=g)
ours = attention_reference(q_demo, k_demo, v_demo, causal=True)
theirs = F.scaled_dot_product_attention(q_demo, k_demo, v_demo, is_causal=True, enable_gqa=True)
print("largest difference from SDPA:", float((ours - theirs).abs().max()))

# %% [markdown]
# ## 5. Naive attention in Triton
#
# The plan, with the pieces of modules 01 and 03, for every `(batch, head)` in one launch each:
#
# ```
# Q, K ──batched GEMM──▶ S [B, H, Nq, Nk] ──scale, mask (PyTorch)──▶ S
#    S ──softmax kernel──▶ P [B, H, Nq, Nk]
# P, V ──batched GEMM──▶ O [B, H, Nq, D]
# ```
#
# `S` and `P` are written to DRAM whole, and read back by the next step. That is what
# "naive" means here, and sections 6 and 7 count its cost.
#
# **The building blocks are given**, below, in locked cells: the reference versions of
# module 03's `batched_gemm_strided` (with its kernel) and module 01's `softmax` (with
# `softmax_kernel`), and the input checks that module 05's kernels use. Your grade here
# depends only on what you write here: a mistake left in module 03 does not cost you twice,
# and you can do this module without having finished 03. Compare them with yours if you
# wrote them.

# %% nbgrader={"grade": false, "grade_id": "given_gemm", "locked": true, "schema_version": 3, "solution": false, "task": false}
# From module 03: batched_gemm_strided(a, b, b_transposed) -> a @ b^T (or a @ b) for every
# (batch, head) in one launch, in a's dtype.
# given: tiling.TILE
# given: tiling.TILE_K
# given: tiling.MAX_GRID_YZ
# given: tiling.TRITON_DTYPES

# given: tiling.check_inputs

# given: tiling.matmul_tile

# given: tiling.store_tile

# given: tiling.batched_gemm_strided_kernel

# given: tiling.batched_gemm_strided

# %% nbgrader={"grade": false, "grade_id": "given_softmax", "locked": true, "schema_version": 3, "solution": false, "task": false}
# From module 01: softmax(x) -> the row softmax of a 2-D tensor, one program per row.
# given: softmax.softmax_kernel

# given: softmax.softmax

# %% nbgrader={"grade": false, "grade_id": "given_checks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The input checks of every attention function from here on.
# given: flash_forward.SUPPORTED_DTYPES
# given: flash_forward.MIN_HEAD_DIM
# given: flash_forward.MAX_HEAD_DIM

# given: flash_forward.check_attention_inputs

# %% [markdown]
# Write `naive_attention(q, k, v, causal=False, sm_scale=None)`, with the same inputs and
# output as `attention_reference`:
#
# 1. `check_attention_inputs(q, k, v)` first: bad inputs raise a `ValueError` or
#    `TypeError` before any launch (the tests try some). It returns `B, H, Hkv, Nq, Nk, D`.
# 2. `batched_gemm_strided` pairs head `h` of its first input with head `h` of its second:
#    give every query head its K/V head with `repeat_kv` first.
# 3. `S = batched_gemm_strided(Q, K, True)`: `Kᵀ` by strides, no copy. Its result has the
#    inputs' dtype, and **S must be fp32** (section 4 says why): give it fp32 copies of `Q`
#    and `K` (`.float()`: `N·D` elements each, nothing next to `S`'s `N²`).
# 4. Scale and mask `S` in PyTorch: it is in DRAM anyway (`s.mul_(...)`,
#    `s.masked_fill_(...)` work in place).
# 5. `P = softmax(S)` with the given wrapper, which takes a 2-D tensor: view `S` as
#    `[B·H·Nq, Nk]` (one row per query), and the result back as `[B, H, Nq, Nk]`.
# 6. `O = batched_gemm_strided(P, V, False)` in fp32 (`V` converted), returned in `q`'s dtype.
#
# The Triton kernels do the work: no PyTorch product (`@`, `torch.matmul`, `bmm`, `einsum`,
# ...), no `torch.softmax`, no SDPA, and no `attention_reference` (which uses them) in
# `naive_attention` or in a function it calls; the checks make them raise, and the grader
# reads your code: `naive_attention` must launch `batched_gemm_strided_kernel` and
# `softmax_kernel`, through the given wrappers. The tests use the same inputs as
# `attention_reference`'s.

# %% nbgrader={"grade": false, "grade_id": "naive_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: naive_attention.naive_attention

# %% nbgrader={"grade": true, "grade_id": "test_naive_attention", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
checks.check_naive_attention(naive_attention)

# %% [markdown]
# Three launches, and the same answer as the reference:

# %% nbgrader={"grade": false, "grade_id": "demo_naive", "locked": true, "schema_version": 3, "solution": false, "task": false}
q_demo = torch.randn(2, 4, 70, 32, generator=g).to(course.DEVICE, torch.float16)
k_demo = torch.randn(2, 2, 90, 32, generator=g).to(course.DEVICE, torch.float16)
v_demo = torch.randn(2, 2, 90, 32, generator=g).to(course.DEVICE, torch.float16)
with count_launches(batched_gemm_strided_kernel) as gemms, count_launches(softmax_kernel) as softmaxes:
    o_naive = naive_attention(q_demo, k_demo, v_demo, causal=True)
o_ref = attention_reference(q_demo.double(), k_demo.double(), v_demo.double(), causal=True)
print(f"launches: {gemms[0]} batched GEMMs, {softmaxes[0]} softmax")
print("largest difference from the float64 reference:", float((o_naive.double() - o_ref).abs().max()))

# %% [markdown]
# ## 6. What it costs: memory
#
# `Q`, `K`, `V` and `O` have `N·D` elements per head; `S` and `P` have `Nq·Nk`: with `N`
# queries and keys, **`N²`**. A worked example first: `Q` for one sequence of `N = 16384`
# tokens, 16 heads of `D = 64`, in fp16 (2 bytes per element):

# %% nbgrader={"grade": false, "grade_id": "demo_q_bytes", "locked": true, "schema_version": 3, "solution": false, "task": false}
B_ex, H_ex, N_ex, D_ex = 1, 16, 16384, 64
q_bytes = B_ex * H_ex * N_ex * D_ex * torch.empty((), dtype=torch.float16).element_size()
print(f"Q: {q_bytes:,} bytes = {q_bytes / 2**20:g} MiB")

# %% [markdown]
# Write `sp_bytes(B, H, Nq, Nk, dtype)`: the bytes of `S` and `P` together, both
# `[B, H, Nq, Nk]` with elements of `dtype` (a torch dtype; its size in bytes:
# `torch.empty((), dtype=dtype).element_size()`). `naive_attention` keeps both in fp32.

# %% nbgrader={"grade": false, "grade_id": "sp_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: naive_attention.sp_bytes

# %% nbgrader={"grade": true, "grade_id": "test_sp_bytes", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_sp_bytes(sp_bytes)

# %% [markdown]
# One sequence, 16 heads of `D = 64`: the inputs and output grow like `N`, `S` and `P` like
# `N²`. Past `N ≈ 25,000` they no longer fit in an H100's 80 GB.

# %% nbgrader={"grade": false, "grade_id": "plot_sp_bytes", "locked": true, "schema_version": 3, "solution": false, "task": false}
lengths = [2 ** i for i in range(9, 18)]
ax = plots.lines(lengths, {
    "S and P (fp32)": [sp_bytes(1, 16, n, n, torch.float32) / 2**30 for n in lengths],
    "Q, K, V, O (fp16)": [4 * 16 * n * 64 * 2 / 2**30 for n in lengths]},
    title="memory of one sequence, 16 heads, D = 64", xlabel="N", ylabel="GiB", logx=True, logy=True)
ax.axhline(80e9 / 2**30, color="gray", linestyle="--", label="an H100's 80 GB")
ax.legend()
plt.show()

# %% [markdown]
# ### Predicted against measured
#
# On a GPU, the next cell measures the peak memory one call of your `naive_attention` adds
# over its inputs (`torch.cuda.max_memory_allocated`), with `B·N` fixed. On a CPU it shows
# the same measurement made on an H100 by the course's own benchmark (`python -m grader
# bench`, 2026-11-23, torch 2.11, triton 3.6; fp16, `D = 64`, 16 heads, `B·N = 16384`),
# next to the course's FlashAttention forward (module 05) on the same inputs.

# %% nbgrader={"grade": false, "grade_id": "given_measured", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: naive_attention.H100_MEASURED

# %% nbgrader={"grade": false, "grade_id": "plot_measured", "locked": true, "schema_version": 3, "solution": false, "task": false}
def measure_peak_mib(B, N, H=16, D=64):
    """Peak memory (MiB) one naive_attention call adds over its fp16 inputs, on this GPU."""
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    naive_attention(q, k, v)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


if course.INTERPRET:
    where = "H100, measured by the course's benchmark"
    measured = {N: row[1] for N, row in H100_MEASURED.items()}
    batch = {N: row[0] for N, row in H100_MEASURED.items()}
else:
    where = f"{torch.cuda.get_device_name()}, measured now"
    batch = {N: 4096 // N for N in (512, 1024, 2048, 4096)}
    measured = {N: measure_peak_mib(batch[N], N) for N in batch}
model = {N: sp_bytes(batch[N], 16, N, N, torch.float32) / 2**20 for N in batch}
print(f"{'N':>6} {'B':>3} {'model: S + P (MiB)':>19} {'measured (MiB)':>15}   ({where})")
for N in batch:
    print(f"{N:6d} {batch[N]:3d} {model[N]:19,.0f} {measured[N]:15,.0f}")
if course.INTERPRET:
    print("FlashAttention forward on the same inputs:",
          ", ".join(f"{row[3]:g} MiB" for row in H100_MEASURED.values()))
ns = list(batch)
plots.predicted_vs_measured(ns, {"model: S + P in fp32": [model[n] for n in ns]},
                            {where: (ns, [measured[n] for n in ns])},
                            title="peak memory of naive attention", xlabel="N", ylabel="MiB")
plt.show()

# %% [markdown]
# The model is within a few percent. The rest is `repeat_kv`'s copies of `K` and `V` (it
# copies even when `Hkv = H`): `2·B·H·N·D` fp16 elements, 64 MiB in the H100's table.
# FlashAttention's 33 MiB there is its output `O` (32 MiB) and one fp32 number per query
# row: no `N²` anywhere.
#
# Speed tells the same story. On the same H100 and inputs, naive attention ran at about
# **20 TFLOPS** at every `N`, FlashAttention at **370-410 TFLOPS**, with the same
# `4·B·H·N²·D` flops:

# %% nbgrader={"grade": false, "grade_id": "table_speed", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(f"{'N':>6} {'B':>3} {'naive TFLOPS':>13} {'flash TFLOPS':>13}   (H100, fp16, D = 64, 16 heads)")
for N, (B, naive_mib, naive_tflops, flash_mib, flash_tflops) in H100_MEASURED.items():
    print(f"{N:6d} {B:3d} {naive_tflops:13.1f} {flash_tflops:13.1f}")

# %% [markdown]
# What holds naive attention back? Set `bottleneck_answer` to one letter:
#
# - **a**: its GEMMs do not use the tensor cores;
# - **b**: reading and writing `S` and `P` in DRAM: it is memory-bound;
# - **c**: launching three kernels from Python instead of one;
# - **d**: computing the exponentials.
#
# (An H100 reads or writes DRAM at about 3.35 TB/s and multiplies fp16 matrices at about
# 800 TFLOPS. At `N = 16384`, `B = 1`, 16 heads of `D = 64`: how many bytes do `S` and `P`
# move, how many flops are done, and how long does each take?)

# %% nbgrader={"grade": false, "grade_id": "bottleneck_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: bottleneck_answer = "x"  (one letter)
# solution: naive_attention.bottleneck_answer

# %% nbgrader={"grade": true, "grade_id": "test_bottleneck_answer", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(bottleneck_answer, name="bottleneck_answer")

# %% [markdown]
# ## 7. What it costs: DRAM traffic
#
# Time on a GPU is mostly **traffic**: elements moved between DRAM and the chip. Count
# them for one `(batch, head)`, with `Nq = Nk = N` and head dim `d`, in elements (not bytes).
#
# **Naive attention**, each kernel reading its inputs once: `S = Q Kᵀ` reads `Q` and `K`
# and writes `S`; the softmax reads `S` and writes `P`; `O = P V` reads `P` and `V` and
# writes `O`. For `N = 4096`, `d = 64`: `Q`, `K`, `V`, `O` are `4·N·d` = 1,048,576 elements,
# and `S` written, `S` read, `P` written, `P` read are `4·N²` = 67,108,864: 64 times more.
#
# **FlashAttention** (module 05) never writes `S` or `P`. Each program takes a block of `b`
# queries and walks all of `K` and `V` block by block, keeping its scores in SRAM, a small
# fast memory of `M` elements. The model:
#
# - half of the SRAM holds the program's `Q` block and its output accumulator, `2·b·d`
#   elements, so `b = M // (4·d)`; the other half holds a block of `K`, of `V` and of scores;
# - each program reads its `Q` block once, **all** of `K` and `V` (`N·d` each), and writes
#   its `O` block once; there are `ceil(N / b)` programs (a ragged last block still reads
#   all of `K` and `V`).
#
# Write:
#
# - `naive_dram_accesses(N, d)`;
# - `flash_dram_accesses(N, d, M)`, raising a `ValueError` when `b` would be 0 (`M < 4·d`);
# - `flash_one_pass_max_n(d, M)`: the longest `N` for which FlashAttention reads `K` and
#   `V` only once (one block covers every query).
#
# The tests compare your counts exactly, from `N = 1` to `10⁵`.

# %% nbgrader={"grade": false, "grade_id": "dram_accesses", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: naive_attention.naive_dram_accesses

# solution: naive_attention.flash_dram_accesses

# solution: naive_attention.flash_one_pass_max_n

# %% nbgrader={"grade": true, "grade_id": "test_dram_accesses", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_dram_accesses(naive_dram_accesses, flash_dram_accesses, flash_one_pass_max_n)

# %% [markdown]
# On an H100, `M` is 228 KB of SRAM per SM: 116,736 fp16 elements. Below, `d = 64`. The
# dotted line `4·N·d` is the least any attention can move (read `Q`, `K`, `V`, write `O`
# once).

# %% nbgrader={"grade": false, "grade_id": "given_sram", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: naive_attention.H100_SRAM_BYTES

# %% nbgrader={"grade": false, "grade_id": "plot_traffic", "locked": true, "schema_version": 3, "solution": false, "task": false}
M_h100, d_plot = H100_SRAM_BYTES // 2, 64
lengths = [2 ** i for i in range(6, 18)]
ax = plots.lines(lengths, {
    "naive": [naive_dram_accesses(n, d_plot) for n in lengths],
    "FlashAttention": [flash_dram_accesses(n, d_plot, M_h100) for n in lengths],
    "4 N d (the least)": [4 * n * d_plot for n in lengths]},
    title=f"DRAM accesses of one head, d = {d_plot}, M = {M_h100:,}", xlabel="N",
    ylabel="elements", logx=True, logy=True)
ax.axvline(flash_one_pass_max_n(d_plot, M_h100), color="gray", linestyle=":",
           label=f"flash_one_pass_max_n = {flash_one_pass_max_n(d_plot, M_h100)}")
ax.legend()
plt.show()
for n in (1024, 16384):
    print(f"N = {n:5d}: naive / flash = "
          f"{naive_dram_accesses(n, d_plot) / flash_dram_accesses(n, d_plot, M_h100):.1f}")

# %% [markdown]
# FlashAttention's count is the least possible, `Θ(N·d)`, only while one block covers every
# query: up to `N = M / (4·d)`, 456 here. Past it, `K` and `V` are read again for every
# block of queries: about `2·N·d · N / b = 8·N²·d² / M` elements, `Θ(N²·d² / M)`. It is
# still quadratic in `N`, but `M / (2·d²)` times below naive's `4·N²` (14 times at `d = 64`):
# the SRAM decides how far below. ("FlashAttention's traffic is `O(N·d)`" is true only
# for sequences that fit in one block.)
#
# The model counts every re-read of `K` and `V` as DRAM traffic. On an H100, one head's `K`
# and `V` at `N = 16384`, `d = 64` take 4 MiB, which stays in the 50 MB L2 cache between
# blocks: most re-reads never reach DRAM. Naive's `S` and `P`, 1 GiB each per head in fp32,
# cannot stay anywhere.

# %% [markdown]
# At long sequences, with the same SRAM `M`, how does **doubling the head dim `d`** change
# FlashAttention's DRAM accesses? They are multiplied by about (set `head_dim_answer`):
#
# - **a**: 1;
# - **b**: 2;
# - **c**: 4;
# - **d**: 8.

# %% nbgrader={"grade": false, "grade_id": "head_dim_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: head_dim_answer = "x"  (one letter)
# solution: naive_attention.head_dim_answer

# %% nbgrader={"grade": true, "grade_id": "test_head_dim_answer", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(head_dim_answer, name="head_dim_answer")

# %% [markdown]
# ## What you built
#
# - `attention_reference`: `softmax(Q Kᵀ · scale + mask) V` over the keys, in fp32, with a
#   top-left causal mask for any `Nq`, `Nk` and grouped K/V heads; it agrees with PyTorch's
#   SDPA, and every later kernel is checked against it.
# - `naive_attention`: the same from three Triton launches (GEMM, softmax, GEMM), correct
#   and simple, with `S` and `P` written to DRAM in between.
# - What that costs: `8·B·H·N²` bytes of memory (32 GiB at `N = 16384`, 16 heads) and
#   `4·N²` DRAM accesses per head, so naive attention runs at the speed of DRAM, about 20
#   TFLOPS on an H100.
# - FlashAttention keeps the scores in SRAM: its memory is `O`'s, its traffic
#   `Θ(N²·d² / M)`, the least possible `4·N·d` while a block covers the sequence. Module 05
#   writes it.
