"""Hidden tests of module 02: the visible cases on inputs the learner never saw."""
import torch

from course import DEVICE, INTERPRET
from course.checks import masking as visible
from course.testing import check_rejects, dtype_name, randn

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
        # Transposed views (scores and mask), and scores far from zero both ways.
        scores = randn(B, H, N, M, device=DEVICE, seed=seed).transpose(-1, -2) * 4
        visible.case_apply_mask(fn, scores, random.t().contiguous().t().to(DEVICE), quiet=True,
                                name="apply_mask on scores [2, 3, 5, 7] (a transposed view), a transposed bool [5, 7] mask")
        for shift in (1e4, -1e4):
            scores = randn(B, H, M, N, device=DEVICE, seed=seed) * 30 + shift
            visible.case_apply_mask(fn, scores, full.to(DEVICE), quiet=True,
                                    name=f"apply_mask on scores [2, 3, 5, 7] around {shift:+.0e}, a bool [2, 3, 5, 7] mask")


def test_padding_mask(fn):
    for seed, n in zip(SEEDS, (1, 6, 33)):
        g = _generator(seed)
        lengths = [0, n] + torch.randint(0, n + 1, (3,), generator=g).tolist()
        visible.case_padding_mask(fn, lengths, n, quiet=True)
        visible.case_padding_mask(fn, torch.tensor(lengths), n, quiet=True)
        # int32 lengths, as a strided view.
        visible.case_padding_mask(fn, torch.tensor(lengths + lengths, dtype=torch.int32)[::2], n, quiet=True)
        visible.case_padding_with_causal(fn, lengths, n, quiet=True)


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
        # Scores far from zero both ways, in float32 and float16.
        for shift in (1e4, -1e4):
            for dtype in DTYPES:
                s = visible.masked_scores((5, 9), seed=seed, blocked_rows=[(2,)], dtype=dtype, scale=20.0, shift=shift)
                visible.case_safe_softmax(fn, s, -1, quiet=True,
                                          name=f"safe_softmax on {dtype_name(dtype)} scores [5, 9] around "
                                               f"{shift:+.0e}, with a fully masked row")


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
    # Every case in both dtypes; every other launch on scores and an output whose rows and
    # batch entries lie apart in memory (all four strides must be used).
    for index, (B, M, N, causal, lengths) in enumerate(KERNEL_CASES):
        for dtype in DTYPES:
            x = visible.make_scores(B, M, N, seed=100 + index, dtype=dtype)
            visible.case_kernel(kernel, x, causal=causal, lengths=lengths, gaps=(index + dtype.itemsize) % 2 == 1,
                                quiet=True)
    for seed in SEEDS:
        g = _generator(seed)
        lengths = torch.randint(0, 48, (3,), generator=g).tolist()
        visible.case_kernel(kernel, visible.make_scores(3, 5, 47, seed=seed), causal=bool(seed % 2),
                            lengths=lengths, gaps=seed % 2 == 0, quiet=True)
    # Rows wider than any fixed block; scores far from zero both ways (with fully masked
    # rows); a row whose sum of exps passes the float16 max.
    for (B, M, N), causal, lengths, seed in [((1, 2, 5003), False, [4000], 400), ((1, 3, 8193), True, None, 401)]:
        for dtype in DTYPES:
            visible.case_kernel(kernel, visible.make_scores(B, M, N, seed=seed, dtype=dtype), causal=causal,
                                lengths=lengths, gaps=seed % 2 == 0, label=" (wide rows)", quiet=True)
    for seed, dtype in zip(SEEDS, DTYPES + DTYPES[:1]):
        x = visible.make_scores(3, 5, 40 + seed, seed=seed, dtype=dtype, kind="extreme")
        visible.case_kernel(kernel, x, causal=True, lengths=[40 + seed, 0, 7], gaps=seed % 2 == 1,
                            label=", far from zero both ways", quiet=True)
    x = visible.make_scores(1, 1, 65800, seed=402, kind="long")
    visible.case_kernel(kernel, x, causal=False, lengths=[65790], quiet=True,
                        label=" (a long row: its sum of exps passes the float16 max)")


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
    # Non-contiguous views: their rows are not one after another in memory.
    for dtype, seed in zip(DTYPES, (24, 25, 26)):
        x = randn(3, 6, 41, dtype=dtype, device=DEVICE, seed=seed) * 4
        for label, view in visible.layouts(x, seed=seed + 10).items():
            visible.case_wrapper(fn, kernel, view, causal=True, lengths=[41, 0, 17], quiet=True,
                                 name=f"masked_softmax on {dtype_name(dtype)} scores [3, 6, 41], {label}, "
                                      "causal, lengths=[41, 0, 17]")
        visible.case_wrapper(fn, kernel, visible.layouts(x[0], seed=seed)["a transposed view"], causal=False,
                             quiet=True, name=f"masked_softmax on {dtype_name(dtype)} scores [6, 41] (a transposed view)")
    # Rows wider than any fixed block, scores far from zero both ways, a long float16 row.
    for shape, dtype, causal, lengths, seed in [((1, 3, 5003), torch.float32, True, [4999], 27),
                                                ((1, 9001), torch.float16, False, [8000], 28),
                                                ((1, 2, 8193), torch.float32, False, None, 29)]:
        x = randn(*shape, dtype=dtype, device=DEVICE, seed=seed) * 4
        visible.case_wrapper(fn, kernel, x, causal=causal, lengths=lengths, quiet=True,
                             name=f"masked_softmax on {dtype_name(dtype)} scores {list(shape)}, "
                                  f"causal={causal}, lengths={lengths}")
    for dtype, seed in zip(DTYPES, (30, 31, 32)):
        x = visible.make_scores(3, 5, 44, seed=seed, dtype=dtype, kind="extreme").to(DEVICE)
        visible.case_wrapper(fn, kernel, x, causal=True, lengths=[44, 0, 30], quiet=True,
                             name=f"masked_softmax on {dtype_name(dtype)} scores [3, 5, 44] far from zero "
                                  "both ways, causal, lengths=[44, 0, 30]")
    x = visible.make_scores(1, 1, 65800, seed=33, kind="long").to(DEVICE)[0]
    visible.case_wrapper(fn, kernel, x, causal=False, lengths=[65790], quiet=True,
                         name="masked_softmax on float16 scores [1, 65800], causal=False, lengths=[65790]: "
                              "a sum of exps past the float16 max")
    check_rejects([(f"{bad.dim()}-D scores (they must be 2-D or 3-D)", lambda bad=bad: fn(bad))
                   for bad in (torch.ones(3, device=DEVICE), torch.ones(2, 2, 3, 4, device=DEVICE))],
                  name="masked_softmax")
