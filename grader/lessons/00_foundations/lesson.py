# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 Foundations: a quiz before the kernels
#
# Eleven short questions on what the rest of the course builds on: vectors and matrix
# products, softmax and its `dim`, the GPU's memories, masks, kernel fusion and low
# precision. Some are answered with a few lines of PyTorch, some with one letter.
#
# How to answer: each question names a variable (or a function). Replace
# `raise NotImplementedError()` in the cell below the question by your answer, for example
# `q05_sram_vs_dram = "a"`, then run the check cell after it. The check first looks at the
# **form** of your answer (one letter, a number, a tensor of the right shape), then says at
# once whether it is **right**; once it is, the explanation of the question appears under
# the check. Answer first, then read why. Your grade comes from hidden tests when your
# notebook is graded (they also say which classic slip a wrong answer looks like).
# The last cell shows every question's points and your progress.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import course  # first: picks the GPU, or Triton's interpreter on a CPU, before triton loads

import matplotlib.pyplot as plt
import torch

from course import plots
from course.checks import foundations as checks

print(course.describe())

# %% [markdown]
# ## Vectors and matrices
#
# ### Q1 (1 point). The L2 norm of [3, 4]
# The L2 norm (Euclidean length) of a vector is $\|x\|_2 = \sqrt{\sum_i x_i^2}$.
# Set `q01_l2_norm` to the L2 norm of `[3, 4]`: compute it with torch, or by hand.

# %% nbgrader={"grade": false, "grade_id": "q01_l2_norm", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q01_l2_norm = the L2 norm of [3, 4] (a number)
# solution: foundations.q01_l2_norm

# %% nbgrader={"grade": true, "grade_id": "test_q01_l2_norm", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_q01_l2_norm(q01_l2_norm)

# %% [markdown]
# **Why.** The L2 norm is the length of the arrow from the origin to the point (3, 4): by
# Pythagoras, square the sides, add, take the square root. `torch.linalg.vector_norm(x)`
# computes it for any vector. (Forgetting the root gives the *squared* norm; adding the
# absolute values gives the L1 norm: both are other quantities.)

# %% [markdown]
# ### Q2 (1 point). A dot product
# The dot product of two vectors of the same length is $u \cdot v = \sum_i u_i v_i$.
# Set `q02_dot` to the dot product of `u` and `v` below (a number).

# %% nbgrader={"grade": false, "grade_id": "given_q02", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: foundations.u
# given: foundations.v

# %% nbgrader={"grade": false, "grade_id": "q02_dot", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q02_dot = the dot product of u and v (a number)
# solution: foundations.q02_dot

# %% nbgrader={"grade": true, "grade_id": "test_q02_dot", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_q02_dot(q02_dot)

# %% [markdown]
# **Why.** First entry times first entry, plus second times second, plus third times
# third. In attention, the score of query i for key j is exactly this: the dot product of
# the query vector with the key vector. A large dot product means the two vectors point
# the same way; `u · v = ‖u‖ ‖v‖ cos θ`.

# %% [markdown]
# ### Q3 (1 point). A 2x2 matrix product
# Set `q03_matmul` to the matrix product `a @ b` of the two matrices below (a 2x2 tensor).
# Entry (i, j) of a matrix product is the dot product of row i of `a` with column j of
# `b`. Try it by hand first, then with torch.

# %% nbgrader={"grade": false, "grade_id": "given_q03", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: foundations.a
# given: foundations.b

# %% nbgrader={"grade": false, "grade_id": "q03_matmul", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q03_matmul = the matrix product of a and b (a 2x2 tensor)
# solution: foundations.q03_matmul

# %% nbgrader={"grade": true, "grade_id": "test_q03_matmul", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_q03_matmul(q03_matmul)

# %% [markdown]
# **Why.** Entry (0, 0) takes row 0 of `a`, [1, 2], and column 0 of `b`, [5, 7]; entry
# (0, 1) takes the same row and column 1, and so on. `a * b` multiplies entry by entry
# instead: a different operation, and a classic slip. Order matters too: `b @ a` differs.
# Attention's scores are one matrix product, S = Q Kᵀ: all the query-key dot products at
# once. A product of an M×K by a K×N matrix costs M·N·K multiply-adds.

