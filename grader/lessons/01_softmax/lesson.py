# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 Softmax: from the formula to a Triton kernel
#
# Attention is `softmax(Q Kᵀ / √d) V`. Before any attention kernel, we need a softmax that
# is **correct** for any input, that can be computed **one block at a time** (the trick
# FlashAttention is built on), and that runs as a **GPU kernel**.
#
# In this notebook you will write:
# 1. `softmax_naive`: the formula, and see it break (1 point);
# 2. `softmax_stable`: the version every library uses (2 points);
# 3. `online_softmax`: one pass over blocks with a running max and sum, and find a bug
#    (3 + 1 points);
# 4. `softmax_kernel` + `softmax`: a Triton kernel, one program per row, after a worked
#    first kernel and how to debug one (3 + 2 points).
#
# Run the cells in order; the last cell shows each exercise's points and your progress.
# Each exercise is followed by a check: it prints `ok` lines when
# your code is right and says what is wrong when it is not. When you submit, hidden tests
# run the same checks on inputs you have not seen.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import course  # first: picks the GPU, or Triton's interpreter on a CPU, before triton loads

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl

from course import plots
from course.checks import softmax as checks

print(course.describe())

# %% [markdown]
# ## 1. The formula
#
# $$\mathrm{softmax}(x)_i = \frac{e^{x_i}}{\sum_j e^{x_j}}$$
#
# It turns any vector of scores into probabilities: positive, summing to 1, the largest
# score getting the largest weight. On a tensor, `dim` says **along which axis** the
# entries must sum to 1: for a 2x3 tensor, `dim=1` normalizes each row (3 entries),
# `dim=0` each column (2 entries). Attention uses the last dim: each query's weights over
# the keys sum to 1.
#
# Write `softmax_naive` straight from the formula (no `torch.softmax`). It must work for a
# tensor of any number of dims, along any `dim`, and for non-contiguous views (a
# transposed or permuted tensor) too.

# %% nbgrader={"grade": false, "grade_id": "softmax_naive", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: softmax.softmax_naive

# %% nbgrader={"grade": true, "grade_id": "test_softmax_naive", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_softmax_naive(softmax_naive)

# %% [markdown]
# Now feed it scores that are merely large. `exp(1000)` does not fit in a float32
# (the largest is about 3.4e38 ≈ e^88.7), so it becomes `inf`, and `inf / inf` is `NaN`:

# %% nbgrader={"grade": false, "grade_id": "demo_overflow", "locked": true, "schema_version": 3, "solution": false, "task": false}
big = torch.tensor([1000.0, 1001.0, 1002.0])
print("exp(big)           =", torch.exp(big))
print("softmax_naive(big) =", softmax_naive(big))
print("torch.softmax(big) =", torch.softmax(big, dim=-1))

# %% [markdown]
# ## 2. Subtract the max
#
# For any constant c, $e^{x_i - c} / \sum_j e^{x_j - c} = e^{x_i} / \sum_j e^{x_j}$: the
# $e^{-c}$ cancels. Choose $c = \max_j x_j$. Then every exponent is ≤ 0, every `exp` lies
# in (0, 1], and the largest is exactly 1, so the sum is at least 1: no overflow, no
# division by zero. Take the max **along `dim`** (with `keepdim=True`, so it broadcasts).
#
# It must work for **any** scores, also far from zero in both directions: one tensor may
# hold slices around +10⁴ and slices around -10⁴. That is why the max is taken per slice:
# the max of the whole tensor would leave a slice that lies far below it with
# `exp(-10⁴) = 0` everywhere (underflow), and 0 / 0 is NaN.

# %% nbgrader={"grade": false, "grade_id": "softmax_stable", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: softmax.softmax_stable

# %% nbgrader={"grade": true, "grade_id": "test_softmax_stable", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_softmax_stable(softmax_stable)

# %% [markdown]
# Scores and the probabilities they give. Notice that shifting every score by the same
# amount changes nothing: only differences between scores matter.

