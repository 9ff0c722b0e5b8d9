"""Classic bugs of module 09 (patterns around attention)."""
from grader.bugs import Bug

KERNEL_USERS = ("test_pattern_attention",)  # the wrapper launches the kernel: it fails too
ROPE_USERS = ("test_pattern_attention_kernel", "test_pattern_attention")  # they call rope_tile

BUGS = {
    # qkv_projection
    "qkv_lanes_and_heads_swapped": Bug(  # the split along the wrong dim
        "qkv_projection", find="qkv = qkv.view(B, N, heads + 2 * kv_heads, D)",
        replace="qkv = qkv.view(B, N, D, heads + 2 * kv_heads).transpose(2, 3)", says="swapped"),
    "qkv_split_in_thirds": Bug(  # right only when kv_heads == heads
        "qkv_projection", find="q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=2)",
        replace="q, k, v = qkv.chunk(3, dim=2)", says="thirds"),
    "qkv_copies": Bug(
        "qkv_projection", find="return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)",
        replace="return q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), "
                "v.transpose(1, 2).contiguous()", says="copy"),
    "qkv_three_gemms": Bug(
        "qkv_projection", find="qkv = x @ w_qkv.T  #",
        replace="qkv = torch.cat([x @ w.T for w in w_qkv.split([heads * D, kv_heads * D, kv_heads * D])], "
                "-1)  #", says="GEMM"),
    # rope
    "rope_interleaved": Bug(
        "rope", find="x1, x2 = x[..., :half].float(), x[..., half:].float()  # pair i: lanes i and i + D/2\n"
                     "    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)",
        replace="x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()\n"
                "    out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)",
        says="interleaved"),
    "rope_no_offset": Bug(
        "rope", find="positions = offset + torch.arange(", replace="positions = torch.arange(",
        says="offset"),
    "rope_other_way": Bug(
        "rope", find="[x1 * cos - x2 * sin, x2 * cos + x1 * sin]",
        replace="[x1 * cos + x2 * sin, x2 * cos - x1 * sin]",
        says="other way"),
    "rope_exponent_without_2": Bug(
        "rope", find="freq = base ** (-2.0 * torch.arange(", replace="freq = base ** (-1.0 * torch.arange(",
        says="exponent"),
    # rope_tile, rope_kernel
    "rope_tile_interleaved": Bug(
        "rope_kernel",
        find="partner = tl.where(first, lane + half, lane - half)  # the other lane of each pair\n"
             "    pair = tl.where(first, lane, lane - half)\n"
             "    sign = tl.where(first, -1.0, 1.0)",
        replace="partner = lane ^ 1\n    pair = lane // 2\n    sign = tl.where(lane % 2 == 0, -1.0, 1.0)",
        says="interleaved", also=ROPE_USERS),
    "rope_kernel_no_offset": Bug(
        "rope_kernel", find="rows, pos_offset + rows, N,", replace="rows, rows, N,", says="offset"),
    "rope_tile_frequencies_from_block_d": Bug(
        "rope_kernel", find="(-2.0 / HEAD_DIM)", replace="(-2.0 / BLOCK_D)", says="BLOCK_D", also=ROPE_USERS),
    # alibi_slopes
    "alibi_starts_at_one": Bug(
        "alibi_slopes", find="2.0 ** (-8.0 * (i + 1) / n)", replace="2.0 ** (-8.0 * i / n)", says="started"),
    "alibi_geometric_for_any_h": Bug(
        "alibi_slopes", find="slopes = geometric(p) + geometric(2 * p)[0::2][:heads - p]",
        replace="slopes = geometric(heads)", says="power of two"),
    "alibi_even_ranks": Bug(
        "alibi_slopes", find="geometric(2 * p)[0::2]", replace="geometric(2 * p)[1::2]", says="1st, 3rd"),
    # key_block_range
    "range_from_last_query": Bug(
        "key_block_range", find="first = max(0, first_pos - window + 1) // block_k",
        replace="first = max(0, last_pos - window + 1) // block_k", says="partly"),
    "range_rounded_up": Bug(
        "key_block_range", find="first = max(0, first_pos - window + 1) // block_k",
        replace="first = -(-max(0, first_pos - window + 1) // block_k)", says="rounded up"),
    "range_without_diagonal_block": Bug(
        "key_block_range", find="stop = min(n_k - 1, last_pos) // block_k + 1",
        replace="stop = min(n_k - 1, last_pos) // block_k", says="diagonal"),
    # pattern_attention_kernel
    "alibi_natural_units": Bug(
        "pattern_attention_kernel", find="slope = tl.load(SLOPES + h) * KERNEL_LOG2E",
        replace="slope = tl.load(SLOPES + h)", says="log2", also=KERNEL_USERS),
    "alibi_slope_of_kv_head": Bug(
        "pattern_attention_kernel", find="tl.load(SLOPES + h)", replace="tl.load(SLOPES + h // GROUP)",
        says="K/V head", also=KERNEL_USERS),
    "alibi_bonus_not_penalty": Bug(
        "pattern_attention_kernel", find="s = s - slope * tl.abs(distance)",
        replace="s = s + slope * tl.abs(distance)",
        says="penalty", also=KERNEL_USERS),
    "window_one_too_long": Bug(
        "pattern_attention_kernel", find="(distance < window)", replace="(distance <= window)",
        says="window", also=KERNEL_USERS),
    "window_drops_partly_visible_block": Bug(
        "pattern_attention_kernel", find="lo = tl.maximum(first_pos - window + 1, 0) // BLOCK_K * BLOCK_K",
        replace="lo = tl.maximum(last_pos - window + 1, 0) // BLOCK_K * BLOCK_K", says="partly",
        also=KERNEL_USERS),
    "window_masked_not_skipped": Bug(
        "pattern_attention_kernel", find="lo = tl.maximum(first_pos - window + 1, 0) // BLOCK_K * BLOCK_K",
        replace="lo = 0", says="skip", also=KERNEL_USERS),
    "rope_queries_not_offset": Bug(
        "pattern_attention_kernel", find="q = rope_tile(q_base, rows, q_pos,",
        replace="q = rope_tile(q_base, rows, rows,", says="q_offset", also=KERNEL_USERS),
    "distance_without_offset": Bug(
        "pattern_attention_kernel", find="distance = q_pos[:, None] - cols[None, :]",
        replace="distance = rows[:, None] - cols[None, :]", says="q_offset", also=KERNEL_USERS),
    "blocks_not_counted": Bug(
        "pattern_attention_kernel", find="        visited += 1\n", replace="", says="BLOCKS_RUN",
        also=KERNEL_USERS),
    # pattern_attention (the wrapper)
    "wrapper_window_not_causal": Bug(
        "pattern_attention", find="causal = causal or window is not None  #",
        replace="causal = bool(causal)  #", says="window"),
    "wrapper_default_window_too_short": Bug(
        "pattern_attention", find="window = q_offset + Nq  #", replace="window = Nq  #",
        says="q_offset + Nq"),
    "wrapper_offset_not_passed": Bug(
        "pattern_attention", find="q_offset, window, float(rope_base),",
        replace="0, window, float(rope_base),",
        says="q_offset"),
    "wrapper_slopes_ignored": Bug(
        "pattern_attention", find="ALIBI=alibi_slopes is not None,", replace="ALIBI=False,", says="slopes"),
}
