# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 Block sizes and tuning
#
# Module 05's kernel took its block sizes (`BLOCK_Q`, `BLOCK_K`) and launch settings
# (`num_warps`, `num_stages`) as given. Here you find out which values are allowed, which
# fit on the chip, and which are fast, and you compare a model of the kernel's memory
# traffic with the machine's limits. There are no kernels to write: everything is plain
# Python arithmetic, so the checks try many configurations.
#
# In this notebook you will write:
# 1. `check_block_config`: the constraints between the blocks of a whole attention step,
#    applied the way a production library applies them, one log line per change (4 points);
# 2. `smem_bytes`: the shared memory one program of module 05's kernel needs (2 points);
# 3. `prune_configs`: the configurations that fit, as an autotuner must know before it
#    compiles them (1 point);
# 4. two predictions: which of four configurations ran fastest on an H100, and why
#    (1 point each), checked against the measured sweep;
# 5. `kernel_dram_bytes`: the bytes the kernel moves, with module 04's traffic model,
#    for a roofline (2 points);
#
# and then follow the steps from module 05's kernel to the course's tuned one.
#
# Run the cells in order. Each exercise is followed by a check that prints `ok` lines when
# your code is right and says what is wrong when it is not. Hidden tests run the same
# checks on hundreds of configurations you have not seen.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import course  # first: picks the GPU, or Triton's interpreter on a CPU, before triton loads

import math

import matplotlib.pyplot as plt
import torch
import triton
import triton.language as tl
import triton.testing

from course.checks import block_tuning as checks

print(course.describe())

# %% [markdown]
# ## The blocks of an attention step
#
# A library that runs attention for training (forward and backward) names more blocks than
# module 05's two. Here are the seven of a configuration, all in tokens:
#
# | block | where it is used |
# |---|---|
# | `block_q`, `block_kv` | the forward: each program owns `block_q` query rows and walks the keys and values `block_kv` at a time |
# | `block_kv_compute` | the forward's inner step: a loaded KV block is computed `block_kv_compute` keys at a time |
# | `block_q_dkv`, `block_kv_dkv` | the backward's dK/dV kernel (module 08): a program owns `block_kv_dkv` keys and walks the queries `block_q_dkv` at a time |
# | `block_q_dq`, `block_kv_dq` | the backward's dQ kernel: a program owns `block_q_dq` queries and walks the keys `block_kv_dq` at a time |
#
# They are not independent. The constraints, and why:
#
# - **A compute sub-block divides its block** (`block_kv_compute | block_kv`): the inner
#   loop steps through a loaded block in whole sub-blocks; a remainder would need a
#   ragged, masked sub-block in every step.
# - **Backward blocks divide the forward ones** (`block_q_dkv | block_q`,
#   `block_kv_dkv | block_kv`, `block_q_dq | block_q`, `block_kv_dq | block_kv`): the
#   sequences are padded once, to multiples of the forward blocks, so a backward block that
#   divides its forward block tiles the same padded length exactly; and whatever the
#   forward knows per block (which blocks are fully masked, which are skipped) applies to
#   whole backward blocks.
# - **Each sequence is padded to a multiple of its forward block**: a library that pads
#   the inputs once needs no masks for ragged tails in its kernels.
# - **A block is never longer than its sequence**: a cross-attention whose keys are 77 text
#   tokens would compute 512-key blocks that are 85% padding. The block shrinks to the
#   sequence length, rounded up to a multiple of 16 (the smallest tile `tl.dot` takes).
#
# Every block is a multiple of 16 (powers of two are the usual choice, and Triton's
# `tl.arange` needs one, but a library's rules hold for any multiple of 16).

# %% [markdown]
# ### 1. The rules as code (4 points)
#
# `check_block_config(blocks, q_len, kv_len)` takes a dict with the seven blocks and the
# two sequence lengths, and returns `(adjusted, log)`: the configuration to run with, and
# the list of changes it made, as a library logs them. It applies three rules, in this
# order:
#
# 1. **Short sequences.** If `block_q` is longer than `q_len` rounded up to a multiple of
#    16, it becomes that; likewise `block_kv` with `kv_len`. (Only these two: the
#    sub-blocks follow in rule 2.)
# 2. **Sub-blocks divide their blocks**, checked after rule 1 and in this order:
#    `block_kv_compute`, `block_q_dkv`, `block_kv_dkv`, `block_q_dq`, `block_kv_dq`
#    (the dict `PARENTS` below, sub-block: its block). A sub-block that does not divide its
#    block becomes the largest multiple of 16 that divides the block and is no larger than
#    the sub-block asked for (a sub-block larger than its block becomes the block).
# 3. **Padding.** `q_len` becomes the smallest multiple of `block_q` at or above it;
#    `kv_len` the smallest multiple of `block_kv` at or above it.
#
# `adjusted` is a new dict with the seven blocks and the padded `q_len` and `kv_len`.
# `log` has one line per value that changed, in the order the rules change them (nothing
# for a value that stays), each written
#
# ```
# key: old -> new: why
# ```
#
# where `why` names what forced the change: the sequence length (the number) for rule 1,
# the block it must divide for rule 2 (e.g. `block_kv`), the block it is padded to for
# rule 3 (e.g. `block_q`). Start with the given `check_block_inputs(blocks, q_len,
# kv_len)`: it raises a `ValueError` (`TypeError` for a non-dict) for a missing or unknown
# key, a block that is not a positive multiple of 16, or a length that is not a positive
# whole number. The tests try these and expect the error.

