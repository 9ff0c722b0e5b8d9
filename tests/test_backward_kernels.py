"""Module 08's answer key: the FlashAttention backward kernels (solutions/flash_backward.py).

Gradients are compared with float64 autograd through plain attention, on fresh random
inputs (the seed is in every failure message), ragged and unequal lengths, causal and
not, grouped-query heads, non-contiguous layouts, fused (atomic dQ) and unfused dQ.
On a CPU the kernels run in Triton's interpreter: sizes stay small.
"""
import random

import course  # noqa: F401  (picks GPU or interpreter before triton is imported)
import pytest
import torch

from course.testing import CheckFailed, assert_close, count_launches, guarded_input, randn
from solutions import flash_backward as fb
from solutions import flash_backward_d256 as d256
from solutions import flash_backward_split as split
from solutions.naive_attention import attention_reference, attention_scores

DEVICE = course.DEVICE
ON_GPU = DEVICE == "cuda"


def fresh_seed():
    return random.randrange(2**31)


def _inputs(seed, B=1, H=2, Hkv=2, Nq=40, Nk=40, D=32, dtype=torch.float32):
    """q, k, v, dO: fresh random, seeds seed .. seed + 3."""
    return [randn(B, h, n, D, dtype=dtype, device=DEVICE, seed=seed + i)
            for i, (h, n) in enumerate([(H, Nq), (Hkv, Nk), (Hkv, Nk), (H, Nq)])]


def reference(q, k, v, do, causal, sm_scale=None):
    """(o, dq, dk, dv) by float64 autograd through plain attention (GQA by repetition)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o = attention_reference(q64, k64, v64, causal, sm_scale)
    o.backward(do.double())
    return o.detach(), q64.grad, k64.grad, v64.grad


def tolerances(dtype, ref):
    """(atol, rtol): fp32 is near-exact on a CPU (TF32-free GPU dots too: dot_precision
    is "ieee" for fp32); half precision scales with the gradient's own size."""
    if dtype == torch.float32:
        return 1e-4, 1e-4
    size = max(1.0, float(ref.abs().max()))
    return (1e-2 if dtype == torch.float16 else 2e-2) * size, 1e-2


def check_grads(grads, refs, dtype, label, mistakes=None):
    for name, got, want in zip(("dq", "dk", "dv"), grads, refs):
        atol, rtol = tolerances(dtype, want)
        assert got.dtype == dtype, f"{name} should be {dtype}, got {got.dtype}"
        assert_close(got, want, name=f"{name} [{label}]", atol=atol, rtol=rtol, quiet=True,
                     dim_names=("batch", "head", "row", "col"),
                     mistakes=(mistakes or {}).get(name))


