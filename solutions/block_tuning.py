"""Module 07: block sizes and tuning.

Which block sizes a FlashAttention step may use (`check_block_config`: the constraints of
the block-size note, with one log line per adjustment), which fit in shared memory
(`smem_bytes`, `prune_configs`: the model `solutions/flash_tuned.py`'s autotuner prunes
with), which are fast (the H100 sweep of module 05's kernel, `python -m
solutions.block_sweep`), and what bytes a kernel moves (`kernel_dram_bytes`, module 04's
traffic model for a kernel's own block size).
"""
import csv
import pathlib

import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton

from solutions.naive_attention import flash_dram_accesses

# ---------------------------------------------------------------------------------------
# The blocks of one attention step (forward and backward) and their constraints.

# The blocks a configuration names: the forward's query and key/value blocks, the
# sub-block the forward computes a KV block in, and the blocks of the two backward
# kernels (dK/dV and dQ).
BLOCK_KEYS = ("block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv",
              "block_q_dq", "block_kv_dq")
# Each sub-block and the block it must divide, in the order the rules check them.
PARENTS = {"block_kv_compute": "block_kv", "block_q_dkv": "block_q", "block_kv_dkv": "block_kv",
           "block_q_dq": "block_q", "block_kv_dq": "block_kv"}
MIN_BLOCK = 16  # tl.dot's smallest tile side: every block is a multiple of it


def check_block_inputs(config, q_len, kv_len):
    """Raise ValueError (TypeError for a non-dict) unless `config` names exactly the
    blocks of BLOCK_KEYS, each a positive multiple of MIN_BLOCK, and the two sequence
    lengths are positive whole numbers."""
    if not isinstance(config, dict):
        raise TypeError(f"blocks must be a dict of block sizes, got {type(config).__name__}")
    missing = [key for key in BLOCK_KEYS if key not in config]
    unknown = [key for key in config if key not in BLOCK_KEYS]
    if missing or unknown:
        raise ValueError(f"blocks must name exactly {', '.join(BLOCK_KEYS)}"
                         + (f"; missing {', '.join(missing)}" if missing else "")
                         + (f"; unknown {', '.join(map(str, unknown))}" if unknown else ""))
    for key, value in list(config.items()) + [("q_len", q_len), ("kv_len", kv_len)]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive whole number, got {value!r}")
        if key in BLOCK_KEYS and value % MIN_BLOCK:
            raise ValueError(f"{key} = {value} is not a multiple of {MIN_BLOCK}")


def check_block_config(blocks, q_len, kv_len):
    """Adjust a block configuration to sequences of q_len queries and kv_len keys.

    Returns (adjusted, log): adjusted holds the seven blocks and the padded lengths
    "q_len" and "kv_len"; log has one line per change, "key: old -> new: why".
    """
    check_block_inputs(blocks, q_len, kv_len)
    adjusted = dict(blocks, q_len=q_len, kv_len=kv_len)
    log = []
    # Rule 1: a forward block longer than its sequence (rounded up to 16) computes padding.
    q_room = triton.cdiv(q_len, MIN_BLOCK) * MIN_BLOCK
    if adjusted["block_q"] > q_room:
        log.append(f"block_q: {adjusted['block_q']} -> {q_room}: "
                   f"longer than the sequence (q_len = {q_len})")
        adjusted["block_q"] = q_room
    kv_room = triton.cdiv(kv_len, MIN_BLOCK) * MIN_BLOCK
    if adjusted["block_kv"] > kv_room:
        log.append(f"block_kv: {adjusted['block_kv']} -> {kv_room}: "
                   f"short KV sequence (kv_len = {kv_len})")
        adjusted["block_kv"] = kv_room
    # Rule 2: each sub-block divides its (possibly shrunk) block; else the largest
    # multiple of 16 that divides the block and is no larger than the one asked for.
    for sub, parent in PARENTS.items():
        block, wanted = adjusted[parent], adjusted[sub]
        if block % wanted:
            size = min(wanted, block)
            while block % size:
                size -= MIN_BLOCK
            log.append(f"{sub}: {wanted} -> {size}: must divide {parent} = {block}")
            adjusted[sub] = size
    # Rule 3: each sequence padded up to a multiple of its forward block.
    for length, block in (("q_len", "block_q"), ("kv_len", "block_kv")):
        padded = triton.cdiv(adjusted[length], adjusted[block]) * adjusted[block]
        if padded != adjusted[length]:
            log.append(f"{length}: {adjusted[length]} -> {padded}: "
                       f"padded to a multiple of {block} = {adjusted[block]}")
            adjusted[length] = padded
    return adjusted, log


