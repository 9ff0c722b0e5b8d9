"""Module 03: tiling and batched GEMM.

Read it top to bottom: a tiled matmul in plain PyTorch and the DRAM reads it saves, the
same tiles as one Triton kernel, then the two ways the design note dispatches the many
small GEMMs of attention (one per batch and head): strides over [B, H, M, K] tensors,
or an array of pointers to separately allocated matrices. `compare_dispatch` puts
numbers on the choice.
"""
import course  # first: chooses GPU or interpreter before triton is imported
import torch
import triton
import triton.language as tl
import triton.testing

# Output tiles are TILE x TILE; K is walked TILE_K at a time. 64 keeps a GPU's tensor
# cores busy; 32 keeps the interpreter's small checks ragged (sizes like 40 or 70).
TILE = course.pick(32, 64)
TILE_K = 32
# CUDA caps grid axes 1 and 2 at 65535 programs (axis 0 at 2**31 - 1).
MAX_GRID_YZ = 65535

TRITON_DTYPES = {torch.float16: tl.float16, torch.float32: tl.float32,
                 torch.bfloat16: tl.bfloat16}


def check_inputs(tensors: dict, rank: int):
    """Check the inputs {name: tensor} of every wrapper below before any launch.

    Each must be a non-empty torch.Tensor with `rank` dims, of a dtype in TRITON_DTYPES
    (bfloat16 only on a GPU: the interpreter computes it wrongly), on course.DEVICE; all
    must share one dtype. Raise TypeError (type, dtype) or ValueError (rank, device, size)
    with a message naming the input.
    """
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name} must have {rank} dims, got shape {tuple(t.shape)}")
        if t.dtype not in TRITON_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, float32, bfloat16")
        if t.dtype == torch.bfloat16 and course.INTERPRET:
            raise TypeError(f"{name} is bfloat16, which Triton's interpreter computes wrongly: "
                            "use float16 or float32 on a CPU (bfloat16 works on a GPU)")
        if t.device.type != course.DEVICE:
            raise ValueError(f"{name} is on {t.device}, but kernels run on {course.DEVICE}")
        if t.numel() == 0:
            raise ValueError(f"{name} is empty (shape {tuple(t.shape)})")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        raise TypeError(f"inputs must share one dtype, got {sorted(map(str, dtypes))}")


# ---------------------------------------------------------------------------------------
# Tiling in plain PyTorch, and what it saves.

def tiled_matmul(a, b, tile):
    """C = A @ B computed one tile x tile block of C at a time.

    For each output block, walk K in steps of `tile`, adding the product of an A block
    and a B block into an accumulator (fp32, or fp64 for fp64 inputs). Sizes need not be
    multiples of the tile: slicing past the end gives the smaller edge blocks.
    """
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"need a [M, K] and b [K, N], got {tuple(a.shape)} and {tuple(b.shape)}")
    if not isinstance(tile, int) or tile < 1:
        raise ValueError(f"tile must be a positive int, got {tile!r}")
    (M, K), N = a.shape, b.shape[1]
    acc_dtype = torch.promote_types(a.dtype, torch.float32)
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    for i in range(0, M, tile):
        for j in range(0, N, tile):
            acc = torch.zeros(min(tile, M - i), min(tile, N - j), dtype=acc_dtype, device=a.device)
            for p in range(0, K, tile):
                acc += a[i:i + tile, p:p + tile].to(acc_dtype) @ b[p:p + tile, j:j + tile].to(acc_dtype)
            c[i:i + tile, j:j + tile] = acc
    return c


def dram_reads(m, n, k, tile):
    """Elements of A [m, k] and B [k, n] read from DRAM by the tiled C = A @ B.

    Model: C is computed one tile x tile block at a time. For one block, its strip of A
    (tile rows x k) and its strip of B (k x tile columns) are read from DRAM once, pass
    through SRAM, and are dropped; nothing is kept from one output block to the next.
    So each element of A is read once per block column of C, ceil(n / tile) times, and
    each element of B once per block row, ceil(m / tile) times: a ragged last block still
    costs a full read of its strip. Writes of C (m * n either way) are not counted.
    """
    return m * k * triton.cdiv(n, tile) + k * n * triton.cdiv(m, tile)


