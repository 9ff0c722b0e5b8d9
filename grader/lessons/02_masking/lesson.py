# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 Masking: hiding keys from softmax
#
# In attention, each query `i` gives a weight to each key `j`: a row of
# `softmax(scores[i, :])`. Often some keys must get **no weight at all**:
#
# - **causal** models (GPT-style) must not look at the future: query `i` sees keys `j <= i`;
# - **padding**: sequences of different lengths are padded to one length `n` to make a
#   batch, and nobody may attend to a pad token.
#
# A mask says which keys are hidden. The trick: set their scores to `-inf`, and
# `exp(-inf) = 0` gives them weight 0 while the other weights still sum to 1.
#
# **Convention in this course**: a boolean mask is **True where a key is blocked**
# (like the `attn_mask` of `torch.nn.MultiheadAttention`; careful: the boolean `attn_mask`
# of `scaled_dot_product_attention` uses the opposite). A 0/1 mask: **1 = blocked**.
#
# In this notebook you will write:
# 1. `causal_mask_bool` and `causal_mask` (boolean and additive causal masks, 1 + 1 points);
# 2. `apply_mask`: blocked scores become `-inf` (2 points);
# 3. `padding_mask` for a batch of ragged sequences, combined with causal (2 points);
# 4. `safe_softmax`: zeros, not NaN, on rows where everything is masked (2 points);
# 5. `masked_softmax_kernel` + `masked_softmax`: the same in one Triton kernel (3 + 2 points).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import course  # first: picks the GPU, or Triton's interpreter on a CPU, before triton loads

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl

from course import plots
from course.checks import masking as checks

print(course.describe())

# %% [markdown]
# ## 1. The causal mask
#
# For 4 tokens, query `i` (a row) may see keys `j` (columns) with `j <= i`:
#
# ```
#          key j:  0  1  2  3
# query 0          .  X  X  X      X = blocked (True)
# query 1          .  .  X  X      . = visible (False)
# query 2          .  .  .  X
# query 3          .  .  .  .
# ```
#
# The blocked entries are the **strict** upper triangle (`j > i`): the diagonal stays
# visible, since a token may look at itself. Write `causal_mask_bool(n)`: an `[n, n]`
# `torch.bool` tensor, True above the diagonal (`torch.triu` helps; read what its
# `diagonal` argument does). `device` says where to create it.

# %% nbgrader={"grade": false, "grade_id": "causal_mask_bool", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: masking.causal_mask_bool

# %% nbgrader={"grade": true, "grade_id": "test_causal_mask_bool", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_causal_mask_bool(causal_mask_bool)

# %% [markdown]
# The same mask in **additive** form: a float tensor with `0` where a key is visible and
# `-inf` where it is blocked, to be added to the scores (`scores + mask`). Visible scores
# are unchanged; blocked ones become `-inf`. Write `causal_mask(n, dtype)`: the additive
# mask, in the dtype of the scores it will be added to.

# %% nbgrader={"grade": false, "grade_id": "causal_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: masking.causal_mask

# %% nbgrader={"grade": true, "grade_id": "test_causal_mask", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_causal_mask(causal_mask)

# %% [markdown]
# ## 2. Applying a mask
#
# `apply_mask(scores, mask)` returns the scores with every blocked entry set to `-inf`.
# The mask may be boolean (True = blocked) or numeric (1 = blocked, 0 = visible), and it
# **broadcasts** against the scores: one `[M, N]` causal mask serves scores
# `[B, H, M, N]` of every batch entry and head. `Tensor.masked_fill` does exactly this;
# it wants a boolean mask. Return a new tensor: do not change `scores` in place. It must
# work for scores of any float dtype and layout (a transposed view too), however far from
# zero they lie.

# %% nbgrader={"grade": false, "grade_id": "apply_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: masking.apply_mask

# %% nbgrader={"grade": true, "grade_id": "test_apply_mask", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_apply_mask(apply_mask)

# %% [markdown]
# Random scores for 6 tokens, the causal mask, the masked scores (`-inf` shows as white)
# and the weights softmax gives them. Row 0 puts all its weight on key 0; each row's
# weights still sum to 1, spread only over the past.

# %% nbgrader={"grade": false, "grade_id": "plot_causal", "locked": true, "schema_version": 3, "solution": false, "task": false}
torch.manual_seed(0)
demo_scores = torch.randn(6, 6)
demo_masked = apply_mask(demo_scores, causal_mask_bool(6))
plots.heatmaps({"scores": demo_scores, "causal_mask_bool(6)": causal_mask_bool(6),
                "masked scores": demo_masked,
                "weights = softmax(masked)": torch.softmax(demo_masked, dim=-1)},
               unit=["weights = softmax(masked)"])
plt.show()

