"""Visible checks of module 08 (the FlashAttention backward pass). Hidden tests reuse the
`case_*` functions with inputs the learner never sees: the same kinds of input (dtypes,
memory layouts, value ranges, causal or not, grouped-query heads, ragged lengths), at other
sizes and seeds.

Every gradient is compared with float64 autograd through attention computed from the same
inputs. What the answer key's own formulas give (delta, the size of the terms a gradient
sums, which sets its tolerance, and the outputs of this module's classic mistakes, by which
a failing check names the one it matches) is recorded for these inputs
(course/recorded.py; grader/lessons/08_flash_backward/answers.py computes it).
"""
import ast
import contextlib
import inspect
import math
import textwrap

import torch
import triton

from course import DEVICE, INTERPRET
from course.checks.flash_forward import LAYOUTS  # noqa: F401  (hidden.py's layouts)
from course.checks.flash_forward import (BF16, EXTREME_SHIFT, F16, F32, MARGIN, _future, _views_hint,
                                         attention_values, block_d, in_layout)
from course.gpu_compile import _dependencies, compile_for_gpu
from course import recorded
from course.recorded import answer
from course.testing import check_choice  # noqa: F401  (the question's test cell)
from course.testing import (Guarded, assert_close, assert_not_trivial, check_rejects, dtype_name,
                            fail, guarded_input, guarded_output, hinted, join_hints, randn,
                            tolerance, watched_call)
from course.rules import FORBIDDEN_NAMES, Avoids, JitKernel, Launches, checked

# Read off the notebook's code (course/rules.py), by these checks and by the grader: what
# no run shows (autograd used, a kernel defined twice, a store racing where an atomic add
# belongs).
AUTOGRAD = ("autograd", "backward", "grad", "requires_grad", "requires_grad_", "vjp", "jvp",
            "jacobian")
NO_AUTOGRAD = "derive the gradient by hand, as the lesson does: no autograd"


class AtomicDQ:
    """Every write through a pointer computed from bwd_dkdv_kernel's DQ (followed through
    assignments and into the functions it is passed to) is tl.atomic_add, and there is one:
    the interpreter runs programs one after another, so no run shows the race of a store."""

    def problems(self, defs):
        functions = {name: places[-1][1] for name, places in defs.items()
                     if isinstance(places[-1][1], ast.FunctionDef)}
        return dq_write_problems(functions)


RULES = {
    "test_softmax_backward": [Avoids("softmax_backward", AUTOGRAD, NO_AUTOGRAD)],
    "test_attention_backward_reference": [Avoids("attention_backward_reference", AUTOGRAD, NO_AUTOGRAD)],
    "test_bwd_preprocess_kernel": [JitKernel("bwd_preprocess_kernel"), JitKernel("_row_delta")],
    "test_bwd_dkdv_kernel": [JitKernel("bwd_dkdv_kernel"), JitKernel("_dkdv_q_blocks")],
    "test_bwd_dq_kernel": [JitKernel("bwd_dq_kernel"), JitKernel("_dq_kv_blocks")],
    "test_accumulate_dq": [JitKernel("bwd_dkdv_kernel"), JitKernel("_accumulate_dq"), AtomicDQ()],
    "test_flash_backward": [
        Launches("flash_backward", "bwd_dkdv_kernel", forbid="matmul"),
        Launches("flash_backward", "bwd_dq_kernel", forbid="softmax"),
        Launches("flash_backward", "bwd_preprocess_kernel", forbid="attention")],
    "test_flash_attention_function": [
        Launches("autograd_forward", "flash_attention_kernel", forbid="matmul"),
        Launches("autograd_backward", "bwd_dkdv_kernel", forbid="matmul"),
        Avoids("attention_gradients", tuple(sorted(FORBIDDEN_NAMES["softmax"] | {"attention_reference"})),
               "one step through FlashAttentionFunction.apply: the gradients come from your kernels")],
}

DTYPES = (F32, F16) if INTERPRET else (F32, F16, BF16)  # bf16 only on a GPU (hidden tests)
# The kernels take q, k and v through their strides but read each row's head dim as one
# contiguous vector: every layout but "transposed" (the wrappers copy that one).
KERNEL_LAYOUTS = ("contiguous", "bnhd", "sliced")
QUERY_DIMS = ("batch", "head", "query", "dim")
KEY_DIMS = ("batch", "kv head", "key", "dim")
INTERPRETER_BLOCK = 32  # the wrapper's default BLOCK_M and BLOCK_N in the interpreter
FORBID = ("attention", "softmax", "matmul")
# The "extreme" kind's shift of q[..., 0] and k[..., 0]: rows of raw scores at +-1024, scaled
# ones at +-128 to +-256, past where exp overflows fp32 (88) or fp16 (11). (The forward's
# shift, 256 in fp16, would put lse at +-16384, where fp32's rounding of lse alone moves P
# by 1e-3: more than a gradient's tolerance once K's column of 256 multiplies it.)
BACKWARD_SHIFT = 32.0
# The cases each check adds on a GPU (bf16, real sizes), as (args, kwargs) of its case
# function: grader/lessons/08_flash_backward/answers.py records their answers too.
GPU_CASES = {
    "check_attention_backward_reference": [((2, 4, 2, 300, 257, 64, BF16), dict(seed=9, causal=True))],
    "check_bwd_preprocess_kernel": [((2, 4, 1000, 128, BF16), dict(seed=5, block_m=64))],
    "check_bwd_dkdv_kernel": [((2, 4, 2, 300, 517, 128, BF16), dict(seed=10, blocks=(64, 64))),
                              ((1, 4, 4, 250, 250, 64, F16), dict(seed=11, causal=True, blocks=(64, 32)))],
    "check_bwd_dq_kernel": [((2, 4, 2, 517, 300, 128, BF16), dict(seed=10, blocks=(64, 64))),
                            ((1, 4, 4, 250, 250, 64, F16), dict(seed=11, causal=True, blocks=(64, 32)))],
    "check_accumulate_dq": [((2, 4, 2, 300, 517, 128, BF16), dict(seed=10, blocks=(64, 64)))],
    "check_flash_backward": [((2, 4, 2, 777, 1025, 128, BF16),
                              dict(seed=7, causal=True, layouts=("bnhd",) * 5)),
                             ((1, 4, 4, 300, 300, 64, F16), dict(seed=8, fused=True))],
    "check_flash_attention_function": [((2, 4, 2, 1000, 1000, 128, BF16),
                                        dict(seed=7, causal=True, layouts=("bnhd",) * 4))],
}


