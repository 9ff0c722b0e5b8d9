"""Hidden tests of module 06: the visible cases on inputs the learner never saw (several
seeds; lengths and head dims that are not powers of two nor multiples of the blocks; Nq
equal to, below and above Nk, K/V shorter than one block, a single query; GROUP of 1, 2,
3, 4 and MQA; causal and not; every layout of q, k, v and of the kernel's O; rows of
scores far above and far below zero; V far from zero on either side; fp32 and fp16, bf16
and longer sequences on a GPU), and the answers to the alignment questions."""
import torch

from course import INTERPRET, pick
from course.checks import attention_variants as visible
from course.checks.attention_variants import BF16, F16, F32, LAYOUTS, OUT_LAYOUTS
from course.testing import check_rejects, graded_choice
from solutions import attention_variants as key

SEEDS = (61, 62, 63)
DTYPES = (F32, F16) if INTERPRET else (F32, F16, BF16)


def _generator(seed):
    g = torch.Generator().manual_seed(seed)

    def draw(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]

    def length():
        return int(torch.randint(1, 101, (1,), generator=g))
    return draw, length


def _random_shapes(seed, count, blocks=(16, 32, 64)):
    """(n_q, n_k, block_q, block_k, causal) drawn from seed: lengths 1 to 100."""
    draw, length = _generator(seed)
    return [(length(), length(), draw(blocks), draw(blocks), bool(draw((0, 1)))) for _ in range(count)]


def _random_cases(seed, count):
    """(B, H, Hkv, Nq, Nk, D, blocks, causal, dtype, layouts), drawn from seed: lengths of
    1 to 100, every grouping of up to 4 query heads, head dims rarely powers of two."""
    draw, length = _generator(seed)
    cases = []
    for _ in range(count):
        H = draw((1, 2, 3, 4))
        Hkv = draw([d for d in (1, 2, 3, 4) if H % d == 0])
        cases.append((1 if H > 2 else draw((1, 2)), H, Hkv, length(), length(),
                      draw((16, 24, 40, 48, 72)), (draw((16, 32)), draw((16, 32))),
                      bool(draw((0, 1))), draw(DTYPES), tuple(draw(LAYOUTS) for _ in range(3))))
    return cases


def _layouts(i):
    """Three layouts for q, k, v, different from one another, turning with i."""
    return tuple(LAYOUTS[(i + j) % len(LAYOUTS)] for j in range(3))


SHAPES = [  # (n_q, n_k, block_q, block_k, causal)
    (1, 1, 16, 16, True), (1, 1, 16, 16, False), (1, 300, 16, 64, True), (300, 1, 64, 16, True),
    (128, 128, 128, 64, True), (129, 129, 128, 64, True), (250, 250, 64, 128, True),
    (77, 7, 64, 64, False), (77, 7, 32, 16, True), (200, 64, 32, 32, True), (64, 200, 32, 32, True),
    (96, 160, 32, 16, True), (160, 96, 16, 32, True), (100, 100, 16, 16, False),
    (1000, 1000, 128, 64, True), (999, 1013, 64, 32, True), (1013, 999, 64, 32, True),
]


def test_kv_block_range(fn):
    for args in SHAPES + _random_shapes(SEEDS[0], 12):
        visible.case_kv_block_range(fn, *args)


def test_block_counts(fn):
    for args in SHAPES + _random_shapes(SEEDS[1], 12) + [(16384, 16384, 128, 64, True),
                                                         (16384, 4096, 128, 64, True)]:
        visible.case_block_counts(fn, *args)


def test_decode_align(answer):
    graded_choice(answer, "decode_align_answer", key.decode_align_answer,
            "draw the 4 x 100 mask: which keys may the first new token see, and which may the "
            "last one?")


def test_sdpa_causal(answer):
    graded_choice(answer, "sdpa_causal_answer", key.sdpa_causal_answer,
            "PyTorch's is_causal is aligned top-left: query i sees keys j <= i.")


