"""What module 05's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`): the launch grid, and the outputs of the
FlashAttention loop's classic mistakes (as signatures), by which a failing check names
the slip."""
import math

import torch
import triton

from course.checks.flash_forward import (BLOCKED_GPU_CASES, GPU_BLOCKS, KERNEL_GPU_CASES, LN2,
                                         LOG2E, WRAPPER_CASES, WRAPPER_GPU_CASES, _future,
                                         attention_inputs, mistake_questions, reference)
from grader.answer_key import signatures
from solutions.flash_forward import flash_grid  # noqa: F401 (asked by name)

# How module 04 records a tensor's classic mistakes (told apart from one another too).

CHECKS = ("check_flash_grid", "check_flash_attention_blocked", "check_flash_attention_kernel",
          "check_flash_attention")


def _questions(shape, options, blocks, **kinds):
    """What a check's comparison asks for one of its cases, run with these blocks."""
    B, H, Nq, Nk, D, dtype = shape[:6]
    q, k, v = attention_inputs(B, H, Nq, Nk, D, dtype, seed=options["seed"],
                               kind=options.get("kind", "random"),
                               layouts=options.get("layouts", ("contiguous",) * 3))
    scale = 1.0 / math.sqrt(D) if options.get("sm_scale") is None else options["sm_scale"]
    return mistake_questions(q, k, v, blocks, scale, options.get("causal", False), **kinds)


def _gpu_questions():
    """The GPU's cases, and the wrapper's on a GPU's default blocks."""
    for shape, options in BLOCKED_GPU_CASES:
        yield from _questions(shape, options, shape[6:], base2=False, lse=False)
    for shape, options in KERNEL_GPU_CASES:
        yield from _questions(shape, options, options["blocks"])
    for shape, options in [case for case in WRAPPER_CASES if "blocks" not in case[1]] + WRAPPER_GPU_CASES:
        yield from _questions(shape, options, options.get("blocks", GPU_BLOCKS))


# The table is recorded on a CPU. A generator: its inputs are made only when a table is
# recorded, not each time the grader loads this file to compute an answer.
EXTRA = _gpu_questions()


