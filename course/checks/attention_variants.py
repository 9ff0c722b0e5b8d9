"""Visible checks of module 06 (causal and multi-head variants). Hidden tests reuse the
`case_*` functions with inputs the learner never sees: the same kinds of input (dtypes,
memory layouts, value ranges, head groupings, causal or not, Nq above, equal to or below
Nk, K/V shorter than one block), at other sizes and seeds.

The causal mask of this module is bottom-right aligned: query i sees keys
j <= i + (Nk - Nq); a query that sees no key has O = 0 and LSE = -inf. K/V head
h // (H // Hkv) serves query head h. Inputs, output layouts, guards and the descriptions
of the FlashAttention loop's classic mistakes come from module 05's checks. The key block
ranges, the blocks a kernel runs and the outputs of the classic mistakes are the answer
key's (course/recorded.py): recorded for these checks' inputs.
"""
import functools
import math

import torch
import triton

from course import DEVICE, INTERPRET, pick, recorded
from course.checks import flash_forward as ff
from course.checks.flash_forward import (BF16, F16, F32, LOG2E, attention_values, block_d,
                                         output_in_layout)
from course.gpu_compile import compile_for_gpu
from course.recorded import answer
from course.testing import (assert_close, assert_not_trivial, check_choice, check_rejects,  # noqa: F401
                            dtype_name, fail, guarded_input, hinted, join_hints, watched_call)
from course.rules import Avoids, JitKernel, Launches, checked

# What a wrapper that copies its inputs would name (the kernel reads any layout, and K/V
# heads through GROUP).
COPIES = ("contiguous", "clone", "reshape", "repeat", "repeat_interleave", "to", "copy_")

# Checked on the submitted code (course/rules.py): the worker's launch count and forbidden
# functions are only as honest as the notebook lets them be.
RULES = {
    "test_attention_kernel": [JitKernel("attention_kernel"), JitKernel("attend_kv_blocks")],
    "test_attention": [
        Launches("attention", "attention_kernel", forbid="softmax"),
        Launches("attention", "attention_kernel", forbid="matmul"),
        Avoids("attention", COPIES, "the wrapper copies nothing: the kernel reads any layout "
               "through the strides, and K/V heads through GROUP")],
}


BHND, BHN = ff.BHND, ff.BHN
# Memory layouts of inputs: module 05's, plus "padded": every head's keys followed by NaN
# (a kernel that reads keys past Nk gets NaN, even with Nk shorter than one block).
LAYOUTS = ff.LAYOUTS + ("padded",)
OUT_LAYOUTS = ff.OUT_LAYOUTS
KEY_GAP = pick(32, 128)  # NaN rows after each head's keys: at least the largest BLOCK_K


# ---------------------------------------------------------------------------------------
# Which key blocks a query block visits

def _sees(shift):
    """The causal rule as text: "j <= i + 60", "j <= i - 30", "j <= i"."""
    return f"j <= i {'+' if shift > 0 else '-'} {abs(shift)}" if shift else "j <= i"


_RANGE_MISTAKES = {  # answers.py's kv_block_range_mistakes gives the ranges of each, by key
    "top_left": "this is the top-left alignment (row i sees keys j <= i); this module's is "
                "bottom-right: row i sees keys j <= i + (n_k - n_q)",
    "diagonal_left_out": "row i sees keys j <= i + shift, itself included: that is i + shift + 1 "
                         "keys, not i + shift",
    "row_before_block": "masked_end counts the keys of the row just before the block "
                        "(first_row + shift): the block's last row is first_row + block_q - 1, "
                        "which sees first_row + block_q + shift keys",
    "full_from_last_row": "full_end was taken from the last row: a block that the first rows may "
                          "not see whole would run without its mask. Whole blocks are those the "
                          "FIRST row sees",
    "not_clamped": "the counts were not kept between 0 and n_k: a row sees at least 0 keys (a "
                   "block whose rows see none gets (0, 0)) and at most n_k",
    "not_causal_rounded": "not causal: every row sees all n_k keys, so masked_end is n_k",
    "full_not_whole_blocks": "full_end must be a whole number of blocks (rounded down): a partial "
                             "block needs its mask",
    "masked_rounded_up": "masked_end is the number of keys the last row sees, not rounded up to a "
                         "whole block (the masks handle the rest of the block)",
    "ragged_block_unmasked": "the last, ragged key block ran without a mask: full_end counts whole "
                             "blocks only (n_k // block_k * block_k)",
}


