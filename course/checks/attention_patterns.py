"""Visible checks of module 09 (patterns around attention). Hidden tests reuse the `case_*`
functions with inputs the learner never sees: the same kinds of input (dtypes, memory
layouts, value ranges, patterns, offsets, window sizes), at other sizes and seeds.

Every output is compared with the answer key's, in float64, and none is computed here by
the exercise's own method: the projection's q, k and v are read from x @ w_qkvᵀ at the
columns the answer key takes (recorded); RoPE's outputs are recorded for these checks'
inputs; the attention kernels' come from PyTorch's own attention (SDPA, which they may not
use) with the patterns as an explicit score bias, on q and k turned by the recorded RoPE.
The classic mistakes' outputs are recorded too (the projection's as columns, the others as
signatures), so that a failing check names the one the output matches; so are the ALiBi
slopes, the key block ranges and the blocks a kernel must run (course/recorded.py). On a
GPU the checks run their *_GPU_CASES too, which answers.py records as well. Module 05's
inputs, layouts and launch checks are reused as they are.
"""
import math

import torch
import torch.nn.functional as F
import triton

from course import DEVICE, INTERPRET, pick, recorded
from course.checks.flash_forward import (BF16, BHN, BHND, F16, F32, LAYOUTS, LN2, LOG2E,  # noqa: F401
                                         LSE_TOLERANCE, MARGIN, OUT_LAYOUTS, _describe, _f64,
                                         _kind_hint, _launch_check, _views_hint,
                                         attention_values, bad_inputs, block_d, in_layout,
                                         output_in_layout)
from course.gpu_compile import compile_for_gpu
from course.recorded import answer, matches
from course.testing import (assert_close, assert_not_trivial, check_choice, check_rejects,  # noqa: F401
                            dtype_name, fail, guarded_input, guarded_output, hinted, join_hints,
                            randn, tolerance, watched_call)
from course.rules import FORBIDDEN_NAMES, Avoids, JitKernel, Launches, checked

# Checked on the submitted code (course/rules.py): the worker's launch count and forbidden
# functions are only as honest as the notebook lets them be.
RULES = {
    "test_qkv_projection": [
        Avoids("qkv_projection", ("cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack"),
               "q, k and v come from one product, split with views: nothing is concatenated")],
    "test_rope_kernel": [JitKernel("rope_tile"), JitKernel("rope_kernel")],
    "test_pattern_attention_kernel": [JitKernel("pattern_attention_kernel")],
    "test_pattern_attention": [
        Launches("pattern_attention", "pattern_attention_kernel", forbid="softmax"),
        Launches("pattern_attention", "pattern_attention_kernel", forbid="matmul")],
}
assert "scaled_dot_product_attention" in FORBIDDEN_NAMES["softmax"]  # attention is forbidden too


DTYPES = (F32, F16) if INTERPRET else (F32, F16, BF16)
F64 = torch.float64
ROPE_BASE = 10000.0  # RoPE's usual base, the default of the lesson's functions
# Layouts of the projection's inputs (module 05's in_layout): x [B, N, C] and w [rows, C]
# as they are, stored transposed (w kept as [C, rows] for x @ w), or slices of longer rows.
MATRIX_LAYOUTS = ("contiguous", "transposed", "sliced")
FAR = 300.0  # inputs of the "far_above" / "far_below" kinds sit around +-FAR


def _shifted(t, kind):
    """t moved far above or far below zero for those kinds, else unchanged."""
    return t + {"far_above": FAR, "far_below": -FAR}.get(kind, 0.0)


# ---------------------------------------------------------------------------------------
# 1. qkv_projection

def projection_inputs(B, N, C, rows, dtype, *, seed, kind="random", layouts=("contiguous",) * 2):
    """Guarded x [B, N, C] and w_qkv [rows, C] in `dtype` on DEVICE, laid out as `layouts`
    (MATRIX_LAYOUTS). kind "far_above" / "far_below": x around +-FAR (the products stay
    inside fp16's range: w is small)."""
    x = _shifted(randn(B, N, C, seed=seed), kind)
    w = randn(rows, C, seed=seed + 1) / math.sqrt(C)
    return tuple(in_layout(t.to(DEVICE, dtype), layout, seed=seed + 5 + i)
                 for i, (t, layout) in enumerate(zip((x, w), layouts)))


_PROJECTION_MISTAKES = {  # the slips among answers.py's projection_columns, in the order looked for
    "per_head": "each head's q, k and v rows were taken together ([heads, 3, D], GPT-NeoX's fused "
                "layout): here the rows are all q heads, then all k heads, then all v heads, D rows each",
    "lanes_outer": "the lanes and the heads were swapped: view the product as [B, N, heads, D] (each "
                   "head's D rows together), not [B, N, D, heads]"}


def _read(product, columns):
    """[B, heads, N, D] from a [B, N, rows] product: entry [b, h, n, d] is the product's
    column columns[h][d] (a recorded table) of batch b, token n."""
    return product[..., torch.tensor(columns, device=product.device)].transpose(1, 2)


def case_projection(fn, x, w, heads, kv_heads, *, kind="random", quiet=False):
    B, N, C = x.shape
    rows = w.shape[0]
    D = rows // (heads + 2 * kv_heads)
    layouts = "" if x.is_contiguous() and w.is_contiguous() else f"; x {_describe(x)}, w {_describe(w)}"
    name = (f"qkv_projection({dtype_name(x.dtype)}{'' if kind == 'random' else ' ' + kind}, "
            f"x {tuple(x.shape)}, w_qkv {tuple(w.shape)}, heads={heads}, kv_heads={kv_heads}{layouts})")
    columns = answer("attention_patterns", "projection_columns", rows, heads, kv_heads)
    result, report = watched_call(fn, x, w, heads, kv_heads, measure_products=True)
    if not isinstance(result, (tuple, list)) or len(result) != 3 or \
            not all(isinstance(t, torch.Tensor) for t in result):
        fail(f"{name} should return three tensors (q, k, v), got {type(result).__name__}")
    product = _f64(x) @ _f64(w).T
    expected = [_read(product, part) for part in columns["parts"]]
    hint = join_hints(kv_heads != heads and f"kv_heads = {kv_heads} here, heads = {heads}: the rows "
                  f"split into {heads * D} for q and {kv_heads * D} each for k and v, not in thirds.",
                  not (x.is_contiguous() and w.is_contiguous()) and "x or w_qkv is a view here: "
                  "x @ w_qkv.T takes any layout, and its output is a fresh contiguous tensor, so "
                  "view that output, not the inputs.")
    for label, got, want, i in zip("qkv", result, expected, range(3)):
        mistakes = {text: _read(product, columns[layout][i])
                    for layout, text in _PROJECTION_MISTAKES.items() if layout in columns}
        with hinted(hint):
            assert_close(got, want, name=f"{label} of {name}", dim_names=("batch", "head", "token", "dim"),
                         mistakes=mistakes, quiet=True)
            assert_not_trivial(got, name=f"{label} of {name}")
        if got.dtype != x.dtype:
            fail(f"{label} of {name} is {dtype_name(got.dtype)}, not x's {dtype_name(x.dtype)}")
    storages = {t.untyped_storage().data_ptr() for t in result}
    if len(storages) != 1:
        fail(f"{name}: q, k and v live in {len(storages)} separate places in memory; they should "
             "be views of the one product x @ w_qkvᵀ. A copy happened (.contiguous(), .clone(), "
             "reshape of a view that cannot be viewed, torch.cat), or each came from its own "
             "product: split the one output with .view, .split or slicing, and .transpose")
    if rows > max(B * N, C) and report["largest_product"] < rows:
        fail(f"{name}: the largest matrix product had a side of {report['largest_product']}, but "
             f"the fused weight has {rows} rows: multiply x by all of w_qkv at once, one GEMM, "
             "and split its output")
    if not quiet:
        print(f"ok  {name}: views of one product")


