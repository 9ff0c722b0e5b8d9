"""Module 05 (FlashAttention forward): the pieces its checks are built from, what the
checks catch, the reference passing every visible check and hidden test, and the H100
figures the notebook ships against the benchmark's CSV.

On a CPU the kernels run through Triton's interpreter at small sizes; on a GPU the same
tests run compiled (course.testing picks the tolerances).
"""
import csv
import math
import re

import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch

from course import DEVICE, INTERPRET, recorded
from course.checks import flash_forward as checks
from course.testing import CheckFailed, assert_close, count_launches, randn, tolerance
from grader import answer_key, paths
from solutions import flash_forward as ff
from solutions.naive_attention import attention_reference

answers = paths.lesson_file("05_flash_forward", "answers")
F32, F16 = torch.float32, torch.float16


@pytest.fixture
def keyed():
    """The answer key computes what a check asks: these inputs are none of the visible checks'."""
    with recorded.computing(answer_key.resolve):
        yield


@pytest.mark.parametrize("causal", [False, True])
def test_checks_reference_is_the_course_reference(causal):
    q, k, v = (randn(2, 3, 37, 24, dtype=torch.float64, seed=s) for s in (1, 2, 3))
    o, lse = checks.reference(q, k, v, causal, 0.3)
    assert_close(o, attention_reference(q, k, v, causal=causal, sm_scale=0.3), quiet=True)
    s = q @ k.transpose(-1, -2) * 0.3
    if causal:
        s = s.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    assert_close(lse, torch.logsumexp(s, -1), quiet=True)


