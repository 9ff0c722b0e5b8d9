"""Visible checks of module 03 (tiling and batched GEMM). Hidden tests reuse the `case_*`
functions with inputs the learner never sees."""
import torch
import triton

from course import DEVICE, INTERPRET
from course.gpu_compile import compile_for_gpu
from course.testing import (assert_close, assert_not_trivial, check_rejects, dtype_name,
                            explain_nan_from_guards, fail, guarded_input, guarded_output, randn,
                            run_wrapper, watched_call)

BLOCK = 32          # block sizes the checks launch a learner's matmul_kernel with
ROW_COL = ("row", "col")
BHMN = ("batch", "head", "row", "col")


def _guarded(shape, dtype, seed, scale=1.0):
    """Random input with NaN just before and after it in memory."""
    return guarded_input(randn(*shape, dtype=torch.float32, device=DEVICE, seed=seed).mul(scale).to(dtype))


def _check_dtype(out, dtype, name):
    if out.dtype != dtype:
        fail(f"{name} is {dtype_name(out.dtype)} but the inputs are {dtype_name(dtype)}: "
             "accumulate in fp32, then return (store) the inputs' dtype")


# ---------------------------------------------------------------------------------------
# tiled_matmul

def case_tiled_matmul(fn, M, N, K, tile, dtype, *, seed, quiet=False):
    a = randn(M, K, dtype=dtype, seed=seed)
    b = randn(K, N, dtype=dtype, seed=seed + 1)
    name = f"tiled_matmul({dtype_name(dtype)} [{M}, {K}] @ [{K}, {N}], tile={tile})"
    out, report = watched_call(fn, a.clone(), b.clone(), tile, measure_products=True)
    last_k = (K - 1) // tile * tile
    assert_close(out, a.double() @ b.double(), name=name, dim_names=ROW_COL, quiet=quiet,
                 mistakes={"only the last block along K counts: add each block product to the "
                           "accumulator (acc += ...) instead of replacing it":
                           a[:, last_k:].double() @ b[last_k:].double()},
                 hint="every output block sums the products of ALL blocks along K; edge blocks "
                      "are smaller when a size is not a multiple of the tile")
    assert_not_trivial(out, name=name)
    _check_dtype(out, dtype, name)
    if report["largest_product"] > tile:
        fail(f"{name} multiplied matrices with a side of {report['largest_product']}, larger than the "
             "tile: compute C one tile x tile block at a time, from tile x tile blocks of A and B")


def check_tiled_matmul(tiled_matmul):
    for M, N, K, tile, dtype in [(37, 45, 50, 16, torch.float32), (20, 20, 20, 32, torch.float32),
                                 (9, 7, 11, 4, torch.float16)]:
        case_tiled_matmul(tiled_matmul, M, N, K, tile, dtype, seed=M)


# ---------------------------------------------------------------------------------------
# dram_reads, dram_reads_untiled

def reference_dram_reads(m, n, k, tile):
    return m * k * triton.cdiv(n, tile) + k * n * triton.cdiv(m, tile)


def case_dram_reads(dram_reads, dram_reads_untiled, m, n, k, tile):
    name = f"dram_reads(m={m}, n={n}, k={k}, tile={tile})"
    got = dram_reads(m, n, k, tile)
    want = reference_dram_reads(m, n, k, tile)
    if got != want:
        why = {m * k * (n // tile) + k * n * (m // tile):
               "you counted full tiles only: a ragged last tile is still read in full, so "
               "count tiles with ceil(n / tile) (triton.cdiv), not n // tile",
               m * k * triton.cdiv(m, tile) + k * n * triton.cdiv(n, tile):
               "A and B are swapped: each element of A is read once per block COLUMN of C "
               "(ceil(n / tile) times), each element of B once per block ROW (ceil(m / tile))",
               m * k + k * n: "that counts each input once, as if everything stayed in SRAM"}
        fail(f"{name} is {got}, expected {want}. " + why.get(got, "Follow the model in the "
             "docstring: A is read ceil(n / tile) times, B ceil(m / tile) times."))
    untiled = dram_reads_untiled(m, n, k)
    if untiled != 2 * m * n * k:
        fail(f"dram_reads_untiled(m={m}, n={n}, k={k}) is {untiled}, expected {2 * m * n * k}: "
             "each of the m*n outputs reads a row of A (k elements) and a column of B (k)")


def check_dram_reads(dram_reads, dram_reads_untiled):
    for m, n, k, tile in [(64, 64, 64, 16), (100, 70, 64, 32), (5, 5, 5, 8), (7, 3, 2, 1)]:
        case_dram_reads(dram_reads, dram_reads_untiled, m, n, k, tile)
    print("ok  dram_reads and dram_reads_untiled follow the model")


# ---------------------------------------------------------------------------------------
# matmul_kernel (launched directly on guarded buffers) and the matmul wrapper

def case_matmul_kernel(kernel, a, b, *, name, hint=None, quiet=False):
    """Launch kernel on a [M, K], b [K, N] with BLOCK-sized tiles into a guarded output."""
    (M, K), N = a.shape, b.shape[1]
    with guarded_output((M, N), a.dtype, DEVICE, name="the output") as out:
        kernel[(triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))](
            a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(),
            BLOCK_M=BLOCK, BLOCK_N=BLOCK, BLOCK_K=BLOCK)
    explain_nan_from_guards(out, name=name)
    assert_close(out, a.double() @ b.double(), name=name, dim_names=ROW_COL, hint=hint, quiet=quiet)
    assert_not_trivial(out, name=name)


