"""Visible checks of module 01 (softmax). Hidden tests reuse the `case_*` functions
with inputs the learner never sees."""
import torch
import triton

from course import DEVICE
from course.recorded import answer
from course.testing import (assert_close, assert_not_trivial, check_rejects, dtype_name,
                            explain_nan_from_guards, fail, guarded_input, guarded_output, randn,
                            row_margin, run_wrapper, weight_tolerance)
from course.testing import check_choice  # noqa: F401  (the lesson calls checks.check_choice)
from course.rules import Avoids, Int64Offsets, JitKernel, Launches, checked

# Checked on the submitted code (course/rules.py): the worker's launch count and
# forbidden-function checks are only as honest as the notebook lets them be.
RULES = {"test_softmax_kernel": [JitKernel("softmax_kernel"), Int64Offsets("softmax_kernel")],
         "test_softmax": [Launches("softmax", "softmax_kernel", forbid="softmax"),
                          Avoids("softmax", ("exp", "exp2", "expm1", "logsumexp", "softmax_naive",
                                             "softmax_stable", "online_softmax"),
                                 "the wrapper only prepares and launches: all of the softmax (max, "
                                 "exp, sum, division) must happen in softmax_kernel")]}


ROW_COL = ("row", "col")
OVERFLOW = ("no max subtraction: exp(x) overflows to inf once x passes 88.7 (in float32), and "
            "inf / inf is NaN. Subtract the max of each {where} before exp")
UNDERFLOW = ("the max of the whole tensor was subtracted, not the max of each slice: in a slice "
             "whose entries all lie far below that max, every exp underflows to 0, and 0 / 0 is "
             "NaN. Take the max along `dim` (keepdim=True)")
HALF_SUM = ("the exps were summed in float16: a row of more than 65504 (the float16 max) entries "
            "near its max sums past 65504, the sum overflows to inf and every weight becomes 0. "
            "Compute the statistics (max, exp, sum) in float32 and convert only when storing")
OTHER_ZERO = ("the padding lanes were loaded as 0 (other=0) and added exp(0 - max) to the sum: "
              "load them as -inf")


def _reference(x, dim):
    return torch.softmax(x.to(torch.float64), dim=dim)


def _wrong_dims(x, dim):
    """Outputs of softmax over every other dim: the classic 'wrong dim' mistake."""
    dims = range(x.dim())
    picked = dim % x.dim()
    return {f"softmax over dim={d} instead of dim={dim}": _reference(x, d) for d in dims if d != picked}


def _max_mistakes(x, dim, where="slice along `dim`"):
    """{description: recorded output} of the two classic ways to get the max subtraction
    wrong: none, or the max of the whole tensor."""
    return dict(zip((OVERFLOW.format(where=where), UNDERFLOW), answer("softmax", "max_mistakes", x, dim)))


def extreme_rows(n_rows, n_cols, *, seed, dtype=torch.float32, device="cpu"):
    """Rows far from zero in both directions: row r is shifted by +1e4, -1e4 or 0 in turn,
    with its own spread (1 to 30), and the last of 4 or more rows mixes huge and tiny values
    (|x| from 1e-4 to 1e4, either sign). Without a max subtraction the +1e4 rows overflow;
    with the max of the whole tensor the -1e4 rows underflow."""
    g = torch.Generator().manual_seed(seed)
    spread = 1 + 29 * torch.rand(n_rows, 1, generator=g)
    shift = torch.tensor([1e4, -1e4, 0.0]).repeat(n_rows)[:n_rows, None]
    x = randn(n_rows, n_cols, seed=seed) * spread + shift
    if n_rows >= 4:
        sign = torch.where(torch.rand(n_cols, generator=g) < 0.5, -1.0, 1.0)
        x[-1] = sign * 10 ** (8 * torch.rand(n_cols, generator=g) - 4)
    return x.to(device=device, dtype=dtype)


def long_half_rows(n_rows, n_cols, *, seed, device="cpu"):
    """float16 rows whose entries lie within about 1e-3 of each other: every exp(x - max) is
    about 1, so with more than 65504 columns a row's sum only fits in float32."""
    return (randn(n_rows, n_cols, seed=seed) * 1e-4).to(device=device, dtype=torch.float16)


