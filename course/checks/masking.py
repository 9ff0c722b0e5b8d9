"""Visible checks of module 02 (masking). Hidden tests reuse the `case_*` functions with
inputs the learner never sees.

Convention: a boolean mask is True where a key is BLOCKED; `visible` tensors below are
the opposite (True where query i may see key j), which reads better in references.

The outputs of the classic mistakes of safe_softmax and of the masked-softmax kernel, by
which a failing check names the one it matches, are recorded for the checks' inputs
(course/recorded.py; grader/lessons/02_masking/answers.py computes them).
"""
import warnings

import torch
import triton

from course import DEVICE, recorded
from course.checks.softmax import (HALF_SUM, OVERFLOW, extreme_rows, layouts, long_half_rows,
                                   recorded_launches, wrapper_hint)
from course.testing import (assert_close, assert_not_trivial, check_rejects, dtype_name,
                            explain_nan_from_guards, fail, guarded_input, guarded_output, randn,
                            row_margin, run_wrapper, weight_tolerance)
from course.rules import Avoids, JitKernel, Launches, checked

# Checked on the submitted code (course/rules.py): the worker's launch count and
# forbidden-function checks are only as honest as the notebook lets them be, and a NaN
# replaced after the fact gives the same output as none computed at all.
RULES = {"test_safe_softmax": [Avoids("safe_softmax", ("nan_to_num", "nan_to_num_", "isnan"),
                                      "safe_softmax must compute no NaN at all, not replace it "
                                      "afterwards: a NaN computed on the way still makes the "
                                      "gradients NaN in the backward pass. Give the fully masked "
                                      "slices finite scores before the softmax, then zero them")],
         "test_masked_softmax_kernel": [JitKernel("masked_softmax_kernel")],
         "test_masked_softmax": [Launches("masked_softmax", "masked_softmax_kernel", forbid="softmax"),
                                 Avoids("masked_softmax",
                                        ("exp", "exp2", "expm1", "logsumexp", "safe_softmax", "apply_mask",
                                         "causal_mask", "causal_mask_bool", "padding_mask", "masked_fill",
                                         "masked_fill_", "triu", "tril"),
                                        "the wrapper only prepares and launches: the masking and the "
                                        "softmax must happen in masked_softmax_kernel (from the indices "
                                        "i and j, never from a mask tensor)")]}


QUERY_KEY = ("query i", "key j")
NEG_INF = float("-inf")


def _lengths_tensor(lengths, device="cpu"):
    return torch.as_tensor(lengths, device=device).reshape(-1, 1, 1)


def visible_keys(n_queries, n_keys, *, causal=False, lengths=None, device="cpu",
                 strict=False, pad_queries=False):
    """[B, M, N] bool, True where query i sees key j ([1, M, N] without lengths).

    causal: j <= i (top-left aligned). lengths: per batch entry, keys j < lengths[b].
    strict and pad_queries build two classic mistakes: causal j < i, and the padding
    applied to queries i >= lengths[b] instead of keys.
    """
    i = torch.arange(n_queries, device=device)[:, None]
    j = torch.arange(n_keys, device=device)[None, :]
    visible = torch.ones(1, n_queries, n_keys, dtype=torch.bool, device=device)
    if causal:
        visible = visible & ((j < i) if strict else (j <= i))
    if lengths is not None:
        visible = visible & ((i if pad_queries else j) < _lengths_tensor(lengths, device))
    return visible


def masked_reference(scores, visible):
    """float64 softmax of scores over the visible keys, 0 on rows with none visible."""
    s = scores.to(torch.float64).masked_fill(~visible, NEG_INF)
    return torch.softmax(s, dim=-1).nan_to_num(nan=0.0)


def _square_causal(n, device="cpu"):
    return ~visible_keys(n, n, causal=True, device=device)[0]


def _check_bool_mask(out, expected, *, name, mistakes, hint):
    """A bool mask (True = blocked) against the expected one, naming classic mistakes."""
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
        fail(f"{name} should be a torch.bool tensor (True = blocked), got "
             + (dtype_name(out.dtype) if isinstance(out, torch.Tensor) else type(out).__name__))
    assert_close(out.double(), expected.double(), name=name,
                 dim_names=("batch",) * (expected.dim() - 2) + QUERY_KEY, hint=hint, quiet=True,
                 mistakes={k: v.double() for k, v in mistakes.items()})


