"""Hidden tests of module 03: the visible cases on inputs the learner never saw (several
seeds, sizes that are not multiples of any tile, sizes of several hundred and K of
thousands, every memory layout of every input and of matmul_kernel's output, block shapes
that differ, values past fp16's range and fp16 products that overflow it, mixed shapes per
pointer, both transposition settings, fp32 and fp16, bf16 on a GPU)."""
import itertools

import torch

from course import DEVICE, INTERPRET
from course.checks import tiling as visible
from course.checks.tiling import LAYOUTS, OUT_LAYOUTS
from course.testing import check_rejects, fail

SEEDS = (31, 32, 33)
DTYPES = (torch.float32, torch.float16) if INTERPRET else (torch.float32, torch.float16, torch.bfloat16)
F32, F16 = torch.float32, torch.float16
LAYOUT_PAIRS = list(itertools.product(LAYOUTS, LAYOUTS))  # every layout of a with every one of b


def test_tiled_matmul(fn):
    def case(*args, **kwargs):
        visible.case_tiled_matmul(fn, *args, quiet=True, **kwargs)
    cases = [(1, 1, 1, 1), (3, 4, 5, 1), (50, 33, 70, 16), (64, 64, 64, 64), (13, 29, 7, 5),
             (40, 24, 100, 32)]
    for seed in SEEDS:
        for (M, N, K, tile), dtype in zip(cases, (F32, F16) * 3):
            case(M, N, K, tile, dtype, seed=seed + M)
    for (M, N, K, tile), layouts, dtype, seed in zip(
            [(33, 40, 70, 16), (50, 21, 64, 32), (17, 38, 45, 8), (29, 30, 31, 6)],
            [("transposed", "strided"), ("sliced", "transposed"), ("strided", "sliced"),
             ("contiguous", "transposed")], (F32, F16) * 2, SEEDS + SEEDS[:1]):
        case(M, N, K, tile, dtype, seed=seed, layouts=layouts)
    case(20, 16, 1536, 32, F16, seed=SEEDS[0])  # long fp16 reductions
    case(12, 17, 2048, 64, F16, seed=SEEDS[1], layouts=("transposed", "contiguous"))
    case(40, 33, 300, 16, F16, seed=SEEDS[2], kind="cancelling")
    case(20, 45, 200, 32, F32, seed=SEEDS[0], kind="cancelling", layouts=("sliced", "contiguous"))
    case(35, 28, 90, 16, F32, seed=SEEDS[1], kind="large")


def test_dram_reads(dram_reads, dram_reads_untiled):
    g = torch.Generator().manual_seed(SEEDS[0])
    cases = [(1, 1, 1, 1), (128, 64, 32, 64), (97, 61, 33, 16), (4096, 4096, 64, 128),
             (65536, 65536, 128, 128), (10 ** 6, 3, 7, 4096), (123457, 98765, 4321, 96)]
    cases += [tuple(int(v) for v in torch.randint(1, 300, (3,), generator=g)) +
              (int(torch.randint(1, 70, (1,), generator=g)),) for _ in range(6)]
    for m, n, k, tile in cases:
        visible.case_dram_reads(dram_reads, dram_reads_untiled, m, n, k, tile)
        if dram_reads(m, n, k, 1) != dram_reads_untiled(m, n, k):
            fail(f"dram_reads(m={m}, n={n}, k={k}, tile=1) should equal dram_reads_untiled: "
                 "a 1 x 1 tile reuses nothing")