def case_softmax(fn, x, dim, *, name, quiet=False):
    """fn(x, dim) against float64 softmax, naming the wrong-dim and max-subtraction mistakes
    if they happen."""
    out = fn(x.clone(), dim=dim)
    assert_close(out, _reference(x, dim), name=name, dim_names=ROW_COL if x.dim() == 2 else None,
                 mistakes={**_wrong_dims(x, dim), **_max_mistakes(x, dim)}, quiet=quiet,
                 hint="every slice along `dim` must sum to 1: take the max and the sum along `dim` "
                      "(keepdim=True)")
    assert_not_trivial(out, name=name)


def check_softmax_naive(softmax_naive):
    x = randn(3, 5, seed=1)
    for dim in (-1, 0):
        case_softmax(softmax_naive, x, dim, name=f"softmax_naive(x, dim={dim})")
    case_softmax(softmax_naive, randn(5, 3, seed=2).t(), -1,
                 name="softmax_naive(x, dim=-1) on a transposed 3x5 view")
    case_softmax(softmax_naive, randn(2, 3, 4, seed=3), 1, name="softmax_naive(x, dim=1) on a 2x3x4 tensor")


def check_softmax_stable(softmax_stable):
    case_softmax(softmax_stable, torch.tensor([1000.0, 1001.0, 1002.0]), -1,
                 name="softmax_stable([1000, 1001, 1002])")
    x = randn(2, 3, seed=2) * 3
    for dim in (0, 1):
        case_softmax(softmax_stable, x, dim, name=f"softmax_stable(x, dim={dim}) on a 2x3 tensor")
    # Rows around +1e4, -1e4 and 0, and one mixing huge and tiny values; also as columns.
    x = extreme_rows(4, 6, seed=3)
    case_softmax(softmax_stable, x, -1, name="softmax_stable(x, dim=-1), rows far from zero both ways")
    case_softmax(softmax_stable, x.t(), 0,
                 name="softmax_stable(x, dim=0), columns far from zero both ways (a transposed view)")
    case_softmax(softmax_stable, extreme_rows(4, 6, seed=4, dtype=torch.float16), -1,
                 name="softmax_stable(x, dim=-1), float16 rows far from zero both ways")
    case_softmax(softmax_stable, extreme_rows(6, 4, seed=5).reshape(2, 3, 4).transpose(1, 2), 1,
                 name="softmax_stable(x, dim=1) on a 2x4x3 view far from zero both ways")


def case_online(fn, x, block_size, *, name, quiet=False):
    out = fn(x.clone(), block_size)
    assert_close(out, _reference(x, -1), name=name, quiet=quiet,
                 mistakes=dict(zip(("the max is updated before the sum is rescaled, so the rescale "
                                    "factor exp(m_old - m_new) is always 1",
                                    "the running max started at 0, not -inf: for scores far below 0 "
                                    "every exp(x - 0) underflows to 0, the sum is 0 and 0 / 0 is NaN"),
                                   answer("softmax", "online_mistakes", x, block_size))),
                 hint="when a block raises the max, multiply the old sum by exp(m_old - m_new) "
                      "before replacing m")
    assert_not_trivial(out, name=name)


def check_online_softmax(online_softmax):
    # Increasing values: every block raises the max, so the rescale matters.
    x = torch.linspace(-3, 9, 23) + 0.1 * randn(23, seed=3)
    case_online(online_softmax, x, 5, name="online_softmax(x, block_size=5)")
    case_online(online_softmax, randn(17, seed=4) * 4, 17, name="online_softmax(x, block_size=17)")
    for shift in (-1e4, 1e4):
        case_online(online_softmax, randn(19, seed=5) * 3 + shift, 4,
                    name=f"online_softmax(x, block_size=4), x around {shift:+.0e}")
    case_online(online_softmax, torch.linspace(-1e4, 1e4, 13) + randn(13, seed=6), 3,
                name="online_softmax(x, block_size=3), x rising from -1e4 to 1e4")