# %% [markdown]
# A worked example: a cross-attention step with 4,000 queries and 77 text tokens, run with
# a configuration tuned for long sequences:
#
# ```
# blocks = {"block_q": 128, "block_kv": 512, "block_kv_compute": 64, "block_q_dkv": 128,
#           "block_kv_dkv": 128, "block_q_dq": 128, "block_kv_dq": 96}
# check_block_config(blocks, 4000, 77) ->
# adjusted: block_q 128, block_kv 80, block_kv_compute 16, block_q_dkv 128,
#           block_kv_dkv 80, block_q_dq 128, block_kv_dq 80, q_len 4096, kv_len 80
# log:
#   block_kv: 512 -> 80: short KV sequence (kv_len = 77)
#   block_kv_compute: 64 -> 16: must divide block_kv = 80
#   block_kv_dkv: 128 -> 80: must divide block_kv = 80
#   block_kv_dq: 96 -> 80: must divide block_kv = 80
#   q_len: 4000 -> 4096: padded to a multiple of block_q = 128
#   kv_len: 77 -> 80: padded to a multiple of block_kv = 80
# ```
#
# `block_kv_compute = 64` divided the `block_kv` it was given (512), but not the shrunk
# one (80 = 5 x 16): that is why rule 2 comes after rule 1. `block_q` fits the 4,000
# queries and stays; its sub-blocks divide it and stay.
#
# The tests try hundreds of random configurations: blocks that are multiples of 16 but
# rarely powers of two, sub-blocks that divide their block and sub-blocks up to twice
# their block, sequences from 1 token to 40,000, short on either side.

# %% nbgrader={"grade": false, "grade_id": "given_blocks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: block_tuning.BLOCK_KEYS
# given: block_tuning.PARENTS
# given: block_tuning.MIN_BLOCK
# given: block_tuning.check_block_inputs

# %% nbgrader={"grade": false, "grade_id": "check_block_config", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: block_tuning.check_block_config

# %% nbgrader={"grade": true, "grade_id": "test_check_block_config", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
checks.check_block_config_rules(check_block_config)

# %% [markdown]
# The worked example through your function, drawn: each row is one block size laid along
# its padded sequence (the keys' rows on the left, the queries' on the right); the dashed
# line is where the real sequence ends.

# %% nbgrader={"grade": false, "grade_id": "plot_blocks", "locked": true, "schema_version": 3, "solution": false, "task": false}
example = {"block_q": 128, "block_kv": 512, "block_kv_compute": 64, "block_q_dkv": 128,
           "block_kv_dkv": 128, "block_q_dq": 128, "block_kv_dq": 96}
adjusted, log = check_block_config(example, 4000, 77)
print("\n".join(log))
fig, axes = plt.subplots(1, 2, figsize=(13, 2.8))
for ax, side, length, real in ((axes[0], "kv", adjusted["kv_len"], 77),
                               (axes[1], "q", adjusted["q_len"], 4000)):
    names = [k for k in BLOCK_KEYS if k.startswith(f"block_{side}")]
    for row, name in enumerate(names):
        size = adjusted[name]
        for i, start in enumerate(range(0, length, size)):
            ax.barh(row, size, left=start, color=f"C{row}", alpha=0.55 + 0.3 * (i % 2),
                    edgecolor="white")
    ax.axvline(real, color="black", linestyle="--")
    ax.set_yticks(range(len(names)), [f"{n} = {adjusted[n]}" for n in names])
    ax.set(xlim=(0, max(length, real)), xlabel="token", title=f"{side}_len {real}, padded to {length}")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Shared memory
#
# A program's tiles live in the SM's **shared memory** (SRAM). Module 05's kernel holds:
#
# - its `Q` tile, `block_q` rows, loaded once and kept for the whole loop over the keys;
# - `K` and `V` tiles of `block_kv` rows, one of each **per pipeline stage**: with
#   `num_stages = s`, Triton's pipeliner starts the loads of the next `s - 1` key blocks
#   while the current one is being computed, so `s` K tiles and `s` V tiles are in shared
#   memory at once. More stages hide more of the memory latency, and cost more bytes.
#
# Every tile row is `BLOCK_D` wide: the head dim rounded up to a power of two, at least 16
# (module 05's rule), and each element takes its dtype's size. The statistics `m`, `l`
# and the accumulator live in registers, and on an H100 so does `P` on its way to the
# second `tl.dot` (the compiler's figures below leave no room for it in shared memory).
#
# A worked example: one `Q` tile of 128 rows at `D = 80`, in fp16:

# %% nbgrader={"grade": false, "grade_id": "demo_q_tile", "locked": true, "schema_version": 3, "solution": false, "task": false}
block_d_ex = max(16, triton.next_power_of_2(80))  # 128: D = 80 is padded
q_tile_bytes = 128 * block_d_ex * torch.empty((), dtype=torch.float16).element_size()
print(f"BLOCK_D = {block_d_ex}; one Q tile: 128 x {block_d_ex} x 2 bytes = {q_tile_bytes:,} bytes")

# %% [markdown]
# ### 2. The shared-memory model (2 points)
#
# Write `smem_bytes(block_q, block_kv, head_dim, dtype, stages)`: the bytes of one program's
# `Q` tile plus `stages` `K` tiles and `stages` `V` tiles, as an int. `dtype` is a torch
# dtype (`torch.empty((), dtype=dtype).element_size()` gives its bytes per element).
# `stages` below 1 means nothing (a pipeline holds at least the step it computes): raise a
# `ValueError`. The tests try fp16, bf16 and fp32, head dims from 16 to 256 that are
# rarely powers of two, one to six stages, and every configuration of the H100 sweep
# below, whose shared memory they compare with what Triton's compiler reported for it.

# %% nbgrader={"grade": false, "grade_id": "smem_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: block_tuning.smem_bytes

# %% nbgrader={"grade": true, "grade_id": "test_smem_bytes", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_smem_bytes(smem_bytes)

# %% [markdown]
# ### 3. Which configurations fit (1 point)
#
# An SM of an H100 has 228 KiB of shared memory; the driver keeps 1 KiB of it for each
# program it runs, so one program may use at most 227 KiB = **232,448 bytes** (CUDA's
# "opt-in" limit per block, `torch.cuda.get_device_properties(0).shared_memory_per_block_optin`).
# A configuration that needs more does not compile: Triton raises `OutOfResources`.
#
# `triton.autotune` compiles and times every configuration in its list, the first time a
# kernel meets a new shape. A configuration that cannot compile must leave the list first:
# `triton.autotune(configs, key, prune_configs_by={"early_config_prune": prune})` calls
# `prune(configs, named_args, **kwargs)` before timing anything. The course's tuned kernel
# (`solutions/flash_tuned.py`) prunes its list with the function you write now.
#
# Write `prune_configs(configs, head_dim, dtype, limit=None)`: `configs` is a list of
# `(block_q, block_kv, num_warps, num_stages)` tuples; return, as a list and in the order
# given, those whose `smem_bytes` is at most `limit` (a configuration that needs exactly
# the limit fits). With `limit=None`, use the given `smem_limit()`: this GPU's limit per
# program, or the H100's 232,448 bytes on a CPU. The tests try the sweep's 54
# configurations, lists in other orders, limits of their own, configurations that need
# exactly the default limit or 1 KiB more, and an empty list.