def _gpu_cases(check):
    """The cases `check` adds on a GPU (none in the interpreter)."""
    return [] if INTERPRET else GPU_CASES[check]


def _f64(t):
    return t.detach().to(DEVICE, torch.float64)


def _scale(D, sm_scale):
    return 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)


def _tolerance(dtype, size):
    """(atol, rtol) for a result from inputs in `dtype`: the dtype's tolerance, the absolute
    part scaled by `size`, the result's largest entry (results grow with the values; for a
    gradient, the largest of the terms each entry sums, which may cancel)."""
    atol, rtol = tolerance(dtype, DEVICE)
    return atol * max(1.0, size), rtol


# ---------------------------------------------------------------------------------------
# 1. softmax's gradient

def softmax_values(shape, dim, dtype, *, seed, kind="random"):
    """(x float64, p = softmax(x, dim) in dtype, dp in dtype) on DEVICE. kind "random":
    standard normal logits and dp; "extreme": logits shifted far above zero in some rows
    and far below in the others, spread by 30 inside a row (weights of exactly 0 and
    nearly 1), and dp of size +-1000."""
    x = randn(*shape, seed=seed, dtype=torch.float64)
    dp = randn(*shape, seed=seed + 1)
    if kind == "extreme":
        rows = x.movedim(dim, -1)
        shift = 1e4 * (1.0 - 2.0 * (torch.arange(rows[..., 0].numel()) % 2).double())
        x = (30 * rows + shift.view(rows.shape[:-1])[..., None]).movedim(-1, dim)
        dp = 1000 * dp
    elif kind != "random":
        raise ValueError(f"unknown kind of values {kind!r}")
    p = torch.softmax(x, dim)
    return x.to(DEVICE), p.to(DEVICE, dtype), dp.to(DEVICE, dtype)


_SOFTMAX_MISTAKES = (  # what each output of answers.py's softmax_mistakes comes from
    "dx = p * dp: the sum over the row, sum(p * dp), was not subtracted from dp",
    "dx = dp - sum(p * dp): the factor p in front is missing (row i of the Jacobian is p_i "
    "(delta_ij - p_j))",
    "dx = p * (dp - sum(dp)): the sum must weigh dp by p: sum(p * dp)",
    "dx = p * (dp - p * dp): sum(p * dp) over the softmax's dim is one number per row")


def softmax_mistakes(p, dp, dim):
    """{description: recorded output} of the classic mistakes of softmax's gradient, the sum
    over each other dim last (a mistake that changes nothing here has none)."""
    others = [f"the sum ran over dim {other}, not over the softmax's dim {dim}"
              for other in range(p.dim()) if other != dim % p.dim()]
    found = zip((*_SOFTMAX_MISTAKES, *others), answer("flash_backward", "softmax_mistakes", p, dp, dim))
    return {description: wrong for description, wrong in found if wrong}


def case_softmax_backward(fn, shape, dim, dtype, *, seed, kind="random", layout="contiguous",
                          quiet=False):
    """layout "transposed": p and dp are views of tensors stored with their last two dims
    swapped."""
    x, p, dp = softmax_values(shape, dim, dtype, seed=seed, kind=kind)
    if layout == "transposed":
        p, dp = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (p, dp))
    elif layout != "contiguous":
        raise ValueError(f"unknown layout {layout!r}")
    name = (f"softmax_backward({dtype_name(dtype)}{'' if kind == 'random' else ' ' + kind}, "
            f"shape {tuple(shape)}, dim={dim}{'' if layout == 'contiguous' else ', p and dp views'})")
    mistakes = recorded.deferred(lambda: softmax_mistakes(p, dp, dim))
    x = x.detach().requires_grad_()
    torch.softmax(x, dim).backward(_f64(dp))
    out = fn(p, dp, dim=dim)
    atol, rtol = _tolerance(dtype, float(x.grad.abs().max()))
    hint = kind == "extreme" and ("p holds exact zeros and weights near 1 here, and dp is about "
                                  "+-1000: compute the sum in fp32 or better")
    assert_close(out, x.grad, name=name, atol=atol, rtol=rtol, mistakes=mistakes,
                 hint=hint or None, quiet=quiet)
    assert_not_trivial(out, name=name)
    if out.dtype != p.dtype:
        fail(f"{name} returned {dtype_name(out.dtype)}; return the gradient in p's dtype "
             f"({dtype_name(p.dtype)}), after computing it in fp32")


@checked(RULES)
def check_softmax_backward(softmax_backward):
    def case(*args, **kwargs):
        case_softmax_backward(softmax_backward, *args, **kwargs)
    case((4, 7), -1, F32, seed=1)
    case((6, 5), 0, F32, seed=2)
    case((3, 5, 9), 1, F16, seed=3)
    case((2, 3, 6, 40), -1, F32, seed=4, layout="transposed")
    case((5, 33), -1, F16, seed=5, kind="extreme")
    case((3, 4, 20), -1, F32, seed=6, kind="extreme")


# ---------------------------------------------------------------------------------------
# 2. attention's gradients: the float64 reference, and the classic mistakes recorded

def _expand(x, heads):
    """GQA: K/V head j serves the query heads j*g .. j*g + g - 1, g = heads // Hkv."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _scores(q, k, causal, scale):
    s = q @ _expand(k, q.shape[1]).transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(_future(s.shape[-2], s.shape[-1], s.device), float("-inf"))
    return s


def forward64(q, k, v, causal, scale):
    """(O, LSE) in float64: softmax(Q K^T * scale + causal mask) V, and the natural-log
    log-sum-exp of each row's scaled scores. K/V may have fewer heads (GQA)."""
    s = _scores(_f64(q), _f64(k), causal, scale)
    return torch.softmax(s, -1) @ _expand(_f64(v), q.shape[1]), torch.logsumexp(s, -1)


def reference_grads(q, k, v, do, causal, scale):
    """(dq, dk, dv) by float64 autograd through attention."""
    q64, k64, v64 = (_f64(t).requires_grad_() for t in (q, k, v))
    s = _scores(q64, k64, causal, scale)
    (torch.softmax(s, -1) @ _expand(v64, q.shape[1])).backward(_f64(do))
    return q64.grad, k64.grad, v64.grad