def flash_grid_mistakes(seq_len, batch, heads, block_q):
    """The grids of the classic slips, in the order of the check's descriptions: floored
    query blocks, axes swapped, batch and heads on two axes, one program per query."""
    blocks = triton.cdiv(seq_len, block_q)
    return [(seq_len // block_q, batch * heads, 1), (batch * heads, blocks, 1), (blocks, batch, heads),
            (seq_len, batch * heads, 1)]


# ---------------------------------------------------------------------------------------
# The loop's classic mistakes

def _f64(t):
    return t.detach().to(torch.float64)


def online(q, k, v, block_q, block_k, scale, causal, *, base2=True, p_exp=None, alpha_exp=None,
           rescale_acc=True, rescale_l=True, alpha_one=False, update_m=True, divide=True,
           m_start=float("-inf"), dtype=torch.float64):
    """FlashAttention's loop in float64, with switches for the classic mistakes. Scores are
    in base 2 (times log2 e, with exp2) when base2, else natural (with exp); p_exp and
    alpha_exp override the exponential of p and of alpha ("exp" or "exp2"); dtype is the
    precision of the statistics (float32 shows what underflows in a kernel). Every query
    block runs at once, key block by key block: causal, a query block stops after the key
    block its last row reaches (the rows of the blocks that stopped keep their state)."""
    q, k, v = (_f64(t).to(dtype) for t in (q, k, v))
    Nq, Nk = q.shape[2], k.shape[2]
    exps = {"exp": torch.exp, "exp2": torch.exp2}
    default = "exp2" if base2 else "exp"
    exp_p, exp_alpha = exps[p_exp or default], exps[alpha_exp or default]
    s_all = q @ k.transpose(-1, -2) * (scale * (LOG2E if base2 else 1.0))
    if causal:
        s_all = s_all.masked_fill(_future(Nq, Nk, s_all.device), float("-inf"))
    block_end = (torch.arange(Nq, device=q.device) // block_q + 1) * block_q  # of each row's block
    m = torch.full(s_all.shape[:3], m_start, dtype=dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros_like(q)
    for ks in range(0, Nk, block_k):
        s = s_all[..., ks:ks + block_k]
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.ones_like(m) if alpha_one else exp_alpha(m - m_new)
        p = exp_p(s - m_new[..., None])
        runs = block_end > ks if causal else torch.ones_like(block_end, dtype=torch.bool)
        l = torch.where(runs, (l * alpha if rescale_l else l) + p.sum(-1), l)
        acc = torch.where(runs[:, None], (acc * alpha[..., None] if rescale_acc else acc)
                          + p @ v[:, :, ks:ks + block_k], acc)
        if update_m:
            m = torch.where(runs, m_new, m)
    return acc / l[..., None] if divide else acc


def _batch_as_heads(x, strides):
    """x [B, H, N, D], stored with these strides, as read with the batch offset
    (b * H + h) * stride_h (entries outside x's own NaN, as the guards around it are);
    None where that offset is right: B == 1 or a batch stride of H * stride_h."""
    B, H = x.shape[:2]
    if B == 1 or strides[0] == H * strides[1]:
        return None
    wrong = [H * strides[1], *strides[1:]]
    size = 1 + max(sum((n - 1) * step for n, step in zip(x.shape, st)) for st in (strides, wrong))
    memory = torch.full((size,), float("nan"), dtype=torch.float64, device=x.device)
    memory.as_strided(x.shape, strides).copy_(x)
    return memory.as_strided(x.shape, wrong)


def loop_outputs(q, k, v, block_q, block_k, scale, causal, base2, strides):
    """{mistake: O} of the classic mistakes of this module's loop that these inputs can
    show (base2: the kernel, in base 2 with exp2; else flash_attention_blocked, natural
    with exp), keyed as the check's _loop_mistakes describes them; strides: those of q, k
    and v, which a batch offset's mistake reads through."""
    Nq, Nk, D = q.shape[2], k.shape[2], q.shape[3]

    def ref(sc=scale, c=causal, qkv=(q, k, v)):
        return reference(*qkv, c, sc)[0]

    def variant(**switches):
        return online(q, k, v, block_q, block_k, scale, causal, base2=base2, **switches)

    def masked(s, diagonal=1):
        return s.masked_fill(_future(Nq, Nk, s.device, diagonal), float("-inf")) if causal else s

    found = {}
    if Nk == D:  # K's [Nk, D] matrix used as if it were K^T [D, Nk]
        found["k_not_transposed"] = torch.softmax(masked(_f64(q) @ _f64(k) * scale), -1) @ _f64(v)
    found["acc_not_rescaled"] = variant(rescale_acc=False)
    found["l_not_rescaled"] = variant(rescale_l=False)
    found["alpha_one"] = variant(alpha_one=True)
    found["max_not_updated"] = variant(update_m=False)
    found["no_division"] = variant(divide=False)
    found["max_from_zero"] = variant(m_start=0.0, dtype=torch.float32)
    if Nk % block_k:
        pad = triton.cdiv(Nk, block_k) * block_k - Nk
        zeros = torch.zeros(*k.shape[:2], pad, D, dtype=torch.float64, device=k.device)
        found["tail_counted"] = ref(qkv=(q, torch.cat([_f64(k), zeros], 2), torch.cat([_f64(v), zeros], 2)))
    if base2:
        found["p_exp"] = variant(p_exp="exp")
        found["alpha_exp"] = variant(alpha_exp="exp")
        found["exp_not_exp2"] = ref(scale * LOG2E)
        found["sm_scale_only"] = ref(scale * LN2)
        found["qk_scale_missing"] = ref(LN2)
        found["qk_scale_twice"] = ref(scale * scale * LOG2E)
    found["scale_missing"] = ref(1.0)
    found["scale_twice"] = ref(scale * scale)
    if causal:
        found["mask_missing"] = ref(c=False)
        found["diagonal_hidden"] = torch.softmax(masked(_f64(q) @ _f64(k).transpose(-1, -2) * scale, 0),
                                                 -1) @ _f64(v)
    else:
        found["mask_applied"] = ref(c=True)
    for i, which in enumerate("qkv"):
        seen = _batch_as_heads(_f64((q, k, v)[i]), strides[i])
        if seen is not None:
            found[f"{which}_batch_as_heads"] = ref(qkv=tuple(seen if j == i else t for j, t in enumerate((q, k, v))))
    return found


def kernel_mistakes(q, k, v, block_q, block_k, scale, causal, base2, strides):
    """{mistake: signature of its O} (see loop_outputs)."""
    return signatures(loop_outputs(q, k, v, block_q, block_k, scale, causal, base2, strides),
                      reference(q, k, v, causal, scale)[0])


def lse_outputs(q, k, scale, causal):
    """{mistake: LSE} of the classic slips of the kernel's base-2 statistics, keyed as the
    check's _LSE_MISTAKES describes them."""
    s = _f64(q) @ _f64(k).transpose(-1, -2) * (scale * LOG2E)  # base 2, as in the kernel
    if causal:
        s = s.masked_fill(_future(s.shape[-2], s.shape[-1], s.device), float("-inf"))
    m = s.amax(-1)
    l = torch.exp2(s - m[..., None]).sum(-1)
    return {"base_2": m + torch.log2(l), "mixed_bases": m + torch.log(l), "max_only": m * LN2,
            "minus_inf": torch.full_like(m, float("-inf"))}


def lse_mistakes(q, k, scale, causal):
    """{mistake: signature of its LSE} (see lse_outputs)."""
    return signatures(lse_outputs(q, k, scale, causal), reference(q, k, k, causal, scale)[1])