def case_matmul_kernel_random(kernel, M, N, K, dtype, *, seed, b_col_major=False, quiet=False):
    a = _guarded((M, K), dtype, seed)
    # A column-major b is a transposed view: only the strides say how to walk it.
    b = _guarded((N, K), dtype, seed + 1).t() if b_col_major else _guarded((K, N), dtype, seed + 1)
    layout = "column-major " if b_col_major else ""
    case_matmul_kernel(kernel, a, b, quiet=quiet,
                       name=f"matmul_kernel on {dtype_name(dtype)} [{M}, {K}] @ {layout}[{K}, {N}]")


def case_fp16_accumulation(kernel, M, N, *, seed, quiet=False):
    """Partial sums near 300 that cancel: an fp16 accumulator (ulp 0.25 there) loses the
    small terms; an fp32 one keeps them."""
    K = 2 * BLOCK
    a = randn(M, K, seed=seed) * 0.1
    b = randn(K, N, seed=seed + 1)
    a[:, 0], a[:, BLOCK] = 300.0, 300.0
    b[0], b[BLOCK] = 1.0, -1.0
    a, b = (guarded_input(t.to(DEVICE, torch.float16)) for t in (a, b))
    case_matmul_kernel(kernel, a, b, quiet=quiet,
                       name=f"matmul_kernel on float16 inputs whose partial sums cancel (K={K})",
                       hint="large partial sums lose their small terms in an fp16 accumulator: "
                            "accumulate in fp32 (tl.zeros(..., dtype=tl.float32)) and convert "
                            "only when storing")


def check_matmul_kernel(matmul_kernel):
    case_matmul_kernel_random(matmul_kernel, 37, 45, 50, torch.float32, seed=1)
    case_matmul_kernel_random(matmul_kernel, 33, 20, 70, torch.float16, seed=2, b_col_major=True)
    case_fp16_accumulation(matmul_kernel, 20, 24, seed=3)


def case_matmul(matmul, kernel, a, b, *, name, quiet=False):
    out = run_wrapper(matmul, kernel, a, b, forbid="matmul", name=name, launches=1,
                      hint="one launch on a grid of (row tiles, column tiles) computes the whole product")
    assert_close(out, a.double() @ b.double(), name=name, dim_names=ROW_COL, quiet=quiet)
    _check_dtype(out, a.dtype, name)


def _bad_matmul_inputs(matmul):
    x = torch.ones(4, 6, device=DEVICE)
    return [("a 1-D a", lambda: matmul(torch.ones(6, device=DEVICE), x)),
            ("a [4, 6] @ [4, 6] (inner sizes differ)", lambda: matmul(x, x)),
            ("int32 inputs", lambda: matmul(x.int(), x.t().int())),
            ("a float32 a with a float16 b", lambda: matmul(x, x.t().half()))] + (
        [] if INTERPRET else [("CPU tensors", lambda: matmul(x.cpu(), x.t().cpu()))])


def check_matmul(matmul, matmul_kernel):
    a = randn(70, 33, device=DEVICE, seed=4)
    case_matmul(matmul, matmul_kernel, a, randn(33, 45, device=DEVICE, seed=5),
                name="matmul(float32 [70, 33] @ [33, 45])")
    a = randn(20, 40, dtype=torch.float16, device=DEVICE, seed=6).t()
    case_matmul(matmul, matmul_kernel, a, randn(20, 50, dtype=torch.float16, device=DEVICE, seed=7),
                name="matmul(float16 transposed view [40, 20] @ [20, 50])")
    check_rejects(_bad_matmul_inputs(matmul), name="matmul")
    print("ok  matmul rejects bad inputs with clear errors")


