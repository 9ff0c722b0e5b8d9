"""GPU benchmark of the course's attention kernels against PyTorch's SDPA backends.

    python -m solutions.bench [--quick] [--out DIR]
    python -m solutions.bench --plot CSV [--out DIR]     (re-draw the plots from a CSV)

For each case (dtype, head dim D, sequence length N with B*N = 16384, H = 16, causal or
not, forward or forward+backward) it checks each of our kernels against SDPA once and
records the peak memory each call adds over what was allocated before it. Then it times
every implementation with triton.testing.do_bench (median, after warm-up), in 3 rounds
that take turns (the median round is kept), in two ways: called from Python as a user
would (eager), and replayed from a CUDA graph captured around the same call (graph),
which leaves out the host's launch overhead.
At N = 1024 the eager step of a Python-launched kernel can be set by that overhead
(solutions/PERF.md): the two columns say which of host and GPU bounds a result.
TFLOPS count 4*B*H*N^2*D for the forward (half when causal) and 3.5x that for
forward+backward (the backward does 2.5x the forward's matmul work).
Writes bench.csv, tflops.png, tflops_graph.png and memory.png to --out (default: bench_out).
"""
import argparse
import csv
import os
import statistics
import sys

import torch
import torch.nn.functional as F

FIELDS = ["dtype", "D", "N", "B", "H", "causal", "mode", "impl", "ms", "tflops", "peak_mib",
          "graph_ms", "graph_tflops", "status"]
IMPLS = ["teaching", "tuned", "naive", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"]
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
ROUNDS = 3    # each time is the median of this many rounds...
REP_MS = 50   # ...of triton.testing.do_bench(warmup=25, rep=REP_MS), itself a median
SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION"}


def _cases(quick):
    dtypes = [torch.bfloat16] if quick else [torch.float16, torch.bfloat16]
    dims = [128] if quick else [64, 128]
    lengths = [1024, 4096] if quick else [1024, 4096, 16384]
    for dtype in dtypes:
        for mode in ("fwd", "fwd+bwd"):
            for causal in (False, True):
                for d in dims:
                    for n in lengths:
                        yield dict(dtype=dtype, D=d, N=n, B=16384 // n, H=16, causal=causal, mode=mode)


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _ours(mode):
    """name -> fn(q, k, v, causal) returning O, or None where the impl has no such mode."""
    from solutions.flash_forward import flash_attention
    from solutions.flash_tuned import flash_attention_forward
    from solutions.naive_attention import naive_attention
    if mode == "fwd":
        return {"teaching": lambda q, k, v, c: flash_attention(q, k, v, causal=c)[0],
                "tuned": lambda q, k, v, c: flash_attention_forward(q, k, v, causal=c)[0],
                "naive": lambda q, k, v, c: naive_attention(q, k, v, causal=c)}
    try:
        from solutions.flash_backward import flash_attention as train_attention
    except Exception as e:  # the backward is optional for this benchmark
        print(f"fwd+bwd of ours: n/a ({type(e).__name__}: {e})", file=sys.stderr)
        train_attention = None
    fn = None if train_attention is None else (lambda q, k, v, c: train_attention(q, k, v, causal=c)[0])
    return {"teaching": None, "tuned": fn, "naive": None}


def _rel_err(a, b):
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm())


def _step(fn, q, k, v, causal, do):
    """One timed unit: the forward, or the forward then the backward."""
    if do is None:
        return lambda: fn(q, k, v, causal)

    def fwd_bwd():
        fn(q, k, v, causal).backward(do)
    return fwd_bwd


def _check(fn, q, k, v, causal, do, expected):
    """Relative L2 error of our output (and gradients) against SDPA's; None if fine."""
    if do is None:
        errs = {"o": _rel_err(fn(q, k, v, causal), expected[0])}
    else:
        for t in (q, k, v):
            t.grad = None
        o = fn(q, k, v, causal)
        o.backward(do)
        errs = {"o": _rel_err(o, expected[0])}
        errs.update({n: _rel_err(t.grad, e) for n, t, e in zip("qkv", (q, k, v), expected[1:])})
    bad = {n: e for n, e in errs.items() if not e < 2e-2}  # bf16/fp16: ~1e-3 when right
    return None if not bad else "WRONG " + " ".join(f"{n}:{e:.2g}" for n, e in bad.items())


def _peak_mib(step, grads):
    """Peak memory (MiB) one call of the step adds to what was allocated before it."""
    for t in grads:
        t.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _eager_ms(step, grads):
    """Median time (ms) of the step called from Python, as a user calls it."""
    import triton
    return triton.testing.do_bench(step, warmup=25, rep=REP_MS, grad_to_none=grads or None,
                                   return_mode="median")


def _graph_ms(step, grads, rep=REP_MS):
    """Median time (ms) of the step replayed from a CUDA graph: the GPU's work alone."""
    import triton
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
        for _ in range(2):
            for t in grads:
                t.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    for t in grads:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=rep, return_mode="median")
    del graph
    for t in grads:
        t.grad = None
    return ms