def run_backward(q, k, v, do, causal, fused, sm_scale=None):
    """Through the autograd Function, as training would: returns (o, dq, dk, dv)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o, lse = fb.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale, fused=fused)
    assert not lse.requires_grad, "lse must be marked non-differentiable"
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


# (B, H, Hkv, Nq, Nk, D): ragged lengths, Nq != Nk both ways, K/V shorter than one block,
# GQA and MQA, and head dims that are not powers of two: 24 padded to 32 inside; 80 and
# 160 split into two column blocks (64 + 16, 128 + 32) by the unfused path
# (solutions/flash_backward_split.py) and padded by the fused one.
SHAPES = {
    "ragged-97": (2, 2, 2, 97, 97, 32),
    "nq61-nk97": (1, 2, 2, 61, 97, 64),
    "short-kv-20": (1, 2, 2, 97, 20, 16),
    "gqa-4to2": (1, 4, 2, 64, 61, 32),
    "mqa-d24": (2, 2, 1, 45, 70, 24),
    "split-d80-gqa": (1, 4, 2, 53, 70, 80),
    "split-d160": (1, 1, 1, 45, 38, 160),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("fused", [False, True], ids=["dq-kernel", "fused-atomic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_gradients_match_float64_autograd(shape, causal, fused, dtype):
    B, H, Hkv, Nq, Nk, D = shape
    seed = fresh_seed()
    q, k, v, do = _inputs(seed, B, H, Hkv, Nq, Nk, D, dtype)
    o, *grads = run_backward(q, k, v, do, causal, fused)
    o_ref, *refs = reference(q, k, v, do, causal)
    label = f"seed={seed} shape={shape} causal={causal} fused={fused}"
    atol, rtol = tolerances(dtype, o_ref)
    assert_close(o, o_ref, name=f"o [{label}]", atol=atol, rtol=rtol, quiet=True)
    check_grads(grads, refs, dtype, label)


@pytest.mark.parametrize("fused", [False, True], ids=["dq-kernel", "fused-atomic"])
def test_non_contiguous_inputs_and_grad_output(fused):
    """[B, N, H, D] tensors viewed as [B, H, N, D] (a projection's natural layout), and
    a dO with its own odd strides: the kernels must follow strides, not assume them.
    D = 48: two column blocks (32 + 16) in the unfused path."""
    B, H, Hkv, Nq, Nk, D = 2, 2, 2, 70, 45, 48
    seed = fresh_seed()
    q = randn(B, Nq, H, D, device=DEVICE, seed=seed).transpose(1, 2)
    k = randn(B, Nk, Hkv, D, device=DEVICE, seed=seed + 1).transpose(1, 2)
    v = randn(B, Hkv, D, Nk, device=DEVICE, seed=seed + 2).transpose(2, 3)  # head dim not the fastest axis
    do = randn(B, Nq, 2 * D, H, device=DEVICE, seed=seed + 3)[:, :, ::2].permute(0, 3, 1, 2)
    assert not any(t.is_contiguous() for t in (q, k, v, do))
    _, *grads = run_backward(q, k, v, do, True, fused)
    _, *refs = reference(q, k, v, do, True)
    check_grads(grads, refs, torch.float32, f"seed={seed} non-contiguous fused={fused}")


def _off_alignment(t):
    """t's values in a tensor that starts one element into its buffer (2 or 4 bytes off
    a 16-byte boundary), as a slice of a wider buffer would."""
    moved = torch.cat([t.new_zeros(1), t.flatten()])[1:].view(t.shape)
    assert moved.data_ptr() % 16
    return moved


@pytest.mark.parametrize("D", [64, 160] + ([96, 192] if ON_GPU else []))
def test_inputs_off_16_byte_alignment(D):
    """q, k, v and dO one element into their buffers (the H200 faulted on this at
    D = 160 before the wrappers copied such inputs, PERF.md 3f)."""
    shape = (2, 4, 2, 300, 257) if ON_GPU else (1, 2, 1, 45, 38)
    dtype = torch.float16 if ON_GPU else torch.float32
    seed = fresh_seed()
    q, k, v, do = (_off_alignment(t) for t in _inputs(seed, *shape, D, dtype))
    o, *grads = run_backward(q, k, v, do, True, fused=False)
    o_ref, *refs = reference(q, k, v, do, True)
    atol, rtol = tolerances(dtype, o_ref)
    assert_close(o, o_ref, name=f"o [seed={seed} D={D} misaligned]", atol=atol, rtol=rtol, quiet=True)
    check_grads(grads, refs, dtype, f"seed={seed} D={D} misaligned")


def test_grad_output_with_zero_strides():
    """o.sum().backward() hands the backward an expanded dO whose strides are all 0."""
    seed = fresh_seed()
    q, k, v, _ = _inputs(seed, Nq=40, Nk=33, D=16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fb.flash_attention(q, k, v, causal=True)[0].sum().backward()
    _, *refs = reference(q, k, v, torch.ones_like(q), True)
    check_grads((q.grad, k.grad, v.grad), refs, torch.float32, f"seed={seed} dO = ones, strides 0")


@pytest.mark.parametrize("fused", [False, True], ids=["dq-kernel", "fused-atomic"])
def test_inputs_expanded_over_batch_and_heads(fused):
    """K and V `expand`ed from one (batch, head) to all: strides 0, which the forward and
    the backward read as they are (the gradients are those of the expanded tensors)."""
    seed = fresh_seed()
    q, k, v, do = _inputs(seed, B=2, H=3, Nq=37, Nk=30, D=16)
    k, v = (t[:1, :1].expand(2, 3, -1, -1) for t in (k, v))
    assert k.stride()[:2] == (0, 0)
    _, *grads = run_backward(q, k, v, do, True, fused)
    _, *refs = reference(q, k, v, do, True)
    check_grads(grads, refs, torch.float32, f"seed={seed} fused={fused} K, V expanded")


@pytest.mark.parametrize("fused", [False, True], ids=["dq-kernel", "fused-atomic"])
def test_no_reads_past_the_inputs(fused):
    """Inputs framed by NaN in memory: a load past a ragged tail would show as NaN."""
    B, H, Hkv, Nq, Nk, D = 1, 2, 2, 45, 53, 40
    seed = fresh_seed()
    q, k, v, do = (guarded_input(t) for t in _inputs(seed, B, H, Hkv, Nq, Nk, D))
    o, lse = fb.flash_attention(q, k, v)
    grads = fb.flash_attention_backward(q, k, v, guarded_input(o), lse, do, fused=fused)
    _, *refs = reference(q, k, v, do, False)
    check_grads(grads, refs, torch.float32, f"seed={seed} NaN-guarded fused={fused}")


def test_custom_scale_reaches_dq_and_dk():
    """sm_scale is used in P and again on dQ and dK (dS = d(scale * Q K^T))."""
    B, H, Hkv, Nq, Nk, D = 1, 2, 2, 50, 40, 32
    seed = fresh_seed()
    q, k, v, do = _inputs(seed, B, H, Hkv, Nq, Nk, D)
    for fused in (False, True):
        _, *grads = run_backward(q, k, v, do, False, fused, sm_scale=0.3)
        _, *refs = reference(q, k, v, do, False, sm_scale=0.3)
        check_grads(grads, refs, torch.float32, f"seed={seed} sm_scale=0.3 fused={fused}")


def test_reference_derivation_matches_autograd():
    """The lesson's hand-derived gradients (dS = P * (dP - delta), ...) equal autograd."""
    for (B, H, Hkv, Nq, Nk, D), causal in [((2, 4, 2, 13, 9, 16), True), ((1, 3, 1, 7, 11, 20), False),
                                           ((1, 2, 2, 16, 16, 16), True)]:
        seed = fresh_seed()
        q, k, v, do = _inputs(seed, B, H, Hkv, Nq, Nk, D)
        o, *refs = reference(q, k, v, do, causal)
        lse = attention_scores(q.double(), k.double(), causal).logsumexp(-1).float()
        grads = fb.attention_backward_reference(q, k, v, o.float(), do, lse, causal)
        for name, got, want in zip(("dq", "dk", "dv"), grads, refs):
            assert_close(got, want, name=f"reference {name} (seed={seed})", atol=1e-5, rtol=1e-5,
                         quiet=True)


