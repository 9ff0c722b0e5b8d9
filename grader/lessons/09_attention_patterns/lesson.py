# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 Patterns around attention
#
# Module 05's kernel computes `softmax(Q Kᵀ · scale) V`. A real model wraps more around it:
# the projection that makes `Q`, `K` and `V` from the tokens, and a way to tell the
# attention **where** each token sits (attention alone cannot: shuffle the keys and
# values together and every output stays the same). This module builds the patterns that
# today's models use, each one **inside** the kernel, where it costs almost nothing:
#
# 1. `qkv_projection`: one GEMM for `q`, `k` and `v`, split with views, no copy (2 points);
# 2. `rope`: rotary position embedding (RoPE) in PyTorch (2 points), and a question on what
#    it makes the scores depend on (1 point);
# 3. `rope_tile` and `rope_kernel`: RoPE in Triton, applied to a tile as it is loaded
#    (3 points);
# 4. `alibi_slopes`: ALiBi's slope per head, the bias it adds to the scores (2 points);
# 5. `key_block_range`: which key blocks a sliding window needs (2 points), and a question
#    (1 point);
# 6. `pattern_attention_kernel`: module 05's kernel with RoPE, ALiBi and sliding windows,
#    skipping every key block outside the window (6 points);
# 7. `pattern_attention`: the wrapper that launches it (2 points).
#
# **Positions.** Query row `i` sits at position `q_offset + i` of the sequence, key `j` at
# position `j`. Without a cache `q_offset = 0`; when a model generates text, the keys are
# every token so far (the KV cache) and the queries the newest ones, at its end:
# `q_offset = Nk − Nq` (module 06's bottom-right alignment). Every pattern here depends on
# the **distance** `q_offset + i − j` between a query and a key.
#
# Run the cells in order; the last cell shows each exercise's points and your progress.
# Each exercise is followed by a check that prints `ok` lines when your code is right and
# says what is wrong when it is not. Hidden tests run the same checks on inputs you have
# not seen.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import course  # first: picks the GPU, or Triton's interpreter on a CPU, before triton loads

import math

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl

from course.checks import attention_patterns as checks

print(course.describe())

# %% [markdown]
# ## 1. One projection for q, k and v
#
# Each token's vector `x` (`C` channels) becomes a query, a key and a value through three
# weight matrices: `q = x W_qᵀ`, `k = x W_kᵀ`, `v = x W_vᵀ`. Stacking the three weights into
# one `w_qkv` makes that **one** GEMM: one launch instead of three, `x` read once, and a
# wider product that keeps a GPU busier.
#
# The rows of `w_qkv` hold, in this order, the `H` query heads, then the `Hkv` key heads,
# then the `Hkv` value heads, `D` rows each (`Hkv < H` is grouped-query attention):
#
# ```
# w_qkv rows: | q head 0 | ... | q head H-1 | k head 0 | ... | k head Hkv-1 | v head 0 | ... |
#               D rows                       D rows                          D rows
# ```
#
# So `x @ w_qkv.T` is `[B, N, (H + 2·Hkv)·D]`, and the rest is bookkeeping that moves no
# data: `.view(B, N, H + 2·Hkv, D)` gives every head its slot, `.split` cuts the slots into
# the three parts, `.transpose(1, 2)` puts heads before tokens. Each result is a **view**
# `[B, heads, N, D]` whose strides are `(N·F, D, F, 1)` with `F = (H + 2·Hkv)·D`: not
# contiguous, and it need not be, since module 05's kernel reads any strides.
#
# (Checkpoints differ: GPT-NeoX stores each head's q, k and v rows together, `[H, 3, D]`.
# This lesson's layout is the one above, three parts one after another.)
#
# The input checks are given:

# %% nbgrader={"grade": false, "grade_id": "given_projection", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: attention_patterns.check_projection_inputs

# %% [markdown]
# ### Exercise 1: `qkv_projection` (2 points)
#
# Write `qkv_projection(x, w_qkv, heads, kv_heads=None)` (`kv_heads` defaults to `heads`):
#
# - call `check_projection_inputs` first (it returns `D`, and raises for bad inputs);
# - **one** GEMM with the whole `w_qkv` (the check watches the sides of every matrix
#   product), then views: `.view`, `.split` or slicing, `.transpose`. No copy: no
#   `.contiguous()`, `.clone()` or `torch.cat`/`torch.stack` (the check verifies that `q`,
#   `k` and `v` live in one piece of memory; the hidden test also reads your code for
#   `cat` and `stack`);
# - return `q`, `k`, `v` in `x`'s dtype.
#
# The tests try: grouped heads (`kv_heads < heads`), fp32 and fp16, `x` and `w_qkv` as
# views (stored transposed, or slices of longer rows), and `x` far above or far below zero.