# %% nbgrader={"grade": false, "grade_id": "given_limit", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: block_tuning.H100_SMEM_PER_BLOCK
# given: block_tuning.smem_limit

# %% nbgrader={"grade": false, "grade_id": "prune_configs", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: block_tuning.prune_configs

# %% nbgrader={"grade": true, "grade_id": "test_prune_configs", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_prune_configs(prune_configs, smem_limit)

# %% [markdown]
# ### The model against the compiler
#
# The course swept module 05's kernel over 54 configurations on an H100
# (`python -m solutions.block_sweep`): `BLOCK_Q` in {64, 128, 256}, `BLOCK_K` in
# {32, 64, 128}, 4 or 8 warps, 2 to 4 stages, fp16, `D` = 64 and 128, causal or not, three
# sequence lengths. It recorded the shared memory of each compiled kernel, and what the
# compiler asked for where it refused one. The figures are given below (they are data, not
# code to read closely), then set against your model:

# %% nbgrader={"grade": false, "grade_id": "given_sweep", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: block_tuning.SWEEP_CONFIGS
# given: block_tuning.H100_SWEEP_SHARED
# given: block_tuning.H100_SWEEP_TFLOPS
# given: block_tuning.H100_SWEEP_SDPA

# %% nbgrader={"grade": false, "grade_id": "plot_smem", "locked": true, "schema_version": 3, "solution": false, "task": false}
model = {D: [smem_bytes(bq, bk, D, torch.float16, s) for bq, bk, w, s in SWEEP_CONFIGS]
         for D in H100_SWEEP_SHARED}
fits = {D: prune_configs(list(SWEEP_CONFIGS), D, torch.float16, H100_SMEM_PER_BLOCK)
        for D in H100_SWEEP_SHARED}
fig, ax = plt.subplots(figsize=(6.5, 5))
for D, marker in ((64, "o"), (128, "s")):
    refused = [H100_SWEEP_TFLOPS[(D, False, 16384)][i] is None for i in range(len(SWEEP_CONFIGS))]
    for flag, color, label in ((False, "tab:blue", "compiled"), (True, "tab:red", "refused (out of resources)")):
        xs = [m for m, r in zip(model[D], refused) if r == flag]
        ys = [c for c, r in zip(H100_SWEEP_SHARED[D], refused) if r == flag]
        if xs:
            ax.scatter(xs, ys, marker=marker, color=color, s=45, alpha=0.7, label=f"D = {D}, {label}")
top = 340_000
ax.plot([0, top], [0, top], color="gray", linewidth=1, label="model = compiler")
ax.axhline(H100_SMEM_PER_BLOCK, color="black", linestyle="--", label="H100 limit per program")
ax.axvline(H100_SMEM_PER_BLOCK, color="black", linestyle="--")
ax.set(xlim=(0, top), ylim=(0, top), xlabel="your smem_bytes (bytes)",
       ylabel="Triton's compiler on the H100 (bytes)", title="shared memory per program, fp16")
ax.legend(fontsize=8)
plt.show()
exact = sum(m == c for D in model for m, c in zip(model[D], H100_SWEEP_SHARED[D]))
print(f"model = compiler for {exact} of {2 * len(SWEEP_CONFIGS)} configurations; "
      f"your prune_configs keeps {len(fits[64])} of 54 at D = 64 and {len(fits[128])} at D = 128; "
      f"the compiler refused {sum(t is None for t in H100_SWEEP_TFLOPS[(128, False, 16384)])} "
      "(all at D = 128)")

# %% [markdown]
# Here the model is exact: every one of the 108 figures, including the 8 refusals at
# `D = 128` (128-key tiles with 4 stages, or with 3 when the query block has 256 rows). That
# is a fact about this kernel, this compiler (Triton 3.6) and this GPU, not a law. The
# model would be off:
#
# - where the compiler stages other tiles in shared memory: a kernel whose second product
#   reads `P` from shared memory adds `block_q x block_kv` elements (the measured figures
#   leave no room for one here: `P` stayed in registers); reductions (`tl.max`, `tl.sum`)
#   and layout conversions need scratch space, which here reused the same buffers;
# - where the pipeliner keeps another number of buffers: other Triton versions or GPUs, or
#   a loop it does not pipeline (then fewer buffers than `num_stages` says);
# - for everything that is not shared memory. The model says nothing about **registers**:
#   at `D = 64`, 256 x 128 tiles with 4 warps fit in 96 KiB, but each thread would hold
#   128 accumulator values and 256 scores, more than its 255 registers: they ran at 146
#   TFLOPS, 40% of the best.
#
# So the model prunes what cannot compile; it does not say what is fast. That takes a
# measurement, or at least a prediction you can check against one.

# %% [markdown]
# ## Predict, then measure
#
# Four configurations of the sweep, at one shape: `D = 64`, `N = 16,384` queries and keys,
# not causal, fp16, one sequence of 16 heads. Three things decide their speed:
#
# - **Arithmetic intensity**: every program reads all of `K` and `V` once, so a head's `K`
#   and `V` are read `ceil(N / block_q)` times; the flops do not change. Larger query
#   blocks mean fewer bytes per flop.
# - **Occupancy**: how many programs an SM holds at once. When one waits for memory,
#   another computes. Shared memory, registers and warps each cap it (the given
#   `programs_per_sm` applies the H100's limits: 228 KiB of shared memory with 1 KiB per
#   program, 65,536 registers, 64 warps).
# - **Registers**: the accumulator (`block_q x BLOCK_D` fp32 numbers) and the tile of
#   scores (`block_q x block_kv`) are spread over the program's `32 x num_warps` threads,
#   at most 255 registers each. A kernel that needs more **spills** the rest to (much
#   slower) local memory.
#
# The table counts the accumulator and scores each thread holds, and the registers per
# thread the compiler reported in the sweep.