def case_projection_random(fn, B, N, C, heads, kv_heads, D, dtype, *, seed, kind="random",
                           layouts=("contiguous",) * 2, quiet=False):
    x, w = projection_inputs(B, N, C, (heads + 2 * kv_heads) * D, dtype, seed=seed, kind=kind,
                             layouts=layouts)
    case_projection(fn, x, w, heads, kv_heads, kind=kind, quiet=quiet)


def bad_projection_inputs(fn):
    x, w = torch.ones(2, 5, 24, device=DEVICE), torch.ones(96, 24, device=DEVICE)
    return [("a 2-D x", lambda: fn(x[0], w, 2, 2)),
            ("w_qkv with another number of columns than x's channels",
             lambda: fn(x, torch.ones(96, 16, device=DEVICE), 2, 2)),
            ("w_qkv rows that do not split into heads + 2 * kv_heads blocks", lambda: fn(x, w[:91], 2, 2)),
            ("heads not a multiple of kv_heads",
             lambda: fn(x, torch.ones(112, 24, device=DEVICE), 3, 2)),
            ("an fp32 x with an fp16 w_qkv", lambda: fn(x, w.half(), 2, 2)),
            ("int32 inputs", lambda: fn(x.int(), w.int(), 2, 2))]


PROJECTION_GPU_CASES = [  # ((B, N, C, heads, kv_heads, D, dtype), options), on a GPU only
    ((2, 100, 256, 16, 4, 64, BF16), dict(seed=6, layouts=("transposed", "contiguous")))]


@checked(RULES)
def check_qkv_projection(qkv_projection):
    def case(*args, **kwargs):
        case_projection_random(qkv_projection, *args, **kwargs)
    case(2, 10, 24, 4, 4, 16, F32, seed=1)                      # heads == kv_heads
    case(2, 9, 40, 4, 2, 16, F32, seed=2)                       # grouped: k, v have 2 heads
    case(1, 13, 20, 3, 1, 24, F16, seed=3, layouts=("transposed", "transposed"))
    case(2, 7, 33, 2, 2, 24, F32, seed=4, layouts=("sliced", "contiguous"), kind="far_above")
    case(1, 11, 16, 4, 2, 16, F16, seed=5, layouts=("contiguous", "sliced"), kind="far_below")
    for args, options in pick([], PROJECTION_GPU_CASES):
        case(*args, **options)
    check_rejects(bad_projection_inputs(qkv_projection), name="qkv_projection")
    print("ok  qkv_projection: one GEMM, q, k, v views of its output (grouped heads, any layout); "
          "bad inputs raise")


# ---------------------------------------------------------------------------------------
# 2. RoPE

_ROPE_MISTAKES = {  # what each output of answers.py's rope_mistakes comes from, in the order looked for
    "interleaved": "lanes 2i and 2i + 1 were paired (GPT-J's interleaved convention): this lesson pairs "
                   "lane i with lane i + D/2 (halves, as GPT-NeoX and Llama)",
    "no_offset": "the rows were turned from position 0: row n sits at position offset + n (offset = "
                 "{offset} here, as for new tokens after a KV cache)",
    "other_way": "the pairs turned the other way: (x_i, x_{{i+D/2}}) becomes (x_i cos - x_{{i+D/2}} sin, "
                 "x_{{i+D/2}} cos + x_i sin)",
    "exponent": "the frequencies were base^(-i/D): pair i turns at base^(-2i/D) (the exponent has a 2: "
                "pairs, not lanes, are counted)",
    "padded_width": "the frequencies were computed from BLOCK_D = {width}, the padded width: use "
                    "HEAD_DIM = {D}, the real one"}


def _told_apart(mistakes, expected, atol, rtol):
    """The recorded mistakes whose output can be told from the expected one at these
    tolerances (one that changes no entry by more than them cannot be named)."""
    expected = expected.detach().to("cpu", F64)
    return {text: wrong for text, wrong in mistakes.items() if not matches(expected, wrong, atol, rtol)}


def _turned(x, offset, base):
    """The answer key's RoPE of x (row n at position offset + n) in float64 on DEVICE: recorded
    for the checks' inputs."""
    return torch.tensor(answer("attention_patterns", "rope", x, offset, base), dtype=F64, device=DEVICE)


def _rope_answers(x, offset, base, *, padded_width=None):
    """(expected, {description: recorded output}) of RoPE of x and its classic mistakes;
    padded_width: the kernel's BLOCK_D, whose frequencies are a mistake when it is not D."""
    found = answer("attention_patterns", "rope_mistakes", x, offset, base, padded_width)
    return _turned(x, offset, base), {
        text.format(offset=offset, width=padded_width, D=x.shape[-1]): found[key]
        for key, text in _ROPE_MISTAKES.items() if key in found}


def rope_values(B, H, N, D, dtype, *, seed, kind="random", layout="contiguous"):
    """A guarded x [B, H, N, D] of `kind` ("random", "far_above", "far_below") laid out as
    `layout` (module 05's LAYOUTS)."""
    return in_layout(_shifted(randn(B, H, N, D, seed=seed), kind).to(DEVICE, dtype), layout, seed=seed + 5)


