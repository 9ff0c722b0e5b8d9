"""The helper library: messages that explain, guards that catch out-of-bounds access,
proof that a Triton kernel ran, and compile-for-GPU on a CPU."""
import pytest
import torch
import triton
import triton.language as tl

from course import DEVICE, testing
from course.testing import CheckFailed


def test_assert_close_names_the_rows_and_the_error():
    expected = torch.randn(4, 6, dtype=torch.float64)
    actual = expected.float().clone()
    actual[2, 3] += 0.5
    with pytest.raises(CheckFailed, match=r"1 of 24 entries(.|\n)*row=2, col=3(.|\n)*rows that differ: 1 of 4"):
        testing.assert_close(actual, expected, dim_names=("row", "col"))


def test_assert_close_reports_nan_shape_and_missing_return():
    expected = torch.randn(3, 3, dtype=torch.float64)
    with pytest.raises(CheckFailed, match="NaN at 1 of 9"):
        bad = expected.float().clone()
        bad[1, 1] = float("nan")
        testing.assert_close(bad, expected)
    with pytest.raises(CheckFailed, match=r"shape \(3,\), expected \(3, 3\)"):
        testing.assert_close(torch.zeros(3), expected)
    with pytest.raises(CheckFailed, match="forget a `return`"):
        testing.assert_close(None, expected)


def test_assert_close_names_a_classic_mistake():
    x = torch.randn(3, 5, dtype=torch.float64)
    wrong = torch.softmax(x, dim=0)
    with pytest.raises(CheckFailed, match="classic mistake: softmax over dim 0"):
        testing.assert_close(wrong.float(), torch.softmax(x, -1), mistakes={"softmax over dim 0": wrong})


def test_tolerances_per_dtype_catch_fp16_sized_errors_in_fp32():
    expected = torch.randn(100, dtype=torch.float64)
    testing.assert_close(expected.half(), expected, quiet=True)  # fp16 rounding passes in fp16
    with pytest.raises(CheckFailed):
        testing.assert_close(expected.half().float(), expected, quiet=True)  # not in fp32


def test_constant_output_is_rejected():
    with pytest.raises(CheckFailed, match="constant"):
        testing.assert_not_trivial(torch.zeros(4, 4))
    testing.assert_not_trivial(torch.randn(4, 4))


@triton.jit
def _copy_kernel(out_ptr, in_ptr, n, BLOCK: tl.constexpr, MASK_LOAD: tl.constexpr, MASK_STORE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(in_ptr + offs, mask=offs < n) if MASK_LOAD else tl.load(in_ptr + offs)
    if MASK_STORE:
        tl.store(out_ptr + offs, x, mask=offs < n)
    else:
        tl.store(out_ptr + offs, x)


def _launch(out, x, mask_load, mask_store):
    n = x.numel()
    _copy_kernel[(triton.cdiv(n, 32),)](out, x, n, BLOCK=32, MASK_LOAD=mask_load, MASK_STORE=mask_store)


def test_guards_let_a_correct_kernel_pass():
    x = testing.guarded_input(torch.randn(50, device=DEVICE))
    with testing.guarded_output((50,), torch.float32, DEVICE) as out:
        _launch(out, x, True, True)
    testing.explain_nan_from_guards(out)
    testing.assert_close(out, x.double(), quiet=True)


def test_guards_catch_an_unmasked_load():
    x = testing.guarded_input(torch.randn(50, device=DEVICE))
    with testing.guarded_output((64,), torch.float32, DEVICE) as out:
        # 2 blocks of 32: reads 14 elements past x, writes all of out and nothing past it
        _copy_kernel[(2,)](out, x, 50, BLOCK=32, MASK_LOAD=False, MASK_STORE=False)
    with pytest.raises(CheckFailed, match="read past the end"):
        testing.explain_nan_from_guards(out)


def test_guards_catch_an_output_left_unwritten():
    """A grid too small for the output: the entries no program stores are named, and not
    blamed on a load past an input."""
    x = testing.guarded_input(torch.randn(64, device=DEVICE))
    with pytest.raises(CheckFailed, match=r"14 of 64 entries of the output were never written, first at \(50,\)"):
        with testing.guarded_output((64,), torch.float32, DEVICE, name="the output") as out:
            _copy_kernel[(2,)](out, x, 50, BLOCK=32, MASK_LOAD=True, MASK_STORE=True)


def test_guards_catch_an_unmasked_store():
    x = testing.guarded_input(torch.randn(50, device=DEVICE))
    with pytest.raises(CheckFailed, match="14 after it"):
        with testing.guarded_output((50,), torch.float32, DEVICE) as out:
            _launch(out, x, True, False)


def test_guarded_allocations_catch_a_wrapper_that_stores_past_its_output():
    x = torch.randn(50, device=DEVICE)
    with pytest.raises(CheckFailed, match="wrote outside a \\(50,\\) tensor"):
        with testing.guarded_allocations():
            out = torch.empty_like(x)
            _launch(out, x, True, False)


def test_count_launches_and_forbid_torch():
    x = torch.randn(40, device=DEVICE)
    out = torch.empty_like(x)
    with testing.count_launches(_copy_kernel) as launches:
        _launch(out, x, True, True)
        _launch(out, x, True, True)
    assert launches[0] == 2
    with pytest.raises(CheckFailed, match="called torch's softmax"):
        with testing.forbid_torch("softmax"):
            x.softmax(-1)
    assert torch.allclose(x.softmax(-1), torch.softmax(x, -1))  # restored afterwards


def test_compile_for_gpu_accepts_a_good_kernel_and_reports_a_gpu_only_error(tmp_path):
    from course.gpu_compile import compile_for_gpu
    signature = {"out_ptr": "*fp32", "in_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr",
                 "MASK_LOAD": "constexpr", "MASK_STORE": "constexpr"}
    compile_for_gpu(_copy_kernel, signature, {"BLOCK": 128, "MASK_LOAD": True, "MASK_STORE": True})
    # A plain Python global inside a kernel runs in the interpreter; a GPU compiler refuses it.
    module = tmp_path / "kernel_with_global.py"
    module.write_text(
        "import triton, triton.language as tl\nSCALE = 2.0\n"
        "@triton.jit\ndef scaled(x_ptr, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n    tl.store(x_ptr + offs, tl.load(x_ptr + offs) * SCALE)\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("kernel_with_global", module)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if DEVICE == "cpu":
        x = torch.ones(16)
        mod.scaled[(1,)](x, BLOCK=16)
        assert torch.equal(x, torch.full((16,), 2.0))  # the interpreter runs it
    with pytest.raises(CheckFailed, match="SCALE"):
        compile_for_gpu(mod.scaled, {"x_ptr": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 16})