# %% nbgrader={"grade": false, "grade_id": "given_predict", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: block_tuning.PREDICT_SHAPE
# given: block_tuning.PREDICT_CONFIGS
# given: block_tuning.PREDICT_REGISTERS
# given: block_tuning.H100_SMEM_PER_SM
# given: block_tuning.SMEM_RESERVED_PER_PROGRAM
# given: block_tuning.H100_REGISTERS_PER_SM
# given: block_tuning.H100_WARPS_PER_SM
# given: block_tuning.H100_PROGRAMS_PER_SM
# given: block_tuning.programs_per_sm

# %% nbgrader={"grade": false, "grade_id": "table_predict", "locked": true, "schema_version": 3, "solution": false, "task": false}
D_p, causal_p, N_p = PREDICT_SHAPE
needs = {letter: smem_bytes(bq, bk, D_p, torch.float16, s)
         for letter, (bq, bk, w, s) in PREDICT_CONFIGS.items()}
print(f"D = {D_p}, N = {N_p}, {'causal' if causal_p else 'not causal'}, fp16, B = 1, H = 16\n")
print(f"{'':3}{'block_q x block_kv':>19}{'warps':>6}{'stages':>7}{'shared KiB':>11}"
      f"{'values/thread':>14}{'registers':>10}{'programs/SM':>12}{'K, V reads/head':>16}")
for letter, (bq, bk, w, s) in PREDICT_CONFIGS.items():
    held_values = (bq * D_p + bq * bk) // (32 * w)  # accumulator + scores, per thread
    limits = programs_per_sm(needs[letter], PREDICT_REGISTERS[letter], w)
    held = min(limits.values())
    capped = ", ".join(name for name, n in limits.items() if n == held)
    print(f"{letter}: {f'{bq} x {bk}':>18}{w:>6}{s:>7}{needs[letter] / 1024:>11.0f}{held_values:>14}"
          f"{PREDICT_REGISTERS[letter]:>10}{held:>12}{triton.cdiv(N_p, bq):>16}   (capped by {capped})")

# %% [markdown]
# ### 4. Your prediction (1 point each)
#
# **Which configuration ran fastest** on the H100? Set `fastest_answer` to its letter,
# `"a"` to `"d"` (the table's). It is graded against the sweep's measurement.

# %% nbgrader={"grade": false, "grade_id": "fastest", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: fastest_answer = "x"  (one letter)
# solution: block_tuning.fastest_answer

# %% nbgrader={"grade": true, "grade_id": "test_fastest", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(fastest_answer, name="fastest_answer")

# %% [markdown]
# **Why?** Set `why_answer` to one letter:
#
# - **a**: occupancy decides: `a`'s small tiles let the most programs share an SM (5),
#   and more programs in flight hide memory latency best.
# - **b**: `c` balances the three: each `K`/`V` tile it loads serves 128 query rows (half
#   the reads of `a`), two of its programs still share an SM, and its threads hold 64
#   values each. `b` reads `K` and `V` the fewest times, but its threads would hold 384
#   values in 255 registers (they spill); `d`'s four stages of 128-key tiles leave room
#   for one program per SM.
# - **c**: arithmetic intensity decides: `b`'s 256-row query blocks read `K` and `V` the
#   fewest times (64 times per head), so they move the fewest bytes per flop.
# - **d**: the pipeline decides: `d`'s four stages keep the most loads in flight and hide
#   the most latency.

# %% nbgrader={"grade": false, "grade_id": "why", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Write your answer as: why_answer = "x"  (one letter)
# solution: block_tuning.why_answer

# %% nbgrader={"grade": true, "grade_id": "test_why", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
checks.check_choice(why_answer, name="why_answer")

# %% [markdown]
# ### What the H100 measured
#
# Answer the questions first: the chart draws your prediction in red. TFLOPS count the two
# products, `4·B·H·N²·D` operations (half when causal), per second; times are medians of
# `triton.testing.do_bench`. PyTorch's own attention ran in the same sweep:
# FlashAttention-2 (`sdpa-flash`) and cuDNN's (`sdpa-cudnn`).

# %% nbgrader={"grade": false, "grade_id": "plot_predict", "locked": true, "schema_version": 3, "solution": false, "task": false}
picked = str(fastest_answer).strip().lower()  # your prediction, drawn in red
measured = {letter: H100_SWEEP_TFLOPS[PREDICT_SHAPE][SWEEP_CONFIGS.index(config)]
            for letter, config in PREDICT_CONFIGS.items()}
flash2, cudnn = H100_SWEEP_SDPA[PREDICT_SHAPE]
fig, ax = plt.subplots(figsize=(7, 3.4))
labels = [f"{letter}: {bq}x{bk} w{w} s{s}" for letter, (bq, bk, w, s) in PREDICT_CONFIGS.items()]
bars = ax.bar(labels, list(measured.values()),
              color=["tab:red" if letter == picked else "tab:blue" for letter in measured])
ax.bar_label(bars, labels=[f"{t:.0f}" for t in measured.values()])
ax.axhline(flash2, color="tab:orange", linestyle="--", label=f"sdpa-flash {flash2:.0f}")
ax.axhline(cudnn, color="tab:green", linestyle="--", label=f"sdpa-cudnn {cudnn:.0f}")
ax.set(ylim=(0, 500), ylabel="TFLOPS", title="H100 (measured), fp16, D = 64, N = 16384, not causal")
ax.legend(fontsize=8, loc="lower right")
plt.show()

# %% [markdown]
# `c` wins, by 14% over `a`. The largest tile loses most: what does not fit in registers
# spills to local memory, which costs more than the `K`/`V` reads it saved (the sweep
# recorded the registers, not the spills: the compiler's report would show them). `d`
# moves no more bytes than `c`, but with one program per SM nothing else runs while it
# waits (the likely reason; the sweep cannot prove it). No single number predicts the
# winner, and the sweep shows how it moves with the shape.
#
# ### The whole sweep
#
# Each cell is the best of the six launch settings (warps x stages) of one block shape;
# the small text says which. Colours share one scale across the four panels.