def _pairs(values):
    """Recorded [[a, b], ...] (JSON has no tuples) as [(a, b), ...]."""
    return [tuple(value) for value in values]


def case_kv_block_range(fn, n_q, n_k, block_q, block_k, causal):
    args = (n_q, n_k, block_q, block_k, causal)
    want = _pairs(answer("attention_variants", "kv_block_ranges", *args))
    mistakes = answer("attention_variants", "kv_block_range_mistakes", *args)
    got = []
    for q_block in range(len(want)):
        value = fn(q_block, n_q, n_k, block_q, block_k, causal)
        if not isinstance(value, (tuple, list)) or len(value) != 2 or \
                not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            fail(f"kv_block_range(q_block={q_block}, ...) should return a pair of ints "
                 f"(full_end, masked_end), got {value!r}")
        got.append(tuple(value))
    if got == want:
        return
    first = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    name = (f"kv_block_range(q_block={first}, n_q={n_q}, n_k={n_k}, block_q={block_q}, "
            f"block_k={block_k}, causal={causal})")
    mistake = next((d for key, d in _RANGE_MISTAKES.items()
                    if key in mistakes and got == _pairs(mistakes[key])), None)
    full, masked = got[first]
    if mistake:
        why = f"this matches a classic mistake: {mistake}"
    elif not 0 <= full <= masked <= n_k:
        why = ("full_end and masked_end lie between 0 and n_k, full_end first: a row sees at "
               "least 0 keys and at most n_k (a block whose rows see no key gets (0, 0))")
    elif full % block_k:
        why = "full_end must be a whole number of blocks (a multiple of block_k)"
    else:
        why = ("full_end: whole blocks that the block's first row sees; masked_end: the keys "
               "its last row sees (n_k when not causal)")
    rows = f"rows {first * block_q} to {min((first + 1) * block_q, n_q) - 1}"
    fail(f"{name} is {got[first]}, expected {want[first]} ({rows}, which see "
         + (f"keys {_sees(n_k - n_q)}" if causal else "every key") + f").\n  {why}")


def check_kv_block_range(kv_block_range):
    for args in [(64, 64, 32, 32, True), (64, 64, 32, 32, False), (70, 45, 16, 16, False),
                 (40, 100, 16, 32, True), (100, 30, 32, 16, True), (50, 7, 32, 32, False),
                 (1, 60, 16, 16, True), (97, 97, 32, 16, True), (33, 33, 16, 32, True)]:
        case_kv_block_range(kv_block_range, *args)
    print("ok  kv_block_range: whole blocks first, masked ones next, the rest skipped "
          "(square, Nq < Nk, Nq > Nk, short K/V, ragged, causal and not)")


def case_block_counts(fn, n_q, n_k, block_q, block_k, causal):
    name = f"block_counts({n_q}, {n_k}, {block_q}, {block_k}, causal={causal})"
    got = fn(n_q, n_k, block_q, block_k, causal)
    want = tuple(answer("attention_variants", "block_counts", n_q, n_k, block_q, block_k, causal))
    if not isinstance(got, (tuple, list)) or len(got) != 3 or \
            not all(isinstance(x, int) and not isinstance(x, bool) for x in got):
        fail(f"{name} should return three ints (unmasked, masked, skipped), got {got!r}")
    got = tuple(got)
    if got == want:
        return
    pairs = sum(want)  # every (query block, key block) pair
    why = ""
    if sum(got) != pairs:
        why = (f" The three must add up to every pair: cdiv(n_q, block_q) x cdiv(n_k, block_k) "
               f"= {pairs}, yours add up to {sum(got)}.")
    elif got[1] < want[1]:
        why = (" A masked range that ends inside a block (a ragged last block, or the diagonal) "
               "still visits that block: count cdiv(masked_end, block_k) blocks, not "
               "masked_end // block_k.")
    fail(f"{name} is {got}, expected {want}.{why} Count, for every query block, the key blocks "
         "before full_end (unmasked) and those from there to masked_end (masked), with "
         "kv_block_range.")


def check_block_counts(block_counts):
    for args in [(64, 64, 32, 32, True), (64, 64, 32, 32, False), (97, 97, 32, 16, True),
                 (100, 30, 32, 16, True), (40, 100, 16, 32, True), (50, 7, 32, 32, False),
                 (4096, 4096, 128, 64, True)]:
        case_block_counts(block_counts, *args)
    print("ok  block_counts: unmasked, masked and skipped pairs of blocks")