# ---------------------------------------------------------------------------------------
# Shared memory: what a configuration needs, and which ones fit.

H100_SMEM_PER_BLOCK = 232448  # bytes one program may use on an H100 (227 KiB, opt-in)


def smem_limit():
    """Shared memory one program may use: this GPU's opt-in limit per block (what
    Triton's compiler checks against), or an H100's on a CPU."""
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        return torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    return H100_SMEM_PER_BLOCK


def smem_bytes(block_q, block_kv, head_dim, dtype, stages):
    """Shared memory of one program of the FlashAttention forward: its Q tile, held for
    the whole loop, and a K and a V tile for each of the `stages` loads in flight; tiles
    are BLOCK_D = max(16, next power of two of head_dim) wide, elements of `dtype`."""
    if stages < 1:
        raise ValueError(f"stages = {stages}: a pipeline holds at least one stage")
    block_d = max(MIN_BLOCK, triton.next_power_of_2(head_dim))
    element = torch.empty((), dtype=dtype).element_size()
    return (block_q + 2 * stages * block_kv) * block_d * element


def prune_configs(configs, head_dim, dtype, limit=None):
    """The configurations (block_q, block_kv, num_warps, num_stages) whose shared memory
    fits in `limit` bytes (default: smem_limit()), in the order given."""
    if limit is None:
        limit = smem_limit()
    return [config for config in configs
            if smem_bytes(config[0], config[1], head_dim, dtype, config[3]) <= limit]


# ---------------------------------------------------------------------------------------
# The bytes a kernel moves, against its flops.

def kernel_dram_bytes(B, H, N, D, block_q, dtype):
    """Bytes module 05's kernel reads and writes in DRAM for B x H heads of N queries
    and keys (not causal), by module 04's model with blocks of block_q query rows:
    Q and O once, all of K and V for every query block, and the fp32 LSE of every row."""
    element = torch.empty((), dtype=dtype).element_size()
    per_head = flash_dram_accesses(N, D, 4 * D * block_q) * element + 4 * N
    return B * H * per_head


# ---------------------------------------------------------------------------------------
# The H100 and the sweep of module 05's kernel on it.

# NVIDIA H100 SXM5 80GB (the course's machine): its datasheet's dense fp16/bf16 tensor-core
# peak (1,979 TFLOPS is the figure with 2:4 sparsity; dense is half) and HBM3 bandwidth.
H100_PEAK_TFLOPS = 989.4
H100_HBM_TB_PER_S = 3.35
# Per SM: 228 KiB of shared memory, of which the driver keeps 1 KiB per resident program
# (so one program may opt in to 227 KiB); 65,536 32-bit registers, handed out to a warp in
# units of 256 (8 per thread); at most 64 warps and 32 programs.
H100_SMEM_PER_SM = 233472
SMEM_RESERVED_PER_PROGRAM = 1024
H100_REGISTERS_PER_SM = 65536
H100_WARPS_PER_SM = 64
H100_PROGRAMS_PER_SM = 32


