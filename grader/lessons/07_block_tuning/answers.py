"""What module 07's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`)."""
import torch
import triton

# smem_bytes and kernel_dram_bytes are answers themselves, asked by these names.
from solutions.block_tuning import (MIN_BLOCK, PARENTS, check_block_config, kernel_dram_bytes,  # noqa: F401
                                    smem_bytes)
from solutions.naive_attention import flash_dram_accesses

CHECKS = ("check_block_config_rules", "check_smem_bytes", "check_prune_configs",
          "check_kernel_dram_bytes")
# No EXTRA: check_prune_configs asks the same answers on a CPU and on any GPU (its default
# limit only decides which of the recorded bytes fit).


def block_config(blocks, q_len, kv_len):
    """(adjusted, changes): the answer key's configuration, and each change of its log as
    (key, old, new, what the line's reason must name), in the log's order."""
    adjusted, log = check_block_config(dict(blocks), q_len, kv_len)
    # Rule 1 names the sequence length, rule 2 the block divided, rule 3 the block padded to.
    names = {"block_q": str(q_len), "block_kv": str(kv_len), **PARENTS,
             "q_len": "block_q", "kv_len": "block_kv"}
    changes = []
    for line in log:
        key, change, _ = line.split(": ", 2)
        old, new = change.split(" -> ")
        changes.append((key, int(old), int(new), names[key]))
    return adjusted, changes


def _up(n, multiple):
    return triton.cdiv(n, multiple) * multiple


def block_config_mistakes(blocks, q_len, kv_len):
    """What the check's explanations of rule 1 compare with: each forward block's bound (its
    sequence rounded up to 16), which a block not shrunk, shrunk to the raw length or shrunk
    needlessly misses, and block_kv fitted to q_len (self-attention assumed)."""
    room = {"block_q": _up(q_len, MIN_BLOCK), "block_kv": _up(kv_len, MIN_BLOCK)}
    return {"room": room, "kv_fitted_to_q_len": min(blocks["block_kv"], room["block_q"])}


def block_d(head_dim):
    """The width of a tile row: head_dim rounded up to a power of two, at least 16."""
    return max(MIN_BLOCK, triton.next_power_of_2(head_dim))


def _element(dtype):
    return torch.empty((), dtype=dtype).element_size()


def smem_mistakes(block_q, block_kv, head_dim, dtype, stages):
    """The bytes of the classic slips, in the order of the check's descriptions: K and V
    once, one tile per stage, Q per stage, Q left out, stages - 1, elements not bytes,
    head_dim not padded."""
    width, size = block_d(head_dim), _element(dtype)
    return [(block_q + 2 * block_kv) * width * size,
            (block_q + stages * block_kv) * width * size,
            stages * (block_q + 2 * block_kv) * width * size,
            2 * stages * block_kv * width * size,
            (block_q + 2 * (stages - 1) * block_kv) * width * size,
            (block_q + 2 * stages * block_kv) * width,
            (block_q + 2 * stages * block_kv) * head_dim * size]


def dram_mistakes(B, H, N, D, block_q, dtype):
    """The bytes of the classic slips, in the order of the check's descriptions: elements
    with an LSE of 1 each, elements with the LSE's 4 bytes, LSE left out, LSE in the inputs'
    dtype, one head, ragged last block dropped, K and V read once, head dim padded."""
    size, width = _element(dtype), block_d(D)
    elements = flash_dram_accesses(N, D, 4 * D * block_q)  # Q, O once; K, V per query block
    floored = 2 * N * D + 2 * N * D * (N // block_q)
    return [B * H * (elements + N),
            B * H * (elements + 4 * N),
            B * H * elements * size,
            B * H * (elements * size + size * N),
            elements * size + 4 * N,
            B * H * (floored * size + 4 * N),
            B * H * (4 * N * D * size + 4 * N),
            B * H * (flash_dram_accesses(N, width, 4 * width * block_q) * size + 4 * N)]
