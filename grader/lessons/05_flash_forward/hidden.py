"""Hidden tests of module 05: the visible cases on inputs the learner never saw (several
seeds; lengths and head dims that are not powers of two nor multiples of the blocks, with
Nq != Nk; causal and not; several batch entries and heads; every layout of q, k, v and of
the kernel's O; blocks that differ; rows of scores far above and far below zero; V far
from zero on either side; fp32 and fp16, bf16 and longer sequences on a GPU), and the
answers to the grid questions."""
import torch

from course import INTERPRET, pick
from course.checks import flash_forward as visible
from course.checks.flash_forward import BF16, F16, F32, LAYOUTS, OUT_LAYOUTS
from course.testing import check_rejects, fail, graded_choice
from solutions import flash_forward as key

SEEDS = (51, 52, 53)
DTYPES = (F32, F16) if INTERPRET else (F32, F16, BF16)


def _random_cases(seed, count):
    """(B, H, Nq, Nk, D, block_q, block_k, causal, dtype, layouts), drawn from seed: lengths
    of 1 to 100, head dims that are rarely powers of two, blocks of 16 or 32."""
    g = torch.Generator().manual_seed(seed)

    def pick_from(options):
        return options[int(torch.randint(len(options), (1,), generator=g))]
    cases = []
    for _ in range(count):
        causal = bool(torch.randint(2, (1,), generator=g))
        Nq = int(torch.randint(1, 101, (1,), generator=g))
        Nk = Nq if causal else int(torch.randint(1, 101, (1,), generator=g))
        layouts = tuple(pick_from(LAYOUTS) for _ in range(3))
        cases.append((pick_from((1, 2)), pick_from((1, 2, 3)), Nq, Nk, pick_from((16, 24, 40, 48, 72)),
                      pick_from((16, 32)), pick_from((16, 32)), causal, pick_from(DTYPES), layouts))
    return cases


def _layouts(i):
    """Three layouts for q, k, v, different from one another, turning with i."""
    return tuple(LAYOUTS[(i + j) % len(LAYOUTS)] for j in range(3))


def test_flash_grid(flash_grid):
    g = torch.Generator().manual_seed(SEEDS[0])
    cases = [(8, 1, 1, 2), (1, 1, 1, 128), (128, 1, 1, 128), (129, 1, 1, 128), (97, 5, 7, 16),
             (16384, 2, 16, 64), (2_097_152, 1, 8, 16), (1000, 4096, 16, 64)]
    cases += [tuple(int(x) for x in torch.randint(1, 3000, (1,), generator=g)) +
              tuple(int(x) for x in torch.randint(1, 40, (2,), generator=g)) +
              (16 * int(torch.randint(1, 9, (1,), generator=g)),) for _ in range(6)]
    for args in cases:
        visible.case_flash_grid(flash_grid, *args)


def test_grid_axis(answer):
    graded_choice(answer, "grid_axis_answer", key.grid_axis_answer,
            "think about what one program loops over, and what the programs divide among "
            "themselves.")


def test_programs(answer):
    visible.check_number(answer, name="programs_answer")
    if answer != key.programs_answer:
        fail(f"programs_answer = {answer} is not right: count the blocks of 2 queries among 8 "
             "(one program each, batch = heads = 1).")


def test_batch_heads(answer):
    graded_choice(answer, "batch_heads_answer", key.batch_heads_answer,
            "do two (batch, head) pairs ever need each other's data, and which axis can hold "
            "the most programs?")


def test_grid_limit(answer):
    graded_choice(answer, "grid_limit_answer", key.grid_limit_answer,
            "find, for each layout, which axis holds the 131,072 query blocks, and compare "
            "with that axis's limit.")


