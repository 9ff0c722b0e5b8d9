"""GPU benchmark of the tuned forward's newer paths (issue 14), one table per section.

    python -m solutions.tuned_bench [--only check,fwd,fp8,dims,train,small] [--tutorial PATH]
                                    [--lengths 1024,4096,16384] [--dims 64,128] [--causal y|n]
                                    [--jobs N [--compile-only]] [--rounds R] [--reps R] [--out DIR]
    python -m solutions.tuned_bench --table CSV [CSV ...]   (re-print saved tables)

Sections (H = 16, B * N = 16384, N in 1024 / 4096 / 16384, causal or not):
- check: small shapes (ragged lengths, GQA, a [B, N, H, D] layout, D = 64 ... 256, fp16,
         bf16 and both FP8 formats) against float64, before anything is timed.
- fwd:   fp16 and bf16 forward, D = 64 / 128: ours (the Gluon kernel where
         `flash_tuned.gluon_forward_takes`, else the autotuned Triton kernel), ours with the Triton
         kernel only ("ours-triton"), SDPA's FlashAttention-2 and cuDNN backends, and
         Triton's fused-attention tutorial (06) without and with warp specialization.
- fp8:   the FP8 forward (e4m3 and e5m2, per-tensor scales from `quantize_fp8`; e5m2
         also with e5m2 output, "e5m2-o8", as the tutorial writes it) against
         our fp16 forward on the same (unquantized) inputs and the tutorial's FP8 (e5m2,
         on e5m2-o8's tensors, its softmax scale carrying their descales);
         accuracy as the relative L2 error against an fp32 reference on the unquantized
         inputs, and against the reference on the dequantized inputs (the kernel's own
         error: P in e4m3, FP8 accumulation).
- dims:  fp16 D = 160 / 192 / 256, forward and forward+backward: ours; ours with one
         column block padded to 256 ("ours-padded": module 08's backward kernels as they
         are, at D = 256 too, where "ours" takes flash_backward_d256's dK/dV kernel); SDPA's
         FlashAttention-2 and cuDNN backends.
- train: forward+backward at D = 64 / 128, fp16 and bf16: ours, FA2, cuDNN, and (fp16)
         the tutorial's own forward+backward, without and with warp specialization.
- small: the N = 1024 training steps (fwd+bwd, D = 64 / 128) that the host's launch
         time can bound: ours, FA2, cuDNN and (fp16) the tutorial, `--reps` times each in
         one process, eager and (not the tutorial) CUDA graph, with the spread; and the
         host time of one step.
The tutorial is not part of this repository: pass the path of a copy of it (a module
with `forward(q, k, v, causal, sm_scale, warp_specialize)` returning its forward's output,
`train(...)` the same through its autograd Function, and its kernel `_attn_fwd`);
without --tutorial its columns read n/a. Every output of ours (and the tutorial's) is
checked against SDPA (fp16) or fp32 references (FP8: on the unquantized inputs, and on its
own dequantized ones) before it is timed; the tutorial's autotuner chooses afresh for
each case (its key leaves out the causal flag). Times are
do_bench medians (the median of --rounds rounds, default 3, that take turns between
implementations; the CSV keeps each round's time, and the config that ours and the
tutorial's autotuners took). Where ours is compared with the tutorial (fwd, fp8), the
tables also give the range of that ratio over the rounds, each round's figures taken side
by side, and in how many rounds ours was at least level: the GPU runs these kernels at
its power cap, and one kernel's rounds can spread by 5%. The
forward rows at N = 1024 (fwd, fp8, dims) are timed again replayed from CUDA graphs (mode
"fwd-graph"): the GPU's work alone, where the host's launch time can bound eager figures.
--dims and --causal narrow the cases of every section but check; --lengths those of fwd,
fp8, dims and train.
--jobs N compiles every kernel the run will need in N processes first (Triton's disk
cache then serves the timed process): the sections need ~200 compiles.
TFLOPS count 4 B H N^2 D for the forward (half when causal), 3.5x that for fwd+bwd.
"""
import argparse
import csv
import importlib.util
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from solutions.bench import _graph_ms  # (the same CUDA-graph timing as the main benchmark)

FIELDS = ["section", "dtype", "D", "N", "causal", "mode", "impl", "ms", "tflops", "err",
          "err_kernel", "config", "status", "rounds_ms"]
LENGTHS = (1024, 4096, 16384)
DIMS = None    # head dims to run (--dims); None: each section's own
CAUSAL = None  # True / False (--causal y / n); None: both
H = 16
TOTAL = 16384  # B * N
DEV = "cuda"
ROUNDS = 3
REP_MS = 40
GRAPH_N = 1024  # the length whose forward rows are timed from CUDA graphs too
TUT = None  # the tutorial's module, when given
FP8_KERNEL_TOL = 0.12  # an FP8 forward's error against fp32 on its own (dequantized) inputs


