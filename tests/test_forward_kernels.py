"""Reference forward kernels (modules 04, 05 and the tuned forward) against float64.

On a CPU these run through Triton's interpreter at small sizes (the whole file in well
under a minute and a half); on a CUDA GPU the same tests run compiled, plus bf16 and
larger shapes.
"""
import types
import zlib

import course  # noqa: F401  (sets TRITON_INTERPRET on a CPU, before triton is imported)
import pytest
import torch
import torch.nn.functional as F

from course.testing import assert_close, assert_not_trivial, count_launches, guarded_input
from solutions.flash_forward import (flash_attention, flash_attention_blocked,
                                     flash_attention_kernel, flash_grid)
from solutions import flash_tuned
from solutions.flash_tuned import flash_attention_forward
from solutions.naive_attention import attention_reference, attention_scores, naive_attention

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"

# (B, H, Hkv, Nq, Nk, D, causal, dtype, layout). Ragged lengths, Nq != Nk both ways,
# K/V shorter than one block, GQA and MQA, head dims that are not powers of two, and
# "bnhd": q/k/v made as [B, N, H, D] and viewed as [B, H, N, D] (non-contiguous);
# "dmajor": stored [B, H, D, N] and viewed as [B, H, N, D] (the head dim strided).
CASES = [
    (2, 2, 2, 97, 97, 32, False, torch.float32, "bhnd"),
    (2, 2, 2, 97, 97, 32, True, torch.float16, "bhnd"),
    (2, 4, 2, 61, 97, 16, True, torch.float32, "bnhd"),
    (2, 2, 1, 97, 61, 64, False, torch.float16, "bnhd"),
    (2, 2, 2, 64, 7, 24, False, torch.float32, "bhnd"),
    (2, 3, 3, 40, 7, 24, True, torch.float16, "bnhd"),
    (2, 2, 2, 70, 130, 64, True, torch.float32, "bhnd"),
    (2, 2, 2, 45, 70, 24, True, torch.float16, "dmajor"),
    # head dims that are not powers of two: two column blocks (128 + 32, 128 + 64)
    (1, 2, 1, 70, 45, 160, True, torch.float32, "bnhd"),
    (1, 2, 2, 33, 70, 192, False, torch.float16, "bhnd"),
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
        (2, 4, 2, 300, 517, 160, False, torch.bfloat16, "bnhd"),
        (2, 2, 2, 1000, 1000, 192, True, torch.float16, "bhnd"),
        (1, 4, 4, 2048, 2048, 128, False, torch.float16, "bhnd"),  # warp-specialized configs (Hopper)
    ]

IMPLS = {"teaching": flash_attention, "tuned": flash_attention_forward}


def make_qkv(B, H, Hkv, Nq, Nk, D, dtype, layout="bhnd", seed=0):
    g = torch.Generator().manual_seed(seed)

    def one(h, n):
        if layout == "bnhd":
            x = torch.randn(B, n, h, D, generator=g).transpose(1, 2)
        elif layout == "dmajor":
            x = torch.randn(B, h, D, n, generator=g).transpose(2, 3)
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


@pytest.mark.skipif(not GPU, reason="a fault of Triton's compiled code; the interpreter has none")
@pytest.mark.parametrize("D", (24, 32))
def test_key_major_k_with_the_default_gpu_tiles(D):
    """Triton 3.6 on an H100 computed K stored [.., D, N] wrongly (or faulted) with the
    default 128 x 64 tiles at D <= 32 in fp16; flash_attention copies such a K."""
    q, k, v = make_qkv(2, 2, 2, 45, 70, D, torch.float16, "dmajor", seed=D)
    for causal in (False, True):
        o, lse = flash_attention(q, k, v, causal=causal)
        o_ref, lse_ref = reference64(q, k, v, causal)
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


def test_launch_compiled_calls_the_jit_once_per_specialization_and_device(monkeypatch):
    """`flash_tuned.launch_compiled`'s bookkeeping, with a stand-in kernel (no GPU here):
    the first launch of each (device, arguments, keywords) goes through the JIT; a repeat
    calls the compiled kernel it returned, with the grid padded to three axes (a grid
    function gets the keywords) and every parameter after the positional ones in the
    kernel's order: from the keywords, a `triton.heuristics` layer's values, or the
    parameter's default. Another device, dtype, value or keyword is another first launch."""
    from types import SimpleNamespace
    calls = []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *args: calls.append(("direct", grid, args))

    class Kernel:  # a JIT function: params in order, with defaults
        params = [SimpleNamespace(name=n, default=d) for n, d in
                  (("x", None), ("n", None), ("A", None), ("EVEN", None), ("B", False), ("C", 5))]

        def __getitem__(self, grid):
            def jit(*args, **kwargs):
                calls.append(("jit", grid, args, kwargs))
                return Compiled()
            return jit

    class Heuristics:  # triton.heuristics over it: EVEN from n and A (no params of its own)
        arg_names = ["x", "n"]
        values = {"EVEN": lambda named: named["n"] % named["A"] == 0}
        fn = Kernel()

        def __getitem__(self, grid):
            return self.fn[grid]

    monkeypatch.setattr(flash_tuned, "_COMPILED", {})
    monkeypatch.setattr(flash_tuned, "cuda_context_on_this_thread", lambda device: None)
    kernel, x = Heuristics(), torch.zeros(4, dtype=torch.float16)
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    grid = lambda kw: (kw["A"] + 1,)  # noqa: E731
    flash_tuned.launch_compiled(kernel, cuda0, grid, x, 8, B=True, A=2, num_warps=4)
    flash_tuned.launch_compiled(kernel, cuda0, grid, x, 8, B=True, A=2, num_warps=4)
    assert calls == [("jit", (3,), (x, 8), dict(B=True, A=2, num_warps=4)),
                     ("direct", (3, 1, 1), (x, 8, 2, True, True, 5))]  # A, EVEN, B, C's default
    for device, arg, n, a in ((cuda1, x, 8, 2), (cuda0, x.bfloat16(), 8, 2), (cuda0, x, 7, 2), (cuda0, x, 8, 3)):
        calls.clear()
        flash_tuned.launch_compiled(kernel, device, grid, arg, n, B=True, A=a, num_warps=4)
        assert [c[0] for c in calls] == ["jit"], (device, arg.dtype, n, a)
    calls.clear()
    flash_tuned.launch_compiled(kernel, cuda0, grid, x, 7, B=True, A=2, num_warps=4)
    assert calls == [("direct", (3, 1, 1), (x, 7, 2, False, True, 5))]  # 7 % 2: EVEN false
    assert len(flash_tuned._COMPILED) == 5