# ---------------------------------------------------------------------------------------
# Inputs

def in_layout(x, layout, *, seed=0):
    """x [B, H, N, D] in guarded memory laid out as `layout`: module 05's layouts
    (ff.in_layout), or "padded": every head's N rows followed by KEY_GAP rows of NaN."""
    if layout == "padded":
        return guarded_input(x, gaps=(0, 0, KEY_GAP, 0), margin=ff.MARGIN)
    return ff.in_layout(x, layout, seed=seed)


def variant_inputs(B, H, Hkv, Nq, Nk, D, dtype, *, seed, kind="random", layouts=("contiguous",) * 3):
    """Guarded q [B, H, Nq, D], k and v [B, Hkv, Nk, D] of `kind` (module 05's
    attention_values) in `dtype` on DEVICE, laid out as `layouts` (see in_layout)."""
    q, k, v = attention_values(B, H, Nq, Nk, D, dtype, seed=seed, kind=kind)
    values = (q, k[:, :Hkv], v[:, :Hkv])
    return tuple(in_layout(t.to(DEVICE, dtype), layout, seed=seed + 5 + i)
                 for i, (t, layout) in enumerate(zip(values, layouts)))


def _gapped(x):
    """True when x is a view with NaN rows after each head's keys (the "padded" layout)."""
    B, H, N, D = x.shape
    return x.stride(2) == D and x.stride(3) == 1 and x.stride(1) == (N + KEY_GAP) * D


# ---------------------------------------------------------------------------------------
# The reference (float64), and the classic mistakes' outputs (recorded)

def _f64(t):
    return t.detach().to(DEVICE, torch.float64)


def bottom_right(n_q, n_k, shift=None):
    """[n_q, n_k] bool, True where query i sees key j: j <= i + shift (n_k - n_q unless given)."""
    shift = n_k - n_q if shift is None else shift
    return torch.ones(n_q, n_k, dtype=torch.bool, device=DEVICE).tril(shift)


