"""Classic bugs of module 01 (softmax)."""
from grader.bugs import Bug

BUGS = {
    "no_max_subtraction": Bug(
        "softmax_stable", find="z = x - x.max(dim=dim, keepdim=True).values", replace="z = x",
        says="Subtract the max"),
    "wrong_dim": Bug(  # ignores `dim`: always the last one
        "softmax_stable",
        find="z = x - x.max(dim=dim, keepdim=True).values\n    e = torch.exp(z)\n    return e / e.sum(dim=dim, keepdim=True)",
        replace="z = x - x.max(dim=-1, keepdim=True).values\n    e = torch.exp(z)\n    return e / e.sum(dim=-1, keepdim=True)",
        says="instead of dim"),
    "rescale_order": Bug(
        "online_softmax",
        find="        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum()\n        m = m_new",
        replace="        m = m_new\n        l = l * torch.exp(m - m_new) + torch.exp(block - m_new).sum()",
        says="rescaled"),
    "load_other_zero": Bug(
        "softmax_kernel", find='mask=mask, other=-float("inf")', replace="mask=mask, other=0.0",
        says="other=0", also=("test_softmax",)),
    "missing_load_mask": Bug(
        "softmax_kernel", find='cols, mask=mask, other=-float("inf"))', replace="cols)",
        says="masked", also=("test_softmax",)),
    "missing_store_mask": Bug(
        "softmax_kernel", find="y.to(out_ptr.dtype.element_ty), mask=mask)",
        replace="y.to(out_ptr.dtype.element_ty))", says="outside", also=("test_softmax",)),
    "wrapper_fixed_block": Bug(
        "softmax", find="block = triton.next_power_of_2(n_cols)", replace="block = 1024",
        says="next_power_of_2"),
    "wrapper_calls_torch": Bug(
        "softmax", find="    out = torch.empty_like(x)\n",
        replace="    return torch.softmax(x, dim=-1)\n    out = torch.empty_like(x)\n",
        says="Triton kernel"),
    "global_max": Bug(  # the max of the whole tensor: far-below slices underflow to 0 / 0
        "softmax_stable", find="z = x - x.max(dim=dim, keepdim=True).values", replace="z = x - x.max()",
        says="underflows"),
    "online_max_starts_at_zero": Bug(
        "online_softmax", find='m = torch.tensor(float("-inf"))', replace="m = torch.tensor(0.0)",
        says="started at 0"),
    "kernel_int32_offsets": Bug(
        "softmax_kernel", find="row = tl.program_id(0).to(tl.int64)", replace="row = tl.program_id(0)",
        says="int64"),
    "kernel_ignores_input_stride": Bug(
        "softmax_kernel", find="in_ptr + row * in_row_stride + cols", replace="in_ptr + row * n_cols + cols",
        says="stride", also=("test_softmax",)),
    "kernel_ignores_output_stride": Bug(  # one stride for both tensors
        "softmax_kernel", find="out_ptr + row * out_row_stride + cols",
        replace="out_ptr + row * in_row_stride + cols", says="stride", also=("test_softmax",)),
    "kernel_half_sum": Bug(  # the exps summed in the input's dtype (float16 for float16 rows)
        "softmax_kernel", find="    e = tl.exp(z)\n", replace="    e = tl.exp(z).to(in_ptr.dtype.element_ty)\n",
        says="float32", also=("test_softmax",)),
    "kernel_no_max_subtraction": Bug(
        "softmax_kernel", find="z = x - tl.max(x, axis=0)", replace="z = x", says="subtract the max",
        also=("test_softmax",)),
    "wrapper_caps_block": Bug(
        "softmax", find="block = triton.next_power_of_2(n_cols)",
        replace="block = min(triton.next_power_of_2(n_cols), 4096)", says="smaller than a row"),
    "wrapper_assumes_contiguous": Bug(  # passes n_cols as both row strides
        "softmax", find="out, x, x.stride(0), out.stride(0), n_cols",
        replace="out, x, n_cols, n_cols, n_cols", says="stride"),
    "wrapper_skips_contiguous": Bug(  # a transposed view goes to a kernel that walks rows with unit stride
        "softmax", find="x = x.contiguous()", replace="x = x", says="contiguous"),
    "wrapper_computes_with_torch": Bug(  # launches the kernel, then returns PyTorch's own result
        "softmax", find="    return out",
        replace="    e = torch.exp(x.float() - x.float().max(dim=-1, keepdim=True).values)\n"
                "    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)",
        says="must happen in softmax_kernel"),
}