def test_direct_launch_passes_what_tritons_launcher_would(monkeypatch):
    """`direct_launch.DirectLaunch` with stand-ins for Triton 3.6's launcher pieces (no GPU
    here): the C function gets the grid, the stream, the kernel's handle and metadata,
    then the kernel's arguments with each descriptor as its encoding, shape and strides;
    a descriptor is encoded once per base address; launchers it cannot call directly
    (scratch memory, several CTAs, descriptors it cannot find, another layout of the C
    function's leading arguments) give None."""
    from types import SimpleNamespace
    import triton.backends.nvidia.driver as nvidia
    from triton import knobs
    from triton.tools.tensor_descriptor import TensorDescriptor
    from solutions import direct_launch
    encoded, launched = [], []
    # Triton 3.6's layout of the C function's leading arguments (the CPU's Triton may be newer)
    monkeypatch.setattr(nvidia, "_BASE_ARGS_FORMAT", direct_launch.C_HEAD, raising=False)
    monkeypatch.setattr(nvidia, "make_tensordesc_arg", lambda desc, meta: (
        encoded.append(desc.base.data_ptr()) or [("map", desc.base.data_ptr(), meta), *desc.shape, *desc.strides]),
        raising=False)
    monkeypatch.setattr(direct_launch, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_stream=lambda index: 1000 + index)))

    def closure(launcher, tensordesc_indices, tensordesc_meta):  # as Triton wraps its C function
        def inner(*args):
            return launcher(tensordesc_indices, tensordesc_meta, *args)
        return inner

    def compiled(launch, **run):
        run = {"global_scratch_size": 0, "profile_scratch_size": 0, "num_ctas": 1, **run}
        return SimpleNamespace(function=77, packed_metadata=(4, 1, 0), run=SimpleNamespace(
            launch=launch, launch_cooperative_grid=False, launch_pdl=True, **run))

    def c_launch(*args):
        launched.append(args)

    x, y = torch.randn(8, 16), torch.randn(8, 16)
    desc = TensorDescriptor(y, [8, 16], [16, 1], [4, 16])
    template = direct_launch.rebased(desc, None)
    kernel = compiled(closure(c_launch, {1}, ["meta"]))
    direct = direct_launch.DirectLaunch.of(kernel, (3, 2, 1), [x, desc, 5, 0.5, "A"], [(0, 0)], [(1, 1, template)], 1)
    assert direct.template == [None, None, 8, 16, 16, 1, 5, 0.5, "A"]  # keeps no tensor
    x2, y2 = torch.randn(8, 16), torch.randn(8, 16)
    for _ in range(2):
        direct((x2, y2))
    assert launched[0] == launched[1] == (3, 2, 1, 1001, 77, False, True, None, None, (4, 1, 0), None, None, None,
                                          x2, ("map", y2.data_ptr(), "meta"), 8, 16, 16, 1, 5, 0.5, "A")
    assert encoded == [y.data_ptr(), y2.data_ptr()]  # at the plan's making, then once for y2
    monkeypatch.setattr(direct_launch, "MAPS_MAX", 1)  # full: a new address clears the others
    y3 = torch.randn(8, 16)
    for t in (y3, y2):
        direct((x2, t))
    assert encoded[2:] == [y3.data_ptr(), y2.data_ptr()] and launched[-1][14][1] == y2.data_ptr()
    # launchers it leaves to Triton
    assert direct_launch.DirectLaunch.of(compiled(closure(c_launch, {1}, ["meta"]), global_scratch_size=64),
                                         (1, 1, 1), [x, desc], [(0, 0)], [(1, 1, template)], 1) is None
    assert direct_launch.DirectLaunch.of(compiled(closure(c_launch, {1}, ["meta"]), num_ctas=2),
                                         (1, 1, 1), [x, desc], [(0, 0)], [(1, 1, template)], 1) is None
    assert direct_launch.DirectLaunch.of(compiled(c_launch), (1, 1, 1), [x, desc], [(0, 0)], [(1, 1, template)], 1) is None
    plain = direct_launch.DirectLaunch.of(compiled(len), (1, 1, 1), [x, 5], [(0, 0)], [], 1)  # len: a C function
    assert plain is not None and plain.c_launch is len
    monkeypatch.setattr(nvidia, "_BASE_ARGS_FORMAT", direct_launch.C_HEAD + "O")  # another Triton's layout
    assert direct_launch.DirectLaunch.of(compiled(len), (1, 1, 1), [x, 5], [(0, 0)], [], 1) is None
    hook = launched.append
    assert not direct_launch.hooks_set()
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert direct_launch.hooks_set()  # then a plan launches through CompiledKernel[grid]
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)