def _load_tutorial(path):
    spec = importlib.util.spec_from_file_location("tutorial06", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flops(B, N, D, causal, train=False):
    return 4 * B * H * N * N * D * (0.5 if causal else 1.0) * (3.5 if train else 1.0)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def _ms(fn):
    import triton
    return triton.testing.do_bench(fn, warmup=25, rep=REP_MS, return_mode="median")


def _timed(fns, timer=None):
    """{name: [ms of each round]} over ROUNDS rounds that take turns between the
    functions (each timed by `timer`, default `_ms`)."""
    times = {n: [] for n in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            times[name].append((timer or _ms)(fn))
    return times


def _fill_times(rows, steps, flops, timer=None):
    for name, rounds in _timed(steps, timer).items():
        ms = statistics.median(rounds)
        rows[name].update(ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}",
                          rounds_ms=" ".join(f"{t:.4f}" for t in rounds))


def _graph_rows(case, mode, rows, steps, flops):
    """At N = GRAPH_N, the forward steps again, replayed from CUDA graphs (the GPU's work
    alone), as rows of mode `mode`-graph: there an eager launch can take longer on the
    host than the kernel on the GPU, and eager figures moved by up to a third run to run
    (PERF.md 3k)."""
    if case["N"] != GRAPH_N:
        return []
    graphed, ok = {}, {}
    for name, fn in steps.items():
        graphed[name] = _row(case, mode + "-graph", name, err=rows[name]["err"],
                             err_kernel=rows[name]["err_kernel"], config=rows[name]["config"])
        try:
            _graph_ms(fn, [], rep=5)  # can it be captured?
            ok[name] = fn
        except Exception as e:
            graphed[name]["status"] = "n/a (" + str(e).splitlines()[0][:50] + ")"
    _fill_times(graphed, ok, flops, timer=lambda fn: _graph_ms(fn, []))
    return list(graphed.values())


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _chosen_config():
    """The config of the latest launch through flash_tuned.launch_tuned, as text."""
    from solutions import flash_tuned
    cfg = flash_tuned.LAST_CONFIG[0]
    if isinstance(cfg, str):  # "gluon": flash_gluon's kernel, which has one config
        return cfg
    if cfg is None or "BLOCK_Q" not in cfg.kwargs:
        return ""
    return "x".join(str(v) for v in flash_tuned._shape(cfg))


def _tutorial_config():
    """The config the tutorial's autotuner took for its latest launch, as text (BLOCK_M x
    BLOCK_N x warps x stages): two runs' tutorial times can differ by its choice."""
    cfg = getattr(getattr(TUT, "_attn_fwd", None), "best_config", None)
    if cfg is None:
        return ""
    return "x".join(str(v) for v in (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages))


def _config_that_ran(name):
    """The config of implementation `name`'s latest forward: the tutorial's for its rows,
    none for SDPA's backends ("FA2", "cuDNN"), ours for every other row ("ours...", and
    the FP8 section's "fp16", "e4m3", ...)."""
    if name.startswith("tut"):
        return _tutorial_config()
    return "" if name in ("FA2", "cuDNN") else _chosen_config()


def _with(module, name, value, fn):
    """fn with module.name set to value during each call."""
    def run(*args, **kwargs):
        old = getattr(module, name)
        setattr(module, name, value)
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(module, name, old)
    return run


# ---------------------------------------------------------------------------------------
# Cases

def _grid(section, dtypes, dims):
    for dtype in dtypes:
        for D in dims:
            for causal in (False, True):
                for N in LENGTHS:
                    yield dict(section=section, dtype=dtype, D=D, N=N, causal=causal)


def fwd_cases():
    return _grid("fwd", (torch.float16, torch.bfloat16), (64, 128))


def fp8_cases():
    return _grid("fp8", (torch.float16,), (64, 128))


def dims_cases():
    return _grid("dims", (torch.float16,), (160, 192, 256))


def train_cases():
    return _grid("train", (torch.float16, torch.bfloat16), (64, 128))


def small_cases():
    for D in (64, 128):
        for dtype in (torch.bfloat16, torch.float16):
            for causal in (False, True):
                yield dict(section="small", dtype=dtype, D=D, N=1024, causal=causal)


# Small shapes with ragged lengths, GQA, a [B, N, H, D] layout: (kind, B, H, Hkv, Nq, Nk,
# D, causal, layout); each against a float64 reference.
CHECKS = [
    ("fp16", 2, 4, 2, 300, 517, 160, False, "bnhd"),
    ("bf16", 2, 4, 4, 1000, 1000, 192, True, "bhnd"),
    ("fp16", 1, 4, 1, 257, 129, 96, True, "bhnd"),
    ("fp16", 1, 8, 8, 2048, 2048, 128, True, "bhnd"),
    ("bf16", 2, 4, 2, 1000, 777, 64, False, "bnhd"),
    ("e4m3", 2, 4, 2, 300, 517, 128, True, "bnhd"),
    ("e5m2", 2, 4, 4, 1000, 1000, 64, False, "bhnd"),
    ("e4m3", 1, 4, 1, 257, 300, 96, True, "bhnd"),
    ("e4m3", 2, 2, 2, 777, 1025, 256, False, "bhnd"),
    ("e5m2", 1, 8, 8, 2048, 2048, 128, True, "bhnd"),
]


def check_cases():
    for i, c in enumerate(CHECKS):
        yield dict(section="check", dtype=c[0], D=c[6], N=c[4], causal=c[7], index=i)


SECTIONS = {"check": check_cases, "fwd": fwd_cases, "fp8": fp8_cases, "dims": dims_cases,
            "train": train_cases, "small": small_cases}


def cases(section):
    """The section's cases that --dims and --causal select (the check section: all)."""
    return [c for c in SECTIONS[section]()
            if section == "check" or ((DIMS is None or c["D"] in DIMS)
                                      and (CAUSAL is None or c["causal"] == CAUSAL))]


def _selection():
    """What selects the cases, for a worker process to select the same (`_warm`)."""
    return LENGTHS, DIMS, CAUSAL


def _select(selection):
    global LENGTHS, DIMS, CAUSAL
    LENGTHS, DIMS, CAUSAL = selection


def _inputs(case, seed=0):
    B, N, D = TOTAL // case["N"], case["N"], case["D"]
    g = torch.Generator(device=DEV).manual_seed(seed + N + D)
    return [torch.randn(B, H, N, D, device=DEV, dtype=torch.float32, generator=g) for _ in range(3)]


# ---------------------------------------------------------------------------------------
# The implementations of each section: name -> fn() returning the output, built per case.

def _fwd_impls(case, q, k, v):
    from solutions import flash_tuned
    c = case["causal"]
    impls = {
        "ours": lambda: flash_tuned.flash_attention_forward(q, k, v, causal=c)[0],
        "ours-triton": _with(flash_tuned, "TRY_GLUON", False,
                             lambda: flash_tuned.flash_attention_forward(q, k, v, causal=c)[0]),
        "FA2": lambda: _sdpa("FLASH_ATTENTION")(q, k, v, c),
        "cuDNN": lambda: _sdpa("CUDNN_ATTENTION")(q, k, v, c),
    }
    if TUT is not None and q.dtype == torch.float16:
        scale = q.shape[-1] ** -0.5
        impls["tut"] = lambda: TUT.forward(q, k, v, c, scale, False)
        impls["tut-ws"] = lambda: TUT.forward(q, k, v, c, scale, True)
    return impls


def _fp8_impls(case, q32, k32, v32):
    from solutions import flash_tuned as ft
    c = case["causal"]
    impls, refs = {}, {}
    q16, k16, v16 = (t.half() for t in (q32, k32, v32))
    impls["fp16"] = lambda: ft.flash_attention_forward(q16, k16, v16, causal=c)[0]
    for name, dt in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        (q8, dq), (k8, dk), (v8, dv) = (ft.quantize_fp8(t, dt) for t in (q32, k32, v32))
        v8t = ft.transpose_v_fp8(v8)  # keys contiguous, as Hopper's FP8 products want V
        impls[name] = (lambda q8=q8, k8=k8, v8t=v8t, dq=dq, dk=dk, dv=dv: ft.flash_attention_fp8(
            q8, k8, v8t, causal=c, descale_q=dq, descale_k=dk, descale_v=dv)[0])
        refs[name] = (q8, k8, v8, dq, dk, dv)
        if name == "e4m3":  # V as given ([B, H, N, D], D contiguous): the kernel's wrapper copies it
            impls["e4m3-vcopy"] = (lambda q8=q8, k8=k8, v8=v8, dq=dq, dk=dk, dv=dv: ft.flash_attention_fp8(
                q8, k8, v8, causal=c, descale_q=dq, descale_k=dk, descale_v=dv)[0])
        else:  # e5m2 out, as the tutorial writes it (in V's scale: o = o8 * dv)
            impls["e5m2-o8"] = (lambda q8=q8, k8=k8, v8t=v8t, dq=dq, dk=dk, dv=dv: ft.flash_attention_fp8(
                q8, k8, v8t, causal=c, descale_q=dq, descale_k=dk, descale_v=dv, out_dtype=dt)[0])
            if TUT is not None:
                # The tutorial's FP8 (e5m2 in and out, V transposed in memory; with and
                # without WS) on the very tensors "e5m2-o8" reads: it takes no descales,
                # so its softmax scale carries descale_q * descale_k, and its output is in
                # V's scale as ours. (Which bits the products see moved neither kernel's
                # speed beyond the rounds' spread, PERF.md 3x.)
                scale = q32.shape[-1] ** -0.5 * dq.item() * dk.item()
                for suffix, ws in (("", False), ("-ws", True)):
                    impls["tut-e5m2" + suffix] = (lambda q8=q8, k8=k8, v8t=v8t, s=scale, ws=ws: TUT.forward(
                        q8, k8, v8t, c, s, ws))
    return impls, refs


def _step(forward):
    """A training step of `forward` (returns o): fn(do) runs o.backward(do), returns o."""
    def step(do):
        o = forward()
        o.backward(do)
        return o
    return step


def _train_impls(case, q, k, v):
    """name -> fn(do): fwd+bwd of ours, SDPA's FA2 and cuDNN, and (fp16) the tutorial's."""
    from solutions.flash_backward import flash_attention
    c = case["causal"]
    impls = {"ours": _step(lambda: flash_attention(q, k, v, causal=c)[0]),
             "FA2": _step(lambda: _sdpa("FLASH_ATTENTION")(q, k, v, c)),
             "cuDNN": _step(lambda: _sdpa("CUDNN_ATTENTION")(q, k, v, c))}
    if TUT is not None and q.dtype == torch.float16 and case["D"] <= 128:
        scale = q.shape[-1] ** -0.5
        impls["tut"] = _step(lambda: TUT.train(q, k, v, c, scale, False))
        impls["tut-ws"] = _step(lambda: TUT.train(q, k, v, c, scale, True))
    return impls


def _dims_impls(case, q, k, v, train):
    from solutions import flash_tuned
    c = case["causal"]
    if train:  # the backward splits the head dim as the forward does (SPLIT_D)
        impls = _train_impls(case, q, k, v)
        # module 08's backward kernels as they are: padded, and at 256 columns its own dK/dV
        impls["ours-padded"] = _with(flash_tuned, "SPLIT_D", False,
                                     _with(flash_tuned, "ROWS_D256", False, impls["ours"]))
        return impls
    return {"ours": lambda: flash_tuned.flash_attention_forward(q, k, v, causal=c)[0],
            "ours-padded": _with(flash_tuned, "SPLIT_D", False,
                                 lambda: flash_tuned.flash_attention_forward(q, k, v, causal=c)[0]),
            "FA2": lambda: _sdpa("FLASH_ATTENTION")(q, k, v, c),
            "cuDNN": lambda: _sdpa("CUDNN_ATTENTION")(q, k, v, c)}


# ---------------------------------------------------------------------------------------
# Running a section

def _row(case, mode, impl, **kw):
    row = {"section": case["section"], "dtype": str(case["dtype"]).replace("torch.", ""),
           "D": case["D"], "N": case["N"], "causal": case["causal"], "mode": mode, "impl": impl,
           "ms": "", "tflops": "", "err": "", "err_kernel": "", "config": "", "status": "ok", "rounds_ms": ""}
    row.update(kw)
    return row


def _check_and_time(case, mode, impls, expected, flops, train_grads=None, do=None, tol=2e-2):
    """Check each impl against `expected` (an output, or (o, dq, dk, dv)), then time the
    ones that pass. Returns the rows. With train_grads, each impl is fn(do) (`_step`)."""
    rows, steps = {}, {}
    for name, fn in impls.items():
        try:
            if train_grads is None:
                out = fn()
                err = _rel(out, expected)
                step = fn
            else:
                for t in train_grads:
                    t.grad = None
                out = fn(do)
                errs = [_rel(out, expected[0])] + [_rel(t.grad, e) for t, e in zip(train_grads, expected[1:])]
                err = max(errs)

                def step(fn=fn):
                    fn(do)
            config = _config_that_ran(name) if train_grads is None else ""
            status = "ok" if err < tol else f"WRONG {err:.2g}"
            rows[name] = _row(case, mode, name, err=f"{err:.2e}", config=config, status=status)
            if status == "ok":
                steps[name] = step
        except Exception as e:  # a backend that rejects the case
            rows[name] = _row(case, mode, name, status="n/a (" + str(e).splitlines()[0][:50] + ")")
        torch.cuda.empty_cache()
    _fill_times(rows, steps, flops)
    return list(rows.values()) + (_graph_rows(case, mode, rows, steps, flops) if train_grads is None else [])


def run_fwd(case):
    q, k, v = (t.to(case["dtype"]) for t in _inputs(case))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])
    return _check_and_time(case, "fwd", _fwd_impls(case, q, k, v), expected,
                           _flops(q.shape[0], case["N"], case["D"], case["causal"]))