# %% [markdown]
# ## Softmax and its `dim`
#
# ### Q4 (2 points). Softmax of [1, 2, 3], and what `dim` means
# $\mathrm{softmax}(x)_i = e^{x_i} / \sum_j e^{x_j}$ turns scores into positive weights
# that sum to 1. On a tensor with several dimensions, `dim` says along which dimension the
# weights must sum to 1. Given the 2x3 tensor `x` below, set:
#
# - `q04_softmax_123`: the softmax of the vector `[1, 2, 3]` (a tensor of 3 weights);
# - `q04_softmax_dim0`: the softmax of `x` along `dim=0`;
# - `q04_softmax_dim1`: the softmax of `x` along `dim=1`;
# - `q04_attention_dim`: an attention score matrix has shape [queries, keys], one row per
#   query. Along which dim (`0` or `1`) does attention take its softmax?
#
# You may use `torch.softmax(t, dim=...)`, or `torch.exp` and `.sum(dim=..., keepdim=True)`.
# Look at which entries sum to 1 in each of your results.

# %% nbgrader={"grade": false, "grade_id": "given_q04", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: foundations.x

# %% nbgrader={"grade": false, "grade_id": "q04_softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q04_softmax_123 = softmax of [1, 2, 3]
# solution: foundations.q04_softmax_123
# q04_softmax_dim0 = softmax of x along dim 0
# solution: foundations.q04_softmax_dim0
# q04_softmax_dim1 = softmax of x along dim 1
# solution: foundations.q04_softmax_dim1
# q04_attention_dim = the dim attention takes its softmax along (0 or 1)
# solution: foundations.q04_attention_dim

# %% nbgrader={"grade": true, "grade_id": "test_q04_softmax", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_q04_softmax(q04_softmax_123, q04_softmax_dim0, q04_softmax_dim1, q04_attention_dim)

# %% [markdown]
# **Why.** softmax([1, 2, 3]) is e¹, e², e³ divided by their sum: each step of 1 in the
# score multiplies the weight by e ≈ 2.7, so the largest score takes most of the weight.
#
# `dim=d` means "the entries that differ only in their index along dimension d form one
# softmax". On a 2x3 tensor, `dim=0` (size 2) runs down each **column**: 3 softmaxes of 2
# entries, each column sums to 1. `dim=1` (size 3) runs along each **row**: 2 softmaxes of
# 3 entries, each row sums to 1. Attention normalizes each query's row of scores over all
# the keys, so it uses `dim=1`, written `dim=-1` (the last dim) so that it still works
# with batch and head dimensions in front.

# %% [markdown]
# ## Where the data lives on a GPU
#
# ### Q5 (1 point). SRAM and DRAM
# Which statement about a GPU's SRAM (shared memory / L1) and DRAM (HBM, "global memory")
# is right? Set `q05_sram_vs_dram` to one letter.
#
# - **a**: DRAM is faster: it is built into each streaming multiprocessor (SM), right next
#   to the compute units, while SRAM is the large memory on the graphics card.
# - **b**: SRAM is faster: it sits on the chip, inside each SM, and is small (hundreds of
#   KB per SM); DRAM is large (tens of GB) but off the chip, so it delivers far fewer
#   bytes per second.
# - **c**: They are equally fast; they differ only in that SRAM keeps its contents when the
#   power is off.
# - **d**: SRAM is faster, and it is the tens-of-GB memory where model weights and
#   activations stay between kernel launches.

# %% nbgrader={"grade": false, "grade_id": "q05_sram_vs_dram", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q05_sram_vs_dram = your answer: one letter, "a" to "d"
# solution: foundations.q05_sram_vs_dram

# %% nbgrader={"grade": true, "grade_id": "test_q05_sram_vs_dram", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(q05_sram_vs_dram, name="q05_sram_vs_dram")