def test_matmul_kernel(kernel):
    def case(*args, **kwargs):
        visible.case_matmul_kernel_random(kernel, *args, quiet=True, **kwargs)
    for (M, N, K), seed, dtypes in zip([(1, 1, 1), (33, 65, 17), (64, 32, 96)], SEEDS,
                                       (DTYPES, DTYPES[::2], DTYPES[1:])):
        for dtype in dtypes:
            case(M, N, K, dtype, seed=seed)
    # Every layout of A and of B, the output in each of its layouts, blocks of several
    # shapes: a kernel that ignores one stride or mixes up two blocks fails.
    blocks = [(32, 32, 32), (16, 32, 16), (32, 16, 32), (64, 32, 16), (16, 64, 64)]
    for i, layouts in enumerate(LAYOUT_PAIRS):
        case(30 + 4 * i, 50 - 2 * i, 20 + 7 * i, DTYPES[i % 2], seed=SEEDS[i % 3] + i,
             layouts=layouts, out_layout=OUT_LAYOUTS[i % 3], blocks=blocks[i % len(blocks)])
    case(100, 70, 40, F32, seed=SEEDS[0], out_layout="sliced")
    case(16, 16, 2048, F16, seed=SEEDS[1])  # long fp16 reductions
    case(9, 20, 1024, F16, seed=SEEDS[2], layouts=("sliced", "transposed"), out_layout="transposed",
         blocks=(16, 32, 64))
    case(41, 19, 300, F16, seed=SEEDS[0], kind="cancelling", out_layout="sliced", blocks=(16, 16, 64))
    case(25, 33, 170, F32, seed=SEEDS[1], kind="cancelling", blocks=(32, 16, 16))
    case(40, 33, 100, F32, seed=SEEDS[2], kind="large", layouts=("transposed", "sliced"),
         out_layout="transposed")


def test_matmul(matmul, kernel):
    def case(*args, **kwargs):
        visible.case_matmul_random(matmul, kernel, *args, quiet=True, **kwargs)
    for (M, N, K), seed in zip([(1, 1, 1), (65, 33, 17), (100, 7, 64)], SEEDS):
        for dtype in DTYPES:
            case(M, N, K, dtype, seed=seed)
    for i, layouts in enumerate(LAYOUT_PAIRS):
        case(25 + 5 * i, 60 - 3 * i, 33 + 4 * i, DTYPES[i % 2], seed=SEEDS[i % 3] + i, layouts=layouts)
    case(300, 70, 64, F32, seed=SEEDS[0], layouts=("sliced", "contiguous"))  # past any fixed cap
    case(33, 290, 40, F16, seed=SEEDS[1])
    case(24, 40, 2000, F16, seed=SEEDS[2], layouts=("contiguous", "transposed"))  # long fp16 K
    case(70, 45, 200, F16, seed=SEEDS[0], kind="cancelling")
    case(33, 65, 150, F32, seed=SEEDS[1], kind="cancelling", layouts=("transposed", "contiguous"))
    case(65, 40, 80, F32, seed=SEEDS[2], kind="large", layouts=("strided", "transposed"))
    check_rejects(visible._bad_matmul_inputs(matmul) + [
        ("a 3-D b", lambda: matmul(torch.ones(4, 6, device=DEVICE), torch.ones(2, 6, 3, device=DEVICE))),
        ("float64 inputs", lambda: matmul(torch.ones(4, 6, device=DEVICE, dtype=torch.float64),
                                          torch.ones(6, 3, device=DEVICE, dtype=torch.float64)))],
        name="matmul")


def test_batched_gemm_strided(fn, kernel):
    def case(*args, **kwargs):
        visible.case_strided_random(fn, kernel, *args, quiet=True, **kwargs)
    cases = [  # (B, H, M, N, K, b_transposed, layout)
        (1, 1, 1, 1, 1, True, "bhmk"), (1, 2, 50, 70, 16, True, "bmhk"),
        (3, 2, 40, 33, 24, False, "bhmk"), (2, 2, 64, 64, 32, True, "bhmk"),
    ]
    for (B, H, M, N, K, b_transposed, layout), seed, dtype in zip(cases, SEEDS * 2, DTYPES * 2):
        case(B, H, M, N, K, dtype, b_transposed, seed=seed, layout=layout)
    for i, layout in enumerate(("bmhk", "transposed", "sliced", "strided", "shared")):
        for b_transposed in (True, False):
            case(1 + i % 2, 3 - i % 2, 21 + 7 * i, 45 - 4 * i, 18 + 5 * i,
                 DTYPES[(i + b_transposed) % 2], b_transposed, seed=SEEDS[i % 3] + i, layout=layout)
    case(1, 2, 160, 40, 32, F32, True, seed=SEEDS[0])  # past any fixed cap
    case(1, 2, 17, 16, 1280, F16, False, seed=SEEDS[1], layout="sliced")  # long fp16 K
    case(2, 2, 33, 40, 200, F16, True, seed=SEEDS[0], layout="bmhk", kind="cancelling")
    case(1, 3, 45, 20, 170, F32, False, seed=SEEDS[1], layout="shared", kind="cancelling")
    case(2, 2, 30, 17, 50, F32, True, seed=SEEDS[2], layout="transposed", kind="large")
    a = torch.ones(2, 3, 8, 16, device=DEVICE)
    check_rejects([
        ("a 3-D a", lambda: fn(a[0], a, True)),
        ("b with another batch size", lambda: fn(a, torch.ones(1, 3, 8, 16, device=DEVICE), True)),
        ("b whose K differs from a's (b_transposed=True)", lambda: fn(a, torch.ones(2, 3, 8, 12, device=DEVICE), True)),
        ("b whose K differs from a's (b_transposed=False)", lambda: fn(a, torch.ones(2, 3, 8, 16, device=DEVICE), False)),
        ("a float32 a with a float16 b", lambda: fn(a, a.half(), True)),
        ("int32 inputs", lambda: fn(a.int(), a.int(), True)),
    ], name="batched_gemm_strided")