def kv_heads(H, Hkv):
    """The K/V head of every query head: h // (H // Hkv)."""
    return [h // (H // Hkv) for h in range(H)]


def masked_attention(q, k, v, scale, visible=None, heads=None):
    """(O, LSE) in float64: query head h against K/V head heads[h] (default kv_heads),
    keys where visible [Nq, Nk] is True (default: all). A row that sees no key: O = 0,
    LSE = -inf."""
    H, Hkv = q.shape[1], k.shape[1]
    heads = kv_heads(H, Hkv) if heads is None else heads
    q, k, v = _f64(q), _f64(k)[:, heads], _f64(v)[:, heads]
    s = q @ k.transpose(-1, -2) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v, torch.logsumexp(s, -1)


def reference(q, k, v, causal=False, scale=None):
    """(O, LSE) in float64 for this module's attention: GQA heads, bottom-right causal."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return masked_attention(q, k, v, scale, bottom_right(q.shape[2], k.shape[2]) if causal else None)


_GQA = ("the GROUP = H // Hkv consecutive query heads j·GROUP ... j·GROUP + GROUP - 1 share K/V "
        "head j: query head h reads K/V head h // GROUP")


def _variant_mistakes(q, k, v):
    """{key: description} of this module's kernel's classic mistakes, then module 05's
    (those of the loop), in the order they are looked for: answers.py's variant_mistakes
    gives the output of each that applies, by key."""
    H, Nq = q.shape[1:3]
    Hkv, Nk = k.shape[1], k.shape[2]
    text = {
        "heads_modulo": f"query head h read K/V head h % Hkv: {_GQA}",
        "group_is_hkv": f"query head h read K/V head h // Hkv: GROUP is H // Hkv = {H // Hkv} query "
                        f"head(s) per K/V head, not Hkv = {Hkv}",
        "top_left": "the causal mask is aligned top-left (row i sees keys j <= i): this module's "
                    f"is bottom-right, row i sees keys j <= i + Nk - Nq, here {_sees(Nk - Nq)}",
        "causal_mask_missing": "the causal mask was not applied: row i sees keys j <= i + Nk - Nq only",
        "causal_diagonal_hidden": "the causal mask also hid the diagonal: row i sees key i + Nk - Nq too",
        "diagonal_block_unmasked": "the diagonal block(s) ran without the causal mask: keys the row "
                                   "must not see counted. In the masked phase, hide keys j > row + "
                                   "(N_K - N_Q) as well as keys j >= N_K",
        "stopped_one_block_early": "the loop stopped one key block early: the last block a query "
                                   "block needs (the one its last row's keys end in) was skipped. Its "
                                   "last row sees q0 + BLOCK_Q + N_K - N_Q keys",
        "diagonal_block_in_unmasked_phase": "the diagonal block(s) ran in the unmasked phase: whole "
                                            "blocks are those the block's FIRST row sees (full_end "
                                            "from q0 + N_K - N_Q + 1 keys, rounded down)",
        "empty_rows_nan": f"the first Nq - Nk = {Nq - Nk} rows see no key, and came out NaN (0 / 0): "
                          "their O must be 0 (divide by 1 where l = 0) and their LSE -inf",
        # Here module 05's output of the mistake (its top-left mask) stands for it.
        "mask_applied": "a causal mask was applied, but this call is not causal",
    }
    for which in "qkv":
        text[f"{which}_batch_head_swapped"] = (
            f"{which}'s batch and head strides were swapped: batch b, head h lives at "
            f"b * stride_{which}b + h * stride_{which}h")
    text["o_batch_head_swapped"] = ("O's batch and head strides were swapped: store O[b, h] at "
                                    "b * stride_ob + h * stride_oh")
    return text | ff._loop_mistakes(q, k, v, True)


_LSE_MISTAKES = {  # answers.py's lse_mistakes gives the LSE of each, by key
    "empty_rows_inf": "the rows that see no key must get LSE = -inf (the log of an empty sum, what "
                      "torch.logsumexp gives), not +inf",
    "empty_rows_zero": "the rows that see no key must get LSE = -inf (the log of an empty sum), not 0",
    **ff._LSE_MISTAKES}


def mistake_questions(q, k, v, blocks, scale, causal):
    """[(name, arguments)] of the answers a comparison asks for: the outputs of the
    kernel's classic mistakes (a batch offset's mistake depends on q's strides; K and V's
    matter to none, and those of "padded" differ on a GPU) and those of LSE."""
    return [("variant_mistakes", (q, k, v, *blocks, scale, causal, list(q.stride()))),
            ("lse_mistakes", (q, k, scale, causal))]


def _mistakes(q, k, v, blocks, scale, causal):
    """({description: recorded O}, {description: recorded LSE}) of the classic mistakes
    these inputs can show. Asked before the launch, while q, k and v hold the values the
    answers are recorded for."""
    texts = _variant_mistakes(q, k, v)
    questions = [(name, recorded.snapshot(*args)) for name, args in mistake_questions(q, k, v, blocks, scale, causal)]
    found = recorded.deferred(lambda: dict(enumerate(answer("attention_variants", name, *args)
                                                     for name, args in questions)))
    return (recorded.deferred(lambda: {text: found[0][key] for key, text in texts.items() if key in found[0]}),
            recorded.deferred(lambda: {text: found[1][key] for key, text in _LSE_MISTAKES.items()
                                       if key in found[1]}))


# ---------------------------------------------------------------------------------------
# Comparing a result

def _name(fn_name, q, k, v, *, causal, kind, extra=""):
    H, Hkv = q.shape[1], k.shape[1]
    heads = "" if H == Hkv else f", {'MQA' if Hkv == 1 else 'GQA'} {H} query heads on {Hkv} K/V"
    return ff._name(fn_name, q, k, v, causal=causal, kind=kind, extra=heads + extra)


def _hint(q, k, v, causal, scale, kind, blocks):
    H, Nq, D = q.shape[1:]
    Hkv, Nk = k.shape[1], k.shape[2]
    block_q, block_k = blocks
    values = ff._kind_hint(kind, q.dtype, Nk, D, scale)
    return join_hints(
        values and values + ".",
        H != Hkv and f"K and V have {Hkv} head(s) for {H} query heads here: {_GQA}.",
        causal and Nq != Nk and f"Nq = {Nq}, Nk = {Nk}: bottom-right, row i sees keys "
                                f"{_sees(Nk - Nq)}"
                                + (f", so rows 0 to {Nq - Nk - 1} see none (O = 0, LSE = -inf)."
                                   if Nq > Nk else "."),
        Nk < block_k and f"K and V hold {Nk} keys, fewer than one block of {block_k}: no key "
                         "block is whole, and no key past N_K may be loaded.",
        block_q != block_k and f"The blocks differ here (BLOCK_Q={block_q}, BLOCK_K={block_k}).",
        ff._views_hint({"q": q, "k": k, "v": v}))


def _check_result(out, lse, q, k, v, *, name, causal, scale, kind, mistakes, hint, quiet):
    """Compare O (and LSE, unless None) with the float64 reference, naming the classic
    mistakes (_mistakes: those of O, those of LSE)."""
    expected, expected_lse = reference(q, k, v, causal, scale)
    mistakes, lse_mistakes = mistakes
    if not isinstance(out, torch.Tensor):
        fail(f"{name} should give O as a torch.Tensor, got {type(out).__name__}")
    Nq, Nk = q.shape[2], k.shape[2]
    sees_keys = torch.ones(Nq, dtype=torch.bool)
    if causal and Nq > Nk:
        sees_keys[:Nq - Nk] = False
    if tuple(out.shape) == tuple(expected.shape) and (_gapped(k) or _gapped(v)) and \
            bool(torch.isnan(out.detach().cpu()[:, :, sees_keys]).any()):
        fail(f"{name}: O has NaN. Here each head's {Nk} keys are followed by NaN in memory, so "
             "your kernel read K or V past the end of the keys: load keys only under a mask "
             "(cols < N_K), and let the unmasked phase cover whole blocks only, "
             "(N_K // BLOCK_K) * BLOCK_K keys" + (f"\n  hint: {hint}" if hint else ""))
    assert_close(out, expected, name=name, dim_names=BHND, hint=hint, quiet=quiet,
                 mistakes=mistakes)
    assert_not_trivial(out, name=name)
    if out.dtype != q.dtype:
        fail(f"{name}: O is {dtype_name(out.dtype)} but the inputs are {dtype_name(q.dtype)}: "
             "keep the statistics and the accumulator in fp32, and give O the inputs' dtype")
    if lse is not None:
        atol, rtol = ff.LSE_TOLERANCE
        assert_close(lse, expected_lse, name=f"LSE of {name}", dim_names=BHN, atol=atol, rtol=rtol,
                     mistakes=lse_mistakes, quiet=True,
                     hint="LSE[row] = log(sum over the keys the row sees of exp(S * sm_scale)): "
                          "(m + log2 l) * ln 2, and -inf for a row that sees no key")


def _launch_failed(error, name, hint):
    """An out-of-bounds access stopped by course.bounds: its sentence, with the hints."""
    text = str(error.__cause__ or error)
    if "outside every tensor" not in text:
        raise error
    fail(f"{name}: {text}" + (f"\n  hint: {hint}" if hint else ""))


# ---------------------------------------------------------------------------------------
# attention_kernel (launched directly on guarded buffers)

def _check_steps(steps, n_q, n_k, blocks, causal, name):
    """STEPS[pair, i] = (unmasked, masked) blocks run by program (i, pair): the two phases
    of kv_block_range, whatever the (batch, head)."""
    want = _pairs(answer("attention_variants", "expected_steps", n_q, n_k, *blocks, causal))
    ranges = _pairs(answer("attention_variants", "kv_block_ranges", n_q, n_k, *blocks, causal))
    got = steps.detach().cpu().tolist()
    for pair, row in enumerate(got):
        for i, (ran, wanted) in enumerate(zip(map(tuple, row), want)):
            if ran == wanted:
                continue
            key_blocks = triton.cdiv(n_k, blocks[1])
            if ran == (0, sum(wanted)) and wanted[0]:
                why = ("every block ran with masks: the blocks that every row of the query block "
                       "sees whole, before full_end, need none: run them in the unmasked phase")
            elif sum(ran) > sum(wanted) and ran[0] <= wanted[0]:
                why = (f"{sum(ran) - sum(wanted)} block(s) that no row of the query block needs "
                       "ran anyway (masked out entirely): the masked phase stops at masked_end, "
                       "the keys its last row sees; every later key block is skipped")
            elif ran[0] > wanted[0]:
                why = ("a block that some row must not see whole ran in the unmasked phase: it "
                       "covers whole blocks the FIRST row sees, full_end")
            else:
                why = ("count the blocks each loop runs (steps += 1 in the loop) and store them "
                       "at STEPS + (pid_bh * num_programs(0) + pid_q) * 2 (+ 1 for the masked "
                       "ones)")
            fail(f"{name}: program ({i}, {pair}) ran {ran[0]} key block(s) unmasked and {ran[1]} "
                 f"masked (of {key_blocks}); expected {wanted[0]} and {wanted[1]}, as "
                 f"kv_block_range({i}, ...) = {ranges[i]} says. {why}")


def case_kernel(kernel, q, k, v, *, causal=False, sm_scale=None, blocks=(32, 32),
                out_layout="contiguous", kind="random", quiet=False):
    """Launch kernel on q, k, v into a guarded O laid out as out_layout, a guarded LSE
    [B, H, Nq] and a guarded STEPS [B * H, cdiv(Nq, BLOCK_Q), 2], on the grid
    (cdiv(Nq, BLOCK_Q), B * H, 1), with GROUP = H // Hkv and COUNT_STEPS."""
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    block_q, block_k = blocks
    name = _name("attention_kernel", q, k, v, causal=causal, kind=kind,
                 extra=f", BLOCK_Q={block_q}, BLOCK_K={block_k}"
                       + (f", sm_scale={sm_scale}" if sm_scale is not None else "")
                       + ("" if out_layout == "contiguous" else f", O {out_layout}"))
    hint = join_hints(_hint(q, k, v, causal, scale, kind, blocks),
                     out_layout != "contiguous" and f"O is a {out_layout} view here: store "
                     "through O's own strides.")
    mistakes = _mistakes(q, k, v, blocks, scale, causal)
    with hinted(hint), \
            output_in_layout((B, H, Nq, D), q.dtype, out_layout, name=f"O of {name}") as out, \
            ff.guarded_output((B, H, Nq), torch.float32, DEVICE, name=f"LSE of {name}",
                              margin=ff.MARGIN) as lse, \
            ff.guarded_output((B * H, triton.cdiv(Nq, block_q), 2), torch.int32, DEVICE,
                              name=f"STEPS of {name}", margin=ff.MARGIN) as steps:
        try:
            kernel[(triton.cdiv(Nq, block_q), B * H, 1)](
                q, k, v, out, lse, steps, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
                H, Nq, Nk, scale * LOG2E,
                GROUP=H // Hkv, HEAD_DIM=D, BLOCK_D=block_d(D), BLOCK_Q=block_q, BLOCK_K=block_k,
                CAUSAL=causal, COUNT_STEPS=True, DOT_PRECISION="ieee" if q.dtype == F32 else "tf32")
        except Exception as error:  # noqa: BLE001 (an out-of-bounds access gets its hints)
            _launch_failed(error, name, None)
    _check_result(out, lse, q, k, v, name=name, causal=causal, scale=scale, kind=kind,
                  mistakes=mistakes, hint=hint, quiet=quiet)
    _check_steps(steps, Nq, Nk, blocks, causal, name)