# %% nbgrader={"grade": false, "grade_id": "qkv_projection", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_patterns.qkv_projection

# %% nbgrader={"grade": true, "grade_id": "test_qkv_projection", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_qkv_projection(qkv_projection)

# %% [markdown]
# The three views, where they start in the product's memory (in elements), and their
# strides:

# %% nbgrader={"grade": false, "grade_id": "demo_projection", "locked": true, "schema_version": 3, "solution": false, "task": false}
x_demo = torch.randn(2, 5, 32)
w_demo = torch.randn((8 + 2 * 2) * 16, 32) / 32 ** 0.5
q_demo, k_demo, v_demo = qkv_projection(x_demo, w_demo, 8, 2)
for label, t in (("q", q_demo), ("k", k_demo), ("v", v_demo)):
    print(f"{label}: shape {tuple(t.shape)}, starts at element {t.storage_offset():3d}, "
          f"strides {t.stride()}, contiguous: {t.is_contiguous()}")
print("one piece of memory:", len({t.untyped_storage().data_ptr() for t in (q_demo, k_demo, v_demo)}) == 1)

# %% [markdown]
# ## 2. RoPE: positions as rotations
#
# RoPE (Su et al., 2021, used by Llama, Mistral, Qwen, ...) turns `q` and `k` according to
# their positions. The `D` lanes of a head form `D/2` **pairs**; pair `i` is a point in a
# plane, turned by the angle `position · θᵢ` with
#
# $$\theta_i = \text{base}^{-2i/D}, \qquad \text{base} = 10\,000 \text{ (Llama 3: } 500\,000\text{)}.$$
#
# Pair 0 turns by 1 radian per position, the last pair about `1/base` radian: fast pairs
# tell near positions apart, slow ones far positions. Turning `(a, b)` by the angle `φ`
# gives `(a cos φ − b sin φ, b cos φ + a sin φ)`.
#
# **Which lanes form a pair** is a convention, and a checkpoint only works with the one it
# was trained with:
#
# - **halves** (GPT-NeoX, Llama in Hugging Face's code): pair `i` is lanes `i` and
#   `i + D/2`;
# - **interleaved** (GPT-J, the RoFormer paper): pair `i` is lanes `2i` and `2i + 1`.
#
# **This lesson uses halves**, and the tests grade it: with `D = 8`, lanes `(0, 4)`,
# `(1, 5)`, `(2, 6)`, `(3, 7)` turn together, by `pos·θ₀ … pos·θ₃`.
#
# ### Exercise 2: `rope` (2 points)
#
# Write `rope(x, offset=0, base=10000.0)` for `x` `[..., N, D]`: row `n` sits at position
# `offset + n`.
#
# - Compute the table of angles `[N, D/2]` in float64 (it is small, and positions in the
#   thousands keep their precision), rotate in fp32, return a new tensor in `x`'s dtype.
# - An odd `D` has no pairs: raise a `ValueError`.
#
# The tests try: offsets from 0 to a few thousand, `D` not a power of two (40: pairs
# `(i, i + 20)`), base 10,000 and 500,000, fp32 and fp16, `x` as a view (`[B, N, H, D]`
# viewed as `[B, H, N, D]`, transposed, sliced), and `x` far above or far below zero.

# %% nbgrader={"grade": false, "grade_id": "given_rope_base", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: attention_patterns.ROPE_BASE

# %% nbgrader={"grade": false, "grade_id": "rope", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_patterns.rope

# %% nbgrader={"grade": true, "grade_id": "test_rope", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_rope(rope)

# %% [markdown]
# Left: one vector whose pairs 0, 4 and 8 all start at `(1, 0)`, turned by your `rope` at
# positions 0 to 15 (`D = 32`): pair 0 goes round at 1 radian per position, pair 4 at
# 0.1, pair 8 at 0.01. Right: the scores of one query turned to position `m` with one key
# turned to position `n`.