_GRAD_MISTAKES = {  # answers.py's grad_mistakes: {name: its (dq, dk, dv)}, described
    "delta_from_do": "delta was computed from dO * dO: delta = rowsum(dO * O) (which equals "
                     "rowsum(P * dP))",
    "delta_from_p": "delta was computed from P, and rowsum(P) = 1: delta = rowsum(P * dP) = "
                    "rowsum(dO * O)",
    "ds_no_delta": "dS = P * dP: delta was not subtracted: dS = P * (dP - delta)",
    "ds_is_p": "dS was taken as P: softmax's gradient is dS = P * (dP - delta)",
    "dk_scale_missing": "dK is missing the scale: S = scale * Q Kᵀ, so dK = scale * dSᵀ Q",
    "dk_scale_twice": "dK has the scale twice: dK = scale * dSᵀ Q, once",
    "dq_scale_missing": "dQ is missing the scale: S = scale * Q Kᵀ, so dQ = scale * dS K",
    "dq_scale_twice": "dQ has the scale twice: dQ = scale * dS K, once",
    "lse_base2": "P was recomputed with lse as if it were a base-2 log: lse is the natural log of "
                 "each row's sum, so P = exp(S - lse), or in base 2 exp2(S * log2 e - lse * log2 e) "
                 "(in a kernel: the scores times qk_scale, minus lse * LOG2E_C)",
    "mask_missing": "the causal mask is missing in the backward: P must be 0 where key j > query i "
                    "when it is recomputed, as in the forward",
    "mask_extra": "a causal mask was applied, but this call is not causal",
    "group_first_head": "dK and dV came from the first query head of each group only: {group} query "
                        "heads share each K/V head here (GQA), and its gradients are the sum over "
                        "all of them",
}


def grad_mistakes(q, k, v, do, causal, scale, which):
    """[{description: recorded output}] for dq, dk and dv: the classic mistakes that change
    that gradient (recorded for the ones named by `which`)."""
    found = answer("flash_backward", "grad_mistakes", q, k, v, do, causal, scale, which)
    group = q.shape[1] // k.shape[1]
    return [{description.format(group=group): found[name][index]
             for name, description in _GRAD_MISTAKES.items() if found.get(name) and found[name][index]}
            for index in range(3)]


def backward_values(B, H, Hkv, Nq, Nk, D, dtype, *, seed, kind="random"):
    """q [B, H, Nq, D], k and v [B, Hkv, Nk, D], dO [B, H, Nq, D] in dtype on DEVICE, with
    values of `kind` (flash_forward.attention_values: "random", "extreme" rows of scores far
    above and far below zero, "big_v" values of V about +-2000)."""
    q, k, v = attention_values(B, H, Nq, Nk, D, dtype, seed=seed, kind=kind)
    if kind == "extreme":  # the same shift in every dtype (see BACKWARD_SHIFT)
        q[..., 0] *= BACKWARD_SHIFT / EXTREME_SHIFT[dtype]
        k[..., 0] = BACKWARD_SHIFT
    do = randn(B, H, Nq, D, seed=seed + 3)
    return tuple(t[:, :heads].to(DEVICE, dtype) for t, heads in ((q, H), (k, Hkv), (v, Hkv), (do, H)))


def laid_out(tensors, layouts, seed):
    """Guarded copies of the tensors, each laid out as its layout (flash_forward.in_layout)."""
    return tuple(in_layout(t, layout, seed=seed + 5 + i)
                 for i, (t, layout) in enumerate(zip(tensors, layouts)))


def _kind_hint(kind):
    if kind == "extreme":
        return ("the rows of scores here lie far above or far below zero (thousands): recompute "
                "P as exp(S - lse) with the subtraction inside the exponential (never exp(S) / "
                "exp(lse)), S in fp32")
    if kind in ("big_v", "big_v_negative"):
        return ("V and O are about " + ("-" if kind == "big_v_negative" else "+") + "2,000 here: "
                "dP and delta are large and nearly equal, so compute both, and dP - delta, in fp32")
    return None


def _describe(tensors):
    return ", ".join(f"{n} {tuple(t.shape)}" + ("" if t.is_contiguous() else
                                                f" (a view, strides {tuple(t.stride())})")
                     for n, t in tensors.items())


def _name(fn_name, q, k, v, *, dtype=None, causal, kind, extra="", views=None):
    dtype = dtype or q.dtype
    layouts = "" if all(t.is_contiguous() for t in (views or {}).values()) else \
        "; " + _describe({n: t for n, t in views.items() if not t.is_contiguous()})
    return (f"{fn_name}({dtype_name(dtype)}{'' if kind == 'random' else ' ' + kind}, "
            f"q {tuple(q.shape)}, k/v {tuple(k.shape)}{', causal' if causal else ''}{extra}{layouts})")


def compare_grads(grads, q, k, v, do, *, name, causal, scale, dtype=None, hint=None, which="qkv",
                  quiet=False):
    """Compare (dq, dk, dv) (the ones named by `which`) with float64 autograd; dtype: the
    inputs' dtype, which sets the tolerance."""
    dtype = dtype or q.dtype
    sizes = answer("flash_backward", "grad_sizes", q, k, v, do, causal, scale)
    mistakes = recorded.deferred(lambda: dict(enumerate(grad_mistakes(q, k, v, do, causal, scale, which))))
    expected = reference_grads(q, k, v, do, causal, scale)
    for index, (label, dims) in enumerate((("dq", QUERY_DIMS), ("dk", KEY_DIMS), ("dv", KEY_DIMS))):
        if label[1] not in which:
            continue
        got = grads[index]
        atol, rtol = _tolerance(dtype, sizes[index])
        assert_close(got, expected[index], name=f"{label} of {name}", atol=atol, rtol=rtol,
                     dim_names=dims, mistakes=recorded.deferred(lambda i=index: mistakes[i]),
                     hint=hint, quiet=quiet)
        spread = float((expected[index] - expected[index].flatten()[0]).abs().max())
        if spread > 1e-9 * max(1.0, sizes[index]):  # one key: dq = dk = 0
            assert_not_trivial(got, name=f"{label} of {name}")


