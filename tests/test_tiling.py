"""Module 03 reference (solutions/tiling.py) against PyTorch, and its checks.

On a CPU the kernels run through Triton's interpreter at small sizes; on a GPU the same
tests run compiled (fp32 then uses TF32 tolerances, course.testing picks them).
"""
import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch
import triton.language as tl

from course import DEVICE, INTERPRET
from course.checks import tiling as checks
from course.testing import CheckFailed, assert_close, count_launches, randn
from grader import answer_key, paths
from solutions import tiling

DTYPES = (torch.float32, torch.float16)


def _reference(a, b):
    return a.double() @ b.double()


@pytest.mark.parametrize("M, N, K, tile", [(1, 1, 1, 1), (37, 45, 50, 16), (20, 20, 20, 32), (64, 8, 96, 64)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tiled_matmul(M, N, K, tile, dtype):
    a, b = randn(M, K, dtype=dtype, seed=M), randn(K, N, dtype=dtype, seed=N)
    out = tiling.tiled_matmul(a, b, tile)
    assert out.dtype == dtype
    assert_close(out, _reference(a, b), quiet=True)


def test_dram_reads_model():
    assert tiling.dram_reads(100, 70, 64, 32) == 100 * 64 * 3 + 64 * 70 * 4
    for m, n, k in [(1, 1, 1), (97, 61, 33), (1024, 1024, 64)]:
        assert tiling.dram_reads(m, n, k, 1) == tiling.dram_reads_untiled(m, n, k) == 2 * m * n * k
        assert tiling.dram_reads(m, n, k, max(m, n)) == m * k + k * n  # everything read once


@pytest.mark.parametrize("M, K, N", [(1, 1, 1), (37, 50, 45), (64, 64, 64), (70, 17, 33)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul(M, K, N, dtype):
    a = randn(K, M, dtype=dtype, device=DEVICE, seed=K).t()  # a transposed view
    b = randn(K, N, dtype=dtype, device=DEVICE, seed=N)
    with count_launches(tiling.matmul_kernel) as launches:
        out = tiling.matmul(a, b)
    assert launches[0] == 1 and out.dtype == dtype
    assert_close(out, _reference(a, b), quiet=True)


@pytest.mark.parametrize("B, H, M, N, K, layout", [(1, 1, 1, 1, 1, "bhmk"), (2, 3, 37, 45, 20, "bhmk"),
                                                  (2, 2, 64, 33, 70, "bmhk"), (1, 2, 20, 30, 40, "transposed"),
                                                  (2, 1, 33, 17, 24, "sliced"), (1, 2, 9, 40, 35, "strided"),
                                                  (2, 3, 20, 20, 16, "shared")])
@pytest.mark.parametrize("b_transposed", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_gemm_strided(B, H, M, N, K, layout, b_transposed, dtype):
    a, b = checks.strided_inputs(B, H, M, N, K, dtype, b_transposed, seed=M, layout=layout)
    with count_launches(tiling.batched_gemm_strided_kernel) as launches:
        out = tiling.batched_gemm_strided(a, b, b_transposed)
    assert launches[0] == 1 and out.dtype == dtype and out.is_contiguous()
    assert_close(out, _reference(a, b.transpose(-1, -2) if b_transposed else b), quiet=True)


@pytest.mark.parametrize("b_transposed", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_gemm_ptrs(b_transposed, dtype):
    shapes = [(37, 45, 20), (1, 1, 1), (70, 20, 33), (5, 64, 16)]
    a_list, b_list = checks.ptrs_inputs(shapes, dtype, b_transposed, seed=7, layouts=checks.LAYOUTS)
    with count_launches(tiling.batched_gemm_ptrs_kernel) as launches:
        out = tiling.batched_gemm_ptrs(a_list, b_list, b_transposed)
    assert launches[0] == 1 and len(out) == len(shapes)
    for o, x, y in zip(out, a_list, b_list):
        assert o.dtype == dtype
        assert_close(o, _reference(x, y.t() if b_transposed else y), quiet=True)


@pytest.mark.parametrize("layout, strides", [("contiguous", (7, 1)), ("transposed", (1, 5)),
                                             ("sliced", (12, 1)), ("strided", (16, 2))])
def test_in_layout_keeps_the_values_in_the_layout_it_names(layout, strides):
    x = randn(5, 7, seed=1)
    view = checks.in_layout(x, layout, seed=2)
    assert torch.equal(view, x) and view.stride() == strides


def test_cancelling_values_overflow_fp16_but_cancel_exactly():
    span = checks.SPAN
    a, b = checks.matmul_values(6, 5, 2 * span + 30, seed=3, kind="cancelling")
    for t in (a[:, :2 * span], b[:2 * span]):  # whole numbers (exact in fp16), far from zero
        assert torch.equal(t, t.round()) and t.abs().min() >= 200 and t.abs().max() <= 300
    assert (a[:, :span] @ b[:span]).abs().max() > torch.finfo(torch.float16).max
    big = a[:, :2 * span].double() @ b[:2 * span].double()
    assert torch.equal(big, torch.zeros_like(big))


def _fake_kernel(store):
    """Something launched like a kernel that computes C in PyTorch and stores it with
    store(c, value): for proving what the checks catch without writing a buggy kernel."""
    class Kernel:
        def __getitem__(self, grid):
            def launch(a, b, c, M, N, K, *strides, **blocks):
                store(c, (a.double() @ b.double()).to(c.dtype))
            return launch
    return Kernel()


@pytest.mark.parametrize("out_layout", ["sliced", "transposed"])
def test_matmul_kernel_check_catches_a_store_that_ignores_c_strides(out_layout):
    def as_if_contiguous(c, value):
        torch.as_strided(c, c.shape, (c.shape[1], 1)).copy_(value)
    checks.case_matmul_kernel_random(_fake_kernel(lambda c, v: c.copy_(v)), 20, 30, 40,
                                     torch.float32, seed=0, out_layout=out_layout, quiet=True)
    with pytest.raises(CheckFailed, match="stride_cm"):
        checks.case_matmul_kernel_random(_fake_kernel(as_if_contiguous), 20, 30, 40,
                                         torch.float32, seed=0, out_layout=out_layout, quiet=True)


def test_matmul_kernel_check_catches_an_fp16_accumulator():
    class Fp16Accumulator:  # launched like a kernel; sums K blocks in fp16
        def __getitem__(self, grid):
            def launch(a, b, c, M, N, K, *strides, BLOCK_M, BLOCK_N, BLOCK_K):
                acc = torch.zeros(M, N, dtype=torch.float16)
                for k0 in range(0, K, BLOCK_K):
                    acc += (a[:, k0:k0 + BLOCK_K].float() @ b[k0:k0 + BLOCK_K].float()).half()
                c.copy_(acc)
            return launch
    with pytest.raises(CheckFailed, match="fp32"):
        checks.case_matmul_kernel_random(Fp16Accumulator(), 20, 24, 160, torch.float16, seed=3,
                                         kind="cancelling", quiet=True)
    with pytest.raises(CheckFailed, match="fp32"):
        checks.case_matmul_kernel_random(Fp16Accumulator(), 20, 24, 1024, torch.float16, seed=4,
                                         quiet=True)


def _ones(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("call, error, words", [
    (lambda: tiling.matmul(_ones(3), _ones(3, 2)), ValueError, "2 dims"),
    (lambda: tiling.matmul(_ones(3, 4), _ones(3, 4)), ValueError, "inner dims"),
    (lambda: tiling.matmul(_ones(3, 4).int(), _ones(4, 2).int()), TypeError, "dtype"),
    (lambda: tiling.matmul(_ones(3, 4), _ones(4, 2).half()), TypeError, "one dtype"),
    (lambda: tiling.matmul(_ones(0, 4), _ones(4, 2)), ValueError, "empty"),
    (lambda: tiling.batched_gemm_strided(_ones(2, 3, 4, 5), _ones(2, 3, 6, 4), True), ValueError, "b must be"),
    (lambda: tiling.batched_gemm_strided(_ones(2, 3, 4, 5), _ones(3, 2, 5, 4), False), ValueError, "b must be"),
    (lambda: tiling.batched_gemm_strided(_ones(2, 3, 4, 5), _ones(2, 3, 5, 4), 1), TypeError, "True or False"),
    (lambda: tiling.batched_gemm_ptrs([_ones(4, 5)], [], True), ValueError, "as many"),
    (lambda: tiling.batched_gemm_ptrs([_ones(4, 5)], [_ones(5, 4)], True), ValueError, "pair 0"),
    (lambda: tiling.batched_gemm_ptrs(_ones(4, 5), _ones(4, 5), True), TypeError, "lists"),
])
def test_bad_inputs_raise_clear_errors(call, error, words):
    with pytest.raises(error, match=words):
        call()


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's bf16 rule")
def test_bf16_refused_in_the_interpreter():
    with pytest.raises(TypeError, match="interpreter"):
        tiling.matmul(_ones(4, 4, dtype=torch.bfloat16), _ones(4, 4, dtype=torch.bfloat16))


def test_compare_dispatch():
    rows = {r["strategy"]: r for r in tiling.compare_dispatch(2, 4, 100, 100, 64, torch.float16)}
    assert [rows[s]["launches"] for s in ("loop", "strided", "ptrs", "stack")] == [8, 1, 1, 3]
    assert rows["strided"]["bytes"] < rows["ptrs"]["bytes"] < rows["stack"]["bytes"]
    assert all((r["us"] is None) == INTERPRET for r in rows.values())


CHECKED = {  # exercise -> the reference functions its check and hidden test take
    "tiled_matmul": (tiling.tiled_matmul,),
    "dram_reads": (tiling.dram_reads, tiling.dram_reads_untiled),
    "matmul_kernel": (tiling.matmul_kernel,),
    "matmul": (tiling.matmul, tiling.matmul_kernel),
    "batched_gemm_strided": (tiling.batched_gemm_strided, tiling.batched_gemm_strided_kernel),
    "batched_gemm_ptrs": (tiling.batched_gemm_ptrs, tiling.batched_gemm_ptrs_kernel),
    "compare_dispatch": (tiling.compare_dispatch, tiling.TILE),
}


@pytest.mark.parametrize("exercise", CHECKED)
def test_reference_passes_visible_checks_and_hidden_tests(exercise):
    getattr(checks, f"check_{exercise}")(*CHECKED[exercise])
    getattr(answer_key.hidden("03_tiling"), f"test_{exercise}")(*CHECKED[exercise])


@pytest.mark.skipif(not INTERPRET, reason="on a GPU the kernels compile when they run")
def test_kernels_compile_for_gpu():
    checks.compile_kernels_for_gpu(tiling.matmul_kernel, tiling.batched_gemm_strided_kernel,
                                   tiling.batched_gemm_ptrs_kernel)
