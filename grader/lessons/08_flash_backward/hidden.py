"""Hidden tests of module 08: the visible cases on inputs the learner never saw (several
seeds; lengths and head dims that are not powers of two nor multiples of the blocks, with
Nq != Nk both ways; causal and not; several batch entries and heads, GQA and MQA; every
layout of q, k, v (and of o and dO for the wrapper); blocks that differ; rows of scores far
above and far below zero; V far from zero on either side; fp32 and fp16, bf16 and longer
sequences on a GPU), and the answer to the trade-off question. The static rules (no autograd
in the PyTorch exercises, one jit function per kernel, the wrapper and the autograd Function
launch the kernels, dQ written by atomic adds only) are the checks module's RULES."""
import torch

from course import INTERPRET
from course.checks import flash_backward as visible
from course.checks.flash_backward import BF16, DTYPES, F16, F32, KERNEL_LAYOUTS, LAYOUTS
from course.testing import check_rejects, graded_choice, randn
from solutions import flash_backward as key

SEEDS = (81, 82, 83)


def _random_cases(seed, count, layouts=KERNEL_LAYOUTS, views=3):
    """(B, H, Hkv, Nq, Nk, D, blocks, causal, dtype, layouts), drawn from seed: lengths of 1
    to 80, head dims rarely powers of two, GQA groups of 1 to 3, blocks of 16 or 32."""
    g = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]
    cases = []
    for _ in range(count):
        Hkv, group = pick((1, 2)), pick((1, 2, 3))
        cases.append((1, Hkv * group, Hkv, int(torch.randint(1, 81, (1,), generator=g)),
                      int(torch.randint(1, 81, (1,), generator=g)), pick((16, 24, 40, 48)),
                      (pick((16, 32)), pick((16, 32))), bool(torch.randint(2, (1,), generator=g)),
                      pick(DTYPES), tuple(pick(layouts) for _ in range(views))))
    return cases


def _turning(layouts, i, count=3):
    """count layouts, different from one another, turning with i."""
    return tuple(layouts[(i + j) % len(layouts)] for j in range(count))


def test_softmax_backward(fn):
    def case(*args, **kwargs):
        visible.case_softmax_backward(fn, *args, quiet=True, **kwargs)
    cases = [((7, 13), -1), ((13, 7), 0), ((2, 5, 3), 1), ((3, 4, 5, 6), 2), ((2, 9, 70), -1),
             ((4, 2), 1), ((3, 50, 4), -2)]
    for i, ((shape, dim), seed) in enumerate(zip(cases, SEEDS * 3)):
        case(shape, dim, DTYPES[i % 2], seed=seed + i, layout=("contiguous", "transposed")[i % 2])
    case((6, 129), -1, F16, seed=SEEDS[0], kind="extreme")
    case((5, 2, 33), 1, F32, seed=SEEDS[1], kind="extreme", layout="transposed")
    case((4, 3, 40), -1, F16, seed=SEEDS[2], kind="extreme", layout="transposed")
    if not INTERPRET:
        case((64, 1000), -1, BF16, seed=SEEDS[0])


def test_attention_backward_reference(fn):
    def case(*args, **kwargs):
        visible.case_reference(fn, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Hkv, Nq, Nk, D, causal)
        (1, 1, 1, 1, 1, 16, False), (2, 2, 2, 23, 17, 24, True), (1, 6, 2, 19, 31, 40, False),
        (2, 3, 1, 30, 30, 16, True), (1, 4, 4, 37, 12, 48, True), (2, 2, 1, 9, 41, 32, False)]
    for i, ((B, H, Hkv, Nq, Nk, D, causal), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, causal=causal,
             sm_scale=(None, 0.2, 1.3)[i % 3], layouts=_turning(LAYOUTS, i))
    case(1, 2, 2, 21, 21, 32, F16, seed=SEEDS[0], kind="extreme")
    case(2, 4, 2, 17, 25, 16, F32, seed=SEEDS[1], kind="extreme", causal=True,
         layouts=("transposed", "bnhd", "sliced"))
    case(1, 2, 1, 13, 40, 24, F16, seed=SEEDS[2], kind="big_v", causal=True)
    case(1, 3, 3, 11, 33, 16, F32, seed=SEEDS[0], kind="big_v_negative", layouts=("bnhd",) * 3)
    if not INTERPRET:
        case(2, 8, 2, 500, 700, 128, BF16, seed=SEEDS[1], causal=True)