def run_case(case):
    """All implementations on one case; returns one row per implementation."""
    B, H, N, D, causal, mode = case["B"], case["H"], case["N"], case["D"], case["causal"], case["mode"]
    gen = torch.Generator(device="cuda").manual_seed(N + D)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=case["dtype"], generator=gen)
               for _ in range(3))
    train = mode == "fwd+bwd"
    do = torch.randn_like(q) if train else None
    grads = []
    if train:
        for t in (q, k, v):
            t.requires_grad_(True)
        grads = [q, k, v]
    flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0) * (3.5 if train else 1.0)

    # The answer every one of ours is checked against: SDPA with its default backend.
    o_ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    expected = [o_ref.detach()]
    if train:
        expected += list(torch.autograd.grad(o_ref, (q, k, v), do))
    del o_ref

    fns = {**_ours(mode), **{n: _sdpa(b) for n, b in SDPA_BACKENDS.items()}}
    rows, steps = {}, {}
    for name in IMPLS:  # check and measure memory once
        rows[name] = row = {**case, "dtype": str(case["dtype"]).replace("torch.", ""), "impl": name,
                            "ms": "", "tflops": "", "peak_mib": "", "graph_ms": "",
                            "graph_tflops": "", "status": "ok"}
        if fns[name] is None:
            row["status"] = "n/a"
            continue
        step = _step(fns[name], q, k, v, causal, do)
        try:
            wrong = None if name.startswith("sdpa") else _check(fns[name], q, k, v, causal, do, expected)
            row.update(peak_mib=f"{_peak_mib(step, grads):.1f}", status=wrong or "ok")
            steps[name] = step
        except RuntimeError as e:  # out of memory, or an SDPA backend that rejects the case
            _unavailable(row, e)
        torch.cuda.empty_cache()

    # Time in rounds, every implementation once per round: a drift of the GPU's clock
    # during a case (seen: +-10% at N = 16384) then hits all of them alike.
    eager, graph = {n: [] for n in steps}, {n: [] for n in steps}
    for _ in range(ROUNDS):
        for name, step in list(steps.items()):
            try:
                eager[name].append(_eager_ms(step, grads))
            except RuntimeError as e:
                _unavailable(rows[name], e)
                del steps[name]
                continue
            try:
                graph[name].append(_graph_ms(step, grads))
            except RuntimeError as e:  # a call that cannot be captured keeps its eager time
                print(f"{name}: no graph timing ({str(e).splitlines()[0][:80]})", file=sys.stderr)
            torch.cuda.empty_cache()
    for name in steps:
        ms = statistics.median(eager[name])
        rows[name].update(ms=f"{ms:.4f}", tflops=f"{flops / ms / 1e9:.1f}")
        if graph[name]:
            gms = statistics.median(graph[name])
            rows[name].update(graph_ms=f"{gms:.4f}", graph_tflops=f"{flops / gms / 1e9:.1f}")
    return [rows[name] for name in IMPLS]


def _unavailable(row, error):
    if isinstance(error, torch.cuda.OutOfMemoryError):
        row["status"] = "n/a (out of memory)"
    else:
        row["status"] = "n/a (" + str(error).splitlines()[0][:60] + ")"


def _cell(rows, impl, field):
    row = next(r for r in rows if r["impl"] == impl)
    if row["status"] != "ok" and not row["status"].startswith("WRONG"):
        return "n/a"
    return row.get(field, "") + ("!" if row["status"] != "ok" else "")


