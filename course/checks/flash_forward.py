"""Visible checks of module 05 (FlashAttention forward). Hidden tests reuse the `case_*`
functions with inputs the learner never sees: the same kinds of input (dtypes, memory
layouts, value ranges, causal or not, ragged lengths), at other sizes and seeds.

Every output is compared with attention computed in float64 from the same inputs. The
outputs of this module's classic mistakes, by which a failure names the one the output
matches, are the answer key's (course/recorded.py): recorded for these checks' inputs.
"""
import contextlib
import math

import torch
import triton

from course import DEVICE, INTERPRET, pick, recorded
from course.gpu_compile import compile_for_gpu
from course.recorded import answer, matches
from course.testing import (assert_close, assert_not_trivial, check_choice,  # noqa: F401
                            check_rejects, dtype_name, explain_nan_from_guards, fail,
                            guarded_input, guarded_output, randn, tolerance, watched_call, hinted,
                            join_hints)
from course.rules import FORBIDDEN_NAMES, Avoids, JitKernel, Launches, checked

# Checked on the submitted code (course/rules.py): the worker's launch count and forbidden
# functions are only as honest as the notebook lets them be.
RULES = {
    "test_flash_attention_blocked": [
        Avoids("flash_attention_blocked", tuple(sorted(FORBIDDEN_NAMES["softmax"])),
               "compute the softmax block by block with the running max and sum, not with "
               "PyTorch's softmax")],
    "test_flash_attention_kernel": [JitKernel("flash_attention_kernel")],
    "test_flash_attention": [
        Launches("flash_attention", "flash_attention_kernel", forbid="softmax"),
        Launches("flash_attention", "flash_attention_kernel", forbid="matmul")],
}


LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DTYPES = (F32, F16) if INTERPRET else (F32, F16, BF16)
BHND = ("batch", "head", "query", "dim")
BHN = ("batch", "head", "query")
# Memory layouts of a [B, H, N, D] input (see in_layout) and of the kernel's output O.
LAYOUTS = ("contiguous", "bnhd", "transposed", "sliced")
OUT_LAYOUTS = ("contiguous", "bnhd", "sliced")
LSE_TOLERANCE = (2e-3, 1e-4)  # fp32 statistics whatever the inputs' dtype
# Guard margins (entries of NaN or sentinel on each side of a tensor). In the interpreter,
# none: course.bounds stops any load or store outside a tensor's storage and names the
# tensor, even a load of padded head-dim lanes whose values would never reach O (and every
# guarded byte travels to the grading worker and back). On a GPU nothing stops a stray
# access, so margins turn it into NaN or a changed sentinel.
MARGIN = 0 if INTERPRET else 4096
INTERPRETER_BLOCKS = (32, 32)  # the wrapper's default BLOCK_Q, BLOCK_K in the interpreter
GPU_BLOCKS = (64, 64)  # the blocks the classic mistakes are recorded for on a GPU
# Kinds of values (attention_values): the raw score shift of "extreme" rows, per dtype. In
# fp16, 256 * 256 = 65,536 passes fp16's largest value (65,504); in fp32 the shift is kept
# small enough for fp32 scores to stay accurate to 1e-4.
EXTREME_SHIFT = {F16: 256.0, BF16: 256.0, F32: 32.0}
BIG_V = 2000.0  # about -1024 would collide with guarded_output's "never written" value


# ---------------------------------------------------------------------------------------
# The launch grid and the questions

_GRID_MISTAKES = (  # what each grid of answers.py's flash_grid_mistakes comes from
    "a ragged last block of queries got no program: count query blocks with "
    "ceil(seq_len / block_q) (triton.cdiv), not seq_len // block_q",
    "the axes are swapped: query blocks go on axis 0 (it may hold 2**31 - 1 programs), "
    "batch * heads on axis 1",
    "batch and heads share axis 1 as batch * heads; axis 2 is 1",
    "one program owns block_q queries, not one: cdiv(seq_len, block_q) programs on axis 0")


def case_flash_grid(flash_grid, seq_len, batch, heads, block_q):
    name = f"flash_grid(seq_len={seq_len}, batch={batch}, heads={heads}, block_q={block_q})"
    got = flash_grid(seq_len, batch, heads, block_q)
    args = (seq_len, batch, heads, block_q)
    want = tuple(answer("flash_forward", "flash_grid", *args))
    why = dict(zip(map(tuple, answer("flash_forward", "flash_grid_mistakes", *args)), _GRID_MISTAKES))
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        fail(f"{name} should return a tuple of 3 ints (axis 0, axis 1, axis 2), got {got!r}")
    if tuple(got) == want:
        return
    fail(f"{name} is {tuple(got)!r}, expected {want}: " +
         why.get(tuple(got), "(cdiv(seq_len, block_q), batch * heads, 1): one program per block "
                             "of block_q queries of each (batch, head) pair"))


