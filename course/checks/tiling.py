"""Visible checks of module 03 (tiling and batched GEMM). Hidden tests reuse the `case_*`
functions with inputs the learner never sees: the same kinds of input (memory layouts,
value ranges, long reductions), at other sizes and seeds."""
import contextlib

import torch
import triton

from course import DEVICE, INTERPRET
from course.gpu_compile import compile_for_gpu
from course.recorded import answer
from course.testing import (assert_close, assert_not_trivial,
                            check_rejects, dtype_name, explain_nan_from_guards, fail,
                            guarded_input, guarded_output, randn, run_wrapper, tolerance,
                            watched_call, hinted, join_hints)
from course.rules import Int64Offsets, JitKernel, Launches, checked

# Checked on the submitted code (course/rules.py): the worker's launch count and
# forbidden-function checks are only as honest as the notebook lets them be, and int64
# offsets only matter past 2**31 elements, which a CPU cannot allocate.
RULES = {
    "test_matmul_kernel": [JitKernel("matmul_kernel")],
    "test_matmul": [Launches("matmul", "matmul_kernel", forbid="matmul")],
    "test_batched_gemm_strided": [Launches("batched_gemm_strided", "batched_gemm_strided_kernel",
                                           forbid="matmul"),
                                  Int64Offsets("batched_gemm_strided_kernel")],
    "test_batched_gemm_ptrs": [Launches("batched_gemm_ptrs", "batched_gemm_ptrs_kernel", forbid="matmul")],
}


BLOCK = 32          # block sizes the checks launch a learner's matmul_kernel with
ROW_COL = ("row", "col")
BHMN = ("batch", "head", "row", "col")
# "cancelling" inputs: their first 2 * SPAN entries along K pair up SPAN apart. SPAN is a
# multiple of every BLOCK_K (and tile) the checks use, so each partial sum a kernel keeps
# between K blocks is a whole number, exact in fp32.
SPAN = 64
LARGE = 1e5  # "large" inputs: past fp16's largest value (65,504), their products far inside fp32's
LAYOUTS = ("contiguous", "transposed", "sliced", "strided")  # of an input matrix (in_layout)
OUT_LAYOUTS = ("contiguous", "transposed", "sliced")          # of matmul_kernel's output


def _check_dtype(out, dtype, name):
    if out.dtype != dtype:
        fail(f"{name} is {dtype_name(out.dtype)} but the inputs are {dtype_name(dtype)}: "
             "accumulate in fp32, then return (store) the inputs' dtype")


# ---------------------------------------------------------------------------------------
# Inputs of every product below: values of one kind, laid out in memory one way.

def matmul_values(M, N, K, *, seed, kind="random", lead=()):
    """fp32 a [*lead, M, K] and b [*lead, K, N] on the CPU. kind:
    "random": standard normal;
    "large" (for fp32): a far above zero and b far below, around +-1.5 LARGE, past fp16's
        range;
    "cancelling": along K, a's entries [0, SPAN) are whole numbers from 200 to 300 (so a
        lies far above zero when K < 4 SPAN), b's are whole numbers of magnitude 200 to 300
        of either sign, and entries [SPAN, 2 SPAN) repeat a's and negate b's, so they cancel
        exactly; the rest is normal. The products (up to 90,000) and the partial sums pass
        fp16's largest value, 65,504, though the result does not: an fp32 accumulator keeps
        them exactly, an fp16 one overflows (inf - inf = NaN)."""
    a = randn(*lead, M, K, seed=seed)
    b = randn(*lead, K, N, seed=seed + 1)
    if kind == "large":
        return LARGE * (1.5 + 0.5 * a), -LARGE * (1.5 + 0.5 * b)
    if kind == "cancelling":
        if K <= 2 * SPAN:
            raise ValueError(f"cancelling inputs need K > {2 * SPAN}, got {K}")
        g = torch.Generator().manual_seed(seed + 2)

        def big(*shape, signed):
            values = torch.randint(200, 301, shape, generator=g).float()
            return values * (torch.randint(0, 2, shape, generator=g) * 2 - 1) if signed else values
        a[..., :SPAN] = big(*lead, M, SPAN, signed=False)
        a[..., SPAN:2 * SPAN] = a[..., :SPAN]
        b[..., :SPAN, :] = big(*lead, SPAN, N, signed=True)
        b[..., SPAN:2 * SPAN, :] = -b[..., :SPAN, :]
    elif kind != "random":
        raise ValueError(f"unknown kind of values {kind!r}")
    return a, b


