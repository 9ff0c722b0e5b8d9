"""Classic bugs of module 05 (FlashAttention forward)."""
from grader.bugs import Bug

KERNEL_USERS = ("test_flash_attention",)  # the wrapper launches the kernel: it fails too

BUGS = {
    # flash_grid
    "grid_floor_division": Bug(
        "flash_grid", find="triton.cdiv(seq_len, block_q)", replace="seq_len // block_q",
        says="cdiv", also=KERNEL_USERS),
    "grid_axes_swapped": Bug(
        "flash_grid", find="return (triton.cdiv(seq_len, block_q), batch * heads, 1)",
        replace="return (batch * heads, triton.cdiv(seq_len, block_q), 1)", says="axis 0",
        also=KERNEL_USERS),
    # flash_attention_blocked
    "blocked_acc_not_rescaled": Bug(
        "flash_attention_blocked", find="acc = acc * alpha[..., None] + p @ v",
        replace="acc = acc + p @ v", says="alpha"),
    "blocked_max_replaced_first": Bug(  # the outline's order: alpha is always 1
        "flash_attention_blocked", find="alpha = torch.exp(m - m_new)",
        replace="m = m_new\n            alpha = torch.exp(m - m_new)", says="before m becomes m_new"),
    "blocked_no_division": Bug(
        "flash_attention_blocked", find="= acc / l[..., None]", replace="= acc", says="division"),
    "blocked_whole_rows": Bug(  # S for every key at once, then the blocks
        "flash_attention_blocked",
        find="s = qb @ k[:, :, ks:ks + block_k].transpose(-1, -2) * scale",
        replace="s = (qb @ k.transpose(-1, -2) * scale)[..., ks:ks + block_k]", says="block"),
    "blocked_causal_ignored": Bug(
        "flash_attention_blocked", find="if causal:\n                cols",
        replace="if False:\n                cols", says="causal"),
    # flash_attention_kernel
    "k_not_transposed": Bug(
        "flash_attention_kernel",
        find="kT = tl.load(kT_base + cols[None, :] * stride_kn,",
        replace="kT = tl.load(K + b * stride_kb + h_kv * stride_kh + offs_d[:, None] * stride_kn"
                " + cols[None, :] * stride_kd,",
        says="transpose", also=KERNEL_USERS),
    "scale_twice": Bug(
        "flash_attention_kernel", find="input_precision=DOT_PRECISION) * qk_scale",
        replace="input_precision=DOT_PRECISION) * qk_scale * qk_scale", says="twice",
        also=KERNEL_USERS),
    "scale_missing": Bug(
        "flash_attention_kernel", find="input_precision=DOT_PRECISION) * qk_scale",
        replace="input_precision=DOT_PRECISION)", says="scale", also=KERNEL_USERS),
    "fp16_accumulator": Bug(  # acc rounded to the inputs' dtype after every block
        "flash_attention_kernel", find="acc * alpha[:, None], input_precision=DOT_PRECISION)",
        replace="acc * alpha[:, None], input_precision=DOT_PRECISION).to(v.dtype)", says="fp32",
        also=KERNEL_USERS),
    "acc_not_rescaled": Bug(
        "flash_attention_kernel", find="acc * alpha[:, None],", replace="acc,", says="alpha",
        also=KERNEL_USERS),
    "alpha_after_max": Bug(
        "flash_attention_kernel", find="alpha = tl.exp2(m_i - m_new)",
        replace="alpha = tl.exp2(m_new - m_new)", says="before m becomes m_new", also=KERNEL_USERS),
    "no_final_division": Bug(
        "flash_attention_kernel", find="acc = acc / l_i[:, None]", replace="acc = acc",
        says="division", also=KERNEL_USERS),
    "exp_instead_of_exp2": Bug(
        "flash_attention_kernel", find="p = tl.exp2(s - m_new[:, None])",
        replace="p = tl.exp(s - m_new[:, None])", says="exp2", also=KERNEL_USERS),
    "lse_base_2": Bug(
        "flash_attention_kernel", find="(m_i + tl.log2(l_i)) * LN2", replace="(m_i + tl.log2(l_i))",
        says="base 2", also=KERNEL_USERS),
    "no_key_tail_mask": Bug(  # the K loads stay masked: tail keys score 0, not -inf
        "flash_attention_kernel", find="valid = cols[None, :] < N_K  #",
        replace="valid = cols[None, :] >= 0  #", says="tail", also=KERNEL_USERS),
    "running_max_not_updated": Bug(
        "flash_attention_kernel", find="        m_i = m_new\n", replace="",
        says="running max was never updated", also=KERNEL_USERS),
    "max_starts_at_zero": Bug(
        "flash_attention_kernel", find='m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)',
        replace="m_i = tl.zeros([BLOCK_Q], tl.float32)", says="-inf", also=KERNEL_USERS),
    "batch_offset_from_pair": Bug(  # (b*H + h) * stride_h: right for contiguous tensors only
        "flash_attention_kernel", find="q_ptrs = (Q + b * stride_qb + h * stride_qh",
        replace="q_ptrs = (Q + pid_bh * stride_qh", says="stride_qb", also=KERNEL_USERS),
    "scores_in_fp16": Bug(  # S rounded to the inputs' dtype: Q.K overflows fp16
        "flash_attention_kernel", find="s = tl.dot(q, kT, input_precision=DOT_PRECISION) * qk_scale",
        replace="s = tl.dot(q, kT, input_precision=DOT_PRECISION).to(Q.dtype.element_ty) * qk_scale",
        says="fp32", also=KERNEL_USERS),
    "causal_diagonal_hidden": Bug(
        "flash_attention_kernel", find="cols[None, :] <= offs_q[:, None]",
        replace="cols[None, :] < offs_q[:, None]", says="diagonal", also=KERNEL_USERS),
    # flash_attention (the wrapper)
    "grid_over_block_k": Bug(
        "flash_attention", find="flash_grid(Nq, B, H, block_q)", replace="flash_grid(Nq, B, H, block_k)",
        says="BLOCK_Q"),
    "lse_in_input_dtype": Bug(
        "flash_attention", find="lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)",
        replace="lse = torch.empty(B, H, Nq, device=q.device, dtype=q.dtype)", says="float32"),
    "sm_scale_ignored": Bug(
        "flash_attention", find="scale = default_scale(sm_scale, D)", replace="scale = default_scale(None, D)",
        says="sm_scale"),
    "blocks_not_honoured": Bug(
        "flash_attention", find="block_q, block_k = block_q or 32, block_k or 32",
        replace="block_q, block_k = 32, 32", says="block_q"),
}