def test_attention_kernel(kernel):
    def case(*args, **kwargs):
        visible.case_kernel_random(kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Hkv, Nq, Nk, D, blocks, causal)
        (1, 1, 1, 1, 1, 16, (16, 16), True), (2, 2, 1, 45, 40, 24, (16, 32), True),
        (1, 3, 3, 77, 77, 40, (32, 32), True), (1, 2, 2, 100, 37, 16, (32, 32), True),
        (1, 4, 2, 29, 29, 48, (16, 16), False), (1, 2, 1, 50, 96, 80, (32, 32), False),
        (1, 3, 1, 1, 61, 32, (16, 32), True), (1, 4, 4, 70, 5, 24, (32, 32), False),
        (1, 4, 2, 33, 9, 16, (16, 16), True),
    ]
    for i, ((B, H, Hkv, Nq, Nk, D, blocks, causal), seed) in enumerate(zip(cases, SEEDS * 3)):
        case(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, causal=causal, blocks=blocks,
             layouts=("contiguous", "padded", "padded") if Nk < blocks[1] else ("contiguous",) * 3)
    for i, seed in enumerate(SEEDS):
        case(2, 2, (1, 2, 2)[i], 33 + 8 * i, 50 - 7 * i, 24 + 8 * i, DTYPES[(i + 1) % 2], seed=seed,
             causal=bool(i % 2), sm_scale=(0.25, None, 0.9)[i], blocks=((16, 32), (32, 16), (32, 16))[i],
             layouts=_layouts(i + 1), out_layout=OUT_LAYOUTS[i])
    for i, (B, H, Hkv, Nq, Nk, D, blocks, causal, dtype, layouts) in enumerate(_random_cases(SEEDS[0], 4)):
        case(B, H, Hkv, Nq, Nk, D, dtype, seed=SEEDS[1] + i, causal=causal, blocks=blocks,
             layouts=layouts, out_layout=OUT_LAYOUTS[i % len(OUT_LAYOUTS)])
    case(1, 2, 1, 41, 41, 64, F32, seed=SEEDS[0], kind="extreme", out_layout="sliced")
    case(2, 2, 2, 45, 33, 40, F16, seed=SEEDS[1], kind="extreme", causal=True,
         layouts=("transposed", "bnhd", "contiguous"))
    case(1, 4, 1, 37, 52, 16, F16, seed=SEEDS[2], kind="extreme", causal=True, blocks=(16, 16))
    case(1, 2, 2, 21, 75, 16, F16, seed=SEEDS[0], kind="big_v", blocks=(32, 16), causal=True)
    case(1, 3, 1, 18, 66, 24, F16, seed=SEEDS[1], kind="big_v_negative", out_layout="bnhd",
         layouts=("sliced", "contiguous", "bnhd"))
    if not INTERPRET:
        case(2, 8, 2, 1000, 1000, 128, BF16, seed=SEEDS[2], causal=True, blocks=(128, 64))
        case(1, 8, 1, 333, 901, 64, F16, seed=SEEDS[0], causal=True, blocks=(64, 64),
             layouts=("bnhd",) * 3, out_layout="bnhd")
        case(2, 4, 2, 901, 333, 64, BF16, seed=SEEDS[1], causal=True, blocks=(128, 64),
             layouts=("bnhd", "padded", "padded"))
        case(1, 4, 4, 77, 9, 256, F16, seed=SEEDS[2], blocks=(64, 32), layouts=("contiguous", "padded", "padded"))


def test_attention(fn, kernel):
    def case(*args, **kwargs):
        visible.case_wrapper_random(fn, kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Hkv, Nq, Nk, D, blocks, causal)
        (1, 1, 1, 1, 1, 16, None, True), (2, 2, 1, 70, 45, 24, None, True),
        (1, 4, 2, 77, 77, 40, (16, 32), True), (2, 2, 2, 37, 100, 16, (32, 16), False),
        (1, 3, 1, 45, 20, 48, None, True), (1, 4, 4, 30, 7, 64, (16, 16), False),
    ]
    for i, ((B, H, Hkv, Nq, Nk, D, blocks, causal), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Hkv, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, causal=causal, blocks=blocks)
    for i, seed in enumerate(SEEDS):
        case(2, 2, (2, 1, 2)[i], 40 - 5 * i, 33 + 8 * i, 24 + 8 * i, DTYPES[i % 2], seed=seed,
             causal=bool(i % 2), sm_scale=(0.3, None, 1.5)[i], blocks=(None, (32, 16), (16, 32))[i],
             layouts=_layouts(i + 2))
    for i, (B, H, Hkv, Nq, Nk, D, blocks, causal, dtype, layouts) in enumerate(_random_cases(SEEDS[2], 3)):
        case(B, H, Hkv, Nq, Nk, D, dtype, seed=SEEDS[0] + i, causal=causal,
             blocks=blocks if i % 2 else None, layouts=layouts)
    case(1, 2, 2, 41, 41, 64, F16, seed=SEEDS[0], kind="extreme", causal=True)
    case(2, 2, 1, 37, 50, 32, F32, seed=SEEDS[1], kind="extreme",
         layouts=("transposed", "sliced", "contiguous"))
    case(1, 2, 1, 19, 70, 16, F16, seed=SEEDS[2], kind="big_v_negative", blocks=(16, 32))
    case(1, 2, 2, 23, 64, 24, F32, seed=SEEDS[0], kind="big_v", causal=True,
         layouts=("contiguous", "bnhd", "sliced"))
    for dtype in pick((), (F16, BF16)):  # real sizes, default GPU blocks
        case(2, 8, 2, 1024 + 7, 2048 - 3, 128, dtype, seed=SEEDS[1], causal=True, layouts=("bnhd",) * 3)
        case(1, 4, 1, 500, 300, 256, dtype, seed=SEEDS[2], causal=True)
    for layout, causal in (("bnhd", True), ("transposed", False), ("sliced", True)):
        visible.case_output_layout(fn, 2, 6, 3, 25, 40, 24, F16, seed=SEEDS[1], layout=layout,
                                   causal=causal)
    x = torch.ones(1, 2, 8, 16, device=visible.DEVICE)
    check_rejects(visible.bad_inputs(fn) + [
        ("a head dim of 8 (below 16)", lambda: fn(x[..., :8], x[..., :8], x[..., :8])),
        ("k and v of different lengths", lambda: fn(x, x, torch.ones(1, 2, 9, 16, device=visible.DEVICE))),
        ("k and v with different head counts", lambda: fn(x, x, x[:, :1])),
        ("a batch of 2 queries with a batch of 1 key", lambda: fn(torch.ones(2, 2, 8, 16, device=visible.DEVICE), x, x)),
        ("float64 inputs", lambda: fn(x.double(), x.double(), x.double())),
        ("block_q=48", lambda: fn(x, x, x, block_q=48)),
    ], name="attention")