def test_flash_attention_blocked(fn):
    def case(*args, **kwargs):
        visible.case_blocked_random(fn, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Nq, Nk, D, block_q, block_k, causal)
        (1, 1, 1, 1, 16, 16, 16, False), (2, 3, 45, 70, 24, 16, 32, False),
        (2, 2, 77, 77, 40, 32, 16, True), (1, 2, 100, 37, 16, 64, 16, False),
        (3, 1, 29, 29, 48, 8, 8, True), (1, 2, 64, 96, 32, 16, 64, False),
    ]
    for i, ((B, H, Nq, Nk, D, bq, bk, causal), seed) in enumerate(zip(cases, SEEDS * 2)):
        for dtype in DTYPES[i % 2:] if i < 2 else (DTYPES[i % 2],):
            case(B, H, Nq, Nk, D, dtype, bq, bk, seed=seed + i, causal=causal)
    for i, seed in enumerate(SEEDS):
        case(2, 2, 40 + 9 * i, 57 - 5 * i, 24 + 8 * i, DTYPES[i % 2], 16, 32 - 16 * (i % 2),
             seed=seed, causal=bool(i % 2), sm_scale=(None, 0.2, 1.1)[i], layouts=_layouts(i))
    case(1, 3, 41, 41, 40, F32, 16, 16, seed=SEEDS[0], kind="extreme")
    case(2, 1, 50, 39, 64, F16, 32, 16, seed=SEEDS[1], kind="extreme", causal=False,
         layouts=("bnhd", "contiguous", "transposed"))
    case(1, 2, 30, 30, 16, F16, 16, 16, seed=SEEDS[2], kind="extreme", causal=True)
    for i, (B, H, Nq, Nk, D, bq, bk, causal, dtype, layouts) in enumerate(_random_cases(SEEDS[1], 3)):
        case(B, H, Nq, Nk, D, dtype, bq, bk, seed=SEEDS[2] + i, causal=causal, layouts=layouts)
    case(1, 2, 21, 75, 16, F16, 16, 32, seed=SEEDS[0], kind="big_v")
    case(1, 1, 33, 70, 24, F32, 32, 16, seed=SEEDS[1], kind="big_v_negative",
         layouts=("contiguous", "sliced", "bnhd"))
    if not INTERPRET:
        case(2, 4, 1000, 777, 128, BF16, 128, 64, seed=SEEDS[2], causal=False)
        case(2, 4, 600, 600, 96, F16, 64, 128, seed=SEEDS[0], causal=True, layouts=("bnhd",) * 3)


def test_flash_attention_kernel(kernel):
    def case(*args, **kwargs):
        visible.case_kernel_random(kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Nq, Nk, D, blocks, causal)
        (1, 1, 1, 1, 16, (16, 16), False), (2, 2, 45, 70, 24, (16, 32), False),
        (1, 3, 77, 77, 40, (32, 16), True), (2, 1, 100, 37, 16, (32, 32), False),
        (2, 2, 29, 29, 48, (16, 16), True), (1, 2, 50, 96, 80, (32, 16), False),
    ]
    for i, ((B, H, Nq, Nk, D, blocks, causal), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, causal=causal, blocks=blocks)
    for i, seed in enumerate(SEEDS):
        case(2, 2, 33 + 8 * i, 50 - 7 * i, 24 + 8 * i, DTYPES[(i + 1) % 2], seed=seed,
             causal=bool(i % 2), sm_scale=(0.25, None, 0.9)[i], blocks=((16, 32), (32, 16), (16, 16))[i],
             layouts=_layouts(i + 1), out_layout=OUT_LAYOUTS[i])
    for i, (B, H, Nq, Nk, D, bq, bk, causal, dtype, layouts) in enumerate(_random_cases(SEEDS[0], 4)):
        case(B, H, Nq, Nk, D, dtype, seed=SEEDS[1] + i, causal=causal, blocks=(bq, bk),
             layouts=layouts, out_layout=OUT_LAYOUTS[i % len(OUT_LAYOUTS)])
    case(1, 2, 41, 41, 64, F32, seed=SEEDS[0], kind="extreme", out_layout="sliced")
    case(2, 1, 45, 33, 40, F16, seed=SEEDS[1], kind="extreme", layouts=("transposed", "bnhd", "contiguous"))
    case(1, 2, 37, 37, 16, F16, seed=SEEDS[2], kind="extreme", causal=True, blocks=(16, 16))
    case(1, 1, 21, 75, 16, F16, seed=SEEDS[0], kind="big_v", blocks=(32, 16))
    case(1, 1, 18, 66, 24, F16, seed=SEEDS[1], kind="big_v_negative", out_layout="bnhd",
         layouts=("sliced", "contiguous", "bnhd"))
    if not INTERPRET:
        case(2, 4, 1000, 1000, 128, BF16, seed=SEEDS[2], causal=True, blocks=(128, 64))
        case(1, 4, 333, 901, 64, F16, seed=SEEDS[0], blocks=(64, 64), layouts=("bnhd",) * 3)
        case(2, 2, 300, 300, 256, F32, seed=SEEDS[1], causal=True, blocks=(64, 32))


