"""Hidden tests of module 03: the visible cases on inputs the learner never saw
(several seeds, sizes that are not multiples of any tile, non-contiguous views, mixed
shapes per pointer, both transposition settings, fp32 and fp16, bf16 on a GPU)."""
import torch

from course import DEVICE, INTERPRET
from course.checks import tiling as visible
from course.testing import check_rejects, dtype_name, fail, randn
from grader.rules import JitKernel, Launches

# Checked on the submitted code (grader/rules.py): the worker's launch count and
# forbidden-function checks are only as honest as the notebook lets them be.
RULES = {
    "test_matmul_kernel": [JitKernel("matmul_kernel")],
    "test_matmul": [Launches("matmul", "matmul_kernel", forbid="matmul")],
    "test_batched_gemm_strided": [Launches("batched_gemm_strided", "batched_gemm_strided_kernel",
                                           forbid="matmul")],
    "test_batched_gemm_ptrs": [Launches("batched_gemm_ptrs", "batched_gemm_ptrs_kernel", forbid="matmul")],
}

SEEDS = (31, 32, 33)
DTYPES = (torch.float32, torch.float16) if INTERPRET else (torch.float32, torch.float16, torch.bfloat16)


def test_tiled_matmul(fn):
    cases = [(1, 1, 1, 1), (3, 4, 5, 1), (50, 33, 70, 16), (64, 64, 64, 64), (13, 29, 7, 5),
             (40, 24, 100, 32)]
    for seed in SEEDS:
        for (M, N, K, tile), dtype in zip(cases, (torch.float32, torch.float16) * 3):
            visible.case_tiled_matmul(fn, M, N, K, tile, dtype, seed=seed + M, quiet=True)


def test_dram_reads(dram_reads, dram_reads_untiled):
    g = torch.Generator().manual_seed(SEEDS[0])
    cases = [(1, 1, 1, 1), (128, 64, 32, 64), (97, 61, 33, 16), (4096, 4096, 64, 128)]
    cases += [tuple(int(v) for v in torch.randint(1, 300, (3,), generator=g)) +
              (int(torch.randint(1, 70, (1,), generator=g)),) for _ in range(6)]
    for m, n, k, tile in cases:
        visible.case_dram_reads(dram_reads, dram_reads_untiled, m, n, k, tile)
        if dram_reads(m, n, k, 1) != dram_reads_untiled(m, n, k):
            fail(f"dram_reads(m={m}, n={n}, k={k}, tile=1) should equal dram_reads_untiled: "
                 "a 1 x 1 tile reuses nothing")


def test_matmul_kernel(kernel):
    shapes = [(1, 1, 1), (16, 16, 16), (33, 65, 17), (64, 32, 96), (7, 40, 45)]
    for (M, N, K), seed in zip(shapes, SEEDS * 2):
        for dtype in DTYPES:
            visible.case_matmul_kernel_random(kernel, M, N, K, dtype, seed=seed, quiet=True,
                                              b_col_major=seed % 2 == 0)
    # A transposed (column-major) a: only its strides say so.
    a = visible._guarded((45, 30), torch.float32, SEEDS[1]).t()
    b = visible._guarded((45, 38), torch.float32, SEEDS[2])
    visible.case_matmul_kernel(kernel, a, b, name="matmul_kernel with a column-major a", quiet=True)
    for seed in SEEDS[:2]:
        visible.case_fp16_accumulation(kernel, 9, 40, seed=seed, quiet=True)