# %% [markdown]
# ## 3. Padding: a batch of ragged sequences
#
# Three sentences of 6, 4 and 2 tokens are padded to `n = 6` to make one batch; `lengths`
# holds their true lengths, `[6, 4, 2]`. In sequence `b`, the positions `j >= lengths[b]`
# are padding.
#
# Padding hides **keys** (the last dim of the scores): no query may attend to a pad token.
# The rows of pad *queries* may keep any weights: their outputs are thrown away later.
# So the mask needs one row of key flags per sequence, shared by all queries. Write
# `padding_mask(lengths, n)` returning a `torch.bool` tensor of shape **`[B, 1, n]`**,
# True at the padding positions. The middle dim of size 1 broadcasts over the queries:
# it works with scores `[B, n, n]`, and with a causal `[n, n]` mask:
# `padding_mask(lengths, n) | causal_mask_bool(n)` is the `[B, n, n]` mask that a
# causal model uses on a padded batch. `lengths` may be a list or a 1-D tensor (of any
# integer dtype, possibly a strided view).

# %% nbgrader={"grade": false, "grade_id": "padding_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: masking.padding_mask

# %% nbgrader={"grade": true, "grade_id": "test_padding_mask", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_padding_mask(padding_mask)

# %% [markdown]
# Sequence 1 of the batch (length 4): the padding mask hides the key columns 4 and 5 for
# every query; combined with causal, each query sees its past up to the last real token.

# %% nbgrader={"grade": false, "grade_id": "plot_padding", "locked": true, "schema_version": 3, "solution": false, "task": false}
demo_lengths = [6, 4, 2]
demo_pad = padding_mask(demo_lengths, 6)
demo_both = demo_pad | causal_mask_bool(6)
print("padding_mask:", tuple(demo_pad.shape), "| causal:", tuple(demo_both.shape))
demo_batch = torch.randn(3, 6, 6)
plots.heatmaps({"padding (length 4)": demo_pad[1].expand(6, 6),
                "weights, padding only": torch.softmax(apply_mask(demo_batch, demo_pad), -1)[1],
                "padding | causal": demo_both[1],
                "weights, padding | causal": torch.softmax(apply_mask(demo_batch, demo_both), -1)[1]},
               unit=["weights, padding only", "weights, padding | causal"])
plt.show()

# %% [markdown]
# ## 4. Rows where every key is masked
#
# Sometimes a query has **no** visible key: an empty sequence (length 0), a query placed
# before all the keys it may see (left padding with a causal mask), a sliding window
# over padding. Its row of scores is all `-inf`, and softmax gives NaN:
# the row max is `-inf`, and `-inf - (-inf)` is NaN. One NaN row poisons everything
# computed from it afterwards (a sum over the batch, the gradients of training).

# %% nbgrader={"grade": false, "grade_id": "demo_nan", "locked": true, "schema_version": 3, "solution": false, "task": false}
empty = apply_mask(torch.randn(2, 3, 4), padding_mask([4, 0], 4))  # sequence 1 is empty
print("weights of sequence 1:\n", torch.softmax(empty, dim=-1)[1])

# %% [markdown]
# Write `safe_softmax(scores, dim=-1)`: the softmax along `dim`, except that slices whose
# entries are **all** `-inf` give **zeros** (the query attends to nothing). Compute no NaN
# at all on the way, and raise no warnings: a NaN replaced afterwards still makes the
# gradients NaN in the backward pass, so `nan_to_num` and `isnan` may not be used to
# repair the result; give the fully masked slices finite scores before the softmax
# instead. `torch.softmax` is allowed here. It must work for scores in any layout (a
# transposed view), in float16 as in float32, and far from zero in either direction
# (around ±10⁴).

# %% nbgrader={"grade": false, "grade_id": "safe_softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: masking.safe_softmax

# %% nbgrader={"grade": true, "grade_id": "test_safe_softmax", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_safe_softmax(safe_softmax)

# %% [markdown]
# ## 5. A masked softmax in Triton
#
# Attention kernels never build a mask tensor: they know, from the indices `i` and `j`,
# whether a key is visible, and apply that rule to the block of scores they hold. Write
# `masked_softmax_kernel`, module 01's row softmax with masks:
#
# - the scores are `[B, M, N]` (M queries, N keys); the grid is `(M, B)`: program
#   `(i, b)` = (`tl.program_id(0)`, `tl.program_id(1)`) handles row `i` of batch entry
#   `b`, which starts at `in_ptr + b * in_stride_b + i * in_stride_m`;
# - load the row as one block of `BLOCK_SIZE` lanes, **masked** (`cols < n_keys`,
#   `other=-float("inf")`): the lanes past the end are not read and count for nothing;
# - hide the keys with `tl.where(visible, x, -float("inf"))`: when `CAUSAL`, key `j` is
#   visible if `j <= i`; when `HAS_LENGTHS`, if `j < length`, the int32 that `tl.load`
#   reads at `lengths_ptr + b`. `if CAUSAL:` on a `tl.constexpr` is decided when
#   the kernel is compiled: the unused branch costs nothing. With `M != N`, keep
#   `j <= i` (query `i` sees the first `i + 1` keys, like `is_causal` in PyTorch's SDPA);
# - a row with no visible key must give zeros, not NaN (section 4, now inside the kernel);
# - statistics (max, exp, sum) in float32, store in the output's dtype, store masked: a row
#   may have more than 65504 visible keys (the largest float16), and then its sum of exps
#   does not fit in a float16;
# - honour **all four** strides: the checks also hand the kernel scores and an output whose
#   rows and batch entries are not one after another in memory (slices of wider rows and
#   of taller batch entries, with strides that differ between the input and the output);
#   row `i` of entry `b` of the output starts at `out_ptr + b * out_stride_b + i *
#   out_stride_m`, and the memory between the output's rows must stay untouched;
# - any number of keys (from 1 to tens of thousands), scores far from zero in either
#   direction (around ±10⁴).

