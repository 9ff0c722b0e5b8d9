"""Classic bugs of module 07 (block sizes and tuning)."""
from grader.bugs import Bug

PRUNE = ("test_prune_configs",)  # prune_configs calls smem_bytes: a bug there fails it too

BUGS = {
    # check_block_config
    "sub_block_checked_by_size": Bug(  # a sub-block no larger than its block is accepted
        "check_block_config", find="if block % wanted:", replace="if wanted > block:",
        says="must divide its block"),
    "sub_blocks_before_shrinking": Bug(  # rule 2 looks at the blocks as given
        "check_block_config", find="block, wanted = adjusted[parent], adjusted[sub]",
        replace="block, wanted = blocks[parent], adjusted[sub]", says="after rule 1"),
    "padded_to_the_kv_block": Bug(
        "check_block_config", find='(("q_len", "block_q"), ("kv_len", "block_kv"))',
        replace='(("q_len", "block_kv"), ("kv_len", "block_kv"))', says="its own block"),
    "padded_down": Bug(
        "check_block_config",
        find="padded = triton.cdiv(adjusted[length], adjusted[block]) * adjusted[block]",
        replace="padded = adjusted[length] // adjusted[block] * adjusted[block]", says="rounds up"),
    "block_shrunk_to_the_raw_length": Bug(  # 77 keys -> a block of 77, not a multiple of 16
        "check_block_config", find="kv_room = triton.cdiv(kv_len, MIN_BLOCK) * MIN_BLOCK",
        replace="kv_room = kv_len", says="multiples of 16"),
    "kv_block_fitted_to_queries": Bug(  # self-attention assumed: cross-attention's KV ignored
        "check_block_config", find="kv_room = triton.cdiv(kv_len, MIN_BLOCK) * MIN_BLOCK",
        replace="kv_room = triton.cdiv(q_len, MIN_BLOCK) * MIN_BLOCK", says="fitted to q_len"),
    "padding_not_logged": Bug(
        "check_block_config",
        find='log.append(f"{length}: {adjusted[length]} -> {padded}: "\n'
             '                       f"padded to a multiple of {block} = {adjusted[block]}")',
        replace="pass", says="every change gets one log line"),
    "reason_without_the_block": Bug(
        "check_block_config", find="must divide {parent} = {block}", replace="must divide its block",
        says="should say why"),
    "inputs_not_checked": Bug(
        "check_block_config", find="    check_block_inputs(blocks, q_len, kv_len)\n", replace="",
        says="check the inputs"),
    # smem_bytes
    "stages_ignored": Bug(
        "smem_bytes", find="(block_q + 2 * stages * block_kv)", replace="(block_q + 2 * block_kv)",
        says="once per pipeline stage", also=PRUNE),
    "one_tile_per_stage": Bug(  # K counted per stage, V forgotten
        "smem_bytes", find="2 * stages * block_kv", replace="stages * block_kv",
        says="a K tile and a V tile", also=PRUNE),
    "q_tile_per_stage": Bug(
        "smem_bytes", find="return (block_q + 2 * stages * block_kv) * block_d * element",
        replace="return stages * (block_q + 2 * block_kv) * block_d * element",
        says="held for the whole loop", also=PRUNE),
    "elements_not_bytes": Bug(
        "smem_bytes", find=") * block_d * element", replace=") * block_d", says="elements, not bytes",
        also=PRUNE),
    "head_dim_not_padded": Bug(
        "smem_bytes", find="block_d = max(MIN_BLOCK, triton.next_power_of_2(head_dim))",
        replace="block_d = head_dim", says="not padded", also=PRUNE),
    "zero_stages_accepted": Bug(
        "smem_bytes", find="if stages < 1:", replace="if stages < 0:", says="accepted stages = 0"),
    # prune_configs
    "strict_limit": Bug(
        "prune_configs", find=") <= limit]", replace=") < limit]", says="exactly the limit fits"),
    "sm_capacity_as_limit": Bug(  # the SM's 228 KiB, not what one program may use
        "prune_configs", find="limit = smem_limit()", replace="limit = 228 * 1024",
        says="1 KiB the driver keeps"),
    "warps_as_stages": Bug(
        "prune_configs", find="head_dim, dtype, config[3])", replace="head_dim, dtype, config[2])",
        says="num_stages, the 4th entry"),
    "sorted_by_shape": Bug(
        "prune_configs",
        find="return [config for config in configs\n"
             "            if smem_bytes(config[0], config[1], head_dim, dtype, config[3]) <= limit]",
        replace="return sorted(config for config in configs\n"
                "            if smem_bytes(config[0], config[1], head_dim, dtype, config[3]) <= limit)",
        says="in another order"),
    # the predictions
    "fastest_is_the_largest_tile": Bug(
        "fastest", find='fastest_answer = "c"', replace='fastest_answer = "b"',
        says="another configuration ran faster"),
    "why_intensity_alone": Bug(
        "why", find='why_answer = "b"', replace='why_answer = "c"', says="ignores the others"),
    # kernel_dram_bytes
    "dram_elements_not_bytes": Bug(
        "kernel_dram_bytes", find="flash_dram_accesses(N, D, 4 * D * block_q) * element",
        replace="flash_dram_accesses(N, D, 4 * D * block_q)", says="elements, not bytes"),
    "lse_left_out": Bug(
        "kernel_dram_bytes", find=" * element + 4 * N", replace=" * element",
        says="LSE was left out"),
    "lse_in_the_inputs_dtype": Bug(
        "kernel_dram_bytes", find=" * element + 4 * N", replace=" * element + element * N",
        says="it is fp32, 4 bytes per row"),
    "one_head_counted": Bug(
        "kernel_dram_bytes", find="return B * H * per_head", replace="return per_head",
        says="every one of the B x H heads"),
    "sram_size_as_block": Bug(  # module 04's M is an SRAM size, not a block of rows
        "kernel_dram_bytes", find="flash_dram_accesses(N, D, 4 * D * block_q)",
        replace="flash_dram_accesses(N, D, block_q)", says="M = 4 * D * block_q"),
}
