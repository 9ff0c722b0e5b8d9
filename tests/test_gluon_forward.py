"""The tuned forward's Gluon kernel (solutions/flash_gluon.py): where it runs, and what it
computes. Triton's interpreter has no Gluon, so its results are checked on a Hopper GPU
with Triton 3.6 only; which inputs it takes is checked everywhere.
"""
import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch
import triton

from course.testing import assert_close, assert_not_trivial
from course.checks.flash_forward import attention_values
from solutions import flash_backward, flash_tuned
from tests.test_backward_kernels import check_grads, reference
from tests.test_forward_kernels import make_qkv, reference64

HOPPER = (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
          and triton.__version__.startswith(flash_tuned.GLUON_TRITON))
on_hopper = pytest.mark.skipif(not HOPPER, reason="Gluon runs on a Hopper GPU with Triton 3.6 "
                                                  "(no interpreter)")


class OnHopper:
    """A CPU tensor that answers as a CUDA one would: gluon_takes only reads its dtype,
    shape, layout and address."""

    def __init__(self, t, offset=0):
        self.t, self.offset = t, offset
        self.is_cuda, self.dtype, self.shape, self.device = True, t.dtype, t.shape, "cuda:0"

    def is_contiguous(self):
        return self.t.is_contiguous()

    def data_ptr(self):
        return self.t.data_ptr() + self.offset