def _compare_rope(out, x, expected, mistakes, *, name, hint, quiet=False):
    """out against RoPE of x in float64 (expected, asked before the call). The tolerance grows
    with the largest |x|: a rotation is accurate to a fraction of the vector's length, and an
    entry can be near 0 (cos and sin cancelling) while the pair is long."""
    atol, rtol = tolerance(x.dtype, DEVICE)
    atol *= max(1.0, float(x.detach().abs().max()))
    with hinted(hint):
        assert_close(out, expected, name=name, atol=atol, rtol=rtol,
                     dim_names=("batch", "head", "row", "dim"),
                     mistakes=_told_apart(mistakes, expected, atol, rtol), quiet=quiet)
        assert_not_trivial(out, name=name)


def _rope_name(fn_name, x, offset, base, kind, extra=""):
    layout = "" if x.is_contiguous() else f", {_describe(x)}"
    return (f"{fn_name}({dtype_name(x.dtype)}{'' if kind == 'random' else ' ' + kind}, "
            f"x {tuple(x.shape)}{layout}, offset={offset}{'' if base == ROPE_BASE else f', base={base:g}'}"
            f"{extra})")


def case_rope(fn, x, offset=0, base=ROPE_BASE, *, kind="random", quiet=False):
    name = _rope_name("rope", x, offset, base, kind)
    expected, mistakes = _rope_answers(x, offset, base)
    out = fn(x, offset=offset, base=base)
    if isinstance(out, torch.Tensor) and out.dtype != x.dtype:
        fail(f"{name} returned {dtype_name(out.dtype)}: compute in fp32, return x's dtype "
             f"({dtype_name(x.dtype)})")
    _compare_rope(out, x, expected, mistakes, name=name, quiet=quiet, hint=join_hints(
        offset and f"offset = {offset}: row n sits at position {offset} + n.",
        not x.is_contiguous() and "x is a view here: index it, never assume its layout."))


def case_rope_random(fn, B, H, N, D, dtype, *, seed, offset=0, base=ROPE_BASE, kind="random",
                     layout="contiguous", quiet=False):
    case_rope(fn, rope_values(B, H, N, D, dtype, seed=seed, kind=kind, layout=layout), offset, base,
              kind=kind, quiet=quiet)


ROPE_GPU_CASES = [  # ((B, H, N, D, dtype), options of case_rope_random), on a GPU only (small enough
    ((1, 2, 64, 128, BF16), dict(seed=6, offset=1000, layout="bnhd"))]  # for answers.py to record)


def check_rope(rope):
    def case(*args, **kwargs):
        case_rope_random(rope, *args, **kwargs)
    case(1, 2, 12, 16, F32, seed=1)
    case(2, 3, 20, 40, F32, seed=2, offset=37, layout="bnhd")       # D = 40: pairs (i, i + 20)
    case(1, 2, 30, 64, F16, seed=3, offset=3000, layout="transposed")
    case(1, 1, 9, 32, F32, seed=4, offset=5, base=500000.0, kind="far_above", layout="sliced")
    case(2, 1, 16, 24, F16, seed=5, offset=100, kind="far_below")
    for args, options in pick([], ROPE_GPU_CASES):
        case(*args, **options)
    check_rejects([("an odd head dim", lambda: rope(torch.ones(1, 1, 4, 15, device=DEVICE)))], name="rope")
    print("ok  rope: halves pairing, offsets, any layout; an odd head dim raises")


# ---------------------------------------------------------------------------------------
# 3. rope_kernel (and rope_tile), launched directly

def case_rope_kernel(kernel, x, offset=0, base=ROPE_BASE, *, block_n=16, out_layout="contiguous",
                     kind="random", quiet=False):
    B, H, N, D = x.shape
    name = _rope_name("rope_kernel", x, offset, base, kind, extra=f", BLOCK_N={block_n}"
                      + ("" if out_layout == "contiguous" else f", Y {out_layout}"))
    hint = join_hints(
        offset and f"pos_offset = {offset}: row n sits at position {offset} + n.",
        D != block_d(D) and f"D = {D} is not a power of two: BLOCK_D = {block_d(D)}; pairs and "
        "frequencies come from HEAD_DIM, and lanes past it are masked.",
        out_layout != "contiguous" and f"Y is a {out_layout} view here: store through its strides.",
        not x.is_contiguous() and f"X is a view here (strides {tuple(x.stride())}): load through "
        "its strides.")
    expected, mistakes = _rope_answers(x, offset, base, padded_width=block_d(D))
    with hinted(hint), output_in_layout((B, H, N, D), x.dtype, out_layout, name=f"Y of {name}") as y:
        kernel[(triton.cdiv(N, block_n), B * H, 1)](
            x, y, *x.stride(), *y.stride(), H, N, offset, base,
            HEAD_DIM=D, BLOCK_N=block_n, BLOCK_D=block_d(D))
    _compare_rope(y, x, expected, mistakes, name=name, hint=hint, quiet=quiet)


def case_rope_kernel_random(kernel, B, H, N, D, dtype, *, seed, kind="random", layout="contiguous",
                            **kwargs):
    case_rope_kernel(kernel, rope_values(B, H, N, D, dtype, seed=seed, kind=kind, layout=layout),
                     kind=kind, **kwargs)


ROPE_KERNEL_GPU_CASES = [  # ((B, H, N, D, dtype), options of case_rope_kernel_random), on a GPU only
    ((1, 2, 80, 128, BF16), dict(seed=6, offset=3000, block_n=64, layout="bnhd"))]  # (recorded too)


@checked(RULES)
def check_rope_kernel(rope_kernel):
    def case(*args, **kwargs):
        case_rope_kernel_random(rope_kernel, *args, **kwargs)
    case(1, 2, 20, 32, F32, seed=1)
    case(2, 3, 37, 40, F32, seed=2, offset=11, layout="bnhd", out_layout="sliced")
    case(1, 2, 50, 64, F16, seed=3, offset=2000, block_n=32, layout="transposed", out_layout="bnhd")
    case(1, 1, 16, 16, F32, seed=4, offset=5, base=500000.0, kind="far_above", layout="sliced")
    case(2, 1, 21, 48, F16, seed=5, offset=64, kind="far_below", out_layout="bnhd")
    for args, options in pick([], ROPE_KERNEL_GPU_CASES):
        case(*args, **options)
    print("ok  rope_kernel: halves pairing in a tile, offsets, head dims that are not powers of "
          "two, X and Y in any layout")