def test_flash_attention(fn, kernel):
    def case(*args, **kwargs):
        visible.case_wrapper_random(fn, kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, Nq, Nk, D, blocks, causal)
        (1, 1, 1, 1, 16, None, False), (2, 2, 70, 45, 24, None, False),
        (1, 2, 77, 77, 40, (16, 32), True), (2, 1, 37, 100, 16, (32, 16), False),
        (1, 3, 45, 45, 48, None, True), (2, 2, 30, 61, 64, (16, 16), False),
    ]
    for i, ((B, H, Nq, Nk, D, blocks, causal), seed) in enumerate(zip(cases, SEEDS * 2)):
        case(B, H, Nq, Nk, D, DTYPES[i % 2], seed=seed + i, causal=causal, blocks=blocks)
    for i, seed in enumerate(SEEDS):
        case(2, 2, 40 - 5 * i, 33 + 8 * i, 24 + 8 * i, DTYPES[i % 2], seed=seed,
             causal=bool(i % 2), sm_scale=(0.3, None, 1.5)[i], blocks=(None, (32, 16), (16, 32))[i],
             layouts=_layouts(i + 2))
    for i, (B, H, Nq, Nk, D, bq, bk, causal, dtype, layouts) in enumerate(_random_cases(SEEDS[2], 3)):
        case(B, H, Nq, Nk, D, dtype, seed=SEEDS[0] + i, causal=causal,
             blocks=(bq, bk) if i % 2 else None, layouts=layouts)
    case(1, 2, 41, 41, 64, F16, seed=SEEDS[0], kind="extreme")
    case(2, 1, 37, 50, 32, F32, seed=SEEDS[1], kind="extreme", causal=False,
         layouts=("transposed", "sliced", "contiguous"))
    case(1, 1, 19, 70, 16, F16, seed=SEEDS[2], kind="big_v_negative", blocks=(16, 32))
    case(1, 1, 23, 64, 24, F32, seed=SEEDS[0], kind="big_v", layouts=("contiguous", "bnhd", "sliced"))
    for dtype in pick((), (F16, BF16)):  # real sizes, default GPU blocks
        case(2, 4, 1024 + 7, 2048 - 3, 128, dtype, seed=SEEDS[1], causal=dtype == F16,
             layouts=("bnhd",) * 3)
        case(1, 2, 500, 500, 256, dtype, seed=SEEDS[2], causal=True)
    x = torch.ones(1, 2, 8, 16, device=visible.DEVICE)
    check_rejects(visible.bad_inputs(fn) + [
        ("a head dim of 8 (below 16)", lambda: fn(x[..., :8], x[..., :8], x[..., :8])),
        ("k and v of different lengths", lambda: fn(x, x, torch.ones(1, 2, 9, 16, device=visible.DEVICE))),
        ("float64 inputs", lambda: fn(x.double(), x.double(), x.double())),
    ], name="flash_attention")