def test_batched_gemm_ptrs(fn, kernel):
    def case(*args, **kwargs):
        visible.case_ptrs_random(fn, kernel, *args, quiet=True, **kwargs)
    mixed = [(37, 45, 20), (5, 9, 16), (70, 20, 33), (1, 1, 1), (64, 64, 64)]
    for seed, dtype, b_transposed in zip(SEEDS, DTYPES[1:] + DTYPES[:1], (False, True, False)):
        case(mixed[seed % 3:] + mixed[:seed % 3], dtype, b_transposed, seed=seed)
    # Views in the lists: the wrapper must hand the kernel contiguous matrices.
    case([(20, 30, 40), (33, 10, 17), (8, 45, 29), (50, 21, 12), (3, 7, 5)], F16, False,
         seed=SEEDS[1], layouts=LAYOUTS[1:] + LAYOUTS[:1])
    visible.case_ptrs_one_tensor(fn, kernel, 3, 23, 30, 36, F16, False, seed=SEEDS[0], layout="bmhk",
                                 quiet=True)
    case([(16, 20, 1280), (5, 24, 1024)], F16, True, seed=SEEDS[1])  # long fp16 K
    case([(33, 20, 200), (5, 40, 170)], F16, False, seed=SEEDS[2], kind="cancelling",
         layouts=("contiguous", "sliced"))
    case([(25, 20, 40), (40, 13, 64)], F32, False, seed=SEEDS[1], kind="large",
         layouts=("transposed", "contiguous"))
    x = torch.ones(8, 16, device=DEVICE)
    check_rejects([
        ("lists of different lengths", lambda: fn([x, x], [x], True)),
        ("empty lists", lambda: fn([], [], True)),
        ("a pair whose K differs", lambda: fn([x, x], [x, torch.ones(8, 12, device=DEVICE)], True)),
        ("a 3-D matrix", lambda: fn([x[None]], [x], True)),
        ("mixed dtypes", lambda: fn([x, x.half()], [x, x.half()], True)),
    ], name="batched_gemm_ptrs")


def test_compare_dispatch(fn, tile):
    cases = [(1, 1, 1, 1, 1), (4, 8, 256, 256, 64), (3, 5, 97, 61, 33)]
    if INTERPRET:  # only counted there; on a GPU every strategy also runs (and allocates)
        cases += [(64, 32, 8192, 8192, 128), (7, 3, 1, 40961, 96)]
    for (B, H, M, N, K), dtype in zip(cases, (F32, F16, F16, F16, F32)):
        visible.case_compare_dispatch(fn, B, H, M, N, K, dtype, tile)
    if not INTERPRET:
        rows = {r["strategy"]: r for r in fn(8, 16, 128, 128, 64, torch.float16)}
        if rows["loop"]["us"] < rows["strided"]["us"]:
            fail("compare_dispatch: the loop of 128 launches timed faster than one strided "
                 "launch; is each strategy timed on its own inputs?")