# %% [markdown]
# **Why.** The picture below shows the hierarchy of an H100 (approximate figures). SRAM
# sits inside each SM, next to the units that compute: about 228 KB per SM, around
# 33 TB/s for all 132 SMs together. HBM (DRAM) is 80 GB in stacks beside the chip, at
# about 3.35 TB/s: some ten times slower, and everything a kernel reads or writes there
# crosses that link. Fast kernels load data from DRAM once, work on it in SRAM and
# registers, and write back only the result. That is the whole idea of FlashAttention.

# %% nbgrader={"grade": false, "grade_id": "plot_memory_hierarchy", "locked": true, "schema_version": 3, "solution": false, "task": false}
plots.memory_hierarchy_figure()
plt.show()

# %% [markdown]
# ### Q6 (1 point). Why subtract the max before a softmax?
# Libraries compute softmax as `exp(x - max(x)) / sum(exp(x - max(x)))`. Why? Set
# `q06_subtract_max` to one letter.
#
# - **a**: Without it the weights would not sum to 1.
# - **b**: `exp` of a large score overflows (in float32, `exp(89)` is already `inf`) and
#   `inf / inf` is NaN; subtracting the same constant from every score does not change the
#   softmax, and with the max every exponent is ≤ 0.
# - **c**: `exp` of a negative number is cheaper to compute, so the softmax runs faster.
# - **d**: It sharpens the distribution, so the largest score gets more weight than it
#   would otherwise.

# %% nbgrader={"grade": false, "grade_id": "q06_subtract_max", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q06_subtract_max = your answer: one letter, "a" to "d"
# solution: foundations.q06_subtract_max

# %% nbgrader={"grade": true, "grade_id": "test_q06_subtract_max", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(q06_subtract_max, name="q06_subtract_max")

# %% [markdown]
# **Why.** $e^{x_i - c} / \sum_j e^{x_j - c} = e^{x_i} / \sum_j e^{x_j}$: the factor
# $e^{-c}$ cancels, so any shift gives the same softmax. Shifting by the max makes every
# exponent ≤ 0, so every `exp` lies in (0, 1] and the largest is exactly 1: nothing
# overflows, and the sum is at least 1. Module 01 builds on this; FlashAttention keeps a
# *running* max for the same reason. Below, the scores 88, 89, 90 differ by the same
# steps as [1, 2, 3] in Q4, so they get the same weights, but only with the shift.

# %% nbgrader={"grade": false, "grade_id": "demo_overflow", "locked": true, "schema_version": 3, "solution": false, "task": false}
scores = torch.tensor([88.0, 89.0, 90.0])
shifted = torch.exp(scores - scores.max())
print("exp(scores)               =", torch.exp(scores))
print("softmax without the shift =", torch.exp(scores) / torch.exp(scores).sum())
print("exp(scores - max(scores)) =", shifted)
print("softmax with the shift    =", shifted / shifted.sum())

# %% [markdown]
# ### Q7 (1 point). What is tiling for?
# GPU matrix-product and attention kernels work on *tiles*: blocks of, say, 64x64 entries.
# What is tiling for? Set `q07_tiling` to one letter.
#
# - **a**: To split a matrix product so that each tile can run on a different GPU.
# - **b**: To load a block of the inputs from DRAM into fast on-chip SRAM once and reuse it
#   for many multiply-adds, so that far fewer bytes cross the slow DRAM link.
# - **c**: To lower the number of multiply-adds of an M×K by K×N product below M·N·K.
# - **d**: To make the result bit-for-bit identical to a float64 computation.

# %% nbgrader={"grade": false, "grade_id": "q07_tiling", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q07_tiling = your answer: one letter, "a" to "d"
# solution: foundations.q07_tiling

# %% nbgrader={"grade": true, "grade_id": "test_q07_tiling", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(q07_tiling, name="q07_tiling")

# %% [markdown]
# **Why.** In C = A B each entry of A is used N times and each entry of B M times. Reading
# them from DRAM every time they are used costs 2·M·N·K loads. A kernel that loads a T×T
# tile of A and one of B into SRAM uses each loaded entry T times before loading the next
# tiles, so DRAM traffic drops by a factor of about T, while the number of multiply-adds
# stays M·N·K. Module 03 counts this exactly; FlashAttention tiles Q, K and V the same way.