# ---------------------------------------------------------------------------------------
# causal_mask_bool, causal_mask

CAUSAL_HINT = "query i sees the keys j <= i (its past and itself): block j > i, i.e. triu(diagonal=1)"


def _causal_mistakes(n):
    blocked = _square_causal(n)
    return {
        "mask polarity inverted: True/-inf must mark the BLOCKED keys (the future, j > i)": ~blocked,
        "causal off by one: the diagonal is blocked (strict, j < i); a query must see its "
        "own key (j == i), so block only j > i": blocked | torch.eye(n, dtype=torch.bool),
        "causal off by one: key j = i + 1 is visible; block every j > i": blocked.triu(2),
        "the mask is transposed: the future keys j > i are above the diagonal": blocked.t(),
    }


def case_causal_mask_bool(fn, n, *, quiet=False):
    _check_bool_mask(fn(n), _square_causal(n), name=f"causal_mask_bool({n})",
                     mistakes=_causal_mistakes(n), hint=CAUSAL_HINT)
    if not quiet:
        print(f"ok  causal_mask_bool({n}) blocks exactly the keys j > i")


def check_causal_mask_bool(causal_mask_bool):
    for n in (5, 1, 8):  # n = 1 first would not tell an off-by-one from an inverted mask
        case_causal_mask_bool(causal_mask_bool, n)


def _additive(blocked, dtype):
    return torch.zeros(blocked.shape, dtype=dtype).masked_fill(blocked, NEG_INF)


def case_causal_mask(fn, n, dtype, *, quiet=False):
    name = f"causal_mask({n}, {dtype_name(dtype)})"
    out = fn(n, dtype)
    if isinstance(out, torch.Tensor) and out.dtype != dtype:
        fail(f"{name} has dtype {dtype_name(out.dtype)}: it is an additive mask, added to "
             f"{dtype_name(dtype)} scores, so it must have dtype {dtype_name(dtype)} (0 and -inf)")
    mistakes = {text: _additive(m, dtype) for text, m in _causal_mistakes(n).items()}
    mistakes["1 marks the blocked keys, but an additive mask needs -inf there: "
             "score + 1 still gets weight"] = _square_causal(n).to(dtype)
    assert_close(out, _additive(_square_causal(n), dtype), name=name, dim_names=QUERY_KEY,
                 mistakes=mistakes, quiet=quiet,
                 hint="0 where key j <= i (visible), float('-inf') where j > i (the future)")


def check_causal_mask(causal_mask):
    for n, dtype in ((5, torch.float32), (1, torch.float32), (6, torch.float16), (4, torch.float64)):
        case_causal_mask(causal_mask, n, dtype)


# ---------------------------------------------------------------------------------------
# apply_mask

def case_apply_mask(fn, scores, mask, *, name, quiet=False):
    before = scores.clone()
    out = fn(scores, mask)
    if not torch.equal(scores, before):
        fail(f"{name} changed its `scores` argument in place: return a new tensor "
             "(masked_fill, not masked_fill_)")
    blocked = mask.bool()
    assert_close(out, scores.masked_fill(blocked, NEG_INF), name=name, quiet=quiet,
                 mistakes={"mask polarity inverted: -inf must go where the mask is True/1 "
                           "(blocked), and the scores stay where it is False/0":
                           scores.masked_fill(~blocked, NEG_INF),
                           "the mask was multiplied into the scores: a blocked score becomes 0, "
                           "and exp(0) still gets weight; set it to -inf":
                           scores * (~blocked).to(scores.dtype),
                           "the mask was added to the scores: + 1 does not block a key; set "
                           "blocked scores to -inf": scores + blocked.to(scores.dtype)},
                 hint="mask == 1 or True means blocked: scores.masked_fill(<bool mask>, float('-inf'))")
    weights = torch.softmax(out.double(), dim=-1)
    if (weights.masked_select(blocked.expand_as(weights)) > 0).any():
        fail(f"{name}: softmax of the result still gives weight to blocked keys")