def in_layout(x, layout, *, seed=0):
    """x copied into guarded memory (NaN before and after it) and returned as a view laid out
    as `layout`, which concerns its last two dims unless said otherwise:
    "contiguous" (also "bhmk"); "transposed": stored column by column (strides (1, rows));
    "sliced": a column slice, at a storage offset, of longer rows (random numbers between);
    "strided": every other column of longer rows;
    "bmhk" (4-D): stored as [B, rows, H, cols], how attention's projections come out;
    "shared" (4-D): one matrix per batch entry for all heads (head stride 0), x's head 0."""
    if layout in ("contiguous", "bhmk"):
        return guarded_input(x)
    if layout == "transposed":
        return guarded_input(x.transpose(-1, -2).contiguous()).transpose(-1, -2)
    if layout == "bmhk":
        return guarded_input(x.transpose(1, 2).contiguous()).transpose(1, 2)
    if layout == "shared":
        return guarded_input(x[:, :1].contiguous()).expand(x.shape)
    if layout in ("sliced", "strided"):
        cols = x.shape[-1]
        start, step = (3, 1) if layout == "sliced" else (0, 2)
        wide = randn(*x.shape[:-1], start + step * cols + 2, dtype=x.dtype, device=x.device, seed=seed)
        window = (..., slice(start, start + step * cols, step))
        wide[window] = x
        return guarded_input(wide)[window]
    raise ValueError(f"unknown layout {layout!r}")


def matmul_inputs(M, N, K, dtype, *, seed, kind="random", layouts=("contiguous", "contiguous")):
    """Guarded a [M, K] and b [K, N] of `kind` (see matmul_values), in `layouts`."""
    a, b = (in_layout(t.to(DEVICE, dtype), layout, seed=seed + 7 + i)
            for i, (t, layout) in enumerate(zip(matmul_values(M, N, K, seed=seed, kind=kind), layouts)))
    return a, b


def _kind_name(kind):
    return "" if kind == "random" else f" {kind}"


def _describe(x):
    return (f"[{', '.join(map(str, x.shape))}]"
            + ("" if x.is_contiguous() else f" (a view, strides {tuple(x.stride())})"))


def _row_major(x):
    """x read from its memory as if its last two dims were contiguous (row stride = its
    number of columns): what a kernel that ignores x's strides sees."""
    try:
        return torch.as_strided(x, x.shape, x.stride()[:-2] + (x.shape[-1], 1))
    except RuntimeError:  # it would reach past the memory: no such mistake to name
        return None


def _stride_mistakes(a, b, product, a_advice, b_advice):
    """{description: output} of code that ignores the strides of a non-contiguous a or b
    (product(a, b) is the right answer; the advice says what to do instead)."""
    found = {}
    for name, x, advice, wrong in (("A", a, a_advice, lambda t: product(t, b.double())),
                                   ("B", b, b_advice, lambda t: product(a.double(), t))):
        seen = None if x.is_contiguous() else _row_major(x)
        if seen is not None:
            found[f"{name} was read as if its rows were contiguous, but here it is a view with "
                  f"strides {tuple(x.stride())}: {advice}"] = wrong(seen.double())
    return found


_FP32 = ("accumulate in fp32 (tl.zeros(..., dtype=tl.float32) in a kernel, blocks converted "
         "to fp32 before they are multiplied in PyTorch) and convert only the result")
_HINTS = {
    "random": None,
    "large": f"a is about +{1.5 * LARGE:,.0f} here and b about -{1.5 * LARGE:,.0f}, past fp16's "
             "largest value (65,504): fp32 inputs must stay fp32 all the way",
    "cancelling": "the first K entries here are whole numbers of magnitude 200-300 that cancel "
                  "in pairs: their products (up to 90,000) and partial sums pass fp16's largest "
                  "value, 65,504, and become inf in fp16; " + _FP32,
    "long": "K is long here: an fp16 accumulator rounds every partial sum to 11 bits and the "
            "errors add up; " + _FP32,
}


