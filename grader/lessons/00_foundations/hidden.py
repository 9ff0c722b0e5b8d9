"""Hidden tests of module 00 (the foundations quiz), run only at autograde.

Each test decides whether one answer is right. A failure message explains the idea the
question is about (and names a classic mistake when the answer matches one); it never
quotes this file, which the learner does not see.
"""
import math

import torch

from course.testing import fail
from solutions import foundations as key

_CHOICE_HINTS = {
    "q05_sram_vs_dram": "think about where each memory sits relative to the compute units "
                        "(on the chip inside each SM, or off the chip), and which one is "
                        "small and which one is large",
    "q06_subtract_max": "think about what exp(1000) is in float32, and whether softmax(x - c) "
                        "differs from softmax(x) for a constant c",
    "q07_tiling": "think about which memory is slow, and how many times each input element "
                  "of a matrix product is used",
    "q11_low_precision": "think about bytes per element, tensor-core throughput, and where "
                         "rounding errors add up over many terms (sums, running statistics)",
}


def _number(value, name):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(f"{name} should be a finite number")
    return float(value)


def _tensor(value, name, shape):
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(shape):
        fail(f"{name} should be a tensor of shape {list(shape)}")
    return value.detach().to("cpu", torch.float64)


def _close(actual, expected):
    return bool(torch.allclose(actual, expected, atol=1e-4, rtol=1e-4))


def _choice(answer, name):
    if not isinstance(answer, str) or answer.strip().lower() not in ("a", "b", "c", "d"):
        fail(f'{name} should be one letter, "a" to "d"')
    if answer.strip().lower() != getattr(key, name):
        fail(f"{name} is not the right choice: {_CHOICE_HINTS[name]}.")
    print(f"ok  {name}: right")


def test_q01_l2_norm(value):
    value = _number(value, "q01_l2_norm")
    if math.isclose(value, 25.0):
        fail("q01_l2_norm is the sum of squares: the L2 norm is its square root.")
    if math.isclose(value, 7.0):
        fail("q01_l2_norm is the L1 norm (the sum of absolute values): the L2 norm is the "
             "square root of the sum of squares.")
    if not math.isclose(value, key.q01_l2_norm, rel_tol=1e-5):
        fail("q01_l2_norm is not right: the L2 norm is the square root of the sum of squares, "
             "the length of the arrow from the origin to the point (3, 4).")
    print("ok  q01_l2_norm: right")


def test_q02_dot(value):
    value = _number(value, "q02_dot")
    if not math.isclose(value, key.q02_dot, rel_tol=1e-5):
        fail("q02_dot is not right: a dot product multiplies matching entries (first with "
             "first, second with second, ...) and adds up the products.")
    print("ok  q02_dot: right")


def test_q03_matmul(value):
    got = _tensor(value, "q03_matmul", (2, 2))
    a, b = key.a.double(), key.b.double()
    if _close(got, a * b):
        fail("q03_matmul is the elementwise product: in a matrix product, entry (i, j) is "
             "the dot product of row i of a with column j of b.")
    if _close(got, b @ a):
        fail("q03_matmul is b times a: the order of a matrix product matters; entry (i, j) "
             "of a @ b takes row i of a and column j of b.")
    if not _close(got, a @ b):
        fail("q03_matmul is not right: entry (i, j) is the dot product of row i of a with "
             "column j of b.")
    print("ok  q03_matmul: right")


