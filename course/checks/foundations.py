"""Visible checks of module 00 (the foundations quiz).

They check the FORM of an answer (a letter, a number, a tensor of the right shape) so
that a typo is caught at once, then say right or not yet by comparing with a sealed
answer (course/quiz.py), and show the question's explanation once the answer is right.
They never reveal the answer; the grade comes from the hidden tests.
"""
import math

import torch

from course.quiz import judge
from course.testing import check_choice, fail  # noqa: F401  (check_choice: used by the lesson)

def _number(value, name):
    """A real number from an int, a float or a one-element tensor; fails otherwise."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(f"{name} should be a number (an int, a float or a one-element tensor), "
             f"got {type(value).__name__}"
             + (": did you put quotes around it?" if isinstance(value, str) else ""))
    if not math.isfinite(value):
        fail(f"{name} is {value}: a finite number is expected")
    return float(value)


def _tensor(value, name, shape):
    if not isinstance(value, torch.Tensor):
        fail(f"{name} should be a torch.Tensor, got {type(value).__name__}")
    if tuple(value.shape) != tuple(shape):
        fail(f"{name} has shape {list(value.shape)}, expected {list(shape)}")
    if not value.is_floating_point():
        fail(f"{name} has dtype {value.dtype}; use floats (e.g. torch.tensor([1.0, 2.0]))")
    return value


def _sums_to_one(t, dim, name, what):
    if torch.isnan(t).any():
        fail(f"{name} has NaN: a softmax of finite scores never does "
             "(is a whole row blocked, or did an exp overflow?)")
    if (t < 0).any():
        fail(f"{name} has negative entries: softmax weights are exp(...) / sum, never negative")
    sums = t.sum(dim=dim)
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
        fail(f"{name}: {what} should sum to 1 after a softmax, but they sum to "
             f"{[round(float(s), 4) for s in sums.flatten()]}")


def check_q01_l2_norm(value):
    if not judge("q01_l2_norm", _number(value, "q01_l2_norm")):
        print("ok  q01_l2_norm: a number")


def check_q02_dot(value):
    if not judge("q02_dot", _number(value, "q02_dot")):
        print("ok  q02_dot: a number")


def check_q03_matmul(value):
    if not judge("q03_matmul", _tensor(value, "q03_matmul", (2, 2))):
        print("ok  q03_matmul: a 2x2 float tensor")


def check_q04_softmax(softmax_123, softmax_dim0, softmax_dim1, attention_dim):
    _sums_to_one(_tensor(softmax_123, "q04_softmax_123", (3,)), 0, "q04_softmax_123",
                 "the 3 entries")
    for name, t in (("q04_softmax_dim0", softmax_dim0), ("q04_softmax_dim1", softmax_dim1)):
        _tensor(t, name, (2, 3))
        if torch.isnan(t).any() or (t < 0).any() or (t > 1).any():
            fail(f"{name} should hold softmax weights, each between 0 and 1")
    if isinstance(attention_dim, bool) or not isinstance(attention_dim, int):
        fail(f"q04_attention_dim should be an int (a dimension index), "
             f"got {type(attention_dim).__name__}")
    if attention_dim not in (0, 1, -1, -2):
        fail(f"q04_attention_dim is {attention_dim}: a 2-D tensor has dims 0 and 1 "
             "(or -2 and -1 counted from the end)")
    if not judge("q04_softmax", (softmax_123, softmax_dim0, softmax_dim1, attention_dim % 2)):
        print("ok  q04: three softmax tensors of the right shapes and a dimension index")


def check_q08_causal(mask, weights):
    _tensor(mask, "q08_causal_mask", (4, 4))
    if not bool(((mask == 0) | torch.isneginf(mask)).all()):
        fail("q08_causal_mask should hold only 0 (may attend) and -inf (blocked): it is "
             "ADDED to the scores, so -inf makes exp(score) = 0 and 0 leaves a score as is")
    for row in range(4):
        if bool(torch.isneginf(mask[row]).all()):
            fail(f"row {row} of q08_causal_mask is -inf everywhere: query {row} could attend "
                 "to nothing, and the softmax of a row of -inf is NaN (0 / 0). Which keys "
                 "may every query see?")
    _sums_to_one(_tensor(weights, "q08_causal_weights", (4, 4)), -1, "q08_causal_weights",
                 "the rows (one per query)")
    if not judge("q08_causal", (mask, weights)):
        print("ok  q08: an additive 4x4 mask of 0 / -inf, and 4x4 weights whose rows sum to 1")


def _q09_form(fn, scores, mask, what):
    """Run q09_masked_softmax on one case and check the form of its answer only."""
    name = f"q09_masked_softmax(scores, mask) on {what}"
    try:
        out = fn(scores, mask)
    except RuntimeError as error:
        if "bool" in str(error).lower():
            fail("masked_fill needs a boolean mask, and this mask holds the integers 0 and 1: "
                 f"convert it to bool first (torch said: {error})")
        raise
    if out is None:
        fail("q09_masked_softmax returned None: did you forget a `return`?")
    _sums_to_one(_tensor(out, name, tuple(scores.shape)), -1, name, "the rows")
    return out


def check_q09_masked_softmax(fn):
    scores = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0], [3.0, 0.0, -2.0, 1.0]])
    mask = torch.tensor([[0, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 1]])
    small = _q09_form(fn, scores, mask, "small scores")
    # Scores far below zero in a slice of longer rows, far above zero as a transposed view,
    # with a uint8 mask: any finite scores, any layout and any 0/1 integer mask must work.
    extreme = torch.tensor([[1e4, 1e4 + 3.0, 1e4 - 2.0, 0.0], [2e30, 1e30, 1.5e30, 0.0]])
    extreme_mask = torch.tensor([[1, 0, 0], [0, 1, 0]], dtype=torch.uint8)
    negative = _q09_form(fn, (-extreme)[:, :3], extreme_mask, "very negative scores (a slice of longer rows)")
    large = _q09_form(fn, extreme[:, :3].t().contiguous().t(), extreme_mask.t().contiguous().t(),
                      "very large scores (a transposed view)")
    if not judge("q09_masked_softmax", (small, negative, large)):
        print("ok  q09_masked_softmax: runs, weights of the scores' shape whose rows sum to 1, "
              "for small and for very large or very negative scores")


def check_q10_fusion(value):
    value = _number(value, "q10_fusion_bytes_saved")
    if value <= 0:
        fail("q10_fusion_bytes_saved should be a positive number of bytes")
    if not judge("q10_fusion_bytes_saved", value):
        print("ok  q10_fusion_bytes_saved: a positive number (of bytes)")