# %% [markdown]
# ## Masks
#
# ### Q8 (2 points). The causal mask for 4 tokens, and the weights it gives
# In a language model, token i may attend only to itself and to the tokens before it.
# Scores form a 4x4 matrix: row i is query i, column j is key j. An **additive** mask is
# added to the scores before the softmax: it holds `0` where query i may attend to key j
# and `-inf` where it may not (`exp(-inf) = 0`).
#
# - `q08_causal_mask`: the additive causal mask for 4 tokens (a 4x4 float tensor of 0 and
#   `-inf`). Useful: `torch.full`, `torch.triu` / `torch.tril` (and their `diagonal`
#   argument), or a loop.
# - `q08_causal_weights`: the attention weights `softmax(scores + mask)` along the last dim,
#   for scores that are all equal (take `torch.zeros(4, 4)`).

# %% nbgrader={"grade": false, "grade_id": "q08_causal", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q08_causal_mask = the additive causal mask for 4 tokens (4x4, 0 and -inf)
# solution: foundations.q08_causal_mask
# q08_causal_weights = softmax(zero scores + mask) along the last dim (4x4)
# solution: foundations.q08_causal_weights

# %% nbgrader={"grade": true, "grade_id": "test_q08_causal", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_q08_causal(q08_causal_mask, q08_causal_weights)

# %% [markdown]
# **Why.** Key j comes after query i exactly when j > i: those entries lie on one side of
# the diagonal, and only they are `-inf`. The diagonal itself stays 0: a token sees itself
# (blocking it leaves row 0 with nothing to attend to, and its softmax is 0/0 = NaN).
# With equal scores, each query spreads its weight evenly over the keys it may see, so the
# first token gives all its weight to itself and the last one spreads it over all four.
# Module 05's kernel skips the blocked half of a causal attention matrix entirely: about half
# the work.

# %% [markdown]
# Your mask and your weights as pictures (white = `-inf`). Does row 0 look at one key only,
# and row 3 at all four?

# %% nbgrader={"grade": false, "grade_id": "plot_causal", "locked": true, "schema_version": 3, "solution": false, "task": false}
plots.heatmaps({"your mask (white = -inf)": q08_causal_mask, "your weights": q08_causal_weights},
               annotate=True, unit=["your weights"])
plt.show()

# %% [markdown]
# ### Q9 (2 points). Applying a 0/1 mask with `masked_fill`
# Masks also come as 0/1 integer tensors of the same shape as the scores, where **1 means
# blocked** (a padding token, a future token). Write `q09_masked_softmax(scores, mask)`:
# use `scores.masked_fill(...)` to give every blocked score `-inf`, then take the softmax
# over the last dim. Blocked entries must get weight exactly 0, whatever the scores: the
# hidden tests use rows of scores far from zero (around ±1e4, ±1e10, ±1e30), where a
# large negative number such as `-1e9` in place of `-inf` is not enough and an `exp` of
# the raw scores overflows (Q6). Scores may be non-contiguous views, and the mask any 0/1
# integer dtype. (Here every row has at least one open entry; module 02 deals with rows
# that are blocked entirely.) Note that `masked_fill` wants a boolean mask.

# %% nbgrader={"grade": false, "grade_id": "q09_masked_softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: foundations.q09_masked_softmax

# %% nbgrader={"grade": true, "grade_id": "test_q09_masked_softmax", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_q09_masked_softmax(q09_masked_softmax)

# %% [markdown]
# **Why.** `masked_fill(condition, value)` replaces the entries where the condition is
# True and leaves the others. Blocked scores set to `-inf` weigh `exp(-inf) = 0` after the
# softmax, and the open entries share all of the weight. Three classic slips: filling with
# `0` instead of `-inf` (a score of 0 still weighs `exp(0) = 1`); filling with a large
# negative number such as `-1e9`, which a row of even lower scores outweighs; and inverting
# the polarity, which blocks exactly the entries that should be open.

