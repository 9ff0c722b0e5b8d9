"""Reference forward kernels (modules 04, 05 and the tuned forward) against float64.

On a CPU these run through Triton's interpreter at small sizes (the whole file in well
under a minute and a half); on a CUDA GPU the same tests run compiled, plus bf16 and
larger shapes.
"""
import zlib

import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch
import torch.nn.functional as F

from course.testing import assert_close, assert_not_trivial, count_launches, guarded_input
from solutions.flash_forward import (flash_attention, flash_attention_blocked,
                                     flash_attention_kernel, flash_grid)
from solutions.flash_tuned import flash_attention_forward
from solutions.naive_attention import attention_reference, attention_scores, naive_attention

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"

# (B, H, Hkv, Nq, Nk, D, causal, dtype, layout). Ragged lengths, Nq != Nk both ways,
# K/V shorter than one block, GQA and MQA, head dims that are not powers of two, and
# "bnhd": q/k/v made as [B, N, H, D] and viewed as [B, H, N, D] (non-contiguous).
CASES = [
    (2, 2, 2, 97, 97, 32, False, torch.float32, "bhnd"),
    (2, 2, 2, 97, 97, 32, True, torch.float16, "bhnd"),
    (2, 4, 2, 61, 97, 16, True, torch.float32, "bnhd"),
    (2, 2, 1, 97, 61, 64, False, torch.float16, "bnhd"),
    (2, 2, 2, 64, 7, 24, False, torch.float32, "bhnd"),
    (2, 3, 3, 40, 7, 24, True, torch.float16, "bnhd"),
    (2, 2, 2, 70, 130, 64, True, torch.float32, "bhnd"),
]
if GPU:
    CASES += [
        (2, 4, 2, 97, 61, 64, True, torch.bfloat16, "bnhd"),
        (2, 4, 4, 1000, 1000, 128, True, torch.bfloat16, "bhnd"),
        (2, 4, 1, 777, 1025, 128, False, torch.float16, "bnhd"),
        (2, 2, 2, 300, 300, 256, True, torch.float16, "bhnd"),
        (2, 2, 2, 300, 517, 96, False, torch.bfloat16, "bnhd"),
        (2, 2, 2, 250, 250, 20, True, torch.float16, "bnhd"),
        (1, 8, 8, 2048, 2048, 64, True, torch.float16, "bhnd"),
    ]

IMPLS = {"teaching": flash_attention, "tuned": flash_attention_forward}


def make_qkv(B, H, Hkv, Nq, Nk, D, dtype, layout="bhnd", seed=0):
    g = torch.Generator().manual_seed(seed)

    def one(h, n):
        if layout == "bnhd":
            x = torch.randn(B, n, h, D, generator=g).transpose(1, 2)
        else:
            x = torch.randn(B, h, n, D, generator=g)
        return x.to(device=DEVICE, dtype=dtype)

    return one(H, Nq), one(Hkv, Nk), one(Hkv, Nk)


def reference64(q, k, v, causal, sm_scale=None):
    """(o, lse) in float64 from the same inputs."""
    q, k, v = (t.double() for t in (q, k, v))
    o = attention_reference(q, k, v, causal=causal, sm_scale=sm_scale)
    return o, attention_scores(q, k, causal, sm_scale).logsumexp(-1)


def case_id(c):
    B, H, Hkv, Nq, Nk, D, causal, dtype, layout = c
    return f"B{B}H{H}kv{Hkv}-q{Nq}k{Nk}-D{D}-{'causal' if causal else 'full'}-{str(dtype)[6:]}-{layout}"


def test_flash_grid():
    assert flash_grid(8, 1, 1, 2) == (4, 1, 1)  # 8 queries in blocks of 2
    assert flash_grid(97, 2, 3, 32) == (4, 6, 1)
    assert flash_grid(16384, 1, 1, 128) == (128, 1, 1)