def check_flash_grid(flash_grid):
    for args in [(8, 1, 1, 2), (97, 2, 3, 32), (64, 1, 2, 64), (1, 1, 1, 16), (4096, 8, 16, 128)]:
        case_flash_grid(flash_grid, *args)
    print("ok  flash_grid: (cdiv(seq_len, block_q), batch * heads, 1)")


def check_number(answer, name):
    """The form of a numeric answer (a whole number); hidden tests judge the number."""
    if isinstance(answer, bool) or not isinstance(answer, int):
        fail(f"{name} should be a whole number, e.g. {name} = 3; got {type(answer).__name__}")
    if answer < 0:
        fail(f"{name} is {answer}: a number of programs is not negative")
    print(f"ok  {name}: a whole number (whether it is right is checked when you submit)")


# ---------------------------------------------------------------------------------------
# Inputs: values of one kind, laid out in memory one way

def attention_values(B, H, Nq, Nk, D, dtype, *, seed, kind="random"):
    """fp32 q [B, H, Nq, D], k and v [B, H, Nk, D] on the CPU whose values, once in
    `dtype`, are of `kind`:
    "random": standard normal;
    "extreme": q[..., 0] = +s on even query rows and -s on odd ones, k[..., 0] = s for every
        key (s = EXTREME_SHIFT[dtype]), the rest normal: each row's scores are shifted far
        above or far below zero by +-s^2 (65,536 for fp16) and differ as usual inside the row;
    "big_v", "big_v_negative": v about +2000 (or -2000), q small (nearly uniform weights),
        so the accumulator sums to about Nk * 2000 before the final division."""
    q = randn(B, H, Nq, D, seed=seed)
    k = randn(B, H, Nk, D, seed=seed + 1)
    v = randn(B, H, Nk, D, seed=seed + 2)
    if kind == "extreme":
        shift = EXTREME_SHIFT[dtype]
        sign = 1.0 - 2.0 * (torch.arange(Nq) % 2).float()
        q[..., 0] = shift * sign
        k[..., 0] = shift
    elif kind in ("big_v", "big_v_negative"):
        q = q * 0.1
        v = (BIG_V + 100.0 * v) * (1.0 if kind == "big_v" else -1.0)
    elif kind != "random":
        raise ValueError(f"unknown kind of values {kind!r}")
    return q, k, v


def in_layout(x, layout, *, seed=0):
    """x [B, H, N, D] copied into guarded memory (NaN before and after it) and returned as
    a view laid out as `layout`: "contiguous"; "bnhd": stored as [B, N, H, D] (how
    attention's projections come out) and viewed as [B, H, N, D]; "transposed": each
    [N, D] matrix stored column by column (stride of D > 1, stride of N = 1); "sliced":
    the first D of rows D + 5 long, at a storage offset (random numbers between rows)."""
    if layout == "contiguous":
        return guarded_input(x, margin=MARGIN)
    if layout == "bnhd":
        return guarded_input(x.transpose(1, 2).contiguous(), margin=MARGIN).transpose(1, 2)
    if layout == "transposed":
        return guarded_input(x.transpose(-1, -2).contiguous(), margin=MARGIN).transpose(-1, -2)
    if layout == "sliced":
        D = x.shape[-1]
        wide = randn(*x.shape[:-1], D + 5, dtype=x.dtype, device=x.device, seed=seed)
        wide[..., 2:2 + D] = x
        return guarded_input(wide, margin=MARGIN)[..., 2:2 + D]
    raise ValueError(f"unknown layout {layout!r}")


def attention_inputs(B, H, Nq, Nk, D, dtype, *, seed, kind="random", layouts=("contiguous",) * 3):
    """Guarded q, k, v of `kind` (attention_values) in `dtype` on DEVICE, laid out as
    `layouts` (one per tensor, see in_layout)."""
    values = attention_values(B, H, Nq, Nk, D, dtype, seed=seed, kind=kind)
    return tuple(in_layout(t.to(DEVICE, dtype), layout, seed=seed + 5 + i)
                 for i, (t, layout) in enumerate(zip(values, layouts)))