def test_a_launch_plan_repeats_a_calls_launches_with_the_next_calls_tensors(monkeypatch):
    """`flash_tuned.recording` and `LaunchPlan`, with a stand-in kernel (no GPU here): a
    call whose launch was a compile makes no plan; the next call of its signature, whose
    launch found the compiled kernel, makes one; a third call runs the plan: the same
    compiled kernel and grid, its own inputs (and a descriptor over one) where the
    recorded call had its, fresh buffers, every other argument as recorded. A call with a
    tensor in two roles, or a launch of a tensor the call made otherwise, or another
    planned call inside, makes no plan; other settings are another signature."""
    from types import SimpleNamespace
    from triton.tools.tensor_descriptor import TensorDescriptor
    launched = []

    class Compiled:
        metadata = SimpleNamespace(global_scratch_size=0)

        def __getitem__(self, grid):
            return lambda *args: launched.append((self, grid, args))

    class Kernel:  # a JIT function with one constexpr parameter, A
        params = [SimpleNamespace(name=n, default=None) for n in ("x", "y_desc", "out", "buf", "n", "A")]

        def __getitem__(self, grid):
            return lambda *args, **kwargs: Compiled()

    monkeypatch.setattr(flash_tuned, "INTERPRET", False)
    monkeypatch.setattr(flash_tuned, "_COMPILED", {})
    monkeypatch.setattr(flash_tuned, "cuda_context_on_this_thread", lambda device: None)
    kernel = Kernel()

    def wrapper(x, y, extra=None, inner=None, name="test"):  # as flash_attention_forward uses plans
        signature = flash_tuned.plan_signature(name, (x, y), 7)
        made = flash_tuned.run_plan(signature, (x, y))
        if made is not None:
            return made
        out, buf = torch.empty(3, 16), torch.empty(5)
        with flash_tuned.recording(signature, (x, y)) as recorded:
            y_desc = TensorDescriptor(y, list(y.shape), list(y.stride()), [4, 16])
            flash_tuned.launch_compiled(kernel, x.device, (2,), x, y_desc, extra if extra is not None else out,
                                        buf, 7, A=1)
            if inner is not None:
                inner()
        recorded.keep(returned=(out,), buffers=(buf,))
        return (out,)

    def fresh():
        return torch.randn(8, 16), torch.randn(8, 16)

    x, y = fresh()
    wrapper(x, y)  # the compile
    assert flash_tuned._PLANS == {} and len(launched) == 0
    wrapper(x, y)  # the compiled kernel, recorded
    assert len(flash_tuned._PLANS) == 1
    compiled, grid, recorded_args = launched[-1]
    x2, y2 = fresh()
    (out2,) = wrapper(x2, y2)
    assert len(launched) == 2
    again, grid2, args = launched[-1]
    assert again is compiled and grid2 == grid == (2, 1, 1)
    assert args[0] is x2 and args[2] is out2 and args[4:] == (7, 1)
    assert args[1].base is y2 and args[1].block_shape == [4, 16] and args[1] is not recorded_args[1]
    assert args[3].shape == (5,) and args[3] is not recorded_args[3] and out2 is not recorded_args[2]
    assert recorded_args[1].base is y  # the plan's own copy of the descriptor holds no tensor
    (plan,) = flash_tuned._PLANS.values()
    assert all(a is None for a in plan.launches[0][2][:4])

    for name, call, planned in (
            ("a tensor in two roles", lambda: wrapper(x, x), []),
            ("a tensor not made with torch.empty", lambda: wrapper(x, y, extra=x + 1), []),
            ("a planned call inside", lambda: wrapper(x, y, inner=lambda: wrapper(*fresh(), name="inner")),
             ["inner"])):
        flash_tuned._PLANS.clear()
        call()
        call()
        assert [s[0] for s in flash_tuned._PLANS] == planned, name
    flash_tuned._PLANS.clear()
    wrapper(x, y)
    wrapper(x, y)
    for setting in ("TRY_GLUON", "SPLIT_D", "ROWS_D256"):  # each setting is in the key
        planned = flash_tuned.plan_signature("test", (x, y), 7)
        assert planned in flash_tuned._PLANS, setting
        monkeypatch.setattr(flash_tuned, setting, not getattr(flash_tuned, setting))
        assert flash_tuned.plan_signature("test", (x, y), 7) not in flash_tuned._PLANS, setting
        monkeypatch.setattr(flash_tuned, setting, not getattr(flash_tuned, setting))
    assert flash_tuned.plan_signature("test", (x, "y"), 7) is None


@pytest.mark.skipif(not GPU, reason="direct launches are the GPU's path (the interpreter runs the JIT)")
@pytest.mark.parametrize("D", [64, 128, 160])
def test_repeated_launches_match_the_first(monkeypatch, D):
    """After a shape's first launch (Triton's JIT), `launch_compiled` calls the compiled
    kernels directly: a second training step, and a forward after other shapes ran, give
    the first one's outputs and gradients bit for bit (Triton kernels only: D = 128 with
    the Gluon kernels off; the forward's `triton.heuristics` layer included)."""
    from solutions import flash_backward
    monkeypatch.setattr(flash_tuned, "TRY_GLUON", False)
    monkeypatch.setattr(flash_tuned, "_COMPILED", {})
    # every call through `launch_compiled`: a launch plan would repeat a call without it
    monkeypatch.setattr(flash_tuned, "run_plan", lambda signature, inputs: None)
    q, k, v = make_qkv(2, 4, 2, 300, 300, D, torch.float16, seed=D)
    do = torch.randn_like(q)
    runs = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        o, _ = flash_backward.flash_attention(*leaves, causal=True)
        o.backward(do)
        runs.append([o.detach()] + [t.grad for t in leaves])
        flash_attention_forward(q[:, :, :77], k[:, :, :77], v[:, :, :77], causal=False)  # another shape between
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    from tests.test_backward_kernels import check_grads, reference  # (it imports this file)
    _, *refs = reference(q, k, v, do, True)
    check_grads(runs[1][1:], refs, torch.float16, f"D={D}, second step")
    jit_entries = len(flash_tuned._COMPILED)
    flash_attention_forward(q, k, v, causal=True)
    assert len(flash_tuned._COMPILED) == jit_entries  # the repeat found its compiled kernel


@pytest.mark.skipif(not GPU, reason="launch plans are the GPU's path (the interpreter runs the JIT)")
@pytest.mark.parametrize("D, Hkv, layout, gluon", [(64, 4, "bhnd", True), (64, 2, "bnhd", False),
                                                   (128, 4, "bhnd", True), (160, 4, "bhnd", False)])