def _ref32(q, k, v, causal, rows=2048):
    """Attention in fp32 (TF32 off), 2048 query rows at a time (S of N = 16384 would
    take 17 GB at once)."""
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        out = torch.empty_like(q)
        scale = q.shape[-1] ** -0.5
        N = k.shape[-2]
        for r0 in range(0, q.shape[-2], rows):
            s = (q[:, :, r0:r0 + rows] @ k.transpose(-1, -2)) * scale
            if causal:
                i = torch.arange(r0, r0 + s.shape[-2], device=q.device)[:, None]
                s = s.masked_fill(torch.arange(N, device=q.device)[None, :] > i, float("-inf"))
            out[:, :, r0:r0 + rows] = torch.softmax(s, -1) @ v
        return out
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def run_fp8(case):
    q32, k32, v32 = _inputs(case)
    c = case["causal"]
    impls, refs = _fp8_impls(case, q32, k32, v32)
    # fp32 references: on the unquantized inputs, and on each format's dequantized ones.
    ref32 = _ref32(q32, k32, v32, c)
    deq = {name: _ref32(q8.float() * dq, k8.float() * dk, v8.float() * dv, c)
           for name, (q8, k8, v8, dq, dk, dv) in refs.items()}
    rows, steps = {}, {}
    for name, fn in impls.items():
        try:
            out = fn().float()
            if name == "e5m2-o8" or name.startswith("tut"):  # in V's scale: o = o8 * descale_v
                *_, descale_v = refs["e5m2"]
                out = out * descale_v
            err = _rel(out, ref32)
            base = deq.get("e5m2" if name.startswith("tut") else name.split("-")[0])  # its inputs
            kernel_err = None if base is None else _rel(out, base)  # fp16 has no FP8 inputs
            # FP8 on randn inputs: scores and P off by a few % each, so O (a mean of many
            # values, small) is off by ~5% (e4m3) to ~10% (e5m2) against the unquantized
            # inputs' reference, and by 2-7% against its own inputs' (P in e4m3 or, the
            # tutorial's, e5m2; an e5m2 output). A kernel that lets some queries see later
            # keys stays under 0.3 on long rows; against its own inputs it is off by 0.2.
            if name == "fp16":
                wrong = err >= 2e-2
            else:
                wrong = err >= 0.3 or kernel_err >= FP8_KERNEL_TOL
            status = f"WRONG {err:.2g}" if wrong else "ok"
            config = _config_that_ran(name)
            rows[name] = _row(case, "fwd", name, err=f"{err:.2e}", config=config, status=status,
                              err_kernel="" if kernel_err is None else f"{kernel_err:.2e}")
            if status == "ok":
                steps[name] = fn
        except Exception as e:
            rows[name] = _row(case, "fwd", name, status="n/a (" + str(e).splitlines()[0][:50] + ")")
    flops = _flops(q32.shape[0], case["N"], case["D"], c)
    _fill_times(rows, steps, flops)
    return list(rows.values()) + _graph_rows(case, "fwd", rows, steps, flops)