# %% nbgrader={"grade": false, "grade_id": "plot_rope", "locked": true, "schema_version": 3, "solution": false, "task": false}
unit = torch.zeros(1, 1, 16, 32)
unit[..., [0, 4, 8]] = 1.0  # lanes 0, 4, 8 start at 1; their partners 16, 20, 24 at 0
turned = rope(unit)[0, 0].numpy()
torch.manual_seed(0)
q_one, k_one = torch.randn(32), torch.randn(32)
scores = (rope(q_one.expand(1, 1, 32, 32))[0, 0] @ rope(k_one.expand(1, 1, 32, 32))[0, 0].T).numpy()
fig, (ax_turn, ax_scores) = plt.subplots(1, 2, figsize=(11, 4.6))
circle = torch.linspace(0, 2 * math.pi, 200)
ax_turn.plot(circle.cos(), circle.sin(), color="lightgray", linewidth=1)
for pair, color, labelled in zip((0, 4, 8), ("C0", "C1", "C2"), (range(7), (15,), (15,))):
    ax_turn.plot(turned[:, pair], turned[:, pair + 16], "o", color=color, markersize=5,
                 label=f"pair {pair}: lanes ({pair}, {pair + 16}), θ = {10000 ** (-2 * pair / 32):g}")
    for pos in labelled:  # the position each point was turned to
        ax_turn.annotate(f"pos {pos}" if pos == 15 else str(pos), (turned[pos, pair], turned[pos, pair + 16]),
                         xytext=(4, 4), textcoords="offset points", fontsize=8, color=color)
ax_turn.set(title="a pair turned at positions 0 ... 15", xlabel="first lane of the pair",
            ylabel="second lane of the pair", xlim=(-1.2, 1.2), ylim=(-1.2, 1.2), aspect="equal")
ax_turn.grid(alpha=0.3)
ax_turn.legend(fontsize=8, loc="lower left")
limit = float(abs(scores).max())
image = ax_scores.imshow(scores, cmap="RdBu_r", vmin=-limit, vmax=limit)
ax_scores.set(title="rope(q at m) · rope(k at n)", xlabel="key position n", ylabel="query position m")
fig.colorbar(image, ax=ax_scores, fraction=0.046, label="score")
fig.tight_layout()
plt.show()

# %% [markdown]
# ### Question (1 point): what do the scores depend on?
#
# After RoPE, the score of the query at position `m` with the key at position `n`
# depends on... Set `relative_answer` to one letter:
#
# - **a**: `m` and `n`, each on its own;
# - **b**: only `m − n`: turning `q` by `mθ` and `k` by `nθ` leaves their dot product equal
#   to that of `q` with `k` turned by `(n − m)θ`;
# - **c**: only `m + n`;
# - **d**: neither: RoPE changes the vectors, not the scores.

# %% nbgrader={"grade": false, "grade_id": "relative", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: relative_answer = "x"  (one letter)
# solution: attention_patterns.relative_answer

# %% nbgrader={"grade": true, "grade_id": "test_relative", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(relative_answer, name="relative_answer")

# %% [markdown]
# **Why.** Turning a pair by an angle is a rotation matrix `R`, and `R_mᵀ R_n = R_{n−m}`
# (turn back by `mθ`, then forward by `nθ`), so `(R_m q) · (R_n k) = qᵀ R_mᵀ R_n k =
# q · (R_{n−m} k)`: only the distance counts. The picture above shows it: each diagonal
# `m − n = constant` holds one colour.

# %% [markdown]
# ## 3. RoPE inside a kernel, as the tiles are loaded
#
# RoPE's scores depend only on the distance between a query and a key. So the offset
# matters only where queries and keys start at different positions, the KV-cache case:
# new queries at `Nk − Nq …`, keys from 0. Turning the queries from position 0 there moves
# every distance by `Nk − Nq`; turning queries and keys with the same wrong offset changes
# nothing, which is why the tests give them different starts.
#
# A separate RoPE kernel would read `q` and `k` from DRAM, turn them and write them back,
# and the attention kernel would read them again: twice the traffic of `q` and `k`. Turning
# each tile right after the attention kernel loads it costs no traffic at all, a few
# `cos`/`sin` per element.
#
# First, a worked example: kernels built from `@triton.jit` **helper functions**. A helper
# is called like a Python function from inside a kernel and compiled into it (inlined): no
# launch, no cost. These two load and store a tile of rows of one `[N, D]` matrix (masked,
# through its strides); every kernel of this module uses them.

# %% nbgrader={"grade": false, "grade_id": "given_tiles", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: attention_patterns.load_tile

# given: attention_patterns.store_tile

# given: attention_patterns.copy_heads_kernel

# %% nbgrader={"grade": false, "grade_id": "demo_copy", "locked": true, "schema_version": 3, "solution": false, "task": false}
x_copy = torch.randn(2, 7, 3, 40, device=course.DEVICE).transpose(1, 2)  # [B, N, H, D] seen as [B, H, N, D]
y_copy = torch.empty_like(x_copy)
copy_heads_kernel[(triton.cdiv(7, 16), 2 * 3, 1)](x_copy, y_copy, *x_copy.stride(), *y_copy.stride(), 3, 7,
                                                  HEAD_DIM=40, BLOCK_N=16, BLOCK_D=64)
print("copied exactly:", torch.equal(x_copy, y_copy), "| x's strides", x_copy.stride())

