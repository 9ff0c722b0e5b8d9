"""Visible checks of module 04 (naive attention). Hidden tests reuse the `case_*`
functions with inputs the learner never sees: the same kinds of input (memory layouts,
score ranges, grouped heads, causal or not), at other sizes, seeds and scales."""
import math

import torch
import torch.nn.functional as F

from course import DEVICE, pick, recorded
from course.recorded import answer
from course.testing import (assert_close, assert_not_trivial, check_choice,  # noqa: F401
                            check_rejects, dtype_name, fail, guarded_input, randn, watched_call)
from course.rules import Avoids, Launches, checked

# Checked on the submitted code (course/rules.py): the worker's forbidden-function checks
# are only as honest as the notebook lets them be.
RULES = {
    "test_attention_reference": [Avoids("attention_reference",
                                        ("scaled_dot_product_attention", "multi_head_attention_forward",
                                         "MultiheadAttention"),
                                        "write the formula yourself: the checks compare it with "
                                        "PyTorch's own attention")],
    "test_naive_attention": [Launches("naive_attention", "batched_gemm_strided_kernel", forbid="matmul"),
                             Launches("naive_attention", "softmax_kernel", forbid="softmax")],
}


BHND = ("batch", "head", "query", "col")
# Layouts of the inputs (see in_layout); KINDS of values (see attention_inputs).
LAYOUTS = ("bhnd", "bnhd", "transposed", "shared")
# Scores ("large", "negative") sit this far from zero after scaling, plus a spread of a few
# units: far enough that exp without the max overflows (fp32) or underflows, and that a
# score stored in the input's low precision loses its spread (fp16 rounds 1000 to a
# multiple of 0.5), near enough that fp32 keeps it (ulp(1000) = 6e-5).
OFFSET = {torch.float32: 100.0, torch.float16: 1000.0, torch.bfloat16: 1000.0}
MARGIN = 64  # NaN entries before and after every input (see in_layout)
OVERFLOW = 70_000.0  # "overflow": Q K^T before scaling, past fp16's largest value (65,504)


# ---------------------------------------------------------------------------------------
# Inputs

def in_layout(x, layout):
    """x [B, H, N, D] copied into guarded memory (NaN before and after it) as a view laid out
    as `layout`: "bhnd" (contiguous); "bnhd": stored as [B, N, H, D], how projections come
    out; "transposed": each head's [N, D] matrix stored column by column; "shared": one head
    for all heads (head stride 0), x's head 0. The margins are short (MARGIN): the kernels
    that read these inputs are given, and course.bounds stops a read past the storage."""
    def guarded(t):
        return guarded_input(t, margin=MARGIN)
    if layout == "bhnd":
        return guarded(x)
    if layout == "bnhd":
        return guarded(x.transpose(1, 2).contiguous()).transpose(1, 2)
    if layout == "transposed":
        return guarded(x.transpose(-1, -2).contiguous()).transpose(-1, -2)
    if layout == "shared":
        return guarded(x[:, :1].contiguous()).expand(x.shape)
    raise ValueError(f"unknown layout {layout!r}")


def attention_values(B, H, Hkv, Nq, Nk, D, dtype, *, seed, scale, kind="random"):
    """fp32 q [B, H, Nq, D], k and v [B, Hkv, Nk, D] on the CPU. kind:
    "random": standard normal;
    "large" / "negative": coordinate 0 of every query and key is the same number a (of k:
        +a or -a), so every score is +-OFFSET[dtype] after scaling, plus the usual spread
        (from the other coordinates). V stays standard normal: an offset of V would
        widen the output's tolerance (rtol times |O|) and hide what S's precision does;
    "overflow": the same with Q K^T about OVERFLOW before scaling (fp16: past 65,504)."""
    q = randn(B, H, Nq, D, seed=seed)
    k = randn(B, Hkv, Nk, D, seed=seed + 1)
    v = randn(B, Hkv, Nk, D, seed=seed + 2)
    if kind == "random":
        return q, k, v
    if kind not in ("large", "negative", "overflow"):
        raise ValueError(f"unknown kind of values {kind!r}")
    raw = OVERFLOW if kind == "overflow" else OFFSET[dtype] / scale
    sign = -1.0 if kind == "negative" else 1.0
    q[..., 0] = math.sqrt(raw)
    k[..., 0] = sign * math.sqrt(raw)
    return q, k, v