def run_dims(case):
    q, k, v = (t.half() for t in _inputs(case))
    c = case["causal"]
    B = q.shape[0]
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=c)
    rows = _check_and_time(case, "fwd", _dims_impls(case, q, k, v, False), expected,
                           _flops(B, case["N"], case["D"], c))
    for t in (q, k, v):
        t.requires_grad_(True)
    return rows + _train_rows(case, q, k, v, _dims_impls(case, q, k, v, True))


def _train_rows(case, q, k, v, impls):
    """Check the training steps `impls` (name -> fn(do)) against SDPA's gradients, then
    time them; q, k, v require gradients."""
    c = case["causal"]
    do = torch.randn_like(q)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=c)
    expected = [o.detach()] + list(torch.autograd.grad(o, (q, k, v), do))
    return _check_and_time(case, "fwd+bwd", impls, expected,
                           _flops(q.shape[0], case["N"], case["D"], c, True), train_grads=[q, k, v], do=do)


def run_train(case):
    """fwd+bwd at D = 64 / 128 (fp16, bf16): ours, FA2, cuDNN, the tutorial (fp16)."""
    q, k, v = (t.to(case["dtype"]).requires_grad_(True) for t in _inputs(case))
    return _train_rows(case, q, k, v, _train_impls(case, q, k, v))