def case_kernel_random(kernel, B, H, Hkv, Nq, Nk, D, dtype, *, seed, kind="random",
                       layouts=("contiguous",) * 3, **kwargs):
    q, k, v = variant_inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, kind=kind, layouts=layouts)
    case_kernel(kernel, q, k, v, kind=kind, **kwargs)


# The kernel check's cases run on a GPU only, (B, H, Hkv, Nq, Nk, D, dtype) and options:
# answers.py records their answers too (the table is recorded on a CPU).
KERNEL_GPU_CASES = [((2, 8, 2, 300, 517, 128, BF16), dict(seed=12, causal=True, blocks=(64, 64))),
                    ((1, 4, 4, 517, 300, 96, F16), dict(seed=13, causal=True, blocks=(64, 32)))]


@checked(RULES)
def check_attention_kernel(attention_kernel):
    case = functools.partial(case_kernel_random, attention_kernel)
    # (B, H, Hkv, Nq, Nk, D, dtype)
    case(2, 2, 2, 48, 48, 32, F32, seed=1, causal=True, blocks=(16, 16))  # diagonal blocks
    case(1, 4, 2, 50, 7, 32, F16, seed=2, blocks=(32, 32),                 # 7 text tokens, GQA
         layouts=("contiguous", "padded", "padded"))
    case(1, 2, 1, 50, 20, 16, F32, seed=3, causal=True, blocks=(16, 16))   # Nq > Nk: empty rows
    case(2, 2, 2, 5, 70, 32, F16, seed=4, causal=True, blocks=(16, 32))    # Nq < Nk, KV-cache-like
    case(1, 4, 1, 1, 45, 64, F16, seed=5, causal=True, blocks=(16, 16),   # MQA decoding, one query
         layouts=("bnhd", "bnhd", "bnhd"))
    case(2, 3, 1, 20, 45, 24, F32, seed=6, blocks=(16, 32), layouts=("bnhd", "bnhd", "bnhd"),
         out_layout="bnhd")
    case(1, 2, 2, 37, 37, 40, F32, seed=7, causal=True, blocks=(32, 16), sm_scale=0.3,
         layouts=("transposed", "sliced", "bnhd"), out_layout="sliced")
    case(1, 2, 1, 40, 40, 64, F32, seed=8, kind="extreme")
    case(1, 4, 2, 33, 40, 32, F16, seed=9, kind="extreme", causal=True)
    case(1, 2, 1, 20, 60, 16, F16, seed=10, kind="big_v")
    case(1, 2, 2, 20, 60, 16, F16, seed=11, kind="big_v_negative", causal=True,
         layouts=("contiguous", "bnhd", "transposed"))
    for shape, options in pick([], KERNEL_GPU_CASES):
        case(*shape, **options)