@pytest.mark.parametrize("base2", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_online_emulation_without_mistakes_is_attention(base2, causal):
    q, k, v = (randn(1, 2, 45, 24, dtype=torch.float64, seed=s) for s in (4, 5, 6))
    out = answers.online(q, k, v, 16, 32, 0.2, causal, base2=base2)
    assert_close(out, checks.reference(q, k, v, causal, 0.2)[0], quiet=True)


def test_batch_offset_mistake_reads_the_view_s_memory():
    """A [B, N, H, D] tensor viewed as [B, H, N, D], read with batch offset (b * H + h) *
    stride_h: what answers.py emulates from the strides alone is what the memory holds."""
    x = randn(2, 3, 5, 4, seed=7).transpose(1, 2).contiguous().transpose(1, 2)
    read = torch.as_strided(x, x.shape, (3 * x.stride(1),) + x.stride()[1:], x.storage_offset())
    assert torch.equal(answers._batch_as_heads(x.double(), list(x.stride())), read.double())
    assert answers._batch_as_heads(x.contiguous().double(), list(x.contiguous().stride())) is None


def test_extreme_values_shift_whole_rows_far_from_zero():
    for dtype, shift in checks.EXTREME_SHIFT.items():
        q, k, v = checks.attention_values(1, 1, 6, 9, 16, dtype, seed=1, kind="extreme")
        s = q.double() @ k.double().transpose(-1, -2)
        rows = s[0, 0]
        assert (rows[0::2] > shift ** 2 / 2).all() and (rows[1::2] < -shift ** 2 / 2).all()
        assert (rows.amax(-1) - rows.amin(-1)).max() < 50  # inside a row: usual differences
    q, k, _ = checks.attention_values(1, 1, 4, 4, 16, F16, seed=2, kind="extreme")
    assert (q.half().float() @ k.half().float().transpose(-1, -2)).abs().max() > torch.finfo(F16).max  # raw Q.K


@pytest.mark.parametrize("kind, sign", [("big_v", 1), ("big_v_negative", -1)])
def test_big_v_overflows_an_fp16_accumulator(kind, sign):
    q, k, v = checks.attention_values(1, 1, 8, 60, 16, F16, seed=3, kind=kind)
    p = torch.exp(q @ k.transpose(-1, -2) / 4 - (q @ k.transpose(-1, -2) / 4).amax(-1, keepdim=True))
    assert ((p @ v) * sign).min() > torch.finfo(F16).max  # acc before the division
    assert (v * sign).median() > 100


@pytest.mark.parametrize("layout, strides", [("contiguous", (480, 240, 24, 1)),
                                             ("bnhd", (480, 24, 48, 1)),
                                             ("transposed", (480, 240, 1, 10)),
                                             ("sliced", (580, 290, 29, 1))])
def test_in_layout_keeps_the_values_in_the_layout_it_names(layout, strides):
    x = randn(2, 2, 10, 24, seed=1)
    view = checks.in_layout(x, layout, seed=2)
    assert torch.equal(view, x) and view.stride() == strides


def test_score_max_worked_example():
    q, k = randn(2, 3, 70, 40, device=DEVICE, seed=1), randn(2, 3, 50, 40, device=DEVICE, seed=2)
    m = ff.score_max(q, k)
    assert_close(m, (q.double() @ k.double().transpose(-1, -2) / math.sqrt(40)).amax(-1), quiet=True)


def test_blocked_history_has_one_entry_per_key_block():
    q, k, v = (randn(1, 1, 1, 16, seed=1), randn(1, 1, 70, 16, seed=2), randn(1, 1, 70, 16, seed=3))
    history = []
    out = ff.flash_attention_blocked(q, k, v, 1, 16, history=history)
    assert len(history) == 5
    m, l, acc = history[-1]
    assert_close(acc / l[..., None], out, quiet=True)


def test_grid_answers():
    assert ff.programs_answer == ff.flash_grid(8, 1, 1, 2)[0] == 4
    for answer in (ff.grid_axis_answer, ff.batch_heads_answer, ff.grid_limit_answer):
        assert answer in "abcd" and len(answer) == 1


def test_shipped_h100_figures_equal_the_benchmark_csv():
    with open(paths.SOLUTIONS / "perf" / "bench.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["dtype"] == "float16" and r["mode"] == "fwd"]
    for (D, causal), impls in ff.H100_FORWARD_TFLOPS.items():
        for impl, values in impls.items():
            measured = {int(r["N"]): float(r["tflops"]) for r in rows
                        if int(r["D"]) == D and r["causal"] == str(causal) and r["impl"] == impl}
            assert tuple(measured[n] for n in ff.H100_SEQ_LENS) == values, (D, causal, impl)


# ---------------------------------------------------------------------------------------
# What the checks catch, shown with stand-ins launched like the kernel

def _fake_kernel(compute):
    """Launched like flash_attention_kernel; stores compute(q, k, v, scale, causal) -> (o, lse)."""
    class Kernel:
        __name__ = "fake_kernel"

        def __getitem__(self, grid):
            def launch(q, k, v, o, lse, *args, CAUSAL, **meta):
                scale = args[-1] / checks.LOG2E
                out, l = compute(q, k, v, scale, CAUSAL)
                o.copy_(out.to(o.dtype))
                lse.copy_(l.float())
            return launch
    return Kernel()


@pytest.mark.usefixtures("keyed")
def test_kernel_check_passes_a_right_stand_in():
    right = _fake_kernel(lambda q, k, v, scale, causal: checks.reference(q, k, v, causal, scale))
    checks.case_kernel_random(right, 1, 2, 30, 40, 24, F32, seed=1,
                              out_layout="bnhd", quiet=True)


@pytest.mark.usefixtures("keyed")
def test_kernel_check_names_an_fp16_accumulator():
    def fp16_acc(q, k, v, scale, causal):
        o, lse = checks.reference(q, k, v, causal, scale)
        s = q.double() @ k.double().transpose(-1, -2) * scale
        acc = (torch.exp(s - s.amax(-1, keepdim=True)) @ v.double()).half()  # overflows
        return acc.double() / torch.exp(s - s.amax(-1, keepdim=True)).sum(-1, keepdim=True), lse
    with pytest.raises(CheckFailed, match="fp32"):
        checks.case_kernel_random(_fake_kernel(fp16_acc), 1, 1, 20, 60, 16, F16, seed=2,
                                  kind="big_v", quiet=True)


@pytest.mark.usefixtures("keyed")
def test_kernel_check_names_a_missing_tail_mask():
    def tail_counted(q, k, v, scale, causal):
        zeros = torch.zeros(*k.shape[:2], 32 - k.shape[2] % 32, k.shape[3], dtype=k.dtype,
                            device=k.device)
        return checks.reference(q, torch.cat([k, zeros], 2), torch.cat([v, zeros], 2), causal, scale)
    with pytest.raises(CheckFailed, match="tail"):
        checks.case_kernel_random(_fake_kernel(tail_counted), 1, 2, 20, 45, 16, F32, seed=3,
                                  quiet=True)


@pytest.mark.usefixtures("keyed")
def test_kernel_check_names_lse_in_base_2():
    def base2(q, k, v, scale, causal):
        o, lse = checks.reference(q, k, v, causal, scale)
        return o, lse * checks.LOG2E
    with pytest.raises(CheckFailed, match="base 2"):
        checks.case_kernel_random(_fake_kernel(base2), 1, 2, 20, 45, 16, F32, seed=4, quiet=True)


@pytest.mark.usefixtures("keyed")
def test_wrapper_check_refuses_a_grid_over_key_blocks():
    def over_keys(q, k, v, causal=False, sm_scale=None, *, block_q=None, block_k=None):
        B, H, Nq, D = q.shape
        o, lse = torch.empty_like(q), torch.empty(B, H, Nq, dtype=torch.float32, device=q.device)
        ff.flash_attention_kernel[ff.flash_grid(Nq, B, H, block_k)](
            q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, Nq, k.shape[2],
            ff.default_scale(sm_scale, D) * ff.LOG2E, GROUP=1, HEAD_DIM=D,
            BLOCK_D=checks.block_d(D), BLOCK_Q=block_q, BLOCK_K=block_k, CAUSAL=causal,
            DOT_PRECISION=ff.dot_precision(q.dtype))
        return o, lse
    with pytest.raises(CheckFailed, match="BLOCK_Q"):
        checks.case_wrapper_random(over_keys, ff.flash_attention_kernel, 1, 1, 40, 40, 16, F32,
                                   seed=5, blocks=(16, 32), quiet=True)


def test_wrapper_uses_one_launch():
    q, k, v = checks.attention_inputs(1, 2, 40, 33, 24, F16, seed=6)
    with count_launches(ff.flash_attention_kernel) as launches:
        o, lse = ff.flash_attention(q, k, v, causal=False, block_q=16, block_k=32)
    assert launches[0] == 1 and o.dtype == F16 and lse.dtype == F32


# ---------------------------------------------------------------------------------------
# The recorded classic mistakes, named as their whole outputs would name them

def _visible(cases, default_blocks):
    """(q, k, v, blocks, scale, causal) of a check's cases, as the check makes them."""
    for shape, options in cases:
        B, H, Nq, Nk, D, dtype = shape[:6]
        q, k, v = checks.attention_inputs(B, H, Nq, Nk, D, dtype, seed=options["seed"],
                                          kind=options.get("kind", "random"),
                                          layouts=options.get("layouts", ("contiguous",) * 3))
        scale = 1.0 / math.sqrt(D) if options.get("sm_scale") is None else options["sm_scale"]
        yield q, k, v, options.get("blocks", shape[6:] or default_blocks), scale, options.get("causal", False)


def assert_named_as_before(compare, out, outputs, texts):
    """compare(out) fails naming the first mistake (in the check's order) whose whole
    output out matches, as the checks did when they computed the outputs, or names none;
    or it passes, where the mistake does not show on these inputs."""
    atol, rtol = tolerance(out.dtype, out.device)
    a = out.detach().to("cpu", torch.float64)
    want = next((text for key, text in texts.items() if key in outputs and torch.allclose(
        a, outputs[key].detach().to("cpu", torch.float64), atol=atol, rtol=rtol, equal_nan=True)), None)
    try:
        compare(out)
    except CheckFailed as failure:
        message = str(failure)
        named = re.search("this matches a classic mistake: (.*)", message)
        if "differs from the reference" in message or " has NaN at " in message:
            assert (named and named.group(1)) == want, (want, message)
            return want
    return None


# The first case of the blocked check (its classic mistakes have names), then the wrapper's
BLOCKED_CASE = ((2, 2, 40, 40, 40, F32, 16, 16), dict(seed=1))


@pytest.mark.parametrize("case", [("blocked", BLOCKED_CASE)] + [("wrapper", c) for c in checks.WRAPPER_CASES])
def test_recorded_mistakes_are_named_as_their_whole_outputs_would_be(case):
    """Each classic mistake's output (O, and LSE for the wrapper), compared as a visible
    case compares, is named from the recorded signatures (no answer computed) as the first
    mistake whose whole output it matches."""
    kind, (shape, options) = case
    (q, k, v, blocks, scale, causal), = _visible([(shape, options)], checks.INTERPRETER_BLOCKS)
    base2, lse = kind == "wrapper", kind == "wrapper"
    mistakes = checks._mistakes(q, k, v, blocks, scale, causal, base2=base2, lse=lse)
    o, right_lse = checks.reference(q, k, v, causal, scale)

    def compare(out, lse_out=right_lse.float() if lse else None):
        checks._check_result(out, lse_out, q, k, v, name="o", causal=causal, scale=scale,
                             kind=options.get("kind", "random"), mistakes=mistakes, quiet=True)
    outputs = answers.loop_outputs(q, k, v, *blocks, scale, causal, base2, [list(t.stride()) for t in (q, k, v)])
    texts = checks._loop_mistakes(q, k, v, base2)
    named = [assert_named_as_before(compare, wrong.to(q.dtype), outputs, texts) for wrong in outputs.values()]
    if lse:
        lse_outputs = answers.lse_outputs(q, k, scale, causal)
        named += [assert_named_as_before(lambda out: compare(o.to(q.dtype), out), wrong.float(), lse_outputs,
                                         checks._LSE_MISTAKES) for wrong in lse_outputs.values()]
    assert any(named)


# ---------------------------------------------------------------------------------------
# The reference passes every visible check and hidden test

CHECKED = {  # test cell -> (visible check, the reference objects it takes)
    "test_flash_grid": ("check_flash_grid", (ff.flash_grid,)),
    "test_grid_axis": ("check_choice", (ff.grid_axis_answer,)),
    "test_programs": ("check_number", (ff.programs_answer,)),
    "test_batch_heads": ("check_choice", (ff.batch_heads_answer,)),
    "test_grid_limit": ("check_choice", (ff.grid_limit_answer,)),
    "test_flash_attention_blocked": ("check_flash_attention_blocked", (ff.flash_attention_blocked,)),
    "test_flash_attention_kernel": ("check_flash_attention_kernel", (ff.flash_attention_kernel,)),
    "test_flash_attention": ("check_flash_attention", (ff.flash_attention, ff.flash_attention_kernel)),
}


@pytest.mark.parametrize("test_cell", CHECKED)
def test_reference_passes_visible_checks_and_hidden_tests(test_cell):
    check, args = CHECKED[test_cell]
    extra = {"name": test_cell[5:] + "_answer"} if check in ("check_choice", "check_number") else {}
    getattr(checks, check)(*args, **extra)
    getattr(answer_key.hidden("05_flash_forward"), test_cell)(*args)


@pytest.mark.parametrize("i, says", enumerate(["seq_len // block_q", "axes are swapped", "share axis 1",
                                                "not one"]))
def test_flash_grid_check_names_each_recorded_mistake(i, says):
    """A flash_grid that returns a classic mistake's grid fails the visible check, which
    reads the recorded grids, naming that mistake, and fails the hidden test, which
    computes them."""
    mistakes = paths.lesson_file("05_flash_forward", "answers").flash_grid_mistakes
    with pytest.raises(CheckFailed, match=re.escape(says)):
        checks.check_flash_grid(lambda *args: mistakes(*args)[i])
    with pytest.raises(CheckFailed):
        answer_key.hidden("05_flash_forward").test_flash_grid(lambda *args: mistakes(*args)[i])


def test_wrong_answers_fail():
    hidden = answer_key.hidden("05_flash_forward")
    for test_cell, right in (("test_grid_axis", ff.grid_axis_answer), ("test_batch_heads", ff.batch_heads_answer),
                             ("test_grid_limit", ff.grid_limit_answer)):
        for wrong in set("abcd") - {right}:
            with pytest.raises(CheckFailed, match="not the right choice"):
                getattr(hidden, test_cell)(wrong)
    with pytest.raises(CheckFailed, match="not right"):
        hidden.test_programs(8)
    with pytest.raises(CheckFailed, match="whole number"):
        hidden.test_programs("4")


@pytest.mark.skipif(not INTERPRET, reason="on a GPU the kernels compile when they run")
def test_kernel_compiles_for_gpu():
    checks.compile_kernel_for_gpu(ff.flash_attention_kernel)


def test_plots_draw():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course import plots
    plots.flash_tiles_figure(causal=True)
    q, k, v = (randn(1, 1, 1, 16, seed=1), randn(1, 1, 64, 16, seed=2), randn(1, 1, 64, 16, seed=3))
    history = []
    out = ff.flash_attention_blocked(q, k, v, 1, 16, history=history)
    plots.online_row_figure(history, out)
    plots.tflops_figure(ff.H100_SEQ_LENS, ff.H100_FORWARD_TFLOPS[(64, False)])
    plt.close("all")