def _atol(kind, dtype):
    """assert_close's atol for outputs of this kind: errors scale with the products."""
    return tolerance(dtype, DEVICE)[0] * (1.5 * LARGE) ** 2 if kind == "large" else None


def _kind_hint(kind, dtype, K):
    if kind == "random" and dtype == torch.float16 and K >= 256:
        return _HINTS["long"]
    return _HINTS[kind]


# ---------------------------------------------------------------------------------------
# tiled_matmul

def case_tiled_matmul(fn, M, N, K, tile, dtype, *, seed, kind="random",
                      layouts=("contiguous", "contiguous"), quiet=False):
    a, b = matmul_inputs(M, N, K, dtype, seed=seed, kind=kind, layouts=layouts)
    name = (f"tiled_matmul({dtype_name(dtype)}{_kind_name(kind)} {_describe(a)} @ {_describe(b)}, "
            f"tile={tile})")
    expected = a.double() @ b.double()
    last_k = (K - 1) // tile * tile
    mistakes = {"only the last block along K counts: add each block product to the "
                "accumulator (acc += ...) instead of replacing it":
                a[:, last_k:].double() @ b[last_k:].double()}
    out, report = watched_call(fn, a, b, tile, measure_products=True)
    if report["largest_product"] > tile:
        fail(f"{name} multiplied matrices with a side of {report['largest_product']}, larger than the "
             "tile: compute C one tile x tile block at a time, from tile x tile blocks of A and B "
             "(never a whole strip of rows or columns)")
    assert_close(out, expected, name=name, dim_names=ROW_COL, quiet=quiet, mistakes=mistakes,
                 atol=_atol(kind, dtype), hint=_kind_hint(kind, dtype, K) or
                 "every output block sums the products of ALL blocks along K; edge blocks "
                 "are smaller when a size is not a multiple of the tile")
    assert_not_trivial(out, name=name)
    _check_dtype(out, dtype, name)


def check_tiled_matmul(tiled_matmul):
    for M, N, K, tile, dtype in [(37, 45, 50, 16, torch.float32), (20, 20, 20, 32, torch.float32),
                                 (9, 7, 11, 4, torch.float16)]:
        case_tiled_matmul(tiled_matmul, M, N, K, tile, dtype, seed=M)
    case_tiled_matmul(tiled_matmul, 21, 18, 40, 8, torch.float32, seed=5,
                      layouts=("transposed", "sliced"))
    case_tiled_matmul(tiled_matmul, 12, 17, 300, 16, torch.float16, seed=6, layouts=("strided", "contiguous"))
    case_tiled_matmul(tiled_matmul, 10, 13, 150, 16, torch.float16, seed=7, kind="cancelling")
    case_tiled_matmul(tiled_matmul, 11, 9, 30, 8, torch.float32, seed=8, kind="large")


# ---------------------------------------------------------------------------------------
# dram_reads, dram_reads_untiled

_DRAM_READS_MISTAKES = (  # what each value of answers.py's dram_reads_mistakes comes from
    "you counted full tiles only: a ragged last tile is still read in full, so count tiles "
    "with ceil(n / tile) (triton.cdiv), not n // tile",
    "A and B are swapped: each element of A is read once per block COLUMN of C (ceil(n / "
    "tile) times), each element of B once per block ROW (ceil(m / tile))",
    "that counts each input once, as if everything stayed in SRAM")


def case_dram_reads(dram_reads, dram_reads_untiled, m, n, k, tile):
    name = f"dram_reads(m={m}, n={n}, k={k}, tile={tile})"
    got = dram_reads(m, n, k, tile)
    want = answer("tiling", "dram_reads", m, n, k, tile)
    why = dict(zip(answer("tiling", "dram_reads_mistakes", m, n, k, tile), _DRAM_READS_MISTAKES))
    if got != want:
        fail(f"{name} is {got}, expected {want}. " + why.get(got, "Follow the model in the "
             "docstring: A is read ceil(n / tile) times, B ceil(m / tile) times."))
    untiled, want = dram_reads_untiled(m, n, k), answer("tiling", "dram_reads_untiled", m, n, k)
    if untiled != want:
        fail(f"dram_reads_untiled(m={m}, n={n}, k={k}) is {untiled}, expected {want}: "
             "each of the m*n outputs reads a row of A (k elements) and a column of B (k)")