def check_apply_mask(apply_mask):
    scores = randn(2, 3, 4, 4, seed=20)
    causal = _square_causal(4)
    pad = torch.tensor([False, False, True, True]).reshape(1, 1, 1, 4)  # keys 2, 3 blocked
    full = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(21)) < 0.5
    for mask, label in ((causal, "bool [4, 4] causal"), (causal.float(), "0/1 float [4, 4]"),
                        (causal.long(), "0/1 int64 [4, 4]"), (causal.to(torch.uint8), "0/1 uint8 [4, 4]"),
                        (pad, "bool [1, 1, 1, 4] padding"), (full, "bool [2, 3, 4, 4]")):
        case_apply_mask(apply_mask, scores, mask, name=f"apply_mask(scores [2, 3, 4, 4], {label} mask)")
    # Other dtypes, layouts and magnitudes: float16, transposed views, far from zero.
    case_apply_mask(apply_mask, scores.half(), causal, name="apply_mask(float16 scores [2, 3, 4, 4], causal)")
    case_apply_mask(apply_mask, scores.transpose(-1, -2), causal.t().contiguous().t(),
                    name="apply_mask(scores [2, 3, 4, 4] as a transposed view, a transposed causal mask)")
    for shift in (1e4, -1e4):
        case_apply_mask(apply_mask, scores + shift, causal,
                        name=f"apply_mask(scores [2, 3, 4, 4] around {shift:+.0e}, causal)")


# ---------------------------------------------------------------------------------------
# padding_mask

def case_padding_mask(fn, lengths, n, *, quiet=False):
    name = f"padding_mask({lengths!r}, {n})"
    lens = [int(l) for l in lengths]
    B = len(lens)
    out = fn(lengths, n)
    if isinstance(out, torch.Tensor):
        try:
            out = out.expand(B, n, n)
        except RuntimeError:
            fail(f"{name} has shape {tuple(out.shape)}, which does not broadcast with scores "
                 f"[B, n, n] = [{B}, {n}, {n}]: return [B, 1, n] (one row of key flags per "
                 "sequence, shared by every query)")
    keys = visible_keys(n, n, lengths=lengths)
    queries = visible_keys(n, n, lengths=lengths, pad_queries=True)
    _check_bool_mask(
        out, ~keys, name=name + " (broadcast to [B, n, n])",
        mistakes={"padding applied to the queries (rows i >= length) instead of the keys "
                  "(columns j >= length): no query may attend to a pad KEY": ~queries,
                  "mask polarity inverted: True must mark the padding positions j >= length":
                  keys,
                  "off by one: position length - 1 is the last real token and stays visible; "
                  "block j >= length": ~visible_keys(n, n, lengths=[max(l - 1, 0) for l in lens]),
                  "off by one: position j = length is padding; block j >= length":
                  ~visible_keys(n, n, lengths=[l + 1 for l in lens])},
        hint="key j of sequence b is padding (True) when j >= lengths[b]")
    if not quiet:
        print(f"ok  {name}: True exactly at the padding keys j >= length, for every query")


def case_padding_with_causal(fn, lengths, n, *, quiet=False):
    """padding_mask(lengths, n) | causal_mask_bool(n) must be the [B, n, n] mask of a
    causal model on a padded batch."""
    name = f"padding_mask({lengths}, {n}) | causal_mask_bool({n})"
    combined = fn(lengths, n) | ~visible_keys(n, n, causal=True)[0]
    expected = ~visible_keys(n, n, causal=True, lengths=lengths)
    if tuple(combined.shape) != tuple(expected.shape):
        fail(f"{name} has shape {tuple(combined.shape)}, expected {tuple(expected.shape)} = [B, n, n]")
    assert_close(combined.double(), expected.double(), quiet=True, name=name)
    if not quiet:
        print(f"ok  {name}: the [B, n, n] mask of a causal model on a padded batch")


def check_padding_mask(padding_mask):
    case_padding_mask(padding_mask, [3, 5, 1], 5)
    case_padding_mask(padding_mask, torch.tensor([2, 4]), 6)
    case_padding_mask(padding_mask, torch.tensor([0, 9, 4, 1], dtype=torch.int32)[::2], 4)
    case_padding_with_causal(padding_mask, [4, 0, 2], 4)


# ---------------------------------------------------------------------------------------
# safe_softmax

_SAFE_SOFTMAX_MISTAKES = (  # what each output of answers.py's safe_softmax_mistakes comes from
    "NaN on fully masked rows: a row of -inf has max -inf, and -inf - (-inf) is NaN; such rows "
    "must give zeros",
    "fully masked rows got equal weights 1/N; they must give zeros")