def _describe(x):
    return (f"[{', '.join(map(str, x.shape))}]"
            + ("" if x.is_contiguous() else f" (a view, strides {tuple(x.stride())})"))


def _name(fn_name, q, k, v, *, causal, kind, extra=""):
    layouts = "" if all(t.is_contiguous() for t in (q, k, v)) else \
        f"; q {_describe(q)}, k {_describe(k)}, v {_describe(v)}"
    return (f"{fn_name}({dtype_name(q.dtype)}{'' if kind == 'random' else ' ' + kind}, "
            f"q {tuple(q.shape)}, k/v {tuple(k.shape)}{', causal' if causal else ''}{extra}{layouts})")


# ---------------------------------------------------------------------------------------
# The reference (float64), and the classic mistakes' outputs (recorded)

def _f64(t):
    return t.detach().to(DEVICE, torch.float64)


def _future(Nq, Nk, device, diagonal=1):
    """True where key j is in the future of query i (j > i), top-left aligned; with
    diagonal=0 the diagonal counts as future too (a mistake)."""
    return torch.ones(Nq, Nk, dtype=torch.bool, device=device).triu(diagonal)


def _attend(s, v):
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def reference(q, k, v, causal=False, scale=None):
    """(O, LSE) in float64: softmax(Q K^T * scale + causal mask) V and the natural-log
    log-sum-exp of each row's scaled scores."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(_future(s.shape[-2], s.shape[-1], s.device), float("-inf"))
    return _attend(s, v)


class _Lazy(dict):
    """{description: function giving a wrong output}: computed only when a comparison has
    failed and assert_close looks for the classic mistake the output matches (module 09's
    checks build their mistakes this way)."""

    def items(self):
        for description, compute in super().items():
            try:
                wrong = compute()
            except Exception:  # noqa: BLE001 (a mistake that cannot happen with these shapes)
                continue
            if wrong is not None:
                yield description, wrong


_EXP2 = ("the scores are in base 2 (qk_scale = sm_scale * log2 e), so every exponential of "
         "the loop, p and alpha, must be exp2")


def _loop_mistakes(q, k, v, base2):
    """{key: description} of the classic mistakes of this module's loop (base2: the kernel,
    in base 2 with exp2; else flash_attention_blocked, natural with exp), in the order they
    are looked for: answers.py's kernel_mistakes gives the output of each that applies."""
    exp = "exp2" if base2 else "exp"
    text = {
        "k_not_transposed": "K was not transposed: S = Q K instead of Q Kᵀ. Read each K tile "
                            "transposed, [BLOCK_D, BLOCK_K]: head-dim lanes down (stride_kd), keys "
                            "across (stride_kn)",
        "acc_not_rescaled": "the accumulator was not rescaled: when the running max grows, "
                            f"multiply acc by alpha = {exp}(m_old - m_new) before adding p @ v (as "
                            "l is)",
        "l_not_rescaled": "the running sum l was not rescaled by alpha before adding the new "
                          "block's sum",
        "alpha_one": f"alpha came out as 1: it was computed after m was replaced ({exp}(m - m) = "
                     "1); compute alpha from the old max, before m becomes m_new",
        "max_not_updated": "the running max was never updated (m stays -inf, so alpha = 0 and "
                           "only the last key block counts): set m_i = m_new at the end of every "
                           "iteration",
        "no_division": "the final division is missing: O = acc / l, one division per row after "
                       "the loop",
        "max_from_zero": "the running max started at 0 instead of -inf: rows whose scores all "
                         f"lie far below zero then have {exp}(s - 0) = 0 everywhere, and 0 / 0",
        "tail_counted": f"the keys past Nk = {k.shape[2]} in the last block were counted (with "
                        "score 0 and value 0): the K loads are masked, but the tail's scores "
                        "must also be set to -inf (tl.where(key < N_K, s, -inf))",
        "p_exp": "p = exp(...) but alpha = exp2(...): " + _EXP2,
        "alpha_exp": "alpha = exp(...) but p = exp2(...): " + _EXP2,
        "exp_not_exp2": "exp instead of exp2: " + _EXP2,
        "sm_scale_only": "the scores were scaled by sm_scale only: exp2 needs them times log2 e "
                         "too (qk_scale = sm_scale * log2 e)",
        "qk_scale_missing": "the scale was not applied: multiply Q Kᵀ by qk_scale once",
        "qk_scale_twice": "the scale was applied twice: multiply Q Kᵀ by qk_scale once",
        "scale_missing": "the scale was not applied: multiply Q Kᵀ by the scale once",
        "scale_twice": "the scale was applied twice",
        "mask_missing": "the causal mask was not applied: query i may only see keys j <= i",
        "diagonal_hidden": "the causal mask also hid the diagonal: query i sees keys j <= i, "
                           "itself included (j < i leaves query 0 with no key, and 0 / 0)",
        "mask_applied": "a causal mask was applied, but this call is not causal",
    }
    for which, x in (("q", q), ("k", k), ("v", v)):
        text[f"{which}_batch_as_heads"] = (
            f"{which}'s batch offset was taken as (b * H + h) * stride_{which}h, which holds only "
            f"for a contiguous [B, H, N, D] tensor; here {which} has strides {tuple(x.stride())}: "
            f"use b * stride_{which}b + h * stride_{which}h")
    return text


