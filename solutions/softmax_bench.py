"""Row softmax on a GPU: module 01's fused kernel against the same softmax in separate
PyTorch steps, and against torch.softmax (module 01's H100 figures come from here).

    python -m solutions.softmax_bench

fp16 rows of N columns, 4096 * 8192 / N rows (the same 32 Mi elements at every width).
Each implementation is checked against torch.softmax, then timed with
triton.testing.do_bench (median). "GB/s" counts the bytes the fused kernel must move,
read x once and write y once (4 bytes an element in fp16), over the time: an
implementation that moves more shows less.
"""
import torch
import triton
import triton.testing

from solutions.softmax import softmax

WIDTHS = (256, 1024, 4096, 16384)


def unfused(x):
    """Each step a separate kernel: every intermediate goes to DRAM and back."""
    m = x.max(dim=1, keepdim=True).values
    z = x - m
    e = torch.exp(z)
    s = e.sum(dim=1, keepdim=True)
    return e / s


def main():
    if not torch.cuda.is_available():
        raise SystemExit("the softmax benchmark needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}")
    print(f"{'N':>6} {'rows':>6} {'impl':>14} {'ms':>8} {'GB/s':>8}")
    for n in WIDTHS:
        rows = 4096 * 8192 // n
        x = torch.randn(rows, n, device="cuda", dtype=torch.float16)
        expected = torch.softmax(x.float(), dim=1)
        for name, fn in (("fused (ours)", softmax), ("unfused", unfused),
                         ("torch.softmax", lambda t: torch.softmax(t, dim=1))):
            err = float((fn(x).float() - expected).abs().max())
            assert err < 2e-3, (name, n, err)
            ms = triton.testing.do_bench(lambda: fn(x), warmup=25, rep=100)
            print(f"{n:6d} {rows:6d} {name:>14} {ms:8.4f} {4 * x.numel() / ms / 1e6:8.0f}", flush=True)


if __name__ == "__main__":
    main()