# ---------------------------------------------------------------------------------------
# 4. alibi_slopes

def _alibi_mistakes(heads):
    """{description: slopes} of the classic mistakes (values: answers.py's alibi_mistakes)."""
    p = 2 ** int(math.log2(heads))  # for the descriptions: the largest power of two <= H
    descriptions = {
        "from_one": "the sequence started at 2^0 = 1: head h gets 2^(-8(h+1)/H), so head 0 gets 2^(-8/H)",
        "reversed": "the slopes go from the largest to the smallest: head 0 gets 2^(-8/H), the largest",
        "geometric": f"H = {heads} is not a power of two, and 2^(-8(h+1)/H) was used anyway: take the "
                     f"{p} slopes of {p} heads, then every other slope of {2 * p} heads",
        "even_ranks": f"the extra heads took the even ranks of the {2 * p}-head sequence (its 2nd, 4th, "
                      "...): they take its 1st, 3rd, 5th, ... slopes ([0::2])",
        "first_of_2p": f"the first {heads} slopes of {2 * p} heads: the paper keeps the {p} slopes of {p} "
                       f"heads and adds every other slope of {2 * p}"}
    return {descriptions[key]: torch.tensor(v, dtype=F64)
            for key, v in answer("attention_patterns", "alibi_mistakes", heads).items()}


def case_alibi_slopes(fn, heads, *, quiet=False):
    name = f"alibi_slopes({heads})"
    want, mistakes = answer("attention_patterns", "alibi_slopes", heads), _alibi_mistakes(heads)
    got = fn(heads)
    if not isinstance(got, torch.Tensor) or got.dtype != F32 or tuple(got.shape) != (heads,):
        fail(f"{name} should be a float32 tensor of shape [{heads}], got "
             + (f"{dtype_name(got.dtype)} {tuple(got.shape)}" if isinstance(got, torch.Tensor)
                else type(got).__name__))
    assert_close(got, torch.tensor(want, dtype=F64), name=name, atol=0, rtol=1e-6,
                 dim_names=("head",), mistakes=mistakes, quiet=True,
                 hint="head h of H (a power of two) gets 2^(-8(h+1)/H)")
    if not quiet:
        print(f"ok  {name}: {[round(float(s), 5) for s in got[:4]]}{' ...' if heads > 4 else ''}")


def check_alibi_slopes(alibi_slopes):
    for heads in (8, 1, 2, 16, 3, 6, 12):
        case_alibi_slopes(alibi_slopes, heads, quiet=heads != 8)
    check_rejects([("heads = 0", lambda: alibi_slopes(0))], name="alibi_slopes")
    print("ok  alibi_slopes: powers of two and other head counts (1, 2, 3, 6, 12, 16)")


# ---------------------------------------------------------------------------------------
# 5. key_block_range

_RANGE_MISTAKES = {  # what each range of answers.py's key_block_range_mistakes comes from
    "diagonal": "the block that holds the diagonal (the last key a query sees) was left out: stop is one "
                "past the block holding key min(n_k - 1, last position)",
    "past_n_q": "the last query was taken at (q_block + 1) * block_q - 1 even past n_q: only real queries "
                "(i < n_q) count",
    "no_offset": "q_offset was left out: query i sits at position q_offset + i",
    "from_last_query": "the first block was found from the block's last query: its first query sees "
                       "earlier keys, and a block it sees partly must run too (its first key is at "
                       "max(0, p - W + 1), p the first query's position)",
    "rounded_up": "the first block was rounded up: a key block that is partly inside the window must "
                  "run, so round max(0, p - W + 1) down to its block",
    "window_too_long": "the window is one key too long (p - W is not visible: a query sees W keys, itself "
                       "included)"}


def case_key_block_range(fn, q_block, n_q, n_k, block_q, block_k, *, q_offset=0, causal=False,
                         window=None):
    name = (f"key_block_range(q_block={q_block}, n_q={n_q}, n_k={n_k}, block_q={block_q}, "
            f"block_k={block_k}, q_offset={q_offset}, causal={causal}, window={window})")
    asked = (q_block, n_q, n_k, block_q, block_k, q_offset, causal, window)
    want = tuple(answer("attention_patterns", "key_block_range", *asked))
    mistakes = answer("attention_patterns", "key_block_range_mistakes", *asked)
    first_pos, last_pos = answer("attention_patterns", "query_positions", q_block, n_q, block_q, q_offset)
    got = fn(q_block, n_q, n_k, block_q, block_k, q_offset=q_offset, causal=causal, window=window)
    if not isinstance(got, (tuple, list)) or len(got) != 2 or \
            not all(isinstance(g, int) and not isinstance(g, bool) for g in got):
        fail(f"{name} should return (first, stop), two ints, got {got!r}")
    if tuple(got) == want:
        return
    # One wrong range may have several causes.
    why = "; or: ".join(description for key, description in _RANGE_MISTAKES.items()
                        if tuple(mistakes.get(key, ())) == tuple(got))
    fail(f"{name} is {tuple(got)}, expected {want}: key blocks {want[0]} ... {want[1] - 1} hold a "
         f"key one of its queries (positions {first_pos} ... {last_pos}) sees"
         + (f".\n  this matches a classic mistake: {why}" if why else
            ". The block of key j is j // block_k."))


RANGE_CASES = [  # (q_block, n_q, n_k, block_q, block_k, q_offset, causal, window)
    (0, 40, 40, 16, 16, 0, False, None), (2, 70, 70, 16, 32, 0, True, None),
    (1, 40, 100, 32, 16, 60, True, None), (2, 100, 100, 16, 16, 0, True, 20),
    (3, 100, 100, 32, 16, 0, True, 40), (1, 37, 37, 16, 16, 0, True, 1),
    (0, 8, 64, 16, 16, 56, True, 10), (4, 90, 90, 16, 32, 0, True, 1000),
    (2, 50, 80, 16, 16, 30, True, 17), (1, 40, 60, 32, 16, 0, True, 5),
]


def check_key_block_range(key_block_range):
    for q_block, n_q, n_k, bq, bk, q_offset, causal, window in RANGE_CASES:
        case_key_block_range(key_block_range, q_block, n_q, n_k, bq, bk, q_offset=q_offset,
                             causal=causal, window=window)
    print("ok  key_block_range: full, causal and windowed, with offsets and ragged blocks")


# ---------------------------------------------------------------------------------------
# 6. pattern_attention_kernel: what it gives, and its classic mistakes