def _kernel_mistakes(x):
    """{description: recorded output} of the classic bugs of a row-softmax kernel on x."""
    descriptions = (OTHER_ZERO, OVERFLOW.format(where="row"), UNDERFLOW, HALF_SUM)
    return dict(zip(descriptions, answer("softmax", "kernel_mistakes", x)))


def case_kernel(kernel, x, *, gap=0, label="", quiet=False):
    """Launch the learner's kernel directly on x [n_rows, n_cols], in guarded memory. With
    gap > 0 the input's rows lie n_cols + gap entries apart and the output's n_cols + gap + 3
    (column slices of wider tensors, NaN and sentinels between the rows): the kernel must
    use both row strides, and leave the memory between the output's rows untouched."""
    n_rows, n_cols = x.shape
    name = f"softmax_kernel on a {n_rows}x{n_cols} {dtype_name(x.dtype)} input{label}"
    if gap:
        name += f", rows {n_cols + gap} (input) and {n_cols + gap + 3} (output) entries apart"
    margin = row_margin(n_cols)
    x = guarded_input(x.to(DEVICE), gaps=(0, gap) if gap else None, margin=margin)
    with guarded_output((n_rows, n_cols), x.dtype, DEVICE, name="the output",
                        gaps=(0, gap + 3) if gap else None, margin=margin) as out:
        kernel[(n_rows,)](out, x, x.stride(0), out.stride(0), n_cols,
                          BLOCK_SIZE=triton.next_power_of_2(n_cols))
    calm = x.abs().amax(-1) < 80  # no exp can overflow there: a NaN was read from the guards
    explain_nan_from_guards(out[calm], name=name, gaps=bool(gap))
    atol, rtol = weight_tolerance(x.dtype, n_cols, DEVICE)
    assert_close(out, _reference(x, -1), name=name, dim_names=ROW_COL, quiet=quiet, atol=atol,
                 rtol=rtol, mistakes=_kernel_mistakes(x))


@checked(RULES)
def check_softmax_kernel(softmax_kernel):
    for n_rows, n_cols in [(4, 1), (3, 37), (2, 300)]:
        case_kernel(softmax_kernel, randn(n_rows, n_cols, seed=n_cols) * 3)
    case_kernel(softmax_kernel, randn(3, 37, seed=5) * 3, gap=5)
    case_kernel(softmax_kernel, extreme_rows(4, 50, seed=6), label=" far from zero both ways")
    case_kernel(softmax_kernel, extreme_rows(4, 50, seed=6, dtype=torch.float16), gap=2,
                label=" far from zero both ways")
    case_kernel(softmax_kernel, randn(1, 5000, seed=7) * 3, label=" (a wide row)")
    case_kernel(softmax_kernel, long_half_rows(1, 65700, seed=8),
                label=" (a long row: its sum of exps passes the float16 max)")


def recorded_launches():
    """(launches, before_launch): before_launch records each launch's keyword arguments
    (BLOCK_SIZE, ...) in the list launches, for wrapper_hint."""
    launches = []
    return launches, lambda launch, count: launches.append(dict(launch))


def wrapper_hint(x, launches, default):
    """What most likely went wrong in a wrapper whose output is wrong: a block capped below
    the row length, a non-contiguous input, or else `default`."""
    n = x.shape[-1]
    short = [b for b in (launch.get("BLOCK_SIZE") for launch in launches)
             if isinstance(b, int) and b < n]
    if short:
        return (f"the kernel was launched with BLOCK_SIZE={short[0]}, smaller than a row ({n} "
                "entries): one program loads its whole row, so BLOCK_SIZE = "
                "triton.next_power_of_2(n), never capped")
    if not x.is_contiguous():
        return (f"the input is not contiguous here (strides {tuple(x.stride())}): give the kernel "
                "its real strides (x.stride(...)), and make it contiguous first if its last "
                "stride is not 1")
    return default


