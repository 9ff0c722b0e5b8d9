"""What module 04's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`)."""
import torch
import triton

from solutions.naive_attention import (flash_dram_accesses, flash_one_pass_max_n,
                                       naive_dram_accesses, sp_bytes)

CHECKS = ("check_sp_bytes", "check_dram_accesses")


def sp_bytes_mistakes(B, H, Nq, Nk, dtype):
    """The byte counts of the classic slips, in the order of the check's descriptions:
    elements instead of bytes, one matrix, one matrix in elements."""
    elements = B * H * Nq * Nk
    return [2 * elements, elements * torch.empty((), dtype=dtype).element_size(), elements]


def naive_dram_accesses_mistakes(N, d):
    """In the order of the check's descriptions: S and P written but not read back, one of
    the four N^2 accesses left out, Q K V O left out, O left out."""
    return [4 * N * d + 2 * N * N, 4 * N * d + 3 * N * N, 4 * N * N, 2 * N * d + 4 * N * N]


def flash_dram_accesses_mistakes(N, d, M):
    """In the order of the check's descriptions: full query blocks only, one of K and V per
    block, Q and O left out, b from all of the SRAM."""
    b = M // (4 * d)
    blocks = triton.cdiv(N, b)
    return [2 * N * d + 2 * N * d * (N // b), 2 * N * d + N * d * blocks, 2 * N * d * blocks,
            2 * N * d + 2 * N * d * triton.cdiv(N, max(M // (2 * d), 1))]


def flash_one_pass_max_n_mistakes(d, M):
    """b from all of the SRAM instead of half of it."""
    return [M // (2 * d)]