def case_reference(fn, B, H, Hkv, Nq, Nk, D, dtype, *, seed, causal=False, sm_scale=None,
                   kind="random", layouts=("contiguous",) * 3, quiet=False):
    q, k, v, do = backward_values(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, kind=kind)
    q, k, v = laid_out((q, k, v), layouts, seed)
    scale = _scale(D, sm_scale)
    o, lse = forward64(q, k, v, causal, scale)
    o, lse = o.to(dtype), lse.float()
    name = _name("attention_backward_reference", q, k, v, causal=causal, kind=kind,
                 extra="" if sm_scale is None else f", sm_scale={sm_scale}",
                 views={"q": q, "k": k, "v": v})
    kwargs = {"causal": causal} | ({} if sm_scale is None else {"sm_scale": sm_scale})
    grads = fn(q, k, v, o, do, lse, **kwargs)
    if not isinstance(grads, (tuple, list)) or len(grads) != 3:
        fail(f"{name} should return three tensors (dq, dk, dv), got {type(grads).__name__}")
    for label, g in zip(("dq", "dk", "dv"), grads):
        if isinstance(g, torch.Tensor) and g.dtype != torch.float64:
            fail(f"{name}: {label} is {dtype_name(g.dtype)}; the reference computes and returns "
                 "float64 (convert the inputs with .double() first)")
    compare_grads(grads, q, k, v, do, name=name, causal=causal, scale=scale, dtype=dtype,
                  hint=join_hints(_kind_hint(kind), sm_scale is not None and f"sm_scale="
                              f"{sm_scale} is given here: use it instead of 1/sqrt(D)"),
                  quiet=quiet)


@checked(RULES)
def check_attention_backward_reference(attention_backward_reference):
    def case(*args, **kwargs):
        case_reference(attention_backward_reference, *args, **kwargs)
    case(1, 2, 2, 20, 20, 16, F32, seed=1)                      # square, one head per K/V head
    case(2, 2, 2, 13, 21, 24, F32, seed=2, causal=True)         # Nq != Nk, causal top-left
    case(1, 4, 2, 17, 11, 16, F16, seed=3, sm_scale=0.3)        # GQA, explicit scale
    case(2, 3, 1, 9, 14, 32, F32, seed=4, causal=True, layouts=("bnhd", "transposed", "sliced"))
    case(1, 2, 2, 16, 16, 32, F32, seed=5, kind="extreme")
    case(1, 2, 1, 12, 15, 16, F16, seed=6, kind="extreme", causal=True)
    case(1, 2, 2, 10, 30, 16, F32, seed=7, kind="big_v")
    case(1, 2, 2, 10, 30, 16, F32, seed=8, kind="big_v_negative", layouts=("sliced", "contiguous", "bnhd"))
    for args, kwargs in _gpu_cases("check_attention_backward_reference"):
        case(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# 3. The kernels, launched directly on guarded buffers

def _precision(dtype):
    return "ieee" if dtype == F32 else "tf32"


@contextlib.contextmanager
def accumulator(start, *, name):
    """An fp32 buffer holding `start`, framed by sentinels (course.testing.Guarded): a
    kernel adds into it; on exit, fail if anything was written around it."""
    g = Guarded(tuple(start.shape), torch.float32, DEVICE, 12345.0, margin=MARGIN)
    g.tensor.copy_(start)
    yield g.tensor
    before, after = g.margins_touched()
    if before or after:
        fail(f"your kernel wrote outside {name}: {before} element(s) before it and {after} after "
             "it in memory. Are the adds masked (rows < N_Q, lanes < HEAD_DIM)?")


def expected_delta(q, k, v, do, causal, scale):
    """delta = rowsum(dO * O) [B, H, Nq] in float64, O the output of attention(q, k, v) in
    q's dtype, as recorded for these inputs."""
    return torch.tensor(answer("flash_backward", "delta", q, k, v, do, causal, scale),
                        dtype=torch.float64, device=DEVICE)


def kernel_inputs(B, H, Hkv, Nq, Nk, D, dtype, *, seed, causal, scale, kind="random",
                  layouts=("contiguous",) * 3):
    """Guarded q, k, v (laid out as `layouts`), dO, and the forward's O (in dtype) and LSE,
    and delta = rowsum(dO * O) (fp32): what the backward kernels read."""
    q, k, v, do = backward_values(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, kind=kind)
    q, k, v = laid_out((q, k, v), layouts, seed)
    o, lse = forward64(q, k, v, causal, scale)
    o = o.to(dtype)
    delta = expected_delta(q, k, v, do, causal, scale)
    return (q, k, v, guarded_input(do, margin=MARGIN), guarded_input(o, margin=MARGIN),
            guarded_input(lse.float(), margin=MARGIN), guarded_input(delta.float(), margin=MARGIN))


def _kernel_hint(q, k, v, D, blocks, layouts_hint=True):
    return join_hints(
        blocks[0] != blocks[1] and f"the blocks differ here (BLOCK_M={blocks[0]} query rows, "
        f"BLOCK_N={blocks[1]} keys)",
        D != block_d(D) and f"D = {D} is not a power of two: BLOCK_D = {block_d(D)}, and the "
        "lanes past HEAD_DIM must be masked",
        layouts_hint and _views_hint({"q": q, "k": k, "v": v}))


def _launch_name(fn_name, q, k, v, causal, kind, sm_scale, blocks, extra=""):
    return _name(fn_name, q, k, v, causal=causal, kind=kind, views={"q": q, "k": k, "v": v},
                 extra=f", BLOCK_M={blocks[0]}, BLOCK_N={blocks[1]}"
                       + ("" if sm_scale is None else f", sm_scale={sm_scale}") + extra)


# -- the preprocessing kernel: delta = rowsum(dO * O)

def delta_mistakes(o, do):
    o, do = _f64(o), _f64(do)
    return {"delta = rowsum(dO * dO): it is the rowsum of dO * O": (do * do).sum(-1),
            "delta = rowsum(O * O): it is the rowsum of dO * O": (o * o).sum(-1),
            "delta = rowsum(O): it is the rowsum of dO * O, an elementwise product": o.sum(-1),
            "delta = rowsum(dO): it is the rowsum of dO * O, an elementwise product": do.sum(-1),
            "delta = 1, the rowsum of P: it is rowsum(P * dP) = rowsum(dO * O)": torch.ones_like(o[..., 0])}


def preprocess_values(B, H, Nq, D, dtype, *, seed, kind="random"):
    """q, k, v of `kind` and a random dO [B, H, Nq, D] in dtype on DEVICE (self-attention)."""
    _, _, _, do = backward_values(B, H, H, Nq, Nq, D, dtype, seed=seed)
    q, k, v = attention_values(B, H, Nq, Nq, D, dtype, seed=seed, kind=kind)
    return q.to(DEVICE, dtype), k.to(DEVICE, dtype), v.to(DEVICE, dtype), do


def case_preprocess(kernel, B, H, Nq, D, dtype, *, seed, block_m=32, kind="random", quiet=False):
    """Launch kernel(O, DO, DELTA, N_Q) on (cdiv(Nq, BLOCK_M), B * H): O the attention output
    of values of `kind`, dO random; DELTA a guarded fp32 [B, H, Nq]."""
    q, k, v, do = preprocess_values(B, H, Nq, D, dtype, seed=seed, kind=kind)
    expected = expected_delta(q, k, v, do, False, _scale(D, None))
    o = forward64(q, k, v, False, _scale(D, None))[0].to(dtype)
    o, do = guarded_input(o, margin=MARGIN), guarded_input(do, margin=MARGIN)
    name = (f"bwd_preprocess_kernel({dtype_name(dtype)}{'' if kind == 'random' else ' ' + kind}, "
            f"O and dO {tuple(o.shape)}, BLOCK_M={block_m})")
    hint = join_hints(D != block_d(D) and f"D = {D} is not a power of two: BLOCK_D = {block_d(D)}, "
                  "and the lanes past HEAD_DIM must be masked", Nq % block_m and
                  f"Nq = {Nq} is not a multiple of BLOCK_M: mask the rows of the last block",
                  _kind_hint(kind))
    with hinted(hint), guarded_output((B, H, Nq), F32, DEVICE, name=f"DELTA of {name}",
                                      margin=MARGIN) as delta:
        kernel[(triton.cdiv(Nq, block_m), B * H)](o, do, delta, Nq, HEAD_DIM=D, BLOCK_D=block_d(D),
                                                  BLOCK_M=block_m)
    atol, rtol = _tolerance(F32, float(expected.abs().max()))
    assert_close(delta, expected, name=f"DELTA of {name}", atol=atol, rtol=rtol,
                 dim_names=("batch", "head", "query"), mistakes=delta_mistakes(o, do), hint=hint,
                 quiet=quiet)
    assert_not_trivial(delta, name=f"DELTA of {name}")


@checked(RULES)
def check_bwd_preprocess_kernel(bwd_preprocess_kernel):
    def case(*args, **kwargs):
        case_preprocess(bwd_preprocess_kernel, *args, **kwargs)
    case(1, 2, 64, 32, F32, seed=1)
    case(2, 3, 45, 24, F16, seed=2, block_m=16)           # ragged rows, D not a power of two
    case(1, 2, 33, 40, F32, seed=3, kind="big_v")
    case(2, 1, 20, 16, F16, seed=4, kind="big_v_negative")
    for args, kwargs in _gpu_cases("check_bwd_preprocess_kernel"):
        case(*args, **kwargs)


# -- the dK/dV kernel (and, with FUSED_DQ, the atomic dQ)

def launch_dkdv(kernel, q, k, v, do, lse, delta, dk, dv, dq, *, causal, scale, blocks, fused):
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    # exp2 may overflow on lanes tl.where then drops (`import course` hides NumPy's warning)
    kernel[(triton.cdiv(Nk, blocks[1]), B * Hkv)](
        q, k, v, do, lse, delta, dk, dv, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        H, Hkv, Nq, Nk, scale, GROUP=H // Hkv, CAUSAL=causal, FUSED_DQ=fused, HEAD_DIM=D,
        BLOCK_D=block_d(D), BLOCK_M=blocks[0], BLOCK_N=blocks[1], DOT_PRECISION=_precision(q.dtype))


def case_dkdv(kernel, B, H, Hkv, Nq, Nk, D, dtype, *, seed, causal=False, sm_scale=None,
              blocks=(32, 32), kind="random", layouts=("contiguous",) * 3, fused=False,
              dq_start=None, quiet=False):
    """Launch the dK/dV kernel on (cdiv(Nk, BLOCK_N), B * Hkv) with guarded inputs and
    outputs and compare dK, dV (and with fused, the fp32 dQ it added to DQ, which starts at
    dq_start, zeros by default) with float64 autograd."""
    scale = _scale(D, sm_scale)
    q, k, v, do, o, lse, delta = kernel_inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, causal=causal,
                                               scale=scale, kind=kind, layouts=layouts)
    name = _launch_name("bwd_dkdv_kernel", q, k, v, causal, kind, sm_scale, blocks,
                        extra=", FUSED_DQ=True" if fused else "")
    hint = join_hints(_kind_hint(kind), _kernel_hint(q, k, v, D, blocks),
                  H != Hkv and f"GROUP = {H // Hkv} query heads share each K/V head here")
    start = torch.zeros(q.shape, device=DEVICE) if dq_start is None else dq_start.to(DEVICE, F32)
    with hinted(hint), \
            guarded_output(k.shape, dtype, DEVICE, name=f"DK of {name}", margin=MARGIN) as dk, \
            guarded_output(v.shape, dtype, DEVICE, name=f"DV of {name}", margin=MARGIN) as dv, \
            accumulator(start, name=f"DQ of {name}") as dq:
        launch_dkdv(kernel, q, k, v, do, lse, delta, dk, dv, dq, causal=causal, scale=scale,
                    blocks=blocks, fused=fused)
    if not fused and not torch.equal(dq, start):
        fail(f"{name} changed DQ although FUSED_DQ=False: only the fused kernel adds into dQ")
    grads = (dq - start if fused else None, dk, dv)
    compare_grads(grads, q, k, v, do, name=name, causal=causal, scale=scale, hint=hint,
                  which="qkv" if fused else "kv", quiet=quiet)
    for label, g in (("DK", dk), ("DV", dv)):
        if g.dtype != k.dtype:
            fail(f"{name}: {label} is {dtype_name(g.dtype)}, expected k's dtype")