_PATTERN_MISTAKES = {  # what each output of answers.py's pattern_mistakes and loop_start_mistakes
    # comes from (formatted with the case's q_offset, window, D and BLOCK_D), in the order looked for
    "interleaved": "q and k were turned with lanes 2i and 2i + 1 paired (GPT-J's interleaved "
                   "convention): this lesson pairs lane i with lane i + D/2 (halves)",
    "q_turned_from_zero": "the queries were turned as if they sat where the keys start (q_offset = "
                          "{q_offset} left out, or given to the keys too: RoPE only sees the difference): "
                          "query i sits at q_offset + i, key j at j",
    "other_way": "q and k turned the other way: (x_i cos - x_{{i+D/2}} sin, x_{{i+D/2}} cos + x_i sin)",
    "padded_width": "the RoPE frequencies came from BLOCK_D = {block_d}: use HEAD_DIM = {D}",
    "natural_units": "the ALiBi bias was added in natural units to base-2 scores: multiply the slope by "
                     "log2(e) too, as qk_scale is",
    "bias_scaled": "the ALiBi bias was scaled by sm_scale: it is added to the scaled scores, as it is",
    "bonus": "the ALiBi bias was added, not subtracted: keys further away get a penalty, "
             "-slope * |distance|",
    "slope_of_kv_head": "each query head used the slope of its K/V head (h // GROUP): ALiBi's slopes "
                        "belong to the query heads, SLOPES[h]",
    "slopes_reversed": "the slopes went to the heads in reverse order: query head h takes SLOPES[h]",
    "bias_without_offset": "the ALiBi distance left q_offset = {q_offset} out: distance = q_offset + i - j",
    "mask_without_offset": "the causal mask left q_offset = {q_offset} out (query i saw keys j <= i): "
                           "query i sits at q_offset + i and sees keys j <= q_offset + i",
    "no_mask": "the causal mask was not applied (a window is causal too): a query sees no key after "
               "its own position",
    "window_too_long": "the window is one key too long (distance <= W): a query sees W = {window} keys, "
                       "itself included (0 <= distance < W)",
    "window_too_short": "the window is one key too short (distance < W - 1): a query sees W = {window} "
                        "keys, itself included",
    "from_last_query": "a key block that is partly inside the window was skipped: the loop must start at "
                       "the block holding key max(0, p - W + 1), p the position of the block's FIRST query",
    "rounded_up": "a key block that is partly inside the window was skipped: round the first key "
                  "max(0, p - W + 1) down to its block (// BLOCK_K * BLOCK_K), not up"}


def pattern_questions(q, k, v, *, scale, blocks, pattern):
    """{what: (answer's name, arguments)} a pattern case asks the answer key (answers.py records
    the GPU's cases through the same questions): q and k turned by RoPE, the classic mistakes'
    outputs, and with a window the mistakes of the loop's first block (they depend on the
    blocks)."""
    asked = {}
    if pattern["rope"]:
        asked |= {"q": ("rope", (q, pattern["q_offset"], pattern["rope_base"])),
                  "k": ("rope", (k, 0, pattern["rope_base"]))}
    case = (q, k, v, scale, pattern["q_offset"], pattern["causal"], pattern["window"], pattern["rope"],
            pattern["rope_base"], pattern["slopes"])
    asked["mistakes"] = ("pattern_mistakes", case)
    if pattern["window"] is not None:
        asked["loop_start"] = ("loop_start_mistakes", (*case, *blocks))
    return asked


def _score_bias(H, Nq, Nk, pattern):
    """[H, Nq, Nk] float64 added to the scaled scores, as the docstring defines the patterns:
    ALiBi's -SLOPES[h] * |distance| (the recorded slopes), and -inf where a key is hidden
    (after the query's position; with a window W, W or more positions before it)."""
    positions = pattern["q_offset"] + torch.arange(Nq, device=DEVICE)
    distance = positions[:, None] - torch.arange(Nk, device=DEVICE)
    bias = torch.zeros(H, Nq, Nk, dtype=F64, device=DEVICE)
    if pattern["slopes"] is not None:
        bias -= _f64(pattern["slopes"])[:, None, None] * distance.abs()
    hidden = torch.zeros(Nq, Nk, dtype=torch.bool, device=DEVICE)
    if pattern["causal"]:
        hidden |= distance < 0
    if pattern["window"] is not None:
        hidden |= distance >= pattern["window"]
    return bias.masked_fill(hidden, float("-inf"))


