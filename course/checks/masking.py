"""Visible checks of module 02 (masking). Hidden tests reuse the `case_*` functions with
inputs the learner never sees.

Convention: a boolean mask is True where a key is BLOCKED; `visible` tensors below are
the opposite (True where query i may see key j), which reads better in references.
"""
import warnings

import torch
import triton

from course import DEVICE
from course.testing import (assert_close, assert_not_trivial, dtype_name, explain_nan_from_guards,
                            fail, guarded_input, guarded_output, randn, run_wrapper)

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
    for n, dtype in ((5, torch.float32), (1, torch.float32), (6, torch.float16)):
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
    for mask, label in ((causal, "bool [4, 4] causal"), (causal.float(), "0/1 float [4, 4]"),
                        (causal.long(), "0/1 int64 [4, 4]"), (pad, "bool [1, 1, 1, 4] padding")):
        case_apply_mask(apply_mask, scores, mask, name=f"apply_mask(scores [2, 3, 4, 4], {label} mask)")


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


def check_padding_mask(padding_mask):
    case_padding_mask(padding_mask, [3, 5, 1], 5)
    case_padding_mask(padding_mask, torch.tensor([2, 4]), 6)


# ---------------------------------------------------------------------------------------
# safe_softmax

def case_safe_softmax(fn, scores, dim, *, name, quiet=False):
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
    blocked_row = torch.isneginf(moved).all(-1, keepdim=True)
    assert_close(out, expected, name=name, quiet=quiet,
                 mistakes={"NaN on fully masked rows: a row of -inf has max -inf, and "
                           "-inf - (-inf) is NaN; such rows must give zeros":
                           torch.softmax(scores.double(), dim=dim),
                           "fully masked rows got equal weights 1/N; they must give zeros":
                           torch.softmax(moved.double().masked_fill(blocked_row, 0.0), -1).movedim(-1, dim)},
                 hint="find the slices where every entry is -inf (torch.isneginf(...).all(dim)) "
                      "and return 0 there without computing -inf - (-inf)")
    assert_not_trivial(out, name=name)


def masked_scores(shape, *, seed, blocked_rows, dtype=torch.float32, scale=3.0):
    """Random scores [..., N] with random -inf entries and some rows entirely -inf.

    blocked_rows: indices (tuples of leading indices) of the rows to block entirely.
    """
    scores = randn(*shape, dtype=torch.float32, seed=seed) * scale
    g = torch.Generator().manual_seed(seed)
    blocked = torch.rand(shape, generator=g) < 0.3
    blocked[..., 0] = False  # every other row keeps a visible key
    for row in blocked_rows:
        blocked[row] = True
    return scores.masked_fill(blocked, NEG_INF).to(dtype)


def check_safe_softmax(safe_softmax):
    s = masked_scores((2, 4, 6), seed=30, blocked_rows=[(0, 1), (1, 3)])
    case_safe_softmax(safe_softmax, s, -1, name="safe_softmax(scores [2, 4, 6], dim=-1) with 2 fully masked rows")
    case_safe_softmax(safe_softmax, s.transpose(1, 2).contiguous(), 1,
                      name="safe_softmax(scores [2, 6, 4], dim=1) with 2 fully masked columns")
    case_safe_softmax(safe_softmax, randn(3, 5, seed=31) * 50, -1,
                      name="safe_softmax(scores [3, 5]) with no mask and large scores")


# ---------------------------------------------------------------------------------------
# masked_softmax_kernel and the masked_softmax wrapper

