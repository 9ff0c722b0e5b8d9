"""Classic bugs of module 03 (tiling and batched GEMM)."""
from grader.bugs import Bug

# Test cells whose code calls matmul_tile: a bug planted there may fail them too.
USE_MATMUL_TILE = ("test_matmul", "test_batched_gemm_strided", "test_batched_gemm_ptrs")

BUGS = {
    "k_blocks_overwritten": Bug(
        "tiled_matmul", find="acc += a[", replace="acc = a[", says="acc +="),
    "tiled_whole_strips": Bug(  # one product per output block: a strip of rows by a strip of columns
        "tiled_matmul",
        find="            for p in range(0, K, tile):\n"
             "                acc += a[i:i + tile, p:p + tile].to(acc_dtype) "
             "@ b[p:p + tile, j:j + tile].to(acc_dtype)",
        replace="            acc += a[i:i + tile].to(acc_dtype) @ b[:, j:j + tile].to(acc_dtype)",
        says="larger than the tile"),
    "tiled_fp16_accumulator": Bug(
        "tiled_matmul", find="acc_dtype = torch.promote_types(a.dtype, torch.float32)",
        replace="acc_dtype = a.dtype", says="fp32"),
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
    "c_strides_ignored": Bug(  # assumes a contiguous C
        "matmul_kernel", find="store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)",
        replace="store_tile(c_ptr, acc, offs_m, offs_n, M, N, N, 1)", says="stride_cm"),
    "a_strides_ignored": Bug(  # assumes a row-major A
        "matmul_kernel", find="offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak",
        replace="offs_m[:, None] * K + offs_k[None, :]", says="stride_am", also=USE_MATMUL_TILE),
    "column_blocks_of_block_m": Bug(
        "matmul_kernel", find="offs_n = tl.program_id(1) * BLOCK_N",
        replace="offs_n = tl.program_id(1) * BLOCK_M", says="BLOCK_N"),
    "wrapper_grid_capped": Bug(  # a grid that covers at most 4 x 4 tiles
        "matmul", find="grid = (triton.cdiv(M, TILE), triton.cdiv(N, TILE))",
        replace="grid = (min(triton.cdiv(M, TILE), 4), min(triton.cdiv(N, TILE), 4))", says="grid"),
    "wrapper_blocks_hardcoded": Bug(  # blocks that disagree with the grid
        "matmul", find="BLOCK_M=TILE, BLOCK_N=TILE, BLOCK_K=TILE_K)",
        replace="BLOCK_M=128, BLOCK_N=128, BLOCK_K=TILE_K)", says="grid"),
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
    "int32_offsets": Bug(
        "batched_gemm_strided",
        find="head = tl.program_id(0).to(tl.int64)  # int64: batch * stride_ab can pass 2**31\n"
             "    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
             "    batch = tl.program_id(2).to(tl.int64)",
        replace="head = tl.program_id(0)\n"
                "    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)\n"
                "    batch = tl.program_id(2)", says="int64"),
    "rows_assumed_contiguous": Bug(  # the wrapper passes K, 1 for a's row and column strides
        "batched_gemm_strided", find="batched_gemm_strided_kernel[grid](a, b, c, M, N, K, *a.stride(),",
        replace="batched_gemm_strided_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), K, 1,",
        says="a.stride()"),
    "views_not_made_contiguous": Bug(
        "batched_gemm_ptrs",
        find="    a_list = [t.contiguous() for t in a_list]\n    b_list = [t.contiguous() for t in b_list]\n",
        replace="", says="contiguous"),
    "pointer_array_not_indexed": Bug(
        "batched_gemm_ptrs", find="tl.load(a_ptrs + pair)", replace="tl.load(a_ptrs)",
        says="used pair 0"),
    "ptrs_grid_too_short": Bug(
        "batched_gemm_ptrs", find="triton.cdiv(max(M for M, _, _ in sizes), TILE)",
        replace="triton.cdiv(sizes[0][0], TILE)", says="largest M"),
}
