"""Module 04 reference (solutions/naive_attention.py) against PyTorch and float64, its
memory and traffic models, the H100 figures it ships, and its checks.

On a CPU the Triton steps run through the interpreter at small sizes; on a GPU the same
tests run compiled (fp32 then uses TF32 tolerances, course.testing picks them).
"""
import csv
import math
import re

import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch
import torch.nn.functional as F

from course import DEVICE, INTERPRET, recorded
from course.checks import naive_attention as checks
from course.testing import CheckFailed, assert_close, count_launches
from grader import answer_key, paths
from solutions import naive_attention as key
from solutions.softmax import softmax_kernel
from solutions.tiling import batched_gemm_strided_kernel

answers = paths.lesson_file("04_naive_attention", "answers")
DTYPES = (torch.float32, torch.float16) if INTERPRET else (torch.float32, torch.float16, torch.bfloat16)
# (B, H, Hkv, Nq, Nk, D, causal, sm_scale, layout, kind)
CASES = [
    (1, 1, 1, 1, 1, 16, False, None, "bhnd", "random"),
    (2, 4, 2, 37, 45, 20, True, None, "bhnd", "random"),
    (2, 3, 1, 45, 37, 24, True, 0.3, "bnhd", "random"),
    (1, 2, 2, 33, 33, 40, False, 1.5, "transposed", "random"),
    (2, 2, 2, 20, 27, 16, True, None, "shared", "random"),
    (1, 2, 1, 30, 22, 16, True, None, "bhnd", "large"),
    (1, 2, 2, 22, 30, 24, False, 0.2, "bnhd", "negative"),
]


def _id(case):
    B, H, Hkv, Nq, Nk, D, causal, scale, layout, kind = case
    return f"B{B}H{H}kv{Hkv}-q{Nq}k{Nk}-D{D}-{'causal' if causal else 'full'}-s{scale}-{layout}-{kind}"


def _inputs(case, dtype, seed=0):
    B, H, Hkv, Nq, Nk, D, causal, sm_scale, layout, kind = case
    scale = 1 / math.sqrt(D) if sm_scale is None else sm_scale
    return checks.attention_inputs(B, H, Hkv, Nq, Nk, D, dtype, seed=seed, scale=scale, kind=kind,
                                   layout=layout), causal, sm_scale, scale


def test_reference_equals_sdpa_in_float64():
    for case in CASES:
        (q, k, v), causal, sm_scale, scale = _inputs(case, torch.float32, seed=3)
        q, k, v = (t.double() for t in (q, k, v))
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                  enable_gqa=True)
        out = key.attention_reference(q, k, v, causal=causal, sm_scale=sm_scale)
        assert out.dtype == torch.float64
        assert_close(out, expected, atol=1e-12, rtol=1e-12, quiet=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_reference_in_low_precision(case, dtype):
    (q, k, v), causal, sm_scale, scale = _inputs(case, dtype, seed=4)
    out = key.attention_reference(q, k, v, causal=causal, sm_scale=sm_scale)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, checks.expected_attention(q, k, v, causal, scale), quiet=True)


def test_reference_keeps_fp16_scores_past_fp16_range():
    """Q K^T about 70,000 before scaling: inf in fp16, an ordinary number in fp32."""
    q, k, v = checks.attention_inputs(1, 2, 1, 17, 16, 16, torch.float16, seed=5, scale=0.25,
                                      kind="overflow")
    assert torch.isinf(q[0, 0, :1] @ k[0, 0, :1].T).all()  # what an fp16 S would hold
    out = key.attention_reference(q, k, v, causal=True)
    assert_close(out, checks.expected_attention(q, k, v, True, 0.25), quiet=True)


def test_causal_future_is_top_left_like_sdpa():
    for n_q, n_k in [(1, 1), (3, 5), (5, 3), (4, 4)]:
        mask = key.causal_future(n_q, n_k, "cpu")
        sdpa_visible = torch.ones(n_q, n_k).tril(0).bool()  # SDPA's is_causal (its docs)
        assert mask.dtype == torch.bool and torch.equal(mask, ~sdpa_visible)


def test_repeat_kv_consecutive_heads():
    x = torch.arange(2 * 3).float().view(1, 3, 1, 2)  # head j holds 2j, 2j+1
    out = key.repeat_kv(x, 6)
    assert [int(out[0, h, 0, 0]) // 2 for h in range(6)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_naive_attention(case, dtype):
    (q, k, v), causal, sm_scale, scale = _inputs(case, dtype, seed=6)
    with count_launches(batched_gemm_strided_kernel) as gemms, count_launches(softmax_kernel) as softmaxes:
        out = key.naive_attention(q, k, v, causal=causal, sm_scale=sm_scale)
    assert (gemms[0], softmaxes[0]) == (2, 1)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, checks.expected_attention(q, k, v, causal, scale), quiet=True)


