"""Classic bugs of module 03 (tiling and batched GEMM)."""
from grader.bugs import Bug

# Test cells whose code calls matmul_tile: a bug planted there may fail them too.
USE_MATMUL_TILE = ("test_matmul", "test_batched_gemm_strided", "test_batched_gemm_ptrs")

BUGS = {
    "k_blocks_overwritten": Bug(
        "tiled_matmul", find="acc += a[", replace="acc = a[", says="acc +="),
    "ragged_tiles_floored": Bug(
        "dram_reads", find="m * k * triton.cdiv(n, tile) + k * n * triton.cdiv(m, tile)",
        replace="m * k * (n // tile) + k * n * (m // tile)", says="ceil",
        also=("test_compare_dispatch",)),
    "missing_load_mask": Bug(
        "matmul_kernel", find="mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)",
        replace=")", says="masked", also=USE_MATMUL_TILE),
    "fp16_accumulation": Bug(
        "matmul_kernel", find="acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        replace="acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=a_ptr.dtype.element_ty)",
        says="fp32", also=USE_MATMUL_TILE),
    "wrapper_calls_torch": Bug(
        "matmul", find="    matmul_kernel[grid](", replace="    return a @ b\n    matmul_kernel[grid](",
        says="Triton kernel"),
    "k_not_transposed": Bug(
        "batched_gemm_strided", find="(sb[3], sb[2]) if b_transposed else (sb[2], sb[3])",
        replace="(sb[2], sb[3])", says="a @ b^T"),
    "batch_head_strides_swapped": Bug(
        "batched_gemm_strided", find="a_ptr += batch * stride_ab + head * stride_ah",
        replace="a_ptr += batch * stride_ah + head * stride_ab", says="strides swapped"),
    "grid_batch_first": Bug(
        "batched_gemm_strided", find="grid = (H, triton.cdiv(M, TILE), B)",
        replace="grid = (B, triton.cdiv(M, TILE), H)", says="(heads, cdiv(M, BLOCK_M), batch)"),
    "pointer_array_not_indexed": Bug(
        "batched_gemm_ptrs", find="tl.load(a_ptrs + pair)", replace="tl.load(a_ptrs)",
        says="used pair 0"),
    "ptrs_grid_too_short": Bug(
        "batched_gemm_ptrs", find="triton.cdiv(max(M for M, _, _ in sizes), TILE)",
        replace="triton.cdiv(sizes[0][0], TILE)", says="largest M"),
}