def compile_kernel_for_gpu(attention_kernel, capability=90):
    """Compile the kernel as the wrapper launches it on a GPU (fp16, GQA, causal)."""
    signature = {name: "*fp16" for name in ("Q", "K", "V", "O")} | {"LSE": "*fp32", "STEPS": "*fp32"}
    signature |= {f"stride_{t}{d}": "i32" for t in "qkvo" for d in "bhnd"}
    signature |= {"H": "i32", "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32"}
    constants = {"GROUP": 4, "HEAD_DIM": 64, "BLOCK_D": 64, "BLOCK_Q": 128, "BLOCK_K": 64,
                 "CAUSAL": True, "COUNT_STEPS": False, "DOT_PRECISION": "tf32"}
    compile_for_gpu(attention_kernel, signature | dict.fromkeys(constants, "constexpr"),
                    constants, capability)


# ---------------------------------------------------------------------------------------
# attention (the wrapper): one launch, no copies, o in q's layout

GPU_BLOCKS = (128, 64)  # the wrapper's default blocks on a GPU, as its classic mistakes assume


def case_wrapper(fn, kernel, q, k, v, *, causal=False, sm_scale=None, blocks=None, kind="random",
                 quiet=False):
    B, H, Nq, D = q.shape
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    name = _name("attention", q, k, v, causal=causal, kind=kind,
                 extra=(f", sm_scale={sm_scale}" if sm_scale is not None else "")
                 + (f", block_q={blocks[0]}, block_k={blocks[1]}" if blocks else ""))
    kwargs = {"causal": causal} | ({} if sm_scale is None else {"sm_scale": sm_scale}) | (
        {"block_q": blocks[0], "block_k": blocks[1]} if blocks else {})
    used = blocks or (ff.INTERPRETER_BLOCKS if INTERPRET else (64, 64))
    hint = _hint(q, k, v, causal, scale, kind, used)
    mistakes = _mistakes(q, k, v, blocks or (ff.INTERPRETER_BLOCKS if INTERPRET else GPU_BLOCKS),
                         scale, causal)
    try:
        result, report = watched_call(fn, q, k, v, kernel=kernel, forbid=ff.FORBID,
                                      before_launch=ff._launch_check(name, B, H, Nq, D, blocks),
                                      **kwargs)
    except Exception as error:  # noqa: BLE001 (an out-of-bounds access gets its hints)
        _launch_failed(error, name, hint)
    if report["launches"] != 1:
        fail(f"{name}: {getattr(kernel, '__name__', 'the kernel')} was launched "
             f"{report['launches']} times; the wrapper must launch it exactly once")
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        fail(f"{name} should return a pair (o, lse), got {type(result).__name__}")
    out, lse = result
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, Nq) or lse.dtype != F32:
        fail(f"{name}: lse should be a float32 [B, H, Nq] = {[B, H, Nq]} tensor, got "
             + (f"{dtype_name(lse.dtype)} {list(lse.shape)}" if isinstance(lse, torch.Tensor)
                else type(lse).__name__))
    _check_result(out, lse, q, k, v, name=name, causal=causal, scale=scale, kind=kind,
                  mistakes=mistakes, hint=join_hints(hint, sm_scale is not None and f"sm_scale={sm_scale} is given "
                                 "here: use it instead of 1/sqrt(D)."), quiet=quiet)