def test_naive_attention_overflowing_fp16_scores():
    q, k, v = checks.attention_inputs(1, 2, 1, 17, 16, 16, torch.float16, seed=5, scale=0.25,
                                      kind="overflow")
    out = key.naive_attention(q, k, v, causal=True)
    assert_close(out, checks.expected_attention(q, k, v, True, 0.25), quiet=True)


@pytest.mark.parametrize("call, error", [
    (lambda t: key.naive_attention(t[0], t, t), ValueError),
    (lambda t: key.naive_attention(t, t.half(), t), TypeError),
    (lambda t: key.naive_attention(t.int(), t.int(), t.int()), TypeError),
    (lambda t: key.naive_attention(torch.ones(1, 3, 8, 16, device=DEVICE), t, t), ValueError),
])
def test_naive_attention_rejects_bad_inputs(call, error):
    with pytest.raises(error):
        call(torch.ones(1, 2, 8, 16, device=DEVICE))


def test_sp_bytes():
    assert key.sp_bytes(1, 16, 16384, 16384, torch.float32) == 32 * 2**30
    assert key.sp_bytes(2, 3, 5, 7, torch.float16) == 2 * 2 * 3 * 5 * 7 * 2
    assert key.sp_bytes(1, 1, 1, 1, torch.bfloat16) == 4


def test_traffic_models():
    M, d = 116_736, 64
    b = key.flash_one_pass_max_n(d, M)
    assert b == 456
    for N in (1, 100, b):  # one block of queries: everything read once, the least possible
        assert key.flash_dram_accesses(N, d, M) == 4 * N * d
    assert key.flash_dram_accesses(b + 1, d, M) == 2 * (b + 1) * d * 3
    for N in (1024, 16384, 65536):
        assert key.flash_dram_accesses(N, d, M) < key.naive_dram_accesses(N, d)
    for N in (16384, 65536):  # Theta(N^2 d^2 / M): at long N within 5% of 8 N^2 d^2 / M
        assert abs(key.flash_dram_accesses(N, d, M) / (8 * N * N * d * d / M) - 1) < 0.05
    assert key.naive_dram_accesses(4096, 64) == 4 * 4096 * 64 + 4 * 4096 ** 2
    with pytest.raises(ValueError):
        key.flash_dram_accesses(10, 64, 255)


def test_answers_follow_the_models():
    # Memory-bound: S and P's traffic at N = 16384 (B = 1, H = 16, fp32) takes longer at
    # 3.35 TB/s than the flops at 800 TFLOPS, by more than 10x.
    N, H, D = 16384, 16, 64
    seconds_traffic = 4 * N * N * 4 * H / 3.35e12
    seconds_flops = 4 * N * N * D * H / 800e12
    assert seconds_traffic > 10 * seconds_flops and key.bottleneck_answer == "b"
    N, M = 1 << 20, 116_736  # doubling d multiplies FlashAttention's count by about 4
    ratio = key.flash_dram_accesses(N, 128, M) / key.flash_dram_accesses(N, 64, M)
    assert abs(ratio - 4) < 0.1 and key.head_dim_answer == "c"


def test_shipped_h100_figures_match_the_benchmark_csv():
    with open(paths.SOLUTIONS / "perf" / "bench.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["dtype"] == "float16" and r["D"] == "64"
                and r["causal"] == "False" and r["mode"] == "fwd"]
    cell = {(int(r["N"]), r["impl"]): r for r in rows}
    for N, (B, naive_mib, naive_tflops, flash_mib, flash_tflops) in key.H100_MEASURED.items():
        naive, flash = cell[(N, "naive")], cell[(N, "tuned")]
        assert (int(naive["B"]), int(naive["H"])) == (B, 16)
        assert (float(naive["peak_mib"]), float(naive["tflops"])) == (naive_mib, naive_tflops)
        assert (float(flash["peak_mib"]), float(flash["tflops"])) == (flash_mib, flash_tflops)
        # The memory model: S and P in fp32, plus repeat_kv's copies of K and V (fp16).
        model = key.sp_bytes(B, 16, N, N, torch.float32) + 2 * B * 16 * N * 64 * 2
        assert model / 2**20 == naive_mib


@pytest.mark.skipif(INTERPRET, reason="peak memory is measured on a GPU")
def test_naive_attention_peak_memory_on_gpu():
    B, H, N, D = 2, 16, 2048, 64
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    key.naive_attention(q, k, v)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    model = key.sp_bytes(B, H, N, N, torch.float32)
    assert model <= peak <= 1.1 * model