# %% nbgrader={"grade": false, "grade_id": "masked_softmax_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: masking.masked_softmax_kernel

# %% nbgrader={"grade": true, "grade_id": "test_masked_softmax_kernel", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_masked_softmax_kernel(masked_softmax_kernel)

# %% [markdown]
# The wrapper `masked_softmax(scores, causal=True, lengths=None)`:
#
# - takes scores `[B, M, N]`, or `[M, N]` (one sequence: view it as `[1, M, N]`), and
#   raises a `ValueError` for any other number of dims;
# - `lengths` (optional): a list or tensor of `B` ints (one for 2-D scores), sent to the
#   kernel as an int32 tensor on the scores' device; `None` means no padding;
# - it must accept non-contiguous scores: the kernel walks a row with unit stride, so if
#   `scores.stride(-1) != 1` (a transposed view) make it contiguous first; otherwise (a
#   slice of wider rows or of a larger batch) give the kernel the real strides;
# - launches `masked_softmax_kernel` on the grid `(M, B)` with
#   `BLOCK_SIZE = triton.next_power_of_2(N)` (never capped: one block covers a whole row,
#   for any N), and returns the weights with the shape and dtype of `scores`;
# - it only prepares and launches: the masking and the softmax happen in the kernel, from
#   the indices `i` and `j` (no mask tensor, no `masked_fill`, no PyTorch `exp` or softmax
#   in the wrapper).

# %% nbgrader={"grade": false, "grade_id": "masked_softmax", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: masking.masked_softmax

# %% nbgrader={"grade": true, "grade_id": "test_masked_softmax", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_masked_softmax(masked_softmax, masked_softmax_kernel)

# %% [markdown]
# Your kernel on a padded batch, causal, with 5 queries and 8 keys (`M != N`): sequence 2
# is empty, so its rows are zeros.

# %% nbgrader={"grade": false, "grade_id": "plot_kernel", "locked": true, "schema_version": 3, "solution": false, "task": false}
kernel_weights = masked_softmax(torch.randn(3, 5, 8, device=course.DEVICE), causal=True, lengths=[8, 3, 0])
panels = {f"sequence {b}, length {n}": kernel_weights[b] for b, n in enumerate([8, 3, 0])}
plots.heatmaps(panels, unit=panels, suptitle="masked_softmax(scores, causal=True, lengths=[8, 3, 0])")
plt.show()

# %% [markdown]
# ## 6. Will it compile on a GPU?
#
# The interpreter accepts some code that a GPU compiler rejects. This cell compiles your
# kernel for an H100 (sm_90) without running it. (It takes a few seconds.)

# %% nbgrader={"grade": false, "grade_id": "compile_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.gpu_compile import compile_for_gpu

compile_for_gpu(masked_softmax_kernel,
                {"out_ptr": "*fp32", "in_ptr": "*fp32", "lengths_ptr": "*i32",
                 "in_stride_b": "i32", "in_stride_m": "i32", "out_stride_b": "i32",
                 "out_stride_m": "i32", "n_keys": "i32",
                 "CAUSAL": "constexpr", "HAS_LENGTHS": "constexpr", "BLOCK_SIZE": "constexpr"},
                {"CAUSAL": True, "HAS_LENGTHS": True, "BLOCK_SIZE": 1024})

# %% [markdown]
# ## What you built
# - A mask is a rule on `(i, j)`: causal `j <= i`, padding `j < length`. As tensors,
#   True/1/`-inf` mark what is **blocked**, and broadcasting lets one small mask serve a
#   whole batch of heads.
# - Padding masks keys, not queries.
# - A fully masked row is a real case, not a corner case: softmax must return zeros
#   there, without computing a NaN on the way.
# - In a kernel, masks are `tl.where` on indices, never a tensor read from memory; the
#   load mask (do not read past the row) and the attention mask (do not attend) are two
#   different things. FlashAttention (modules 05-06) applies the same rules block by
#   block, and skips the blocks a causal mask hides entirely.