# %% [markdown]
# Now the rotation. A lane's partner is another **column of the same rows**, so there is
# no need to move lanes around in registers: load the rows a second time with each lane
# reading its partner's column, `x_partner`. With halves pairing, for lane `d` of
# `HEAD_DIM = D` lanes:
#
# ```
# partner = d + D/2 if d < D/2 else d - D/2        pair = d if d < D/2 else d - D/2
# sign    = -1      if d < D/2 else +1             angle = position · base^(-2·pair/D)
# out[d]  = x[d] · cos(angle) + sign · x_partner[d] · sin(angle)
# ```
#
# In Triton: `tl.where` builds `partner`, `pair` and `sign` from `lanes = tl.arange(0,
# BLOCK_D)`; `base^(−2·pair/D)` is `tl.exp2(pair · (−2/D) · tl.log2(base))`; `tl.cos` and
# `tl.sin` work on fp32 tiles. Lanes past `HEAD_DIM` are padding (`BLOCK_D` is a power of
# two): they load as 0 and stay 0, and `D/2`, the pairs and the frequencies come from
# `HEAD_DIM`, never from `BLOCK_D`.
#
# ### Exercise 3: `rope_tile` and `rope_kernel` (3 points)
#
# Write two functions:
#
# - `rope_tile(base, rows, positions, n_rows, stride_n, stride_d, rope_base, HEAD_DIM,
#   BLOCK_D)`, a `@triton.jit` helper: rows `rows` of the `[N, D]` matrix at `base` (load
#   them with `load_tile`, and their partners with a `tl.load` of your own, masked the same
#   way), turned at `positions` (one per row); it returns the fp32 tile. The attention
#   kernel of section 6 calls it for `q` and for `k`.
# - `rope_kernel(X, Y, strides of X, strides of Y, H, N, pos_offset, rope_base, HEAD_DIM,
#   BLOCK_N, BLOCK_D)`: `Y[b, h] = RoPE(X[b, h])` for `[B, H, N, D]` tensors, row `n` at
#   position `pos_offset + n`. Program `(i, b·H + h)` turns rows `i·BLOCK_N …` of batch `b`,
#   head `h` (module 05's grid, `BLOCK_N` rows per program); store with `store_tile`.
#
# The check launches `rope_kernel` on `(cdiv(N, BLOCK_N), B·H, 1)` with `BLOCK_D = D`
# rounded up to a power of two (at least 16). It tries offsets up to a few thousand, head
# dims that are not powers of two (40, 48), base 500,000, fp32 and fp16, `X` and `Y` as views
# (`Y` may have rows longer than `D`, whose extra entries must stay untouched), and `X` far
# from zero. Both functions must be `@triton.jit` functions, each defined once.

# %% nbgrader={"grade": false, "grade_id": "rope_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_patterns.rope_tile

# solution: attention_patterns.rope_kernel

# %% nbgrader={"grade": true, "grade_id": "test_rope_kernel", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
checks.check_rope_kernel(rope_kernel)

# %% [markdown]
# Your kernel against your `rope`, on 1,000 tokens that come after a cache of 3,000:

# %% nbgrader={"grade": false, "grade_id": "demo_rope_kernel", "locked": true, "schema_version": 3, "solution": false, "task": false}
x_rot = torch.randn(1, 2, 1000, 64, device=course.DEVICE)
y_rot = torch.empty_like(x_rot)
rope_kernel[(triton.cdiv(1000, 128), 2, 1)](x_rot, y_rot, *x_rot.stride(), *y_rot.stride(), 2, 1000, 3000,
                                            10000.0, HEAD_DIM=64, BLOCK_N=128, BLOCK_D=64)
print("largest difference from rope(x, offset=3000):", float((y_rot - rope(x_rot, offset=3000)).abs().max()))

# %% [markdown]
# The kernel computes its angles in fp32: near position 4,000, one unit in the last place
# of an angle is about 0.0002 radian, so it differs from the float64 table of `rope` by
# about that much. Kernels that need more precision load a table of `cos` and `sin`
# computed once, in higher precision, instead of computing them.
#
# ## 4. ALiBi: a penalty for distance
#
# ALiBi (Press, Smith and Lewis, 2022; used by BLOOM and MPT) adds no embedding at all. It
# adds a **bias** to each score: `−m_h · |distance|`, with a fixed slope `m_h` per head.
# Far keys get a larger penalty; heads with a large slope look only at their neighbourhood,
# heads with a small one far back. The slopes (the paper's rule):
#
# - `H` a power of two: the geometric sequence `2^(−8/H), 2^(−16/H), …, 2^(−8)`: head `h`
#   (from 0) gets `2^(−8(h+1)/H)`. For 8 heads: `1/2, 1/4, …, 1/256`.
# - otherwise, with `P` the largest power of two below `H`: the `P` slopes of `P` heads,
#   then the slopes of `2P` heads at odd ranks (its 1st, 3rd, 5th, …, in Python
#   `[0::2]`), until there are `H`. For 12 heads: the 8 slopes of 8 heads, then 4 of the 16
#   slopes of 16 heads, `2^(−0.5), 2^(−1.5), 2^(−2.5), 2^(−3.5)`.
#
# ### Exercise 4: `alibi_slopes` (2 points)
#
# Write `alibi_slopes(heads)`: a float32 tensor `[heads]` (raise a `ValueError` for
# `heads < 1`). The tests try powers of two and other counts, from 1 to over 100.

