"""Visible checks of module 01 (softmax). Hidden tests reuse the `case_*` functions
with inputs the learner never sees."""
import torch

from course import DEVICE
from course.testing import (assert_close, assert_not_trivial, dtype_name, explain_nan_from_guards,
                            fail, guarded_input, guarded_output, randn, run_wrapper)
from course.testing import check_choice  # noqa: F401  (the lesson calls checks.check_choice)

ROW_COL = ("row", "col")


def _reference(x, dim):
    return torch.softmax(x.to(torch.float64), dim=dim)


def _wrong_dims(x, dim):
    """Outputs of softmax over every other dim: the classic 'wrong dim' mistake."""
    dims = range(x.dim())
    picked = dim % x.dim()
    return {f"softmax over dim={d} instead of dim={dim}": _reference(x, d) for d in dims if d != picked}


def case_softmax(fn, x, dim, *, name, quiet=False):
    """fn(x, dim) against float64 softmax, naming the wrong-dim mistake if it happens."""
    out = fn(x.clone(), dim=dim)
    assert_close(out, _reference(x, dim), name=name, dim_names=ROW_COL if x.dim() == 2 else None,
                 mistakes=_wrong_dims(x, dim), quiet=quiet,
                 hint="every slice along `dim` must sum to 1: sum with keepdim=True along `dim`")
    assert_not_trivial(out, name=name)


def check_softmax_naive(softmax_naive):
    x = randn(3, 5, seed=1)
    for dim in (-1, 0):
        case_softmax(softmax_naive, x, dim, name=f"softmax_naive(x, dim={dim})")


def case_large_inputs(fn, x, *, name, quiet=False):
    out = fn(x.clone(), dim=-1)
    if isinstance(out, torch.Tensor) and torch.isnan(out).any():
        fail(f"{name} gives NaN for large inputs: exp({float(x.max()):.0f}) overflows to inf "
             "and inf/inf is NaN. Subtract the max of each slice before exp.")
    assert_close(out, _reference(x, -1), name=name, quiet=quiet,
                 hint="subtract the max along `dim` (keepdim=True), not the max of the whole tensor")


def check_softmax_stable(softmax_stable):
    case_large_inputs(softmax_stable, torch.tensor([1000.0, 1001.0, 1002.0]),
                      name="softmax_stable([1000, 1001, 1002])")
    x = randn(2, 3, seed=2) * 3
    for dim in (0, 1):
        case_softmax(softmax_stable, x, dim, name=f"softmax_stable(x, dim={dim}) on a 2x3 tensor")


def online_softmax_rescale_bug(x, block_size):
    """The outline's order: the max is replaced before the sum is rescaled."""
    m, l = torch.tensor(float("-inf")), torch.tensor(0.0)
    x = x.to(torch.float32)
    for start in range(0, x.numel(), block_size):
        block = x[start:start + block_size]
        m = torch.maximum(m, block.max())
        l = l * torch.exp(m - m) + torch.exp(block - m).sum()
    return torch.exp(x - m) / l


def case_online(fn, x, block_size, *, name, quiet=False):
    out = fn(x.clone(), block_size)
    assert_close(out, _reference(x, -1), name=name, quiet=quiet,
                 mistakes={"the max is updated before the sum is rescaled, so the rescale "
                           "factor exp(m_old - m_new) is always 1":
                           online_softmax_rescale_bug(x, block_size)},
                 hint="when a block raises the max, multiply the old sum by exp(m_old - m_new) "
                      "before replacing m")
    assert_not_trivial(out, name=name)


def check_online_softmax(online_softmax):
    # Increasing values: every block raises the max, so the rescale matters.
    x = torch.linspace(-3, 9, 23) + 0.1 * randn(23, seed=3)
    case_online(online_softmax, x, 5, name="online_softmax(x, block_size=5)")
    case_online(online_softmax, randn(17, seed=4) * 4, 17, name="online_softmax(x, block_size=17)")


def case_kernel(kernel, n_rows, n_cols, dtype, *, seed, quiet=False):
    """Launch the learner's kernel directly, on guarded buffers."""
    import triton
    x = guarded_input(randn(n_rows, n_cols, dtype=dtype, device=DEVICE, seed=seed) * 3)
    name = f"softmax_kernel on a {n_rows}x{n_cols} {dtype_name(dtype)} input"
    with guarded_output((n_rows, n_cols), dtype, DEVICE, name="the output") as out:
        kernel[(n_rows,)](out, x, x.stride(0), out.stride(0), n_cols,
                          BLOCK_SIZE=triton.next_power_of_2(n_cols))
    explain_nan_from_guards(out, name=name)
    padded = torch.cat([x.double(), torch.zeros(n_rows, triton.next_power_of_2(n_cols) - n_cols,
                                                dtype=torch.float64, device=x.device)], dim=1)
    assert_close(out, _reference(x, -1), name=name, dim_names=ROW_COL, quiet=quiet,
                 mistakes={"the padding lanes were loaded as 0 (other=0) and added exp(0 - max) "
                           "to the sum: load them as -inf": torch.softmax(padded, -1)[:, :n_cols]})


def check_softmax_kernel(softmax_kernel):
    for n_rows, n_cols in [(4, 1), (3, 37), (2, 300)]:
        case_kernel(softmax_kernel, n_rows, n_cols, torch.float32, seed=n_cols)


def case_wrapper(softmax, kernel, x, *, name, quiet=False):
    out = run_wrapper(softmax, kernel, x, forbid="softmax", name=name)
    assert_close(out, _reference(x, -1), name=name, dim_names=ROW_COL, quiet=quiet,
                 hint="launch one program per row with BLOCK_SIZE = triton.next_power_of_2(n_cols), "
                      "so that one block covers the whole row")
    if out.dtype != x.dtype:
        fail(f"{name}: the output is {out.dtype}, the input {x.dtype}: return the input's dtype")


def check_softmax(softmax, softmax_kernel):
    for n_rows, n_cols, dtype in [(5, 97, torch.float32), (3, 1030, torch.float16)]:
        x = randn(n_rows, n_cols, dtype=dtype, device=DEVICE, seed=n_cols)
        case_wrapper(softmax, softmax_kernel, x, name=f"softmax({n_rows}x{n_cols} {dtype})")
