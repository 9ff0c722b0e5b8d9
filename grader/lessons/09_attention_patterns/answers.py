"""What module 09's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`): the projection's columns, RoPE's outputs,
the ALiBi slopes, the key block ranges and the blocks a kernel must run, and the classic
mistakes' values (tensors as signatures), by which a failing check names the slip."""
import itertools
import math

import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton

from course import recorded
from course.checks.attention_patterns import (
    GPU_BLOCK_SIZES, KERNEL_GPU_CASES, LN2, PROJECTION_GPU_CASES, ROPE_GPU_CASES, ROPE_KERNEL_GPU_CASES,
    WRAPPER_CASES, WRAPPER_GPU_CASES, _pattern, block_d, blocks_run_asked, pattern_questions,
    pattern_values, rope_values)
from grader.answer_key import telling
from solutions import attention_patterns as key

CHECKS = ("check_qkv_projection", "check_rope", "check_rope_kernel", "check_alibi_slopes",
          "check_key_block_range", "check_pattern_attention_kernel", "check_pattern_attention")
ROPE_BASE = key.ROPE_BASE


def _f64(t):
    return t.detach().to(torch.float64)


def _listed(t, dtype):
    """A float64 tensor computed from inputs of `dtype`, as nested lists of 7 significant
    digits (5 below float32): the checks compare with tolerances of 1e-4 or more (1e-2 below
    float32), and the table is about half as long as with float64's 17 digits."""
    digits = 7 if dtype in (torch.float32, torch.float64) else 5
    rounded = [float(f"{value:.{digits}g}") for value in t.detach().reshape(-1).tolist()]
    return torch.tensor(rounded, dtype=torch.float64).reshape(t.shape).tolist()


def _telling(found, right):
    """{mistake: signature} of the outputs that differ from the right one (a signature of
    the right values would name the mistake for any output that is right there)."""
    return {name: told for name, told in telling(found, right).items() if told is not None}


# ---------------------------------------------------------------------------------------
# qkv_projection