# ---------------------------------------------------------------------------------------
# batched_gemm_strided, batched_gemm_ptrs: one launch each, on the grid the design note says

def _grid(launch):
    grid = launch["grid"]
    grid = tuple(grid(launch) if callable(grid) else grid)
    return grid + (1,) * (3 - len(grid))


def _grid_is(expected_grid, name):
    """A before_launch check (see run_wrapper): the launch's grid is the one expected_grid
    gives. It runs before the kernel: programs past the end of a tensor would write past
    it, which the interpreter does not stop (it corrupts memory or crashes)."""
    def check(launch, count):
        grid, (want, layout) = _grid(launch), expected_grid(launch)
        if grid != want:
            fail(f"{name}: the grid is {grid}; expected {layout} = {want}")
    return check


def _bt(b, b_transposed):
    return b.transpose(-1, -2) if b_transposed else b


def _strided_mistakes(a, b, b_transposed):
    """Outputs of the classic bugs, where the shapes let them run in bounds."""
    a, b = a.double(), b.double()
    B, H, M, K = a.shape
    right = _bt(b, b_transposed)
    found = {}
    if b.shape[-1] == b.shape[-2]:
        found["b_transposed is not honoured: " + (
            "you computed a @ b, but b_transposed=True asks for a @ b^T (Q @ K^T): read b "
            "with its last two strides swapped" if b_transposed else
            "you computed a @ b^T, but b_transposed=False asks for a @ b (P @ V)")] = a @ _bt(b, not b_transposed)
    if B == H:
        for where, wrong in (("A", a.transpose(0, 1) @ right), ("B", a @ right.transpose(0, 1)),
                             ("C", (a @ right).transpose(0, 1))):
            found[f"batch and head strides swapped for {where}: C[b, h] used {where}[h, b]. "
                  "Offset = batch * stride_batch + head * stride_head, with the batch id from "
                  "program_id(2) and the head id from program_id(0)"] = wrong
    return found


def case_strided(fn, kernel, a, b, b_transposed, *, name, quiet=False):
    expected = a.double() @ _bt(b.double(), b_transposed)
    B, H, M, _ = a.shape

    def grid(meta):
        return ((H, triton.cdiv(M, meta.get("BLOCK_M", 1)), B),
                "the design note's grid (heads, cdiv(M, BLOCK_M), batch)")
    out = run_wrapper(fn, kernel, a, b, b_transposed, forbid="matmul", name=name, launches=1,
                      hint="one launch must cover every (batch, head) pair",
                      before_launch=_grid_is(grid, name))
    explain_nan_from_guards(out, name=name)
    assert_close(out, expected, name=name, dim_names=BHMN, quiet=quiet,
                 mistakes=_strided_mistakes(a, b, b_transposed))
    assert_not_trivial(out, name=name)
    _check_dtype(out, a.dtype, name)


def strided_inputs(B, H, M, N, K, dtype, b_transposed, *, seed, layout="bhmk"):
    """a [B, H, M, K] and b ([B, H, N, K] or [B, H, K, N]), guarded.

    layout "bmhk": both made as [B, seq, H, dim] and viewed as [B, H, seq, dim], the way
    attention projections come out; b for P @ V is then a [B, H, K, N] view whose rows are
    not contiguous either.
    """
    if layout == "bhmk":
        a = _guarded((B, H, M, K), dtype, seed)
        b = _guarded((B, H, N, K) if b_transposed else (B, H, K, N), dtype, seed + 1)
    else:
        a = _guarded((B, M, H, K), dtype, seed).transpose(1, 2)
        b = _guarded((B, N, H, K), dtype, seed + 1).transpose(1, 2)
        if not b_transposed:  # treat it as V^T's storage: a [B, H, K, N] view of [B, N, H, K]
            b = b.transpose(-1, -2)
    return a, b


def case_strided_random(fn, kernel, B, H, M, N, K, dtype, b_transposed, *, seed, layout="bhmk",
                        quiet=False):
    a, b = strided_inputs(B, H, M, N, K, dtype, b_transposed, seed=seed, layout=layout)
    what = "Q @ K^T" if b_transposed else "P @ V"
    case_strided(fn, kernel, a, b, b_transposed, quiet=quiet,
                 name=f"batched_gemm_strided ({what}, {dtype_name(dtype)}, a {list(a.shape)}, "
                      f"b {list(b.shape)}{', non-contiguous' if layout != 'bhmk' else ''})")