# %% nbgrader={"grade": false, "grade_id": "alibi_slopes", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_patterns.alibi_slopes

# %% nbgrader={"grade": true, "grade_id": "test_alibi_slopes", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_alibi_slopes(alibi_slopes)

# %% [markdown]
# The bias `−m_h · (i − j)` of four of 8 heads on a causal 24 x 24 grid (the blank
# triangle is masked; one colour scale for all four), and the slopes of 8 and of 12 heads:

# %% nbgrader={"grade": false, "grade_id": "plot_alibi", "locked": true, "schema_version": 3, "solution": false, "task": false}
slopes_8, slopes_12 = alibi_slopes(8).numpy(), alibi_slopes(12).numpy()
distance_demo = torch.arange(24)[:, None] - torch.arange(24)[None, :]
bias_demo = -torch.from_numpy(slopes_8)[:, None, None] * distance_demo.float()
bias_demo = bias_demo.masked_fill(distance_demo < 0, float("nan")).numpy()  # the future: masked, blank
shown = (0, 1, 3, 7)
fig, axes = plt.subplots(1, len(shown), figsize=(15, 3.6), layout="constrained")
for ax, head in zip(axes, shown):
    image = ax.imshow(bias_demo[head], cmap="magma", vmin=-float(slopes_8[0]) * 23, vmax=0)
    ax.set(title=f"head {head}: slope {float(slopes_8[head]):g}", xlabel="key j", ylabel="query i")
fig.colorbar(image, ax=list(axes), fraction=0.02, label="bias added to the score")
fig, ax = plt.subplots(figsize=(6, 3.4))
ax.semilogy(range(8), slopes_8, "o", label="8 heads")
ax.semilogy(range(8), slopes_12[:8], "x", color="C1", markersize=9, label="12 heads: the 8 of 8 heads")
ax.semilogy(range(8, 12), slopes_12[8:], "s", color="C2", label="12 heads: 4 of the 16 of 16 heads")
ax.set(title="slope of each head", xlabel="head h", ylabel="slope (log scale)", xticks=range(12))
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 5. Sliding windows: skip what no query sees
#
# With a **sliding window** of `W` keys (Mistral, Gemma, and the local layers of many
# models), the query at position `p` sees only keys `p − W + 1 … p`: `W` keys, itself
# included, so `0 <= distance < W`. A window is always causal here. Its point is speed:
# a query block needs only the key blocks that hold a key one of its queries sees, about
# `W / BLOCK_K + 1` of them, however long the sequence is.
#
# For query block `q_block` (rows `q_block·block_q …`, the last real one below `n_q`), with
# `p_first` and `p_last` the positions of its first and last real query:
#
# - the last key it needs is `min(n_k − 1, p_last)` (causal): `stop` is one past its block;
# - with a window, the first key it needs is `max(0, p_first − W + 1)`: its block is
#   `first`. That block is **partly** inside the window: it must run, with the keys before
#   the window masked inside it. Rounding up to the next full block, or starting from the
#   last query's window, loses keys the first queries see.
#
# ### Exercise 5: `key_block_range` (2 points)
#
# Write `key_block_range(q_block, n_q, n_k, block_q, block_k, *, q_offset=0, causal=False,
# window=None)`: the pair `(first, stop)` of key block indices (`first` included, `stop`
# not). Without causal or window every key block runs; `window` implies causal. The key
# block of key `j` is `j // block_k`.

# %% nbgrader={"grade": false, "grade_id": "key_block_range", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_patterns.key_block_range

# %% nbgrader={"grade": true, "grade_id": "test_key_block_range", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_key_block_range(key_block_range)

# %% [markdown]
# Which (query block, key block) pairs run, by your `key_block_range`, for 256 tokens in
# blocks of 32: causal, and a window of 80. Dark blocks run with every key visible to every
# query, light ones run masked (partly visible), white ones are skipped. The lines are the
# window's edges: a query at `p` sees the keys between them, `p − 79 … p`.