# ---------------------------------------------------------------------------------------
# The checks above must fail on the module's classic mistakes.

# A launch config that bypasses the autotuner, so a monkeypatched kernel is the one launched.
DIRECT = {"dkdv": dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2),
          "dq": dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)}


@pytest.mark.parametrize("fused", [False, True], ids=["dq-kernel", "fused-atomic"])
def test_check_catches_delta_from_wrong_tensors(monkeypatch, fused):
    """delta = rowsum(dO * dO) (or anything but dO * O) must fail the gradient check,
    where delta is made: in the dQ kernel (unfused) or the preprocessing kernel (fused)."""
    seed = fresh_seed()
    q, k, v, do = _inputs(seed)
    name = "bwd_preprocess_kernel" if fused else "bwd_dq_kernel"
    real = getattr(fb, name)
    o_at, do_at = (0, 1) if fused else (4, 3)  # where O and dO sit among the kernel's arguments

    class WrongDelta:  # launches the real kernel with dO in place of O
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                args = list(args)
                args[o_at] = args[do_at]
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(fb, name, WrongDelta())
    o, lse = fb.flash_attention(q, k, v, causal=True)
    grads = fb.flash_attention_backward(q, k, v, o, lse, do, causal=True, fused=fused, config=DIRECT)
    _, *refs = reference(q, k, v, do, True)
    with pytest.raises(CheckFailed):
        check_grads(grads, refs, torch.float32, f"seed={seed} planted: wrong delta")


def test_check_catches_missing_or_doubled_scale_on_dk():
    seed = fresh_seed()
    q, k, v, do = _inputs(seed)
    _, dq, dk, dv = run_backward(q, k, v, do, False, False)
    _, *refs = reference(q, k, v, do, False)
    check_grads((dq, dk, dv), refs, torch.float32, f"seed={seed}")
    scale = q.shape[-1] ** -0.5
    for planted in (dk / scale, dk * scale):
        with pytest.raises(CheckFailed):
            check_grads((dq, planted, dv), refs, torch.float32, f"seed={seed} planted: dk scale")
    with pytest.raises(CheckFailed):  # and on dQ
        check_grads((dq / scale, dk, dv), refs, torch.float32, f"seed={seed} planted: dq scale")