def _expected_pattern(inputs, turned, *, scale, pattern):
    """(O, LSE) in float64 from PyTorch's attention (SDPA) with the patterns as an explicit
    score bias, on q and k turned by the recorded RoPE (turned: {"q": ..., "k": ...}, or {}).
    The LSE is that of the same biased scores."""
    q, k, v = (_f64(t) for t in inputs)
    if turned:
        q, k = (torch.tensor(turned[which], dtype=F64, device=DEVICE) for which in "qk")
    H, Hkv, Nq, Nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    bias = _score_bias(H, Nq, Nk, pattern)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale, enable_gqa=H != Hkv)
    scores = q @ k.repeat_interleave(H // Hkv, 1).transpose(-1, -2) * scale + bias
    return out, torch.logsumexp(scores, -1)


def pattern_values(B, H, Hkv, Nq, Nk, D, dtype, *, seed, kind="random", layouts=("contiguous",) * 3):
    """Guarded q [B, H, Nq, D] and k, v [B, Hkv, Nk, D] of module 05's kinds of values, laid
    out as `layouts`."""
    q, k, v = attention_values(B, H, Nq, Nk, D, dtype, seed=seed, kind=kind)
    return tuple(in_layout(t.to(DEVICE, dtype), layout, seed=seed + 5 + i)
                 for i, (t, layout) in enumerate(zip((q, k[:, :Hkv], v[:, :Hkv]), layouts)))


def _pattern_text(q_offset, causal, window, rope, rope_base, slopes):
    parts = ([f"q_offset={q_offset}"] if q_offset else []) + (["causal"] if causal and window is None else [])
    parts += [f"window={window}"] if window is not None else []
    parts += [f"rope{'' if rope_base == ROPE_BASE else f' base={rope_base:g}'}"] if rope else []
    parts += ["alibi"] if slopes is not None else []
    return ", ".join(parts)


def _pattern_hint(q, k, *, q_offset, causal, window, rope, slopes):
    H, Hkv = q.shape[1], k.shape[1]
    return join_hints(
        q_offset and f"q_offset = {q_offset}: query i sits at position {q_offset} + i, key j at j.",
        rope and "RoPE: q at the queries' positions, k at the keys' (from 0), halves pairing.",
        slopes is not None and "ALiBi: -SLOPES[h] * |distance| is added to the scaled scores, in "
        "base 2 like them (times log2 e)"
        + (f"; h is the query head (GROUP = {H // Hkv})" if H != Hkv else "") + ".",
        window is not None and f"window W = {window}: a query at p sees keys p - W + 1 ... p.",
        causal and window is None and "causal: a query at p sees keys j <= p.",
        _views_hint({"q": q, "k": k}))


def _check_blocks_run(got, expected, name, window, fewer):
    """BLOCKS_RUN against the expected counts: fewer=True fails only if a program ran fewer
    blocks than it must, fewer=False only if it ran more."""
    bad = (got < expected) if fewer else (got > expected)
    if not bad.any():
        return
    b, h, i = (int(x) for x in bad.nonzero()[0])
    seen, want = int(got[b, h, i]), int(expected[b, h, i])
    if fewer:
        fail(f"{name}: program (query block {i}, batch {b}, head {h}) stored {seen} in BLOCKS_RUN, "
             f"but {want} key blocks hold a key its queries see. Did its loop skip a block that is "
             "partly visible, or does the count miss some visited blocks (visited += 1 in every "
             "iteration, stored once after the loop)?")
    fail(f"{name}: program (query block {i}, batch {b}, head {h}) visited {seen} key blocks, but only "
         f"{want} hold a key its queries see: the loop must skip the others, not just mask them"
         + (" (start at the block holding key max(0, p - W + 1), stop after the one holding its "
            "last query's position)" if window is not None else
            " (stop after the block holding its last query's position)"))


def blocks_run_asked(Nq, Nk, blocks, pattern):
    """The arguments of the answer "blocks_run" (the key blocks each query block must run)
    that a case with these lengths, blocks and _pattern asks for."""
    return (Nq, Nk, *blocks, pattern["q_offset"], pattern["causal"], pattern["window"])


def _expected_blocks(B, H, Nq, Nk, blocks, pattern, *, name):
    try:
        counts = answer("attention_patterns", "blocks_run", *blocks_run_asked(Nq, Nk, blocks, pattern))
    except LookupError:  # only a GPU wrapper chooses its own blocks
        fail(f"{name}: launched with BLOCK_Q={blocks[0]}, BLOCK_K={blocks[1]}; the visible checks know "
             f"the blocks each program must run for BLOCK_Q and BLOCK_K in {GPU_BLOCK_SIZES} only "
             "(the lesson's are 128 x 64, or 64 x 32 when D > 128)")
    return torch.tensor(counts, dtype=torch.int32).expand(B, H, len(counts))


def _check_pattern_result(out, lse, blocks_run, inputs, *, name, scale, blocks, pattern, hint, quiet):
    """inputs: q, k and v as they were before the call (the answers are recorded for them)."""
    q = inputs[0]
    B, H, Nq, D = q.shape
    expected_blocks = _expected_blocks(B, H, Nq, inputs[1].shape[2], blocks, pattern, name=name)
    questions = pattern_questions(*inputs, scale=scale, blocks=blocks, pattern=pattern)
    turned = {which: answer("attention_patterns", questions[which][0], *questions[which][1])
              for which in "qk" if which in questions}
    expected, expected_lse = _expected_pattern(inputs, turned, scale=scale, pattern=pattern)
    details = dict(q_offset=pattern["q_offset"], window=pattern["window"], D=D, block_d=block_d(D))

    def told_apart_mistakes():
        found = {}
        for what in ("mistakes", "loop_start"):
            if what in questions:
                found |= answer("attention_patterns", questions[what][0], *questions[what][1])
        mistakes = {text.format(**details): found[key] for key, text in _PATTERN_MISTAKES.items() if key in found}
        return _told_apart(mistakes, expected, *tolerance(q.dtype, DEVICE))
    got_blocks = blocks_run.detach().to("cpu")
    with hinted(hint):
        _check_blocks_run(got_blocks, expected_blocks, name, pattern["window"], fewer=True)
        assert_close(out, expected, name=name, dim_names=BHND, quiet=quiet,
                     mistakes=recorded.deferred(told_apart_mistakes))
        assert_not_trivial(out, name=name)
        atol, rtol = LSE_TOLERANCE
        if pattern.get("rope") and q.dtype != F32:
            # The rotated tiles go to tl.dot in the inputs' dtype: each score is off by up
            # to about eps(dtype) times its size (bf16: 2**-8), and the LSE with it.
            atol += torch.finfo(q.dtype).eps * float(expected_lse.abs().max())
        assert_close(lse, expected_lse, name=f"LSE of {name}", dim_names=BHN, atol=atol, rtol=rtol,
                     quiet=True)
    if out.dtype != q.dtype:
        fail(f"{name}: O is {dtype_name(out.dtype)} but the inputs are {dtype_name(q.dtype)}")
    _check_blocks_run(got_blocks, expected_blocks, name, pattern["window"], fewer=False)


def _pattern(*, q_offset=0, causal=False, window=None, rope=False, rope_base=ROPE_BASE, slopes=None):
    return dict(q_offset=q_offset, causal=causal or window is not None, window=window, rope=rope,
                rope_base=rope_base, slopes=slopes)


def case_pattern_kernel(kernel, q, k, v, *, sm_scale=None, blocks=(32, 32), out_layout="contiguous",
                        kind="random", quiet=False, **options):
    """Launch kernel on guarded q, k, v (and SLOPES) into a guarded O laid out as out_layout,
    a guarded LSE [B, H, Nq] and BLOCKS_RUN [B, H, cdiv(Nq, BLOCK_Q)], on the grid
    (cdiv(Nq, BLOCK_Q), B * H, 1). options: q_offset, causal, window, rope, rope_base, slopes."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    pattern = _pattern(**options)
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    block_q, block_k = blocks
    name = (f"pattern_attention_kernel({dtype_name(q.dtype)}{'' if kind == 'random' else ' ' + kind}, "
            f"q {tuple(q.shape)}, k/v {tuple(k.shape)}, {_pattern_text(**pattern) or 'no pattern'}, "
            f"BLOCK_Q={block_q}, BLOCK_K={block_k}" + (f", sm_scale={sm_scale}" if sm_scale else "")
            + ("" if out_layout == "contiguous" else f", O {out_layout}") + ")")
    hint = join_hints(_pattern_hint(q, k, q_offset=pattern["q_offset"], causal=pattern["causal"],
                                window=pattern["window"], rope=pattern["rope"], slopes=pattern["slopes"]),
                  _kind_hint(kind, q.dtype, Nk, D, scale),
                  out_layout != "contiguous" and f"O is a {out_layout} view here: store through its strides.",
                  D != block_d(D) and f"D = {D}: BLOCK_D = {block_d(D)}, lanes past HEAD_DIM masked.")
    slopes = None if pattern["slopes"] is None else guarded_input(pattern["slopes"].to(DEVICE), margin=MARGIN)
    n_blocks = triton.cdiv(Nq, block_q)
    inputs = tuple(t.clone() for t in (q, k, v))  # as they are before the launch
    with hinted(hint), \
            output_in_layout((B, H, Nq, D), q.dtype, out_layout, name=f"O of {name}") as out, \
            guarded_output((B, H, Nq), F32, DEVICE, name=f"LSE of {name}", margin=MARGIN) as lse, \
            guarded_output((B, H, n_blocks), torch.int32, DEVICE, name=f"BLOCKS_RUN of {name}",
                           margin=MARGIN) as blocks_run:
        kernel[(n_blocks, B * H, 1)](
            q, k, v, out, lse, slopes, blocks_run,
            *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            H, Nq, Nk, scale * LOG2E, pattern["q_offset"],
            pattern["window"] or pattern["q_offset"] + Nq, pattern["rope_base"],
            GROUP=H // Hkv, HEAD_DIM=D, BLOCK_D=block_d(D), BLOCK_Q=block_q, BLOCK_K=block_k,
            CAUSAL=pattern["causal"], ROPE=pattern["rope"], ALIBI=slopes is not None,
            DOT_PRECISION="ieee" if q.dtype == F32 else "tf32")
    _check_pattern_result(out, lse, blocks_run, inputs, name=name, scale=scale, blocks=blocks,
                          pattern=pattern, hint=hint, quiet=quiet)


def case_pattern_kernel_random(kernel, B, H, Hkv, Nq, Nk, D, dtype, *, seed, kind="random",
                               layouts=("contiguous",) * 3, alibi=False, **kwargs):
    q, k, v = pattern_values(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, kind=kind, layouts=layouts)
    slopes = torch.tensor(answer("attention_patterns", "alibi_slopes", H), dtype=F32) if alibi else None
    case_pattern_kernel(kernel, q, k, v, kind=kind, slopes=slopes, **kwargs)


KERNEL_CASES = [  # ((B, H, Hkv, Nq, Nk, D, dtype), options of case_pattern_kernel_random)
    ((1, 2, 2, 40, 40, 32, F32), dict(seed=1, blocks=(16, 16))),                           # no pattern
    ((1, 2, 1, 20, 60, 40, F32), dict(seed=2, rope=True, q_offset=40, blocks=(16, 32))),   # RoPE, KV cache
    ((1, 4, 2, 37, 37, 16, F16), dict(seed=3, alibi=True, causal=True, blocks=(16, 16))),  # ALiBi, grouped
    ((1, 2, 2, 64, 64, 16, F32), dict(seed=4, window=20, blocks=(16, 16))),                # sliding window
    ((2, 2, 1, 30, 45, 24, F16), dict(seed=5, window=7, q_offset=15, rope=True, alibi=True,
                                      blocks=(16, 16), layouts=("bnhd", "transposed", "sliced"),
                                      out_layout="bnhd")),                               # all of them, views
    ((1, 2, 2, 33, 33, 16, F32), dict(seed=6, window=1, blocks=(16, 16),
                                      out_layout="sliced")),                             # W = 1
    ((1, 2, 2, 40, 40, 64, F32), dict(seed=7, kind="extreme", alibi=True, window=50)),     # W > N
    ((1, 1, 1, 20, 50, 16, F16), dict(seed=8, kind="big_v", causal=True, q_offset=30, blocks=(16, 16))),
    ((1, 3, 3, 20, 40, 16, F16), dict(seed=9, kind="big_v_negative", alibi=True, blocks=(16, 32),
                                      layouts=("contiguous", "bnhd", "contiguous"))),
]
KERNEL_GPU_CASES = [  # the same, on a GPU only (small enough for answers.py to record q and k turned)
    ((1, 2, 1, 80, 150, 128, BF16), dict(seed=10, rope=True, alibi=True, window=50, q_offset=70,
                                         blocks=(64, 64), layouts=("bnhd",) * 3)),
    ((1, 2, 2, 100, 100, 64, F16), dict(seed=11, rope=True, causal=True, blocks=(64, 32))),
]


@checked(RULES)
def check_pattern_attention_kernel(pattern_attention_kernel):
    for shape, options in KERNEL_CASES + ([] if INTERPRET else KERNEL_GPU_CASES):
        case_pattern_kernel_random(pattern_attention_kernel, *shape, **options)


# ---------------------------------------------------------------------------------------
# 7. pattern_attention (the wrapper)

FORBID = ("attention", "softmax", "matmul")


def bad_pattern_options(fn):
    x = torch.ones(1, 2, 8, 16, device=DEVICE)
    odd = torch.ones(1, 2, 8, 17, device=DEVICE)
    return [("RoPE with an odd head dim (17)", lambda: fn(odd, odd, odd, rope=True)),
            ("window=0", lambda: fn(x, x, x, window=0)),
            ("q_offset=-1", lambda: fn(x, x, x, q_offset=-1)),
            ("causal with q_offset + Nq > Nk (queries past the last key)",
             lambda: fn(x, x, x, causal=True, q_offset=1)),
            ("alibi_slopes with one slope for 2 heads",
             lambda: fn(x, x, x, alibi_slopes=torch.ones(1, device=DEVICE))),
            ("float64 alibi_slopes", lambda: fn(x, x, x, alibi_slopes=torch.ones(2, device=DEVICE).double()))]


def case_pattern_wrapper(fn, kernel, q, k, v, *, sm_scale=None, blocks=None, kind="random",
                         quiet=False, **options):
    """options: q_offset, causal, window, rope, rope_base, slopes (as the kernel case)."""
    B, H, Nq, D = q.shape
    pattern = _pattern(**options)
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    kwargs = {key: value for key, value in (("q_offset", options.get("q_offset")),
                                             ("causal", options.get("causal")),
                                             ("window", options.get("window")),
                                             ("rope", options.get("rope")),
                                             ("rope_base", options.get("rope_base")),
                                             ("sm_scale", sm_scale)) if value is not None}
    if pattern["slopes"] is not None:
        kwargs["alibi_slopes"] = guarded_input(pattern["slopes"].to(DEVICE), margin=MARGIN)
    if blocks:
        kwargs |= {"block_q": blocks[0], "block_k": blocks[1]}
    name = (f"pattern_attention({dtype_name(q.dtype)}{'' if kind == 'random' else ' ' + kind}, "
            f"q {tuple(q.shape)}, k/v {tuple(k.shape)}, "
            + ", ".join(f"{key}={value if not isinstance(value, torch.Tensor) else 'alibi_slopes(H)'}"
                        for key, value in kwargs.items()) + ")")
    launched = {}
    check_grid = _launch_check(name, B, H, Nq, D, blocks)

    def before_launch(launch, count):
        check_grid(launch, count)
        launched["blocks"] = (launch.get("BLOCK_Q"), launch.get("BLOCK_K"))
    inputs = tuple(t.clone() for t in (q, k, v))  # as they are before the call
    result, report = watched_call(fn, q, k, v, kernel=kernel, forbid=FORBID, before_launch=before_launch,
                                  **kwargs)
    kernel_name = getattr(kernel, "__name__", "the kernel")
    if report["launches"] != 1:
        fail(f"{name}: {kernel_name} was launched {report['launches']} times; the wrapper must "
             "launch it exactly once")
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        fail(f"{name} should return (o, lse, blocks_run), got {type(result).__name__}")
    out, lse, blocks_run = result
    n_blocks = triton.cdiv(Nq, launched["blocks"][0])
    for label, t, shape, dtype in (("lse", lse, (B, H, Nq), F32), ("blocks_run", blocks_run, (B, H, n_blocks),
                                                                    torch.int32)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
            fail(f"{name}: {label} should be a {dtype_name(dtype)} tensor of shape {list(shape)}, got "
                 + (f"{dtype_name(t.dtype)} {tuple(t.shape)}" if isinstance(t, torch.Tensor)
                    else type(t).__name__))
    if not isinstance(out, torch.Tensor):
        fail(f"{name} should give O as a torch.Tensor, got {type(out).__name__}")
    hint = join_hints(_pattern_hint(q, k, q_offset=pattern["q_offset"], causal=pattern["causal"],
                                window=pattern["window"], rope=pattern["rope"], slopes=pattern["slopes"]),
                  _kind_hint(kind, q.dtype, k.shape[2], D, scale),
                  "every option reaches the kernel: q_offset, the window (for plain causal, one "
                  "longer than any distance: q_offset + Nq), ROPE and rope_base, ALIBI and the slopes.")
    _check_pattern_result(out, lse, blocks_run, inputs, name=name, scale=scale,
                          blocks=launched["blocks"], pattern=pattern, hint=hint, quiet=quiet)


def case_pattern_wrapper_random(fn, kernel, B, H, Hkv, Nq, Nk, D, dtype, *, seed, kind="random",
                                layouts=("contiguous",) * 3, alibi=False, **kwargs):
    q, k, v = pattern_values(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, kind=kind, layouts=layouts)
    slopes = torch.tensor(answer("attention_patterns", "alibi_slopes", H), dtype=F32) if alibi else None
    case_pattern_wrapper(fn, kernel, q, k, v, kind=kind, slopes=slopes, **kwargs)


WRAPPER_CASES = [  # ((B, H, Hkv, Nq, Nk, D, dtype), options of case_pattern_wrapper_random)
    ((1, 2, 2, 40, 70, 32, F32), dict(seed=1, rope=True, q_offset=30)),          # default blocks
    ((1, 4, 2, 45, 45, 24, F16), dict(seed=2, alibi=True, window=12, blocks=(16, 16),
                                      layouts=("bnhd", "sliced", "transposed"))),
    ((1, 2, 1, 30, 50, 16, F32), dict(seed=3, causal=True, q_offset=20, sm_scale=0.3, blocks=(16, 32),
                                      rope=True, rope_base=500.0)),
    ((1, 2, 2, 33, 33, 16, F16), dict(seed=4, kind="extreme", window=1, blocks=(16, 16))),
    ((1, 1, 1, 20, 40, 16, F32), dict(seed=5, kind="big_v", alibi=True, blocks=(16, 16))),
    ((1, 1, 1, 20, 40, 16, F16), dict(seed=6, kind="big_v_negative", causal=True, q_offset=20,
                                      blocks=(16, 16))),
]
WRAPPER_GPU_CASES = [  # the same, on a GPU only (two query blocks of the GPU's default 128)
    ((1, 2, 1, 130, 150, 64, BF16), dict(seed=7, rope=True, alibi=True, window=60, q_offset=20,
                                         layouts=("bnhd",) * 3)),
]
# Without block_q and block_k, a wrapper on a GPU chooses its blocks (the lesson's: 128 x 64,
# or 64 x 32 when D > 128): the recorded answers cover these sizes (tl.dot needs 16 or more).
GPU_BLOCK_SIZES = (16, 32, 64, 128, 256)


@checked(RULES)
def check_pattern_attention(pattern_attention, pattern_attention_kernel):
    for shape, options in WRAPPER_CASES + ([] if INTERPRET else WRAPPER_GPU_CASES):
        case_pattern_wrapper_random(pattern_attention, pattern_attention_kernel, *shape, **options)
    check_rejects(bad_inputs(pattern_attention) + bad_pattern_options(pattern_attention),
                  name="pattern_attention")
    print("ok  pattern_attention: every option reaches one launch; bad inputs raise")


# ---------------------------------------------------------------------------------------
# The kernel compiled for an H100 without running it

def compile_kernel_for_gpu(pattern_attention_kernel, capability=90):
    """Compile the kernel with every pattern on, fp16, the GPU's blocks."""
    signature = {name: "*fp16" for name in ("Q", "K", "V", "O")} | {"LSE": "*fp32", "SLOPES": "*fp32",
                                                                    "BLOCKS_RUN": "*i32"}
    signature |= {f"stride_{t}{d}": "i32" for t in "qkvo" for d in "bhnd"}
    signature |= {"H": "i32", "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32", "q_offset": "i32",
                  "window": "i32", "rope_base": "fp32"}
    constants = {"GROUP": 2, "HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_Q": 128, "BLOCK_K": 64,
                 "CAUSAL": True, "ROPE": True, "ALIBI": True, "DOT_PRECISION": "tf32"}
    compile_for_gpu(pattern_attention_kernel, signature | dict.fromkeys(constants, "constexpr"),
                    constants, capability)