DRAM_READS_CASES = [(64, 64, 64, 16), (100, 70, 64, 32), (5, 5, 5, 8), (7, 3, 2, 1), (4096, 4096, 64, 128)]


def check_dram_reads(dram_reads, dram_reads_untiled):
    for m, n, k, tile in DRAM_READS_CASES:
        case_dram_reads(dram_reads, dram_reads_untiled, m, n, k, tile)
    print("ok  dram_reads and dram_reads_untiled follow the model")


# ---------------------------------------------------------------------------------------
# matmul_kernel (launched directly on guarded buffers) and the matmul wrapper

@contextlib.contextmanager
def output_in_layout(shape, dtype, layout, *, name):
    """An [M, N] output for a kernel to fill, guarded (see guarded_output), laid out as
    `layout`: "contiguous"; "transposed": stored column by column (strides (1, M));
    "sliced": the first N columns of rows N + 5 long (strides (N + 5, 1)), whose last 5
    entries must stay untouched."""
    M, N = shape
    if layout == "transposed":
        with guarded_output((N, M), dtype, DEVICE, name=f"{name} (stored transposed, so "
                            "positions below are (col, row))") as out:
            yield out.t()
    else:
        with guarded_output(shape, dtype, DEVICE, name=name,
                            gaps=(0, 5) if layout == "sliced" else None) as out:
            yield out


def _explain_nan(out, *, name, kind, hint=None):
    """NaN in an output means a load read past a guarded input, except with cancelling
    inputs, where an fp16 accumulator makes NaN of its own (inf - inf): assert_close then
    explains it with the kind's hint."""
    if kind != "cancelling" and isinstance(out, torch.Tensor):
        with hinted(hint):
            explain_nan_from_guards(out, name=name)


def _views_hint(tensors, addresses):
    """A hint for inputs that are views: where their elements are."""
    views = [f"{name} (strides {tuple(t.stride())})" for name, t in tensors.items()
             if not t.is_contiguous()]
    if views:
        return (f"{' and '.join(views)} {'is a view' if len(views) == 1 else 'are views'} here: "
                f"{addresses}, from the strides the caller passes, never from the sizes.")
    return None


def case_matmul_kernel(kernel, a, b, *, name, kind="random", out_layout="contiguous",
                       blocks=(BLOCK, BLOCK, BLOCK), quiet=False):
    """Launch kernel on a [M, K], b [K, N] (guarded, any strides) into a guarded output
    laid out as out_layout, with blocks (BLOCK_M, BLOCK_N, BLOCK_K)."""
    (M, K), N = a.shape, b.shape[1]
    block_m, block_n, block_k = blocks
    expected = a.double() @ b.double()
    blocks_hint = len(set(blocks)) > 1 and (
        f"the blocks differ here (BLOCK_M={block_m}, BLOCK_N={block_n}, BLOCK_K={block_k}): "
        "rows step by BLOCK_M, columns by BLOCK_N, K by BLOCK_K")
    layout_hint = out_layout != "contiguous" and (
        f"the output is a {out_layout} view here: store C[m, n] at c_ptr + m * stride_cm + "
        "n * stride_cn, with the strides you are given")
    views_hint = _views_hint({"a": a, "b": b}, "A[m, k] is at a_ptr + m * stride_am + "
                             "k * stride_ak and B[k, n] at b_ptr + k * stride_bk + n * stride_bn")
    with hinted(join_hints(layout_hint, blocks_hint)):
        with output_in_layout((M, N), a.dtype, out_layout, name=f"the output of {name}") as out:
            kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
                a, b, out, M, N, K, *a.stride(), *b.stride(), *out.stride(),
                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    _explain_nan(out, name=name, kind=kind, hint=views_hint)
    hint = join_hints(_kind_hint(kind, a.dtype, K), blocks_hint, views_hint, layout_hint)
    mistakes = _stride_mistakes(a, b, lambda x, y: x @ y,
                                "A[m, k] is at a_ptr + m * stride_am + k * stride_ak",
                                "B[k, n] is at b_ptr + k * stride_bk + n * stride_bn")
    if out_layout == "transposed":
        mistakes["C was stored as if it were contiguous, but here it is a transposed view "
                 f"(strides {tuple(out.stride())}): store C[m, n] at c_ptr + m * stride_cm + "
                 "n * stride_cn"] = expected.flatten().view(N, M).t()
    assert_close(out, expected, name=name, dim_names=ROW_COL, hint=hint, quiet=quiet,
                 mistakes=mistakes, atol=_atol(kind, a.dtype))
    assert_not_trivial(out, name=name)