def test_backward_runs_triton_kernels():
    q, k, v, do = _inputs(fresh_seed(), Nq=33, Nk=33, D=16)
    with count_launches(fb.bwd_preprocess_kernel) as pre, count_launches(fb.bwd_dkdv_kernel) as dkdv, \
            count_launches(fb.bwd_dq_kernel) as dq_launches:
        run_backward(q, k, v, do, False, False)  # dQ kernel (with delta), then dK/dV
        run_backward(q, k, v, do, False, True)   # preprocessing, then dK/dV with atomic dQ
    # (on a GPU the first call of a shape also launches each autotune candidate)
    assert pre[0] == 1 and dkdv[0] >= 2 and dq_launches[0] >= 1, (pre, dkdv, dq_launches)


def test_split_head_dims_run_the_split_kernels():
    """D = 96 (64 + 32 columns) goes to the split kernels, unfused; fused keeps the padded one."""
    q, k, v, do = _inputs(fresh_seed(), Nq=33, Nk=40, D=96)
    with count_launches(split.bwd_dq_split_kernel) as dq_split, \
            count_launches(split.bwd_dkdv_split_kernel) as dkdv_split, \
            count_launches(fb.bwd_dkdv_kernel) as dkdv:
        run_backward(q, k, v, do, True, False)
        unfused = (dq_split[0], dkdv_split[0], dkdv[0])
        run_backward(q, k, v, do, True, True)
        fused = (dq_split[0] - unfused[0], dkdv_split[0] - unfused[1], dkdv[0] - unfused[2])
    assert unfused[0] >= 1 and unfused[1] >= 1 and unfused[2] == 0, unfused
    assert fused[0] == 0 and fused[1] == 0 and fused[2] >= 1, fused


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [256, 200])
def test_256_columns_run_the_rows_dkdv_kernel(D, causal, monkeypatch):
    """At 256 columns (D = 256, or 200 padded to 256: nothing splits it) the unfused
    backward's dK/dV is flash_backward_d256's kernel (scores queries-along-rows), with the
    gradients right on ragged lengths with GQA; fused, or with flash_tuned.ROWS_D256 off
    (the benchmark's "ours-padded"), module 08's."""
    seed = fresh_seed()
    q, k, v, do = _inputs(seed, 1, 4, 2, 97 if not causal else 70, 70, D)
    _, *refs = reference(q, k, v, do, causal)
    launches = {}
    for name, fused, rows in (("rows", False, True), ("fused", True, True), ("off", False, False)):
        monkeypatch.setattr(fb.flash_tuned, "ROWS_D256", rows)
        with count_launches(d256.bwd_dkdv_rows_kernel) as by_rows, count_launches(fb.bwd_dkdv_kernel) as m08:
            _, *grads = run_backward(q, k, v, do, causal, fused)
        launches[name] = (by_rows[0] > 0, m08[0] > 0)
        check_grads(grads, refs, torch.float32, f"seed={seed} {name} causal={causal}")
    assert launches == {"rows": (True, False), "fused": (False, True), "off": (False, True)}, launches


def test_no_shortlisted_tile_has_warps_compute_the_same_scores():
    """Triton lays a product whose result feeds another product (the scores: S feeds P V,
    S^T feeds dV's) out with every warp along its rows, 16 rows a warp for Hopper's
    wgmma: with fewer rows than 16 x num_warps, warps compute the same rows (PERF.md 4c).
    So every tile of the lists has at least that many score rows: the forward's query
    block, the dQ and the rows kernels' query block, module 08's and the split dK/dV
    kernels' key block. The exceptions are module 08's kernel at 256 columns, which the
    tuned path runs only fused or with ROWS_D256 off ("ours-padded")."""
    ft = fb.flash_tuned
    tiles = {"forward": [t for lists in (ft.SHORTLIST, ft.SHORTLIST_FP8, ft.SHORTLIST_TMA, ft.SHORTLIST_TMA_FP8)
                         for entries in lists.values() for t in entries if t[4:5] != ("ws",)],
             "dQ": [t for lists in (fb.SHORTLIST, split.SHORTLIST) for t in sum(lists["dq"].values(), [])],
             "rows dK/dV": d256.SHORTLIST,
             "dK/dV": [t for lists in (fb.SHORTLIST, split.SHORTLIST) for which in ("dkdv", "dkdv_fused")
                       for width, entries in lists.get(which, {}).items() if width != 256 for t in entries]}
    score_rows = {"forward": 0, "dQ": 0, "rows dK/dV": 0, "dK/dV": 1}  # index of the rows' block
    short = [(kind, t) for kind, entries in tiles.items() for t in entries if t[score_rows[kind]] < 16 * t[2]]
    assert not short, f"tiles whose warps would compute the same score rows: {short}"
    assert all(t[1] < 16 * t[2] for t in fb.SHORTLIST["dkdv"][256] + fb.SHORTLIST["dkdv_fused"][256][:1]), \
        "module 08's 256 tiles: the exceptions named above (update this test if they change)"