def test_launch_plans_repeat_a_training_step_bit_for_bit(monkeypatch, D, Hkv, layout, gluon):
    """From the fourth training step of a signature on (the first ones compile: the
    forward's first call passes descriptors for the autotuner's timing runs, its second
    none where a plain config won; then one records), the forward and the backward run
    by their launch plans (`flash_tuned.LaunchPlan`), skipping the wrappers' checks:
    steps on new tensors of the same signature give the first step's outputs and
    gradients bit for bit. Cases:
    the Triton kernels (grouped K/V heads; q, k, v as transposed views), the Gluon ones
    (D = 64 and 128 contiguous, the backward's too), and D = 160, whose split backward has
    no plan."""
    from solutions import flash_backward, flash_gluon
    if gluon:
        monkeypatch.setattr(flash_backward, "GLUON_BACKWARD_MIN_WORK", 0)
    gluon_runs = []  # (LAST_CONFIG names the last launch: at D = 64, the backward's Triton dQ)
    gluon_forward = flash_gluon.forward
    monkeypatch.setattr(flash_gluon, "forward", lambda *a: gluon_runs.append(1) or gluon_forward(*a))
    checks = []
    checked = flash_tuned.check_attention_inputs
    monkeypatch.setattr(flash_tuned, "check_attention_inputs", lambda *a: checks.append(1) or checked(*a))

    def step(seed):
        q, k, v = make_qkv(2, 4, Hkv, 300, 300, D, torch.float16, layout=layout, seed=seed)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        do = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(q)
        o, _ = flash_backward.flash_attention(*leaves, causal=True)
        o.backward(do)
        return (q, k, v, do), [o.detach()] + [t.grad for t in leaves]

    inputs, first = step(1)
    step(2)
    step(3)
    kinds = sorted(s[0] for s in flash_tuned._PLANS)
    assert kinds == (["forward"] if D == 160 else ["backward", "forward"])
    assert bool(gluon_runs) == gluon
    checks.clear()
    _, again = step(1)
    assert len(checks) == 0  # the forward ran by its plan
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    # the plans launched through the kernels' C launchers (`DirectLaunch`) where this
    # Triton's launcher is laid out as 3.6's; with a launch hook installed (a profiler's)
    # they take Triton's own path, which calls it, and give the same bits
    from solutions import direct_launch
    direct = [d is not None for plan in flash_tuned._PLANS.values() for *_, d in plan.launches]
    assert all(direct) if direct_launch.supported() else not any(direct)
    from triton import knobs
    hooked = []
    knobs.runtime.launch_enter_hook.add(hooked.append)
    try:
        _, through_triton = step(1)
    finally:
        knobs.runtime.launch_enter_hook.remove(hooked.append)
    assert len(hooked) >= len(direct)
    assert all(torch.equal(a, b) for a, b in zip(first, through_triton))
    from tests.test_backward_kernels import check_grads, reference  # (it imports this file)
    ref_o, *refs = reference(*inputs, True)
    assert_close(again[0], ref_o, quiet=True)
    check_grads(again[1:], refs, torch.float16, f"D={D}, by the plans")


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


# ---------------------------------------------------------------------------------------
# Head dims as column blocks, and the FP8 forward

def test_column_blocks():
    """Powers of two stay one block; others split where that saves columns."""
    cb = flash_tuned.column_blocks
    assert [cb(d) for d in (16, 64, 128, 256)] == [(16, 0), (64, 0), (128, 0), (256, 0)]
    assert [cb(d) for d in (160, 192, 96, 80, 40)] == [(128, 32), (128, 64), (64, 32), (64, 16), (32, 16)]
    assert cb(24) == (32, 0) and cb(20) == (32, 0) and cb(200) == (256, 0)  # no saving: one block
    assert cb(80, 32) == (64, 32) and cb(40, 32) == (64, 0)  # FP8 blocks are >= 32 wide
    for d in range(16, 257):
        first, second = cb(d)
        assert first + second >= d and first + second <= max(16, 1 << (d - 1).bit_length())


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def make_fp8(B, H, Hkv, Nq, Nk, D, dtype, seed=0):
    q, k, v = make_qkv(B, H, Hkv, Nq, Nk, D, torch.float32, seed=seed)
    return [flash_tuned.quantize_fp8(t, dtype) for t in (q, k, v)]


def _launched_batch_heads(monkeypatch):
    """The (batch, heads) of each forward kernel launch from now on."""
    launched, launch = [], flash_tuned._launch_forward
    monkeypatch.setattr(flash_tuned, "_launch_forward",
                        lambda q, *args: (launched.append(tuple(q.shape[:2])), launch(q, *args))[1])
    return launched


def test_batches_past_the_grid_limit_run_in_slices(monkeypatch):
    """CUDA holds at most 65535 programs on a grid's second axis, where the tuned forward
    puts batch * heads: a larger batch runs in slices of whole batch entries, each entry
    computed as in one launch. The cap is made 5 here: B = 3, H = 2 runs as 2 + 1 entries."""
    q, k, v = make_qkv(3, 2, 1, 37, 45, 32, torch.float32, layout="bnhd", seed=11)
    launched = _launched_batch_heads(monkeypatch)
    monkeypatch.setattr(flash_tuned, "MAX_GRID_Y", 5)
    o, lse = flash_attention_forward(q, k, v, causal=True)
    assert launched == [(2, 2), (1, 2)]
    o_ref, lse_ref = reference64(q, k, v, True)
    assert_close(o, o_ref, quiet=True)
    assert_close(lse, lse_ref, name="lse", atol=1e-3, rtol=1e-3, quiet=True)
    monkeypatch.setattr(flash_tuned, "MAX_GRID_Y", 65535)
    whole = flash_attention_forward(q, k, v, causal=True)
    assert launched[2:] == [(3, 2)]
    assert torch.equal(o, whole[0]) and torch.equal(lse, whole[1]), "a slice changed the entries it holds"
    monkeypatch.setattr(flash_tuned, "MAX_GRID_Y", 1)
    with pytest.raises(ValueError, match="2 heads"):
        flash_attention_forward(q, k, v)


def test_fp8_batches_past_the_grid_limit_run_in_slices(monkeypatch, fp8_rounding):
    """The FP8 forward slices a large batch as the fp16 one does, descales and output
    format carried to each slice. On the CPU the public function runs past its device
    check (the interpreter has no FP8 products; `fp8_rounding` makes its conversions PyTorch's)."""
    if GPU and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs sm_89+")
    if not GPU:
        monkeypatch.setattr(flash_tuned, "check_fp8_inputs", lambda q, k, v, out_dtype:
                            flash_tuned._fp8_shapes(q.shape, k.shape, v.shape))
    dtype = torch.float8_e5m2
    (q8, dq), (k8, dk), (v8, dv) = make_fp8(3, 2, 2, 40, 33, 32, dtype, seed=5)
    launched = _launched_batch_heads(monkeypatch)
    monkeypatch.setattr(flash_tuned, "MAX_GRID_Y", 4)
    o, lse = flash_tuned.flash_attention_fp8(q8, k8, v8, causal=True, descale_q=dq, descale_k=dk,
                                             descale_v=dv, out_dtype=dtype)
    assert launched == [(2, 2), (1, 2)] and o.dtype == dtype
    _fp8_check(o, lse, q8, k8, v8, True, dq, dk, dv)