def run_check(case):
    """One of CHECKS against float64: the output's relative L2 error and the lse's
    largest error; FP8 also against the same reference with P rounded as the kernel
    rounds it (the kernel should be about as far off as that emulation is)."""
    from solutions import flash_tuned as ft
    from solutions.naive_attention import attention_scores, repeat_kv
    kind, B, Hq, Hkv, Nq, Nk, D, causal, layout = CHECKS[case["index"]]
    g = torch.Generator(device=DEV).manual_seed(case["index"])

    def make(h, n):
        if layout == "bnhd":
            return torch.randn(B, n, h, D, device=DEV, generator=g).transpose(1, 2)
        return torch.randn(B, h, n, D, device=DEV, generator=g)

    q, k, v = make(Hq, Nq), make(Hkv, Nk), make(Hkv, Nk)
    if kind in ("fp16", "bf16"):
        dt = torch.float16 if kind == "fp16" else torch.bfloat16
        q, k, v = (t.to(dt) for t in (q, k, v))
        o, lse = ft.flash_attention_forward(q, k, v, causal=causal)
        q64, k64, v64 = (t.double() for t in (q, k, v))
        s = attention_scores(q64, k64, causal)
        ref = torch.softmax(s, -1) @ repeat_kv(v64, Hq)
        err, emul = _rel(o, ref), None
        lse_err = float((lse.double() - s.logsumexp(-1)).abs().max())
        ok = err < (1e-2 if kind == "bf16" else 2e-3) and lse_err < 1e-2
    else:
        dt = torch.float8_e4m3fn if kind == "e4m3" else torch.float8_e5m2
        (q8, dq), (k8, dk), (v8, dv) = (ft.quantize_fp8(t, dt) for t in (q, k, v))
        o, lse = ft.flash_attention_fp8(q8, k8, v8, causal=causal, descale_q=dq, descale_k=dk,
                                        descale_v=dv)
        exact, lse_ref = ft.fp8_attention_reference(q8, k8, v8, causal, None, dq, dk, dv, quantize_p=False)
        emulated, _ = ft.fp8_attention_reference(q8, k8, v8, causal, None, dq, dk, dv, quantize_p=True)
        err, emul = _rel(o, exact), _rel(emulated, exact)
        lse_err = float((lse.double() - lse_ref).abs().max())
        ok = err <= 2 * emul + 1e-3 and lse_err < 1e-2
    cfg = _chosen_config()
    return [_row(case, "fwd", "ours", err=f"{err:.2e}",
                 err_kernel=f"emulated {emul:.2e}" if emul is not None else "",
                 config=f"{kind} B{B} H{Hq}/{Hkv} {Nq}x{Nk} {layout} lse {lse_err:.1e} {cfg}",
                 status="ok" if ok else "WRONG")]