def case_safe_softmax(fn, scores, dim, *, name, quiet=False):
    found = zip(_SAFE_SOFTMAX_MISTAKES, recorded.answer("masking", "safe_softmax_mistakes", scores, dim))
    mistakes = {description: wrong for description, wrong in found if wrong}  # none without a masked row
    before = scores.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning becomes an exception, named below
        try:
            out = fn(scores, dim=dim)
        except Warning as w:
            fail(f"{name} raised a warning ({type(w).__name__}: {w}); compute no NaN or inf at all")
    if not torch.equal(scores.nan_to_num(), before.nan_to_num()):
        fail(f"{name} changed its `scores` argument in place: return a new tensor")
    moved = scores.movedim(dim, -1)
    expected = masked_reference(moved, ~torch.isneginf(moved)).movedim(-1, dim)
    assert_close(out, expected, name=name, quiet=quiet, mistakes=mistakes,
                 hint="find the slices where every entry is -inf (torch.isneginf(...).all(dim)) "
                      "and return 0 there without computing -inf - (-inf)")
    assert_not_trivial(out, name=name)


def masked_scores(shape, *, seed, blocked_rows, dtype=torch.float32, scale=3.0, shift=0.0):
    """Random scores [..., N] (scale * randn + shift) with random -inf entries and some rows
    entirely -inf.

    blocked_rows: indices (tuples of leading indices) of the rows to block entirely.
    """
    scores = randn(*shape, dtype=torch.float32, seed=seed) * scale + shift
    g = torch.Generator().manual_seed(seed)
    blocked = torch.rand(shape, generator=g) < 0.3
    blocked[..., 0] = False  # every other row keeps a visible key
    for row in blocked_rows:
        blocked[row] = True
    return scores.masked_fill(blocked, NEG_INF).to(dtype)


@checked(RULES)
def check_safe_softmax(safe_softmax):
    s = masked_scores((2, 4, 6), seed=30, blocked_rows=[(0, 1), (1, 3)])
    case_safe_softmax(safe_softmax, s, -1, name="safe_softmax(scores [2, 4, 6], dim=-1) with 2 fully masked rows")
    case_safe_softmax(safe_softmax, s.transpose(1, 2), 1,
                      name="safe_softmax(scores [2, 6, 4] as a transposed view, dim=1) with 2 fully masked columns")
    case_safe_softmax(safe_softmax, randn(3, 5, seed=31) * 50, -1,
                      name="safe_softmax(scores [3, 5]) with no mask and large scores")
    s = masked_scores((4, 7), seed=33, blocked_rows=[(0,), (3,)])
    case_safe_softmax(safe_softmax, s.t(), 0, name="safe_softmax(scores [7, 4], dim=0) with 2 fully masked columns")
    for shift, dtype in ((1e4, torch.float32), (-1e4, torch.float16)):
        s = masked_scores((3, 7), seed=32, blocked_rows=[(1,)], dtype=dtype, shift=shift)
        case_safe_softmax(safe_softmax, s, -1, name=f"safe_softmax({dtype_name(dtype)} scores [3, 7] "
                                                    f"around {shift:+.0e}) with a fully masked row")


# ---------------------------------------------------------------------------------------
# masked_softmax_kernel and the masked_softmax wrapper

_KERNEL_MISTAKES = {  # answers.py's kernel_mistakes: {name: output}, described
    "polarity": "mask polarity inverted: the masked keys got the weight and the visible ones were "
                "hidden",
    "strict_causal": "causal off by one: the diagonal is masked (j < i); query i must see the keys "
                     "j <= i, itself included",
    "queries_padded": "padding applied to the queries (rows i >= length) instead of the keys "
                      "(columns j >= length)",
    "nan_rows": "NaN on fully masked rows: with every key masked the row max is -inf and -inf - "
                "(-inf) is NaN; such rows must be zeros",
    "other_zero": "the lanes past the end of the row were loaded as 0 (other=0) instead of -inf, so "
                  "they added exp(0 - max) to the sum",
    "no_max": OVERFLOW.format(where="row"),
    "half_sum": HALF_SUM,
}