def test_reference_equals_sdpa():
    q, k, v = make_qkv(2, 4, 2, 33, 45, 16, torch.float64)
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        assert_close(attention_reference(q, k, v, causal=causal), expected, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_blocked_matches_reference(causal):
    for seed in range(3):
        q, k, v = make_qkv(2, 4, 2, 45, 37, 16, torch.float32, "bnhd", seed=seed)
        o = flash_attention_blocked(q, k, v, block_q=16, block_k=8, causal=causal)
        assert_close(o, reference64(q, k, v, causal)[0], name="blocked output")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_flash_forward(impl, case):
    *shape, causal, dtype, layout = case
    q, k, v = make_qkv(*shape, dtype, layout, seed=zlib.crc32(case_id(case).encode()) % 1000)
    o, lse = IMPLS[impl](q, k, v, causal=causal)
    o_ref, lse_ref = reference64(q, k, v, causal)
    assert o.dtype == dtype and o.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    assert_not_trivial(o)
    assert_close(o, o_ref, dim_names=("b", "h", "row", "col"), quiet=True)
    assert_close(lse, lse_ref, name="lse", atol=1e-3, rtol=1e-3, quiet=True)


@pytest.mark.parametrize("impl", IMPLS)
def test_seeds_and_scale(impl):
    """Fresh inputs each seed, and a caller-given scale used exactly once."""
    for seed in (1, 2, 3):
        q, k, v = make_qkv(1, 2, 2, 50, 50, 32, torch.float32, seed=seed)
        o, lse = IMPLS[impl](q, k, v, causal=seed % 2 == 0, sm_scale=0.3)
        o_ref, lse_ref = reference64(q, k, v, seed % 2 == 0, sm_scale=0.3)
        assert_close(o, o_ref, quiet=True)
        assert_close(lse, lse_ref, name="lse", atol=1e-3, rtol=1e-3, quiet=True)


def test_teaching_kernel_masks_its_loads():
    """Inputs inside NaN margins: a missing load mask would pull NaN into the output."""
    q, k, v = (guarded_input(t) for t in make_qkv(1, 2, 2, 45, 21, 24, torch.float32, seed=5))
    o, _ = flash_attention(q, k, v, block_q=32, block_k=16)
    assert not torch.isnan(o).any()
    assert_close(o, reference64(q, k, v, False)[0], quiet=True)


def test_teaching_kernel_block_sizes():
    """Several key blocks per query block and the reverse, both causal."""
    q, k, v = make_qkv(1, 2, 2, 70, 70, 16, torch.float32, seed=6)
    for bq, bk in ((16, 64), (64, 16)):
        o, _ = flash_attention(q, k, v, causal=True, block_q=bq, block_k=bk)
        assert_close(o, reference64(q, k, v, True)[0], quiet=True)


def test_launches_a_triton_kernel():
    q, k, v = make_qkv(1, 1, 1, 16, 16, 16, torch.float32)
    with count_launches(flash_attention_kernel) as n:
        flash_attention(q, k, v)
    assert n[0] == 1


@pytest.mark.parametrize("causal", [False, True])
def test_naive_attention(causal):
    for dtype, shape in ((torch.float32, (2, 2, 2, 45, 37, 16)),
                         (torch.float16, (2, 4, 2, 33, 33, 32))):
        q, k, v = make_qkv(*shape, dtype, "bnhd", seed=7)
        o = naive_attention(q, k, v, causal=causal)
        assert o.dtype == dtype
        assert_not_trivial(o)
        assert_close(o, reference64(q, k, v, causal)[0], quiet=True)


ALL = {**IMPLS, "blocked": lambda q, k, v: flash_attention_blocked(q, k, v, 16, 16),
       "naive": naive_attention}


@pytest.mark.parametrize("impl", ALL)
def test_bad_inputs(impl):
    fn = ALL[impl]
    q, k, v = make_qkv(1, 4, 2, 16, 16, 32, torch.float32)
    with pytest.raises(ValueError, match="4 dims"):
        fn(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="one dtype"):
        fn(q, k.half(), v)
    with pytest.raises(TypeError, match="dtype"):
        fn(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn(q.tolist(), k, v)
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        fn(q[:, :3], k, v)
    with pytest.raises(ValueError, match="head_dim"):
        fn(q, k[..., :16], v[..., :16])
    with pytest.raises(ValueError, match="not supported"):
        fn(*(torch.randn(1, 1, 4, 8, device=DEVICE) for _ in range(3)))
    with pytest.raises(ValueError, match="not supported"):
        fn(*(torch.randn(1, 1, 4, 264, device=DEVICE) for _ in range(3)))
    with pytest.raises(ValueError, match="same shape"):
        fn(q, k, v[:, :, :8])
    with pytest.raises(ValueError, match="one device"):
        fn(q, k.to("meta"), v)