def case_matmul_kernel_random(kernel, M, N, K, dtype, *, seed, kind="random",
                              layouts=("contiguous", "contiguous"), out_layout="contiguous",
                              blocks=(BLOCK, BLOCK, BLOCK), quiet=False):
    a, b = matmul_inputs(M, N, K, dtype, seed=seed, kind=kind, layouts=layouts)
    name = (f"matmul_kernel on {dtype_name(dtype)}{_kind_name(kind)} "
            f"{_describe(a)} @ {_describe(b)}"
            + ("" if out_layout == "contiguous" else f" into a {out_layout} output")
            + ("" if blocks == (BLOCK,) * 3 else " with (BLOCK_M, BLOCK_N, BLOCK_K) = "
               f"{tuple(blocks)}"))
    case_matmul_kernel(kernel, a, b, name=name, kind=kind, out_layout=out_layout, blocks=blocks,
                       quiet=quiet)


@checked(RULES)
def check_matmul_kernel(matmul_kernel):
    def case(*args, **kwargs):
        case_matmul_kernel_random(matmul_kernel, *args, **kwargs)
    case(37, 45, 50, torch.float32, seed=1)
    case(33, 20, 70, torch.float16, seed=2, layouts=("contiguous", "transposed"))
    case(20, 24, 160, torch.float16, seed=3, kind="cancelling")
    case(21, 35, 40, torch.float32, seed=4, layouts=("transposed", "sliced"), out_layout="sliced")
    case(18, 45, 256, torch.float16, seed=5, layouts=("strided", "contiguous"),
         out_layout="transposed", blocks=(16, 32, 16))
    case(25, 19, 33, torch.float32, seed=6, kind="large", blocks=(32, 16, 16))


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


def case_matmul(matmul, kernel, a, b, *, name, kind="random", quiet=False):
    (M, K), N = a.shape, b.shape[1]
    expected = a.double() @ b.double()

    def grid(meta):
        return ((triton.cdiv(M, meta.get("BLOCK_M", 1)), triton.cdiv(N, meta.get("BLOCK_N", 1)), 1),
                "(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)) for the blocks it is launched with")
    out = run_wrapper(matmul, kernel, a, b, forbid="matmul", name=name, launches=1,
                      hint="one launch on a grid of (row tiles, column tiles) computes the whole product",
                      before_launch=_grid_is(grid, name))
    _explain_nan(out, name=name, kind=kind)
    assert_close(out, expected, name=name, dim_names=ROW_COL, quiet=quiet,
                 hint=join_hints(_kind_hint(kind, a.dtype, K),
                             _views_hint({"a": a, "b": b}, "pass a.stride() and b.stride()")),
                 atol=_atol(kind, a.dtype),
                 mistakes=_stride_mistakes(a, b, lambda x, y: x @ y, "pass a.stride() to the kernel",
                                           "pass b.stride() to the kernel"))
    _check_dtype(out, a.dtype, name)


def case_matmul_random(matmul, kernel, M, N, K, dtype, *, seed, kind="random",
                       layouts=("contiguous", "contiguous"), quiet=False):
    a, b = matmul_inputs(M, N, K, dtype, seed=seed, kind=kind, layouts=layouts)
    case_matmul(matmul, kernel, a, b, kind=kind, quiet=quiet,
                name=f"matmul({dtype_name(dtype)}{_kind_name(kind)} "
                     f"{_describe(a)} @ {_describe(b)})")


