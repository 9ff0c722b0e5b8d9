"""Classic bugs of module 04 (naive attention)."""
from grader.bugs import Bug

# Test cells whose code calls causal_future or repeat_kv: a bug planted there fails them too.
USE_HELPERS = ("test_attention_reference", "test_naive_attention")

BUGS = {
    "causal_diagonal_hidden": Bug(
        "causal_future", find=".triu(1)", replace=".triu(0)", says="diagonal", also=USE_HELPERS),
    "causal_bottom_right": Bug(  # the last query aligned with the last key
        "causal_future", find=".triu(1)", replace=".triu(1 + n_k - n_q)", says="top-left",
        also=USE_HELPERS),
    "gqa_heads_modulo": Bug(  # query head h reads K/V head h % Hkv
        "repeat_kv", find="x.repeat_interleave(heads // x.shape[1], dim=1)",
        replace="x.repeat(1, heads // x.shape[1], 1, 1)", says="consecutive", also=USE_HELPERS),
    "scale_missing": Bug(
        "attention_reference", find=" * default_scale(sm_scale, q.shape[-1])", replace="",
        says="scale"),
    "sm_scale_ignored": Bug(
        "attention_reference", find="default_scale(sm_scale, q.shape[-1])",
        replace="default_scale(None, q.shape[-1])", says="sm_scale was ignored"),
    "softmax_over_queries": Bug(
        "attention_reference", find="dim=-1)", replace="dim=-2)", says="over the keys"),
    "k_not_transposed": Bug(
        "attention_reference", find="keys.transpose(-1, -2)", replace="keys", says="transposed"),
    "scores_in_fp16": Bug(  # S computed in the inputs' dtype
        "attention_reference", find="acc = torch.promote_types(q.dtype, torch.float32)",
        replace="acc = q.dtype", says="fp32"),
    "naive_scale_missing": Bug(
        "naive_attention", find="    s.mul_(default_scale(sm_scale, D))\n", replace="", says="scale"),
    "naive_k_not_transposed": Bug(
        "naive_attention", find="batched_gemm_strided(q.float(), k.float(), True)",
        replace="batched_gemm_strided(q.float(), k.float(), False)", says="transposed"),
    "naive_scores_in_fp16": Bug(  # S stored by the GEMM in the inputs' dtype, then converted
        "naive_attention", find="batched_gemm_strided(q.float(), k.float(), True)",
        replace="batched_gemm_strided(q, k, True).float()", says="fp32"),
    "naive_mask_forgotten": Bug(
        "naive_attention",
        find="    if causal:\n        s.masked_fill_(causal_future(Nq, Nk, q.device), float(\"-inf\"))\n",
        replace="", says="causal mask was not applied"),
    "naive_softmax_over_queries": Bug(
        "naive_attention", find="p = softmax(s.view(B * H * Nq, Nk)).view(B, H, Nq, Nk)",
        replace="p = softmax(s.transpose(-1, -2).reshape(B * H * Nk, Nq))"
                ".view(B, H, Nk, Nq).transpose(-1, -2)",
        says="over the keys"),
    "naive_calls_torch": Bug(  # the output GEMM done by PyTorch
        "naive_attention", find="return batched_gemm_strided(p, v.float(), False).to(q.dtype)",
        replace="return (p @ v.float()).to(q.dtype)", says="Triton kernel"),
    "sp_elements_not_bytes": Bug(
        "sp_bytes", find=" * torch.empty((), dtype=dtype).element_size()", replace="",
        says="bytes per element"),
    "sp_one_matrix": Bug(
        "sp_bytes", find="2 * B * H * Nq * Nk", replace="B * H * Nq * Nk", says="both"),
    "naive_traffic_one_pass_over_s_p": Bug(  # S and P written but never read back
        "dram_accesses", find="4 * N * d + 4 * N * N", replace="4 * N * d + 2 * N * N",
        says="written once and read once"),
    "flash_blocks_floored": Bug(
        "dram_accesses", find="2 * N * d * triton.cdiv(N, b)", replace="2 * N * d * (N // b)",
        says="ceil"),
    "flash_kv_counted_once": Bug(  # only one of K and V read per block
        "dram_accesses", find="2 * N * d * triton.cdiv(N, b)", replace="N * d * triton.cdiv(N, b)",
        says="all of K and all of V"),
    "flash_block_from_whole_sram": Bug(
        "dram_accesses", find="b = M // (4 * d)", replace="b = M // (2 * d)", says="half the SRAM"),
}
