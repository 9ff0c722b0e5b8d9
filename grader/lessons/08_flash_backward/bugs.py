"""Classic bugs of module 08 (the FlashAttention backward pass)."""
from grader.bugs import Bug

# Test cells that run an exercise's code through later ones: a bug planted there fails them too.
DKDV_USERS = ("test_accumulate_dq", "test_flash_backward", "test_flash_attention_function")
WRAPPER_USERS = ("test_flash_backward", "test_flash_attention_function")
DELTA_USERS = ("test_bwd_dq_kernel",) + WRAPPER_USERS  # the dQ kernel computes delta with _row_delta

BUGS = {
    # softmax_backward
    "softmax_sum_not_subtracted": Bug(
        "softmax_backward", find="(dp32 - (p32 * dp32).sum(dim, keepdim=True))", replace="dp32",
        says="not subtracted"),
    "softmax_sum_of_dp": Bug(  # sum(dp) instead of sum(p * dp)
        "softmax_backward", find="(p32 * dp32).sum(dim, keepdim=True)",
        replace="dp32.sum(dim, keepdim=True)", says="weigh"),
    "softmax_sum_over_last_dim": Bug(
        "softmax_backward", find=".sum(dim, keepdim=True)", replace=".sum(-1, keepdim=True)", says="dim"),
    # attention_backward_reference
    "reference_delta_from_do": Bug(
        "attention_backward_reference", find="delta = (do64 * o64)", replace="delta = (do64 * do64)",
        says="delta"),
    "reference_ds_without_delta": Bug(
        "attention_backward_reference", find="ds = p * (dp - delta)", replace="ds = p * dp", says="delta"),
    "reference_dk_scale_twice": Bug(
        "attention_backward_reference", find="dk = scale * ds.transpose(-1, -2) @ q64",
        replace="dk = scale * scale * ds.transpose(-1, -2) @ q64", says="twice"),
    "reference_gqa_not_summed": Bug(
        "attention_backward_reference", find="dk = dk.view(B, Hkv, group, Nk, D).sum(2)",
        replace="dk = dk.view(B, Hkv, group, Nk, D)[:, :, 0]", says="group"),
    "reference_causal_ignored": Bug(
        "attention_backward_reference", find="attention_scores(q64, k64, causal, scale)",
        replace="attention_scores(q64, k64, False, scale)", says="causal"),
    # bwd_preprocess_kernel (and _row_delta)
    "delta_from_do_squared": Bug(
        "bwd_preprocess_kernel", find="o.to(tl.float32) * do.to(tl.float32)",
        replace="do.to(tl.float32) * do.to(tl.float32)", says="delta", also=DELTA_USERS),
    "delta_of_o_only": Bug(
        "bwd_preprocess_kernel", find="o.to(tl.float32) * do.to(tl.float32)", replace="o.to(tl.float32)",
        says="rowsum of dO * O", also=DELTA_USERS),
    # bwd_dkdv_kernel (and _dkdv_q_blocks)
    "dk_scale_missing": Bug(
        "bwd_dkdv_kernel", find="    dk = dk * sm_scale  #", replace="    dk = dk  #", says="scale",
        also=DKDV_USERS),
    "ds_is_p": Bug(  # dS = P instead of P * (dP - delta)
        "bwd_dkdv_kernel", find="dsT = pT * (dpT - delta[None, :])", replace="dsT = pT", says="dS",
        also=DKDV_USERS),
    "lse_not_in_base_2": Bug(
        "bwd_dkdv_kernel", find="- (lse * LOG2E_C)[None, :])", replace="- lse[None, :])", says="base-2",
        also=DKDV_USERS),
    "causal_mask_missing": Bug(
        "bwd_dkdv_kernel", find="keep = keep & (offs_m[None, :] >= offs_n[:, None])",
        replace="keep = keep", says="causal", also=DKDV_USERS),
    "gqa_not_summed": Bug(  # only the first query head of each group reaches dK and dV
        "bwd_dkdv_kernel", find="for g in range(GROUP):", replace="for g in range(1):", says="group",
        also=DKDV_USERS),
    # bwd_dq_kernel (and _dq_kv_blocks)
    "dq_scale_missing": Bug(
        "bwd_dq_kernel", find="    dq = dq * sm_scale  #", replace="    dq = dq  #", says="scale",
        also=WRAPPER_USERS),
    "dq_causal_mask_missing": Bug(
        "bwd_dq_kernel", find="keep = keep & (offs_m[:, None] >= offs_n[None, :])", replace="keep = keep",
        says="causal", also=WRAPPER_USERS),
    "dq_lse_not_in_base_2": Bug(
        "bwd_dq_kernel", find="other=0.0) * LOG2E_C", replace="other=0.0)", says="base-2",
        also=WRAPPER_USERS),
    "dq_delta_not_stored": Bug(
        "bwd_dq_kernel", find="    tl.store(DELTA + rows + offs_m, delta, mask=row_ok)\n", replace="",
        says="DELTA", also=WRAPPER_USERS),
    # _accumulate_dq (the fused dQ)
    "dq_not_atomic": Bug(  # right in the interpreter, a race on a GPU
        "accumulate_dq", find='tl.atomic_add(dq_ptrs, dq, mask=dq_mask, sem="relaxed")',
        replace="tl.store(dq_ptrs, tl.load(dq_ptrs, mask=dq_mask, other=0.0) + dq, mask=dq_mask)",
        says="atomic"),
    "fused_dq_scale_missing": Bug(
        "accumulate_dq", find="input_precision=DOT_PRECISION) * sm_scale",
        replace="input_precision=DOT_PRECISION)", says="scale", also=WRAPPER_USERS),
    # flash_backward (the wrapper)
    "fused_dq_not_zeroed": Bug(
        "flash_backward", find="dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)",
        replace="dq = torch.empty(q.shape, device=q.device, dtype=torch.float32)", says="zeros",
        also=("test_flash_attention_function",)),
    "dkdv_grid_over_query_heads": Bug(
        "flash_backward", find="bwd_dkdv_kernel[(triton.cdiv(Nk, block_n), B * Hkv)]",
        replace="bwd_dkdv_kernel[(triton.cdiv(Nk, block_n), B * H)]", says="grid",
        also=("test_flash_attention_function",)),
    "sm_scale_ignored": Bug(
        "flash_backward", find="sm_scale = default_scale(sm_scale, D)",
        replace="sm_scale = default_scale(None, D)", says="sm_scale", also=("test_flash_attention_function",)),
    "fused_dq_left_in_fp32": Bug(
        "flash_backward", find="return dq.to(q.dtype), dk, dv", replace="return dq, dk, dv", says="dtype",
        also=("test_flash_attention_function",)),
    # FlashAttentionFunction
    "causal_not_passed_to_backward": Bug(
        "flash_attention_function", find="ctx.causal, ctx.sm_scale, fused=ctx.fused",
        replace="False, ctx.sm_scale, fused=ctx.fused", says="causal"),
    "sm_scale_not_passed_to_backward": Bug(
        "flash_attention_function", find="ctx.causal, ctx.sm_scale, fused=ctx.fused",
        replace="ctx.causal, None, fused=ctx.fused", says="sm_scale"),
}