# %% nbgrader={"grade": false, "grade_id": "plot_probabilities", "locked": true, "schema_version": 3, "solution": false, "task": false}
scores = torch.tensor([2.0, 1.0, 0.1, 3.0, -1.0, 2.5])
fig, axes = plt.subplots(1, 4, figsize=(16, 3.2))
plots.bars({f"x{i}": v for i, v in enumerate(scores)}, title="scores x", ax=axes[0])
plots.bars({f"x{i}": v for i, v in enumerate(softmax_stable(scores))},
           title="softmax(x): positive, sums to 1", ax=axes[1])
plots.bars({f"x{i}": v for i, v in enumerate(scores + 100)}, title="scores x + 100", ax=axes[2])
plots.bars({f"x{i}": v for i, v in enumerate(softmax_stable(scores + 100))},
           title="softmax(x + 100): the same", ax=axes[3])
plt.show()

# %% [markdown]
# ## 3. Online softmax: one pass over blocks
#
# On a GPU a row of attention scores can be far longer than fast on-chip memory (SRAM).
# FlashAttention never holds the whole row: it walks over it **block by block** and keeps
# two numbers per row:
#
# - `m`, the running max of the scores seen so far;
# - `l`, the running sum of `exp(x - m)` over the scores seen so far.
#
# When a new block arrives, its max may be larger than `m`. The old sum was computed
# against the old max, so it must be **rescaled**: $e^{x - m_{old}} = e^{x - m_{new}} \cdot
# e^{m_{new} - m_{old}}$, i.e. multiply the old `l` by $\alpha = e^{m_{old} - m_{new}}$:
#
# ```
# m_new = max(m, max(block))
# l     = l * exp(m - m_new) + sum(exp(block - m_new))
# m     = m_new
# ```
#
# At the end `softmax(x) = exp(x - m) / l`.
#
# ### Find the bug
# The module outline wrote this update in another order. Read it and run it:

# %% nbgrader={"grade": false, "grade_id": "buggy_online", "locked": true, "schema_version": 3, "solution": false, "task": false}
def online_softmax_buggy(x, block_size, history=None):
    m, l = torch.tensor(float("-inf")), torch.tensor(0.0)
    for start in range(0, x.numel(), block_size):
        block = x[start:start + block_size]
        m = torch.maximum(m, block.max())             # the max is updated first...
        l = l * torch.exp(m - m) + torch.exp(block - m).sum()   # ...then "rescaled"
        if isinstance(history, list):
            history.append((m.item(), l.item()))
    return torch.exp(x - m) / l


x_demo = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
print("buggy :", online_softmax_buggy(x_demo, 2))
print("right :", torch.softmax(x_demo, dim=-1))

# %% [markdown]
# Why is it wrong? Set `rescale_bug_answer` to one letter:
#
# - **a**: `torch.maximum` compares the wrong tensors.
# - **b**: once `m` has been replaced, the rescale factor `exp(m_old - m_new)` is computed as
#   `exp(m - m)`, which is always 1, so the sum of earlier blocks stays measured against an
#   old, smaller max and is too large (and every probability too small).
# - **c**: the final division should use the sum of the last block only.
# - **d**: nothing is wrong; the difference is rounding error.

# %% nbgrader={"grade": false, "grade_id": "rescale_bug", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: rescale_bug_answer = "x"  (one letter)
# solution: softmax.rescale_bug_answer

# %% nbgrader={"grade": true, "grade_id": "test_rescale_bug", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(rescale_bug_answer, name="rescale_bug_answer")

# %% [markdown]
# Now write the fixed `online_softmax`. It must touch each element of `x` once to build
# `m` and `l` (one pass over the blocks), then produce the probabilities. If `history` is
# a list, append `(m, l)` after each block: the plot below uses it. Like `softmax_stable`
# it must work for scores far from zero in either direction (around ±10⁴): every `exp` is
# taken against the running max, which starts at `-inf` (a max that starts at 0 would
# make every `exp` of scores around -10⁴ underflow to 0).

# %% nbgrader={"grade": false, "grade_id": "online_softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: softmax.online_softmax

# %% nbgrader={"grade": true, "grade_id": "test_online_softmax", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_online_softmax(online_softmax)

# %% [markdown]
# The running statistics over the blocks of one row: the max only grows, and each time it
# jumps, the sum drops, because everything seen so far is re-measured against a larger max.
# The outline's buggy order never re-measures: its sum only grows, and ends far too large.