# %% nbgrader={"grade": false, "grade_id": "plot_sweep", "locked": true, "schema_version": 3, "solution": false, "task": false}
blocks_q, blocks_k = (64, 128, 256), (32, 64, 128)
fig, axes = plt.subplots(1, 4, figsize=(16, 3.9), gridspec_kw={"wspace": 0.4})
for ax, (D, causal) in zip(axes, [(64, False), (64, True), (128, False), (128, True)]):
    speeds = H100_SWEEP_TFLOPS[(D, causal, 16384)]
    grid = torch.zeros(3, 3)
    for i, bq in enumerate(blocks_q):
        for j, bk in enumerate(blocks_k):
            tried = [(t or 0.0, w, s) for (q_, k_, w, s), t in zip(SWEEP_CONFIGS, speeds) if (q_, k_) == (bq, bk)]
            best, w, s = max(tried)
            grid[i, j] = best
            ax.text(j, i, f"{best:.0f}\nw{w} s{s}", ha="center", va="center", fontsize=8,
                    color="white" if best < 250 else "black")
    image = ax.imshow(grid.numpy(), cmap="viridis", vmin=0, vmax=500)
    ax.set_xticks(range(3), blocks_k)
    ax.set_yticks(range(3), blocks_q)
    flash2, cudnn = H100_SWEEP_SDPA[(D, causal, 16384)]
    ax.set(xlabel="BLOCK_K", ylabel="BLOCK_Q",
           title=f"D = {D}{', causal' if causal else ''}\nFA2 {flash2:.0f}, cuDNN {cudnn:.0f}")
fig.colorbar(image, ax=axes, fraction=0.015, label="TFLOPS (H100, N = 16384)")
plt.show()

print("the fastest configuration of each shape (BLOCK_Q, BLOCK_K, warps, stages):")
for (D, causal, N), speeds in H100_SWEEP_TFLOPS.items():
    best = max(range(len(speeds)), key=lambda i: speeds[i] or 0.0)
    print(f"  D = {D:3d}, N = {N:5d}, {'causal' if causal else 'full  '}: {SWEEP_CONFIGS[best]} "
          f"{speeds[best]:.0f} TFLOPS")

# %% [markdown]
# The winner changes with the head dim, the length and causality: at `D = 128` blocks of
# 64 x 64 win up to `N = 4096` and 256 x 64 at `N = 16384`; 128-key tiles rarely win. That
# is why an autotuner times its configurations **per shape** (its `key`: the lengths, the
# head dim, causal) and keeps the winner for the next call with the same key.
#
# On a GPU, the next cell times the four configurations now, with
# `triton.testing.do_bench`, and lets `triton.autotune` choose among those that your
# `prune_configs` keeps (`N = 4096`, so that it runs in seconds). On a CPU there is nothing
# to time: the figures above are the H100's.

# %% nbgrader={"grade": false, "grade_id": "given_kernel", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: flash_forward.LOG2E
# given: flash_forward.LN2
# given: flash_forward.flash_grid
# given: flash_forward.flash_attention_kernel

# %% nbgrader={"grade": false, "grade_id": "live_sweep", "locked": true, "schema_version": 3, "solution": false, "task": false}
if course.INTERPRET:
    print("No GPU here: the sweep above is the H100's. On a CUDA GPU this cell times the four "
          "configurations and autotunes among them.")
else:
    D_l, N_l, H_l = 64, 4096, 16
    B_l = 16384 // N_l
    q_l, k_l, v_l = (torch.randn(B_l, H_l, N_l, D_l, device="cuda", dtype=torch.float16) for _ in range(3))
    o_l = torch.empty_like(q_l)
    lse_l = torch.empty(B_l, H_l, N_l, device="cuda", dtype=torch.float32)
    args_l = (q_l, k_l, v_l, o_l, lse_l, *q_l.stride(), *k_l.stride(), *v_l.stride(), *o_l.stride(),
              H_l, N_l, N_l, LOG2E / math.sqrt(D_l))
    fixed_l = dict(GROUP=1, HEAD_DIM=D_l, BLOCK_D=D_l, CAUSAL=False, DOT_PRECISION="tf32")
    flops_l = 4 * B_l * H_l * N_l ** 2 * D_l
    kept_l = prune_configs(list(PREDICT_CONFIGS.values()), D_l, torch.float16)
    print(f"{torch.cuda.get_device_name()}, fp16, D = {D_l}, N = {N_l}, B = {B_l}, H = {H_l}")
    for letter, (bq, bk, w, s) in PREDICT_CONFIGS.items():
        if (bq, bk, w, s) not in kept_l:
            print(f"  {letter}: pruned, does not fit in this GPU's {smem_limit():,} bytes")
            continue
        ms = triton.testing.do_bench(lambda: flash_attention_kernel[flash_grid(N_l, B_l, H_l, bq)](
            *args_l, **fixed_l, BLOCK_Q=bq, BLOCK_K=bk, num_warps=w, num_stages=s))
        print(f"  {letter}: {bq} x {bk}, {w} warps, {s} stages: {flops_l / ms / 1e9:.0f} TFLOPS")

    def prune_for_autotune(configs, named_args, **kwargs):
        by_tuple = {(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages): c for c in configs}
        return [by_tuple[t] for t in prune_configs(list(by_tuple), D_l, torch.float16)]

    tuned_l = triton.autotune(
        configs=[triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=w, num_stages=s)
                 for bq, bk, w, s in PREDICT_CONFIGS.values()],
        key=["N_Q", "N_K"], prune_configs_by={"early_config_prune": prune_for_autotune},
    )(flash_attention_kernel)
    tuned_l[lambda meta: flash_grid(N_l, B_l, H_l, meta["BLOCK_Q"])](*args_l, **fixed_l)
    print("triton.autotune chose:", tuned_l.best_config)