def test_kernel_input_copies_only_what_the_kernels_cannot_take():
    buf = torch.randn(2, 3, 40, 16, device=DEVICE)
    aligned = buf[:, :, 8:]  # 8 rows of 16 fp32 in: a 16-byte boundary, strided
    assert flash_tuned.kernel_input(aligned) is aligned
    for name, t, contiguous in (("one element in", buf.flatten()[1:1 + 2 * 3 * 39 * 16].view(2, 3, 39, 16), False),
                                ("head dim strided", buf.transpose(2, 3), False),
                                ("not contiguous", aligned, True)):
        got = flash_tuned.kernel_input(t, contiguous=contiguous)
        assert got.data_ptr() % 16 == 0 and got.stride(-1) == 1, name
        assert got.is_contiguous() or not contiguous, name
        assert torch.equal(got, t), name
    v8 = torch.randn(1, 2, 33, 32, device=DEVICE).to(torch.float8_e4m3fn)
    vt = flash_tuned.transpose_v_fp8(v8.flatten()[1:1 + 2 * 32 * 32].view(1, 2, 32, 32).transpose(-1, -2))
    assert vt.stride(-2) == 1 and vt.data_ptr() % 16 == 0, "V for FP8: keys contiguous, aligned"


def test_quantize_fp8():
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 7
    for dtype, mantissa in ((torch.float8_e4m3fn, 3), (torch.float8_e5m2, 2)):
        x8, descale = flash_tuned.quantize_fp8(x, dtype)
        assert x8.dtype == dtype and x8.shape == x.shape and descale.shape == (1,)
        assert float(x8.float().abs().max()) == flash_tuned.fp8_max(dtype)  # amax lands on the max
        back = x8.float() * descale
        normal = x.abs() > descale * 2.0 ** (-6 if mantissa == 3 else -14)
        rel = ((back - x).abs() / x.abs())[normal]
        assert float(rel.max()) <= 2.0 ** -(mantissa + 1) * 1.001  # round to nearest
    with pytest.raises(TypeError, match="float8"):
        flash_tuned.quantize_fp8(x, torch.float16)


def test_fp8_reference():
    """Without P rounding the reference is attention on the dequantized inputs; with it,
    a few percent off (P has 3 mantissa bits)."""
    (q8, dq), (k8, dk), (v8, dv) = make_fp8(1, 4, 2, 37, 45, 32, torch.float8_e4m3fn, seed=3)
    deq = [t.double() * d.double() for t, d in ((q8, dq), (k8, dk), (v8, dv))]
    for causal in (False, True):
        o, lse = flash_tuned.fp8_attention_reference(q8, k8, v8, causal, None, dq, dk, dv, quantize_p=False)
        o_ref, lse_ref = reference64(*deq, causal)
        assert_close(o, o_ref, atol=1e-12, rtol=1e-10)
        assert_close(lse, lse_ref, name="lse", atol=1e-12, rtol=1e-10)
        o_q, _ = flash_tuned.fp8_attention_reference(q8, k8, v8, causal, None, dq, dk, dv)
        err = float((o_q - o_ref).norm() / o_ref.norm())
        assert 1e-3 < err < 5e-2, err


def test_fp8_input_checks():
    (q8, dq), (k8, dk), (v8, dv) = make_fp8(1, 4, 2, 16, 16, 32, torch.float8_e4m3fn)
    fp8 = flash_tuned.flash_attention_fp8
    with pytest.raises(TypeError, match="float8_e4m3fn or torch.float8_e5m2"):
        fp8(q8.float(), k8, v8)
    with pytest.raises(TypeError, match="one FP8 dtype"):
        fp8(q8, k8.to(torch.float8_e5m2), v8)
    with pytest.raises(TypeError, match="out_dtype"):
        fp8(q8, k8, v8, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="out_dtype"):  # FP8 out only in the inputs' format
        fp8(q8, k8, v8, out_dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match="4 dims"):
        fp8(q8[0], k8[0], v8[0])
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        fp8(q8[:, :3], k8, v8)
    with pytest.raises(ValueError, match="head_dim 16 not supported in FP8"):
        fp8(q8[..., :16], k8[..., :16], v8[..., :16])
    with pytest.raises(TypeError, match="flash_attention_fp8"):  # the fp16 kernel points there
        flash_attention_forward(q8, k8, v8)
    if not GPU:
        with pytest.raises(RuntimeError, match="compute capability >= 8.9"):
            fp8(q8, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv)
    elif torch.cuda.get_device_capability() >= (8, 9):
        with pytest.raises(ValueError, match="one number"):
            fp8(q8, k8, v8, descale_q=torch.ones(2, device=DEVICE))


def _fp8_check(o, lse, q8, k8, v8, causal, dq, dk, dv, sm_scale=None):
    """The kernel against float64 on the dequantized inputs: about as far off as the same
    reference with P rounded to e4m3 in PyTorch (the roundings differ tile by tile), and
    the lse (no P rounding in it) close. An FP8 O is in V's scale (o = o8 * dv): the
    reference is then rounded to O's format too."""
    exact, lse_ref = flash_tuned.fp8_attention_reference(q8, k8, v8, causal, sm_scale, dq, dk, dv,
                                                         quantize_p=False)
    emulated, _ = flash_tuned.fp8_attention_reference(q8, k8, v8, causal, sm_scale, dq, dk, dv)
    if o.dtype in flash_tuned.FP8_DTYPES:
        scale, fmax = dv.double().reshape(()), flash_tuned.fp8_max(o.dtype)
        emulated = (emulated / scale).clamp(-fmax, fmax).to(o.dtype).double() * scale
        o = o.double() * scale
    err = float((o.double() - exact).norm() / exact.norm())
    emul = float((emulated - exact).norm() / exact.norm())
    assert err <= 1.5 * emul + 1e-3, (err, emul)
    assert_close(lse, lse_ref, name="lse", atol=2e-3, rtol=1e-3, quiet=True)