@checked(RULES)
def check_bwd_dkdv_kernel(bwd_dkdv_kernel):
    def case(*args, **kwargs):
        case_dkdv(bwd_dkdv_kernel, *args, **kwargs)
    case(1, 2, 2, 64, 64, 32, F32, seed=1)                       # two blocks each way
    case(1, 2, 2, 45, 70, 24, F32, seed=2, blocks=(16, 32))      # ragged Nq != Nk, D = 24
    case(1, 4, 2, 40, 33, 32, F16, seed=3, causal=True, sm_scale=0.3)      # GQA
    case(1, 3, 1, 30, 37, 40, F32, seed=4, layouts=("bnhd", "sliced", "contiguous"))   # MQA, views
    case(1, 2, 1, 40, 40, 32, F16, seed=5, kind="extreme", causal=True, blocks=(32, 16))
    case(1, 2, 2, 20, 60, 16, F32, seed=6, kind="big_v")
    case(1, 1, 1, 20, 60, 16, F32, seed=7, kind="big_v_negative", layouts=("sliced",) * 3)
    for args, kwargs in _gpu_cases("check_bwd_dkdv_kernel"):
        case(*args, **kwargs)


# -- the dQ kernel (it stores delta too)

def case_dq(kernel, B, H, Hkv, Nq, Nk, D, dtype, *, seed, causal=False, sm_scale=None,
            blocks=(32, 32), kind="random", layouts=("contiguous",) * 3, quiet=False):
    """Launch the dQ kernel on (cdiv(Nq, BLOCK_M), B * H) with guarded inputs and outputs;
    compare dQ with float64 autograd and the delta it stores with rowsum(dO * O)."""
    scale = _scale(D, sm_scale)
    q, k, v, do, o, lse, _ = kernel_inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, causal=causal,
                                           scale=scale, kind=kind, layouts=layouts)
    expected = expected_delta(q, k, v, do, causal, scale)
    name = _launch_name("bwd_dq_kernel", q, k, v, causal, kind, sm_scale, blocks)
    hint = join_hints(_kind_hint(kind), _kernel_hint(q, k, v, D, blocks),
                  H != Hkv and f"query head h reads K/V head h // GROUP (GROUP = {H // Hkv} here)")
    with hinted(hint), \
            guarded_output(q.shape, dtype, DEVICE, name=f"DQ of {name}", margin=MARGIN) as dq, \
            guarded_output(q.shape[:3], F32, DEVICE, name=f"DELTA of {name}", margin=MARGIN) as delta:
        kernel[(triton.cdiv(Nq, blocks[0]), B * H)](
            q, k, v, do, o, lse, delta, dq, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            H, Nq, Nk, scale, GROUP=H // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=block_d(D),
            BLOCK_M=blocks[0], BLOCK_N=blocks[1], DOT_PRECISION=_precision(dtype))
    atol, rtol = _tolerance(F32, float(expected.abs().max()))
    assert_close(delta, expected, name=f"DELTA stored by {name}", atol=atol, rtol=rtol,
                 dim_names=("batch", "head", "query"), mistakes=delta_mistakes(o, do), quiet=True,
                 hint="the dQ kernel stores delta = rowsum(dO * O) of its rows for the dK/dV kernel")
    compare_grads((dq, None, None), q, k, v, do, name=name, causal=causal, scale=scale, hint=hint,
                  which="q", quiet=quiet)
    if dq.dtype != q.dtype:
        fail(f"{name}: DQ is {dtype_name(dq.dtype)}, expected q's dtype")


