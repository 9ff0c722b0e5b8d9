"""Classic bugs of module 02 (masking)."""
from grader.bugs import Bug

BUGS = {
    "causal_off_by_one": Bug(
        "causal_mask_bool", find="triu(diagonal=1)", replace="triu(diagonal=0)", says="off by one", also=("test_causal_mask",)),
    "additive_mask_of_ones": Bug(
        "causal_mask", find='mask.masked_fill(causal_mask_bool(n, device=device), float("-inf"))',
        replace="mask.masked_fill(causal_mask_bool(n, device=device), 1.0)", says="-inf"),
    "mask_polarity_inverted": Bug(
        "apply_mask", find="scores.masked_fill(mask.bool(),", replace="scores.masked_fill(~mask.bool(),",
        says="polarity"),
    "mask_multiplied": Bug(
        "apply_mask", find='return scores.masked_fill(mask.bool(), float("-inf"))',
        replace="return scores * (1 - mask.float())", says="multiplied"),
    "padding_on_queries": Bug(
        "padding_mask", find="[:, None, :]", replace="[:, :, None]", says="queries"),
    "padding_polarity_inverted": Bug(
        "padding_mask", find="keys[None, :] >= lengths[:, None]", replace="keys[None, :] < lengths[:, None]",
        says="polarity"),
    "nan_on_fully_masked_rows": Bug(
        "safe_softmax", find="return probs.masked_fill(blocked, 0.0)",
        replace="return torch.softmax(scores, dim=dim)", says="NaN on fully masked rows"),
    "uniform_fully_masked_rows": Bug(
        "safe_softmax", find="return probs.masked_fill(blocked, 0.0)", replace="return probs",
        says="1/N"),
    "kernel_causal_off_by_one": Bug(
        "masked_softmax_kernel", find="cols <= i", replace="cols < i", says="off by one", also=("test_masked_softmax",)),
    "kernel_nan_on_fully_masked_rows": Bug(
        "masked_softmax_kernel", find='row_max = tl.where(row_max == -float("inf"), 0.0, row_max)',
        replace="", says="NaN on fully masked rows", also=("test_masked_softmax",)),
    "kernel_padding_on_queries": Bug(
        "masked_softmax_kernel", find="cols < tl.load(lengths_ptr + b)",
        replace="i < tl.load(lengths_ptr + b)", says="queries", also=("test_masked_softmax",)),
    "missing_load_mask": Bug(
        "masked_softmax_kernel", find='row_in + cols, mask=in_row, other=-float("inf"))',
        replace="row_in + cols)", says="masked", also=("test_masked_softmax",)),
    "load_other_zero": Bug(
        "masked_softmax_kernel", find='mask=in_row, other=-float("inf")', replace="mask=in_row, other=0.0",
        says="other=0", also=("test_masked_softmax",)),
    "missing_store_mask": Bug(
        "masked_softmax_kernel", find="y.to(out_ptr.dtype.element_ty), mask=in_row)",
        replace="y.to(out_ptr.dtype.element_ty))", says="outside", also=("test_masked_softmax",)),
    "wrapper_calls_torch": Bug(
        "masked_softmax", find="    out = torch.empty_like(x)\n",
        replace="    return torch.softmax(x, dim=-1).reshape(scores.shape)\n    out = torch.empty_like(x)\n",
        says="Triton kernel"),
    "wrapper_ignores_strides": Bug(
        "masked_softmax", find="x = x.contiguous()", replace="x = x", says="transposed"),
    "nan_to_num_fix_up": Bug(  # computes the NaN, then replaces it: the gradients stay NaN
        "safe_softmax", find="    blocked = torch.isneginf(scores).all(dim=dim, keepdim=True)\n"
                             "    probs = torch.softmax(scores.masked_fill(blocked, 0.0), dim=dim)\n"
                             "    return probs.masked_fill(blocked, 0.0)",
        replace="    return torch.softmax(scores, dim=dim).nan_to_num(0.0)", says="backward pass"),
    "kernel_ignores_input_strides": Bug(  # rows taken as one after another in memory
        "masked_softmax_kernel", find="row_in = in_ptr + b * in_stride_b + i * in_stride_m",
        replace="row_in = in_ptr + (b * tl.num_programs(0) + i) * n_keys", says="stride",
        also=("test_masked_softmax",)),
    "kernel_ignores_batch_stride": Bug(  # batch entries taken as one after another in memory
        "masked_softmax_kernel", find="row_in = in_ptr + b * in_stride_b + i * in_stride_m",
        replace="row_in = in_ptr + (b * tl.num_programs(0) + i) * in_stride_m", says="stride",
        also=("test_masked_softmax",)),
    "kernel_ignores_output_strides": Bug(  # the input's strides used for the output
        "masked_softmax_kernel", find="row_out = out_ptr + b * out_stride_b + i * out_stride_m",
        replace="row_out = out_ptr + b * in_stride_b + i * in_stride_m", says="stride",
        also=("test_masked_softmax",)),
    "kernel_half_sum": Bug(  # the exps summed in the scores' dtype (float16 for float16 scores)
        "masked_softmax_kernel", find="    e = tl.exp(x - row_max)\n",
        replace="    e = tl.exp(x - row_max).to(in_ptr.dtype.element_ty)\n", says="float32",
        also=("test_masked_softmax",)),
    "kernel_no_max_subtraction": Bug(
        "masked_softmax_kernel", find="    e = tl.exp(x - row_max)\n", replace="    e = tl.exp(x)\n",
        says="subtract the max", also=("test_masked_softmax",)),
    "wrapper_caps_block": Bug(
        "masked_softmax", find="BLOCK_SIZE=triton.next_power_of_2(N))",
        replace="BLOCK_SIZE=min(triton.next_power_of_2(N), 4096))", says="smaller than a row"),
    "wrapper_assumes_contiguous": Bug(  # strides computed from the shape
        "masked_softmax", find="out, x, lengths, x.stride(0), x.stride(1), out.stride(0), out.stride(1), N,",
        replace="out, x, lengths, M * N, N, M * N, N, N,", says="stride"),
    "wrapper_masks_with_torch": Bug(  # a causal mask tensor, and a kernel told not to mask
        "masked_softmax", find="    out = torch.empty_like(x)\n",
        replace="    if causal:\n        x = x.masked_fill(torch.ones(M, N, dtype=torch.bool, device=x.device).triu(1), "
                "float('-inf'))\n    causal = False\n    out = torch.empty_like(x)\n",
        says="never from a mask tensor"),
}