@pytest.fixture
def fp8_rounding(monkeypatch):
    """On the CPU: Triton's interpreter rounds fp32 -> fp8 without the carry into the
    exponent (31.4 becomes 16, not 32); this swaps in PyTorch's conversion for that one
    step. On a GPU: nothing."""
    if GPU:
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    convert = getattr(interpreter, "_convert_float", None)
    if convert is None:
        pytest.skip("this Triton's interpreter converts floats elsewhere")

    def rounded(data, src, dst, rounding):
        if dst in (tl.float8e4nv, tl.float8e5) and src in (tl.float32, tl.float16):
            x = torch.from_numpy(np.ascontiguousarray(data).view(
                np.float32 if src == tl.float32 else np.float16).copy()).float()
            out = x.to(torch.float8_e4m3fn if dst == tl.float8e4nv else torch.float8_e5m2)
            return out.view(torch.uint8).numpy().reshape(data.shape)
        return convert(data, src, dst, rounding)
    monkeypatch.setattr(interpreter, "_convert_float", rounded)


def _fp8_forward(q8, k8, v8, causal, descales, out_dtype, sm_scale=None):
    """flash_attention_fp8 on a GPU; on the CPU its launcher in the interpreter (the
    public function refuses the CPU: no FP8 tensor cores)."""
    if GPU:
        dq, dk, dv = descales
        return flash_tuned.flash_attention_fp8(q8, k8, v8, causal=causal, sm_scale=sm_scale, descale_q=dq,
                                               descale_k=dk, descale_v=dv, out_dtype=out_dtype)
    B, H, Nq, D = q8.shape
    o = torch.empty(B, H, Nq, D, dtype=out_dtype)
    lse = torch.empty(B, H, Nq)
    scale = D ** -0.5 if sm_scale is None else sm_scale
    flash_tuned._launch_forward(q8, k8, flash_tuned.transpose_v_fp8(v8), o, lse, causal, scale,
                                descales, True, True, (Nq, k8.shape[2], D, causal, q8.dtype, out_dtype))
    return o, lse


@pytest.mark.skipif(GPU, reason="the GPU runs test_fp8_forward")
def test_fp8_kernel_in_the_interpreter(fp8_rounding):
    """The FP8 kernel's logic (V stored transposed, P scaled and rounded to e4m3,
    descales, column blocks, GQA, causal, ragged lengths, fp16 or FP8 output) on the
    CPU, through the launcher the public function uses."""
    for (B, H, Hkv, Nq, Nk, D, causal, dtype) in ((1, 2, 1, 70, 45, 64, True, torch.float8_e4m3fn),
                                                  (1, 2, 2, 33, 70, 96, False, torch.float8_e5m2)):
        (q8, dq), (k8, dk), (v8, dv) = make_fp8(B, H, Hkv, Nq, Nk, D, dtype, seed=D)
        for out_dtype in (torch.float16, dtype):
            o, lse = _fp8_forward(q8, k8, v8, causal, (dq, dk, dv), out_dtype)
            assert o.dtype == out_dtype
            _fp8_check(o, lse, q8, k8, v8, causal, dq, dk, dv)


@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
def test_fp8_output_saturates_at_its_format_max(dtype, fp8_rounding):
    """An FP8 O saturates at its format's largest value. Every query scores key 0 at 1
    and the 63 others at 0.375, so each of those has e^-0.625 = 0.535 of key 0's weight,
    which P's e4m3 rounding takes up to 0.5625: the row sums past l by ~5%. Column 0 of
    V holds the format's largest value in every row, so the exact O there is that
    value, and O with P rounded ~5% past it (e4m3fn has no infinity: NaN unless the
    conversion saturates, as Triton's cvt.rn.satfinite does on the GPU and PyTorch's,
    in the interpreter, does). Other columns: as _fp8_check wants them."""
    if GPU and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs sm_89+")
    fmax = flash_tuned.fp8_max(dtype)
    B, H, N, D = 1, 2, 64, 32
    q = torch.zeros(B, H, N, D, device=DEVICE)
    q[..., 0] = 1.0
    k = torch.zeros(B, H, N, D, device=DEVICE)
    k[..., 0] = 0.375
    k[:, :, 0, 0] = 1.0
    v = torch.randn(B, H, N, D, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(0))
    v[..., 0] = fmax
    q8, k8, v8 = (t.to(dtype) for t in (q, k, v))
    ones = [torch.ones(1, device=DEVICE) for _ in range(3)]
    emulated, _ = flash_tuned.fp8_attention_reference(q8, k8, v8, False, 1.0, *ones)
    assert float(emulated[..., 0].min()) > 1.04 * fmax  # the case this test is for
    o, lse = _fp8_forward(q8, k8, v8, False, ones, dtype, sm_scale=1.0)
    assert o.dtype == dtype
    assert torch.equal(o[..., 0].float(), torch.full_like(o[..., 0], fmax, dtype=torch.float32))
    assert torch.isfinite(o.float()).all()
    _fp8_check(o, lse, q8, k8, v8, False, *ones, sm_scale=1.0)


FP8_CASES = [(2, 4, 2, 300, 517, 128, True), (2, 4, 4, 1000, 1000, 64, False),
             (1, 4, 1, 257, 300, 96, True), (2, 2, 2, 777, 1025, 256, False),
             (1, 8, 8, 2048, 2048, 128, True)]