def test_bwd_preprocess_kernel(kernel):
    def case(*args, **kwargs):
        visible.case_preprocess(kernel, *args, quiet=True, **kwargs)
    cases = [(1, 1, 1, 16, 16), (2, 3, 77, 24, 32), (1, 2, 100, 40, 16), (3, 1, 33, 72, 32),
             (1, 4, 64, 48, 64)]
    for i, ((B, H, Nq, D, block_m), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Nq, D, DTYPES[i % 2], seed=seed + i, block_m=block_m)
    case(2, 2, 41, 40, F16, seed=SEEDS[0], kind="big_v", block_m=32)
    case(1, 3, 29, 24, F32, seed=SEEDS[1], kind="big_v_negative", block_m=16)
    case(1, 2, 50, 16, F32, seed=SEEDS[2], kind="extreme")
    if not INTERPRET:
        case(4, 8, 2047, 128, BF16, seed=SEEDS[0], block_m=64)
        case(2, 4, 999, 256, F16, seed=SEEDS[1], block_m=128)


def _kernel_cases(case):
    """The cases every test of a backward kernel runs (case: the kernel's case function)."""
    cases = [  # (B, H, Hkv, Nq, Nk, D, blocks, causal)
        (1, 1, 1, 1, 1, 16, (16, 16), False), (2, 2, 2, 45, 30, 24, (16, 32), False),
        (1, 4, 2, 61, 61, 40, (32, 16), True), (1, 3, 1, 17, 70, 16, (32, 32), True),
        (2, 2, 1, 33, 50, 48, (16, 16), False)]
    for i, ((B, H, Hkv, Nq, Nk, D, blocks, causal), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, causal=causal, blocks=blocks,
             sm_scale=(None, 0.25, None, 1.1, 0.5)[i], layouts=_turning(KERNEL_LAYOUTS, i))
    for i, (B, H, Hkv, Nq, Nk, D, blocks, causal, dtype, layouts) in enumerate(_random_cases(SEEDS[1], 3)):
        case(B, H, Hkv, Nq, Nk, D, dtype, seed=SEEDS[2] + i, causal=causal, blocks=blocks, layouts=layouts)
    case(1, 2, 2, 41, 41, 64, F32, seed=SEEDS[0], kind="extreme", layouts=("sliced", "bnhd", "contiguous"))
    case(1, 4, 2, 37, 37, 32, F16, seed=SEEDS[1], kind="extreme", causal=True, blocks=(16, 32))
    case(1, 2, 1, 19, 66, 24, F16, seed=SEEDS[2], kind="big_v", blocks=(32, 16))
    case(1, 1, 1, 23, 50, 16, F32, seed=SEEDS[0], kind="big_v_negative", causal=True,
         layouts=("bnhd", "sliced", "bnhd"))
    if not INTERPRET:  # (fp32 at D <= 64: exact fp32 dots at D = 96 took 14 s to compile)
        case(2, 8, 2, 1000, 777, 128, BF16, seed=SEEDS[1], causal=True, blocks=(64, 64))
        case(1, 4, 4, 333, 901, 64, F16, seed=SEEDS[2], blocks=(64, 32), layouts=("bnhd",) * 3)
        case(2, 2, 1, 300, 300, 40, F32, seed=SEEDS[0], causal=True, blocks=(32, 32))


def test_bwd_dkdv_kernel(kernel):
    _kernel_cases(lambda *args, **kwargs: visible.case_dkdv(kernel, *args, quiet=True, **kwargs))


def test_bwd_dq_kernel(kernel):
    _kernel_cases(lambda *args, **kwargs: visible.case_dq(kernel, *args, quiet=True, **kwargs))


def test_accumulate_dq(kernel):
    def case(*args, **kwargs):
        visible.case_dkdv(kernel, *args, fused=True, quiet=True, **kwargs)
    _kernel_cases(case)
    case(2, 2, 1, 29, 47, 24, F32, seed=SEEDS[2], blocks=(16, 16), causal=True,
         dq_start=-randn(2, 2, 29, 24, seed=SEEDS[1]))
    visible.check_atomic_dq(kernel)  # the learner's own kernel object (tests); RULES at grading