def attention_inputs(B, H, Hkv, Nq, Nk, D, dtype, *, seed, scale, kind="random", layout="bhnd"):
    """Guarded q, k, v (see attention_values) on the device, laid out as `layout` ("shared":
    q contiguous, k and v one head for all heads)."""
    q, k, v = attention_values(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, scale=scale, kind=kind)
    q_layout = "bhnd" if layout == "shared" else layout
    return (in_layout(q.to(DEVICE, dtype), q_layout), in_layout(k.to(DEVICE, dtype), layout),
            in_layout(v.to(DEVICE, dtype), layout))


def _describe(t):
    return (f"[{', '.join(map(str, t.shape))}]"
            + ("" if t.is_contiguous() else f" (a view, strides {tuple(t.stride())})"))


# ---------------------------------------------------------------------------------------
# What attention gives, and the classic mistakes' outputs (recorded)

def expected_attention(q, k, v, causal, scale):
    """PyTorch's own attention (SDPA) in float64: what every check compares with."""
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


_MISTAKES = {  # answers.py's attention_mistakes gives the output of each that applies, by key
    "no_scale": "the scores were not multiplied by the scale (sm_scale, or 1/sqrt(D) when "
                "sm_scale is None)",
    "scale_twice": "the scale was applied twice",
    "softmax_over_queries": "the softmax ran over the queries (each column of weights sums to "
                            "1): take it over the keys (the last dim), so that each query's "
                            "weights sum to 1",
    "divided_by_d": "the scores were divided by D instead of sqrt(D)",
    "sm_scale_ignored": "sm_scale was ignored: when the caller gives sm_scale, use it instead "
                        "of 1/sqrt(D)",
    "k_not_transposed": "K was not transposed: S = Q K^T, whose entry [i, j] is the dot "
                        "product of query i with key j",
    "mask_missing": "the causal mask was not applied",
    "diagonal_hidden": "the diagonal was masked too: query i sees key i itself, hide only j > i",
    "bottom_right": "the mask was aligned bottom-right (the last query with the last key): "
                    "SDPA's is_causal aligns it top-left, query i sees keys j <= i whatever Nq "
                    "and Nk",
    "heads_modulo": "query head h used K/V head h % Hkv: consecutive query heads share one K/V "
                    "head, so query head h reads K/V head h // (H // Hkv)",
}


def _mistakes(q, k, v, causal, scale, default):
    """{description: recorded output} of the classic mistakes that apply to these inputs."""
    q, k, v = recorded.snapshot(q, k, v)
    return recorded.deferred(lambda: {text: found[key] for found in [answer(
        "naive_attention", "attention_mistakes", q, k, v, causal, scale, default)]
        for key, text in _MISTAKES.items() if key in found})


def _hint(kind, dtype, scale):
    if kind in ("large", "negative"):
        offset = OFFSET[dtype] * (1 if kind == "large" else -1)
        return (f"here every score is about {offset:+g} after scaling, plus a spread of a few "
                "units: softmax must subtract each row's max (torch.softmax and the softmax kernel "
                "do), and S must be fp32, where a score near 1000 keeps its spread (fp16 "
                "rounds it to a multiple of 0.5)")
    if kind == "overflow":
        return (f"here Q K^T is about {OVERFLOW:,.0f} before scaling, past fp16's largest value "
                "(65,504): in fp16 it is inf. Compute S in fp32 (convert Q and K first); "
                f"after scaling by {scale:.3g} it is an ordinary fp32 number")
    return None


def case_attention(fn, B, H, Hkv, Nq, Nk, D, dtype, *, seed, causal=False, sm_scale=None,
                   kind="random", layout="bhnd", forbid=("attention",), what="attention_reference",
                   quiet=False):
    """Call fn(q, k, v, causal=..., [sm_scale=...]) on inputs of this shape, kind and layout
    with `forbid`'s PyTorch functions raising, and compare with SDPA in float64."""
    scale = 1 / math.sqrt(D) if sm_scale is None else sm_scale
    q, k, v = attention_inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, scale=scale, kind=kind,
                               layout=layout)
    kwargs = {"causal": causal} if sm_scale is None else {"causal": causal, "sm_scale": sm_scale}
    name = (f"{what}({dtype_name(dtype)}{'' if kind == 'random' else ' ' + kind} q {_describe(q)}, "
            f"k and v {_describe(k)}, causal={causal}"
            + ("" if sm_scale is None else f", sm_scale={sm_scale:g}") + ")")
    # Asked before the call, while q, k and v hold the values the answers are recorded for.
    mistakes = _mistakes(q, k, v, causal, scale, sm_scale is None)
    out, _ = watched_call(fn, q, k, v, forbid=forbid, **kwargs)
    assert_close(out, expected_attention(q, k, v, causal, scale), name=name, dim_names=BHND,
                 quiet=quiet, hint=_hint(kind, dtype, scale), mistakes=mistakes)
    assert_not_trivial(out, name=name)
    if out.dtype != dtype:
        fail(f"{name} is {dtype_name(out.dtype)}: return the dtype of q ({dtype_name(dtype)}), "
             "whatever you computed in")