def dram_reads_untiled(m, n, k):
    """Elements read from DRAM when each of the m * n outputs reads its own row of A and
    column of B, with nothing reused from SRAM: 2 * m * n * k (the tiled count at tile=1)."""
    return 2 * m * n * k


# ---------------------------------------------------------------------------------------
# The same tiles in Triton. `matmul_tile` is the inner loop every kernel below shares.

@triton.jit
def matmul_tile(a_ptr, b_ptr, offs_m, offs_n, M, N, K,
                stride_am, stride_ak, stride_bk, stride_bn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The [BLOCK_M, BLOCK_N] tile of A @ B at rows offs_m and columns offs_n, in fp32.

    Walks K in steps of BLOCK_K. Every load is masked: rows, columns and K entries past
    the end read 0, which adds nothing to the dot products.
    """
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak,
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        b = tl.load(b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def store_tile(c_ptr, tile, rows, cols, M, N, stride_cm, stride_cn):
    """Write an fp32 tile into C[rows, cols] in C's dtype, skipping rows and columns past the end."""
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn,
             tile.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per output tile: program (i, j) computes C[i-th row block, j-th column block]."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = matmul_tile(a_ptr, b_ptr, offs_m, offs_n, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K)
    store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)


def matmul(a, b):
    """C = A @ B for a [M, K] and b [K, N] of any sizes and strides, in a's dtype."""
    check_inputs({"a": a, "b": b}, rank=2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dims differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty(M, N, dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(M, TILE), triton.cdiv(N, TILE))
    if grid[1] > MAX_GRID_YZ:
        raise ValueError(f"N={N} needs {grid[1]} column tiles, over CUDA's {MAX_GRID_YZ} on grid axis 1")
    matmul_kernel[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
                        BLOCK_M=TILE, BLOCK_N=TILE, BLOCK_K=TILE_K)
    return c


# ---------------------------------------------------------------------------------------
# Batched GEMM, dispatch 1: one launch over [B, H, M, K] tensors, addressed by strides.

@triton.jit
def batched_gemm_strided_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                                stride_ab, stride_ah, stride_am, stride_ak,
                                stride_bb, stride_bh, stride_bk, stride_bn,
                                stride_cb, stride_ch, stride_cm, stride_cn,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr):
    """Grid (heads, cdiv(M, BLOCK_M), batch): program (h, i, b) computes row block i of C[b, h].

    It loops over all column blocks of its rows itself: the grid has only three axes, and
    the design note spends them on head, row block and batch.
    """
    head = tl.program_id(0).to(tl.int64)  # int64: batch * stride_ab can pass 2**31
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    batch = tl.program_id(2).to(tl.int64)
    a_ptr += batch * stride_ab + head * stride_ah
    b_ptr += batch * stride_bb + head * stride_bh
    c_ptr += batch * stride_cb + head * stride_ch
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        acc = matmul_tile(a_ptr, b_ptr, offs_m, offs_n, M, N, K,
                          stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K)
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)


def batched_gemm_strided(a, b, b_transposed):
    """C[b, h] = A[b, h] @ B[b, h]^T (b_transposed=True, b is [B, H, N, K]: Q @ K^T)
    or A[b, h] @ B[b, h] (False, b is [B, H, K, N]: P @ V), for a [B, H, M, K].

    One launch for all B * H products. Inputs may be non-contiguous views: every stride
    is passed to the kernel in elements. Returns a contiguous [B, H, M, N] in a's dtype.
    """
    check_inputs({"a": a, "b": b}, rank=4)
    if not isinstance(b_transposed, bool):
        raise TypeError(f"b_transposed must be True or False, got {b_transposed!r}")
    B, H, M, K = a.shape
    N, Kb = (b.shape[2], b.shape[3]) if b_transposed else (b.shape[3], b.shape[2])
    if tuple(b.shape[:2]) != (B, H) or Kb != K:
        want = f"[{B}, {H}, N, {K}]" if b_transposed else f"[{B}, {H}, {K}, N]"
        raise ValueError(f"b must be {want} for a {tuple(a.shape)} with b_transposed="
                         f"{b_transposed}, got {tuple(b.shape)}")
    grid = (H, triton.cdiv(M, TILE), B)
    if max(grid[1:]) > MAX_GRID_YZ:
        raise ValueError(f"grid {grid} passes CUDA's limit of {MAX_GRID_YZ} on axes 1 and 2")
    c = torch.empty(B, H, M, N, dtype=a.dtype, device=a.device)
    # B^T is B read with its last two strides swapped: no copy, no transpose in the kernel.
    sb = b.stride()
    stride_bk, stride_bn = (sb[3], sb[2]) if b_transposed else (sb[2], sb[3])
    batched_gemm_strided_kernel[grid](a, b, c, M, N, K, *a.stride(),
                                      sb[0], sb[1], stride_bk, stride_bn, *c.stride(),
                                      BLOCK_M=TILE, BLOCK_N=TILE, BLOCK_K=TILE_K)
    return c


