# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 Causal and multi-head variants
#
# Module 05's kernel computes one kind of attention well. Models ask for more of it:
#
# - **causal attention that costs half**: module 05 stopped after the diagonal block but
#   masked every block it visited; here only the blocks that cross the diagonal pay for a
#   mask, and you count the blocks your kernel runs;
# - **batch and heads through strides**: projections come out as `[B, N, H, D]`, and the
#   kernel reads them as `[B, H, N, D]` with no copy;
# - **grouped-query and multi-query attention**: fewer K/V heads than query heads;
# - **cross-attention and decoding**: `Nq != Nk`, keys shorter than one block (a few text
#   tokens), and the question of where the causal diagonal goes when the lengths differ.
#
# In this notebook you will write:
# 1. `kv_block_range` (2 points): which key blocks a query block runs without a mask, with
#    one, or skips;
# 2. `block_counts` (1 point): how much of the work causal attention skips;
# 3. two questions on causal alignment (1 point each);
# 4. `attend_kv_blocks` and `attention_kernel` (5 points): the kernel, its key loop in two
#    phases, grouped heads, any strides, bottom-right alignment;
# 5. `attention` (2 points): the wrapper, taking views without copying them;
#
# and then measure what causal skipping saves.
#
# **This module's convention.** Here `causal=True` is aligned **bottom-right**, like
# FlashAttention's own library: query `i` sees keys `j <= i + (Nk - Nq)`. Modules 04 and 05
# (and PyTorch's `is_causal`) align it top-left, `j <= i`; the two agree when `Nq == Nk`.
# Section 1 shows why decoding needs bottom-right, and what happens to the queries that see
# no key.
#
# Run the cells in order. Each exercise is followed by a check that prints `ok` lines when
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
import triton.testing
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch, Rectangle

from course import plots
from course.checks import attention_variants as checks

print(course.describe())

# %% [markdown]
# ## 1. Where does the diagonal go when Nq != Nk?
#
# With as many queries as keys, causal means "query `i` sees keys `0 ... i`". With
# `Nq != Nk` there are two ways to place that diagonal:
#
# - **top-left** (PyTorch's `is_causal`, modules 04 and 05): query `i` sees keys `j <= i`.
#   The first query and the first key line up.
# - **bottom-right** (FlashAttention's library from its version 2.1, and this module):
#   query `i` sees keys `j <= i + (Nk - Nq)`. The **last** query and the **last** key line
#   up: the last query sees every key.
#
# Black is hidden, white is seen:

# %% nbgrader={"grade": false, "grade_id": "plot_alignment", "locked": true, "schema_version": 3, "solution": false, "task": false}
def hidden_keys(n_q, n_k, align):
    """True where query i may not see key j, for the alignment named."""
    shift = n_k - n_q if align == "bottom-right" else 0
    return torch.ones(n_q, n_k, dtype=torch.bool).triu(1 + shift)


plots.masks({f"{align}, Nq = {n_q}, Nk = {n_k}": hidden_keys(n_q, n_k, align)
             for n_q, n_k in ((3, 6), (6, 3)) for align in ("top-left", "bottom-right")})
plt.show()

# %% [markdown]
# **Why bottom-right.** A model that generates text keeps the keys and values of every
# token so far in a **KV cache**. A step that adds `Nq` new tokens computes `Nq` queries
# against `Nk` keys: the cached ones, then the new ones, last. New token `i` must see
# every cached token and the new ones up to itself: keys `j <= i + (Nk - Nq)`, the
# bottom-right mask. Top-left would let the first new token see only the first cached one.
#
# **Rows that see nothing.** With `Nq > Nk`, bottom-right leaves the first `Nq - Nk`
# queries with no key at all (the `6 x 3` picture: rows 0 to 2). Softmax over nothing is
# `0 / 0`. The convention of this module: **their output is 0 and their log-sum-exp is
# `-inf`**, the log of an empty sum (what `torch.logsumexp` gives for a row of `-inf`).
# Your kernel must give exactly that, never NaN.

# %% [markdown]
# ### Two questions (1 point each)
#
# **Q1.** A model appends 4 new tokens to a KV cache that holds 96: the queries are the 4 new
# tokens, the keys all 100 tokens, the new ones last. Each new token must see every cached
# token and the new tokens up to itself, no further. Which call gives exactly that? Set
# `decode_align_answer` to one letter:
#
# - **a**: `causal=True`, aligned top-left;
# - **b**: `causal=True`, aligned bottom-right;
# - **c**: `causal=False`: there are fewer queries than keys, so no mask is needed;
# - **d**: `causal=True`, aligned top-left, with the roles of queries and keys swapped.