def test_attention_check_names_classic_mistakes():
    """On inputs of no visible check: the answer key computes the mistakes' outputs."""
    def no_scale(q, k, v, causal=False, sm_scale=None):
        return key.attention_reference(q, k, v, causal, sm_scale=1.0)

    def bottom_right(q, k, v, causal=False, sm_scale=None):
        return answers.attention64(q, k, v, causal, key.default_scale(sm_scale, q.shape[-1]),
                                   mask="bottom-right").to(q.dtype)
    with recorded.computing(answer_key.resolve):
        with pytest.raises(CheckFailed, match="not multiplied by the scale"):
            checks.case_attention(no_scale, 1, 2, 2, 20, 20, 16, torch.float32, seed=1, quiet=True)
        with pytest.raises(CheckFailed, match="bottom-right"):
            checks.case_attention(bottom_right, 1, 2, 2, 13, 29, 16, torch.float32, seed=1, causal=True,
                                  quiet=True)
        with pytest.raises(CheckFailed, match="scaled_dot_product_attention"):
            checks.case_attention(lambda q, k, v, causal=False: F.scaled_dot_product_attention(
                q, k, v, is_causal=causal), 1, 2, 2, 20, 20, 16, torch.float32, seed=1, quiet=True)


def _making(mistake):
    """An attention_reference that makes one classic mistake: answers.attention64 with the
    switch the mistake's name says."""
    def fn(q, k, v, causal=False, sm_scale=None):
        D = q.shape[-1]
        scale = key.default_scale(sm_scale, D)
        switches = {"no_scale": dict(scale=1.0), "scale_twice": dict(scale=scale * scale),
                    "softmax_over_queries": dict(softmax_dim=-2), "divided_by_d": dict(scale=1 / D),
                    "sm_scale_ignored": dict(scale=1 / math.sqrt(D)), "k_not_transposed": dict(transpose_k=False),
                    "mask_missing": dict(mask=None), "diagonal_hidden": dict(mask="diagonal"),
                    "bottom_right": dict(mask="bottom-right"), "heads_modulo": dict(kv_heads="modulo")}
        return answers.attention64(q, k, v, causal, **{"scale": scale, **switches[mistake]}).to(q.dtype)
    return fn


@pytest.mark.parametrize("mistake", list(checks._MISTAKES))
def test_attention_check_names_each_recorded_mistake(mistake):
    """The visible check reads each classic mistake's recorded output and names it (its
    first cases are those where each mistake shows). Dividing by D is applying
    1/sqrt(D) twice: the check names the first of the two."""
    says = checks._MISTAKES["scale_twice" if mistake == "divided_by_d" else mistake]
    with pytest.raises(CheckFailed, match=re.escape(says)):
        checks.check_attention_reference(_making(mistake))


CHECKED = {  # exercise -> the reference functions its check and hidden test take
    "causal_future": (key.causal_future,),
    "repeat_kv": (key.repeat_kv,),
    "attention_reference": (key.attention_reference,),
    "naive_attention": (key.naive_attention,),
    "sp_bytes": (key.sp_bytes,),
    "dram_accesses": (key.naive_dram_accesses, key.flash_dram_accesses, key.flash_one_pass_max_n),
}


@pytest.mark.parametrize("exercise", CHECKED)
def test_reference_passes_visible_checks_and_hidden_tests(exercise):
    getattr(checks, f"check_{exercise}")(*CHECKED[exercise])
    getattr(answer_key.hidden("04_naive_attention"), f"test_{exercise}")(*CHECKED[exercise])


MISTAKES = {  # answers.py's classic-mistake values -> (exercise, which of its functions, what the check says)
    "sp_bytes_mistakes": ("sp_bytes", 0, ("counts elements", "one matrix: S and P", "one matrix, in elements")),
    "naive_dram_accesses_mistakes": ("dram_accesses", 0, ("4 N^2, not 2 N^2", "count every N^2 access",
                                                          "Q, K, V and O are read", "O is written: 4 N d")),
    "flash_dram_accesses_mistakes": ("dram_accesses", 1, ("full blocks only", "2 N d per block",
                                                          "written once too", "share half the SRAM")),
    "flash_one_pass_max_n_mistakes": ("dram_accesses", 2, ("take half the SRAM",)),
}


@pytest.mark.parametrize("mistakes, i", [(name, i) for name, (_, _, says) in MISTAKES.items()
                                         for i in range(len(says))])
def test_checks_name_each_recorded_mistake(mistakes, i):
    """A function that returns a classic mistake's value fails the visible check, which
    reads the recorded values, naming that mistake, and fails the hidden test, which
    computes them."""
    exercise, position, says = MISTAKES[mistakes]
    values = getattr(paths.lesson_file("04_naive_attention", "answers"), mistakes)
    functions = list(CHECKED[exercise])
    functions[position] = lambda *args: values(*args)[i]
    with pytest.raises(CheckFailed, match=re.escape(says[i])):
        getattr(checks, f"check_{exercise}")(*functions)
    with pytest.raises(CheckFailed):
        getattr(answer_key.hidden("04_naive_attention"), f"test_{exercise}")(*functions)


@pytest.mark.parametrize("answer", ["bottleneck_answer", "head_dim_answer"])
def test_answers_pass_their_hidden_tests(answer):
    checks.check_choice(getattr(key, answer), name=answer)
    getattr(answer_key.hidden("04_naive_attention"), f"test_{answer}")(getattr(key, answer))