def _shortlisted():
    """(id, D, fp32, fused, config, rows) for every config the backward's autotuners may
    pick on a GPU (module 08's kernels per head-dim bucket, the split kernels per width
    class, the D = 256 dK/dV kernel, and the fp32 lists of all), the other kernel at its
    bucket's first config. rows: flash_tuned.ROWS_D256, False for module 08's own 256
    bucket (which the benchmark's "ours-padded" runs)."""
    def tiles(t):
        return dict(BLOCK_M=t[0], BLOCK_N=t[1], num_warps=t[2], num_stages=t[3])

    def fp32(table):
        return {which: {"fp32": entries} for which, entries in table.items()}
    tables = [("padded", fb.SHORTLIST, {64: 64, 128: 128, 256: 256}),
              ("split", split.SHORTLIST, {128: 96, 192: 160}),
              ("padded", fp32(fb.FP32_SHORTLIST), {"fp32": 24}),
              ("split", fp32(split.FP32_SHORTLIST), {"fp32": 48})]
    cases = []
    for kind, table, dims in tables:
        for which, buckets in table.items():
            other = "dq" if which == "dkdv" else "dkdv"
            for bucket, entries in buckets.items():
                for t in entries:
                    config = {"dkdv": tiles(t)} if which == "dkdv_fused" else {
                        which: tiles(t), other: tiles(table[other][bucket][0])}
                    cases.append((f"{kind}-{which}-{bucket}-{'x'.join(map(str, t))}", dims[bucket],
                                  bucket == "fp32", which == "dkdv_fused", config, kind != "padded"))
    rows = [(t, fb.SHORTLIST["dq"][256][0], False) for t in d256.SHORTLIST]
    rows += [(fb.FP32_SHORTLIST["dkdv"][0], fb.FP32_SHORTLIST["dq"][0], True)]
    for t, dq, fp32_ in rows:
        cases.append((f"rows-dkdv-256-{'fp32-' if fp32_ else ''}{'x'.join(map(str, t))}", 256, fp32_,
                      False, {"dkdv": tiles(t), "dq": tiles(dq)}, True))
    return cases


SHORTLISTED = _shortlisted()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D, fp32, fused, config, rows", [c[1:] for c in SHORTLISTED],
                         ids=[c[0] for c in SHORTLISTED])
def test_every_shortlisted_config_computes_the_gradients(D, fp32, fused, config, rows, causal,
                                                         monkeypatch):
    """Each tile shape the autotuners may choose, on lengths ragged for every tile (97
    queries, 70 keys) with GQA: the block ranges (diagonal, unmasked middle, ragged tail)
    depend on the tiles. fp32 in the interpreter (tiles honoured, warps and stages not);
    on a GPU fp16, except the fp32 configs."""
    monkeypatch.setattr(fb.flash_tuned, "ROWS_D256", rows)
    seed = fresh_seed()
    dtype = torch.float32 if fp32 or not ON_GPU else torch.float16
    q, k, v, do = _inputs(seed, 1, 4, 2, 97, 70, D, dtype)
    o, lse = fb.flash_attention(q, k, v, causal=causal)
    grads = fb.flash_attention_backward(q, k, v, o, lse, do, causal=causal, fused=fused, config=config)
    _, *refs = reference(q, k, v, do, causal)
    check_grads(grads, refs, dtype, f"seed={seed} D={D} fused={fused} causal={causal} {config}")


