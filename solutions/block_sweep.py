"""Block-size sweep of the teaching FlashAttention forward on a GPU (module 07's data).

    python -m solutions.block_sweep [--dims 64 128] [--out DIR]

For each head dim D, causal or not, and sequence length N (B*N = 16384, H = 16, fp16, as in
solutions/bench.py), it launches `solutions.flash_forward.flash_attention_kernel` with every
configuration (BLOCK_Q, BLOCK_K, num_warps, num_stages) of the grid below, checks the output
against SDPA once per configuration, and times it with triton.testing.do_bench (median).
A configuration the compiler refuses (too much shared memory) is recorded as
`out_of_resources`. Each row also records the shared memory and registers per thread that
the compiled kernel uses. SDPA's FlashAttention-2 and cuDNN backends are timed in the same
run. Writes block_sweep.csv to --out (default: block_sweep_out); the copy shipped with the
course is solutions/perf/block_sweep.csv.
"""
import argparse
import csv
import itertools
import os

import torch
import torch.nn.functional as F
import triton
import triton.testing

from solutions.flash_forward import LOG2E, dot_precision, flash_attention_kernel, flash_grid

FIELDS = ["impl", "D", "N", "B", "H", "causal", "block_q", "block_k", "num_warps", "num_stages",
          "status", "ms", "tflops", "shared_bytes", "regs"]
BLOCKS_Q = (64, 128, 256)
BLOCKS_K = (32, 64, 128)
WARPS = (4, 8)
STAGES = (2, 3, 4)
CONFIGS = list(itertools.product(BLOCKS_Q, BLOCKS_K, WARPS, STAGES))


def launch(q, k, v, causal, block_q, block_k, num_warps, num_stages):
    """One launch of the teaching kernel with this configuration; returns (o, compiled)."""
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    compiled = flash_attention_kernel[flash_grid(N, B, H, block_q)](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, N, N, LOG2E / D ** 0.5, GROUP=1, HEAD_DIM=D, BLOCK_D=D, BLOCK_Q=block_q,
        BLOCK_K=block_k, CAUSAL=causal, DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages)
    return o, compiled


def _compile(D, causal, block_q):
    """Compile the configurations with this (D, causal, block_q) on a tiny input: fills Triton's cache.

    Lengths and strides of the tiny input specialize as the sweep's do (all multiples of
    16), so the timed launches find their kernels compiled.
    """
    q = torch.randn(1, 1, 128, D, device="cuda", dtype=torch.float16)
    for bq, bk, w, s in CONFIGS:
        if bq != block_q:
            continue
        try:
            launch(q, q, q, causal, bq, bk, w, s)
        except triton.runtime.errors.OutOfResources:
            pass
    torch.cuda.synchronize()


def compile_all(dims):
    """Compile in parallel processes: one compile takes seconds, the sweep has hundreds."""
    import concurrent.futures
    import multiprocessing
    jobs = list(itertools.product(dims, (False, True), BLOCKS_Q))
    with concurrent.futures.ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, *zip(*jobs)))


def _tflops(ms, B, H, N, D, causal):
    return 4 * B * H * N * N * D / (2 if causal else 1) / (ms * 1e-3) / 1e12


def _time(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40)  # median of the repeats


def sweep(dims, lengths):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    rows = []
    for D, causal, N in itertools.product(dims, (False, True), lengths):
        B, H = 16384 // N, 16
        base = dict(D=D, N=N, B=B, H=H, causal=causal)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms = _time(run)
            rows.append(dict(base, impl=name, status="ok", ms=round(ms, 4),
                             tflops=round(_tflops(ms, B, H, N, D, causal), 1)))
        for bq, bk, w, s in CONFIGS:
            row = dict(base, impl="teaching", block_q=bq, block_k=bk, num_warps=w, num_stages=s)
            try:
                o, compiled = launch(q, k, v, causal, bq, bk, w, s)
            except triton.runtime.errors.OutOfResources as e:
                rows.append(dict(row, status="out_of_resources", shared_bytes=getattr(e, "required", "")))
                continue
            err = float((o.float() - expected.float()).abs().max())
            if err > 2e-2:
                rows.append(dict(row, status=f"wrong (max error {err:.3g})"))
                continue
            ms = _time(lambda: launch(q, k, v, causal, bq, bk, w, s))
            rows.append(dict(row, status="ok", ms=round(ms, 4),
                             tflops=round(_tflops(ms, B, H, N, D, causal), 1),
                             shared_bytes=compiled.metadata.shared, regs=compiled.n_regs))
        best = max((r for r in rows if r["impl"] == "teaching" and r["status"] == "ok"
                    and (r["D"], r["N"], r["causal"]) == (D, N, causal)), key=lambda r: r["tflops"])
        print(f"D={D} N={N} causal={causal}: best {best['block_q']}x{best['block_k']} "
              f"w{best['num_warps']} s{best['num_stages']} {best['tflops']} TFLOPS", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--out", default="block_sweep_out")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("the block-size sweep needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}; torch {torch.__version__}, triton {triton.__version__}; "
          f"shared memory per block (opt-in) {props.shared_memory_per_block_optin} bytes", flush=True)
    compile_all(args.dims)
    print("compiled", flush=True)
    rows = sweep(args.dims, args.lengths)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "block_sweep.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