# %% nbgrader={"grade": false, "grade_id": "plot_window", "locked": true, "schema_version": 3, "solution": false, "task": false}
def block_map(n, block, window):
    """[blocks, blocks]: 0 skipped, 1 runs partly visible, 2 runs fully visible."""
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    sees = (distance >= 0) & (distance < (window or n))
    grid = torch.zeros(n // block, n // block)
    for qb in range(n // block):
        first, stop = key_block_range(qb, n, n, block, block, causal=True, window=window)
        for kb in range(first, stop):
            tile = sees[qb * block:(qb + 1) * block, kb * block:(kb + 1) * block]
            grid[qb, kb] = 2 if tile.all() else 1
    return grid.numpy()


import matplotlib.patches as mpatches

maps = {"causal": block_map(256, 32, None), "window W = 80": block_map(256, 32, 80)}
fig, axes = plt.subplots(1, 2, figsize=(11, 5.2))
for ax, (title, grid) in zip(axes, maps.items()):
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=2.4, extent=(0, 256, 256, 0))
    ax.plot([0, 256], [0, 256], color="k", linewidth=1)
    if "window" in title:
        ax.plot([0, 256 - 79], [79, 256], color="k", linewidth=1)
    ax.set_xticks(range(0, 257, 32))
    ax.set_yticks(range(0, 257, 32))
    ax.grid(color="gray", linewidth=0.5)
    runs, masked = int((grid > 0).sum()), int((grid == 1).sum())
    ax.set(title=f"{title}: {runs} of 64 blocks run, {masked} of them masked", xlabel="key", ylabel="query")
colors = plt.get_cmap("Blues")([2 / 2.4, 1 / 2.4, 0.0])
fig.legend(handles=[mpatches.Patch(facecolor=c, edgecolor="gray", label=label) for c, label in
                    zip(colors, ("runs, every key visible", "runs, partly visible (masked)", "skipped"))],
           loc="lower center", ncol=3)
fig.tight_layout(rect=(0, 0.07, 1, 1))
plt.show()

# %% [markdown]
# ### Question (1 point): how many key blocks?
#
# `N = 4096` tokens, blocks of 64 queries and 64 keys, a window of 512. How many key blocks
# does the query block that starts at token 2048 visit? Set `window_blocks_answer` to one
# letter:
#
# - **a**: 8 (512 / 64);
# - **b**: 9;
# - **c**: 32 (every block up to the diagonal, 2048 / 64);
# - **d**: 33.

# %% nbgrader={"grade": false, "grade_id": "window_blocks", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: window_blocks_answer = "x"  (one letter)
# solution: attention_patterns.window_blocks_answer

# %% nbgrader={"grade": true, "grade_id": "test_window_blocks", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(window_blocks_answer, name="window_blocks_answer")

# %% [markdown]
# **Why.** The block's first query, at 2048, sees keys 1537 … 2048. Key 1537 lies in block
# 24 (keys 1536 … 1599), only partly inside the window, but it must run. The last query,
# at 2111, sees up to its own key, in block 32. Blocks 24 … 32: nine, not 512 / 64 = 8: a
# window rarely starts on a block boundary, and the block on the diagonal runs too.

# %% [markdown]
# ## 6. One kernel with every pattern
#
# Module 05's loop, with positions. Two more helpers are given: `online_softmax_step` is
# module 05's update for one key block (running max, sum, accumulator) and `finish_rows`
# its end (`O = acc / l` and the natural-log `LSE`). Both handle a case module 05 never
# met: a row none of whose keys so far is visible. With a window, the first block a program
# visits can hold no visible key for its last rows; module 05's update would compute
# `exp2(−inf − (−inf))`, NaN, so the step takes its exponentials against 0 for such a row
# until it meets a key. `KERNEL_LOG2E` is `log₂ e` for use inside kernels.

# %% nbgrader={"grade": false, "grade_id": "given_kernel_helpers", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: flash_forward.SUPPORTED_DTYPES
# given: flash_forward.MIN_HEAD_DIM
# given: flash_forward.MAX_HEAD_DIM
# given: flash_forward.LOG2E
# given: flash_forward.LN2
# given: attention_patterns.KERNEL_LOG2E
# given: flash_forward.check_attention_inputs
# given: flash_forward.default_scale
# given: flash_forward.dot_precision
# given: flash_forward.flash_grid

# given: attention_variants.online_softmax_step

# given: attention_patterns.finish_rows

# %% [markdown]
# ### Exercise 6: `pattern_attention_kernel` (6 points)
#
# `pattern_attention_kernel` keeps module 05's grid and arguments, plus `SLOPES`,
# `BLOCKS_RUN`, `q_offset`, `window`, `rope_base` and the switches `ROPE`, `ALIBI`
# (`CAUSAL` as before). Program `(i, b·H + h)`, for its `BLOCK_Q` query rows:
#
# 1. `b`, `h`, and K/V head `h // GROUP`, as in module 05; the rows `i·BLOCK_Q + …` and their
#    positions `q_offset + row`;
# 2. the `Q` tile: `load_tile`, or with `ROPE`, `rope_tile` at the queries' positions,
#    converted back to `Q`'s dtype (`.to(Q.dtype.element_ty)`: the tensor cores want both
#    operands of `tl.dot` in one dtype);
# 3. with `ALIBI`, the slope of **query** head `h`, `SLOPES[h]`. The scores are in base 2
#    (`qk_scale = sm_scale · log₂e`), so the bias must be too: times `KERNEL_LOG2E`;
# 4. the key range. With `CAUSAL`, as in `key_block_range` but in keys, not blocks: `hi =
#    min(N_K, p_last + 1)` and `lo` the first key `max(0, p_first − window + 1)` rounded down
#    to a multiple of `BLOCK_K`; without, all keys. For plain causal attention the caller
#    passes a `window` longer than any distance (`q_offset + N_Q`), so one rule serves both;
# 5. for each key block from `lo` to `hi`: the `K` tile (`load_tile`, or `rope_tile` at the
#    keys' positions, `j`, then `.to(K.dtype.element_ty)`) **not** transposed, `s =
#    tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) · qk_scale`; with `ALIBI`, `s −=
#    slope · |distance|` (`distance = q_pos − j`, `tl.abs`); hide with `-inf` the keys `>= N_K`
#    and, with `CAUSAL`, those outside `0 <= distance < window`; then the `V` tile
#    (`load_tile`) and `online_softmax_step`. Count the blocks you visit;
# 6. `finish_rows`; store `O` with `store_tile` and `LSE` as in module 05 (`LSE + (b·H + h)·N_Q
#    + row`, masked); store the count at `BLOCKS_RUN + (b·H + h)·cdiv(N_Q, BLOCK_Q) + i`
#    (`BLOCKS_RUN` is a contiguous int32 `[B, H, cdiv(N_Q, BLOCK_Q)]` tensor; `tl.cdiv` works in
#    kernels).
#
# When `ALIBI` is off, `SLOPES` is `None`: read it only under `if ALIBI:` (`ROPE`, `ALIBI`
# and `CAUSAL` are `tl.constexpr`, so the branches not taken are not even compiled).
#
# The check launches your kernel on `(cdiv(Nq, BLOCK_Q), B·H, 1)` with blocks of 16 or 32,
# `BLOCK_D` = `D` rounded up to a power of two (at least 16), `qk_scale = sm_scale · log₂e`,
# and compares `BLOCKS_RUN` with the blocks `key_block_range` gives: a loop that masks the
# blocks outside the window instead of skipping them fails, as does one that skips a block
# partly inside it. It tries each pattern alone and all together, with grouped heads
# (`GROUP > 1`), `q_offset` from 0 to about 50, windows of 1, of a few keys and longer than the
# sequence, `Nq != Nk` and lengths that are not multiples of the blocks, `D` from 16 to 64
# (not always a power of two), fp32 and fp16, views for `q`, `k`, `v` and `O` (each in its
# own layout: use each tensor's strides), and module 05's kinds of values (scores far above
# and below zero; `V` around ±2,000). On a GPU also bf16 and hundreds of tokens. The kernel
# must be one `@triton.jit` function, defined once.

# %% nbgrader={"grade": false, "grade_id": "pattern_attention_kernel", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_patterns.pattern_attention_kernel

# %% nbgrader={"grade": true, "grade_id": "test_pattern_attention_kernel", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
checks.check_pattern_attention_kernel(pattern_attention_kernel)

# %% [markdown]
# ## 7. The wrapper
#
# ### Exercise 7: `pattern_attention` (2 points)
#
# `pattern_attention(q, k, v, *, causal=False, window=None, rope=False, rope_base=10000.0,
# q_offset=0, alibi_slopes=None, sm_scale=None, block_q=None, block_k=None)` returns `(o, lse,
# blocks_run)`. `alibi_slopes` is a float32 `[H]` tensor on `q`'s device (`alibi_slopes(H)`)
# or `None` for no ALiBi; `window` implies causal.
#
# - check the inputs with `check_attention_inputs` (it returns `B, H, Hkv, Nq, Nk, D`), then
#   the options with `check_pattern_options` (given below): both raise `ValueError` or
#   `TypeError` for what the kernel cannot take;
# - the window the kernel gets: `window`, or `q_offset + Nq` for plain causal attention (and
#   without causal, the kernel ignores it);
# - blocks, `BLOCK_D`, `o`, `lse`, the grid, `qk_scale`, `GROUP` and `DOT_PRECISION` as in
#   module 05's wrapper (in the interpreter 32 x 32 by default); `blocks_run` is a new int32
#   `[B, H, cdiv(Nq, block_q)]` tensor;
# - **one** launch of `pattern_attention_kernel`, passing `alibi_slopes` (maybe `None`) as
#   `SLOPES`.
#
# The Triton kernel does the work: the wrapper (and any function it calls) uses no PyTorch
# softmax, attention or matrix product. The tests try the kernel check's kinds of input
# and every option, and bad inputs: module 05's, plus RoPE with an odd head dim, a window
# of 0, a negative `q_offset`, causal with queries past the last key (`q_offset + Nq > Nk`),
# and slopes of the wrong shape or dtype.

# %% nbgrader={"grade": false, "grade_id": "given_options", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: attention_patterns.check_pattern_options

# %% nbgrader={"grade": false, "grade_id": "pattern_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: attention_patterns.pattern_attention

# %% nbgrader={"grade": true, "grade_id": "test_pattern_attention", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_pattern_attention(pattern_attention, pattern_attention_kernel)

# %% [markdown]
# Everything at once, as a model would run it: the projection's views go straight into the
# kernel (no copy), 24 new tokens after a cache of 72, RoPE, ALiBi and a window of 40,
# against the same computed in PyTorch with your `rope` and `alibi_slopes`:

# %% nbgrader={"grade": false, "grade_id": "demo_all", "locked": true, "schema_version": 3, "solution": false, "task": false}
torch.manual_seed(2)
B_all, N_all, C_all, H_all, Hkv_all, D_all, new = 1, 96, 64, 4, 2, 32, 24
x_all = torch.randn(B_all, N_all, C_all, device=course.DEVICE)
w_all = torch.randn((H_all + 2 * Hkv_all) * D_all, C_all, device=course.DEVICE) / C_all ** 0.5
q_all, k_all, v_all = qkv_projection(x_all, w_all, H_all, Hkv_all)
q_new = q_all[:, :, -new:]  # the newest tokens: positions 72 ... 95
slopes_all = alibi_slopes(H_all).to(course.DEVICE)
o_all, lse_all, runs_all = pattern_attention(q_new, k_all, v_all, window=40, rope=True, q_offset=N_all - new,
                                             alibi_slopes=slopes_all, block_q=16, block_k=16)

q_t = rope(q_new, offset=N_all - new).float()
k_t = rope(k_all).float().repeat_interleave(H_all // Hkv_all, 1)
positions_all = torch.arange(N_all, device=course.DEVICE)
distance_all = positions_all[-new:, None] - positions_all[None, :]  # query position - key position
s_all = q_t @ k_t.transpose(-1, -2) / math.sqrt(D_all) - slopes_all[:, None, None] * distance_all.abs()
s_all = s_all.masked_fill((distance_all < 0) | (distance_all >= 40), float("-inf"))
o_torch = torch.softmax(s_all, -1) @ v_all.float().repeat_interleave(H_all // Hkv_all, 1)
print("largest difference from PyTorch:", float((o_all - o_torch).abs().max()))
print("key blocks visited by each query block:", runs_all[0, 0].tolist(),
      f"(of {triton.cdiv(N_all, 16)}: the window skips the rest)")

# %% [markdown]
# ## 8. Will it compile on a GPU?
#
# The interpreter runs some code a GPU compiler rejects. This cell compiles your kernel,
# with every pattern on, for an H100 (sm_90) without running it (a few seconds).

# %% nbgrader={"grade": false, "grade_id": "compile_check", "locked": true, "schema_version": 3, "solution": false, "task": false}
checks.compile_kernel_for_gpu(pattern_attention_kernel)

# %% [markdown]
# ## What you built
# - A fused QKV projection: one GEMM, then views with strides `(N·F, D, F, 1)` that the
#   attention kernel reads as they are: no copy between the projection and attention.
# - RoPE, halves pairing: pair `(i, i + D/2)` turned by `position · base^(−2i/D)`, applied
#   inside the kernel to each tile as it is loaded, with a second load for the partners;
#   the scores then depend only on the distance, so the offset of new queries after a KV
#   cache is what matters.
# - ALiBi: the paper's slopes per head, and a bias `−m_h · |distance|` added to the scores
#   in the kernel, in base 2 like them.
# - Sliding windows: only the key blocks that hold a visible key run (the partly visible
#   ones masked), about `W / BLOCK_K + 1` per query block whatever the length; you counted
#   them.
# - One kernel for all of it, where each pattern is a few lines on top of module 05's loop.
