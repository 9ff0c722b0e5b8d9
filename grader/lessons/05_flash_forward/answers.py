"""What module 05's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`)."""
import triton

from solutions.flash_forward import flash_grid

CHECKS = ("check_flash_grid",)


def flash_grid_mistakes(seq_len, batch, heads, block_q):
    """The grids of the classic slips, in the order of the check's descriptions: floored
    query blocks, axes swapped, batch and heads on two axes, one program per query."""
    blocks = triton.cdiv(seq_len, block_q)
    return [(seq_len // block_q, batch * heads, 1), (batch * heads, blocks, 1), (blocks, batch, heads),
            (seq_len, batch * heads, 1)]
