"""Hidden tests of module 01: the visible cases on inputs the learner never saw."""
import torch

from course import DEVICE, INTERPRET, pick
from course.checks import softmax as visible
from course.testing import check_rejects, fail, randn
from solutions import softmax as key
from grader.rules import JitKernel, Launches

# Checked on the submitted code (grader/rules.py): the worker's launch count and
# forbidden-function checks are only as honest as the notebook lets them be.
RULES = {"test_softmax_kernel": [JitKernel("softmax_kernel")],
         "test_softmax": [Launches("softmax", "softmax_kernel", forbid="softmax")]}

SEEDS = (11, 12, 13)
DTYPES = (torch.float32, torch.float16) if INTERPRET else (torch.float32, torch.float16, torch.bfloat16)


def test_softmax_naive(fn):
    for seed in SEEDS:
        x = randn(3, 7, 5, seed=seed)
        for dim in (0, 1, 2, -1):
            visible.case_softmax(fn, x, dim, name=f"softmax_naive on a 3x7x5 tensor, dim={dim}", quiet=True)


def test_softmax_stable(fn):
    for seed in SEEDS:
        x = randn(4, 9, seed=seed) * 200 + 500
        visible.case_large_inputs(fn, x, name="softmax_stable on large inputs", quiet=True)
        y = randn(3, 6, 5, seed=seed) * 40
        for dim in (0, 1, -1):
            visible.case_softmax(fn, y, dim, name=f"softmax_stable on a 3x6x5 tensor, dim={dim}", quiet=True)


def test_online_softmax(fn):
    for seed in SEEDS:
        rising = torch.linspace(-5, 20, 61) + randn(61, seed=seed)
        for block in (1, 4, 7, 61, 100):
            visible.case_online(fn, rising, block, name=f"online_softmax with block_size={block}", quiet=True)
        visible.case_online(fn, randn(45, seed=seed) * 10, 8, name="online_softmax on random values", quiet=True)


def test_rescale_bug(answer):
    visible.check_choice(answer, name="rescale_bug_answer")
    if answer.strip().lower() != key.rescale_bug_answer:
        fail("rescale_bug_answer is not the right choice: look at the value of m when "
             "exp(m_old - m_new) is computed in the buggy version.")


def test_softmax_kernel(kernel):
    shapes = [(1, 1), (5, 1), (3, 7), (4, 97), (2, 130), (3, 1000)] + pick([], [(257, 4099), (1000, 3001)])
    for (n_rows, n_cols), seed in zip(shapes, range(20, 40)):
        for dtype in DTYPES:
            visible.case_kernel(kernel, n_rows, n_cols, dtype, seed=seed, quiet=True)


def test_softmax(softmax, kernel):
    for n_rows, n_cols, seed in [(1, 1, 1), (6, 61, 2), (3, 777, 3), (2, 1500, 4)]:
        for dtype in DTYPES:
            x = randn(n_rows, n_cols, dtype=dtype, device=DEVICE, seed=seed) * 5
            visible.case_wrapper(softmax, kernel, x, name=f"softmax on a {n_rows}x{n_cols} {dtype}", quiet=True)
    # A transposed (non-contiguous) view must work too.
    x = randn(40, 9, device=DEVICE, seed=5).t()
    visible.case_wrapper(softmax, kernel, x, name="softmax on a transposed 9x40 view", quiet=True)
    check_rejects([(f"a {bad.dim()}-D input (it must be 2-D)", lambda bad=bad: softmax(bad))
                   for bad in (torch.ones(3, device=DEVICE), torch.ones(2, 3, 4, device=DEVICE))],
                  name="softmax")