# %% [markdown]
# ## Bytes, flops and the roofline
#
# A kernel is held back by the slower of two things: doing its flops, or moving its bytes
# between DRAM and the chip. The **roofline** draws both as ceilings over the **arithmetic
# intensity** `I` = flops / bytes moved: the attainable speed is
# `min(peak flops, bandwidth x I)`. For an H100 SXM (the course's "H100 80GB HBM3"),
# NVIDIA's datasheet gives **989 TFLOPS** of dense fp16/bf16 tensor-core work (its
# 1,979 TFLOPS figure is with 2:4 sparsity, twice the dense one) and **3.35 TB/s** of HBM3
# bandwidth. Below `I = 989 / 3.35 ≈ 295` flops per byte a kernel is memory-bound on it.
# (Measured on the course's H100, cuBLAS's large fp16 matrix products reach ~790 TFLOPS:
# the datasheet's peak is a ceiling no kernel reaches.)
#
# The bytes come from module 04's traffic model, given below: `flash_dram_accesses(N, d,
# M)` counts the elements one head moves when a program's SRAM holds `M` elements and its
# query block is `b = M // (4 d)` rows. Module 05's kernel chooses `block_q` itself, so its
# count is `flash_dram_accesses(N, D, 4 * D * block_q)`: `Q` and `O` once, all of `K` and
# `V` for each of the `ceil(N / block_q)` query blocks.

# %% nbgrader={"grade": false, "grade_id": "given_traffic", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: naive_attention.flash_dram_accesses
# given: block_tuning.H100_PEAK_TFLOPS
# given: block_tuning.H100_HBM_TB_PER_S

# %% [markdown]
# ### 5. The bytes the kernel moves (2 points)
#
# Write `kernel_dram_bytes(B, H, N, D, block_q, dtype)`: the bytes module 05's kernel reads
# and writes in DRAM for `B x H` heads of `N` queries and `N` keys, not causal, by that
# model: module 04's count of elements for blocks of `block_q` rows, times the bytes of one
# element of `dtype`, plus the log-sum-exp the kernel also writes (one fp32 number, 4
# bytes, per query row), for each of the `B x H` heads. Count the real head dim `D`, not
# `BLOCK_D` (masked lanes are not read). Return an int. The tests try fp16, bf16 and fp32,
# lengths that are not multiples of the block (a ragged last query block reads all of `K`
# and `V` too), and single blocks.

# %% nbgrader={"grade": false, "grade_id": "kernel_dram_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
# solution: block_tuning.kernel_dram_bytes

# %% nbgrader={"grade": true, "grade_id": "test_kernel_dram_bytes", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
checks.check_kernel_dram_bytes(kernel_dram_bytes)

# %% [markdown]
# Every configuration of the sweep at `N = 16384`, not causal, placed by its intensity
# under your model and its measured speed. The dotted verticals are the intensity the kernel
# would have if `K` and `V` came from DRAM only once (module 04's least possible traffic,
# `4·N·D` elements per head).

# %% nbgrader={"grade": false, "grade_id": "plot_roofline", "locked": true, "schema_version": 3, "solution": false, "task": false}
N_r, H_r = 16384, 16
points = {}
for D in (64, 128):
    flops = 4 * H_r * N_r ** 2 * D
    for (bq, bk, w, s), t in zip(SWEEP_CONFIGS, H100_SWEEP_TFLOPS[(D, False, N_r)]):
        if t is not None:
            intensity = flops / kernel_dram_bytes(1, H_r, N_r, D, bq, torch.float16)
            points.setdefault((D, bq), []).append((intensity, t))
fig, ax = plt.subplots(figsize=(8, 4.8))
ridge = H100_PEAK_TFLOPS / H100_HBM_TB_PER_S  # flops per byte where the two roofs meet
xs = sorted([2 ** (i / 4) for i in range(16, 57)] + [ridge])
ax.plot(xs, [min(H100_PEAK_TFLOPS, H100_HBM_TB_PER_S * x) for x in xs], color="black",
        label=f"roofline: {H100_PEAK_TFLOPS:.0f} TFLOPS, {H100_HBM_TB_PER_S} TB/s")
ax.axhline(790, color="gray", linestyle="-.", linewidth=1, label="cuBLAS fp16 GEMM, measured (~790)")
for (D, bq), pts in sorted(points.items()):
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="o" if D == 64 else "s",
               color={64: "tab:blue", 128: "tab:orange", 256: "tab:green"}[bq], alpha=0.7,
               label=f"D = {D}, BLOCK_Q = {bq}")
for D in (64, 128):
    once = 4 * H_r * N_r ** 2 * D / (H_r * (4 * N_r * D * 2 + 4 * N_r))
    ax.axvline(once, color="gray", linestyle=":", linewidth=1,
               label="K and V read from DRAM once" if D == 64 else None)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set(xlabel="arithmetic intensity under the model (flops per byte)", ylabel="TFLOPS (measured)",
       title="module 05's kernel on the H100, fp16, N = 16384, not causal", ylim=(50, 1500))
ax.grid(alpha=0.3, which="both")
ax.legend(fontsize=7, loc="lower right")
plt.show()

# %% [markdown]
# Read it honestly:
#
# - The model's intensity is about `BLOCK_Q` flops per byte (each `K`/`V` byte read feeds
#   `BLOCK_Q` rows), whatever `D`. By the model, blocks of 64 rows are memory-bound, capped
#   at `3.35 x 64 ≈ 214` TFLOPS. Yet they measured up to 410: **above the roof** (and some
#   blocks of 128 rows beat their roof of ~425 too). The model overcounts. It charges DRAM
#   for every re-read of `K` and `V`, but one head's `K` and `V` (4 MiB at `D = 64`) stay
#   in the H100's 50 MB L2 cache while the programs of that head run side by side (module
#   05: programs start in the order of axis 0, the query blocks), so most re-reads never
#   reach DRAM. The real traffic lies between the model's and the dotted lines'.
# - Only a profiler can say where: Nsight Compute counts the bytes that really cross
#   (`ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum python your_script.py`, on a
#   GPU where profiling is allowed). The course's H100 runs did not profile, so the bytes
#   here are computed, not measured.
# - Every point is far below the compute roof. The kernel computes one exponential per
#   score, on special-function units about 100 times slower than the tensor cores'
#   multiply-adds: at `D = 64` the course's perf log (`solutions/PERF.md`) estimates 1.1 ms
#   of exponentials against 1.4 ms of matrix products at this shape. Overlapping the two,
#   as cuDNN's kernel does, is what moves a kernel toward the roof; block sizes alone do
#   not.