# ---------------------------------------------------------------------------------------
# Batched GEMM, dispatch 2: one launch over separately allocated matrices, through an
# array of their addresses.

@triton.jit
def batched_gemm_ptrs_kernel(a_ptrs, b_ptrs, c_ptrs, sizes_ptr,
                             B_TRANSPOSED: tl.constexpr, DTYPE: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr):
    """Grid (pairs, cdiv(max M, BLOCK_M)): program (p, i) computes row block i of pair p.

    a_ptrs/b_ptrs/c_ptrs hold each pair's address as int64; sizes_ptr holds (M, N, K) per
    pair, since pairs may differ in shape. Matrices are contiguous, so their strides
    follow from their sizes.
    """
    pair = tl.program_id(0)
    M = tl.load(sizes_ptr + 3 * pair)
    N = tl.load(sizes_ptr + 3 * pair + 1)
    K = tl.load(sizes_ptr + 3 * pair + 2)
    row0 = tl.program_id(1) * BLOCK_M
    if row0 < M:  # the grid fits the tallest pair; shorter pairs leave programs idle
        a_ptr = tl.load(a_ptrs + pair).to(tl.pointer_type(DTYPE))
        b_ptr = tl.load(b_ptrs + pair).to(tl.pointer_type(DTYPE))
        c_ptr = tl.load(c_ptrs + pair).to(tl.pointer_type(DTYPE))
        if B_TRANSPOSED:  # b is [N, K]
            stride_bk, stride_bn = 1, K
        else:  # b is [K, N]
            stride_bk, stride_bn = N, 1
        offs_m = row0 + tl.arange(0, BLOCK_M)
        for n0 in range(0, N, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            acc = matmul_tile(a_ptr, b_ptr, offs_m, offs_n, M, N, K,
                              K, 1, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K)
            store_tile(c_ptr, acc, offs_m, offs_n, M, N, N, 1)


def batched_gemm_ptrs(a_list, b_list, b_transposed):
    """C_p = A_p @ B_p^T (b_transposed=True, B_p is [N_p, K_p]) or A_p @ B_p (False,
    B_p is [K_p, N_p]) for lists of 2-D matrices A_p [M_p, K_p], one pair per
    (batch, head), each its own allocation, shapes free to differ between pairs.

    One launch: the matrices' addresses go into int64 tensors the kernel reads. Returns
    the list of C_p, [M_p, N_p] in the inputs' dtype (contiguous views into one new
    buffer). Non-contiguous inputs are copied to contiguous ones first.
    """
    if not isinstance(b_transposed, bool):
        raise TypeError(f"b_transposed must be True or False, got {b_transposed!r}")
    if not isinstance(a_list, (list, tuple)) or not isinstance(b_list, (list, tuple)):
        raise TypeError("a_list and b_list must be lists of 2-D tensors")
    if len(a_list) != len(b_list) or not a_list:
        raise ValueError(f"need as many a's as b's, at least one: got {len(a_list)} and {len(b_list)}")
    check_inputs({f"{name}_list[{i}]": t for name, ts in (("a", a_list), ("b", b_list))
                   for i, t in enumerate(ts)}, rank=2)
    a_list = [t.contiguous() for t in a_list]
    b_list = [t.contiguous() for t in b_list]
    sizes = []
    for i, (a, b) in enumerate(zip(a_list, b_list)):
        (M, K), (N, Kb) = a.shape, (b.shape if b_transposed else b.shape[::-1])
        if Kb != K:
            raise ValueError(f"pair {i}: a is {tuple(a.shape)} but b is {tuple(b.shape)} "
                             f"(b_transposed={b_transposed})")
        sizes.append((M, N, K))
    pairs = len(sizes)
    grid = (pairs, triton.cdiv(max(M for M, _, _ in sizes), TILE))
    if grid[1] > MAX_GRID_YZ:
        raise ValueError(f"grid {grid} passes CUDA's limit of {MAX_GRID_YZ} on axis 1")
    # The outputs are views into one new buffer: one allocation instead of one per pair.
    first = a_list[0]
    out = torch.empty(sum(M * N for M, N, _ in sizes), dtype=first.dtype, device=first.device)
    c_list = [c.view(M, N) for c, (M, N, _) in zip(out.split([M * N for M, N, _ in sizes]), sizes)]
    # One host-to-device copy carries the whole table: the a, b and c addresses, then
    # (M, N, K) pair by pair.
    table = torch.tensor([t.data_ptr() for t in a_list + b_list + c_list]
                         + [size for pair in sizes for size in pair],
                         dtype=torch.int64).to(first.device)
    batched_gemm_ptrs_kernel[grid](table[:pairs], table[pairs:2 * pairs],
                                   table[2 * pairs:3 * pairs], table[3 * pairs:],
                                   B_TRANSPOSED=b_transposed, DTYPE=TRITON_DTYPES[first.dtype],
                                   BLOCK_M=TILE, BLOCK_N=TILE, BLOCK_K=TILE_K)
    return c_list


# ---------------------------------------------------------------------------------------
# Which dispatch when: launches, bytes, and time on a GPU.

def compare_dispatch(B, H, M, N, K, dtype=torch.float16):
    """Four ways to compute B * H products [M, K] @ [K, N]; one dict per way with
    strategy, launches, bytes (DRAM traffic), us (microseconds measured on a GPU, None
    where kernels run in the interpreter).

    strategy "loop": one `matmul` launch per (batch, head);
             "strided": one `batched_gemm_strided` launch over [B, H, M, K] tensors;
             "ptrs": one `batched_gemm_ptrs` launch over separate allocations;
             "stack": separate allocations copied into [B, H, ...] tensors by
                      torch.stack (one launch each for A and B), then "strided".
    bytes: every way reads A and B as `dram_reads(M, N, K, TILE)` counts and writes C,
    per pair, times the element size. On top of that, "ptrs" reads its table: 6 int64 per
    pair (3 addresses, M, N, K); "stack" reads and writes each element of A and B once more.
    """
    pairs = B * H
    size = torch.empty((), dtype=dtype).element_size()
    gemm = pairs * (dram_reads(M, N, K, TILE) + M * N) * size
    rows = [{"strategy": "loop", "launches": pairs, "bytes": gemm},
            {"strategy": "strided", "launches": 1, "bytes": gemm},
            {"strategy": "ptrs", "launches": 1, "bytes": gemm + pairs * 6 * 8},
            {"strategy": "stack", "launches": 3,
             "bytes": gemm + 2 * pairs * (M * K + K * N) * size}]
    runs = {row["strategy"]: None for row in rows}
    if not course.INTERPRET:  # do_bench needs a GPU
        a = torch.randn(B, H, M, K, dtype=dtype, device=course.DEVICE)
        b = torch.randn(B, H, K, N, dtype=dtype, device=course.DEVICE)
        a_list = [x.clone() for x in a.flatten(0, 1)]
        b_list = [x.clone() for x in b.flatten(0, 1)]
        runs = {
            "loop": lambda: [matmul(x, y) for x, y in zip(a_list, b_list)],
            "strided": lambda: batched_gemm_strided(a, b, False),
            "ptrs": lambda: batched_gemm_ptrs(a_list, b_list, False),
            "stack": lambda: batched_gemm_strided(torch.stack(a_list).view(B, H, M, K),
                                                  torch.stack(b_list).view(B, H, K, N), False),
        }
    for row in rows:
        run = runs[row["strategy"]]
        row["us"] = None if run is None else 1000 * triton.testing.do_bench(run)
    return rows