def check_batched_gemm_strided(batched_gemm_strided, batched_gemm_strided_kernel):
    for b_transposed in (True, False):  # square, B == H: every classic mistake has a name
        case_strided_random(batched_gemm_strided, batched_gemm_strided_kernel, 2, 2, 40, 40, 40,
                            torch.float32, b_transposed, seed=10)
    case_strided_random(batched_gemm_strided, batched_gemm_strided_kernel, 2, 3, 37, 45, 20,
                        torch.float32, True, seed=11)
    case_strided_random(batched_gemm_strided, batched_gemm_strided_kernel, 2, 3, 37, 20, 45,
                        torch.float16, False, seed=12, layout="bmhk")


def _pair_mistakes(a_list, b_list, p, b_transposed):
    """Pair p computed from pair 0's A or B: the pointer array not indexed by the pair."""
    if p == 0 or any(t.shape != a_list[0].shape for t in a_list) or \
            any(t.shape != b_list[0].shape for t in b_list):
        return {}
    a0, b0 = a_list[0].double(), _bt(b_list[0].double(), b_transposed)
    ap, bp = a_list[p].double(), _bt(b_list[p].double(), b_transposed)
    return {"pair p used pair 0's A: load a_ptrs + pair (one address per pair), not a_ptrs": a0 @ bp,
            "pair p used pair 0's B: load b_ptrs + pair (one address per pair), not b_ptrs": ap @ b0}


def case_ptrs(fn, kernel, a_list, b_list, b_transposed, *, name, quiet=False):
    expected = [x.double() @ _bt(y.double(), b_transposed) for x, y in zip(a_list, b_list)]
    tallest = max(x.shape[0] for x in a_list)

    def grid(meta):
        return ((len(a_list), triton.cdiv(tallest, meta.get("BLOCK_M", 1)), 1),
                "(pairs, cdiv(largest M, BLOCK_M), 1)")
    out = run_wrapper(fn, kernel, list(a_list), list(b_list), b_transposed, forbid="matmul",
                      name=name, launches=1, hint="one launch must cover every pair",
                      before_launch=_grid_is(grid, name))
    if not isinstance(out, (list, tuple)) or len(out) != len(a_list):
        fail(f"{name} should return a list of {len(a_list)} tensors, one per pair, got "
             f"{type(out).__name__}" + (f" of length {len(out)}" if isinstance(out, (list, tuple)) else ""))
    for p, (o, e) in enumerate(zip(out, expected)):
        pair = f"{name}, pair {p} [{a_list[p].shape[0]}, {a_list[p].shape[1]}] @ ..."
        explain_nan_from_guards(o, name=pair)
        assert_close(o, e, name=pair, dim_names=ROW_COL, quiet=True,
                     mistakes=_pair_mistakes(a_list, b_list, p, b_transposed))
        assert_not_trivial(o, name=pair)
        _check_dtype(o, a_list[p].dtype, pair)
    if not quiet:
        print(f"ok  {name}: {len(out)} pairs")


def ptrs_inputs(shapes, dtype, b_transposed, *, seed):
    """One guarded allocation per matrix; shapes is a list of (M, N, K)."""
    a_list = [_guarded((M, K), dtype, seed + 2 * i) for i, (M, N, K) in enumerate(shapes)]
    b_list = [_guarded((N, K) if b_transposed else (K, N), dtype, seed + 2 * i + 1)
              for i, (M, N, K) in enumerate(shapes)]
    return a_list, b_list


def case_ptrs_random(fn, kernel, shapes, dtype, b_transposed, *, seed, quiet=False):
    a_list, b_list = ptrs_inputs(shapes, dtype, b_transposed, seed=seed)
    what = "Q @ K^T" if b_transposed else "P @ V"
    case_ptrs(fn, kernel, a_list, b_list, b_transposed, quiet=quiet,
              name=f"batched_gemm_ptrs ({what}, {dtype_name(dtype)}, {len(shapes)} pairs "
                   f"(M, N, K) = {shapes})")


def check_batched_gemm_ptrs(batched_gemm_ptrs, batched_gemm_ptrs_kernel):
    fn, kernel = batched_gemm_ptrs, batched_gemm_ptrs_kernel
    case_ptrs_random(fn, kernel, [(40, 33, 32)] * 3, torch.float32, True, seed=20)
    case_ptrs_random(fn, kernel, [(37, 45, 20), (5, 9, 16), (70, 20, 33)], torch.float32, True, seed=21)
    case_ptrs_random(fn, kernel, [(20, 37, 45), (40, 8, 16)], torch.float16, False, seed=22)