@checked(RULES)
def check_bwd_dq_kernel(bwd_dq_kernel):
    def case(*args, **kwargs):
        case_dq(bwd_dq_kernel, *args, **kwargs)
    case(1, 2, 2, 64, 64, 32, F32, seed=1)
    case(1, 2, 2, 70, 45, 24, F32, seed=2, blocks=(32, 16))      # ragged Nq != Nk, D = 24
    case(1, 4, 2, 33, 40, 32, F16, seed=3, causal=True, sm_scale=0.3)      # GQA
    case(1, 3, 1, 37, 30, 40, F32, seed=4, layouts=("sliced", "contiguous", "bnhd"))   # MQA, views
    case(1, 2, 1, 40, 40, 32, F16, seed=5, kind="extreme", causal=True, blocks=(16, 32))
    case(1, 2, 2, 20, 60, 16, F32, seed=6, kind="big_v")
    case(1, 1, 1, 20, 60, 16, F32, seed=7, kind="big_v_negative", layouts=("bnhd",) * 3)
    for args, kwargs in _gpu_cases("check_bwd_dq_kernel"):
        case(*args, **kwargs)


# -- the fused dQ: what it computes, and that its adds are atomic

_WRITES = ("store", "atomic_add", "atomic_xchg", "atomic_max", "atomic_min", "atomic_and",
           "atomic_or", "atomic_xor", "atomic_cas")


def _callee(call):
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _mentions(node, names):
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _pointer(call):
    if call.args:
        return call.args[0]
    return next((kw.value for kw in call.keywords if kw.arg == "pointer"), None)


def pointer_writes(functions, kernel, pointer):
    """[(function, operation, code)] of every tl.store or tl.atomic_* whose pointer is
    computed from the argument `pointer` of `kernel`: the name is followed through
    assignments (dq_ptrs = DQ + offsets, ...) and into the notebook's functions it is passed
    to, as whatever they call it. functions: {name: ast.FunctionDef}."""
    found, todo, seen = [], [(kernel, pointer)], set()
    while todo:
        name, param = todo.pop()
        if (name, param) in seen or name not in functions:
            continue
        seen.add((name, param))
        fn, derived, grew = functions[name], {param}, True
        while grew:  # until no assignment adds a name computed from the pointer
            grew = False
            for node in ast.walk(fn):
                value = getattr(node, "value", None)
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) \
                        and value is not None and _mentions(value, derived):
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                        for n in ast.walk(target):
                            if isinstance(n, ast.Name) and n.id not in derived:
                                derived.add(n.id)
                                grew = True
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            callee = _callee(node)
            if callee in functions and callee != name:
                params = [a.arg for a in functions[callee].args.args]
                passed = list(zip(params, node.args)) + [(kw.arg, kw.value) for kw in node.keywords]
                todo += [(callee, p) for p, arg in passed if p in params and _mentions(arg, derived)]
            elif callee in _WRITES and _pointer(node) is not None and _mentions(_pointer(node), derived):
                found.append((name, callee, ast.unparse(node)))
    return found


def dq_write_problems(functions, kernel="bwd_dkdv_kernel", pointer="DQ"):
    """What is wrong with how `kernel` writes dQ, as sentences (none: every write through a
    pointer computed from DQ is tl.atomic_add, and there is at least one)."""
    writes = pointer_writes(functions, kernel, pointer)
    problems = [
        f"{fn} writes dQ with tl.{op} ({code[:120]}): in the fused kernel every KV block's "
        "program adds its part to the same rows of dQ, at the same time on a GPU, so the "
        "additions must be atomic: tl.atomic_add(pointers, values, mask=...). A load, an add "
        "and a tl.store race there (two programs read the same old value, one store overwrites "
        "the other's part), although the interpreter, which runs programs one after another, "
        "gives the right sum" if op == "store" else
        f"{fn} writes dQ with tl.{op} ({code[:120]}): dQ is a sum of every KV block's part: "
        "add them with tl.atomic_add"
        for fn, op, code in writes if op != "atomic_add"]
    if not writes:
        problems.append(f"{kernel} never adds into dQ with tl.atomic_add (following {pointer} "
                        "through the functions it calls): with FUSED_DQ each KV block's part of "
                        "dQ = scale * dS K goes into DQ by atomic adds")
    return problems