def case_wrapper_random(fn, kernel, B, H, Hkv, Nq, Nk, D, dtype, *, seed, kind="random",
                        layouts=("contiguous",) * 3, **kwargs):
    q, k, v = variant_inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, kind=kind, layouts=layouts)
    case_wrapper(fn, kernel, q, k, v, kind=kind, **kwargs)


def case_output_layout(fn, B, H, Hkv, Nq, Nk, D, dtype, *, seed, layout="bnhd", causal=False):
    """o comes back in q's layout: the strides torch.empty_like(q) gives (for q viewed from
    [B, N, H, D], o viewed the same way, so o.transpose(1, 2) needs no copy either)."""
    q, k, v = variant_inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, layouts=(layout,) * 3)
    out, _ = fn(q, k, v, causal=causal)
    want = torch.empty_like(q).stride()
    if not isinstance(out, torch.Tensor) or tuple(out.stride()) != tuple(want):
        fail(f"attention({dtype_name(dtype)}, q {ff._describe(q)}, k/v {ff._describe(k)}): o has "
             f"strides {tuple(out.stride()) if isinstance(out, torch.Tensor) else None}, expected "
             f"{tuple(want)}, q's layout. Allocate o with torch.empty_like(q), and copy nothing "
             "(no .contiguous(), .clone(), .reshape() of the inputs): the kernel reads any layout "
             "through the strides")