_LSE_MISTAKES = {  # answers.py's lse_mistakes gives the LSE of each, by key
    "base_2": "LSE is in base 2 (m + log2 l): the backward wants the natural log, "
              "(m + log2 l) * ln 2",
    "mixed_bases": "LSE mixes bases: m is in base 2, so LSE = (m + log2 l) * ln 2, not m + ln l",
    "max_only": "LSE holds the running max only: add log2 l before converting to the natural log",
    "minus_inf": "LSE is -inf: the running max was never updated (m stays -inf): set m_i = m_new "
                 "at the end of every iteration",
}


def mistake_questions(q, k, v, blocks, scale, causal, *, base2=True, lse=True):
    """[(name, arguments)] of the answers a comparison asks for: the outputs of the loop's
    classic mistakes (a batch offset's mistake depends on the inputs' strides) and, with
    lse, those of LSE."""
    strides = [list(t.stride()) for t in (q, k, v)]
    return ([("kernel_mistakes", (q, k, v, *blocks, scale, causal, base2, strides))]
            + ([("lse_mistakes", (q, k, scale, causal))] if lse else []))


def _mistakes(q, k, v, blocks, scale, causal, *, base2=True, lse=True):
    """({description: recorded O}, {description: recorded LSE}, or None without lse) of the
    classic mistakes these inputs can show. Asked before the launch, while q, k and v hold
    the values the answers are recorded for."""
    texts = _loop_mistakes(q, k, v, base2)
    questions = [(name, recorded.snapshot(*args))
                 for name, args in mistake_questions(q, k, v, blocks, scale, causal, base2=base2, lse=lse)]
    found = recorded.deferred(lambda: dict(enumerate(answer("flash_forward", name, *args)
                                                     for name, args in questions)))
    o = recorded.deferred(lambda: {text: found[0][key] for key, text in texts.items() if key in found[0]})
    return o, (recorded.deferred(lambda: {text: found[1][key] for key, text in _LSE_MISTAKES.items()
                                          if key in found[1]}) if lse else None)


def _matches(out, mistakes):
    atol, rtol = tolerance(out.dtype, out.device)
    a = out.detach().to("cpu", torch.float64)
    return any(matches(a, wrong, atol, rtol) for wrong in mistakes.values())


def _kind_hint(kind, dtype, Nk, D, scale):
    if kind == "extreme":
        shift = EXTREME_SHIFT[dtype] ** 2
        return (f"the rows here alternate between scores far above and far below zero (about "
                f"±{shift * scale:,.0f} after scaling"
                + (f"; the raw products Q·K reach {shift:,.0f}, past fp16's largest value, "
                   "65,504" if dtype != F32 else "") +
                "): compute S in fp32 and keep it there, keep m and l in fp32, start m at -inf "
                "and subtract the running max before every exponential")
    if kind in ("big_v", "big_v_negative"):
        return (f"V's entries here are about {'-' if kind == 'big_v_negative' else '+'}"
                f"{BIG_V:,.0f} and the weights nearly uniform: before the final division the "
                f"accumulator sums up to about {Nk} x {BIG_V:,.0f}, past fp16's largest value "
                "(65,504): keep acc in fp32 and convert only O, when storing it")
    return None


def _views_hint(tensors):
    views = [f"{name} (strides {tuple(t.stride())})" for name, t in tensors.items()
             if not t.is_contiguous()]
    if views:
        return (f"{', '.join(views)} {'is a view' if len(views) == 1 else 'are views'} here: "
                "element [b, h, n, d] lives at ptr + b * stride_b + h * stride_h + n * stride_n "
                "+ d * stride_d, with the strides the caller passes, never with the sizes")
    return None