def kernel_mistakes(scores, causal, lengths, expected, atol, rtol):
    """{description: recorded output} of the classic bugs of a masked softmax on scores
    [B, M, N] or [M, N] that tell from the expected output: a mistake within the tolerance
    of it where they differ most (no max subtracted from calm scores, say) names nothing."""
    found = recorded.answer("masking", "kernel_mistakes", scores, causal, lengths)
    right = expected.detach().to("cpu", torch.float64)
    return {description: found[name] for name, description in _KERNEL_MISTAKES.items()
            if found.get(name) and not recorded.matches(right, found[name], atol, rtol)}


def _describe(shape, dtype, causal, lengths):
    dims = ", ".join(str(d) for d in shape)
    return f"[{dims}] {dtype_name(dtype)}, causal={causal}, lengths={lengths}"


def case_kernel(kernel, x, *, causal, lengths=None, gaps=False, label="", quiet=False):
    """Launch the learner's kernel directly on scores x [B, M, N], in guarded memory (grid
    (M, B)). With gaps, the input and the output are slices of wider rows and taller batch
    entries (NaN and sentinels between rows and between batch entries, and different
    strides for the two): the kernel must use all four strides and leave that memory
    untouched."""
    B, M, N = x.shape
    name = f"masked_softmax_kernel on scores {_describe((B, M, N), x.dtype, causal, lengths)}{label}"
    if gaps:
        name += f", rows {N + 5} (input) and {N + 8} (output) entries apart"
    margin = row_margin(N)
    x = guarded_input(x.to(DEVICE), gaps=(0, 2, 5) if gaps else None, margin=margin)
    visible = visible_keys(M, N, causal=causal, lengths=lengths, device=DEVICE)
    expected = masked_reference(x, visible)
    atol, rtol = weight_tolerance(x.dtype, N, DEVICE)
    mistakes = kernel_mistakes(x, causal, lengths, expected, atol, rtol)
    lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    with guarded_output((B, M, N), x.dtype, DEVICE, name="the output", gaps=(0, 1, 8) if gaps else None,
                        margin=margin) as out:
        kernel[(M, B)](out, x, lens, x.stride(0), x.stride(1), out.stride(0), out.stride(1), N,
                       CAUSAL=causal, HAS_LENGTHS=lengths is not None,
                       BLOCK_SIZE=triton.next_power_of_2(N))
    # A NaN in a row that has a visible key and no score exp could overflow on was read
    # from the guards (a fully masked row's NaN is the kernel's own, named below).
    calm = visible.any(-1).expand(B, M) & (x.abs().amax(-1) < 80)
    explain_nan_from_guards(out[calm], name=name, gaps=gaps)
    assert_close(out, expected, name=name, quiet=quiet, atol=atol, rtol=rtol,
                 dim_names=("batch b",) + QUERY_KEY, mistakes=mistakes,
                 hint="key j is visible to query i when j <= i (causal) and j < lengths[b]; "
                      "a row with no visible key must be all zeros")


def make_scores(B, M, N, *, seed, dtype=torch.float32, kind="random"):
    """Scores [B, M, N] of a kind: "random" (3 * randn), "extreme" (rows far from zero both
    ways, see softmax.extreme_rows) or "long" (float16 rows whose sums of exps pass the
    float16 max when more than 65504 keys are visible)."""
    if kind == "extreme":
        return extreme_rows(B * M, N, seed=seed, dtype=dtype).reshape(B, M, N)
    if kind == "long":
        return long_half_rows(B * M, N, seed=seed).reshape(B, M, N)
    return randn(B, M, N, dtype=dtype, seed=seed) * 3


@checked(RULES)
def check_masked_softmax_kernel(kernel):
    # Ragged width, no mask at all: only the load masks keep the tail out.
    case_kernel(kernel, make_scores(2, 3, 37, seed=40), causal=False)
    case_kernel(kernel, make_scores(2, 9, 9, seed=41), causal=True, lengths=[9, 4])
    # Non-square, both ways: query i still sees keys j <= i.
    case_kernel(kernel, make_scores(1, 5, 12, seed=42), causal=True)
    case_kernel(kernel, make_scores(1, 12, 5, seed=43, dtype=torch.float16), causal=True)
    # A sequence of length 0: all its rows are fully masked.
    case_kernel(kernel, make_scores(3, 4, 20, seed=44, dtype=torch.float16), causal=False, lengths=[20, 0, 7])
    # Rows and batch entries apart in memory; scores far from zero both ways; a wide row;
    # a row whose sum of exps passes the float16 max.
    case_kernel(kernel, make_scores(2, 3, 37, seed=45), causal=True, lengths=[37, 0], gaps=True)
    case_kernel(kernel, make_scores(2, 4, 30, seed=46, kind="extreme"), causal=True, lengths=[30, 9],
                label=", far from zero both ways")
    case_kernel(kernel, make_scores(2, 4, 30, seed=49, dtype=torch.float16, kind="extreme"), causal=True,
                lengths=[30, 0], gaps=True, label=", far from zero both ways")
    case_kernel(kernel, make_scores(1, 2, 5000, seed=47), causal=False, lengths=[4500], label=" (wide rows)")
    case_kernel(kernel, make_scores(1, 1, 65700, seed=48, kind="long"), causal=False,
                label=" (a long row: its sum of exps passes the float16 max)")