def print_table(all_rows):
    """TFLOPS per implementation, tuned / each SDPA backend, teaching / tuned, and peak
    memory (MiB)."""
    short = {"teaching": "teach", "tuned": "tuned", "naive": "naive", "sdpa-flash": "FA2",
             "sdpa-cudnn": "cuDNN", "sdpa-efficient": "eff"}
    head = (f"{'dtype':5} {'mode':7} {'c':1} {'D':>3} {'N':>5} | "
            + " ".join(f"{short[i]:>6}" for i in IMPLS)
            + " | t/FA2 t/cuD t/eff te/tu | graph: t/FA2 t/cuD | mem MiB: tuned   FA2 cuDNN  naive")
    print("\nTFLOPS (median, eager); '!' = failed the check against SDPA; t/X = tuned over X;"
          " te/tu = teaching over tuned;\ngraph: tuned over X from CUDA-graph replays (GPU time alone)")
    print(head)
    print("-" * len(head))
    keys = []
    for r in all_rows:
        key = (r["dtype"], r["mode"], r["causal"], r["D"], r["N"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        rows = [r for r in all_rows if (r["dtype"], r["mode"], r["causal"], r["D"], r["N"]) == key]
        tf = {i: _cell(rows, i, "tflops") for i in IMPLS}
        gtf = {i: _cell(rows, i, "graph_tflops") for i in IMPLS}

        def ratio(other, table=tf, ours="tuned"):
            try:
                return f"{float(table[ours].rstrip('!')) / float(table[other].rstrip('!')):5.2f}"
            except ValueError:
                return "  n/a"
        mem = {i: _cell(rows, i, "peak_mib") for i in ("tuned", "sdpa-flash", "sdpa-cudnn", "naive")}
        dtype, mode, causal, d, n = key
        print(f"{SHORT_DTYPE.get(dtype, dtype):5} {mode:7} {'y' if str(causal) == 'True' else 'n'} {d:>3} {n:>5} | "
              + " ".join(f"{tf[i]:>6}" for i in IMPLS)
              + f" | {ratio('sdpa-flash')} {ratio('sdpa-cudnn')} {ratio('sdpa-efficient')}"
              + f" {ratio('tuned', ours='teaching')} |"
              + f"        {ratio('sdpa-flash', gtf)} {ratio('sdpa-cudnn', gtf)} |"
              + f"          {mem['tuned']:>6} {mem['sdpa-flash']:>5} {mem['sdpa-cudnn']:>5} {mem['naive']:>6}")


def plot(all_rows, out):
    """tflops.png and memory.png: one panel per (mode, causal, dtype, D), x = N."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["mode"], str(r["causal"]), r["dtype"], int(r["D"])) for r in all_rows})
    for field, label, name in (("tflops", "TFLOPS (eager)", "tflops.png"),
                               ("graph_tflops", "TFLOPS (CUDA graph)", "tflops_graph.png"),
                               ("peak_mib", "peak MiB", "memory.png")):
        if not any(r.get(field) for r in all_rows):
            continue  # e.g. a CSV from before graph timings
        cols = min(4, len(panels))
        nrows = (len(panels) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
        for ax, panel in zip(axes.flat, panels):
            mode, causal, dtype, d = panel
            for impl in IMPLS:
                pts = [(int(r["N"]), float(r[field])) for r in all_rows
                       if (r["mode"], str(r["causal"]), r["dtype"], int(r["D"])) == panel
                       and r["impl"] == impl and r.get(field) not in ("", None)]
                if pts:  # one colour per implementation in every panel
                    ax.plot(*zip(*sorted(pts)), marker="o", label=impl, color=f"C{IMPLS.index(impl)}")
            ax.set_xscale("log", base=2)
            if field == "peak_mib":
                ax.set_yscale("log")
            ax.set_title(f"{mode} {'causal' if causal == 'True' else 'full'} {dtype} D={d}", fontsize=9)
            ax.set_xlabel("N (B*N = 16384, H = 16)")
            ax.set_ylabel(label)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="bf16, D=128, N in {1024, 4096} only")
    parser.add_argument("--out", default="bench_out", help="folder for bench.csv and the plots")
    parser.add_argument("--plot", metavar="CSV", help="only re-draw the plots from this CSV")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.plot:
        with open(args.plot) as f:
            rows = list(csv.DictReader(f))
    else:
        if not torch.cuda.is_available():
            sys.exit("solutions.bench needs a CUDA GPU (use --plot CSV to draw saved results)")
        print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}", flush=True)
        rows = []
        with open(os.path.join(args.out, "bench.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            for case in _cases(args.quick):
                case_rows = run_case(case)
                rows += case_rows
                writer.writerows(case_rows)
                f.flush()  # a crash later on (a bad kernel kills the CUDA context) keeps these
                print(" ".join(f"{r['impl']}={r['tflops'] or r['status']}" for r in case_rows),
                      "|", {k: str(v) for k, v in case.items()}, flush=True)
    try:
        plot(rows, args.out)
    except ImportError:
        print("matplotlib is missing: no plots (bench.csv has the numbers)", file=sys.stderr)
    print_table(rows)


if __name__ == "__main__":
    main()