# %% nbgrader={"grade": false, "grade_id": "plot_running", "locked": true, "schema_version": 3, "solution": false, "task": false}
row = torch.tensor([0.5, 1.0, 0.2, 3.0, 2.5, 0.1, 6.0, 1.0, 5.5, 2.0, 7.0, 0.3])
history = []
online_softmax(row, 3, history=history)
blocks = torch.arange(1, len(history) + 1)
fig, axes = plt.subplots(1, 3, figsize=(14, 3.2))
plots.bars({str(i): v for i, v in enumerate(row)}, title="the row, one colour per block of 3",
           groups=[i // 3 for i in range(len(row))], ax=axes[0])
plots.lines(blocks, {"running max m": [h[0] for h in history]}, title="m after each block",
            xlabel="block", ax=axes[1])
buggy = []
online_softmax_buggy(row, 3, history=buggy)
plots.lines(blocks, {"running sum l (yours)": [h[1] for h in history],
                     "the buggy order": [h[1] for h in buggy]},
            title="l after each block", xlabel="block", ax=axes[2])
plt.show()

# %% [markdown]
# ## 4. A first Triton kernel, worked
#
# A Triton kernel is a Python function compiled for the GPU (or, here on a CPU, run by
# Triton's interpreter). It is launched on a **grid** of programs: `kernel[(n_rows,)](...)`
# starts `n_rows` copies of it, which on a GPU run at the same time. Each program learns
# which one it is from `tl.program_id(0)` and works on a **block** of elements at once:
# `tl.arange(0, BLOCK_SIZE)` is the vector `0, 1, ..., BLOCK_SIZE - 1`, and arithmetic on
# it works lane by lane, like a PyTorch tensor.
#
# Here is a whole kernel, done for you: it subtracts from each row its mean. Read it line
# by line; the softmax kernel you write next has the same skeleton.

# %% nbgrader={"grade": false, "grade_id": "worked_kernel", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: softmax.center_rows_kernel
# given: softmax.center_rows

# %% [markdown]
# - **Pointers.** `in_ptr` is the address of the tensor's first element; `in_ptr + i` is
#   element `i`. Row `row` of a contiguous `[n_rows, n_cols]` tensor starts at
#   `in_ptr + row * n_cols`, so `in_ptr + row * n_cols + lanes` is a *block* of pointers,
#   one per lane.
# - **Masks.** `BLOCK_SIZE` must be a power of two, so a row of 5 columns gets 8 lanes.
#   `mask=lanes < n_cols` keeps lanes 5, 6, 7 from reading or writing memory that is not
#   the row's; a masked load gives those lanes `other` instead. Which `other` is right
#   depends on what comes next: `0` adds nothing to a **sum**, `-inf` never wins a
#   **max** (and `tl.exp(-inf)` is `0`).
# - **Reductions.** `tl.sum(x, axis=0)`, `tl.max(x, axis=0)` turn a block into one number;
#   `tl.exp`, `-`, `/` work lane by lane.
#
# Run it on 3 rows of 5 columns, and compare with PyTorch:

# %% nbgrader={"grade": false, "grade_id": "demo_worked_kernel", "locked": true, "schema_version": 3, "solution": false, "task": false}
x = torch.randn(3, 5)
print("kernel :", center_rows(x))
print("PyTorch:", x - x.mean(dim=1, keepdim=True))

# %% [markdown]
# ### Debugging a kernel
#
# Under the interpreter a kernel is ordinary Python running one program after another, so
# `print(...)` inside it shows the values of a block (it fails to compile on a GPU: remove
# it, or use `tl.device_print("name", value)`, which works in both). Printing for one
# program only keeps the output short: `if row == 1: print(...)`.
#
# The errors you are most likely to meet, as the interpreter words them:
#
# | message | what it means |
# | --- | --- |
# | `arange's range must be a power of 2` | `BLOCK_SIZE` is not 1, 2, 4, 8, ...: use `triton.next_power_of_2(n)` |
# | `incompatible dimensions at index 0: 8 and 4` | two blocks of different sizes meet in one operation |
# | `Mask argument cannot be block type if pointer argument is not a block` | the pointer lacks its `+ lanes` |
# | a check saying *out of bounds* or *NaN came from memory outside the tensor* | a lane read or wrote past the tensor: a missing or wrong mask, or a wrong stride or grid |
#
# The cell below runs the worked kernel with a print for row 1, then with a block that is
# not a power of two, and shows the message.

# %% nbgrader={"grade": false, "grade_id": "demo_debugging", "locked": true, "schema_version": 3, "solution": false, "task": false}
@triton.jit
def center_rows_printing(out_ptr, in_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    lanes = tl.arange(0, BLOCK_SIZE)
    x = tl.load(in_ptr + row * n_cols + lanes, mask=lanes < n_cols, other=0.0)
    if row == 1:
        print("program", row, "loaded", x)
    tl.store(out_ptr + row * n_cols + lanes, x - tl.sum(x, axis=0) / n_cols, mask=lanes < n_cols)


if course.INTERPRET:  # plain print inside a kernel runs under the interpreter only
    center_rows_printing[(3,)](torch.empty_like(x), x, 5, BLOCK_SIZE=8)
try:
    center_rows(x, block_size=6)
except Exception as error:  # shown, not raised: this cell is about the message
    print("BLOCK_SIZE=6 ->", type(error).__name__, error)

# %% [markdown]
# ## 5. The softmax kernel: one program per row
#
# For a row softmax: one program per row, each loading the whole row as one block of
# `BLOCK_SIZE` lanes. `BLOCK_SIZE` must be a power of two (a `tl.arange` rule), so it is
# usually larger than the row: the extra lanes must be **masked**:
#
# - `tl.load(ptr + cols, mask=cols < n_cols, other=-float("inf"))`: lanes past the end
#   are not read, and they get `-inf`, which never wins the max and adds `exp(-inf) = 0`
#   to the sum. (With `other=0` they would add `exp(0 - max)` each: wrong.)
# - `tl.store(..., mask=cols < n_cols)`: never write past the row.
#
# Memory is addressed with pointers: row `r` of the input starts at
# `in_ptr + r * in_row_stride`, row `r` of the output at `out_ptr + r * out_row_stride`.
# The kernel must honour **both** row strides: the checks also hand it an input and an
# output whose rows are not one after another in memory (column slices of wider tensors,
# so a stride is larger than `n_cols`, and the two strides differ), and the memory between
# the output's rows must stay untouched. Convert the row index to `tl.int64` before
# multiplying it by a stride: in int32, `row * stride` wraps around past 2**31 elements
# (a 65536 x 32768 float16 tensor).
#
# Compute the statistics (max, exp, sum) in float32 even for float16 inputs, and store in
# the output's dtype (`out_ptr.dtype.element_ty`): a row may hold more than 65504 entries
# (the largest float16), and then its sum of exps does not fit in a float16. Rows may be
# of any width (from 1 to tens of thousands of columns) and lie far from zero in either
# direction (around ±10⁴).
#
# The checks surround your tensors with NaN and sentinel values in memory, so a missing
# mask shows up as a clear message instead of silent garbage (the interpreter does no
# bounds checking).

# %% nbgrader={"grade": false, "grade_id": "softmax_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: softmax.softmax_kernel

# %% nbgrader={"grade": true, "grade_id": "test_softmax_kernel", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_softmax_kernel(softmax_kernel)

# %% [markdown]
# What did your kernel do? Under the interpreter every load and store can be recorded.
# Below, your kernel runs on a 6 x 7 slice of a wider tensor (its rows are 12 apart in
# memory, the output's 10 apart); each colour is one program. One program per row, each
# touching all of its row and nothing else, is what a row softmax should look like; a
# kernel that ignores a stride, or a grid over the wrong axis, shows up here at a glance.

# %% nbgrader={"grade": false, "grade_id": "plot_kernel_accesses", "locked": true, "schema_version": 3, "solution": false, "task": false}
checks.show_kernel_accesses(softmax_kernel)

# %% [markdown]
# The wrapper allocates the output, picks `BLOCK_SIZE = triton.next_power_of_2(n_cols)`
# and launches one program per row: `softmax_kernel[(n_rows,)](...)`. It must work for
# any number of columns, from 1 to tens of thousands (never cap `BLOCK_SIZE`: one block
# covers the whole row), and for float16 as well as float32. It must accept
# non-contiguous input (a transposed view, a column slice of a wider tensor, every other
# column): give the kernel `x`'s real row stride `x.stride(0)`, and if `x.stride(1) != 1`
# make `x` contiguous first (the kernel walks a row with unit stride). It raises a
# `ValueError` for input that is not 2-D. The wrapper only prepares and launches: all of
# the softmax (max, exp, sum, division) happens in `softmax_kernel`, none of it in PyTorch.

# %% nbgrader={"grade": false, "grade_id": "softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: softmax.softmax

# %% nbgrader={"grade": true, "grade_id": "test_softmax", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_softmax(softmax, softmax_kernel)

# %% [markdown]
# ## Why fuse: bytes over bandwidth
#
# A softmax does a few operations per element; the GPU can do hundreds in the time it
# takes to fetch one element from DRAM. So its time is the **bytes it moves** divided by
# DRAM bandwidth (3.35 TB/s on an H100). Your kernel reads `x` once and writes `y` once:
# 2 passes over the data. The same softmax as separate PyTorch steps (`max`, subtract,
# `exp`, `sum`, divide) writes every intermediate to DRAM and reads it back: 8 passes
# (the max and the sum each read the data once; the subtract, the `exp` and the division
# each read it once and write it once). The model predicts 4x the time, independent of
# the row width. The markers are times measured on an H100, fp16, 32 Mi elements
# (the figures are given below, with the command that measured them).

# %% nbgrader={"grade": false, "grade_id": "given_h100_softmax", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: softmax.H100_SOFTMAX_WIDTHS
# given: softmax.H100_SOFTMAX_MS

# %% nbgrader={"grade": false, "grade_id": "plot_softmax_traffic", "locked": true, "schema_version": 3, "solution": false, "task": false}
elements, bandwidth = 2**25, 3.35e12  # bytes per second
widths = torch.tensor(H100_SOFTMAX_WIDTHS, dtype=torch.float64)
model_ms = {passes: torch.full_like(widths, passes * 2 * elements / bandwidth * 1e3)
            for passes in (2, 8)}  # 2 bytes an element in fp16
ax = plots.predicted_vs_measured(
    widths, {"model: 2 passes (fused)": model_ms[2], "model: 8 passes (unfused)": model_ms[8]},
    {f"H100: {name}": (widths, ms) for name, ms in H100_SOFTMAX_MS.items()},
    title="row softmax of 32 Mi fp16 elements on an H100", xlabel="row width N",
    ylabel="milliseconds", logy=True)
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
ax.figure.tight_layout()
plt.show()

# %% [markdown]
# The fused kernel reaches 70-80% of the bandwidth model on rows of 1024 and more (46% on
# rows of 256, where each program has little to do; the model counts no launch and no
# partly used memory transaction); the unfused steps take about 6x longer, more
# than the 4x the bytes predict: 5 launches instead of 1, and each step's kernel is a
# little further from the bandwidth. `torch.softmax` is one fused kernel too. Module 04
# makes the same count for attention, where the intermediates are `N x N` matrices.

# %% [markdown]
# ## 6. Will it compile on a GPU?
#
# The interpreter is forgiving: it runs some code that a GPU compiler rejects. This cell
# compiles your kernel for an H100 (sm_90) without running it, so you learn about such
# errors now, not when you first meet a GPU. (It takes a few seconds.)

# %% nbgrader={"grade": false, "grade_id": "compile_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.gpu_compile import compile_for_gpu

compile_for_gpu(softmax_kernel,
                {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_row_stride": "i32",
                 "out_row_stride": "i32", "n_cols": "i32", "BLOCK_SIZE": "constexpr"},
                {"BLOCK_SIZE": 1024})

# %% [markdown]
# ## What you built
# - `softmax_stable` is what every library computes; the max subtraction costs nothing and
#   removes overflow.
# - `online_softmax` needs only `(m, l)` per row to process a row block by block, as long
#   as the sum is rescaled **before** the max is replaced. Module 05 uses exactly this to
#   compute attention without ever storing the N×N score matrix.
# - `softmax_kernel` shows the Triton pattern used everywhere in this course: program id →
#   offsets → masked load → compute in fp32 → masked store.