def notebook_functions(kernel):
    """{name: ast.FunctionDef} of a kernel and the @triton.jit functions it calls, from their
    source; None for a grading proxy (the grader reads the submitted code instead)."""
    fn = getattr(kernel, "fn", None)
    if fn is None or not callable(fn):
        return None
    sources = _dependencies(fn, {fn.__name__}) + [textwrap.dedent(inspect.getsource(fn))]
    return {node.name: node for source in sources for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef)}


def check_atomic_dq(kernel):
    functions = notebook_functions(kernel)
    if functions is None:
        return
    problems = dq_write_problems(functions)
    if problems:
        fail("; ".join(problems))
    print("ok  every write into DQ is tl.atomic_add")


@checked(RULES)
def check_accumulate_dq(bwd_dkdv_kernel):
    def case(*args, **kwargs):
        case_dkdv(bwd_dkdv_kernel, *args, fused=True, **kwargs)
    case(1, 2, 2, 64, 64, 32, F32, seed=1)
    case(1, 2, 2, 45, 70, 24, F32, seed=2, blocks=(16, 32), dq_start=randn(1, 2, 45, 24, seed=12))
    case(1, 4, 2, 40, 33, 32, F16, seed=3, causal=True, sm_scale=0.3,
         layouts=("bnhd", "sliced", "contiguous"))
    case(1, 2, 1, 40, 40, 32, F16, seed=4, kind="extreme", blocks=(32, 16))
    case(1, 2, 1, 20, 60, 16, F32, seed=5, kind="big_v", causal=True)
    case(1, 1, 1, 20, 60, 16, F32, seed=6, kind="big_v_negative", layouts=("sliced", "bnhd", "bnhd"))
    for args, kwargs in _gpu_cases("check_accumulate_dq"):
        case(*args, **kwargs)
    check_atomic_dq(bwd_dkdv_kernel)


# ---------------------------------------------------------------------------------------
# 4. The wrapper, and 5. the autograd Function

def _dkdv_launch_check(name, B, Hkv, Nk, blocks):
    def check(launch, count):
        grid = launch["grid"]
        grid = tuple(grid(launch) if callable(grid) else grid)
        grid = grid + (1,) * (3 - len(grid))
        block_m, block_n = launch.get("BLOCK_M"), launch.get("BLOCK_N")
        wanted = tuple(blocks) if blocks else (INTERPRETER_BLOCK,) * 2 if INTERPRET else None
        if wanted is not None and (block_m, block_n) != wanted:
            fail(f"{name}: bwd_dkdv_kernel was launched with BLOCK_M={block_m}, BLOCK_N={block_n}; "
                 + (f"block_m={blocks[0]}, block_n={blocks[1]} were asked for" if blocks else
                    f"in the interpreter the default blocks are {INTERPRETER_BLOCK} x "
                    f"{INTERPRETER_BLOCK} (smaller ones make every check slower)"))
        if not isinstance(block_n, int):
            fail(f"{name}: bwd_dkdv_kernel was launched without an integer BLOCK_N")
        want = (triton.cdiv(Nk, block_n), B * Hkv, 1)
        if grid != want:
            fail(f"{name}: bwd_dkdv_kernel's grid is {grid}; expected (cdiv(Nk, BLOCK_N), "
                 f"B * Hkv, 1) = {want}: one program per block of BLOCK_N keys of each (batch, "
                 "K/V head) pair, the query blocks (of every query head of the group) walked "
                 "inside each program")
    return check


def case_wrapper(fn, kernel, B, H, Hkv, Nq, Nk, D, dtype, *, seed, causal=False, sm_scale=None,
                 fused=False, blocks=None, kind="random", layouts=("contiguous",) * 5, quiet=False):
    scale = _scale(D, sm_scale)
    q, k, v, do = backward_values(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, kind=kind)
    o, lse = forward64(q, k, v, causal, scale)
    q, k, v, o, do = laid_out((q, k, v, o.to(dtype), do), layouts, seed)
    name = _name("flash_backward", q, k, v, causal=causal, kind=kind,
                 views={"q": q, "k": k, "v": v, "o": o, "do": do},
                 extra=(", fused" if fused else "") + ("" if sm_scale is None else f", sm_scale={sm_scale}")
                 + (f", block_m={blocks[0]}, block_n={blocks[1]}" if blocks else ""))
    kwargs = {"causal": causal, "fused": fused} | ({} if sm_scale is None else {"sm_scale": sm_scale}) \
        | ({"block_m": blocks[0], "block_n": blocks[1]} if blocks else {})
    grads, report = watched_call(fn, q, k, v, o, guarded_input(lse.float(), margin=MARGIN), do,
                                 kernel=kernel, forbid=FORBID, **kwargs,
                                 before_launch=_dkdv_launch_check(name, B, Hkv, Nk, blocks))
    if report["launches"] != 1:
        fail(f"{name}: bwd_dkdv_kernel was launched {report['launches']} times; the wrapper "
             "launches it once (after the dQ kernel, or after the preprocessing with fused=True)")
    if not isinstance(grads, (tuple, list)) or len(grads) != 3:
        fail(f"{name} should return three tensors (dq, dk, dv), got {type(grads).__name__}")
    for label, g, like in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        if isinstance(g, torch.Tensor) and g.dtype != like.dtype:
            converted = fused and label == "dq"
            fail(f"{name}: {label} is {dtype_name(g.dtype)}; return each gradient in its input's "
                 f"dtype ({dtype_name(like.dtype)})"
                 + (": the fp32 dQ buffer of the fused path is converted at the end" if converted else ""))
    compare_grads(grads, q, k, v, do, name=name, causal=causal, scale=scale, quiet=quiet,
                  hint=join_hints(_kind_hint(kind), sm_scale is not None and f"sm_scale={sm_scale} "
                              "is given here: use it instead of 1/sqrt(D)", fused and
                              "fused=True: the dQ buffer is fp32 zeros, filled by the atomic adds"))