def case_wrapper(softmax, kernel, x, *, name, quiet=False):
    """softmax(x) through the learner's kernel, PyTorch's softmax forbidden."""
    launches, record = recorded_launches()
    out = run_wrapper(softmax, kernel, x, forbid="softmax", name=name, before_launch=record)
    atol, rtol = weight_tolerance(x.dtype, x.shape[1], x.device)
    assert_close(out, _reference(x, -1), name=name, dim_names=ROW_COL, quiet=quiet, atol=atol,
                 rtol=rtol, mistakes=_kernel_mistakes(x),
                 hint=wrapper_hint(x, launches, "launch one program per row with BLOCK_SIZE = "
                                   "triton.next_power_of_2(n_cols), so that one block covers the "
                                   "whole row"))
    if out.dtype != x.dtype:
        fail(f"{name}: the output is {out.dtype}, the input {x.dtype}: return the input's dtype")


def layouts(x, *, seed):
    """{description: view} of x's values in the layouts the hidden tests use: transposed
    (last two dims), a slice of wider rows and of a taller batch (NaN between rows, so a
    wrapper that ignores a stride reads NaN), and every other column of wider rows."""
    lead = (0,) * (x.dim() - 2)
    wide = guarded_input(randn(*x.shape[:-1], 2 * x.shape[-1] + 1, dtype=x.dtype, device=x.device, seed=seed))
    wide[..., 1::2] = x
    return {"a transposed view": x.transpose(-1, -2).contiguous().transpose(-1, -2),
            f"a slice of rows {x.shape[-1] + 3} long": guarded_input(x, gaps=lead + (2, 3)),
            "every other column of wider rows": wide[..., 1::2]}


@checked(RULES)
def check_softmax(softmax, softmax_kernel):
    for n_rows, n_cols, dtype in [(5, 97, torch.float32), (3, 1030, torch.float16)]:
        x = randn(n_rows, n_cols, dtype=dtype, device=DEVICE, seed=n_cols)
        case_wrapper(softmax, softmax_kernel, x, name=f"softmax({n_rows}x{n_cols} {dtype_name(dtype)})")
    for label, x in layouts(randn(4, 33, device=DEVICE, seed=9), seed=10).items():
        case_wrapper(softmax, softmax_kernel, x, name=f"softmax(4x33 float32, {label})")
    x = randn(1, 4500, device=DEVICE, seed=11)
    case_wrapper(softmax, softmax_kernel, x, name="softmax(1x4500 float32): a row wider than 4096")
    for dtype in (torch.float32, torch.float16):
        x = extreme_rows(4, 20, seed=12, dtype=dtype, device=DEVICE)
        case_wrapper(softmax, softmax_kernel, x,
                     name=f"softmax(4x20 {dtype_name(dtype)}), rows far from zero both ways")
    x = long_half_rows(1, 65700, seed=13, device=DEVICE)
    case_wrapper(softmax, softmax_kernel, x,
                 name="softmax(1x65700 float16): a row whose sum of exps passes the float16 max")
    check_rejects([("a 1-D input (it must be 2-D)", lambda: softmax(torch.ones(3, device=DEVICE)))],
                  name="softmax")


def show_kernel_accesses(softmax_kernel):
    """Draw which program loaded and stored which element, on a 6 x 7 column slice of a
    wider tensor (rows not one after another in memory); an out-of-bounds access is
    reported under the picture of what happened until then."""
    import matplotlib.pyplot as plt

    from course import INTERPRET, bounds, plots
    if not INTERPRET:
        print("The recording needs Triton's interpreter: run this notebook with TRITON_INTERPRET=1 to see it.")
        return
    x = torch.randn(6, 12)[:, 2:9]
    out = torch.full((6, 10), float("nan"))[:, 1:8]
    accesses, error = bounds.record(lambda: softmax_kernel[(6,)](
        out, x, x.stride(0), out.stride(0), 7, BLOCK_SIZE=8))
    plots.kernel_accesses(accesses, [("in_ptr", x, "load"), ("out_ptr", out, "store")],
                          title="your softmax_kernel on a 6 x 7 slice: one colour per program")
    plt.show()
    if error:
        print("It stopped:", error)
