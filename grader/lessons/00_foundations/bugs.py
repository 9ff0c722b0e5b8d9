"""Classic wrong answers of module 00 (the foundations quiz): each loses its question."""
from grader.bugs import Bug

BUGS = {
    "l2_without_sqrt": Bug(
        "q01_l2_norm", find="torch.linalg.vector_norm(torch.tensor([3.0, 4.0])).item()",
        replace="torch.tensor([3.0, 4.0]).pow(2).sum().item()", says="square root"),
    "dot_mismatched_entries": Bug(
        "q02_dot", find="torch.dot(u, v)", replace="torch.dot(u, v.flip(0))", says="matching"),
    "matmul_elementwise": Bug(
        "q03_matmul", find="a @ b", replace="a * b", says="elementwise"),
    "softmax_wrong_dim": Bug(
        "q04_softmax", find="torch.softmax(x, dim=1)", replace="torch.softmax(x, dim=0)",
        says="row"),
    "attention_softmax_over_queries": Bug(
        "q04_softmax", find="q04_attention_dim = 1", replace="q04_attention_dim = 0",
        says="query"),
    "sram_dram_swapped": Bug(
        "q05_sram_vs_dram", find='"b"', replace='"a"', says="compute units"),
    "max_subtraction_for_speed": Bug(
        "q06_subtract_max", find='"b"', replace='"c"', says="exp(1000)"),
    "tiling_cuts_flops": Bug(
        "q07_tiling", find='"b"', replace='"c"', says="slow"),
    "causal_mask_transposed": Bug(
        "q08_causal", find="triu(1)", replace="tril(-1)", says="diagonal"),
    "causal_mask_blocks_diagonal": Bug(
        "q08_causal", find="triu(1)", replace="triu(0)", says="attend to nothing"),
    "masked_fill_polarity_inverted": Bug(
        "q09_masked_softmax", find="mask.bool()", replace="mask == 0", says="polarity"),
    "masked_fill_with_zero": Bug(
        "q09_masked_softmax", find='float("-inf")', replace="0.0", says="-inf"),
    "masked_fill_large_negative": Bug(
        "q09_masked_softmax", find='float("-inf")', replace="-1e9", says="very negative"),
    "masked_softmax_without_max": Bug(  # exp of the scores as they are, then normalized
        "q09_masked_softmax",
        find='torch.softmax(scores.masked_fill(mask.bool(), float("-inf")), dim=-1)',
        replace='(lambda e: e / e.sum(-1, keepdim=True))(scores.masked_fill(mask.bool(), '
                'float("-inf")).exp())',
        says="overflow"),
    "fusion_one_trip_per_matrix": Bug(
        "q10_fusion", find="4 * 1024", replace="2 * 1024", says="two trips"),
    "fp16_everywhere": Bug(
        "q11_low_precision", find='"c"', replace='"a"', says="rounding"),
}