def _bad_matmul_inputs(matmul):
    x = torch.ones(4, 6, device=DEVICE)
    return [("a 1-D a", lambda: matmul(torch.ones(6, device=DEVICE), x)),
            ("a [4, 6] @ [4, 6] (inner sizes differ)", lambda: matmul(x, x)),
            ("int32 inputs", lambda: matmul(x.int(), x.t().int())),
            ("a float32 a with a float16 b", lambda: matmul(x, x.t().half()))] + (
        [] if INTERPRET else [("CPU tensors", lambda: matmul(x.cpu(), x.t().cpu()))])


@checked(RULES)
def check_matmul(matmul, matmul_kernel):
    def case(*args, **kwargs):
        case_matmul_random(matmul, matmul_kernel, *args, **kwargs)
    case(70, 45, 33, torch.float32, seed=4)
    case(40, 50, 20, torch.float16, seed=6, layouts=("transposed", "contiguous"))
    case(50, 30, 40, torch.float32, seed=8, layouts=("sliced", "strided"))
    case(140, 37, 48, torch.float32, seed=9)
    case(24, 30, 300, torch.float16, seed=10, layouts=("contiguous", "transposed"))
    case(20, 33, 160, torch.float16, seed=11, kind="cancelling")
    case(30, 21, 40, torch.float32, seed=12, kind="large", layouts=("contiguous", "strided"))
    check_rejects(_bad_matmul_inputs(matmul), name="matmul")
    print("ok  matmul rejects bad inputs with clear errors")


# ---------------------------------------------------------------------------------------
# batched_gemm_strided, batched_gemm_ptrs: one launch each, on the grid the design note says

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


def case_strided(fn, kernel, a, b, b_transposed, *, name, kind="random", quiet=False):
    expected = a.double() @ _bt(b.double(), b_transposed)
    B, H, M, K = a.shape

    def grid(meta):
        return ((H, triton.cdiv(M, meta.get("BLOCK_M", 1)), B),
                "the design note's grid (heads, cdiv(M, BLOCK_M), batch)")
    out = run_wrapper(fn, kernel, a, b, b_transposed, forbid="matmul", name=name, launches=1,
                      hint="one launch must cover every (batch, head) pair",
                      before_launch=_grid_is(grid, name))
    _explain_nan(out, name=name, kind=kind)
    mistakes = _strided_mistakes(a, b, b_transposed) | _stride_mistakes(
        a, b, lambda x, y: x @ _bt(y, b_transposed),
        "pass every stride of a to the kernel (a.stride()), the row and column strides included",
        "pass every stride of b to the kernel (b.stride()), the row and column strides included")
    assert_close(out, expected, name=name, dim_names=BHMN, quiet=quiet, mistakes=mistakes,
                 hint=join_hints(_kind_hint(kind, a.dtype, K), _views_hint(
                     {"a": a, "b": b}, "pass all four strides of a and of b (x.stride())")),
                 atol=_atol(kind, a.dtype))
    assert_not_trivial(out, name=name)
    _check_dtype(out, a.dtype, name)


def strided_inputs(B, H, M, N, K, dtype, b_transposed, *, seed, layout="bhmk", kind="random"):
    """Guarded a [B, H, M, K] and b ([B, H, N, K] if b_transposed, else [B, H, K, N]) of
    `kind` (see matmul_values), both laid out as `layout` (see in_layout), except for
    "shared": a contiguous and b one matrix per batch entry for all heads, the way
    multi-query attention shares K and V."""
    a, b = matmul_values(M, N, K, seed=seed, kind=kind, lead=(B, H))
    a_layout, b_layout = ("contiguous", "shared") if layout == "shared" else (layout, layout)
    return (in_layout(a.to(DEVICE, dtype), a_layout, seed=seed + 7),
            in_layout(_bt(b, b_transposed).to(DEVICE, dtype), b_layout, seed=seed + 8))


def case_strided_random(fn, kernel, B, H, M, N, K, dtype, b_transposed, *, seed, layout="bhmk",
                        kind="random", quiet=False):
    a, b = strided_inputs(B, H, M, N, K, dtype, b_transposed, seed=seed, layout=layout, kind=kind)
    what = "Q @ K^T" if b_transposed else "P @ V"
    case_strided(fn, kernel, a, b, b_transposed, kind=kind, quiet=quiet,
                 name=f"batched_gemm_strided ({what}, {dtype_name(dtype)}"
                      f"{_kind_name(kind)}, a {_describe(a)}, b {_describe(b)})")