def _check_result(out, lse, q, k, v, *, name, causal, scale, kind, mistakes, hint=None,
                  quiet=False):
    """Compare O (and LSE, unless None) with the float64 reference, naming the classic
    mistakes (_mistakes: those of O, those of LSE)."""
    expected, expected_lse = reference(q, k, v, causal, scale)
    mistakes, lse_mistakes = mistakes
    hint = join_hints(_kind_hint(kind, q.dtype, k.shape[2], q.shape[-1], scale), hint,
                  _views_hint({"q": q, "k": k, "v": v}))
    if not isinstance(out, torch.Tensor):
        fail(f"{name} should give O as a torch.Tensor, got {type(out).__name__}")
    if MARGIN and tuple(out.shape) == tuple(q.shape) and torch.isnan(out).any() \
            and kind == "random" and not _matches(out, mistakes):  # NaN from the guards
        explain_nan_from_guards(out, name=name, gaps=not all(t.is_contiguous() for t in (q, k, v)))
    assert_close(out, expected, name=name, dim_names=BHND, mistakes=mistakes, hint=hint, quiet=quiet)
    assert_not_trivial(out, name=name)
    if out.dtype != q.dtype:
        fail(f"{name}: O is {dtype_name(out.dtype)} but the inputs are {dtype_name(q.dtype)}: "
             "keep the statistics and the accumulator in fp32, and give O the inputs' dtype")
    if lse is not None:
        atol, rtol = LSE_TOLERANCE
        assert_close(lse, expected_lse, name=f"LSE of {name}", dim_names=BHN, atol=atol, rtol=rtol,
                     mistakes=lse_mistakes, quiet=True,
                     hint="LSE[row] = log(sum_j exp(S[row, j] * sm_scale)): with base-2 "
                          "statistics, (m + log2 l) * ln 2")


# ---------------------------------------------------------------------------------------
# flash_attention_blocked (PyTorch, block by block)

def case_blocked(fn, q, k, v, block_q, block_k, *, causal=False, sm_scale=None, kind="random",
                 quiet=False):
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    name = _name("flash_attention_blocked", q, k, v, causal=causal, kind=kind,
                 extra=f", block_q={block_q}, block_k={block_k}"
                       + (f", sm_scale={sm_scale}" if sm_scale is not None else ""))
    kwargs = {"causal": causal} | ({} if sm_scale is None else {"sm_scale": sm_scale})
    mistakes = _mistakes(q, k, v, (block_q, block_k), scale, causal, base2=False, lse=False)
    out, report = watched_call(fn, q, k, v, block_q, block_k, forbid=("softmax", "attention"),
                               measure_products=True, **kwargs)
    limit = max(block_q, block_k, D)
    if report["largest_product"] > limit:
        fail(f"{name} multiplied matrices with a side of {report['largest_product']}, larger than "
             f"the blocks: compute S one [block_q, block_k] block at a time (q block @ k blockᵀ) "
             f"and O from p @ v block by block, never a whole row of S (sides up to {limit} here)")
    _check_result(out, None, q, k, v, name=name, causal=causal, scale=scale, kind=kind,
                  mistakes=mistakes, quiet=quiet)


def case_blocked_random(fn, B, H, Nq, Nk, D, dtype, block_q, block_k, *, seed, causal=False,
                        sm_scale=None, kind="random", layouts=("contiguous",) * 3, quiet=False):
    q, k, v = attention_inputs(B, H, Nq, Nk, D, dtype, seed=seed, kind=kind, layouts=layouts)
    case_blocked(fn, q, k, v, block_q, block_k, causal=causal, sm_scale=sm_scale, kind=kind,
                 quiet=quiet)


# The checks' cases run on a GPU only, (B, H, Nq, Nk, D, dtype[, block_q, block_k]) and
# options: answers.py records their classic mistakes too (the table is recorded on a CPU).
BLOCKED_GPU_CASES = [((2, 2, 70, 45, 24, BF16, 16, 32), dict(seed=9, causal=True))]
KERNEL_GPU_CASES = [((2, 2, 300, 517, 128, BF16), dict(seed=10, causal=False, blocks=(64, 64))),
                    ((1, 2, 250, 250, 96, F16), dict(seed=11, causal=True, blocks=(64, 32)))]