def test_flash_backward(fn, kernel):
    def case(*args, **kwargs):
        visible.case_wrapper(fn, kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Hkv, Nq, Nk, D, blocks, causal)
        (1, 1, 1, 1, 1, 16, None, False), (2, 2, 2, 45, 70, 24, (16, 32), True),
        (1, 4, 2, 61, 33, 40, None, False), (1, 3, 1, 30, 30, 16, (32, 16), True),
        (2, 2, 1, 17, 50, 48, None, False), (1, 2, 2, 64, 64, 32, (16, 16), True)]
    for i, ((B, H, Hkv, Nq, Nk, D, blocks, causal), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, causal=causal, blocks=blocks,
             fused=bool(i % 3 == 1), sm_scale=(None, 0.3, None)[i % 3],
             layouts=_turning(LAYOUTS, i, count=5))
    case(1, 2, 2, 41, 41, 64, F16, seed=SEEDS[0], kind="extreme", fused=True)
    case(1, 4, 2, 33, 47, 32, F32, seed=SEEDS[1], kind="extreme", causal=True,
         layouts=("transposed", "bnhd", "sliced", "sliced", "bnhd"))
    case(1, 2, 1, 19, 66, 24, F16, seed=SEEDS[2], kind="big_v")
    case(1, 1, 1, 23, 50, 16, F32, seed=SEEDS[0], kind="big_v_negative", fused=True,
         layouts=("contiguous",) * 3 + ("transposed", "sliced"))
    if not INTERPRET:  # real sizes, default GPU blocks
        case(2, 8, 2, 1024 + 7, 2048 - 3, 128, BF16, seed=SEEDS[1], causal=True, layouts=("bnhd",) * 5)
        case(1, 4, 4, 700, 700, 64, F16, seed=SEEDS[2], fused=True)
        case(1, 2, 1, 300, 500, 40, F32, seed=SEEDS[0], causal=True)
    x = torch.ones(1, 2, 8, 16, device=visible.DEVICE)
    longer = torch.ones(1, 2, 9, 16, device=visible.DEVICE)
    lse = torch.zeros(1, 2, 8, device=visible.DEVICE)
    check_rejects(visible.bad_inputs(fn) + [
        ("k and v of different lengths", lambda: fn(x, x, longer, x, lse, x)),
        ("float64 inputs", lambda: fn(x.double(), x.double(), x.double(), x.double(), lse, x.double())),
        ("a do in fp16 with fp32 q", lambda: fn(x, x, x, x, lse, x.half())),
    ], name="flash_backward")


def test_flash_attention_function(fn, kernel):
    def case(*args, **kwargs):
        visible.case_function(fn, kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Hkv, Nq, Nk, D, causal)
        (1, 1, 1, 1, 1, 16, False), (2, 2, 2, 45, 70, 24, True), (1, 4, 2, 61, 33, 40, False),
        (1, 3, 1, 30, 30, 16, True), (2, 2, 1, 17, 50, 48, False)]
    for i, ((B, H, Hkv, Nq, Nk, D, causal), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, causal=causal, fused=bool(i % 2),
             sm_scale=(None, 0.4, None)[i % 3], layouts=_turning(LAYOUTS, i, count=4))
    case(1, 2, 2, 41, 41, 64, F16, seed=SEEDS[0], kind="extreme", fused=True)
    case(1, 4, 2, 33, 33, 32, F32, seed=SEEDS[1], kind="extreme", causal=True)
    case(1, 2, 1, 19, 66, 24, F32, seed=SEEDS[2], kind="big_v", causal=True)
    case(1, 1, 1, 23, 50, 16, F16, seed=SEEDS[0], kind="big_v_negative", fused=True,
         layouts=("sliced", "bnhd", "transposed", "bnhd"))
    if not INTERPRET:
        case(2, 8, 2, 1024, 1024, 128, BF16, seed=SEEDS[1], causal=True, fused=True)
        case(1, 4, 4, 500, 300, 64, F16, seed=SEEDS[2], layouts=("bnhd",) * 4)


def test_fused_tradeoff(answer):
    graded_choice(answer, "fused_tradeoff_answer", key.fused_tradeoff_answer,
                  "count the matrix products, the atomic adds and the bytes of each path, then "
                  "read the H100 figures again.")