def case_wrapper(fn, kernel, scores, *, causal, lengths=None, name, quiet=False):
    """fn(scores, ...) through the learner's kernel, PyTorch's softmax forbidden."""
    kwargs = {} if causal is None else {"causal": causal}  # None: rely on the default (True)
    visible = visible_keys(*scores.shape[-2:], causal=causal is not False, lengths=lengths,
                           device=scores.device)
    expected = masked_reference(scores, visible).reshape(scores.shape)  # [1, M, N] from [M, N] scores
    atol, rtol = weight_tolerance(scores.dtype, scores.shape[-1], scores.device)
    mistakes = kernel_mistakes(scores, causal is not False, lengths, expected, atol, rtol)
    launches, record = recorded_launches()
    out = run_wrapper(fn, kernel, scores, lengths=lengths, forbid="softmax", name=name,
                      before_launch=record, **kwargs)
    assert_close(out, expected, name=name, quiet=quiet, atol=atol, rtol=rtol, mistakes=mistakes,
                 hint=wrapper_hint(scores, launches, None))
    if out.dtype != scores.dtype:
        fail(f"{name}: the output is {out.dtype}, the scores {scores.dtype}: return the scores' dtype")


@checked(RULES)
def check_masked_softmax(masked_softmax, kernel):
    x = randn(2, 6, 45, device=DEVICE, seed=50)
    case_wrapper(masked_softmax, kernel, x, causal=True, lengths=[45, 3],
                 name="masked_softmax(scores [2, 6, 45], causal=True, lengths=[45, 3])")
    x = randn(7, 30, dtype=torch.float16, device=DEVICE, seed=51)
    case_wrapper(masked_softmax, kernel, x, causal=False, lengths=[12],
                 name="masked_softmax(scores [7, 30] float16, causal=False, lengths=[12])")
    x = randn(3, 10, 4, device=DEVICE, seed=52)
    case_wrapper(masked_softmax, kernel, x, causal=None,
                 name="masked_softmax(scores [3, 10, 4]) (causal by default, more queries than keys)")
    # Non-contiguous scores, rows wider than 4096, scores far from zero both ways, a row
    # whose sum of exps passes the float16 max.
    for label, view in layouts(randn(2, 5, 33, device=DEVICE, seed=53), seed=54).items():
        case_wrapper(masked_softmax, kernel, view, causal=True, lengths=[33, 10],
                     name=f"masked_softmax(scores [2, 5, 33], {label}, causal=True, lengths=[33, 10])")
    x = randn(1, 4500, device=DEVICE, seed=55)
    case_wrapper(masked_softmax, kernel, x, causal=False, lengths=[4400],
                 name="masked_softmax(scores [1, 4500], causal=False, lengths=[4400]): a row wider than 4096")
    for dtype in (torch.float32, torch.float16):
        x = make_scores(2, 4, 20, seed=56, dtype=dtype, kind="extreme").to(DEVICE)
        case_wrapper(masked_softmax, kernel, x, causal=True, lengths=[20, 0],
                     name=f"masked_softmax({dtype_name(dtype)} scores [2, 4, 20] far from zero both ways, "
                          "causal=True, lengths=[20, 0])")
    x = make_scores(1, 1, 65700, seed=57, kind="long").to(DEVICE)[0]
    case_wrapper(masked_softmax, kernel, x, causal=False,
                 name="masked_softmax(float16 scores [1, 65700], causal=False): a row whose sum of "
                      "exps passes the float16 max")
    check_rejects([("1-D scores (they must be 2-D or 3-D)", lambda: masked_softmax(torch.ones(3, device=DEVICE)))],
                  name="masked_softmax")
