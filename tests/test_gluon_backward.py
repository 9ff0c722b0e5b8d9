"""The backward's Gluon kernels (solutions/flash_gluon_backward.py: dK/dV, and dQ at
D = 128): where they run, and what they compute. Triton's interpreter has no Gluon, so its results are checked on a
Hopper GPU with Triton 3.6 only; which inputs it takes is checked everywhere.
"""
import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch
import triton

from course.checks.flash_forward import attention_values
from course.testing import assert_close
from solutions import flash_backward, flash_tuned
from tests.test_backward_kernels import check_grads, reference, run_backward, tolerances
from tests.test_forward_kernels import make_qkv
from tests.test_gluon_forward import OnHopper, on_hopper


def test_gluon_backward_takes_only_what_its_kernels_read(monkeypatch):
    monkeypatch.setattr(flash_tuned, "INTERPRET", False)
    monkeypatch.setattr(flash_tuned, "TRY_GLUON", True)
    monkeypatch.setattr(flash_tuned, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(triton, "__version__", "3.6.0")

    def takes(B=2, H=16, Hkv=8, N=4096, D=128, dtype=torch.float16, layout="bhnd", offset=0, scale=0.1):
        q, k, v = (OnHopper(t.to(dtype), offset)
                   for t in make_qkv(B, H, Hkv, N, N, D, torch.float32, layout))
        return flash_backward.gluon_backward_takes(q, k, v, scale)

    assert takes() and takes(D=64) and takes(dtype=torch.bfloat16) and takes(Hkv=16)
    assert not takes(D=96) and not takes(dtype=torch.float32)
    assert not takes(layout="bnhd") and not takes(offset=2)  # descriptors over [B*H, N, D], TMA's alignment
    assert takes(scale=-0.1) and takes(scale=2.0 ** -100)
    assert not takes(scale=0.0) and not takes(scale=1e-35)   # dK/dV at D = 128 divides lse by the scale
    assert not takes(N=1024, D=64, B=1)  # too little work: the host's launch time bounds the step
    monkeypatch.setattr(flash_backward, "GLUON_BACKWARD_MIN_WORK", 0)
    assert takes(N=77, D=64, B=1)
    monkeypatch.setattr(flash_tuned, "_capability", lambda device: (8, 0))
    assert not takes()                                # no TMA or wgmma before Hopper
    monkeypatch.setattr(flash_tuned, "_capability", lambda device: (9, 0))
    monkeypatch.setattr(flash_tuned, "TRY_GLUON", False)
    assert not takes()                                # FLASH_TUNED_GLUON=0


@pytest.fixture
def gluon_calls(monkeypatch):
    """Every shape runs the Gluon kernels (the work threshold off); returns the list of
    their launches ("dq", "dkdv"), so a test can see which ran."""
    from solutions import flash_gluon_backward
    calls = []
    for name, kernel in (("dq", "dq_delta"), ("dkdv", "dkdv")):
        def counted(*args, name=name, launch=getattr(flash_gluon_backward, kernel)):
            calls.append(name)
            return launch(*args)
        monkeypatch.setattr(flash_gluon_backward, kernel, counted)
    monkeypatch.setattr(flash_backward, "GLUON_BACKWARD_MIN_WORK", 0)
    return calls


def launches(D):
    """The Gluon kernels that one backward at head dim D launches."""
    return ["dq", "dkdv"] if D in flash_backward.GLUON_DQ_HEAD_DIMS else ["dkdv"]


# One query block and several; ragged lengths (rows past N: lse = +inf in the kernel);
# causal diagonals that start inside a block; odd and even counts of the blocks it pairs.
LENGTHS = (1, 77, 128, 200, 383, 640, 1000)


@on_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_backward_matches_float64(gluon_calls, causal, D, dtype):
    for N in LENGTHS:  # 4 query heads on 2 K/V heads: each K/V head sums two heads' blocks
        q, k, v = make_qkv(2, 4, 2, N, N, D, dtype, seed=N * 5 + D + causal)
        do = torch.randn_like(q)
        _, *grads = run_backward(q, k, v, do, causal, fused=False)
        _, *refs = reference(q, k, v, do, causal)
        check_grads(grads, refs, dtype, f"N={N} D={D} causal={causal}")
    assert gluon_calls == launches(D) * len(LENGTHS)


@on_hopper
@pytest.mark.parametrize("kind", ["extreme", "big_v"])
def test_gluon_backward_extreme_values_and_a_given_scale(gluon_calls, kind):
    """Module 05's extreme inputs (rows of scores shifted by +-s, s = 256 in bf16; V about
    +-2000), with the default scale and a caller's, against float64 gradients from the
    same o and lse (`attention_backward_reference`): the backward's inputs. Against
    gradients through the exact forward, dQ with V ~ 2000 is off by up to 15% in any
    FlashAttention backward: delta = rowsum(dO * O) from O rounded to bf16 (the Triton
    kernels' too). With "extreme", dQ is not compared: its first column is s times
    sum_j dS_ij, which is 0 exactly (softmax's gradient sums to 0 along a row) and, from
    dS rounded to bf16 for the product with K, about s * 2^-8 in any kernel; dK and dV
    have no such cancellation."""
    q, k, v = (t.to("cuda", torch.bfloat16) for t in attention_values(2, 2, 300, 300, 128, torch.bfloat16,
                                                                       seed=7, kind=kind))
    do = torch.randn_like(q)
    names = ("dk", "dv") if kind == "extreme" else ("dq", "dk", "dv")
    for causal in (False, True):
        for scale in (None, 0.05):
            o, lse = flash_tuned.flash_attention_forward(q, k, v, causal=causal, sm_scale=scale)
            grads = flash_backward.flash_attention_backward(q, k, v, o, lse, do, causal, scale)
            refs = flash_backward.attention_backward_reference(q, k, v, o, do, lse, causal, scale)
            for name, got, want in zip(("dq", "dk", "dv"), grads, refs):
                if name in names:
                    atol, rtol = tolerances(torch.bfloat16, want)
                    assert_close(got, want, name=f"{name} [{kind} causal={causal} scale={scale}]",
                                 atol=atol, rtol=rtol, quiet=True)
    assert gluon_calls == launches(128) * 4


@on_hopper
def test_backward_runs_gluon_only_where_it_takes_the_inputs(gluon_calls):
    for layout, gluon in (("bhnd", True), ("bnhd", False)):
        q, k, v = make_qkv(2, 4, 2, 500, 500, 128, torch.float16, layout, seed=3)
        do = torch.randn_like(q)
        before = len(gluon_calls)
        _, *grads = run_backward(q, k, v, do, True, fused=False)
        assert (len(gluon_calls) > before) == gluon, layout
        _, *refs = reference(q, k, v, do, True)
        check_grads(grads, refs, torch.float16, layout)


@on_hopper
def test_a_new_thread_runs_the_forward_and_the_backward(gluon_calls):
    """A thread that has not called CUDA yet has no current CUDA context, and Triton 3.6
    encodes host-made TMA descriptors before its launcher makes one current: there the
    Gluon kernels (and the Triton forward's descriptor configs) failed with "invalid
    device context" while the caching allocator served every buffer (no CUDA call on the
    thread before the launch). Autograd's backward thread is such a thread. Each call
    runs first on this thread (buffers cached), then on a new one."""
    import threading
    q, k, v = make_qkv(2, 4, 2, 300, 300, 128, torch.float16, seed=4)
    do = torch.randn_like(q)
    q64, k64, v64 = (t[..., :64].contiguous() for t in (q, k, v))

    def work():
        o, lse = flash_tuned.flash_attention_forward(q, k, v, causal=True)
        grads = flash_backward.flash_attention_backward(q, k, v, o, lse, do, causal=True)
        o64, _ = flash_tuned.flash_attention_forward(q64, k64, v64, causal=True)
        return o.cpu(), [g.cpu() for g in grads], o64.cpu()  # the GPU buffers go back to the cache

    expected = work()
    got = []

    def on_a_new_thread():
        try:
            got.append(work())
        except Exception as e:  # raised again below, on the test's thread
            got.append(e)

    thread = threading.Thread(target=on_a_new_thread)
    thread.start()
    thread.join()
    if isinstance(got[0], Exception):
        raise got[0]
    o, grads, o64 = got[0]
    assert torch.equal(o, expected[0]) and torch.equal(o64, expected[2])
    assert all(torch.equal(g, e) for g, e in zip(grads, expected[1]))
    assert gluon_calls == launches(128) * 2


def test_gluon_backward_file_imports_without_a_gpu():
    """The backward imports it only on the Hopper path, but it must stay importable with
    any Triton here."""
    from solutions import flash_gluon_backward
    from triton.experimental.gluon._runtime import GluonJITFunction
    assert isinstance(flash_gluon_backward.bwd_dkdv_kernel, GluonJITFunction)
    assert isinstance(flash_gluon_backward.bwd_dq_kernel, GluonJITFunction)
    assert flash_gluon_backward.KEYS.value * 2 == flash_gluon_backward.BLOCK_N.value  # two consumers