@checked(RULES)
def check_flash_attention_blocked(flash_attention_blocked):
    def case(*args, **kwargs):
        case_blocked_random(flash_attention_blocked, *args, **kwargs)
    case(2, 2, 40, 40, 40, F32, 16, 16, seed=1)           # square: classic mistakes have names
    case(2, 2, 70, 45, 24, F32, 16, 32, seed=2)           # Nq != Nk, ragged, blocks differ
    case(1, 2, 50, 50, 16, F16, 32, 16, seed=3, causal=True)
    case(2, 1, 37, 61, 40, F32, 16, 16, seed=4, sm_scale=0.3,
         layouts=("bnhd", "transposed", "sliced"))
    case(1, 2, 33, 40, 32, F32, 16, 16, seed=5, kind="extreme")
    case(1, 2, 33, 40, 32, F16, 16, 16, seed=6, kind="extreme", causal=True)
    case(1, 1, 20, 90, 16, F16, 16, 32, seed=7, kind="big_v")
    case(1, 1, 20, 90, 16, F16, 16, 32, seed=8, kind="big_v_negative", layouts=("contiguous", "bnhd", "contiguous"))
    for shape, options in pick([], BLOCKED_GPU_CASES):
        case(*shape, **options)


# ---------------------------------------------------------------------------------------
# flash_attention_kernel (launched directly on guarded buffers)

@contextlib.contextmanager
def output_in_layout(shape, dtype, layout, *, name):
    """A [B, H, N, D] output for the kernel to fill, guarded (see guarded_output), laid out
    as `layout`: "contiguous"; "bnhd": stored as [B, N, H, D]; "sliced": the first D of
    rows D + 3 long, whose last 3 entries must stay untouched."""
    B, H, N, D = shape
    if layout == "bnhd":
        with guarded_output((B, N, H, D), dtype, DEVICE, margin=MARGIN, name=f"{name} (stored as "
                            "[B, N, H, D], so positions below are (batch, query, head, dim))") as out:
            yield out.transpose(1, 2)
    else:
        with guarded_output(shape, dtype, DEVICE, name=name, margin=MARGIN,
                            gaps=(0, 0, 0, 3) if layout == "sliced" else None) as out:
            yield out


def block_d(D):
    return max(16, triton.next_power_of_2(D))