def bad_inputs(fn):
    x = torch.ones(1, 2, 8, 16, device=DEVICE)
    lse = torch.zeros(1, 2, 8, device=DEVICE)
    return [("a 3-D q", lambda: fn(x[0], x, x, x, lse, x)),
            ("do shorter than q", lambda: fn(x, x, x, x, lse, x[:, :, :4])),
            ("an fp16 lse", lambda: fn(x, x, x, x, lse.half(), x)),
            ("lse of the wrong shape", lambda: fn(x, x, x, x, lse[:, :1], x)),
            ("o in fp16 with fp32 q, k, v", lambda: fn(x, x, x, x.half(), lse, x)),
            ("a head dim of 8", lambda: fn(*(x[..., :8],) * 4, lse, x[..., :8]))]


@checked(RULES)
def check_flash_backward(flash_backward, bwd_dkdv_kernel):
    def case(*args, **kwargs):
        case_wrapper(flash_backward, bwd_dkdv_kernel, *args, **kwargs)
    case(1, 2, 2, 45, 61, 32, F32, seed=1)
    case(1, 2, 2, 45, 61, 32, F32, seed=1, fused=True)
    case(1, 4, 2, 50, 50, 24, F16, seed=2, causal=True, blocks=(16, 32))
    case(1, 3, 1, 33, 40, 40, F32, seed=3, fused=True, sm_scale=0.3, blocks=(32, 16),
         layouts=("bnhd", "transposed", "sliced", "bnhd", "transposed"))
    case(1, 2, 1, 40, 40, 32, F16, seed=4, kind="extreme", causal=True, fused=True)
    case(1, 2, 2, 20, 60, 16, F32, seed=5, kind="big_v", layouts=("contiguous",) * 4 + ("bnhd",))
    case(1, 1, 1, 20, 60, 16, F32, seed=6, kind="big_v_negative", fused=True)
    for args, kwargs in _gpu_cases("check_flash_backward"):
        case(*args, **kwargs)
    check_rejects(bad_inputs(flash_backward), name="flash_backward")
    print("ok  flash_backward rejects bad inputs with clear errors")


def case_function(fn, kernel, B, H, Hkv, Nq, Nk, D, dtype, *, seed, causal=False, sm_scale=None,
                  fused=False, kind="random", layouts=("contiguous",) * 4, quiet=False):
    """fn = attention_gradients(q, k, v, do, causal, sm_scale, fused) -> (o, lse, dq, dk, dv)
    through FlashAttentionFunction."""
    scale = _scale(D, sm_scale)
    q, k, v, do = backward_values(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, kind=kind)
    q, k, v, do = laid_out((q, k, v, do), layouts, seed)
    name = _name("FlashAttentionFunction", q, k, v, causal=causal, kind=kind,
                 views={"q": q, "k": k, "v": v, "do": do},
                 extra=(", fused" if fused else "")
                 + ("" if sm_scale is None else f", sm_scale={sm_scale}"))
    result, report = watched_call(fn, q, k, v, do, causal=causal, sm_scale=sm_scale, fused=fused,
                                  kernel=kernel, forbid=FORBID)
    if not isinstance(result, (tuple, list)) or len(result) != 5:
        fail(f"attention_gradients should return (o, lse, dq, dk, dv), got {type(result).__name__}")
    if report["launches"] != 1:
        fail(f"{name}: one backward launched bwd_dkdv_kernel {report['launches']} times, not once: "
             "does FlashAttentionFunction.backward call your flash_backward?")
    o, lse, *grads = result
    expected_o, expected_lse = forward64(q, k, v, causal, scale)
    atol, rtol = tolerance(dtype, DEVICE)
    assert_close(o, expected_o, name=f"O of {name}", atol=atol, rtol=rtol, dim_names=QUERY_DIMS, quiet=True,
                 hint="the forward returns module 05's flash_attention(q, k, v, causal, sm_scale)")
    assert_close(lse, expected_lse, name=f"lse of {name}", atol=2e-3, rtol=1e-4, quiet=True,
                 dim_names=("batch", "head", "query"))
    compare_grads(grads, q, k, v, do, name=name, causal=causal, scale=scale, quiet=quiet,
                  hint=join_hints(_kind_hint(kind), sm_scale is not None and f"sm_scale={sm_scale} "
                              "is given here: save it on ctx and pass it to flash_backward",
                              "backward gets do and returns one gradient per input of forward: dq, "
                              "dk, dv, then None for causal, sm_scale and fused, saved on ctx in "
                              "forward"))


@checked(RULES)
def check_flash_attention_function(attention_gradients, bwd_dkdv_kernel):
    def case(*args, **kwargs):
        case_function(attention_gradients, bwd_dkdv_kernel, *args, **kwargs)
    case(1, 2, 2, 45, 61, 32, F32, seed=1)
    case(1, 4, 2, 50, 50, 24, F16, seed=2, causal=True, fused=True)
    case(1, 3, 1, 33, 40, 40, F32, seed=3, sm_scale=0.3, layouts=("bnhd", "transposed", "sliced", "bnhd"))
    case(1, 2, 1, 40, 40, 32, F16, seed=4, kind="extreme", causal=True)
    case(1, 2, 2, 20, 60, 16, F32, seed=5, kind="big_v", fused=True)
    case(1, 1, 1, 20, 60, 16, F32, seed=6, kind="big_v_negative", causal=True)
    for args, kwargs in _gpu_cases("check_flash_attention_function"):
        case(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# The kernels compiled for an H100 without running them

def compile_kernels_for_gpu(bwd_dkdv_kernel, bwd_dq_kernel, capability=90):
    """Compile both kernels with the signatures the wrapper gives them (fp16, D = 64,
    64 x 64 tiles, causal; the dK/dV kernel fused, with GQA)."""
    pointers = {name: "*fp16" for name in ("Q", "K", "V", "DO", "O", "DK", "DV")}
    pointers |= {name: "*fp32" for name in ("LSE", "DELTA")}
    strides = {f"stride_{t}{d}": "i32" for t in "qkv" for d in "bhn"}
    sizes = {"H": "i32", "H_KV": "i32", "N_Q": "i32", "N_K": "i32", "sm_scale": "fp32"}
    constants = {"GROUP": 2, "CAUSAL": True, "HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_M": 64,
                 "BLOCK_N": 64, "DOT_PRECISION": "tf32"}
    for kernel, dq_type, extra in ((bwd_dkdv_kernel, "*fp32", {"FUSED_DQ": True}),
                                   (bwd_dq_kernel, "*fp16", {})):
        arguments = inspect.signature(getattr(kernel, "fn", kernel)).parameters
        signature = {name: (pointers | strides | sizes | {"DQ": dq_type}).get(name, "constexpr")
                     for name in arguments}
        compile_for_gpu(kernel, signature, {name: value for name, value in (constants | extra).items()
                                            if name in arguments}, capability)