@pytest.mark.skipif(not GPU or torch.cuda.get_device_capability() < (8, 9), reason="FP8 needs sm_89+")
@pytest.mark.parametrize("dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: "-".join(map(str, c)))
def test_fp8_forward(dtype, case):
    *shape, causal = case
    (q8, dq), (k8, dk), (v8, dv) = make_fp8(*shape, dtype, seed=sum(shape))
    for out_dtype in (torch.float16, torch.bfloat16, dtype):
        o, lse = flash_tuned.flash_attention_fp8(q8, k8, v8, causal=causal, descale_q=dq,
                                                 descale_k=dk, descale_v=dv, out_dtype=out_dtype)
        assert o.dtype == out_dtype and o.shape == q8.shape and lse.shape == q8.shape[:3]
        assert_not_trivial(o)
        _fp8_check(o, lse, q8, k8, v8, causal, dq, dk, dv)


# ---------------------------------------------------------------------------------------
# Every config the tuned forward's autotuner can pick, tiles honoured (the interpreter
# too): a config is only tried where it wins a benchmark, so a wrong one could hide
# behind the others. "tma" and "ws" configs load through tensor descriptors.

FP8_GPU = GPU and torch.cuda.get_device_capability() >= (8, 9)


def _forward_shortlist():
    """FP8's lists only where FP8 runs (the interpreter runs the FP8 kernel in
    test_fp8_kernel_in_the_interpreter)."""
    width_to_d = {64: 64, 128: 128, 192: 160, 256: 256}
    tables = [("fp16", flash_tuned.SHORTLIST), ("fp16", flash_tuned.SHORTLIST_TMA)]
    if FP8_GPU:
        tables += [("fp8", flash_tuned.SHORTLIST_FP8), ("fp8", flash_tuned.SHORTLIST_TMA_FP8)]
    cases = {f"{kind}-D{width_to_d[w]}-" + "x".join(map(str, c)): (width_to_d[w], kind, c)
             for kind, table in tables for w, configs in table.items() for c in configs}
    cases["short-q-" + "x".join(map(str, flash_tuned.SHORT_Q))] = (64, "fp16", flash_tuned.SHORT_Q)
    cases["fp32-" + "x".join(map(str, flash_tuned.FP32))] = (48, "fp32", flash_tuned.FP32)
    return cases


def _forward_cases():
    """Each config, causal or not, with 144 keys (ragged for every tile) and 128 (whole
    blocks: the kernel compiled without its masked stage where nothing is causal), as the
    autotuner would try them: a 4-warp "ws" config only with whole blocks, not causal
    (test_single_loop_configs_only_where_nothing_is_masked)."""
    return {f"{name}-{'causal' if causal else 'full'}-k{n_k}": (D, kind, config, causal, n_k)
            for name, (D, kind, config) in _forward_shortlist().items()
            for causal in (False, True) for n_k in (144, 128)
            if flash_tuned.offered(config, causal, n_k)}


FORWARD_SHORTLIST = _forward_cases()


def _choose(monkeypatch, config):
    """As if the autotuner had chosen `config` for every key."""
    chosen = flash_tuned._config(*config)

    class Chosen(dict):
        def get(self, key, default=None):
            return chosen
    monkeypatch.setattr(flash_tuned, "_CHOSEN", Chosen())


@pytest.mark.parametrize("D, kind, config, causal, Nk", FORWARD_SHORTLIST.values(), ids=FORWARD_SHORTLIST.keys())
def test_every_shortlisted_forward_config(monkeypatch, D, kind, config, causal, Nk):
    _choose(monkeypatch, config)
    # 150 = 128 + 22 query rows, GQA; 144 keys make FP8's transposed V rows 144 bytes
    # long, as TMA needs (16-byte multiples)
    B, H, Hkv, Nq = 1, 2, 1, 150
    seed = zlib.crc32(f"{D}{kind}{config}{causal}{Nk}".encode()) % 1000
    if kind == "fp8":
        (q8, dq), (k8, dk), (v8, dv) = make_fp8(B, H, Hkv, Nq, Nk, D, torch.float8_e4m3fn, seed=seed)
        q, k, v = q8, k8, flash_tuned.transpose_v_fp8(v8)
    else:
        q, k, v = make_qkv(B, H, Hkv, Nq, Nk, D, torch.float32 if kind == "fp32" else torch.float16,
                           seed=seed)
    if len(config) > 4:  # a descriptor config: only where the autotuner may pick one
        assert flash_tuned._tma_ok(q, k, v, kind == "fp8"), "descriptors not allowed here"
    if kind == "fp8":
        o, lse = flash_tuned.flash_attention_fp8(q, k, v, causal=causal, descale_q=dq,
                                                 descale_k=dk, descale_v=dv)
        _fp8_check(o, lse, q8, k8, v8, causal, dq, dk, dv)
        return
    o, lse = flash_attention_forward(q, k, v, causal=causal)
    o_ref, lse_ref = reference64(q, k, v, causal)
    assert_close(o, o_ref, name=f"o {kind} D={D} {config}", dim_names=("b", "h", "row", "col"), quiet=True)
    assert_close(lse, lse_ref, name="lse", atol=1e-3, rtol=1e-3, quiet=True)


DESCRIPTOR_CONFIGS = {f"D{D}-" + "x".join(map(str, c)): (D, c)
                      for D, configs in flash_tuned.SHORTLIST_TMA.items() for c in configs}


def test_every_shortlisted_config_is_found_by_its_name():
    """The autotuner's pruning finds each shortlisted config by the tuple the list names
    it with (`_shape`), a register cap (maxnreg) included; the cap reaches the compiler."""
    lists = (flash_tuned.SHORTLIST, flash_tuned.SHORTLIST_FP8, flash_tuned.SHORTLIST_TMA,
             flash_tuned.SHORTLIST_TMA_FP8)
    named = [t for table in lists for entries in table.values() for t in entries]
    named += [flash_tuned.SHORT_Q, flash_tuned.FP32]
    assert any(len(t) == 6 for t in named), "no capped config left: drop this test's maxnreg part"
    for t in named:
        config = flash_tuned._config(*t)
        assert flash_tuned._shape(config) == t
        assert config.all_kwargs().get("maxnreg") == (t[5] if len(t) == 6 else None)


def test_autotuning_takes_the_best_median_of_rounds_in_turn(monkeypatch):
    """launch_tuned's choice (`_choose`): every config timed once per round, each round
    starting one config further along, the best median wins. A config that reads fast
    only while the GPU is fresh (as the first ones timed did on the H100, PERF.md 3j)
    loses."""
    monkeypatch.setattr(flash_tuned, "AUTOTUNE_ROUNDS", 3)
    # "a" reads fastest once (the first trial of all) and would win on it or on the mean
    scripted = {"a": [0.1, 2.0, 2.0], "b": [1.5, 9.0, 1.6], "c": [3.0, 3.0, 3.0]}
    calls = []

    class FakeAutotuner:
        arg_names = ["X"]
        nargs = None

        def prune_configs(self, kwargs):
            assert self.nargs == {"X": "x"} and kwargs == {"N": 7}
            return list(scripted)

        def _bench(self, *args, config, **meta):
            assert args == ("x",) and meta == {"N": 7, "grid": "g", "warmup": False}
            calls.append(config)
            return [scripted[config][calls.count(config) - 1], 0.0, 0.0]

    tuned = FakeAutotuner()
    assert flash_tuned._choose(tuned, "g", ("x",), {"N": 7}) == "b"
    assert "".join(calls) == "abc" "bca" "cab"
    assert tuned.nargs is None and tuned.configs_timings == {"a": 2.0, "b": 1.6, "c": 3.0}


def test_single_loop_configs_only_where_nothing_is_masked(monkeypatch):
    """The autotuner offers a 4-warp "ws" config (it compiles only as the program's one
    loop) where no key block is masked: not causal, and the keys fill whole blocks."""
    monkeypatch.setattr(flash_tuned, "INTERPRET", False)
    props = types.SimpleNamespace(shared_memory_per_block_optin=232448)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    configs = [flash_tuned._config(*c) for c in flash_tuned.SHORTLIST_TMA[128] + flash_tuned.SHORTLIST[128]]
    q = torch.empty(1, 1, 4096, 128, dtype=torch.float16)
    single = [c for c in flash_tuned.SHORTLIST_TMA[128] if flash_tuned.single_loop_only(c)]
    assert single, "no 4-warp ws config listed: this test checks nothing"
    for causal, n_k, offered in ((False, 4096, True), (True, 4096, False), (False, 4000, False)):
        args = {"Q": q, "N_Q": 4096, "N_K": n_k, "BLOCK_D": 128, "BLOCK_D2": 0, "HEAD_DIM": 128,
                "TMA_OK": 1, "CAUSAL": causal}
        kept = [flash_tuned._shape(c) for c in flash_tuned._prune(configs, args)]
        assert all((c in kept) == offered for c in single), (causal, n_k, kept)
        assert flash_tuned.SHORTLIST_TMA[128][0] in kept


def test_causal_tiles_have_query_blocks_of_whole_key_blocks():
    """Causal, a query block must start on a key-block boundary (the kernel's unmasked
    stage ends there), so a tile whose BLOCK_Q is not a multiple of BLOCK_K is offered
    only where nothing is causal."""
    wide = [c for c in flash_tuned.SHORTLIST_TMA_FP8[128] if c[0] % c[1]]
    assert wide, "no tile with BLOCK_Q < BLOCK_K listed: this test checks nothing"
    for config in wide:
        assert flash_tuned.offered(config, False, 4096)
        assert not flash_tuned.offered(config, True, 4096)
    assert flash_tuned.offered((128, 64, 8, 3), True, 4096)


def test_inputs_expanded_over_batch_and_heads_run_without_descriptors():
    """K and V `expand`ed from one (batch, head) to all (strides 0) are right, and run
    the pointer configs: the tuned kernel makes no tensor map with a stride of 0."""
    q, k, v = make_qkv(2, 4, 1, 70, 45, 32, torch.float16, seed=3)
    k, v = (t[:1].expand(2, 4, -1, -1) for t in (k, v))
    assert k.stride()[:2] == (0, 0) and v.stride()[:2] == (0, 0)
    assert not flash_tuned._tma_ok(q, k, v, False)
    for causal in (False, True):
        o, lse = flash_attention_forward(q, k, v, causal=causal)
        o_ref, lse_ref = reference64(q, k, v, causal)
        assert_close(o, o_ref, name=f"o causal={causal}", dim_names=("b", "h", "row", "col"), quiet=True)
        assert_close(lse, lse_ref, name="lse", atol=1e-3, rtol=1e-3, quiet=True)


@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_fp8_descriptors_merge_batch_and_heads_where_the_strides_allow(monkeypatch, fp8_rounding, layout):
    """FP8's K and V contiguous: rank-3 descriptors over [B * Hkv, N, D], each program at
    row b * Hkv + h_kv (B = 3 and GQA: a row computed from H instead reads another head's
    keys). K in a [B, N, H, D] buffer keeps rank 4, as Q always does, and so do fp16's K
    and V (slower at rank 3 on the H200, PERF.md 4c)."""
    if GPU and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs sm_89+")
    if not GPU:  # past the device check, as in test_fp8_batches_past_the_grid_limit_run_in_slices
        monkeypatch.setattr(flash_tuned, "check_fp8_inputs", lambda q, k, v, out_dtype:
                            flash_tuned._fp8_shapes(q.shape, k.shape, v.shape))
    config = flash_tuned.SHORTLIST_TMA_FP8[64][0]
    _choose(monkeypatch, config)
    (q8, dq), (k8, dk), (v8, dv) = make_fp8(3, 4, 2, 150, 144, 64, torch.float8_e5m2, seed=7)
    if layout == "bnhd":  # the same values in [B, N, H, D] buffers
        q8, k8 = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q8, k8))
    vt = flash_tuned.transpose_v_fp8(v8)  # contiguous: rank 3 in both cases
    ranks = [len(shape) for _, shape, _ in flash_tuned._layouts(q8, k8, vt, True)]
    assert ranks == ([4, 3, 3] if layout == "bhnd" else [4, 4, 3])
    q16, k16, v16 = (t.to(torch.float16) for t in (q8, k8, v8))
    assert [len(shape) for _, shape, _ in flash_tuned._layouts(q16, k16, v16, False)] == [4, 4, 4]
    assert flash_tuned._tma_ok(q8, k8, vt, True)
    o, lse = flash_tuned.flash_attention_fp8(q8, k8, vt, causal=True, descale_q=dq, descale_k=dk,
                                             descale_v=dv)
    _fp8_check(o, lse, q8, k8, v8, True, dq, dk, dv)


@pytest.mark.parametrize("D, config", DESCRIPTOR_CONFIGS.values(), ids=DESCRIPTOR_CONFIGS.keys())
def test_descriptor_configs_take_strided_heads(monkeypatch, D, config):
    """Descriptors span [B, H, N, D] with the tensors' own strides: q, k, v as
    [B, N, H, D] buffers seen as [B, H, N, D] (the next row in memory is another head's),
    ragged lengths, GQA. (Bounds a few rows too long fail here: in the interpreter they
    read past the buffer.)"""
    _choose(monkeypatch, config)
    causal = not flash_tuned.single_loop_only(config)  # else whole key blocks, not causal
    q, k, v = make_qkv(2, 4, 2, 150, 144 if causal else 128, D, torch.float16, layout="bnhd", seed=D)
    assert q.stride(1) == D and flash_tuned._tma_ok(q, k, v, False)
    o, lse = flash_attention_forward(q, k, v, causal=causal)
    o_ref, lse_ref = reference64(q, k, v, causal)
    assert_close(o, o_ref, name=f"o D={D} {config} bnhd", dim_names=("b", "h", "row", "col"), quiet=True)
    assert_close(lse, lse_ref, name="lse", atol=1e-3, rtol=1e-3, quiet=True)