def case_kernel(kernel, q, k, v, *, causal=False, sm_scale=None, blocks=(32, 32),
                out_layout="contiguous", kind="random", quiet=False):
    """Launch kernel on guarded q, k, v into a guarded O laid out as out_layout and a
    guarded LSE [B, H, Nq], on the grid (cdiv(Nq, BLOCK_Q), B * H, 1)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    block_q, block_k = blocks
    name = _name("flash_attention_kernel", q, k, v, causal=causal, kind=kind,
                 extra=f", BLOCK_Q={block_q}, BLOCK_K={block_k}"
                       + (f", sm_scale={sm_scale}" if sm_scale is not None else "")
                       + ("" if out_layout == "contiguous" else f", O {out_layout}"))
    hint = join_hints(
        block_q != block_k and f"the blocks differ here (BLOCK_Q={block_q}, BLOCK_K={block_k}): "
        "query rows step by BLOCK_Q, keys by BLOCK_K",
        out_layout != "contiguous" and f"O is a {out_layout} view here: store O[b, h, n, d] at "
        "O + b * stride_ob + h * stride_oh + n * stride_on + d * stride_od",
        D != block_d(D) and f"D = {D} is not a power of two: BLOCK_D = {block_d(D)}, and the "
        "lanes past HEAD_DIM must be masked on every load and store")
    mistakes = _mistakes(q, k, v, blocks, scale, causal)
    with hinted(hint), \
            output_in_layout((B, H, Nq, D), q.dtype, out_layout, name=f"O of {name}") as out, \
            guarded_output((B, H, Nq), torch.float32, DEVICE, name=f"LSE of {name}",
                           margin=MARGIN) as lse:
        kernel[(triton.cdiv(Nq, block_q), B * H, 1)](
            q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            H, Nq, Nk, scale * LOG2E,
            GROUP=1, HEAD_DIM=D, BLOCK_D=block_d(D), BLOCK_Q=block_q, BLOCK_K=block_k,
            CAUSAL=causal, DOT_PRECISION="ieee" if q.dtype == F32 else "tf32")
    _check_result(out, lse, q, k, v, name=name, causal=causal, scale=scale, kind=kind,
                  mistakes=mistakes, hint=hint, quiet=quiet)


def case_kernel_random(kernel, B, H, Nq, Nk, D, dtype, *, seed, kind="random",
                       layouts=("contiguous",) * 3, **kwargs):
    q, k, v = attention_inputs(B, H, Nq, Nk, D, dtype, seed=seed, kind=kind, layouts=layouts)
    case_kernel(kernel, q, k, v, kind=kind, **kwargs)


@checked(RULES)
def check_flash_attention_kernel(flash_attention_kernel):
    def case(*args, **kwargs):
        case_kernel_random(flash_attention_kernel, *args, **kwargs)
    case(2, 2, 32, 32, 32, F32, seed=1)                   # square, one block: K^T has a name
    case(1, 2, 97, 75, 40, F32, seed=2, blocks=(32, 16))  # ragged Nq != Nk, D not a power of 2
    case(2, 1, 70, 70, 24, F16, seed=3, causal=True, blocks=(16, 32))
    case(2, 2, 40, 50, 32, F32, seed=4, sm_scale=0.3, layouts=("bnhd", "transposed", "sliced"),
         out_layout="bnhd")
    case(1, 2, 33, 40, 16, F16, seed=5, layouts=("sliced", "bnhd", "contiguous"), out_layout="sliced")
    case(1, 2, 40, 40, 64, F32, seed=6, kind="extreme")
    case(1, 2, 40, 40, 64, F16, seed=7, kind="extreme", causal=True)
    case(1, 1, 20, 60, 16, F16, seed=8, kind="big_v")
    case(1, 1, 20, 60, 16, F16, seed=9, kind="big_v_negative", layouts=("contiguous", "bnhd", "transposed"))
    for shape, options in pick([], KERNEL_GPU_CASES):
        case(*shape, **options)


# ---------------------------------------------------------------------------------------
# flash_attention (the wrapper): one launch on the grid of flash_grid

FORBID = ("attention", "softmax", "matmul")


def _launch_check(name, B, H, Nq, D, blocks):
    def check(launch, count):
        grid = launch["grid"]
        grid = tuple(grid(launch) if callable(grid) else grid)
        grid = grid + (1,) * (3 - len(grid))
        block_q, block_k = launch.get("BLOCK_Q"), launch.get("BLOCK_K")
        if blocks is not None and (block_q, block_k) != tuple(blocks):
            fail(f"{name}: launched with BLOCK_Q={block_q}, BLOCK_K={block_k}, but block_q="
                 f"{blocks[0]}, block_k={blocks[1]} were asked for: when given, they are the "
                 "kernel's blocks")
        if blocks is None and INTERPRET and (block_q, block_k) != INTERPRETER_BLOCKS:
            fail(f"{name}: launched with BLOCK_Q={block_q}, BLOCK_K={block_k}; in the interpreter "
                 f"the default blocks are {INTERPRETER_BLOCKS[0]} x {INTERPRETER_BLOCKS[1]} "
                 "(smaller ones make every check several times slower)")
        if not isinstance(block_q, int):
            fail(f"{name}: the kernel was launched without an integer BLOCK_Q")
        want = (triton.cdiv(Nq, block_q), B * H, 1)
        if grid != want:
            fail(f"{name}: the grid is {grid}; expected (cdiv(Nq, BLOCK_Q), B * H, 1) = {want} "
                 f"for BLOCK_Q={block_q}: one program per block of BLOCK_Q queries of each "
                 "(batch, head) pair, the key blocks being walked inside each program")
    return check


def case_wrapper(fn, kernel, q, k, v, *, causal=False, sm_scale=None, blocks=None, kind="random",
                 quiet=False):
    B, H, Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    name = _name("flash_attention", q, k, v, causal=causal, kind=kind,
                 extra=(f", sm_scale={sm_scale}" if sm_scale is not None else "")
                 + (f", block_q={blocks[0]}, block_k={blocks[1]}" if blocks else ""))
    kwargs = {"causal": causal} | ({} if sm_scale is None else {"sm_scale": sm_scale}) | (
        {"block_q": blocks[0], "block_k": blocks[1]} if blocks else {})
    mistakes = _mistakes(q, k, v, blocks or (INTERPRETER_BLOCKS if INTERPRET else GPU_BLOCKS),
                         scale, causal)
    result, report = watched_call(fn, q, k, v, kernel=kernel, forbid=FORBID,
                                  before_launch=_launch_check(name, B, H, Nq, D, blocks), **kwargs)
    kernel_name = getattr(kernel, "__name__", "the kernel")
    if report["launches"] != 1:
        fail(f"{name}: {kernel_name} was launched {report['launches']} times; the wrapper must "
             "launch it exactly once, on a grid that covers every query block of every "
             "(batch, head) pair")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        fail(f"{name} should return a pair (o, lse), got {type(result).__name__}")
    out, lse = result
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, Nq):
        fail(f"{name}: lse should be a [B, H, Nq] = {[B, H, Nq]} tensor, got "
             + (f"shape {tuple(lse.shape)}" if isinstance(lse, torch.Tensor) else type(lse).__name__))
    if lse.dtype != torch.float32:
        fail(f"{name}: lse is {dtype_name(lse.dtype)}; it must be float32 whatever the inputs' "
             "dtype (the backward recomputes P from it)")
    _check_result(out, lse, q, k, v, name=name, causal=causal, scale=scale, kind=kind,
                  mistakes=mistakes, quiet=quiet,
                  hint=sm_scale is not None and f"sm_scale={sm_scale} is given here: use it "
                  "instead of 1/sqrt(D)")


def case_wrapper_random(fn, kernel, B, H, Nq, Nk, D, dtype, *, seed, kind="random",
                        layouts=("contiguous",) * 3, **kwargs):
    q, k, v = attention_inputs(B, H, Nq, Nk, D, dtype, seed=seed, kind=kind, layouts=layouts)
    case_wrapper(fn, kernel, q, k, v, kind=kind, **kwargs)


def bad_inputs(fn):
    x = torch.ones(1, 2, 8, 16, device=DEVICE)
    return [("a 3-D q", lambda: fn(x[0], x, x)),
            ("k with another head dim than q", lambda: fn(x, torch.ones(1, 2, 8, 32, device=DEVICE),
                                                          torch.ones(1, 2, 8, 32, device=DEVICE))),
            ("int32 inputs", lambda: fn(x.int(), x.int(), x.int())),
            ("a float32 q with float16 k and v", lambda: fn(x, x.half(), x.half()))]


# The wrapper check's cases, (B, H, Nq, Nk, D, dtype) and options, and those run on a GPU
# only. Without blocks, the wrapper's defaults are compared as GPU_BLOCKS on a GPU:
# answers.py records those cases' classic mistakes for GPU_BLOCKS too.
WRAPPER_CASES = [
    ((1, 2, 70, 45, 40, F32), dict(seed=1)),                  # default blocks, Nq != Nk, ragged
    ((2, 1, 50, 50, 24, F16), dict(seed=2, causal=True, blocks=(16, 32))),
    ((1, 2, 40, 33, 32, F32), dict(seed=3, sm_scale=0.3, blocks=(32, 16),
                                   layouts=("bnhd", "transposed", "sliced"))),
    ((1, 2, 40, 40, 64, F16), dict(seed=4, kind="extreme", layouts=("contiguous", "bnhd", "contiguous"))),
    ((1, 1, 20, 60, 16, F16), dict(seed=5, kind="big_v", blocks=(16, 32))),
    ((1, 1, 20, 60, 16, F32), dict(seed=6, kind="big_v_negative")),
]
WRAPPER_GPU_CASES = [((2, 4, 777, 1025, 128, BF16), dict(seed=7, layouts=("bnhd",) * 3)),
                     ((1, 2, 300, 300, 256, F16), dict(seed=8, causal=True))]


@checked(RULES)
def check_flash_attention(flash_attention, flash_attention_kernel):
    for shape, options in WRAPPER_CASES + pick([], WRAPPER_GPU_CASES):
        case_wrapper_random(flash_attention, flash_attention_kernel, *shape, **options)
    check_rejects(bad_inputs(flash_attention), name="flash_attention")
    print("ok  flash_attention rejects bad inputs with clear errors")


# ---------------------------------------------------------------------------------------
# The kernel compiled for an H100 without running it

def compile_kernel_for_gpu(flash_attention_kernel, capability=90):
    """Compile the kernel with the signature the wrapper gives it (fp16, GPU blocks)."""
    signature = {name: "*fp16" for name in ("Q", "K", "V", "O")} | {"LSE": "*fp32"}
    signature |= {f"stride_{t}{d}": "i32" for t in "qkvo" for d in "bhnd"}
    signature |= {"H": "i32", "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32"}
    constants = {"GROUP": 1, "HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_Q": 128, "BLOCK_K": 64,
                 "CAUSAL": True, "DOT_PRECISION": "tf32"}
    compile_for_gpu(flash_attention_kernel, signature | dict.fromkeys(constants, "constexpr"),
                    constants, capability)