def test_q04_softmax(softmax_123, softmax_dim0, softmax_dim1, attention_dim):
    v = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    if not _close(_tensor(softmax_123, "q04_softmax_123", (3,)), v.exp() / v.exp().sum()):
        fail("q04_softmax_123 is not right: exponentiate each entry, then divide by the sum "
             "of the exponentials, so that the weights are positive and sum to 1.")
    x = key.x.double()
    along0, along1 = torch.softmax(x, dim=0), torch.softmax(x, dim=1)
    got0 = _tensor(softmax_dim0, "q04_softmax_dim0", (2, 3))
    got1 = _tensor(softmax_dim1, "q04_softmax_dim1", (2, 3))
    if _close(got0, along1):
        fail("q04_softmax_dim0 normalizes each row: dim=0 runs DOWN the rows, so with dim=0 "
             "each column (its 2 entries) sums to 1.")
    if not _close(got0, along0):
        fail("q04_softmax_dim0 is not right: dim=0 is the dimension of size 2, so each "
             "column of x is one softmax and sums to 1.")
    if _close(got1, along0):
        fail("q04_softmax_dim1 normalizes each column: dim=1 runs ACROSS a row, so with "
             "dim=1 each row (its 3 entries) sums to 1.")
    if not _close(got1, along1):
        fail("q04_softmax_dim1 is not right: dim=1 is the dimension of size 3, so each row "
             "of x is one softmax and sums to 1.")
    if isinstance(attention_dim, bool) or attention_dim not in (1, -1):
        fail("q04_attention_dim is not right: a score matrix has one row per query and one "
             "column per key, and each query's weights over all the keys must sum to 1.")
    print("ok  q04: right")


def test_q05_sram_vs_dram(answer):
    _choice(answer, "q05_sram_vs_dram")


def test_q06_subtract_max(answer):
    _choice(answer, "q06_subtract_max")


def test_q07_tiling(answer):
    _choice(answer, "q07_tiling")


def test_q08_causal(mask, weights):
    got = _tensor(mask, "q08_causal_mask", (4, 4))
    if not bool(((got == 0) | torch.isneginf(got)).all()):
        fail("q08_causal_mask should hold only 0 and -inf")
    blocked = torch.isneginf(got)
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    if torch.equal(blocked, future.T):
        fail("q08_causal_mask blocks the past and opens the future: row i is query i and "
             "column j is key j; query i may attend to keys j <= i, so the -inf entries "
             "belong above the diagonal.")
    if torch.equal(blocked, future | torch.eye(4, dtype=torch.bool)):
        fail("q08_causal_mask blocks the diagonal: a token may attend to itself (key j = i), "
             "so the diagonal stays 0 and only keys after the query are -inf.")
    if not torch.equal(blocked, future):
        fail("q08_causal_mask is not right: query i (row i) may attend to keys j <= i "
             "(the diagonal and the columns left of it); the keys after it are -inf.")
    expected = torch.softmax(torch.zeros(4, 4, dtype=torch.float64).masked_fill(future, -math.inf),
                             dim=-1)
    if not _close(_tensor(weights, "q08_causal_weights", (4, 4)), expected):
        fail("q08_causal_weights is not right: with all scores equal, softmax gives every key "
             "a row may see the same weight and every blocked key 0; each row sums to 1.")
    print("ok  q08: right")


def _random_case(shape, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    scores = scale * torch.randn(*shape, generator=g)
    mask = (torch.rand(*shape, generator=g) < 0.45).long()
    # Keep one open entry per row: a fully blocked row is module 02's topic.
    open_col = torch.randint(0, shape[-1], shape[:-1], generator=g)
    mask.scatter_(-1, open_col.unsqueeze(-1), 0)
    return scores, mask


def _extreme_case(n_cols, seed, sign):
    """Rows whose scores all lie far from zero on one side (sign): around 1e4 (a few apart),
    1e10 and 1e30 (spread over a factor of 2)."""
    scores, mask = _random_case((3, n_cols), seed, scale=1.0)
    spread = 1 + torch.rand(2, n_cols, generator=torch.Generator().manual_seed(seed + 1))
    return sign * torch.stack([1e4 + 3 * scores[0], 1e10 * spread[0], 1e30 * spread[1]]), mask


def _as_view(t, layout):
    """The same values as a non-contiguous view: "transposed" (stored column by column) or
    "sliced" (the first columns of longer rows)."""
    if layout == "transposed":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype)
    wide[..., :t.shape[-1]] = t
    return wide[..., :t.shape[-1]]