# %% [markdown]
# ## From the teaching kernel to the tuned one
#
# The course ships a tuned version of module 05's kernel (`solutions/flash_tuned.py`); its
# perf log (`solutions/PERF.md`) records each step and what it measured on the H100. In
# order:
#
# 1. **Blocks per shape.** `triton.autotune` over a short list per head-dim class
#    (three or four configurations each, from sweeps like this module's), pruned by
#    shared memory with this module's `prune_configs`, timed once per key (lengths,
#    head dim, causal). The lengths are not compile-time constants
#    (`do_not_specialize`), so one compile serves every length: the GPU tests went from
#    a 200 s time-out to 65.6 s.
# 2. **No masks where none are needed.** The key loop runs in two parts: the blocks every
#    query row of the program may see, with plain loads and no comparisons, then only the
#    diagonal block (causal) and the ragged last block with masks. Causal, it needs
#    `BLOCK_Q` to be a multiple of `BLOCK_K`, so that the diagonal starts on a key-block
#    boundary: a constraint of the same kind as those at the top of this notebook. The
#    masked part always spans `BLOCK_Q` keys (causal) or `BLOCK_K` (the ragged block), so
#    the compiler knows its step count, and one step compiles to no loop at all. Where
#    nothing is causal and the keys fill at least one block, the kernel also tells the
#    compiler that the first part runs at least once (`tl.assume`). Without that, at some FP8 tiles every tensor-core product
#    waited for the one before: 7% slower at `D = 128`.
# 3. **Longest programs first (causal).** Query blocks run in reverse order, so the GPU's
#    last wave is made of short programs instead of the longest ones. (Measured later on
#    the H200 at `N = 1024`, the opposite order ran as fast, within 1%.)
# 4. **Loads: measured, mostly kept simple.** Plain pointers take any strides and stay the
#    default. Tensor descriptors (TMA) made on the device cost 15-25% at `N = 1024` (each
#    program sets its own up before its first load). One case wants TMA anyway: with 4
#    warps, a 128 x 128 `Q` tile loaded into registers takes 64 of them a thread, next to
#    the accumulator's 128. Copied by TMA, `Q` stays in shared memory, where the products
#    read it. At `D = 128` on the H200 (128 x 64 tiles, 4 warps, `N` = 1024 and 4096,
#    causal or not): 248-386 TFLOPS with `Q` in registers, 305-487 through TMA, 295-490
#    for the best 8-warp tiles. Made on the host instead (one per tensor and launch, over
#    `[B, H, N, D]`, so each head keeps its own bounds), the same tiles ran 1-10% faster on
#    the H100 (446 against 416 TFLOPS at `N = 1024`), and 64 x 64 tiles at `D = 64` 22%.
#    Such configurations compete in the autotuner where the tensors are aligned for TMA.
# 5. **Host time.** At short sequences the GPU runs a step's kernels about as fast as
#    Python launches them: a training step at `D = 64`, `N = 1024` (16 sequences of 16
#    heads) is ~0.6 ms of GPU work and took ~0.9 ms of host time on the H100 machine. So
#    after the first call of a shape the tuned kernels skip the autotuner's dispatch (the
#    chosen configuration is remembered) and Triton's own launch path too: the first
#    launch returns the compiled kernel, and later launches with the same kinds of
#    arguments call it directly. Inside a training step that saved 150-250 µs. Then
#    the wrappers' own Python was the largest part left (input checks, choices, argument
#    lists): a call whose tensors have the same shapes, strides, dtype and alignment as
#    an earlier call's makes the same launches with other tensors. So the wrappers record
#    a call's launches once and repeat them for the next call of its kind (a *launch
#    plan*, as cuDNN and cuFFT keep plans), skipping the rest. The step's host time went
#    from 0.58-0.75 ms to 0.42-0.53 ms, under its GPU time, but a slow moment of the host
#    still put it behind cuDNN's in some repetitions. Last, a plan calls each kernel's
#    compiled launcher (C code) itself: Triton's Python layers around it took 6-14 µs of
#    a launch's 13-21, most of it encoding every TMA descriptor again at every launch,
#    which a plan now does once per tensor address. That took the step to ~0.39 ms
#    (H200), level with cuDNN's, and in 72 repetitions of 72 the eager step ran at
#    0.86-1.19x cuDNN's. What is left on the host is mostly the autograd machinery's.
# 6. **Head dims that are not powers of two.** `tl.arange` needs power-of-two lengths, so
#    module 05's kernel computes `D = 160` as 256 columns (60% more products, and a 256-wide
#    accumulator that forces small blocks). The tuned kernels cut such a head dim into two
#    power-of-two column blocks (160 = 128 + 32): two `Q` tiles whose products add into one
#    score tile, two accumulators sharing `P`; shared memory is this module's `smem_bytes`
#    summed over the two. Forward: 1.32-1.40x the padded kernel at `D = 160`, 1.12-1.25x at
#    192 (H100); forward and backward together: 1.74-2.09x at 160, 1.55-1.90x at 192 (H200).
# 7. **A fair choice.** `triton.autotune` times each configuration once, in list order, and
#    keeps the fastest. At `D = 128`, `N = 4096` (H100) it kept the first one, 484 TFLOPS,
#    over one that ran at 540 when forced: whatever runs first reads fast (timed in rounds,
#    every configuration's first reading was its highest, up to 15% above its later ones).
#    Shortening each timing to 10 + 40 ms, to afford several rounds, flattered another
#    tile: level with the best at that length, ~8% behind it over 25 + 80 ms. The tuned
#    kernels now time every configuration in three rounds, each round starting one
#    configuration further along the list, for 25 + 80 ms each, and keep the best median,
#    so one lucky reading cannot win. Tuning takes ~3 s per key instead of ~1 s.
# 8. **Past Triton's scheduler.** What was left of cuDNN's lead was overlap: compute the
#    exponentials of key block `j` while the tensor cores run block `j - 1`'s `P V`
#    (FlashAttention-3's schedule). Triton's compiler waits for each product right after
#    issuing it, so on Hopper the tuned forward runs a second kernel at `D = 128`, written
#    in Gluon, Triton's lower-level language, where shared memory, barriers, TMA copies
#    and which warps do what are written by hand. One warp streams `K` and `V` blocks into
#    two shared-memory buffers (three at `D = 64`); two warpgroups of 64 query rows each issue block `j`'s
#    scores and block `j - 1`'s `P V` together, wait for the scores only, and run the
#    softmax under `P V`. Step 2 still holds (only the 128 x 128 diagonal block is
#    masked, and the first warpgroup, whose rows see only that block's first 64 keys,
#    computes only those: 3-6% at `N = 1024`). One more change: a persistent grid. At `N = 1024` each 128-row tile is
#    short, and its start (loading `Q`) and end (storing `O`) were exposed; now one program
#    per SM walks many tiles, loading the next tile's `Q`, `K` and `V` while it finishes
#    this one, and takes causal tiles in pairs (a head's longest with its shortest), so
#    every program gets the same work (step 3's aim). An order that balanced the work
#    even better, but spread each round of tiles over every head, ran up to 16% slower:
#    tiles running together no longer shared their `K` and `V` in L2. At `D = 128` the
#    Gluon kernel runs at 1.06-1.39x the Triton kernel, and 0.92-1.15x cuDNN (H100). At
#    `D = 64` (H200) it runs causal (1.02x the Triton kernel at `N = 1024`, 1.06-1.10x
#    beyond) and without a mask up to 2048 queries (1.01-1.06x; longer, the Triton kernel
#    read 1-2% faster). Other head dims, strided inputs and other GPUs keep the Triton
#    kernel.
# 9. **A register cap.** Occupancy counts registers too. At `D = 64` the 64 x 64 tiles
#    with 4 warps took 114-120 registers a thread, so four programs filled an SM's 65,536,
#    however much shared memory was left. `triton.Config(..., maxnreg=96)` tells the
#    compiler to use at most 96. That fit without spilling, and five programs share an SM
#    where shared memory has room for them (fp16 with two stages, 40 KB a program; without
#    the cap, two stages gained nothing). Causal at `N = 1024` (H200), the forward ran 1%
#    faster in fp16 and 2% in FP8. At 88 the compiler spilled, and it ran 3x slower. So a
#    cap is one more entry on the autotuner's list, not a rule.
#
# Tried without gain: Triton 3.6's warp specialization with plain pointer loads (402 against
# 396 TFLOPS; with tensor descriptors it gained 4% at `N = 4096` and lost 4% at `N = 1024`,
# so those configurations only compete in the autotuner), 256-row query blocks (register
# pressure), two stages (10-20% slower).
#
# The figures (fp16, `N = 16384`, TFLOPS): module 05's kernel with its default blocks
# (128 x 64), the same kernel at the best configuration of this module's sweep, the tuned
# kernel (before step 8), and PyTorch's backends, from the course's benchmark
# (`python -m grader bench`; the sweep is a separate run, so equal kernels differ by a few
# percent between the two).