# ---------------------------------------------------------------------------------------
# compare_dispatch

def dispatch_model(B, H, M, N, K, dtype, tile):
    """{strategy: (launches, bytes)} as compare_dispatch's docstring defines them."""
    pairs, size = B * H, torch.empty((), dtype=dtype).element_size()
    gemm = pairs * (reference_dram_reads(M, N, K, tile) + M * N) * size
    return {"loop": (pairs, gemm), "strided": (1, gemm), "ptrs": (1, gemm + pairs * 6 * 8),
            "stack": (3, gemm + 2 * pairs * (M * K + K * N) * size)}


_GEMM_BYTES = "pairs * (dram_reads(M, N, K, TILE) + M * N) * element size"
_DISPATCH_HINTS = {  # strategy: (launches, bytes), as the docstring counts them
    "loop": ("one matmul launch per (batch, head) pair: B * H", _GEMM_BYTES),
    "strided": ("one launch for every pair", _GEMM_BYTES),
    "ptrs": ("one launch for every pair (copying the table is not a launch)",
             _GEMM_BYTES + " + pairs * 6 * 8 for the table of 6 int64 per pair"),
    "stack": ("torch.stack once for A and once for B, then one strided launch: 3",
              _GEMM_BYTES + " + 2 * pairs * (M * K + K * N) * element size: the copies read "
              "and write every element of A and B once more"),
}


def case_compare_dispatch(fn, B, H, M, N, K, dtype, tile):
    name = f"compare_dispatch(B={B}, H={H}, M={M}, N={N}, K={K}, {dtype_name(dtype)})"
    rows = fn(B, H, M, N, K, dtype)
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, dict) for r in rows):
        fail(f"{name} should return a list of dicts, got {type(rows).__name__}")
    by_name = {r.get("strategy"): r for r in rows}
    for strategy, (launches, size) in dispatch_model(B, H, M, N, K, dtype, tile).items():
        row = by_name.get(strategy)
        if row is None:
            fail(f"{name} has no row with strategy {strategy!r} (rows: {list(by_name)})")
        for key, want, hint in zip(("launches", "bytes"), (launches, size), _DISPATCH_HINTS[strategy]):
            if row.get(key) != want:
                fail(f"{name}, strategy {strategy!r}: {key} is {row.get(key)}, expected {want}: "
                     f"{hint}")
        us = row.get("us", "missing")
        if INTERPRET and us is not None:
            fail(f"{name}, strategy {strategy!r}: us should be None in the interpreter "
                 f"(no timing without a GPU), got {us!r}")
        if not INTERPRET and not (isinstance(us, float) and us > 0):
            fail(f"{name}, strategy {strategy!r}: us should be the measured time in "
                 f"microseconds on the GPU, got {us!r}")


def check_compare_dispatch(compare_dispatch, tile):
    for B, H, M, N, K, dtype in [(2, 4, 100, 100, 64, torch.float16), (1, 3, 50, 70, 32, torch.float32)]:
        case_compare_dispatch(compare_dispatch, B, H, M, N, K, dtype, tile)
    print("ok  compare_dispatch: launches and bytes of the four strategies")


# ---------------------------------------------------------------------------------------
# The three kernels, compiled for an H100 without running them

def compile_kernels_for_gpu(matmul_kernel, batched_gemm_strided_kernel, batched_gemm_ptrs_kernel,
                            capability=90):
    """Compile each kernel with the signature the notebook gives it (fp16, GPU blocks)."""
    blocks = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}
    constexprs = dict.fromkeys(blocks, "constexpr")
    matrices = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32"}
    strides_2d = {f"stride_{s}": "i32" for s in ("am", "ak", "bk", "bn", "cm", "cn")}
    strides_4d = {f"stride_{p}{d}": "i32" for p, dims in (("a", "bhmk"), ("b", "bhkn"), ("c", "bhmn"))
                  for d in dims}
    compile_for_gpu(matmul_kernel, matrices | strides_2d | constexprs, blocks, capability)
    compile_for_gpu(batched_gemm_strided_kernel, matrices | strides_4d | constexprs, blocks, capability)
    tables = {"a_ptrs": "*i64", "b_ptrs": "*i64", "c_ptrs": "*i64", "sizes_ptr": "*i64",
              "B_TRANSPOSED": "constexpr", "DTYPE": "constexpr"}
    compile_for_gpu(batched_gemm_ptrs_kernel, tables | constexprs,
                    blocks | {"B_TRANSPOSED": True, "DTYPE": triton.language.float16}, capability)
