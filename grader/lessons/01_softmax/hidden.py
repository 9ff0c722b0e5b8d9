"""Hidden tests of module 01: the visible cases on inputs the learner never saw."""
import torch

from course import DEVICE, INTERPRET, pick
from course.checks import softmax as visible
from course.testing import check_rejects, dtype_name, graded_choice, randn
from solutions import softmax as key

SEEDS = (11, 12, 13)
DTYPES = (torch.float32, torch.float16) if INTERPRET else (torch.float32, torch.float16, torch.bfloat16)


def test_softmax_naive(fn):
    for seed in SEEDS:
        x = randn(3, 7, 5, seed=seed)
        for dim in (0, 1, 2, -1):
            visible.case_softmax(fn, x, dim, name=f"softmax_naive on a 3x7x5 tensor, dim={dim}", quiet=True)
        # A permuted (non-contiguous) view.
        visible.case_softmax(fn, x.permute(2, 0, 1), 1, quiet=True,
                             name="softmax_naive on a permuted 5x3x7 view, dim=1")


def test_softmax_stable(fn):
    for seed in SEEDS:
        x = randn(4, 9, seed=seed) * 200 + 500
        visible.case_softmax(fn, x, -1, name="softmax_stable on large inputs", quiet=True)
        y = randn(3, 6, 5, seed=seed) * 40
        for dim in (0, 1, -1):
            visible.case_softmax(fn, y, dim, name=f"softmax_stable on a 3x6x5 tensor, dim={dim}", quiet=True)
        # Slices far from zero both ways, along the last dim, as columns (a transposed view)
        # and along the middle dim of a 3-D tensor; in float16 too.
        z = visible.extreme_rows(7, 33, seed=seed)
        visible.case_softmax(fn, z, -1, quiet=True, name="softmax_stable on rows far from zero both ways")
        visible.case_softmax(fn, z.t(), 0, quiet=True,
                             name="softmax_stable on columns far from zero both ways (a transposed view), dim=0")
        z = visible.extreme_rows(12, 9, seed=seed).reshape(3, 4, 9).transpose(1, 2)
        visible.case_softmax(fn, z, 1, quiet=True,
                             name="softmax_stable on a 3x9x4 view far from zero both ways, dim=1")
        z = visible.extreme_rows(6, 20, seed=seed, dtype=torch.float16)
        visible.case_softmax(fn, z, -1, quiet=True,
                             name="softmax_stable on float16 rows far from zero both ways")


def test_online_softmax(fn):
    for seed in SEEDS:
        rising = torch.linspace(-5, 20, 61) + randn(61, seed=seed)
        for block in (1, 4, 7, 61, 100):
            visible.case_online(fn, rising, block, name=f"online_softmax with block_size={block}", quiet=True)
        visible.case_online(fn, randn(45, seed=seed) * 10, 8, name="online_softmax on random values", quiet=True)
        # Far from zero: all far below, all far above, and rising from -1e4 to 1e4.
        far = {"x around -1e4": randn(37, seed=seed) * 5 - 1e4, "x around +1e4": randn(37, seed=seed) * 5 + 1e4,
               "x rising from -1e4 to 1e4": torch.linspace(-1e4, 1e4, 37) + randn(37, seed=seed)}
        for label, x in far.items():
            for block in (1, 5, 37):
                visible.case_online(fn, x, block, quiet=True, name=f"online_softmax with block_size={block}, {label}")


def test_rescale_bug(answer):
    graded_choice(answer, "rescale_bug_answer", key.rescale_bug_answer,
                  "look at the value of m when exp(m_old - m_new) is computed in the buggy version.")


def test_softmax_kernel(kernel):
    shapes = [(1, 1), (5, 1), (3, 7), (4, 97), (2, 130), (3, 1000)] + pick([], [(257, 4099), (1000, 3001)])
    for (n_rows, n_cols), seed in zip(shapes, range(20, 40)):
        for dtype in DTYPES:
            visible.case_kernel(kernel, randn(n_rows, n_cols, dtype=dtype, seed=seed) * 3, quiet=True)
    # Input and output rows apart in memory (both strides must be used), rows wider than
    # any fixed block, rows far from zero both ways.
    for (n_rows, n_cols, gap), seed in zip([(3, 1, 1), (5, 37, 11), (4, 300, 2), (2, 1500, 600)], range(40, 50)):
        for dtype in DTYPES:
            visible.case_kernel(kernel, randn(n_rows, n_cols, dtype=dtype, seed=seed) * 3, gap=gap, quiet=True)
    for (n_rows, n_cols), seed in (((2, 5003), 50), ((1, 8193), 51)):
        for dtype in DTYPES:
            visible.case_kernel(kernel, randn(n_rows, n_cols, dtype=dtype, seed=seed) * 3, gap=seed % 5,
                                label=" (wide rows)", quiet=True)
    for seed in SEEDS:
        for dtype in DTYPES:
            visible.case_kernel(kernel, visible.extreme_rows(7, 60 + seed, seed=seed, dtype=dtype),
                                gap=seed % 3, label=" far from zero both ways", quiet=True)
    # A float16 row whose sum of exps passes the float16 max: only a float32 sum is right.
    visible.case_kernel(kernel, visible.long_half_rows(1, 65800, seed=52),
                        label=" (a long row: its sum of exps passes the float16 max)", quiet=True)


def test_softmax(softmax, kernel):
    for n_rows, n_cols, seed in [(1, 1, 1), (6, 61, 2), (3, 777, 3), (2, 1500, 4)]:
        for dtype in DTYPES:
            x = randn(n_rows, n_cols, dtype=dtype, device=DEVICE, seed=seed) * 5
            visible.case_wrapper(softmax, kernel, x, name=f"softmax on a {n_rows}x{n_cols} {dtype_name(dtype)}", quiet=True)
    # Non-contiguous inputs: transposed, a column slice of wider rows, every other column.
    for dtype, seed in zip(DTYPES, (5, 6, 7)):
        x = randn(9, 40, dtype=dtype, device=DEVICE, seed=seed) * 5
        for label, view in visible.layouts(x, seed=seed + 10).items():
            visible.case_wrapper(softmax, kernel, view, quiet=True,
                                 name=f"softmax on a 9x40 {dtype_name(dtype)} input, {label}")
    # Rows wider than any fixed block, rows far from zero both ways, long float16 rows.
    for n_rows, n_cols, dtype, seed in [(2, 5003, torch.float32, 8), (1, 9001, torch.float16, 9),
                                        (1, 8193, torch.float32, 10)]:
        x = randn(n_rows, n_cols, dtype=dtype, device=DEVICE, seed=seed) * 5
        visible.case_wrapper(softmax, kernel, x, quiet=True,
                             name=f"softmax on a {n_rows}x{n_cols} {dtype_name(dtype)}")
    for dtype, seed in zip(DTYPES, (14, 15, 16)):
        x = visible.extreme_rows(7, 45, seed=seed, dtype=dtype, device=DEVICE)
        visible.case_wrapper(softmax, kernel, x, quiet=True,
                             name=f"softmax on 7x45 {dtype_name(dtype)} rows far from zero both ways")
    x = visible.long_half_rows(1, 65800, seed=17, device=DEVICE)
    visible.case_wrapper(softmax, kernel, x, quiet=True,
                         name="softmax on a 1x65800 float16: a sum of exps past the float16 max")
    check_rejects([(f"a {bad.dim()}-D input (it must be 2-D)", lambda bad=bad: softmax(bad))
                   for bad in (torch.ones(3, device=DEVICE), torch.ones(2, 3, 4, device=DEVICE))],
                  name="softmax")