def _check_masked_softmax(fn, scores, mask, extreme):
    blocked = mask.bool()
    expected = torch.softmax(scores.double().masked_fill(blocked, -math.inf), dim=-1)
    got = _tensor(fn(scores, mask), "q09_masked_softmax(scores, mask)", scores.shape)
    gives_blocked_weight = bool((got[blocked] != 0).any())  # NaN counts as weight here
    open_weights = got[~blocked]
    if gives_blocked_weight and bool((open_weights == 0).any()) and \
            bool(((open_weights == 0) | torch.isnan(open_weights)).all()):
        fail("q09_masked_softmax gives weight to the blocked entries and none to the "
             "open ones: the mask's polarity is inverted (mask == 1 means blocked).")
    if torch.isnan(got).any():
        if extreme:
            fail("q09_masked_softmax gives NaN on rows of very large or very negative scores: "
                 "exp overflows to inf (or every exp underflows to 0) unless the row max is "
                 "subtracted first, as torch.softmax does (Q6).")
        fail("q09_masked_softmax gives NaN on rows that have open entries.")
    if gives_blocked_weight:
        if extreme:
            fail("q09_masked_softmax gives weight to blocked entries in rows whose scores are "
                 "very negative (down to -1e30): a large negative fill such as -1e9 is still "
                 "above such scores. Only -inf weighs exactly 0, whatever the row holds.")
        fail("q09_masked_softmax gives weight to blocked entries: their scores must become "
             "-inf before the softmax, since exp(-inf) = 0 (a score of 0 still gets "
             "weight exp(0) = 1).")
    if not _close(got, expected):
        fail("q09_masked_softmax gives the wrong weights on the open entries: take the "
             "softmax over the last dim (the keys) after blocking the masked scores.")


def test_q09_masked_softmax(fn):
    shapes = [(3, 5), (2, 4, 7), (1, 6, 11), (5, 1), (4, 9), (3, 2, 6)]
    layouts = [None, None, None, None, "transposed", "sliced"]
    mask_dtypes = [torch.int64, torch.int64, torch.int32, torch.int64, torch.uint8, torch.int64]
    for seed, (shape, layout, mask_dtype) in enumerate(zip(shapes, layouts, mask_dtypes)):
        scores, mask = _random_case(shape, 900 + seed)
        mask = mask.to(mask_dtype)
        if layout:
            scores, mask = _as_view(scores, layout), _as_view(mask, layout)
        _check_masked_softmax(fn, scores, mask, extreme=False)
    for seed, (n_cols, layout, sign) in enumerate([(7, None, -1), (12, "transposed", -1), (5, "sliced", 1),
                                                    (9, None, 1), (6, "transposed", 1), (11, "sliced", -1)]):
        scores, mask = _extreme_case(n_cols, 950 + seed, sign)
        if layout:
            scores, mask = _as_view(scores, layout), _as_view(mask, layout)
        _check_masked_softmax(fn, scores, mask, extreme=True)
    print("ok  q09_masked_softmax: right on random scores and masks, views, and rows of very "
          "large and very negative scores")


def test_q10_fusion(value):
    value = _number(value, "q10_fusion_bytes_saved")
    n2 = 1024 * 1024
    if math.isclose(value, 2 * n2 * 2):
        fail("q10_fusion_bytes_saved counts one trip per matrix: S and P are each written to "
             "DRAM by one kernel and read back by the next, two trips each.")
    if math.isclose(value, 4 * n2):
        fail("q10_fusion_bytes_saved counts elements, not bytes: an FP16 element is 2 bytes.")
    if not math.isclose(value, key.q10_fusion_bytes_saved):
        fail("q10_fusion_bytes_saved is not right: count the N x N matrices that travel "
             "between kernels, how often each is written and read, and 2 bytes per FP16 "
             "element.")
    print("ok  q10_fusion_bytes_saved: right")


def test_q11_low_precision(answer):
    _choice(answer, "q11_low_precision")
