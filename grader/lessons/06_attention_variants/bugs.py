"""Classic bugs of module 06 (causal and multi-head variants)."""
from grader.bugs import Bug

COUNTS_USE_RANGE = ("test_block_counts",)  # block_counts calls kv_block_range
KERNEL_USERS = ("test_attention",)         # the wrapper launches the kernel

BUGS = {
    # kv_block_range
    "range_top_left": Bug(  # module 05's alignment where this module asks for bottom-right
        "kv_block_range", find="shift = n_k - n_q  #", replace="shift = 0  #", says="bottom-right",
        also=COUNTS_USE_RANGE),
    "range_last_row_off_by_one_block": Bug(  # the keys of the row before the block
        "kv_block_range", find="first_row + block_q + shift", replace="first_row + shift",
        says="last row", also=COUNTS_USE_RANGE),
    "range_full_not_whole_blocks": Bug(
        "kv_block_range", find="return (seen_by_first // block_k) * block_k, seen_by_last",
        replace="return seen_by_first, seen_by_last", says="whole", also=COUNTS_USE_RANGE),
    "range_not_clamped": Bug(  # rows that see no key give negative counts
        "kv_block_range", find="min(max(first_row + shift + 1, 0), n_k)",
        replace="first_row + shift + 1", says="between 0 and n_k", also=COUNTS_USE_RANGE),
    # block_counts
    "counts_ragged_block_dropped": Bug(
        "block_counts", find="masked += triton.cdiv(masked_end, block_k)",
        replace="masked += masked_end // block_k", says="cdiv(masked_end"),
    # attend_kv_blocks and attention_kernel
    "causal_skip_one_block_early": Bug(
        "attention_kernel", find="tl.maximum(q0 + BLOCK_Q + shift, 0)", replace="tl.maximum(q0 + shift, 0)",
        says="one key block early", also=KERNEL_USERS),
    "diagonal_block_not_masked": Bug(
        "attention_kernel",
        find="            if CAUSAL:\n                visible = visible & (cols[None, :] <= offs_q[:, None] + shift)\n",
        replace="", says="diagonal", also=KERNEL_USERS),
    "full_blocks_from_last_row": Bug(  # the diagonal block runs in the unmasked phase
        "attention_kernel", find="tl.maximum(q0 + shift + 1, 0)", replace="tl.maximum(q0 + BLOCK_Q + shift, 0)",
        says="diagonal", also=KERNEL_USERS),
    "gqa_head_modulo": Bug(
        "attention_kernel", find="h_kv = h // GROUP", replace="h_kv = h % (H // GROUP)",
        says="h // GROUP", also=KERNEL_USERS),
    "batch_head_strides_swapped": Bug(
        "attention_kernel", find="Q + b * stride_qb + h * stride_qh", replace="Q + b * stride_qh + h * stride_qb",
        says="stride_qb", also=KERNEL_USERS),
    "short_kv_read_past_end": Bug(  # the unmasked phase rounds the keys up to a whole block
        "attention_kernel", find="full_end = N_K // BLOCK_K * BLOCK_K",
        replace="full_end = tl.cdiv(N_K, BLOCK_K) * BLOCK_K", says="past the end", also=KERNEL_USERS),
    "causal_top_left": Bug(
        "attention_kernel", find="shift = N_K - N_Q", replace="shift = 0", says="bottom-right",
        also=KERNEL_USERS),
    "empty_rows_nan": Bug(  # 0 / 0 for the rows that see no key
        "attention_kernel", find="(acc / l_safe[:, None])", replace="(acc / l_i[:, None])",
        says="see no key", also=KERNEL_USERS),
    "every_block_masked": Bug(  # right answer, but no block runs without a mask
        "attention_kernel", find="full_end = tl.minimum(tl.maximum(q0 + shift + 1, 0), N_K) // BLOCK_K * BLOCK_K",
        replace="full_end = 0", says="unmasked phase"),
    "no_block_skipped": Bug(  # right answer, but the blocks after the diagonal run, masked out
        "attention_kernel", find="masked_end = tl.minimum(tl.maximum(q0 + BLOCK_Q + shift, 0), N_K)",
        replace="masked_end = N_K", says="skipped"),
    # attention (the wrapper)
    "group_is_kv_heads": Bug(
        "attention", find="GROUP=H // Hkv", replace="GROUP=Hkv", says="GROUP is H // Hkv"),
    "output_not_in_q_layout": Bug(
        "attention", find="o = torch.empty_like(q)",
        replace="o = torch.empty(q.shape, device=q.device, dtype=q.dtype)", says="q's layout"),
    "inputs_copied": Bug(
        "attention", find="    o = torch.empty_like(q)",
        replace="    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()\n    o = torch.empty_like(q)",
        says="contiguous"),
    "grid_over_block_k": Bug(
        "attention", find="flash_grid(Nq, B, H, block_q)", replace="flash_grid(Nq, B, H, block_k)",
        says="BLOCK_Q"),
    "lse_in_input_dtype": Bug(
        "attention", find="lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)",
        replace="lse = torch.empty(B, H, Nq, device=q.device, dtype=q.dtype)", says="float32"),
    "small_blocks_accepted": Bug(
        "attention", find="if not isinstance(block, int) or block < 16 or block & (block - 1):",
        replace="if not isinstance(block, int):", says="block_k=8"),
}
