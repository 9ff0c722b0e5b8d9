"""Hidden tests of module 04: the visible cases on inputs the learner never saw (several
seeds, lengths and head dims that are not powers of two nor multiples of any block, Nq != Nk
both ways, grouped heads, several batches and heads, causal and not, scales of every size,
every layout of the inputs, scores far above and far below zero, fp16 products past fp16's
range, fp32 and fp16, bf16 and longer sequences on a GPU)."""
import torch

from course import DEVICE, INTERPRET, pick
from course.checks import naive_attention as visible
from course.checks.naive_attention import LAYOUTS
from course.testing import check_rejects, graded_choice
from solutions import naive_attention as key

SEEDS = (41, 42, 43)
F32, F16 = torch.float32, torch.float16
DTYPES = (F32, F16) if INTERPRET else (F32, F16, torch.bfloat16)


def test_causal_future(fn):
    for n_q, n_k in [(2, 2), (4, 9), (9, 4), (33, 17), (17, 33), (64, 64), (1, 100), (100, 1),
                     (257, 300), (300, 257)]:
        visible.case_causal_future(fn, n_q, n_k)


def test_repeat_kv(fn):
    cases = [  # (B, Hkv, N, D, heads, layout)
        (1, 1, 1, 16, 1, "bhnd"), (2, 3, 9, 20, 12, "bhnd"), (3, 2, 13, 24, 6, "bnhd"),
        (1, 4, 7, 40, 8, "transposed"), (2, 1, 11, 16, 5, "bnhd"), (1, 2, 6, 48, 2, "transposed"),
    ]
    for (B, Hkv, N, D, heads, layout), seed, dtype in zip(cases, SEEDS * 2, DTYPES * 3):
        visible.case_repeat_kv(fn, B, Hkv, N, D, heads, dtype, seed=seed, layout=layout)


def _attention_cases(check):
    """The hidden cases of both exercises; check(B, H, Hkv, Nq, Nk, D, dtype, **options).
    Small on a CPU: in the interpreter each query row of the softmax kernel is one program
    (a few ms), and every input crosses to the grading worker and back."""
    for i, ((B, H, Hkv, Nq, Nk, D), causal, sm_scale) in enumerate(zip(
            [(1, 1, 1, 1, 1, 16), (2, 3, 3, 19, 47, 40), (1, 4, 2, 23, 30, 20), (3, 2, 1, 14, 29, 48),
             (1, 6, 3, 11, 65, 24), (1, 2, 2, 33, 33, 16)],
            (False, True, True, False, True, True), (None, 0.05, None, 1.3, 0.7, None))):
        check(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=SEEDS[i % 3] + i, causal=causal,
              sm_scale=sm_scale)
    for i, layout in enumerate(LAYOUTS[1:]):
        for dtype in (F32, F16):
            check(1, 2, 2, 13 + 5 * i, 34 - 6 * i, 24 + 8 * i, dtype, seed=SEEDS[i] + 7, layout=layout,
                  causal=dtype == F16, sm_scale=(0.4, None, 0.9)[i])
    for kind, dtype, causal in [("large", F32, False), ("large", F16, True), ("negative", F32, True),
                                ("negative", F16, False), ("overflow", F16, True)]:
        check(1, 2, 1, 18, 31, 20, dtype, seed=SEEDS[1] + 11, kind=kind, causal=causal,
              layout="bnhd" if causal else "bhnd")
    check(1, 2, 1, 29, 20, 16, F16, seed=SEEDS[2], kind="overflow", sm_scale=0.01)
    for dtype in DTYPES[2:]:  # bf16, on a GPU
        check(2, 4, 2, 97, 61, 64, dtype, seed=SEEDS[0], causal=True, layout="bnhd")
        check(1, 2, 2, 40, 50, 32, dtype, seed=SEEDS[1], kind="large")
    for (B, H, Hkv, Nq, Nk, D), dtype in zip(pick([], [(1, 4, 4, 500, 500, 128), (1, 4, 1, 377, 525, 96),
                                                       (1, 2, 2, 300, 517, 256)]), DTYPES[::-1]):
        check(B, H, Hkv, Nq, Nk, D, dtype, seed=SEEDS[2], causal=Nq == Nk)


def test_attention_reference(fn):
    def check(*args, **kwargs):
        visible.case_attention(fn, *args, quiet=True, **kwargs)
    _attention_cases(check)


def test_naive_attention(fn):
    _attention_cases(lambda *args, **kwargs: visible.case_naive_attention(fn, *args, **kwargs))

    def t(*shape, dtype=torch.float32):
        return torch.ones(*shape, device=DEVICE, dtype=dtype)
    q = t(2, 4, 8, 16)
    check_rejects(visible.bad_attention_inputs(fn) + [
        ("k with another batch size", lambda: fn(q, t(1, 4, 8, 16), t(1, 4, 8, 16))),
        ("k whose head dim differs from q's", lambda: fn(q, t(2, 4, 8, 24), t(2, 4, 8, 24))),
        ("a head dim of 8, below 16", lambda: fn(t(2, 4, 8, 8), t(2, 4, 8, 8), t(2, 4, 8, 8))),
        ("float64 inputs", lambda: fn(q.double(), q.double(), q.double())),
    ], name="naive_attention")


def test_sp_bytes(fn):
    g = torch.Generator().manual_seed(SEEDS[0])
    cases = [(1, 1, 1, 1, torch.float16), (4, 32, 8192, 8192, torch.float32),
             (1, 64, 131072, 131072, torch.bfloat16), (7, 3, 100, 37, torch.float64)]
    cases += [tuple(int(x) for x in torch.randint(1, 5000, (4,), generator=g)) + (dtype,)
              for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float32)]
    for B, H, Nq, Nk, dtype in cases:
        visible.case_sp_bytes(fn, B, H, Nq, Nk, dtype)


def test_dram_accesses(naive, flash, one_pass):
    g = torch.Generator().manual_seed(SEEDS[1])
    cases = [(1, 1, 4), (7, 3, 12), (456, 64, 116_736), (457, 64, 116_736), (65536, 128, 116_736),
             (100_000, 256, 50_000), (33, 16, 64 * 16)]
    for _ in range(6):
        d = int(torch.randint(1, 300, (1,), generator=g))
        cases.append((int(torch.randint(1, 100_000, (1,), generator=g)), d,
                      4 * d * int(torch.randint(1, 2000, (1,), generator=g))
                      + int(torch.randint(0, 4 * d, (1,), generator=g))))
    for N, d, M in cases:
        visible.case_dram_accesses(naive, flash, one_pass, N, d, M)
    check_rejects([("an SRAM smaller than 4 d (M=255, d=64)", lambda: flash(10, 64, 255)),
                   ("an SRAM of 0 elements", lambda: flash(10, 16, 0))], name="flash_dram_accesses")


def test_bottleneck_answer(answer):
    graded_choice(answer, "bottleneck_answer", key.bottleneck_answer,
                  "compare naive attention's bytes of S and P with an H100's 3.35 TB/s, and its "
                  "flops with the tensor cores' ~800 TFLOPS.")


def test_head_dim_answer(answer):
    graded_choice(answer, "head_dim_answer", key.head_dim_answer,
                  "look at how FlashAttention's count depends on d at long sequences (two places: "
                  "the block size and the bytes per pass).")