def test_matmul(matmul, kernel):
    for (M, K, N), seed in zip([(1, 1, 1), (65, 17, 33), (100, 64, 7)], SEEDS):
        for dtype in DTYPES:
            a = randn(M, K, dtype=dtype, device=DEVICE, seed=seed)
            b = randn(K, N, dtype=dtype, device=DEVICE, seed=seed + 1)
            visible.case_matmul(matmul, kernel, a, b, quiet=True,
                                name=f"matmul on {dtype_name(dtype)} [{M}, {K}] @ [{K}, {N}]")
    a = randn(30, 50, device=DEVICE, seed=SEEDS[0])[:, ::2]  # every other column: strided rows
    b = randn(37, 25, device=DEVICE, seed=SEEDS[1]).t()
    visible.case_matmul(matmul, kernel, a, b, quiet=True, name="matmul on strided views")
    check_rejects(visible._bad_matmul_inputs(matmul) + [
        ("a 3-D b", lambda: matmul(torch.ones(4, 6, device=DEVICE), torch.ones(2, 6, 3, device=DEVICE))),
        ("float64 inputs", lambda: matmul(torch.ones(4, 6, device=DEVICE, dtype=torch.float64),
                                          torch.ones(6, 3, device=DEVICE, dtype=torch.float64)))],
        name="matmul")


def test_batched_gemm_strided(fn, kernel):
    cases = [  # (B, H, M, N, K, b_transposed, layout)
        (1, 1, 1, 1, 1, True, "bhmk"), (1, 2, 50, 70, 16, True, "bmhk"),
        (2, 3, 33, 17, 40, False, "bmhk"), (3, 2, 40, 33, 24, False, "bhmk"),
        (2, 2, 64, 64, 32, True, "bhmk"), (2, 1, 20, 45, 70, False, "bhmk"),
    ]
    for (B, H, M, N, K, b_transposed, layout), seed, dtype in zip(cases, SEEDS * 2, DTYPES * 3):
        visible.case_strided_random(fn, kernel, B, H, M, N, K, dtype, b_transposed, seed=seed,
                                    layout=layout, quiet=True)
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
    mixed = [(37, 45, 20), (5, 9, 16), (70, 20, 33), (1, 1, 1), (64, 64, 64)]
    for seed, dtype in zip(SEEDS, DTYPES * 2):
        for b_transposed in (True, False):
            shapes = mixed[seed % 3:] + mixed[:seed % 3]
            visible.case_ptrs_random(fn, kernel, shapes, dtype, b_transposed, seed=seed, quiet=True)
    visible.case_ptrs_random(fn, kernel, [(40, 33, 32)] * 4, torch.float32, False, seed=SEEDS[0], quiet=True)
    # A transposed view in the list: the wrapper must not read it as row-major.
    a_list, b_list = visible.ptrs_inputs([(20, 30, 40), (33, 10, 17)], torch.float32, True, seed=SEEDS[1])
    a_list[0] = visible._guarded((40, 20), torch.float32, SEEDS[2]).t()
    visible.case_ptrs(fn, kernel, a_list, b_list, True, quiet=True,
                      name="batched_gemm_ptrs with a transposed view in a_list")
    x = torch.ones(8, 16, device=DEVICE)
    check_rejects([
        ("lists of different lengths", lambda: fn([x, x], [x], True)),
        ("empty lists", lambda: fn([], [], True)),
        ("a pair whose K differs", lambda: fn([x, x], [x, torch.ones(8, 12, device=DEVICE)], True)),
        ("a 3-D matrix", lambda: fn([x[None]], [x], True)),
        ("mixed dtypes", lambda: fn([x, x.half()], [x, x.half()], True)),
    ], name="batched_gemm_ptrs")


def test_compare_dispatch(fn, tile):
    for (B, H, M, N, K), dtype in zip([(1, 1, 1, 1, 1), (4, 8, 256, 256, 64), (3, 5, 97, 61, 33)],
                                      (torch.float32, torch.float16, torch.float16)):
        visible.case_compare_dispatch(fn, B, H, M, N, K, dtype, tile)
    if not INTERPRET:
        rows = {r["strategy"]: r for r in fn(8, 16, 128, 128, 64, torch.float16)}
        if rows["loop"]["us"] < rows["strided"]["us"]:
            fail("compare_dispatch: the loop of 128 launches timed faster than one strided "
                 "launch; is each strategy timed on its own inputs?")