# %% [markdown]
# ## Why fuse kernels, and why low precision
#
# ### Q10 (1 point). What kernel fusion saves
# Unfused attention for one head with N = 1024 tokens in FP16 (2 bytes per number) runs
# three kernels, each reading its inputs from DRAM and writing its output to DRAM:
#
# 1. `S = Q Kᵀ` writes the N×N scores S;
# 2. `P = softmax(S)` reads S and writes the N×N weights P;
# 3. `O = P V` reads P.
#
# A fused kernel (FlashAttention) computes S and P block by block in SRAM and never
# stores them in DRAM; Q, K, V and O are read and written either way. How many **bytes**
# of DRAM traffic does fusion save? Set `q10_fusion_bytes_saved` to that number (an
# expression such as `3 * 1024 * 1024` is fine).

# %% nbgrader={"grade": false, "grade_id": "q10_fusion", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q10_fusion_bytes_saved = the bytes of DRAM traffic fusion saves (a number)
# solution: foundations.q10_fusion_bytes_saved

# %% nbgrader={"grade": true, "grade_id": "test_q10_fusion", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_q10_fusion(q10_fusion_bytes_saved)

# %% [markdown]
# **Why.** Every N×N matrix that one kernel writes and the next one reads crosses the
# DRAM link twice. The traffic grows with N²: at N = 16,384 with 32 heads, S and P cost
# 64 GiB of traffic, about 20 ms at 3.35 TB/s, several times what the two matrix products
# take on an H100 (head dimension 128), and S alone needs 16 GiB of memory. Fusion removes
# both: the N×N matrices never leave SRAM. Module 04 measures this.

# %% [markdown]
# ### Q11 (1 point). Why FP16 / BF16?
# Attention kernels take FP16 or BF16 inputs, but keep some values in FP32. Which
# statement is right? Set `q11_low_precision` to one letter.
#
# - **a**: FP16 and BF16 are more precise than FP32, so every value, including the
#   softmax's running max and sum, should be kept in them.
# - **b**: They only matter on CPUs; a GPU computes FP32 just as fast as FP16.
# - **c**: They take half the bytes of FP32 (half the memory and the DRAM traffic) and GPU
#   tensor cores multiply them many times faster; values where rounding errors add up,
#   such as the softmax statistics and the matmul accumulators, are kept in FP32.
# - **d**: BF16 has more mantissa bits than FP32, so sums can be accumulated in BF16.

# %% nbgrader={"grade": false, "grade_id": "q11_low_precision", "locked": false, "schema_version": 3, "solution": true, "task": false}
# q11_low_precision = your answer: one letter, "a" to "d"
# solution: foundations.q11_low_precision

# %% nbgrader={"grade": true, "grade_id": "test_q11_low_precision", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(q11_low_precision, name="q11_low_precision")

# %% [markdown]
# **Why.** A 16-bit number is half the bytes, and an H100's tensor cores run FP16/BF16
# matrix products at roughly 15 times its plain FP32 rate. But 16 bits round coarsely:
# FP16 keeps 10 mantissa bits (and overflows above 65,504); BF16 keeps FP32's range but
# only 7 mantissa bits. A long sum in 16 bits stops growing once each new term is smaller
# than the rounding step, as the cell below shows. So kernels load and multiply in
# FP16/BF16, but accumulate products, and keep the softmax's running max and sum, in FP32.

# %% nbgrader={"grade": false, "grade_id": "demo_precision", "locked": true, "schema_version": 3, "solution": false, "task": false}
total16, total32 = torch.tensor(0.0, dtype=torch.float16), torch.tensor(0.0)
for _ in range(4096):  # add 0.1 4096 times: the exact sum is 409.6
    total16 += 0.1
    total32 += 0.1
print(f"sum in FP16: {float(total16):.1f}   sum in FP32: {float(total32):.1f}")
print("70000 in FP16:", torch.tensor(70000.0).half(), "  in BF16:", torch.tensor(70000.0).bfloat16())

# %% [markdown]
# ## What comes next
# - Module 01 builds a softmax that never overflows and computes it block by block.
# - Module 02 builds causal and padding masks and handles fully masked rows.
# - Module 03 tiles a matrix product in Triton; module 04 measures the cost of unfused
#   attention; module 05 fuses it all into FlashAttention.
