"""What module 03's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`)."""
import torch
import triton

from course.checks.tiling import DISPATCH_CASES
from solutions.tiling import dram_reads, dram_reads_untiled  # noqa: F401 (asked by name)

CHECKS = ("check_dram_reads", "check_compare_dispatch")
# compare_dispatch's bytes depend on TILE, 32 on a CPU and 64 on a GPU: record both.
EXTRA = [("dispatch_model", (*case, tile)) for case in DISPATCH_CASES for tile in (32, 64)]


def dram_reads_mistakes(m, n, k, tile):
    """The counts of the classic slips, in the order of the check's descriptions: full tiles
    only, A and B swapped, each input read once."""
    return [m * k * (n // tile) + k * n * (m // tile),
            m * k * triton.cdiv(m, tile) + k * n * triton.cdiv(n, tile),
            m * k + k * n]


def dispatch_model(B, H, M, N, K, dtype, tile):
    """{strategy: (launches, bytes)} as compare_dispatch's docstring defines them."""
    pairs, size = B * H, torch.empty((), dtype=dtype).element_size()
    gemm = pairs * (dram_reads(M, N, K, tile) + M * N) * size
    return {"loop": (pairs, gemm), "strided": (1, gemm), "ptrs": (1, gemm + pairs * 6 * 8),
            "stack": (3, gemm + 2 * pairs * (M * K + K * N) * size)}
