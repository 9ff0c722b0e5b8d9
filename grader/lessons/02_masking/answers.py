"""What module 02's visible checks ask the answer key (course/recorded.py; recorded for
the learner's copy by `python -m grader build`): the outputs of the classic mistakes of
safe_softmax and of the masked-softmax kernel, as signatures, by which a failing check names
the slip."""
import torch
import triton

from course.checks.masking import NEG_INF, masked_reference, visible_keys
from grader.answer_key import telling
from solutions.masking import safe_softmax

CHECKS = ("check_safe_softmax", "check_masked_softmax_kernel", "check_masked_softmax")


def safe_softmax_mistakes(scores, dim):
    """Fully masked slices left NaN (a plain softmax); given equal weights 1/N (scores of 0
    there, not zeroed after the softmax)."""
    right = safe_softmax(scores.double(), dim)
    blocked = torch.isneginf(scores).all(dim, keepdim=True)
    return list(telling({"nan": torch.softmax(scores.double(), dim=dim),
                         "uniform": torch.softmax(scores.double().masked_fill(blocked, 0.0), dim=dim)},
                        right).values())


def kernel_mistakes(scores, causal, lengths):
    """{name: signature} of the classic bugs of a masked softmax on scores [B, M, N] (or
    [M, N], one batch entry), as the check names them: the mask inverted (where it masks
    anything), the causal mask strict, the padding on the queries, fully masked rows left
    NaN, the padding lanes of the block loaded as 0, no max subtracted, and (below float32)
    the exps summed in the scores' dtype."""
    x = scores if scores.dim() == 3 else scores[None]
    _, M, N = x.shape
    visible = visible_keys(M, N, causal=causal, lengths=lengths, device=x.device)
    wrong = {}
    if not visible.all():
        wrong["polarity"] = masked_reference(x, ~visible)
    if causal:
        wrong["strict_causal"] = masked_reference(
            x, visible_keys(M, N, causal=True, lengths=lengths, strict=True, device=x.device))
    if lengths is not None:
        wrong["queries_padded"] = masked_reference(
            x, visible_keys(M, N, causal=causal, lengths=lengths, pad_queries=True, device=x.device))
    wrong["nan_rows"] = torch.softmax(x.double().masked_fill(~visible, NEG_INF), dim=-1)
    block = triton.next_power_of_2(N)
    padded = torch.cat([x.double(), x.new_zeros(*x.shape[:2], block - N).double()], -1)
    wrong["other_zero"] = masked_reference(
        padded, visible_keys(M, block, causal=causal, lengths=lengths, device=x.device))[..., :N]
    e = torch.exp(x.float().masked_fill(~visible, NEG_INF))
    total = e.sum(-1, keepdim=True)
    wrong["no_max"] = e / total.masked_fill(total == 0, 1.0)
    if x.dtype != torch.float32:
        s = x.double().masked_fill(~visible, NEG_INF)
        top = s.amax(-1, keepdim=True)
        e = torch.exp(s - top.masked_fill(top == NEG_INF, 0.0)).to(x.dtype).double()
        total = e.sum(-1, keepdim=True).to(x.dtype).double()
        wrong["half_sum"] = e / total.masked_fill(total == 0, 1.0)
    right = masked_reference(x, visible).reshape(scores.shape)
    return telling({name: w.to(torch.float64).reshape(scores.shape) for name, w in wrong.items()}, right)