# %% nbgrader={"grade": false, "grade_id": "decode_align", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: decode_align_answer = "x"  (one letter)
# solution: attention_variants.decode_align_answer

# %% nbgrader={"grade": true, "grade_id": "test_decode_align", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(decode_align_answer, name="decode_align_answer")

# %% [markdown]
# **Why.** Draw the `4 x 100` mask. New token `i` (`i = 0 ... 3`) is token `96 + i` of the
# sequence: it may see keys `0 ... 96 + i`, that is `j <= i + 96 = i + (Nk - Nq)`, the
# bottom-right mask. Top-left would show the first new token key 0 alone; `causal=False`
# would let the first new tokens see the ones after them; and swapping queries and keys
# gives a `100 x 4` mask, not the `4 x 100` one the scores have.

# %% [markdown]
# **Q2.** `F.scaled_dot_product_attention(q, k, v, is_causal=True)` with one query and 100
# keys (`Nq = 1`, `Nk = 100`): which keys does the query attend to? Set
# `sdpa_causal_answer` to one letter:
#
# - **a**: all 100 keys;
# - **b**: key 0 only;
# - **c**: key 99 only;
# - **d**: none: the output is NaN.

# %% nbgrader={"grade": false, "grade_id": "sdpa_causal", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: sdpa_causal_answer = "x"  (one letter)
# solution: attention_variants.sdpa_causal_answer

# %% nbgrader={"grade": true, "grade_id": "test_sdpa_causal", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(sdpa_causal_answer, name="sdpa_causal_answer")

# %% [markdown]
# **Why.** PyTorch's `is_causal` hides the entries above the main diagonal of the
# `[Nq, Nk]` scores, starting from the top-left corner: query `i` sees keys `j <= i`. The one
# query is query 0, so it sees key 0 alone, and its output is exactly `V[0]`. A decoding step
# with a KV cache wants the opposite: pass no causal mask (one new token sees the whole
# cache), or a bottom-right one such as `torch.nn.attention.bias.causal_lower_right`, used
# in section 6 below.

# %% [markdown]
# ## 2. Which key blocks a query block visits
#
# Program `i` of the grid owns query rows `q0 = i · BLOCK_Q` to `q0 + BLOCK_Q - 1` and walks
# the keys in blocks of `BLOCK_K`. With `shift = Nk - Nq`, row `r` sees keys
# `j <= r + shift`, that is `r + shift + 1` keys (kept between 0 and `Nk`). Each key block
# is one of three kinds for this program:
#
# - **unmasked**: every row of the query block sees every key of the block. The row that
#   sees the fewest keys is the **first** one, `q0`: whole blocks up to
#   `full_end = ⌊seen(q0) / BLOCK_K⌋ · BLOCK_K`. These need no mask at all: no `tl.where`,
#   no key test on the loads.
# - **masked**: some row sees some of its keys, but not every row all of them. They run
#   from `full_end` to `masked_end = seen(q0 + BLOCK_Q - 1)`, the keys the **last** row
#   sees, with masks.
# - **skipped**: blocks that start at or after `masked_end`: no row of the program needs
#   them, and the loop never reaches them.
#
# Without `causal`, every row sees all `Nk` keys: the whole blocks run unmasked, and only a
# ragged last block (`Nk` not a multiple of `BLOCK_K`) needs its mask.
#
# **A worked example**: `Nq = 6`, `Nk = 10`, blocks of 4 and 4, causal, so `shift = 4`.
#
# | query block | rows | keys seen by first / last row | full_end, masked_end | key block 0 (keys 0-3) | 1 (4-7) | 2 (8-9) |
# | --- | --- | --- | --- | --- | --- | --- |
# | 0 | 0-3 | 5 / 8 | 4, 8 | unmasked | masked | skipped |
# | 1 | 4-5 (6, 7 are padding) | 9 / 10 | 8, 10 | unmasked | unmasked | masked |
#
# (The padding rows 6 and 7 of the last block would see more, but there are only 10 keys:
# every count stays between 0 and `Nk`.) The same mask, with the blocks drawn in:

# %% nbgrader={"grade": false, "grade_id": "plot_worked_blocks", "locked": true, "schema_version": 3, "solution": false, "task": false}
fig = plots.masks({"bottom-right, Nq = 6, Nk = 10, blocks of 4 x 4": hidden_keys(6, 10, "bottom-right")})
for edge in (3.5, 7.5):
    fig.axes[0].axvline(edge, color="tab:red", linewidth=2)
fig.axes[0].axhline(3.5, color="tab:red", linewidth=2)
plt.show()

# %% [markdown]
# Write `kv_block_range(q_block, n_q, n_k, block_q, block_k, causal)`: the pair of ints
# `(full_end, masked_end)` for query block `q_block`, bottom-right aligned when `causal`.
#
# - `full_end` is a multiple of `block_k`: only whole blocks run unmasked;
# - `masked_end` is exactly the number of keys the block's last row sees (not rounded up to
#   a block: the masks take care of the rest), `n_k` when not causal;
# - both lie between 0 and `n_k`: a query block whose rows see no key gets `(0, 0)`.
#
# The tests try every query block of: square sizes, `Nq < Nk` and `Nq > Nk`, a single query,
# K/V shorter than one block, lengths that are not multiples of the blocks,
# `block_q != block_k`, causal and not.

# %% nbgrader={"grade": false, "grade_id": "kv_block_range", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_variants.kv_block_range

# %% nbgrader={"grade": true, "grade_id": "test_kv_block_range", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_kv_block_range(kv_block_range)

# %% [markdown]
# Your `kv_block_range` for four shapes: each square is one (query block, key block) pair,
# and the red line is the causal diagonal, key `j = i + shift`. Only the squares the line
# crosses, or the ragged ends of the keys, need a mask.

# %% nbgrader={"grade": false, "grade_id": "plot_block_kinds", "locked": true, "schema_version": 3, "solution": false, "task": false}
KINDS = ListedColormap(["#6baed6", "#fd8d3c", "#e0e0e0"])  # unmasked, masked, skipped


