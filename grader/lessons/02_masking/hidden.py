"""Hidden tests of module 02: the visible cases on inputs the learner never saw."""
import torch

from course import DEVICE, INTERPRET
from course.checks import masking as visible
from course.testing import assert_close, check_rejects, dtype_name, fail, randn
from grader.rules import JitKernel, Launches

# Checked on the submitted code (grader/rules.py): the worker's launch count and
# forbidden-function checks are only as honest as the notebook lets them be.
RULES = {"test_masked_softmax_kernel": [JitKernel("masked_softmax_kernel")],
         "test_masked_softmax": [Launches("masked_softmax", "masked_softmax_kernel", forbid="softmax")]}

SEEDS = (21, 22, 23)
DTYPES = (torch.float32, torch.float16) if INTERPRET else (torch.float32, torch.float16, torch.bfloat16)


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def test_causal_mask_bool(fn):
    for n in (7, 1, 2, 33, 100):
        visible.case_causal_mask_bool(fn, n, quiet=True)


def test_causal_mask(fn):
    for n in (3, 1, 17, 64):
        for dtype in DTYPES + (torch.float64,):
            visible.case_causal_mask(fn, n, dtype, quiet=True)


def test_apply_mask(fn):
    B, H, M, N = 2, 3, 5, 7
    for seed in SEEDS:
        g = _generator(seed)
        random = torch.rand(M, N, generator=g) < 0.4
        full = torch.rand(B, H, M, N, generator=g) < 0.5
        pad = (torch.arange(N) >= torch.randint(0, N + 1, (B,), generator=g)[:, None]).reshape(B, 1, 1, N)
        masks = {"bool [5, 7]": random, "0/1 float [5, 7]": random.float(),
                 "0/1 uint8 [5, 7]": random.to(torch.uint8), "bool [2, 1, 1, 7]": pad,
                 "bool [2, 3, 5, 7]": full}
        for dtype in DTYPES:
            scores = randn(B, H, M, N, dtype=dtype, device=DEVICE, seed=seed) * 4
            for label, mask in masks.items():
                visible.case_apply_mask(fn, scores, mask.to(DEVICE), quiet=True,
                                        name=f"apply_mask on {dtype_name(dtype)} scores [2, 3, 5, 7] with a {label} mask")


def test_padding_mask(fn):
    for seed, n in zip(SEEDS, (1, 6, 33)):
        g = _generator(seed)
        lengths = [0, n] + torch.randint(0, n + 1, (3,), generator=g).tolist()
        visible.case_padding_mask(fn, lengths, n, quiet=True)
        visible.case_padding_mask(fn, torch.tensor(lengths), n, quiet=True)
        combined = fn(lengths, n) | visible.visible_keys(n, n, causal=True)[0].logical_not()
        expected = ~visible.visible_keys(n, n, causal=True, lengths=lengths)
        if tuple(combined.shape) != tuple(expected.shape):
            fail(f"padding_mask({lengths}, {n}) | causal_mask has shape {tuple(combined.shape)}, "
                 f"expected {tuple(expected.shape)} = [B, n, n]")
        assert_close(combined.double(), expected.double(), quiet=True,
                     name=f"padding_mask({lengths}, {n}) combined with a causal mask")


def test_safe_softmax(fn):
    cases = [((3, 8), -1, [(1,)]), ((2, 5, 9), 1, [(0, 2), (1, 0), (1, 4)]),
             ((2, 2, 4, 6), -1, [(0, 1, 3), (1, 0, 0)]), ((4, 7), 0, [(0,), (3,)])]
    for seed in SEEDS:
        for shape, dim, rows in cases:
            for dtype in DTYPES:
                # Rows are built along the last dim, then moved to `dim`.
                s = visible.masked_scores(shape, seed=seed, blocked_rows=rows, dtype=dtype,
                                          scale=30.0).movedim(-1, dim)
                visible.case_safe_softmax(fn, s, dim, quiet=True,
                                          name=f"safe_softmax on {dtype_name(dtype)} scores of shape "
                                               f"{tuple(s.shape)}, dim={dim}, with fully masked slices")


# (B, M, N, causal, lengths): widths that are not powers of two, wider than 256 lanes,
# M > N and M < N, sequences of length 0 (fully masked rows) and of full length.
KERNEL_CASES = [
    (1, 1, 1, False, None),
    (2, 3, 5, True, [5, 0]),
    (2, 7, 100, False, None),
    (1, 3, 300, False, None),
    (3, 6, 61, True, [61, 17, 0]),
    (2, 13, 9, True, [9, 1]),
    (2, 9, 40, True, None),
    (2, 5, 130, False, [130, 64]),
]


def test_masked_softmax_kernel(kernel):
    for index, (B, M, N, causal, lengths) in enumerate(KERNEL_CASES):
        for dtype in DTYPES:
            for seed in SEEDS[:2]:
                visible.case_kernel(kernel, B, M, N, dtype, causal=causal, lengths=lengths,
                                    seed=seed * 100 + index, quiet=True)
    for seed in SEEDS:
        g = _generator(seed)
        lengths = torch.randint(0, 48, (3,), generator=g).tolist()
        visible.case_kernel(kernel, 3, 5, 47, torch.float32, causal=bool(seed % 2), lengths=lengths,
                            seed=seed, quiet=True)


def test_masked_softmax(fn, kernel):
    for seed in SEEDS:
        g = _generator(seed)
        lengths = [0, 70] + torch.randint(1, 70, (1,), generator=g).tolist()
        for dtype in DTYPES:
            x = randn(3, 11, 70, dtype=dtype, device=DEVICE, seed=seed) * 4
            visible.case_wrapper(fn, kernel, x, causal=True, lengths=lengths, quiet=True,
                                 name=f"masked_softmax on {dtype_name(dtype)} scores [3, 11, 70], causal, lengths={lengths}")
        x = randn(9, 33, device=DEVICE, seed=seed)
        visible.case_wrapper(fn, kernel, x, causal=False, quiet=True,
                             name="masked_softmax on scores [9, 33], causal=False, no lengths")
        x = randn(5, 20, device=DEVICE, seed=seed)
        visible.case_wrapper(fn, kernel, x, causal=None, lengths=torch.tensor([7], device=DEVICE),
                             quiet=True, name="masked_softmax on scores [5, 20] (default causal), lengths=tensor([7])")
        # A non-contiguous view: its rows are not one after another in memory.
        x = randn(2, 50, 8, device=DEVICE, seed=seed).transpose(1, 2)
        visible.case_wrapper(fn, kernel, x, causal=True, lengths=[50, 20], quiet=True,
                             name="masked_softmax on a transposed [2, 8, 50] view, causal, lengths=[50, 20]")
    check_rejects([(f"{bad.dim()}-D scores (they must be 2-D or 3-D)", lambda bad=bad: fn(bad))
                   for bad in (torch.ones(3, device=DEVICE), torch.ones(2, 2, 3, 4, device=DEVICE))],
                  name="masked_softmax")
