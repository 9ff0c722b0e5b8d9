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
}