def test_batches_past_the_grid_limit_run_in_slices(monkeypatch):
    """CUDA holds at most 65535 programs on a grid's second axis, where the backward
    kernels put batch * heads: the tuned backward (and forward) run a larger batch in
    slices of whole batch entries. The cap is made 5 here, so B = 3 with 4 query heads
    runs one entry at a time: every grid within the cap, the gradients right, and
    (without atomics) each entry's as in one launch."""
    grids, launcher = [], fb._launcher

    def spying(config, consts, key):  # records every grid the backward's launches make
        launch = launcher(config, consts, key)
        return lambda kernel, tuned, which, grid, *args, **kwargs: launch(
            kernel, tuned, which, lambda c: grids.append(grid(c)) or grid(c), *args, **kwargs)
    monkeypatch.setattr(fb, "_launcher", spying)
    seed = fresh_seed()
    q, k, v, do = _inputs(seed, B=3, H=4, Hkv=2, Nq=37, Nk=45, D=32)
    refs = reference(q, k, v, do, True)[1:]
    monkeypatch.setattr(fb.flash_tuned, "MAX_GRID_Y", 5)
    sliced = {}
    for fused in (False, True):
        grids.clear()
        sliced[fused] = run_backward(q, k, v, do, True, fused)[1:]
        assert grids and all(g[1] <= 5 for g in grids), f"fused={fused}: grids {grids}"
        check_grads(sliced[fused], refs, torch.float32, f"seed={seed} fused={fused}, in slices")
    monkeypatch.setattr(fb.flash_tuned, "MAX_GRID_Y", 65535)
    grids.clear()
    whole = run_backward(q, k, v, do, True, False)[1:]
    assert max(g[1] for g in grids) == 12, f"one launch of B * H programs expected: {grids}"
    for name, a, b in zip(("dq", "dk", "dv"), sliced[False], whole):
        assert torch.equal(a, b), f"{name}: a slice changed the entries it holds (seed={seed})"


# ---------------------------------------------------------------------------------------
# Bad input.

def test_bad_inputs_raise_clear_errors():
    q, k, v, do = _inputs(fresh_seed(), Nq=20, Nk=20, D=16)
    o, lse = fb.flash_attention(q, k, v)
    with pytest.raises(ValueError, match="do"):
        fb.flash_attention_backward(q, k, v, o, lse, do[:, :, :10])
    with pytest.raises(ValueError, match="lse"):
        fb.flash_attention_backward(q, k, v, o, lse[:, :1], do)
    with pytest.raises(ValueError, match="dtype"):
        fb.flash_attention_backward(q, k, v, o, lse, do.half())
    with pytest.raises(ValueError, match="head"):
        fb.flash_attention_backward(q, k[:, :, :, :8], v[:, :, :, :8], o, lse, do)
    with pytest.raises((TypeError, ValueError), match="dtype"):
        fb.flash_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="heads"):
        fb.flash_attention(torch.cat([q, q[:, :1]], 1), k, v)


# ---------------------------------------------------------------------------------------
# Only on a GPU: bf16 (the interpreter computes it wrongly, ARCHITECTURE.md, "Facts about
# the tools"), and head dims above 128 at these lengths (300 x 257), which cost the
# interpreter too much: 160 and 192 run the split kernels (unfused) or module 08's 256
# bucket (fused), 256 the 256 bucket.

@pytest.mark.skipif(not ON_GPU, reason="bf16 and head dims above 128 are only checked on a GPU")
@pytest.mark.parametrize("fused", [False, True], ids=["dq-kernel", "fused-atomic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype, D", [(torch.bfloat16, 128), (torch.float16, 160), (torch.float16, 192),
                                      (torch.float16, 256)], ids=["bf16-D128", "D160", "D192", "D256"])
def test_gpu_only_dtypes_and_head_dims(dtype, D, causal, fused):
    B, H, Hkv, Nq, Nk = 2, 4, 2, 300, 257
    seed = fresh_seed()
    q, k, v, do = _inputs(seed, B, H, Hkv, Nq, Nk, D, dtype)
    _, *grads = run_backward(q, k, v, do, causal, fused)
    _, *refs = reference(q, k, v, do, causal)
    check_grads(grads, refs, dtype, f"seed={seed} {dtype} D={D} causal={causal} fused={fused}")