# ---------------------------------------------------------------------------------------
# causal_future

def case_causal_future(fn, n_q, n_k):
    name = f"causal_future({n_q}, {n_k}, {DEVICE!r})"
    got = fn(n_q, n_k, DEVICE)
    if not isinstance(got, torch.Tensor):
        fail(f"{name} should return a torch.Tensor, got {type(got).__name__}")
    if tuple(got.shape) != (n_q, n_k):
        fail(f"{name} has shape {tuple(got.shape)}, expected ({n_q}, {n_k}): one row per query, "
             "one column per key")
    if got.dtype != torch.bool:
        fail(f"{name} is {dtype_name(got.dtype)}: return a bool tensor (True = hidden), the kind "
             "masked_fill takes")
    if got.device.type != torch.device(DEVICE).type:
        fail(f"{name} is on {got.device}: make it on the device you are given")
    ones = torch.ones(n_q, n_k, dtype=torch.bool)
    want = ones.triu(1)
    got = got.cpu()
    if torch.equal(got, want):
        return
    why = {"diagonal": (ones.triu(0), "the diagonal is hidden too: query i sees key i itself, "
                                      "hide only j > i"),
           "top-left": (ones.triu(1 + n_k - n_q), "the mask is aligned bottom-right (the last "
                        "query with the last key); SDPA's is_causal aligns it top-left: query i "
                        "sees keys j <= i whatever n_q and n_k"),
           "inverted": (~want, "True and False are swapped: True marks the keys to hide (j > i)")}
    for wrong, text in why.values():
        if torch.equal(got, wrong):
            fail(f"{name} is wrong: {text}")
    i, j = (int(x) for x in (got != want).nonzero()[0])
    fail(f"{name} is wrong at query {i}, key {j}: got {bool(got[i, j])}, expected {bool(want[i, j])} "
         "(True exactly where key j is in the future of query i, j > i)")


def check_causal_future(causal_future):
    for n_q, n_k in [(5, 5), (3, 7), (7, 3), (1, 1), (1, 6), (6, 1)]:
        case_causal_future(causal_future, n_q, n_k)
    print("ok  causal_future: True exactly where j > i, for square and rectangular masks")


# ---------------------------------------------------------------------------------------
# repeat_kv

def case_repeat_kv(fn, B, Hkv, N, D, heads, dtype, *, seed, layout="bhnd"):
    x = in_layout(randn(B, Hkv, N, D, seed=seed).to(DEVICE, dtype), layout)
    name = f"repeat_kv({dtype_name(dtype)} x {_describe(x)}, heads={heads})"
    got = fn(x, heads)
    group = heads // Hkv
    want = x.double().repeat_interleave(group, dim=1)
    mistakes = {"query head h got K/V head h % Hkv: the copies must be consecutive, K/V head j "
                "serving query heads j*g .. j*g+g-1 (query head h reads head h // g)":
                x.double().repeat(1, group, 1, 1)}
    assert_close(got, want, name=name, dim_names=BHND, quiet=True, mistakes=mistakes,
                 atol=0, rtol=0)
    if got.dtype != dtype:
        fail(f"{name} is {dtype_name(got.dtype)}: keep x's dtype ({dtype_name(dtype)})")


def check_repeat_kv(repeat_kv):
    case_repeat_kv(repeat_kv, 2, 2, 5, 16, 6, torch.float32, seed=1)
    case_repeat_kv(repeat_kv, 1, 3, 4, 16, 3, torch.float32, seed=2)   # nothing to repeat
    case_repeat_kv(repeat_kv, 2, 1, 6, 20, 4, torch.float16, seed=3)   # multi-query
    case_repeat_kv(repeat_kv, 1, 2, 7, 24, 8, torch.float32, seed=4, layout="bnhd")
    case_repeat_kv(repeat_kv, 2, 2, 5, 16, 4, torch.float16, seed=5, layout="transposed")
    print("ok  repeat_kv: each K/V head copied to its consecutive query heads")


# ---------------------------------------------------------------------------------------
# attention_reference, naive_attention: the same cases

# The attention checks' case run on a GPU only, (B, H, Hkv, Nq, Nk, D, dtype) and options:
# answers.py records its classic mistakes too (the table is recorded on a CPU).
GPU_CASES = [((1, 2, 1, 40, 56, 32, torch.bfloat16), dict(seed=14, causal=True))]