def _split(qkv, heads, kv_heads, layout):
    """q, k, v [B, heads or kv_heads, N, D] read from the rows of a [B, N, rows] product in a
    wrong layout: "per_head" ([heads, 3, D], GPT-NeoX's fused layout) or "lanes_outer"
    ([D, heads]: lanes and heads swapped)."""
    B, N, rows = qkv.shape
    parts = heads + 2 * kv_heads
    D = rows // parts
    if layout == "per_head":
        q, k, v = qkv.view(B, N, heads, 3, D).unbind(3)
    else:
        q, k, v = qkv.view(B, N, D, parts).transpose(2, 3).split([heads, kv_heads, kv_heads], dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def projection_columns(rows, heads, kv_heads):
    """{layout: [q, k, v]}, each [heads or kv_heads][D]: the columns of the product x @ w_qkvᵀ
    that q, k and v read, by the answer key's qkv_projection ("parts": it runs on a product
    that holds its own column numbers) and in the classic slips' layouts ("per_head" only
    when kv_heads == heads, its view needs as many k and v heads as q heads)."""
    numbers = torch.arange(rows, dtype=torch.float64).view(1, 1, rows)
    layouts = {"parts": key.qkv_projection(numbers, torch.eye(rows, dtype=torch.float64), heads, kv_heads)}
    if kv_heads == heads:
        layouts["per_head"] = _split(numbers, heads, kv_heads, "per_head")
    layouts["lanes_outer"] = _split(numbers, heads, kv_heads, "lanes_outer")
    return {layout: [t[0, :, 0].long().tolist() for t in qkv] for layout, qkv in layouts.items()}


# ---------------------------------------------------------------------------------------
# RoPE

def turned(x, positions, base=ROPE_BASE, *, pairing="halves", turn=1.0, exponent=2.0, width=None):
    """float64 RoPE of x [..., N, D] at `positions` [N]. pairing "halves" (lane i with lane
    i + D/2) or "interleaved" (2i with 2i + 1). Classic mistakes: turn=-1 (rotated the other
    way), exponent=1 (base^(-i/D)), width (frequencies from a padded width, not D)."""
    x = _f64(x)
    D = x.shape[-1]
    half = D // 2
    freq = base ** (-exponent * torch.arange(half, dtype=torch.float64, device=x.device) / (width or D))
    angle = turn * _f64(torch.as_tensor(positions)).to(x.device)[:, None] * freq
    cos, sin = angle.cos(), angle.sin()
    if pairing == "halves":
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def _positions(x, offset):
    return offset + torch.arange(x.shape[-2], dtype=torch.float64, device=x.device)


def rope(x, offset, base):
    """RoPE of x, row n at position offset + n (_listed)."""
    return _listed(turned(x, _positions(x, offset), base), x.dtype)


def rope_mistakes(x, offset, base, padded_width):
    """{mistake: signature} of the classic RoPE slips (the check describes each): the
    interleaved pairing, the offset left out, the other way round, base^(-i/D), and the
    frequencies from the kernel's padded width (padded_width: its BLOCK_D, or None)."""
    positions = _positions(x, offset)
    found = {"interleaved": turned(x, positions, base, pairing="interleaved")}
    if offset:
        found["no_offset"] = turned(x, positions - offset, base)
    found |= {"other_way": turned(x, positions, base, turn=-1.0),
              "exponent": turned(x, positions, base, exponent=1.0)}
    if padded_width and padded_width != x.shape[-1]:
        found["padded_width"] = turned(x, positions, base, width=padded_width)
    return _telling(found, turned(x, positions, base))


# ---------------------------------------------------------------------------------------
# alibi_slopes

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


# ---------------------------------------------------------------------------------------
# key_block_range

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


# ---------------------------------------------------------------------------------------
# pattern_attention_kernel and pattern_attention: their classic mistakes

def attention(q, k, v, *, scale, q_offset=0, causal=False, window=None, rope=False,
              rope_base=ROPE_BASE, slopes=None, mistake=None, blocks=None):
    """(O, LSE) in float64 for this module's patterns, computed densely. `mistake` names a
    classic bug to emulate (see pattern_mistakes); `blocks` = (block_q, block_k) is needed by
    the bugs that skip key blocks."""
    mistake = mistake or {}
    q, k, v = _f64(q), _f64(k), _f64(v)
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    rows = q_offset + torch.arange(Nq, device=q.device)
    cols = torch.arange(Nk, device=q.device)
    if rope:
        rope_args = {name: mistake[name] for name in ("pairing", "turn", "exponent", "width")
                     if name in mistake}
        q = turned(q, rows - mistake.get("q_positions_shift", 0), rope_base, **rope_args)
        k = turned(k, cols, rope_base, **rope_args)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = q @ k.transpose(-1, -2) * scale
    distance = rows[:, None] - cols[None, :]
    if slopes is not None:
        per_head = _f64(slopes)[mistake.get("head_map", torch.arange(H)).to(q.device)]
        bias_distance = (distance - mistake.get("bias_shift", 0)).abs()
        s = s - mistake.get("bias_factor", 1.0) * per_head[:, None, None] * bias_distance
    if causal or window is not None:
        masked = distance - mistake.get("mask_shift", 0)
        w = (window if window is not None else q_offset + Nq) + mistake.get("window_extra", 0)
        s = s.masked_fill(~((masked >= 0) & (masked < w)), float("-inf"))
    if "first_key" in mistake:  # a wrong loop start: keys before it never run
        first = torch.tensor([mistake["first_key"](i) for i in range(triton.cdiv(Nq, blocks[0]))],
                             device=q.device).repeat_interleave(blocks[0])[:Nq]
        s = s.masked_fill(cols[None, :] < first[:, None], float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def pattern_mistakes(q, k, v, scale, q_offset, causal, window, rope, rope_base, slopes):
    """{mistake: signature of its O} of the classic slips these patterns can show (the check
    describes each), but those of the loop's first block (loop_start_mistakes)."""
    H, Hkv, D = q.shape[1], k.shape[1], q.shape[3]
    pattern = dict(scale=scale, q_offset=q_offset, causal=causal, window=window, rope=rope,
                   rope_base=rope_base, slopes=slopes)

    def wrong(**mistake):
        return attention(q, k, v, mistake=mistake, **pattern)[0]
    found = {}
    if rope:
        found["interleaved"] = wrong(pairing="interleaved")
        if q_offset:
            found["q_turned_from_zero"] = wrong(q_positions_shift=q_offset)
        found["other_way"] = wrong(turn=-1.0)
        if block_d(D) != D:
            found["padded_width"] = wrong(width=block_d(D))
    if slopes is not None:
        found |= {"natural_units": wrong(bias_factor=LN2), "bias_scaled": wrong(bias_factor=scale),
                  "bonus": wrong(bias_factor=-1.0)}
        if H != Hkv:
            found["slope_of_kv_head"] = wrong(head_map=torch.arange(H) // (H // Hkv))
        found["slopes_reversed"] = wrong(head_map=torch.arange(H - 1, -1, -1))
        if q_offset:
            found["bias_without_offset"] = wrong(bias_shift=q_offset)
    if causal or window is not None:
        if q_offset:
            found["mask_without_offset"] = wrong(mask_shift=q_offset)
        found["no_mask"] = attention(q, k, v, **(pattern | {"causal": False, "window": None}))[0]
    if window is not None:
        found |= {"window_too_long": wrong(window_extra=1), "window_too_short": wrong(window_extra=-1)}
    return _telling(found, attention(q, k, v, **pattern)[0])


def loop_start_mistakes(q, k, v, scale, q_offset, causal, window, rope, rope_base, slopes, block_q, block_k):
    """{mistake: signature of its O} of a window's loop started one block too late: from the
    block's last query, or the first key rounded up to its block."""
    Nq = q.shape[2]
    pattern = dict(scale=scale, q_offset=q_offset, causal=causal, window=window, rope=rope,
                   rope_base=rope_base, slopes=slopes, blocks=(block_q, block_k))

    def starting(first_key):  # first_key(i): the key query block i's loop starts at
        return attention(q, k, v, mistake={"first_key": first_key}, **pattern)[0]

    def last_query(i):  # the position of query block i's last real query
        return q_offset + min(Nq, (i + 1) * block_q) - 1

    def first_seen(i):  # the first key that query block i's first query sees
        return max(0, q_offset + i * block_q - window + 1)
    found = {"from_last_query": starting(lambda i: max(0, last_query(i) - window + 1) // block_k * block_k),
             "rounded_up": starting(lambda i: triton.cdiv(first_seen(i), block_k) * block_k)}
    return _telling(found, attention(q, k, v, **pattern)[0])


# ---------------------------------------------------------------------------------------
# On a GPU the checks run more cases, and a wrapper given no blocks chooses its own: record
# those answers too (the table is recorded on a CPU), for every block size a GPU wrapper may
# take.

def _pattern_asked(shape, options, blocks):
    """What a case of the kernel or the wrapper asks, launched with each of these blocks."""
    H, Nq, Nk, D = shape[1], shape[3], shape[4], shape[5]
    q, k, v = pattern_values(*shape, seed=options["seed"], kind=options.get("kind", "random"))
    slopes = torch.tensor(alibi_slopes(H), dtype=torch.float32) if options.get("alibi") else None
    chosen = ("q_offset", "causal", "window", "rope", "rope_base")
    pattern = _pattern(slopes=slopes, **{name: options[name] for name in chosen if name in options})
    scale = 1.0 / math.sqrt(D) if options.get("sm_scale") is None else options["sm_scale"]
    return [asked for launched in blocks
            for asked in [("blocks_run", blocks_run_asked(Nq, Nk, launched, pattern))]
            + ([("alibi_slopes", (H,))] if slopes is not None else [])
            + list(pattern_questions(q, k, v, scale=scale, blocks=launched, pattern=pattern).values())]


def _rope_asked(shape, options, padded_width):
    x = rope_values(*shape, seed=options["seed"], kind=options.get("kind", "random"))
    asked = (x, options.get("offset", 0), options.get("base", ROPE_BASE))
    return [("rope", asked), ("rope_mistakes", (*asked, padded_width))]


def _gpu_questions():
    """What the GPU's cases ask, and the CPU's wrapper cases that choose their own blocks,
    each question once (a wrapper's blocks change only some of its answers)."""
    choosing = [case for case in WRAPPER_CASES if "blocks" not in case[1]]
    questions = ([("projection_columns", ((heads + 2 * kv_heads) * D, heads, kv_heads))
                  for (_, _, _, heads, kv_heads, D, _), _ in PROJECTION_GPU_CASES]
                 + [asked for shape, options in ROPE_GPU_CASES for asked in _rope_asked(shape, options, None)]
                 + [asked for shape, options in ROPE_KERNEL_GPU_CASES
                    for asked in _rope_asked(shape, options, block_d(shape[3]))]
                 + [asked for shape, options in KERNEL_GPU_CASES
                    for asked in _pattern_asked(shape, options, [options["blocks"]])]
                 + [asked for shape, options in choosing + WRAPPER_GPU_CASES
                    for asked in _pattern_asked(shape, options, [options["blocks"]] if "blocks" in options
                                                else itertools.product(GPU_BLOCK_SIZES, repeat=2))])
    yield from {(name, recorded.key(args)): (name, args) for name, args in questions}.values()


# A generator, read by record() only: this module is loaded again for every answer asked.
EXTRA = _gpu_questions()