# %% nbgrader={"grade": false, "grade_id": "given_bench", "locked": true, "schema_version": 3, "solution": false, "task": false}
# given: flash_forward.H100_SEQ_LENS
# given: flash_forward.H100_FORWARD_TFLOPS

# %% nbgrader={"grade": false, "grade_id": "table_tuned", "locked": true, "schema_version": 3, "solution": false, "task": false}
last = H100_SEQ_LENS.index(16384)
print(f"{'D':>4} {'causal':>7} | {'teaching':>9} | {'best of the sweep':>30} | {'tuned':>6} | "
      f"{'FA2':>6} {'cuDNN':>6}")
for (D, causal), impls in H100_FORWARD_TFLOPS.items():
    speeds = H100_SWEEP_TFLOPS[(D, causal, 16384)]
    best = max(range(len(speeds)), key=lambda i: speeds[i] or 0.0)
    at = f"{speeds[best]:.1f} at {SWEEP_CONFIGS[best]}"
    print(f"{D:>4} {str(causal):>7} | {impls['teaching'][last]:>9.1f} | {at:>30} | "
          f"{impls['tuned'][last]:>6.1f} | {impls['sdpa-flash'][last]:>6.1f} {impls['sdpa-cudnn'][last]:>6.1f}")

# %% [markdown]
# Choosing blocks alone (the sweep's best against the default) gains up to 18% at
# `D = 128`, and brings the teaching kernel level with the tuned one when nothing is
# masked. Causal attention needs the other steps too: at `D = 64` the tuned kernel runs at
# 401 TFLOPS against the teaching kernel's best 284, because it masks only the diagonal
# blocks and runs its longest programs first. Tuning is not a win at every shape either: at
# `D = 64`, not causal, the tuned kernel measured below the teaching one in that run (the
# perf log puts run-to-run noise at this size near 10%).
#
# ## What you built
#
# - `check_block_config`: the constraints between the blocks of a training step as rules
#   applied in order (shrink to the sequence, sub-blocks divide blocks, pad to the forward
#   blocks), each change logged with its reason.
# - `smem_bytes`: one program's shared memory, `(block_q + 2 · stages · block_kv) · BLOCK_D`
#   elements; exact for every configuration Triton 3.6 compiled for the H100, blind to
#   registers.
# - `prune_configs`: what an autotuner must drop before compiling; the course's tuned
#   kernel prunes with it.
# - A prediction checked against a measurement: intensity, occupancy and registers pull in
#   different directions, and the winner changes with the shape, hence autotuning per key.
# - `kernel_dram_bytes`: module 04's model for a kernel's own block size; on a roofline it
#   shows the model's limits (the L2 cache serves most re-reads) and where the time really
#   goes (not DRAM: the exponentials and how they overlap with the products).