def test_gluon_takes_only_what_its_kernel_reads(monkeypatch):
    monkeypatch.setattr(flash_tuned, "INTERPRET", False)
    monkeypatch.setattr(flash_tuned, "TRY_GLUON", True)
    monkeypatch.setattr(flash_tuned, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(triton, "__version__", "3.6.0")

    def takes(B=2, H=4, Hkv=2, Nq=300, Nk=300, D=128, dtype=torch.float16, layout="bhnd", offset=0,
              causal=None):
        q, k, v = (OnHopper(t.to(dtype), offset)
                   for t in make_qkv(B, H, Hkv, Nq, Nk, D, torch.float32, layout))
        if causal is None:
            return flash_tuned.gluon_takes(q, k, v)
        return flash_tuned.gluon_forward_takes(q, k, v, causal)

    assert takes() and takes(dtype=torch.bfloat16) and takes(Hkv=4) and takes(Nq=1, Nk=1)
    assert not takes(dtype=torch.float32)             # no fp32 products in it
    assert takes(D=64) and not takes(D=96)
    # the forward at D = 64 without a causal mask: short sequences only (longer, the
    # Triton kernel read faster); D = 128 and causal D = 64 at any length
    n_max = flash_tuned.GLUON_D64_FULL_MAX_N
    assert takes(D=64, Nq=n_max, Nk=n_max, causal=False) and takes(D=64, Nq=n_max + 1, Nk=n_max + 1, causal=True)
    assert not takes(D=64, Nq=n_max + 1, Nk=n_max + 1, causal=False)
    assert takes(Nq=n_max + 1, Nk=n_max + 1, causal=False)
    assert not takes(D=64, Nk=257, causal=True)       # gluon_takes still decides first
    assert not takes(Nk=257)                          # its causal mask is the square one
    assert not takes(layout="bnhd") and not takes(layout="dmajor")  # descriptors over [B*H, N, D]
    assert not takes(offset=2)                        # TMA wants 16-byte-aligned addresses
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    assert not takes()                                # Gluon's API moves between releases
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(flash_tuned, "_capability", lambda device: (8, 0))
    assert not takes()                                # no TMA or wgmma before Hopper
    monkeypatch.setattr(flash_tuned, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(flash_tuned, "TRY_GLUON", False)
    assert not takes()                                # FLASH_TUNED_GLUON=0


def gluon_forward(q, k, v, causal, scale=None, programs=None):
    """flash_gluon.forward, with its output and lse made as the tuned forward makes them."""
    from solutions import flash_gluon
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    flash_gluon.forward(q, k, v, o, lse, causal, q.shape[-1] ** -0.5 if scale is None else scale, programs)
    return o, lse


def check(o, lse, q, k, v, causal, scale=None, label=""):
    o_ref, lse_ref = reference64(q, k, v, causal, scale)
    assert_not_trivial(o)
    assert_close(o, o_ref, name=f"o {label}", dim_names=("b", "h", "row", "col"), quiet=True)
    assert_close(lse, lse_ref, name=f"lse {label}", atol=1e-3, rtol=1e-3, quiet=True)


# Lengths at the ring's edges: one key block, 2, 3 and 5 (odd and even rounds of its two
# or three slots), ragged ones (the last block masked: keys past N), shorter than a block, and 1.
LENGTHS = (1, 77, 128, 129, 200, 256, 383, 640, 1000)


@on_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_forward_matches_float64(causal, D, dtype):
    for N in LENGTHS:  # 4 query heads on 2 K/V heads: head bh reads K/V head bh // 2
        q, k, v = make_qkv(2, 4, 2, N, N, D, dtype, seed=N * 7 + D + causal)
        o, lse = gluon_forward(q, k, v, causal)
        check(o, lse, q, k, v, causal, label=f"N={N} D={D} causal={causal} {dtype}")


@on_hopper
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_forward_with_many_tiles_per_program(causal, D):
    """The kernel is persistent: each program walks tiles, its K/V ring, Q buffers and O
    buffer carried from one tile to the next. Few programs make long walks at small
    sizes (1 program: every tile; 3 and 7: uneven shares, odd and even tile counts per
    head), and a large case has ~15 tiles per SM."""
    for programs in (1, 3, 7):
        for N in (77, 383, 1000):
            q, k, v = make_qkv(2, 4, 2, N, N, D, torch.float16, seed=N + programs)
            o, lse = gluon_forward(q, k, v, causal, programs=programs)
            check(o, lse, q, k, v, causal, label=f"N={N} D={D} causal={causal} programs={programs}")
    q, k, v = make_qkv(8, 16, 4, 2048, 2048, D, torch.bfloat16, seed=9)
    o, lse = gluon_forward(q, k, v, causal)
    check(o, lse, q, k, v, causal, label=f"N=2048 D={D} causal={causal} B=8 H=16")


@on_hopper
@pytest.mark.parametrize("kind", ["extreme", "big_v", "big_v_negative"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gluon_forward_extreme_values_and_a_given_scale(dtype, kind):
    """Module 05's extreme inputs: rows of scores shifted by +-65,536 (a max to subtract
    before any exp), and V about +-2000 (an accumulator far past fp16's range before the
    division); causal or not, with the default scale and a caller's."""
    q, k, v = (t.to("cuda", dtype) for t in attention_values(2, 2, 300, 300, 128, dtype, seed=5, kind=kind))
    for causal in (False, True):
        for scale in (None, 0.05):
            o, lse = gluon_forward(q, k, v, causal, scale)
            check(o, lse, q, k, v, causal, scale, label=f"{kind} causal={causal} scale={scale}")


@on_hopper
def test_tuned_forward_runs_gluon_only_where_it_takes_the_inputs():
    for layout, gluon in (("bhnd", True), ("bnhd", False)):
        q, k, v = make_qkv(2, 4, 2, 1000, 1000, 128, torch.bfloat16, layout, seed=3)
        flash_tuned.LAST_CONFIG[0] = None
        o, lse = flash_tuned.flash_attention_forward(q, k, v, causal=True)
        assert (flash_tuned.LAST_CONFIG[0] is flash_tuned.GLUON) == gluon, layout
        check(o, lse, q, k, v, True, label=layout)
    n = flash_tuned.GLUON_D64_FULL_MAX_N + 52  # D = 64 past it: Gluon causal only
    q, k, v = make_qkv(1, 2, 1, n, n, 64, torch.float16, seed=4)
    for causal in (False, True):
        flash_tuned.LAST_CONFIG[0] = None
        o, lse = flash_tuned.flash_attention_forward(q, k, v, causal=causal)
        assert (flash_tuned.LAST_CONFIG[0] is flash_tuned.GLUON) == causal
        check(o, lse, q, k, v, causal, label=f"D=64 N={n} causal={causal}")


@on_hopper
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
def test_training_through_the_gluon_forward(D, dtype, causal):
    """The backward reads the forward's lse: gradients through flash_attention (the
    autograd Function) with the Gluon forward match float64 autograd."""
    q, k, v = make_qkv(2, 4, 2, 333, 333, D, dtype, seed=11)
    do = torch.randn_like(q)
    assert flash_tuned.gluon_forward_takes(q, k, v, causal)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, _ = flash_backward.flash_attention(q, k, v, causal=causal)
    o.backward(do)
    _, *refs = reference(q, k, v, do, causal)
    check_grads((q.grad, k.grad, v.grad), refs, dtype, f"gluon forward {dtype} causal={causal}")


@on_hopper
def test_launches_after_the_first_skip_the_jit_and_match_it(monkeypatch):
    """`flash_tuned.launch_compiled` (the Gluon forward's launch): the first launch of a
    specialization goes through Triton's JIT, later ones call the compiled kernel it
    returned. Each direct launch writes what the JIT launch wrote, bit for bit, also
    after other shapes ran in between; each new shape or dtype has its own first launch
    through the JIT (the key holds every argument's value exactly, so it also tells apart
    what Triton specializes on)."""
    from solutions import flash_gluon
    runs = []
    jit_run = flash_gluon.attn_fwd_kernel.run
    monkeypatch.setattr(flash_gluon.attn_fwd_kernel, "run",
                        lambda *a, **kw: runs.append(1) or jit_run(*a, **kw))
    monkeypatch.setattr(flash_tuned, "_COMPILED", {})
    cases = [(N, causal, dtype) for N in (1, 77, 128) for causal in (False, True)
             for dtype in (torch.float16, torch.bfloat16)]
    first = {}
    for case in cases + cases:  # the second round: every launch direct
        N, causal, dtype = case
        q, k, v = make_qkv(2, 4, 2, N, N, 128, dtype, seed=N)
        o, lse = gluon_forward(q, k, v, causal)
        if case not in first:
            check(o, lse, q, k, v, causal, label=f"N={N} causal={causal} {dtype}")
            first[case] = o, lse
        else:
            assert torch.equal(o, first[case][0]) and torch.equal(lse, first[case][1]), case
    assert len(runs) == len(cases) == len(flash_tuned._COMPILED)


@pytest.mark.skipif(not triton.__version__.startswith(flash_tuned.GLUON_TRITON),
                    reason="the Gluon path's Triton (its descriptor's fields change between releases)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_descriptor_is_the_one_tritons_constructor_makes(dtype):
    """`flash_gluon.descriptor` sets a TensorDescriptor's fields without Triton's checks
    (host time): every field as `TensorDescriptor.from_tensor` over the [B * H, N, D]
    view sets it, and Triton's checks pass on them."""
    import dataclasses
    from solutions import flash_gluon
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    for rows, D in ((32, 64), (64, 128), (128, 128)):
        t = torch.empty(3, 5, 77, D, dtype=dtype)
        ours = flash_gluon.descriptor(t, rows)
        block = [1, rows, D]
        layout = flash_gluon.gl.NVMMASharedLayout.get_default_for(block, flash_gluon.GL_DTYPES[str(dtype)])
        theirs = TensorDescriptor.from_tensor(t.view(-1, 77, D), block, layout)
        for field in dataclasses.fields(TensorDescriptor):
            a, b = getattr(ours, field.name), getattr(theirs, field.name)
            if field.name == "base":
                assert a.data_ptr() == b.data_ptr() and a.dtype == b.dtype
            else:
                assert list(a) == list(b) if field.name in ("shape", "strides", "block_shape") else a == b, field.name
        TensorDescriptor(ours.base, ours.shape, ours.strides, ours.block_shape, ours.layout)  # its checks


def test_gluon_file_imports_without_a_gpu():
    """The tuned forward imports it only on the Hopper path, but it must stay importable
    (docs, the benchmark's workers) with any Triton here."""
    from solutions import flash_gluon
    from triton.experimental.gluon._runtime import GluonJITFunction
    assert isinstance(flash_gluon.attn_fwd_kernel, GluonJITFunction)
    assert flash_gluon.BLOCK_N == 2 * flash_gluon.BLOCK_M  # causal: one diagonal block per program


def test_gluon_ring_fits_in_shared_memory():
    """Each head dim's K/V slots (`flash_gluon.NUM_BUF`) fit beside the Q buffers (two per
    consumer) and the O buffers (one per consumer) in a Hopper SM's 227 KB: a launch past
    it fails on the GPU only."""
    from solutions import flash_gluon
    assert set(flash_tuned.GLUON_HEAD_DIMS) <= set(flash_gluon.NUM_BUF)
    for D, slots in flash_gluon.NUM_BUF.items():
        q_and_o = (2 * 2 + 2) * flash_gluon.BLOCK_M * D
        k_and_v = 2 * slots * flash_gluon.BLOCK_N * D
        assert (q_and_o + k_and_v) * 2 <= 227 * 1024, D  # fp16 / bf16 bytes