def _attention_cases(check):
    """The visible cases of both exercises; check(B, H, Hkv, Nq, Nk, D, dtype, **options).
    The first ones name the classic mistakes (square, then causal, then ragged, then GQA)."""
    f32, f16 = torch.float32, torch.float16
    check(1, 2, 2, 10, 24, 24, f32, seed=1)                          # Nk == D: K^T mistakes show
    check(1, 2, 2, 12, 20, 16, f32, seed=2, causal=True, sm_scale=0.3)
    check(2, 1, 1, 9, 29, 20, f32, seed=3, causal=True)              # Nq < Nk
    check(1, 4, 2, 7, 5, 24, f32, seed=4, causal=True, sm_scale=0.2)  # GQA, Nq > Nk
    check(2, 3, 1, 6, 25, 16, f16, seed=5)                           # multi-query
    check(1, 2, 2, 11, 23, 20, f32, seed=6, layout="bnhd", causal=True)
    check(1, 2, 2, 9, 20, 24, f16, seed=7, layout="transposed", sm_scale=0.5)
    check(2, 2, 2, 5, 22, 16, f32, seed=8, layout="shared", causal=True)
    check(1, 2, 1, 12, 26, 16, f32, seed=9, kind="large", causal=True)
    check(1, 2, 2, 9, 19, 16, f16, seed=10, kind="large")
    check(1, 1, 1, 10, 21, 20, f16, seed=11, kind="negative", layout="bnhd", causal=True)
    check(1, 2, 2, 8, 24, 16, f32, seed=12, kind="negative")
    check(1, 2, 1, 19, 16, 16, f16, seed=13, kind="overflow", causal=True)   # Nq > Nk
    for shape, options in pick([], GPU_CASES):  # bf16
        check(*shape, **options)


@checked(RULES)
def check_attention_reference(attention_reference):
    def check(*args, **kwargs):
        case_attention(attention_reference, *args, quiet=True, **kwargs)
    _attention_cases(check)
    print("ok  attention_reference equals SDPA (float64): causal or not, any scale, grouped "
          "heads, views, fp32 and fp16, scores far from zero")


def bad_attention_inputs(fn):
    """(description, call) of inputs the checks expect a ValueError or TypeError for."""
    def t(*shape, dtype=torch.float32):
        return torch.ones(*shape, device=DEVICE, dtype=dtype)
    q = t(1, 2, 8, 16)
    return [
        ("a 3-D q", lambda: fn(q[0], q, q)),
        ("k and v of different lengths", lambda: fn(q, t(1, 2, 8, 16), t(1, 2, 9, 16))),
        ("3 query heads for 2 K/V heads", lambda: fn(t(1, 3, 8, 16), q, q)),
        ("a float16 k with float32 q and v", lambda: fn(q, q.half(), q)),
        ("int32 inputs", lambda: fn(q.int(), q.int(), q.int())),
    ]


def case_naive_attention(fn, *args, quiet=True, **kwargs):
    case_attention(fn, *args, forbid=("matmul", "softmax", "attention"), what="naive_attention",
                   quiet=quiet, **kwargs)


@checked(RULES)
def check_naive_attention(naive_attention):
    def check(*args, **kwargs):
        case_naive_attention(naive_attention, *args, **kwargs)
    _attention_cases(check)
    check_rejects(bad_attention_inputs(naive_attention), name="naive_attention")
    print("ok  naive_attention equals SDPA (float64) with your Triton kernels: causal or not, "
          "any scale, grouped heads, views, fp32 and fp16, scores far from zero; bad inputs "
          "raise")


# ---------------------------------------------------------------------------------------
# sp_bytes

def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def case_sp_bytes(fn, B, H, Nq, Nk, dtype):
    name = f"sp_bytes(B={B}, H={H}, Nq={Nq}, Nk={Nk}, {dtype_name(dtype)})"
    got = fn(B, H, Nq, Nk, dtype)
    want = answer("naive_attention", "sp_bytes", B, H, Nq, Nk, dtype)
    # What each value of answers.py's sp_bytes_mistakes comes from.
    why = dict(zip(answer("naive_attention", "sp_bytes_mistakes", B, H, Nq, Nk, dtype), (
        "that counts elements: multiply by the bytes per element "
        f"({_element_size(dtype)} for {dtype_name(dtype)}: torch.empty((), dtype=dtype).element_size())",
        "that is one matrix: S and P are both [B, H, Nq, Nk], count both",
        "that is one matrix, in elements: count S and P, in bytes")))
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        fail(f"{name} should return a number of bytes, got {type(got).__name__}")
    if got != want:
        fail(f"{name} is {got}, expected {want}. " + why.get(got, "S and P are each "
             "[B, H, Nq, Nk], every element the size of dtype"))