def programs_per_sm(shared_bytes, registers, num_warps):
    """How many programs of a kernel one H100 SM can hold at once (its occupancy), given
    the shared bytes and registers per thread the compiler reports, and each limit's
    share: {"shared memory": n, "registers": n, "warps": n, "programs": n}."""
    per_warp = -(-registers // 8) * 8 * 32
    return {"shared memory": H100_SMEM_PER_SM // (shared_bytes + SMEM_RESERVED_PER_PROGRAM),
            "registers": H100_REGISTERS_PER_SM // (per_warp * num_warps),
            "warps": H100_WARPS_PER_SM // num_warps,
            "programs": H100_PROGRAMS_PER_SM}


# The block-size sweep of module 05's kernel (`python -m solutions.block_sweep`, H100 80GB
# HBM3, torch 2.11.0+cu130, triton 3.6.0; solutions/perf/block_sweep.csv): fp16, H = 16,
# B * N = 16384, TFLOPS = 4 B H N^2 D / time (half when causal), do_bench medians.
# Every (BLOCK_Q, BLOCK_K, num_warps, num_stages) it tried, in this order:
SWEEP_CONFIGS = tuple((bq, bk, w, s) for bq in (64, 128, 256) for bk in (32, 64, 128)
                      for w in (4, 8) for s in (2, 3, 4))
# Head dim D: shared memory of each config as the compiler gave it (the bytes it asked
# for, where it refused: more than 232,448).
H100_SWEEP_SHARED = {
    64: (24576, 32768, 40960, 24576, 32768, 40960, 40960, 57344, 73728,
         40960, 57344, 73728, 73728, 106496, 139264, 73728, 106496, 139264,
         32768, 40960, 49152, 32768, 40960, 49152, 49152, 65536, 81920,
         49152, 65536, 81920, 81920, 114688, 147456, 81920, 114688, 147456,
         49152, 57344, 65536, 49152, 57344, 65536, 65536, 81920, 98304,
         65536, 81920, 98304, 98304, 131072, 163840, 98304, 131072, 163840),
    128: (49152, 65536, 81920, 49152, 65536, 81920, 81920, 114688, 147456,
          81920, 114688, 147456, 147456, 212992, 278528, 147456, 212992, 278528,
          65536, 81920, 98304, 65536, 81920, 98304, 98304, 131072, 163840,
          98304, 131072, 163840, 163840, 229376, 294912, 163840, 229376, 294912,
          98304, 114688, 131072, 98304, 114688, 131072, 131072, 163840, 196608,
          131072, 163840, 196608, 196608, 262144, 327680, 196608, 262144, 327680),
}
# (D, causal, N): TFLOPS of each config, None where the compiler refused it (out of
# shared memory).
H100_SWEEP_TFLOPS = {
    (64, False, 1024): (
        274.5, 312.0, 310.5, 149.8, 166.8, 166.5, 326.5, 347.0, 324.7,
        162.4, 185.9, 184.7, 269.5, 308.2, 184.9, 128.1, 152.0, 153.5,
        277.8, 297.7, 311.7, 232.0, 293.4, 294.7, 294.5, 334.0, 336.9,
        302.0, 344.1, 345.4, 274.8, 298.4, 198.2, 219.8, 269.3, 265.7,
        239.2, 252.0, 251.9, 184.5, 246.6, 250.5, 248.3, 249.9, 251.6,
        232.5, 276.3, 275.4, 130.6, 110.9, 111.8, 257.7, 278.5, 275.7),
    (64, False, 4096): (
        296.0, 330.0, 319.8, 159.2, 177.6, 177.1, 361.8, 355.9, 342.2,
        177.3, 198.8, 202.3, 312.6, 342.8, 225.6, 144.1, 171.0, 171.8,
        314.5, 330.7, 332.5, 256.6, 324.4, 318.3, 331.7, 377.7, 364.4,
        329.7, 376.9, 367.2, 306.5, 334.9, 222.8, 262.6, 311.8, 306.9,
        264.5, 283.2, 283.8, 204.2, 279.1, 282.5, 278.8, 284.2, 285.7,
        263.5, 325.9, 323.7, 147.0, 121.4, 121.6, 295.7, 325.4, 318.2),
    (64, False, 16384): (
        305.6, 327.7, 325.3, 170.8, 183.0, 182.4, 346.6, 347.7, 339.5,
        170.1, 199.7, 195.4, 330.1, 341.0, 269.7, 154.4, 176.8, 176.4,
        334.5, 343.6, 328.7, 271.0, 317.0, 317.5, 350.8, 373.3, 374.4,
        353.0, 373.1, 371.3, 326.7, 361.7, 242.7, 289.7, 324.8, 321.4,
        279.8, 292.3, 290.7, 240.6, 290.3, 291.1, 292.2, 300.3, 296.1,
        292.5, 336.0, 334.4, 145.5, 125.4, 125.1, 318.0, 335.0, 333.9),
    (64, True, 1024): (
        203.2, 211.1, 210.2, 112.1, 121.5, 120.0, 202.9, 220.8, 219.0,
        121.2, 126.3, 125.4, 189.3, 204.8, 146.6, 92.2, 107.1, 106.9,
        186.5, 202.6, 203.8, 156.6, 185.9, 183.3, 184.3, 206.8, 207.6,
        196.8, 209.0, 209.3, 162.4, 160.9, 108.3, 149.4, 124.9, 171.0,
        124.7, 101.6, 104.0, 113.6, 144.0, 147.3, 91.9, 94.1, 94.2,
        136.2, 157.5, 156.9, 40.8, 48.7, 49.0, 139.7, 141.5, 140.3),
    (64, True, 4096): (
        230.4, 241.6, 247.3, 127.5, 135.8, 135.0, 256.8, 265.5, 264.2,
        142.7, 143.5, 143.5, 254.0, 263.7, 196.1, 119.0, 134.0, 135.4,
        233.3, 242.6, 245.4, 199.5, 223.5, 221.3, 236.3, 257.5, 264.9,
        245.2, 258.5, 260.6, 202.1, 198.9, 136.7, 202.0, 222.4, 218.9,
        160.9, 132.3, 135.6, 149.2, 181.3, 184.4, 113.9, 117.5, 117.0,
        182.0, 204.9, 203.3, 50.2, 60.6, 60.5, 180.5, 184.4, 178.6),
    (64, True, 16384): (
        235.8, 249.8, 252.7, 132.4, 142.9, 142.5, 275.2, 264.2, 272.1,
        149.3, 151.9, 150.3, 283.6, 272.9, 216.4, 131.3, 147.4, 147.1,
        251.6, 260.8, 248.1, 222.9, 237.1, 231.7, 262.4, 280.0, 280.4,
        257.4, 272.9, 275.0, 214.6, 213.6, 148.1, 222.7, 242.1, 241.7,
        177.4, 149.7, 149.5, 182.8, 199.2, 201.3, 123.2, 127.4, 127.5,
        214.5, 225.7, 223.9, 53.4, 64.4, 64.1, 195.6, 200.1, 198.6),
    (128, False, 1024): (
        373.5, 385.1, 352.7, 179.4, 207.5, 204.8, 355.3, 426.5, 319.8,
        162.7, 205.0, 202.3, 272.9, 340.6, None, 207.8, 230.0, None,
        338.9, 370.8, 379.5, 352.5, 392.9, 388.6, 384.6, 299.3, 297.7,
        285.7, 373.0, 373.4, 233.3, 254.2, None, 327.1, 365.7, None,
        127.7, 128.1, 94.2, 283.4, 374.3, 377.5, 119.5, 121.4, 120.8,
        338.7, 392.0, 387.4, 110.0, None, None, 344.9, None, None),
    (128, False, 4096): (
        367.6, 383.4, 359.7, 193.7, 218.5, 217.0, 384.8, 462.6, 348.5,
        191.6, 223.9, 186.7, 312.9, 384.0, None, 222.4, 246.8, None,
        367.7, 390.3, 384.4, 373.7, 413.1, 408.7, 419.2, 335.6, 356.0,
        372.1, 434.8, 379.2, 261.7, 296.5, None, 403.3, 444.4, None,
        136.8, 128.9, 95.8, 327.3, 414.9, 418.9, 127.2, 131.8, 131.9,
        406.9, 447.6, 442.9, 123.4, None, None, 408.1, None, None),
    (128, False, 16384): (
        409.8, 399.6, 383.9, 201.3, 209.5, 202.0, 357.4, 406.0, 361.1,
        198.2, 228.3, 225.4, 351.6, 383.8, None, 235.0, 242.7, None,
        366.7, 368.4, 378.3, 408.0, 418.3, 416.7, 436.9, 370.2, 367.3,
        394.5, 412.7, 415.3, 281.7, 308.0, None, 412.7, 431.8, None,
        137.6, 138.3, 99.9, 334.0, 411.9, 440.9, 133.5, 136.4, 135.6,
        419.1, 485.1, 471.2, 125.5, None, None, 424.2, None, None),
    (128, True, 1024): (
        280.6, 286.4, 263.7, 140.5, 161.7, 160.3, 261.0, 302.8, 228.4,
        123.2, 153.9, 152.1, 196.9, 232.5, None, 153.7, 162.7, None,
        227.0, 256.3, 251.4, 236.6, 261.6, 200.6, 237.9, 177.3, 171.6,
        205.7, 253.2, 251.8, 101.5, 115.7, None, 218.5, 238.8, None,
        66.3, 67.3, 58.7, 174.4, 215.1, 216.3, 63.4, 64.6, 64.6,
        187.7, 207.9, 206.0, 29.9, None, None, 154.8, None, None),
    (128, True, 4096): (
        311.9, 320.6, 297.3, 158.1, 179.8, 178.7, 340.1, 299.6, 293.3,
        157.1, 184.4, 181.7, 276.4, 316.2, None, 196.5, 203.8, None,
        290.7, 312.4, 312.8, 300.5, 323.1, 250.3, 315.0, 225.9, 219.5,
        289.4, 334.6, 326.9, 127.2, 143.3, None, 296.3, 310.0, None,
        82.2, 83.9, 73.8, 237.4, 283.6, 278.4, 79.5, 81.4, 82.1,
        259.9, 277.2, 269.0, 37.4, None, None, 201.4, None, None),
    (128, True, 16384): (
        318.2, 341.5, 320.2, 170.8, 190.4, 187.1, 346.2, 381.2, 291.7,
        157.6, 192.3, 193.6, 305.8, 329.6, None, 208.9, 223.9, None,
        325.1, 339.3, 332.4, 326.7, 333.3, 263.6, 320.4, 246.7, 240.7,
        336.1, 357.7, 353.6, 138.8, 153.0, None, 325.5, 344.0, None,
        87.3, 89.3, 79.4, 284.5, 308.3, 309.9, 86.0, 88.1, 87.9,
        289.0, 300.8, 299.3, 40.7, None, None, 221.4, None, None),
}
# (D, causal, N): PyTorch's SDPA in the same run, (FlashAttention-2, cuDNN) TFLOPS.
H100_SWEEP_SDPA = {
    (64, False, 1024): (278.7, 422.1), (64, False, 4096): (303.0, 455.3),
    (64, False, 16384): (310.2, 458.5), (64, True, 1024): (204.2, 316.5),
    (64, True, 4096): (267.0, 399.3), (64, True, 16384): (284.9, 450.2),
    (128, False, 1024): (333.7, 562.2), (128, False, 4096): (357.2, 622.4),
    (128, False, 16384): (350.0, 589.7), (128, True, 1024): (246.5, 419.8),
    (128, True, 4096): (308.0, 542.8), (128, True, 16384): (328.6, 612.7),
}

# ---------------------------------------------------------------------------------------
# Predict, then measure: four configurations of the sweep, one shape.

PREDICT_SHAPE = (64, False, 16384)  # D, causal, N (B = 1, H = 16, fp16)
PREDICT_CONFIGS = {  # letter: (block_q, block_kv, num_warps, num_stages)
    "a": (64, 32, 4, 3), "b": (256, 128, 4, 2), "c": (128, 64, 8, 3), "d": (128, 128, 8, 4)}
PREDICT_REGISTERS = {"a": 83, "b": 255, "c": 125, "d": 170}  # per thread, from the compiler

# Which of PREDICT_CONFIGS ran fastest on the H100?
fastest_answer = "c"

# Why? (see the lesson for the options)
why_answer = "b"


# ---------------------------------------------------------------------------------------
# The sweep's CSV, for the hidden tests and the course's own tests.

SWEEP_CSV = pathlib.Path(__file__).with_name("perf") / "block_sweep.csv"


def sweep_rows():
    """The rows of solutions/perf/block_sweep.csv (dicts of strings)."""
    with open(SWEEP_CSV, newline="") as f:
        return list(csv.DictReader(f))


def measured_tflops(rows, D, causal, N, config):
    """TFLOPS of the teaching kernel with `config` at this shape in the CSV's rows,
    None where the compiler refused the config."""
    for row in rows:
        if (row["impl"] == "teaching" and int(row["D"]) == D and row["causal"] == str(causal)
                and int(row["N"]) == N and tuple(int(row[k]) for k in
                                                ("block_q", "block_k", "num_warps", "num_stages")) == config):
            return float(row["tflops"]) if row["status"] == "ok" else None
    raise KeyError(f"no sweep row for D={D}, causal={causal}, N={N}, {config}")


def measured_winner(rows=None):
    """The letter of PREDICT_CONFIGS that the sweep measured fastest at PREDICT_SHAPE."""
    rows = sweep_rows() if rows is None else rows
    speed = {letter: measured_tflops(rows, *PREDICT_SHAPE, config) or 0.0
             for letter, config in PREDICT_CONFIGS.items()}
    return max(speed, key=speed.get)