def kernel_mistakes(scores, causal, lengths):
    """{description: output} of the classic bugs of a masked softmax on scores [B, M, N]."""
    _, M, N = scores.shape
    visible = visible_keys(M, N, causal=causal, lengths=lengths, device=scores.device)
    mistakes = {"mask polarity inverted: the masked keys got the weight and the visible "
                "ones were hidden": masked_reference(scores, ~visible)}
    if causal:
        mistakes["causal off by one: the diagonal is masked (j < i); query i must see "
                 "the keys j <= i, itself included"] = masked_reference(
            scores, visible_keys(M, N, causal=True, lengths=lengths, strict=True, device=scores.device))
    if lengths is not None:
        mistakes["padding applied to the queries (rows i >= length) instead of the keys "
                 "(columns j >= length)"] = masked_reference(
            scores, visible_keys(M, N, causal=causal, lengths=lengths, pad_queries=True, device=scores.device))
    mistakes["NaN on fully masked rows: with every key masked the row max is -inf and "
             "-inf - (-inf) is NaN; such rows must be zeros"] = torch.softmax(
        scores.double().masked_fill(~visible, NEG_INF), dim=-1)
    # The padding lanes j >= N of a power-of-two block, loaded as 0 instead of -inf.
    block = triton.next_power_of_2(N)
    padded = torch.cat([scores.double(), scores.new_zeros(*scores.shape[:2], block - N).double()], -1)
    mistakes["the lanes past the end of the row were loaded as 0 (other=0) instead of -inf, "
             "so they added exp(0 - max) to the sum"] = masked_reference(
        padded, visible_keys(M, block, causal=causal, lengths=lengths, device=scores.device))[..., :N]
    return mistakes


def _describe(shape, dtype, causal, lengths):
    dims = ", ".join(str(d) for d in shape)
    return f"[{dims}] {dtype_name(dtype)}, causal={causal}, lengths={lengths}"


def case_kernel(kernel, B, M, N, dtype, *, causal, lengths=None, seed, quiet=False):
    """Launch the learner's kernel directly on guarded buffers (grid (M, B))."""
    x = guarded_input(randn(B, M, N, dtype=dtype, device=DEVICE, seed=seed) * 3)
    name = f"masked_softmax_kernel on scores {_describe((B, M, N), dtype, causal, lengths)}"
    lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    with guarded_output((B, M, N), dtype, DEVICE, name="the output") as out:
        kernel[(M, B)](out, x, lens, x.stride(0), x.stride(1), out.stride(0), out.stride(1), N,
                       CAUSAL=causal, HAS_LENGTHS=lengths is not None,
                       BLOCK_SIZE=triton.next_power_of_2(N))
    if not causal and lengths is None:
        explain_nan_from_guards(out, name=name)  # no masked row: NaN can only come from a load
    visible = visible_keys(M, N, causal=causal, lengths=lengths, device=DEVICE)
    assert_close(out, masked_reference(x, visible), name=name, quiet=quiet,
                 dim_names=("batch b",) + QUERY_KEY, mistakes=kernel_mistakes(x, causal, lengths),
                 hint="key j is visible to query i when j <= i (causal) and j < lengths[b]; "
                      "a row with no visible key must be all zeros")


def check_masked_softmax_kernel(kernel):
    # Ragged width, no mask at all: only the load masks keep the tail out.
    case_kernel(kernel, 2, 3, 37, torch.float32, causal=False, seed=40)
    case_kernel(kernel, 2, 9, 9, torch.float32, causal=True, lengths=[9, 4], seed=41)
    # Non-square, both ways: query i still sees keys j <= i.
    case_kernel(kernel, 1, 5, 12, torch.float32, causal=True, seed=42)
    case_kernel(kernel, 1, 12, 5, torch.float16, causal=True, seed=43)
    # A sequence of length 0: all its rows are fully masked.
    case_kernel(kernel, 3, 4, 20, torch.float16, causal=False, lengths=[20, 0, 7], seed=44)


def case_wrapper(fn, kernel, scores, *, causal, lengths=None, name, quiet=False):
    """fn(scores, ...) through the learner's kernel, PyTorch's softmax forbidden."""
    kwargs = {} if causal is None else {"causal": causal}  # None: rely on the default (True)
    out = run_wrapper(fn, kernel, scores, lengths=lengths, forbid="softmax", name=name, **kwargs)
    x = scores if scores.dim() == 3 else scores[None]
    visible = visible_keys(x.shape[1], x.shape[2], causal=causal is not False, lengths=lengths,
                           device=scores.device)
    expected = masked_reference(x, visible).reshape(scores.shape)
    mistakes = {k: v.reshape(scores.shape)
                for k, v in kernel_mistakes(x, causal is not False, lengths).items()}
    assert_close(out, expected, name=name, quiet=quiet, mistakes=mistakes)
    if out.dtype != scores.dtype:
        fail(f"{name}: the output is {out.dtype}, the scores {scores.dtype}: return the scores' dtype")


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