def bad_inputs(fn):
    x = torch.ones(1, 2, 8, 16, device=DEVICE)
    six = torch.ones(1, 6, 8, 16, device=DEVICE)
    four = torch.ones(1, 4, 8, 16, device=DEVICE)
    return ff.bad_inputs(fn) + [
        ("6 query heads with 4 K/V heads (4 does not divide 6)", lambda: fn(six, four, four)),
        ("block_k=8 (below 16)", lambda: fn(x, x, x, block_k=8)),
        ("block_q=24 (not a power of two)", lambda: fn(x, x, x, block_q=24))]


# The wrapper check's cases, (B, H, Hkv, Nq, Nk, D, dtype) and options, and those run on a
# GPU only. Without blocks, the wrapper's defaults are compared as GPU_BLOCKS on a GPU:
# answers.py records those cases' answers for GPU_BLOCKS too.
ATTENTION_CASES = [
    ((1, 2, 2, 70, 45, 40, F32), dict(seed=1)),                                 # default blocks
    ((1, 6, 3, 50, 20, 24, F16), dict(seed=2, causal=True, blocks=(16, 32))),  # GQA, Nq > Nk
    ((2, 4, 1, 8, 60, 32, F32), dict(seed=3, causal=True, blocks=(16, 16),     # MQA, Nq < Nk
                                     layouts=("bnhd", "bnhd", "bnhd"))),
    ((1, 2, 1, 40, 9, 32, F16), dict(seed=4, sm_scale=0.3, layouts=("sliced", "padded", "transposed"))),
    ((1, 2, 2, 40, 40, 64, F16), dict(seed=5, kind="extreme", causal=True)),
    ((1, 2, 1, 20, 60, 16, F32), dict(seed=6, kind="big_v", blocks=(16, 32))),
    ((1, 1, 1, 20, 60, 16, F16), dict(seed=7, kind="big_v_negative", layouts=("contiguous", "bnhd", "bnhd"))),
]
ATTENTION_GPU_CASES = [((2, 8, 2, 777, 1025, 128, BF16), dict(seed=8, causal=True, layouts=("bnhd",) * 3))]


@checked(RULES)
def check_attention(attention, attention_kernel):
    case = functools.partial(case_wrapper_random, attention, attention_kernel)
    for shape, options in ATTENTION_CASES + pick([], ATTENTION_GPU_CASES):
        case(*shape, **options)
    case_output_layout(attention, 1, 4, 2, 20, 30, 16, F32, seed=9)
    print("ok  attention returns o in q's layout ([B, N, H, D] in, [B, N, H, D] out)")
    check_rejects(bad_inputs(attention), name="attention")
    print("ok  attention rejects bad inputs with clear errors")