def run_small(case, reps):
    q, k, v = (t.to(case["dtype"]).requires_grad_(True) for t in _inputs(case))
    c = case["causal"]
    do = torch.randn_like(q)
    grads = [q, k, v]
    flops = _flops(q.shape[0], case["N"], case["D"], c, True)
    # ours, (fp16) the tutorial's step without warp specialization, FA2 and cuDNN
    steps = {n: s for n, s in _train_impls(case, q, k, v).items() if n in ("ours", "tut", "FA2", "cuDNN")}
    fns = {name: (lambda s=s: s(do)) for name, s in steps.items()}
    # check once against SDPA's default backend
    o = F.scaled_dot_product_attention(q, k, v, is_causal=c)
    expected = [o.detach()] + list(torch.autograd.grad(o, (q, k, v), do))
    rows = []
    errs = {}
    for name in ("ours", "tut"):
        if name not in steps:
            continue
        for t in grads:
            t.grad = None
        # detached at once: an output kept alive keeps its autograd graph, and with it the
        # leaves' AccumulateGrad nodes bound to the default stream, which breaks the CUDA
        # graph capture below (cudaErrorStreamCaptureImplicit, PERF.md 3c)
        o = steps[name](do).detach()
        errs[name] = max([_rel(o, expected[0])] + [_rel(t.grad, e) for t, e in zip(grads, expected[1:])])
    for t in grads:
        t.grad = None
    eager = {n: [] for n in fns}
    graph = {n: [] for n in fns}
    host = {n: [] for n in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            eager[name].append(_ms(fn))
            # the tutorial's step is timed eagerly only (its autotuner is not meant for capture)
            graph[name].append(_graph_ms(fn, grads, rep=REP_MS) if name != "tut" else float("nan"))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                fn()
            host[name].append((time.perf_counter() - t0) / 20 * 1e3)  # no sync: host-side time
            torch.cuda.synchronize()
    for name in fns:
        r = [eager["FA2"][i] / eager[name][i] for i in range(reps)]
        gr = [graph["FA2"][i] / graph[name][i] for i in range(reps)]
        vs_others = ""
        if name == "ours":
            for other in ("cuDNN", "tut"):
                if other in fns:
                    vs_others += f" | {other}/X " + " ".join(f"{eager[other][i] / eager[name][i]:.2f}" for i in range(reps))
        err = errs.get(name, 0.0)
        rows.append(_row(case, "fwd+bwd", name, ms=f"{statistics.median(eager[name]):.4f}",
                         tflops=f"{flops / statistics.median(eager[name]) / 1e9:.1f}",
                         err=f"{err:.2e}" if name in errs else "",
                         config=(" ".join(f"{x:.2f}" for x in r) + " | graph " + " ".join(f"{x:.2f}" for x in gr)
                                 + " | host ms " + " ".join(f"{x:.3f}" for x in host[name]) + vs_others),
                         status="ok" if err < 2e-2 else f"WRONG {err:.2g}"))
    return rows


# ---------------------------------------------------------------------------------------
# Compiling ahead, in parallel

def _warm_task(task):
    """In a worker process: compile (not run) every kernel one case will need."""
    try:
        return _warm(*task)
    except Exception as e:
        return f"{task[0]}[{task[1]}] ERR {type(e).__name__} {str(e)[:160]}"


def warm_configs(autotuned, args, kwargs):
    """Compile (not run) every config of a triton.autotune kernel for these arguments, each
    after its pre_hook, as a launch would. The hook matters: ours gives the host-made
    descriptors the config's tiles, and the compiled kernel is specialized on them.
    Triton's own `Autotuner.warmup` skips the hooks, so our descriptor configs got
    16 x 16 tiles there and failed to compile. Returns one line per config that failed."""
    autotuned.nargs = dict(zip(autotuned.arg_names, args))
    errors = []
    try:
        for cfg in autotuned.prune_configs(kwargs):
            if cfg.pre_hook:
                cfg.pre_hook({**autotuned.nargs, **kwargs, **cfg.all_kwargs()})
            try:
                autotuned.fn.warmup(*args, grid=(1, 1, 1), **kwargs, **cfg.all_kwargs())
            except Exception as e:
                errors.append(f"{cfg}: {type(e).__name__} {str(e)[:80]}")
    finally:
        autotuned.nargs = None
    return errors


def _warm(section, index, tutorial, selection):
    global TUT
    _select(selection)
    os.environ.setdefault("COURSE_MODE", "gpu")
    import course  # noqa: F401
    import triton
    from solutions import flash_tuned
    if tutorial:
        TUT = _load_tutorial(tutorial)
    case = cases(section)[index]
    t0 = time.time()

    def warm_ours(tuned, grid, key, *args, **kwargs):
        failed = warm_configs(tuned, args, kwargs)
        if failed:
            raise RuntimeError(f"{len(failed)} configs failed to compile: " + "; ".join(failed))

    flash_tuned.launch_tuned = warm_ours

    class WarmTutorial:  # its failures are its static_assert(BLOCK_N <= HEAD_DIM): ignored
        def __getitem__(self, grid):
            return lambda *args, **kwargs: warm_configs(TUT._attn_fwd, args, kwargs)

    if TUT is not None:
        original = TUT.forward
        TUT.forward = lambda *a, **kw: original(*a, **kw, launch=WarmTutorial())
    errors = []
    try:
        if section == "check":
            run_check(case)
        elif section == "small":
            q, k, v = (t.to(case["dtype"]).requires_grad_(True) for t in _inputs(case))
            for name, fn in _train_impls(case, q, k, v).items():
                if name in ("ours", "tut"):
                    fn(torch.randn_like(q))
        elif section == "dims":
            q, k, v = (t.half() for t in _inputs(case))
            for name, fn in _dims_impls(case, q, k, v, False).items():
                if name.startswith("ours"):
                    fn()
            q, k, v = (t.requires_grad_(True) for t in (q, k, v))
            train = _dims_impls(case, q, k, v, True)
            for name in ("ours", "ours-padded"):
                train[name](torch.randn_like(q))
        elif section == "train":
            q, k, v = (t.to(case["dtype"]).requires_grad_(True) for t in _inputs(case))
            for name, fn in _train_impls(case, q, k, v).items():
                if name.startswith(("ours", "tut")):
                    try:
                        fn(torch.randn_like(q))
                    except Exception as e:
                        errors.append(f"{name}: {type(e).__name__} {str(e)[:80]}")
        else:
            q32, k32, v32 = _inputs(case)
            impls = (_fwd_impls(case, *(t.half() for t in (q32, k32, v32))) if section == "fwd"
                     else _fp8_impls(case, q32, k32, v32)[0])
            for name, fn in impls.items():
                if name.startswith(("ours", "tut", "e4", "e5", "fp16")):
                    try:
                        fn()
                    except Exception as e:
                        errors.append(f"{name}: {type(e).__name__} {str(e)[:80]}")
    except Exception as e:
        errors.append(f"{type(e).__name__} {str(e)[:120]}")
    del triton
    return f"{section}[{index}] {time.time() - t0:.0f}s" + (" ERR " + "; ".join(errors) if errors else "")


def precompile(sections, jobs, tutorial, lengths=(4096, 16384), seconds=600):
    """Compile in `jobs` processes what the sections' cases will need (one case per
    length class: the kernels are specialized on strides and ints of 1, not on N)."""
    import multiprocessing as mp
    wanted = (set(lengths) & set(LENGTHS)) or {min(LENGTHS)}
    tasks = [(s, i, tutorial, _selection()) for s in sections for i, c in enumerate(cases(s))
             if s in ("small", "check") or c["N"] in wanted]
    t0 = time.time()
    try:
        with mp.get_context("spawn").Pool(jobs) as pool:
            results = pool.imap_unordered(_warm_task, tasks)
            for _ in tasks:
                line = results.next(timeout=max(1.0, seconds - (time.time() - t0)))
                if "ERR" in line:
                    print("  warm:", line, flush=True)
    except Exception as e:  # the timed run compiles what is missing
        print(f"compiling ahead stopped: {type(e).__name__}: {e}", flush=True)
    print(f"compiled ahead: {len(tasks)} cases in {time.time() - t0:.0f} s ({jobs} processes)", flush=True)


# ---------------------------------------------------------------------------------------
# Tables

def _get(rows, impl, field="tflops"):
    for r in rows:
        if r["impl"] == impl and r["status"] == "ok" and r.get(field):
            return float(r[field])
    return None


def _best_impl(rows, *impls):
    """The one of `impls` that passed with the highest TFLOPS, or None."""
    timed = [i for i in impls if _get(rows, i)]
    return max(timed, key=lambda i: _get(rows, i)) if timed else None


def _best(rows, *impls):
    """The highest TFLOPS among `impls` that passed, or None."""
    return _get(rows, _best_impl(rows, *impls))


def _ratio(a, b):
    return f"{a / b:5.2f}" if a and b else "  n/a"


def _rounds(rows, ours, other):
    """ours / other round by round (time of other over time of ours): "min-max k/n",
    k the rounds where ours was at least level; "n/a" without both rows' round times
    (CSVs written before the field existed)."""
    times = [next((r.get("rounds_ms") for r in rows if r["impl"] == i and r["status"] == "ok"), None)
             for i in (ours, other)]
    if not all(times):
        return "n/a"
    a, b = ([float(x) for x in t.split()] for t in times)
    ratios = [y / x for x, y in zip(a, b)]
    return f"{min(ratios):.2f}-{max(ratios):.2f} {sum(r >= 1 for r in ratios)}/{len(ratios)}"


def _config_of(rows, impl):
    return next((r["config"] for r in rows if r["impl"] == impl), "")


def print_tables(all_rows):
    groups = {}
    for r in all_rows:
        groups.setdefault((r["section"], r["mode"]), {}).setdefault(
            (r["dtype"], r["D"], r["N"], r["causal"]), []).append(r)
    for (section, mode), cases in groups.items():
        impls = list(dict.fromkeys(r["impl"] for rows in cases.values() for r in rows))
        print(f"\n[{section}] {mode}: TFLOPS (do_bench median); '!' = failed its check")
        if section == "fwd":
            extra = " | o/tut o/cuD  o/FA2 | o/tut by round, rounds >= 1 | ours config | tut config"
        elif section == "fp8":
            extra = (" | e4/16 e5/16 e5/tut o8/tut | o8/tut by round, rounds >= 1 | err vs fp32: fp16 e4m3 e5m2 tut"
                     " | kernel err: e4m3 e5m2 | config e4m3 | tut config")
        elif section == "dims":
            extra = " | o/FA2 o/cuD o/pad | config"
        elif section == "train":
            extra = " | o/FA2 o/cuD o/tut"
        elif section == "check":
            extra = " | rel. L2 error | FP8: same for P rounded in PyTorch | case, lse max error, config"
        else:
            extra = " | eager ratios FA2/X per rep | graph | host ms per step | cuDNN/X | tut/X"
        head = f"{'dtype':8} {'D':>3} {'N':>5} c | " + " ".join(f"{i[:11]:>11}" for i in impls) + extra
        print(head)
        print("-" * len(head))
        for (dtype, D, N, causal), rows in cases.items():
            cells = []
            for i in impls:
                r = next((r for r in rows if r["impl"] == i), None)
                cells.append("n/a" if r is None or not r["tflops"] else r["tflops"] + ("" if r["status"] == "ok" else "!"))
            line = f"{dtype[:8]:8} {D:>3} {N:>5} {'y' if str(causal) == 'True' else 'n'} | " + " ".join(f"{c:>11}" for c in cells)
            ours = _get(rows, "ours")
            if section == "fwd":
                tut = _best_impl(rows, "tut", "tut-ws")
                cfg = _config_of(rows, "ours")
                line += (f" | {_ratio(ours, _get(rows, tut))} {_ratio(ours, _get(rows, 'cuDNN'))}"
                         f" {_ratio(ours, _get(rows, 'FA2'))} | {_rounds(rows, 'ours', tut):>14} | {cfg}"
                         f" | {_config_of(rows, tut)}")
            elif section == "fp8":
                f16, e4, e5 = _get(rows, "fp16"), _get(rows, "e4m3"), _get(rows, "e5m2")
                tut_impl = _best_impl(rows, "tut-e5m2", "tut-e5m2-ws")
                tut = _get(rows, tut_impl)
                err = {r["impl"]: r["err"] for r in rows}
                kerr = {r["impl"]: r["err_kernel"] for r in rows}
                cfg = _config_of(rows, "e4m3")
                line += (f" | {_ratio(e4, f16)} {_ratio(e5, f16)} {_ratio(e5, tut)} {_ratio(_get(rows, 'e5m2-o8'), tut):>6} | "
                         f"{_rounds(rows, 'e5m2-o8', tut_impl):>14} | {err.get('fp16', '')} {err.get('e4m3', '')} {err.get('e5m2', '')} {err.get('tut-e5m2', '')} | "
                         f"{kerr.get('e4m3', '')} {kerr.get('e5m2', '')} | {cfg} | {_config_of(rows, tut_impl)}")
            elif section == "dims":
                cfg = _config_of(rows, "ours")
                line += (f" | {_ratio(ours, _get(rows, 'FA2'))} {_ratio(ours, _get(rows, 'cuDNN'))}"
                         f" {_ratio(ours, _get(rows, 'ours-padded'))} | {cfg}")
            elif section == "train":
                tut = _best(rows, "tut", "tut-ws")
                line += f" | {_ratio(ours, _get(rows, 'FA2'))} {_ratio(ours, _get(rows, 'cuDNN'))} {_ratio(ours, tut)}"
            elif section == "check":
                r = rows[0]
                line += f" | {r['err']} {r['status']} | {r['err_kernel']} | {r['config']}"
            else:
                for r in rows:
                    if r["impl"] != "FA2":
                        line += f"\n      {r['impl']:8}: {r['config']}"
            print(line)


def run_case(section, case, reps):
    """One case of a section; its rows. The tutorial's autotuner chooses afresh for each
    case: its key (N_CTX, HEAD_DIM, FP8_OUTPUT, warp_specialize, dtypes) leaves out the
    causal flag, so a causal case would run the config it took for the non-causal case
    before it, unpruned. Its prune keeps BLOCK_M < BLOCK_N out of causal runs: on such a
    tile (64 x 128, FP8 at D = 128) its causal forward lets queries see later keys."""
    tuner = getattr(TUT, "_attn_fwd", None)
    if tuner is not None:
        tuner.cache.clear()
    if section == "small":
        return run_small(case, reps)
    return {"fwd": run_fwd, "fp8": run_fp8, "dims": run_dims, "train": run_train,
            "check": run_check}[section](case)


def main(argv=None):
    global TUT, ROUNDS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="fwd,fp8,dims,train,small", help="sections, comma-separated")
    parser.add_argument("--tutorial", help="path of a copy of Triton's tutorial 06 (see above)")
    parser.add_argument("--jobs", type=int, default=0, help="processes that compile ahead (0: none)")
    parser.add_argument("--lengths", default="1024,4096,16384", help="sequence lengths N (fwd, fp8, dims, train)")
    parser.add_argument("--dims", help="head dims D, comma-separated (default: each section's own; not check)")
    parser.add_argument("--causal", choices=("y", "n"), help="only causal cases, or only the others (not check)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="timing rounds that take turns between implementations (not small)")
    parser.add_argument("--reps", type=int, default=4, help="repetitions of the small cases")
    parser.add_argument("--out", default="bench_out", help="folder for tuned_bench.csv")
    parser.add_argument("--table", metavar="CSV", nargs="+", help="only re-print the tables of these CSVs")
    parser.add_argument("--compile-only", action="store_true", help="with --jobs: compile ahead, then stop")
    parser.add_argument("--compile-seconds", type=float, default=600, help="stop compiling ahead after this")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.table:
        rows = []
        for path in args.table:
            with open(path) as f:
                rows += list(csv.DictReader(f))
        print_tables(rows)
        return
    if not torch.cuda.is_available():
        sys.exit("solutions.tuned_bench needs a CUDA GPU (use --table CSV to print saved results)")
    import course  # noqa: F401
    _select((tuple(int(n) for n in args.lengths.split(",")),
             tuple(int(d) for d in args.dims.split(",")) if args.dims else None,
             None if args.causal is None else args.causal == "y"))
    ROUNDS = args.rounds
    sections = [s for s in args.only.split(",") if s]
    if args.tutorial:
        TUT = _load_tutorial(args.tutorial)
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
    if args.jobs:
        precompile(sections, args.jobs, args.tutorial, seconds=args.compile_seconds)
    if args.compile_only:
        return
    os.makedirs(args.out, exist_ok=True)
    rows = []
    with open(os.path.join(args.out, "tuned_bench.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for section in sections:
            t0 = time.time()
            for case in cases(section):
                case_rows = run_case(section, case, args.reps)
                rows += case_rows
                writer.writerows(case_rows)
                f.flush()
                print(" ".join(f"{r['impl']}={r['tflops'] or r['status']}" for r in case_rows), "|",
                      section, case["D"], case["N"], case["causal"], flush=True)
            print(f"[{section}] {time.time() - t0:.0f} s", flush=True)
    print_tables(rows)


if __name__ == "__main__":
    main()