def draw_block_kinds(ax, n_q, n_k, block_q, block_k, causal):
    """Each (query block, key block) pair coloured by what kv_block_range makes of it."""
    grid = torch.full((triton.cdiv(n_q, block_q), triton.cdiv(n_k, block_k)), 2)
    for row in range(grid.shape[0]):
        whole, reach = kv_block_range(row, n_q, n_k, block_q, block_k, causal)
        grid[row, :triton.cdiv(reach, block_k)] = 1
        grid[row, :whole // block_k] = 0
    ax.imshow(grid, cmap=KINDS, vmin=0, vmax=2, aspect="auto",
              extent=(0, grid.shape[1] * block_k, grid.shape[0] * block_q, 0))
    ax.set_xticks(range(0, grid.shape[1] * block_k + 1, block_k))
    ax.set_yticks(range(0, grid.shape[0] * block_q + 1, block_q))
    ax.grid(color="white", linewidth=1.5)
    if causal:
        ax.plot([n_k - n_q, n_k], [0, n_q], color="tab:red", linewidth=2)
    ax.axvline(n_k, color="black", linestyle="--", linewidth=1)
    ax.axhline(n_q, color="black", linestyle="--", linewidth=1)
    ax.set(xlim=(0, grid.shape[1] * block_k), ylim=(grid.shape[0] * block_q, 0),
           xlabel="key j", ylabel="query i",
           title=f"Nq = {n_q}, Nk = {n_k}{', causal' if causal else ''}\n"
                 f"blocks {block_q} x {block_k}")


fig, axes = plt.subplots(1, 4, figsize=(16, 4))
for ax, shape in zip(axes, [(128, 128, 32, 16, True), (48, 128, 16, 32, True),
                            (128, 40, 32, 16, True), (100, 7, 32, 32, False)]):
    draw_block_kinds(ax, *shape)
fig.legend(handles=[Patch(color=KINDS(i), label=label) for i, label in
                    enumerate(["unmasked", "masked", "skipped"])], loc="lower center", ncol=3)
fig.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()

# %% [markdown]
# Left to right: a square causal problem (the blocks of 32 x 16 put two masked blocks on
# each row of the diagonal); a chunk of 48 new queries against 128 keys, where even the
# first query sees 81 keys; 128 queries against 40 keys, where the first 88 rows see nothing
# and whole programs skip every block; 100 image tokens attending to 7 text tokens, fewer
# than one block: the only block is masked. Dashed lines: the real `Nq` and `Nk`.
#
# ## 3. How much work is skipped
#
# Each (query block, key block) pair a program runs costs the same two small matrix
# products. Write `block_counts(n_q, n_k, block_q, block_k, causal)`: the three ints
# `(unmasked, masked, skipped)`, how many pairs of one (batch, head) run without a mask,
# run with one, and are skipped (use your `kv_block_range`; a masked range that ends inside
# a block still runs that block). The three add up to
# `cdiv(n_q, block_q) · cdiv(n_k, block_k)`. The tests use the shapes of
# `kv_block_range`'s, and sequences of up to 16,384 with blocks of 128 x 64.

# %% nbgrader={"grade": false, "grade_id": "block_counts", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_variants.block_counts

# %% nbgrader={"grade": true, "grade_id": "test_block_counts", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_block_counts(block_counts)

# %% [markdown]
# Square causal attention with a GPU's blocks (128 x 64), from your `block_counts`: the
# share of all pairs that run, and the share that needs a mask, as `N` grows.

# %% nbgrader={"grade": false, "grade_id": "plot_work", "locked": true, "schema_version": 3, "solution": false, "task": false}
lengths = [2 ** p for p in range(8, 16)]
share = {"run (unmasked + masked)": [], "masked": []}
for n in lengths:
    kinds = block_counts(n, n, 128, 64, True)
    share["run (unmasked + masked)"].append((kinds[0] + kinds[1]) / sum(kinds))
    share["masked"].append(kinds[1] / sum(kinds))
ax = plots.lines(lengths, share, title="causal, Nq = Nk = N, blocks 128 x 64",
                 xlabel="N", ylabel="share of all block pairs", logx=True)
ax.axhline(0.5, color="gray", linestyle=":")
ax.set_ylim(0, 1.05)
plt.show()

# %% [markdown]
# The run share falls to one half, and the masked share to almost nothing: at `N = 16384`
# only the 256 pairs on the diagonal (2 per query block) pay for a mask, out of 16,512 run.
# Module 05's kernel ran the same pairs but masked all of them.
#
# ## 4. Batch and heads through strides
#
# A model computes `Q` as one matrix product, `x @ W_q`, giving `[B, N, H · D]`: token by
# token, every head's `D` numbers next to each other. Viewed as `[B, N, H, D]` and
# transposed to `[B, H, N, D]`, it is what the kernel wants, **without moving a byte**: only
# the strides change. The kernel finds element `[b, h, n, d]` at
# `b · stride_b + h · stride_h + n · stride_n + d · stride_d` whatever they are.

# %% nbgrader={"grade": false, "grade_id": "demo_strides", "locked": true, "schema_version": 3, "solution": false, "task": false}
projected = torch.randn(2, 100, 8 * 64)                    # [B, N, H * D], as x @ W_q gives it
q_view = projected.view(2, 100, 8, 64).transpose(1, 2)     # [B, H, N, D]
print("shape", tuple(q_view.shape), " strides", q_view.stride(), " contiguous:", q_view.is_contiguous())
print("same memory as the projection:", q_view.data_ptr() == projected.data_ptr())
print("head stride 64 (next head, same token), row stride 512 (next token, same head)")

# %% [markdown]
# **Grouped-query attention.** The KV cache of a long sequence holds `K` and `V` for every
# head: at 131,072 tokens, 32 heads of `D = 128` in fp16 take 2 GiB per layer, 64 GiB for
# 32 layers, for one sequence. Grouped-query attention (GQA) gives `H` query heads only
# `Hkv` K/V heads:
# the `GROUP = H / Hkv` **consecutive** query heads `j · GROUP ... j · GROUP + GROUP - 1`
# share K/V head `j`, so query head `h` reads K/V head `h // GROUP`. Multi-query attention
# (MQA) is `Hkv = 1`. The cache shrinks by `GROUP`; the kernel reads K/V head `h // GROUP`
# from the same tensor, and nothing is copied (module 04's `repeat_kv` copied it `GROUP`
# times).

# %% nbgrader={"grade": false, "grade_id": "plot_heads", "locked": true, "schema_version": 3, "solution": false, "task": false}
def draw_heads(ax, heads, kv_heads, mapping, title, color):
    """Query heads on top, K/V heads below (one box per K/V head, as wide as its group), a
    line from each query head to the K/V head it reads."""
    group = heads // kv_heads
    for j in range(kv_heads):
        ax.add_patch(Rectangle((j * group - 0.4, -0.15), group - 0.2, 0.3, color="#fd8d3c"))
        ax.text(j * group + (group - 1) / 2, 0, f"K/V {j}", ha="center", va="center", fontsize=9)
    for h in range(heads):
        ax.plot([h, mapping(h) * group + (group - 1) / 2], [0.9, 0.15], color=color, alpha=0.8)
    ax.scatter(range(heads), [1] * heads, s=250, color="#6baed6", zorder=3)
    for h in range(heads):
        ax.text(h, 1, str(h), ha="center", va="center", fontsize=9, zorder=4)
    ax.set(title=title, xlim=(-0.7, heads - 0.3), ylim=(-0.3, 1.25), xticks=[], yticks=[])


fig, axes = plt.subplots(1, 4, figsize=(16, 2.8))
draw_heads(axes[0], 8, 8, lambda h: h, "multi-head: H = Hkv = 8", "gray")
draw_heads(axes[1], 8, 2, lambda h: h // 4, "GQA, H = 8, Hkv = 2: head h // 4", "tab:green")
draw_heads(axes[2], 8, 1, lambda h: 0, "MQA, H = 8, Hkv = 1", "gray")
draw_heads(axes[3], 8, 2, lambda h: h % 2, "wrong: head h % Hkv", "tab:red")
axes[0].set_yticks([0, 1], ["K/V heads", "query heads"])
fig.tight_layout()
plt.show()

# %% [markdown]
# The last picture is the classic mistake: `h % Hkv` spreads neighbouring query heads over
# different K/V heads, where the model was trained with `h // GROUP`. It gives an answer of
# the right shape, and the wrong one.
#
# ## 5. The kernel
#
# The helpers of module 05 come with it (the input checks, the scale, the dot precision and
# the launch grid), and so does the update of one key block, written as a `@triton.jit`
# function that a kernel can call: `online_softmax_step` is module 05's loop body, with one
# change for the rows that have seen no key yet (their max is still `-inf`, and
# `exp2(-inf - (-inf))` would be NaN).

# %% nbgrader={"grade": false, "grade_id": "helpers", "locked": true, "schema_version": 3, "solution": false, "task": false}
# From module 05:
# given: flash_forward.SUPPORTED_DTYPES
# given: flash_forward.MIN_HEAD_DIM
# given: flash_forward.MAX_HEAD_DIM
# given: flash_forward.LOG2E
# given: flash_forward.LN2
# given: flash_forward.check_attention_inputs
# given: flash_forward.default_scale
# given: flash_forward.flash_grid
# given: flash_forward.dot_precision

# given: attention_variants.online_softmax_step

# %% [markdown]
# Write two `@triton.jit` functions.
#
# **`attend_kv_blocks(m_i, l_i, acc, q, kT_base, v_base, stride_kn, stride_vn, offs_q, d_ok,
# start, end, N_K, shift, qk_scale, BLOCK_K, MASKED, CAUSAL, DOT_PRECISION)`** walks the key
# blocks that start at `start, start + BLOCK_K, ...` (before `end`), and returns
# `(m_i, l_i, acc, steps)`, `steps` being how many blocks its loop ran (count them:
# `steps = 0` before the loop, `steps += 1` in it). For each block: load the `Kᵀ` tile
# (`kT_base + key · stride_kn`: the head-dim lanes are already in `kT_base`) and the `V` tile,
# `s = tl.dot(q, kᵀ, input_precision=DOT_PRECISION) · qk_scale`, then `online_softmax_step`.
#
# - `MASKED=False`: whole blocks every row sees. No key mask on the loads, no `tl.where` on
#   `s`: only the head-dim lanes past `HEAD_DIM` stay masked (`d_ok`).
# - `MASKED=True`: keys `>= N_K` are neither loaded (masked loads, `other=0`) nor counted
#   (score `-inf`); with `CAUSAL`, keys `j > row + shift` score `-inf` too.
#
# `MASKED` and `CAUSAL` are `tl.constexpr`: an `if MASKED:` is decided when the kernel is
# compiled, so the unmasked version of the loop holds no mask instruction at all.
#
# **`attention_kernel`** has module 05's arguments, plus `STEPS` and `COUNT_STEPS`. Program
# `(i, b · H + h)`:
#
# 1. reads K/V head `h // GROUP` (`GROUP = H // Hkv`), through each tensor's own strides;
# 2. loads its `Q` tile once, sets `m = -inf`, `l = 0`, `acc = 0` (fp32);
# 3. computes `full_end` and `masked_end` as `kv_block_range` does (with `tl.minimum` and
#    `tl.maximum`; the shift is `N_K - N_Q`);
# 4. calls `attend_kv_blocks` for `[0, full_end)` with `MASKED=False`, then for
#    `[full_end, masked_end)` with `MASKED=True`;
# 5. stores `O = acc / l`, except that a row that saw no key (`l == 0`) gets `O = 0` (divide
#    by 1 there), in `O`'s dtype through `O`'s strides, and `LSE = (m + log₂ l) · ln 2` at
#    `LSE + (b · H + h) · N_Q + row`, which is `-inf` for those rows (take `log₂` of the same
#    1, or the interpreter warns about `log2(0)`);
# 6. with `COUNT_STEPS`, stores its two `steps` counts, unmasked then masked, at
#    `STEPS + ((b · H + h) · tl.num_programs(0) + i) · 2` (int32, `[B · H, cdiv(Nq, BLOCK_Q), 2]`).
#    They are how you will measure the work, and how the checks see that the phases and the
#    skipping are right: outputs alone cannot tell a masked block from a skipped one.
#
# The check launches your kernel itself, on `(cdiv(Nq, BLOCK_Q), B · H, 1)`, with
# `COUNT_STEPS=True`, `BLOCK_Q` and `BLOCK_K` of 16 or 32 (not always equal),
# `BLOCK_D` = `D` rounded up to a power of two (at least 16), `GROUP = H // Hkv` and
# `qk_scale = sm_scale · log₂e`. It tries:
#
# - `GROUP` of 1, 2, 3, 4 and `Hkv = 1` (MQA); one to four query heads per batch entry,
#   one or two batch entries;
# - causal and not; `Nq == Nk`, `Nq < Nk` (down to a single query: decoding) and `Nq > Nk`
#   (rows with no key); K/V shorter than one block (7 keys for blocks of 32); lengths and
#   head dims (16 to 80) that are not multiples of the blocks;
# - `q`, `k`, `v` as views, each in its own layout (`[B, N, H, D]` viewed as `[B, H, N, D]`,
#   transposed matrices, slices of longer rows, and keys followed by NaN in memory, so that
#   a load past `N_K` shows); `O` as a view too; every entry of `O`, `LSE` and `STEPS` must
#   be written, and nothing around them;
# - module 05's extreme values: fp16 scores past 65,504 before scaling, fp32 rows of
#   scores far above or below zero, `V` around ±2,000;
# - fp32 and fp16 (and, on a GPU, bf16, 8 query heads, head dims up to 256 and sequences
#   of several hundred).

# %% nbgrader={"grade": false, "grade_id": "attention_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_variants.attend_kv_blocks

# solution: attention_variants.attention_kernel

# %% nbgrader={"grade": true, "grade_id": "test_attention_kernel", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
checks.check_attention_kernel(attention_kernel)

# %% [markdown]
# ### Measuring the work
#
# Your kernel counted its own blocks. One head, `N = 256`, blocks of 32 x 32: how many key
# blocks each program ran, causal and not.

# %% nbgrader={"grade": false, "grade_id": "demo_steps", "locked": true, "schema_version": 3, "solution": false, "task": false}
def measure_steps(n, causal, block=32, head_dim=64):
    """Launch attention_kernel on one head of n queries and keys; return STEPS [programs, 2]."""
    q_m, k_m, v_m = (torch.randn(1, 1, n, head_dim, device=course.DEVICE) for _ in range(3))
    o_m = torch.empty_like(q_m)
    lse_m = torch.empty(1, 1, n, device=course.DEVICE)
    counted = torch.zeros(1, triton.cdiv(n, block), 2, dtype=torch.int32, device=course.DEVICE)
    every_stride = [s for t in (q_m, k_m, v_m, o_m) for s in t.stride()]
    attention_kernel[(triton.cdiv(n, block), 1, 1)](
        q_m, k_m, v_m, o_m, lse_m, counted, *every_stride, 1, n, n, LOG2E / math.sqrt(head_dim),
        GROUP=1, HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_Q=block, BLOCK_K=block, CAUSAL=causal,
        COUNT_STEPS=True, DOT_PRECISION="ieee")
    return counted[0].cpu()


fig, axes = plt.subplots(1, 2, figsize=(12, 3.2), sharey=True)
for ax, causal in zip(axes, (False, True)):
    ran = measure_steps(256, causal)
    programs = range(ran.shape[0])
    ax.bar(programs, ran[:, 0], color=KINDS(0), label="unmasked")
    ax.bar(programs, ran[:, 1], bottom=ran[:, 0], color=KINDS(1), label="masked")
    ax.set(title=f"{'causal' if causal else 'not causal'}: {int(ran.sum())} block steps",
           xlabel="program (query block)", ylabel="key blocks run", ylim=(0, 10))
    ax.legend(loc="upper left", ncol=2)
plt.show()
print("predicted by block_counts:", block_counts(256, 256, 32, 32, False), "and",
      block_counts(256, 256, 32, 32, True), "(unmasked, masked, skipped)")

# %% [markdown]
# ## 6. The wrapper
#
# `attention(q, k, v, causal=False, sm_scale=None, *, block_q=None, block_k=None)` returns
# `(o, lse)` for `q` `[B, H, Nq, D]` and `k`, `v` `[B, Hkv, Nk, D]`:
#
# - check the inputs first with `check_attention_inputs` (it returns `B, H, Hkv, Nq, Nk, D`
#   and rejects 3-D inputs, mismatched head dims, lengths or batches, head counts that do
#   not divide, head dims outside 16-256, int and float64 dtypes, mixed dtypes); then check
#   the blocks: `block_q` and `block_k` must be powers of two of at least 16, else a
#   `ValueError` that says so;
# - blocks: those given; otherwise 32 x 32 in the interpreter (the checks expect it), and
#   on a GPU 128 x 64, or 64 x 32 when `D > 128`;
# - **copy nothing**: no `.contiguous()`, `.clone()`, `.reshape()`, `.repeat()`,
#   `repeat_interleave`, `.to()` or `.copy_()` in the wrapper (nor in a function it calls):
#   the kernel reads any layout through the strides and K/V heads through `GROUP`. The
#   grader reads your code for these names;
# - `o = torch.empty_like(q)`: for a `q` viewed from `[B, N, H, D]` it keeps `q`'s strides,
#   so `o` comes back in the same layout and `o.transpose(1, 2)` is again `[B, N, H, D]`
#   with no copy (the check compares `o`'s strides with those of `torch.empty_like(q)`);
#   `lse`: a `[B, H, Nq]` **float32** tensor;
# - **one** launch of `attention_kernel` on `flash_grid(Nq, B, H, block_q)`, with
#   `COUNT_STEPS=False` (pass `lse` as `STEPS`: it is never touched), `GROUP = H // Hkv`,
#   `HEAD_DIM = D`, `BLOCK_D = max(16, next_power_of_2(D))`, `qk_scale = scale · LOG2E`,
#   `CAUSAL`, `DOT_PRECISION = dot_precision(q.dtype)`; on a GPU, `num_warps=8` for
#   `BLOCK_D == 128` (else 4) and `num_stages=2` when `D > 128` (else 3).
#
# The check compares the grid and the blocks of the launch before it runs; no PyTorch
# softmax, attention or matrix product may run in the wrapper (nor in a function it calls).
# The inputs are the kinds of the kernel's check, with the default blocks too.

# %% nbgrader={"grade": false, "grade_id": "attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_variants.attention

# %% nbgrader={"grade": true, "grade_id": "test_attention", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_attention(attention, attention_kernel)

# %% [markdown]
# Yours against PyTorch's. Bottom-right causal in PyTorch needs an explicit mask object,
# `causal_lower_right` (its `is_causal=True` is top-left); here 8 new queries against a
# cache of 100 keys, 8 query heads on 2 K/V heads, the inputs views of `[B, N, H, D]`
# projections. Then cross-attention: 77 image tokens attending to 7 text tokens.

# %% nbgrader={"grade": false, "grade_id": "demo_compare", "locked": true, "schema_version": 3, "solution": false, "task": false}
from torch.nn.attention.bias import causal_lower_right

torch.manual_seed(0)
q_new = torch.randn(2, 8, 8, 64, device=course.DEVICE, dtype=torch.float16).transpose(1, 2)
k_all = torch.randn(2, 100, 2, 64, device=course.DEVICE, dtype=torch.float16).transpose(1, 2)
v_all = torch.randn(2, 100, 2, 64, device=course.DEVICE, dtype=torch.float16).transpose(1, 2)
o_new, _ = attention(q_new, k_all, v_all, causal=True)
k_rep, v_rep = (t.float().repeat_interleave(4, dim=1) for t in (k_all, v_all))
o_sdpa = F.scaled_dot_product_attention(q_new.float(), k_rep, v_rep, attn_mask=causal_lower_right(8, 100))
o_top_left = F.scaled_dot_product_attention(q_new.float(), k_rep, v_rep, is_causal=True)
print("bottom-right, max difference from SDPA + causal_lower_right:", float((o_new.float() - o_sdpa).abs().max()))
print("             and from SDPA is_causal=True (top-left):      ", float((o_new.float() - o_top_left).abs().max()))
print("o keeps q's layout: strides", o_new.stride(), "as q's", q_new.stride())

image = torch.randn(1, 4, 77, 64, device=course.DEVICE)
text_k, text_v = torch.randn(1, 4, 7, 64, device=course.DEVICE), torch.randn(1, 4, 7, 64, device=course.DEVICE)
o_cross, _ = attention(image, text_k, text_v)
print("cross-attention, 7 keys, max difference from SDPA:",
      float((o_cross - F.scaled_dot_product_attention(image, text_k, text_v)).abs().max()))

# %% [markdown]
# ## 7. How much faster is causal?
#
# On a GPU, the next cell times your `attention`, causal and not, with
# `triton.testing.do_bench` (fp16, 16 heads, `D = 64`, `B · N = 16,384`, the wrapper's
# default blocks of 128 x 64), and compares the ratio of times with the ratio of block
# pairs run, from your `block_counts`. Without a GPU there is nothing to time (the
# interpreter's speed says nothing about a GPU's): it prints the block counts alone.

# %% nbgrader={"grade": false, "grade_id": "timing", "locked": true, "schema_version": 3, "solution": false, "task": false}
seq_lens = (1024, 4096, 16384)
print(f"{'N':>6} {'causal pairs':>13} {'full pairs':>11} {'ratio':>6}"
      + ("" if course.INTERPRET else f" {'causal ms':>10} {'full ms':>8} {'ratio':>6}"))
for n in seq_lens:
    causal_kinds, full_kinds = block_counts(n, n, 128, 64, True), block_counts(n, n, 128, 64, False)
    run_causal, run_full = causal_kinds[0] + causal_kinds[1], full_kinds[0] + full_kinds[1]
    line = f"{n:6d} {run_causal:13,d} {run_full:11,d} {run_causal / run_full:6.3f}"
    if not course.INTERPRET:
        q_t, k_t, v_t = (torch.randn(16384 // n, 16, n, 64, device="cuda", dtype=torch.float16)
                         for _ in range(3))
        ms_causal = triton.testing.do_bench(lambda: attention(q_t, k_t, v_t, causal=True))
        ms_full = triton.testing.do_bench(lambda: attention(q_t, k_t, v_t, causal=False))
        line += f" {ms_causal:10.3f} {ms_full:8.3f} {ms_causal / ms_full:6.3f}"
    print(line)

# %% [markdown]
# On a GPU the time ratio comes out above the ratio of pairs, most at short lengths: the
# masked diagonal blocks cost more than the others, and in causal attention the programs
# of the first query blocks have little to do, so they finish early and leave part of the
# GPU idle at the end (module 07's tuned kernel starts the longest programs first).
#
# ## 8. Will it compile on a GPU?
#
# The interpreter runs some code a GPU compiler rejects. This cell compiles your kernel for
# an H100 (sm_90), as the wrapper launches it there (fp16, four query heads per K/V head,
# causal, blocks of 128 x 64), without running it. (It takes a few seconds.)

# %% nbgrader={"grade": false, "grade_id": "compile_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
checks.compile_kernel_for_gpu(attention_kernel)

# %% [markdown]
# ## What you built
# - Causal attention split per program into key blocks seen whole (no mask), blocks
#   crossing the diagonal or the end of the keys (masked), and blocks skipped: about half
#   the work of full attention, and only a sliver of it masked. Your kernel counted it.
# - Bottom-right alignment, what a KV cache needs: query `i` sees keys
#   `j <= i + (Nk - Nq)`; rows that see no key give `O = 0` and `LSE = -inf`, not NaN.
# - Grouped-query and multi-query attention with no copy: query head `h` reads K/V head
#   `h // GROUP`.
# - Any layout through strides, `[B, N, H, D]` projections included, in and out, and K/V
#   shorter than one block.