def check_sp_bytes(sp_bytes):
    for B, H, Nq, Nk, dtype in [(1, 1, 4, 4, torch.float32), (2, 16, 1024, 1024, torch.float32),
                                (3, 5, 7, 11, torch.float16), (1, 16, 16384, 16384, torch.float32)]:
        case_sp_bytes(sp_bytes, B, H, Nq, Nk, dtype)
    print("ok  sp_bytes: S and P, in bytes")


# ---------------------------------------------------------------------------------------
# naive_dram_accesses, flash_dram_accesses, flash_one_pass_max_n

_NAIVE_MISTAKES = (  # what each value of answers.py's naive_dram_accesses_mistakes comes from
    "S and P are each written once and read once: 4 N^2, not 2 N^2",
    "count every N^2 access: S written, S read, P written, P read",
    "Q, K, V and O are read or written once too (N d each)",
    "Q, K and V are read and O is written: 4 N d")
_FLASH_MISTAKES = (  # what each value of answers.py's flash_dram_accesses_mistakes comes from
    "you counted full blocks only: a ragged last block of queries still reads all of K and V, "
    "so count blocks with ceil(N / b) (triton.cdiv)",
    "each block of queries reads all of K and all of V: 2 N d per block",
    "the Q blocks are read once and the O blocks written once too: 2 N d more",
    "the Q block and its output accumulator share half the SRAM: b = M // (4 d)")
_ONE_PASS_MISTAKES = (  # answers.py's flash_one_pass_max_n_mistakes: b from all of the SRAM
    " (the Q block and its accumulator take half the SRAM, 2 b d <= M / 2)",)


def _fail_count(name, got, want, mistakes, otherwise):
    """Fail naming every classic mistake whose count equals got (several may coincide)."""
    why = [text for value, text in mistakes if value == got]
    if len(why) > 1:
        why = [f"{len(why)} mistakes give this count: "
               + "; ".join(f"({i}) {text}" for i, text in enumerate(why, 1))]
    fail(f"{name} is {got}, expected {want}. " + (why[0] if why else otherwise))


def _number(got, name):
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        fail(f"{name} should return a number, got {type(got).__name__}")


def case_dram_accesses(naive, flash, one_pass, N, d, M):
    naive_want = answer("naive_attention", "naive_dram_accesses", N, d)
    naive_mistakes = answer("naive_attention", "naive_dram_accesses_mistakes", N, d)
    flash_want = answer("naive_attention", "flash_dram_accesses", N, d, M)
    flash_mistakes = answer("naive_attention", "flash_dram_accesses_mistakes", N, d, M)
    b = answer("naive_attention", "flash_one_pass_max_n", d, M)
    one_pass_why = dict(zip(answer("naive_attention", "flash_one_pass_max_n_mistakes", d, M),
                            _ONE_PASS_MISTAKES))
    name = f"naive_dram_accesses(N={N}, d={d})"
    got = naive(N, d)
    _number(got, name)
    if got != naive_want:
        _fail_count(name, got, naive_want, list(zip(naive_mistakes, _NAIVE_MISTAKES)),
                    "follow the docstring: each kernel reads its inputs once and writes its output once")
    name = f"flash_dram_accesses(N={N}, d={d}, M={M})"
    got = flash(N, d, M)
    _number(got, name)
    if got != flash_want:
        _fail_count(f"{name} (b = M // (4 d) = {b})", got, flash_want,
                    list(zip(flash_mistakes, _FLASH_MISTAKES)), "follow the docstring")
    name = f"flash_one_pass_max_n(d={d}, M={M})"
    got = one_pass(d, M)
    _number(got, name)
    if got != b:
        fail(f"{name} is {got}, expected {b}: the longest N that one block of b = M // (4 d) "
             "queries covers" + one_pass_why.get(got, ""))


def check_dram_accesses(naive_dram_accesses, flash_dram_accesses, flash_one_pass_max_n):
    for N, d, M in [(1, 16, 64), (100, 16, 6400), (1050, 16, 6400), (1000, 64, 116_736),
                    (4096, 128, 116_736), (16384, 64, 100_000)]:
        case_dram_accesses(naive_dram_accesses, flash_dram_accesses, flash_one_pass_max_n, N, d, M)
    check_rejects([("an SRAM smaller than 4 d (M=100, d=64)",
                    lambda: flash_dram_accesses(1024, 64, 100))], name="flash_dram_accesses")
    print("ok  naive_dram_accesses, flash_dram_accesses and flash_one_pass_max_n follow the model")