@checked(RULES)
def check_batched_gemm_strided(batched_gemm_strided, batched_gemm_strided_kernel):
    def case(*args, **kwargs):
        case_strided_random(batched_gemm_strided, batched_gemm_strided_kernel, *args, **kwargs)
    for b_transposed in (True, False):  # square, B == H: every classic mistake has a name
        case(2, 2, 40, 40, 40, torch.float32, b_transposed, seed=10)
    case(2, 3, 37, 45, 20, torch.float32, True, seed=11)
    case(2, 3, 37, 20, 45, torch.float16, False, seed=12, layout="bmhk")
    case(2, 2, 24, 20, 36, torch.float32, True, seed=13, layout="transposed")
    case(1, 3, 20, 36, 24, torch.float16, False, seed=14, layout="sliced")
    case(2, 2, 30, 20, 16, torch.float32, False, seed=15, layout="shared")
    case(1, 2, 18, 20, 160, torch.float16, True, seed=16, layout="strided", kind="cancelling")
    case(1, 2, 20, 24, 256, torch.float16, False, seed=17)
    case(2, 1, 20, 24, 40, torch.float32, True, seed=18, kind="large")


def _pair_mistakes(a_list, b_list, p, b_transposed):
    """Pair p computed from pair 0's A or B: the pointer array not indexed by the pair."""
    if p == 0 or any(t.shape != a_list[0].shape for t in a_list) or \
            any(t.shape != b_list[0].shape for t in b_list):
        return {}
    a0, b0 = a_list[0].double(), _bt(b_list[0].double(), b_transposed)
    ap, bp = a_list[p].double(), _bt(b_list[p].double(), b_transposed)
    return {"pair p used pair 0's A: load a_ptrs + pair (one address per pair), not a_ptrs": a0 @ bp,
            "pair p used pair 0's B: load b_ptrs + pair (one address per pair), not b_ptrs": ap @ b0}


def case_ptrs(fn, kernel, a_list, b_list, b_transposed, *, name, kind="random", quiet=False):
    expected = [x.double() @ _bt(y.double(), b_transposed) for x, y in zip(a_list, b_list)]
    tallest = max(x.shape[0] for x in a_list)
    views = [f"{which}_list[{i}]" for which, ts in (("a", a_list), ("b", b_list))
             for i, t in enumerate(ts) if not t.is_contiguous()]
    hint = join_hints(_kind_hint(kind, a_list[0].dtype, max(x.shape[1] for x in a_list)), views and
                  f"{', '.join(views)} are non-contiguous views here (transposed, or slices of "
                  "longer rows): the kernel reads every matrix as contiguous rows, so the "
                  "wrapper must put the addresses of .contiguous() copies in the table")

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
        _explain_nan(o, name=pair, kind=kind)
        assert_close(o, e, name=pair, dim_names=ROW_COL, quiet=True, hint=hint,
                     atol=_atol(kind, a_list[p].dtype),
                     mistakes=_pair_mistakes(a_list, b_list, p, b_transposed))
        assert_not_trivial(o, name=pair)
        _check_dtype(o, a_list[p].dtype, pair)
    if not quiet:
        print(f"ok  {name}: {len(out)} pairs")


def ptrs_inputs(shapes, dtype, b_transposed, *, seed, kind="random", layouts=("contiguous",)):
    """One guarded allocation per matrix of `kind` (see matmul_values); shapes is a list of
    (M, N, K). Pair i's a is laid out as layouts[i % len(layouts)], its b as the next
    layout in the list (see in_layout)."""
    a_list, b_list = [], []
    for i, (M, N, K) in enumerate(shapes):
        a, b = matmul_values(M, N, K, seed=seed + 2 * i, kind=kind)
        a_list.append(in_layout(a.to(DEVICE, dtype), layouts[i % len(layouts)], seed=seed + i))
        b_list.append(in_layout(_bt(b, b_transposed).to(DEVICE, dtype),
                                layouts[(i + 1) % len(layouts)], seed=seed + i + 1))
    return a_list, b_list


