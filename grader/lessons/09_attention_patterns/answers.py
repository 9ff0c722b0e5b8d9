"""What module 09's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`)."""
import itertools
import math

import triton

from course.checks.attention_patterns import (GPU_BLOCK_SIZES, KERNEL_GPU_CASES, WRAPPER_CASES,
                                              WRAPPER_GPU_CASES, _pattern, blocks_run_asked)
from solutions import attention_patterns as key

CHECKS = ("check_alibi_slopes", "check_key_block_range", "check_pattern_attention_kernel",
          "check_pattern_attention")


def alibi_slopes(heads):
    """The paper's slopes in float64, by its recursion (the solution's are float32, the check
    compares to 1e-6): P = the largest power of two <= H gives the ratios r, r^2, ..., r^P
    with r = 2^(-8/P); the other H - P heads take every other slope of 2P heads."""
    p = 2 ** int(math.log2(heads))
    ratio = 2.0 ** (-8.0 / p)
    slopes = [ratio ** (i + 1) for i in range(p)]
    return slopes + (alibi_slopes(2 * p)[0::2][:heads - p] if p < heads else [])


def alibi_mistakes(heads):
    """{mistake: slopes} of the classic slips (the check describes each)."""
    p = 2 ** int(math.log2(heads))
    found = {"from_one": [2.0 ** (-8.0 * i / heads) for i in range(heads)],
             "reversed": list(reversed(alibi_slopes(heads)))}
    if p != heads:
        found |= {"geometric": [2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)],
                  "even_ranks": alibi_slopes(p) + alibi_slopes(2 * p)[1::2][:heads - p],
                  "first_of_2p": alibi_slopes(2 * p)[:heads]}
    return found


def key_block_range(q_block, n_q, n_k, block_q, block_k, q_offset, causal, window):
    """The solution's, asked with positional arguments (answer() passes no keywords)."""
    return key.key_block_range(q_block, n_q, n_k, block_q, block_k, q_offset=q_offset, causal=causal,
                               window=window)


def query_positions(q_block, n_q, block_q, q_offset):
    """The positions of the first and the last real query of the block."""
    return q_offset + q_block * block_q, q_offset + min(n_q, (q_block + 1) * block_q) - 1


def key_block_range_mistakes(q_block, n_q, n_k, block_q, block_k, q_offset, causal, window):
    """{mistake: (first, stop)} of the classic slips (the check describes each); asked with
    key_block_range's arguments, causal included, though no slip depends on it."""
    def blocks(first_pos, last_pos, longer=0):
        stop = min(n_k - 1, last_pos) // block_k + 1
        return (0 if window is None else max(0, first_pos - window + 1 - longer) // block_k), stop
    first_pos, last_pos = query_positions(q_block, n_q, block_q, q_offset)
    first, stop = blocks(first_pos, last_pos)
    found = {"diagonal": (first, stop - 1),
             "past_n_q": blocks(first_pos, q_offset + (q_block + 1) * block_q - 1)}
    if q_offset:
        found["no_offset"] = blocks(first_pos - q_offset, last_pos - q_offset)
    if window is not None:
        found |= {"from_last_query": (max(0, last_pos - window + 1) // block_k, stop),
                  "rounded_up": (triton.cdiv(max(0, first_pos - window + 1), block_k), stop),
                  "window_too_long": blocks(first_pos, last_pos, longer=1)}
    return found


def blocks_run(n_q, n_k, block_q, block_k, q_offset, causal, window):
    """The key blocks each query block's program must run (BLOCKS_RUN of one head)."""
    return [stop - first for first, stop in
            (key_block_range(i, n_q, n_k, block_q, block_k, q_offset, causal, window)
             for i in range(triton.cdiv(n_q, block_q)))]


def _asked_on_gpu(shape, options, blocks):
    _, H, _, Nq, Nk = shape[:5]
    pattern = _pattern(**{name: options[name] for name in ("q_offset", "causal", "window")
                          if name in options})
    return [("blocks_run", blocks_run_asked(Nq, Nk, b, pattern)) for b in blocks] + \
        ([("alibi_slopes", (H,))] if options.get("alibi") else [])


# On a GPU the checks run more cases, and a wrapper given no blocks chooses its own: record
# those answers for every block size a GPU wrapper may take.
EXTRA = [asked for shape, options in KERNEL_GPU_CASES
         for asked in _asked_on_gpu(shape, options, [options["blocks"]])] + \
        [asked for shape, options in WRAPPER_CASES + WRAPPER_GPU_CASES
         for asked in _asked_on_gpu(shape, options, [options["blocks"]] if "blocks" in options
                                    else itertools.product(GPU_BLOCK_SIZES, repeat=2))]