def case_ptrs_random(fn, kernel, shapes, dtype, b_transposed, *, seed, kind="random",
                     layouts=("contiguous",), quiet=False):
    a_list, b_list = ptrs_inputs(shapes, dtype, b_transposed, seed=seed, kind=kind, layouts=layouts)
    what = "Q @ K^T" if b_transposed else "P @ V"
    case_ptrs(fn, kernel, a_list, b_list, b_transposed, kind=kind, quiet=quiet,
              name=f"batched_gemm_ptrs ({what}, {dtype_name(dtype)}"
                   f"{_kind_name(kind)}, {len(shapes)} pairs (M, N, K) = "
                   f"{shapes}{'' if layouts == ('contiguous',) else ', layouts ' + ', '.join(layouts)})")


def case_ptrs_one_tensor(fn, kernel, P, M, N, K, dtype, b_transposed, *, seed, layout="bhmk",
                         quiet=False):
    """The P pairs are the heads of one [1, P, ...] tensor each (strided_inputs): matrices
    at storage offsets of one allocation, views that are not contiguous unless layout is
    "bhmk"."""
    a, b = strided_inputs(1, P, M, N, K, dtype, b_transposed, seed=seed, layout=layout)
    what = "Q @ K^T" if b_transposed else "P @ V"
    case_ptrs(fn, kernel, list(a[0]), list(b[0]), b_transposed, quiet=quiet,
              name=f"batched_gemm_ptrs ({what}, {dtype_name(dtype)}, the {P} heads of one tensor "
                   f"a {_describe(a)} and b {_describe(b)})")


@checked(RULES)
def check_batched_gemm_ptrs(batched_gemm_ptrs, batched_gemm_ptrs_kernel):
    fn, kernel = batched_gemm_ptrs, batched_gemm_ptrs_kernel
    case_ptrs_one_tensor(fn, kernel, 3, 40, 33, 32, torch.float32, True, seed=20, layout="bmhk")
    case_ptrs_random(fn, kernel, [(37, 45, 20), (5, 9, 16), (70, 20, 33)], torch.float32, True, seed=21,
                     layouts=("transposed", "sliced", "strided"))
    case_ptrs_random(fn, kernel, [(20, 37, 300), (40, 8, 16)], torch.float16, False, seed=22)
    case_ptrs_random(fn, kernel, [(20, 24, 160), (9, 30, 256)], torch.float16, False, seed=25,
                     kind="cancelling")
    case_ptrs_random(fn, kernel, [(12, 20, 40), (30, 9, 24)], torch.float32, True, seed=26, kind="large")


# ---------------------------------------------------------------------------------------
# compare_dispatch

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
    for strategy, (launches, size) in answer("tiling", "dispatch_model", B, H, M, N, K, dtype, tile).items():
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


DISPATCH_CASES = [(2, 4, 100, 100, 64, torch.float16), (1, 3, 50, 70, 32, torch.float32),
                  (8, 16, 1, 512, 64, torch.float16)]


def check_compare_dispatch(compare_dispatch, tile):
    for B, H, M, N, K, dtype in DISPATCH_CASES:
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


def show_matmul_loads(matmul_kernel, tile=16):
    """Draw how many times the learner's kernel loaded each element of A and B, and which
    program stored each tile of C, for a 40 x 24 by 24 x 56 product in tiles of 16."""
    import matplotlib.pyplot as plt

    from course import bounds, plots
    if not INTERPRET:
        print("The recording needs Triton's interpreter: run this notebook with TRITON_INTERPRET=1 to see it.")
        return
    a, b = torch.randn(40, 24), torch.randn(24, 56)
    c = torch.empty(40, 56)
    grid = (triton.cdiv(40, tile), triton.cdiv(56, tile))
    accesses, error = bounds.record(lambda: matmul_kernel[grid](
        a, b, c, 40, 56, 24, *a.stride(), *b.stride(), *c.stride(),
        BLOCK_M=tile, BLOCK_N=tile, BLOCK_K=tile))
    plots.kernel_accesses(accesses, [("a_ptr", a, "load"), ("b_ptr", b, "load")], show="count",
                          title=f"A (40 x 24) and B (24 x 56): times each element was loaded, grid {grid}")
    plots.kernel_accesses(accesses, [("c_ptr", c, "store")],
                          title="C (40 x 56): the program that stored each element")
    plt.show()
    if error:
        print("It stopped:", error)
