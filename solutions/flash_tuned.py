"""The fast FlashAttention forward: same contract as `solutions.flash_forward.flash_attention`.

What it adds to the teaching kernel, and why:
- The KV loop in two stages: blocks fully visible to every query row run with no mask
  at all (unpredicated loads, no compares); only the diagonal blocks (causal) and the
  ragged tail block pay for masks. Blocks above the diagonal are never visited.
- Causal programs run heaviest first (reverse query-block order) so the GPU's last wave
  is made of short programs.
- triton.autotune over a shortlist of block sizes, warps and pipeline depths per head
  dim, pruned by shared memory; one compile serves every sequence length.
- Plain pointer loads by default: they take any strides with no alignment rules. Where
  Q, K and V are aligned for them (Hopper), descriptor configs compete in the autotuner
  too: "tma" ones (a 128-row Q tile with 4 warps only fits when Q stays in shared
  memory, as a TMA copy leaves it) and warp-specialized ones (`tl.range(...,
  warp_specialize=True)`). Their tensor descriptors are made on the host, once a launch:
  made on the device, each program spent time on three of them before its first load
  (PERF.md, issue 14, 3a, 3f and 3g).
- After the first call of a shape, the chosen config is launched without the
  autotuner's dispatch (`launch_tuned`) and without Triton's JIT (`launch_compiled`);
  once a call of a signature has been recorded, the next ones repeat its launches past
  the wrappers' checks (`LaunchPlan`): host time matters at short sequences.
- Head dims that are not powers of two (80, 96, 160, 192, ...) are computed as two
  power-of-two column blocks (160 = 128 + 32) instead of one block padded to the next
  power of two (256): no multiply-adds on padding, smaller tiles (PERF.md, issue 14).
- FP8 (`flash_attention_fp8`): float8_e4m3fn / float8_e5m2 q, k, v with per-tensor
  descales, P quantized to e4m3 for the second product, fp16/bf16 output or FP8 in
  V's scale (Hopper/Ada).
- On Hopper with Triton 3.6, fp16/bf16 at D = 128, and at D = 64 causal or up to 2048
  queries, with contiguous inputs and N_Q = N_K (`gluon_forward_takes`), the forward
  runs `solutions/flash_gluon.py` instead: the same algorithm in Gluon, with the softmax
  overlapped with the matrix products, which this file's kernel cannot get from
  Triton's compiler, on a persistent grid (D = 128: 1.06-1.39x it, PERF.md 3n, 3o, 3p;
  D = 64: 1.01-1.10x, 4f).
`flash_attention_forward` is what the backward's autograd Function calls.
"""
import functools
import os
import statistics
import threading

import course  # noqa: F401  (chooses GPU or interpreter before triton is imported)
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from solutions.block_tuning import prune_configs, smem_bytes
from solutions.direct_launch import DirectLaunch, hooks_set, rebased
from solutions.flash_forward import (LN2, LOG2E, check_attention_inputs, default_scale,
                                     dot_precision)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# (BLOCK_Q, BLOCK_K, num_warps, num_stages), best first, from sweeps on an H100 (PERF.md),
# per class of tile width (the head dim's column blocks together, see `column_blocks`).
SHORTLIST = {
    64: [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3), (64, 64, 4, 3)],  # head_dim <= 64 (the last: 3w)
    128: [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)],  # <= 128
    192: [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3)],  # 160, 192
    256: [(64, 64, 4, 2), (64, 32, 4, 3), (128, 32, 8, 2), (128, 64, 8, 2)],  # a 128-row fp32 acc spills
}
# FP8 tiles take half the shared memory of fp16 ones, and the products run twice as fast.
SHORTLIST_FP8 = {
    64: [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 4, 3)],
    128: [(64, 64, 4, 3), (128, 128, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4)],  # the last: PERF.md 3u
    192: [(128, 64, 8, 3), (128, 64, 8, 4), (64, 32, 4, 3)],
    256: [(128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 8, 3)],
}
# Descriptor configs: Q, K and V through tensor descriptors made on the host ("tma"; Q
# stays in shared memory, which lets 4 warps hold a 128-row tile), and warp-specialized
# ("ws"). Power-of-two head dims only; they compete with the above where `_tma_ok`
# allows. From sweeps on an H200 and an H100 (PERF.md 3f, 3g, 3j). A 4-warp "ws" config
# runs only where nothing is masked (`single_loop_only`); with 3 stages its output was
# NaN on the H100 (3j), so the lists hold 2-stage ones. A sixth entry caps the registers
# a thread (maxnreg), so that more programs share an SM. Uncapped, the fp16 64 x 64 x 4
# tiles take 114-120, and four 4-warp programs fill an SM's 65536; capped at 96 (no
# spills), five fit where shared memory allows them too: fp16 with 2 stages (40 KB a
# program), FP8 with 3 (28 KB). Causal at N = 1024 the forward ran 1-2% faster; at 88
# registers, 3x slower (PERF.md 4e).
SHORTLIST_TMA = {64: [(128, 128, 8, 3, "ws"), (128, 64, 8, 3, "ws"), (64, 64, 4, 3, "tma"),
                      (64, 64, 4, 2, "tma", 96)],
                 128: [(128, 64, 4, 2, "tma"), (128, 128, 8, 2, "ws"), (64, 64, 4, 3, "tma"),
                       (128, 128, 4, 2, "ws")],
                 # Q in shared memory frees registers: the pointer 128 x 64 x 8 x 2 takes 255
                 # and spills causal; these take 184-228 and spill nothing (PERF.md 4b), and
                 # the forward ran 2-8% faster (4c)
                 256: [(128, 64, 8, 2, "tma"), (64, 64, 4, 2, "tma"), (128, 32, 8, 2, "tma"),
                       (128, 64, 8, 2, "ws")]}
SHORTLIST_TMA_FP8 = {64: [(64, 64, 4, 3, "tma"), (128, 128, 4, 3, "tma"), (64, 64, 4, 3, "tma", 96)],
                     # no 4-warp "ws" tile: at N = 16384 not causal it ran 3% behind (64, 128, 4,
                     # 3, tma), the tutorial's tile, yet the autotuner took it for 4 of 5 FP8 rows
                     # (PERF.md 4h); the last: 3y, not causal
                     128: [(64, 64, 4, 3, "tma"), (128, 64, 4, 3, "tma"), (128, 64, 4, 4, "tma"),
                           (64, 128, 4, 3, "tma")]}
# False: never the descriptor configs (for comparisons; FLASH_TUNED_WS=0 sets it).
TRY_WS = os.environ.get("FLASH_TUNED_WS", "1") != "0"
# The Gluon kernel (solutions/flash_gluon.py) where `gluon_forward_takes` allows; False:
# never (for comparisons; FLASH_TUNED_GLUON=0 sets it).
TRY_GLUON = os.environ.get("FLASH_TUNED_GLUON", "1") != "0"
GLUON_HEAD_DIMS = (64, 128)
# At D = 64 without a causal mask, the Gluon kernel runs up to this many queries: on the
# H200 it read 1.01-1.06x this file's kernel at N = 1024, 0.98-0.99x at N >= 4096; causal,
# 1.02x at N = 1024 (three K/V slots) and 1.06-1.10x beyond (PERF.md 4f; on the H100,
# before the halved diagonal, 3s: 0.96-0.98x, but 1.05-1.07x causal at N >= 4096).
GLUON_D64_FULL_MAX_N = 2048
# Gluon's API changes between Triton releases (3.9 renamed the TMA copies): the kernel
# is written and measured against 3.6.
GLUON_TRITON = "3.6."
SHORT_Q = (64, 64, 4, 3)  # at most 64 query rows: a 128-row block would be half empty
FP32 = (64, 32, 4, 2)     # exact fp32 dots run on FMA units: the smallest tile compiles fastest

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_MIN_CAPABILITY = (8, 9)  # FP8 tensor-core products: Ada (8.9), Hopper (9.0) and later
# P (in [0, 1] after the running max is subtracted) is stored as e4m3 times 2**P_SHIFT:
# e4m3 reaches 448, and its smallest normal number is 2**-6, so unscaled it would flush
# every probability under ~2**-9 to zero. The shift is free: it is added to the exponent.
P_SHIFT = 8.0
P_SHIFT_C = tl.constexpr(P_SHIFT)  # the same, usable inside kernels


# (autotuned kernel, key) -> the triton.Config that triton.autotune chose for that key.
_CHOSEN = {}
SPLIT_D = True        # False: one column block padded to a power of two, forward and backward
                      # (for comparisons)
ROWS_D256 = True      # False: module 08's dK/dV kernel at 256 columns too, not
                      # solutions/flash_backward_d256.py's (for comparisons)
LAST_CONFIG = [None]  # the config of the latest launch (for the benchmark's tables)
GLUON = "gluon"      # ... when flash_gluon's kernel ran it


def launch_tuned(tuned, grid, key, *args, **kwargs):
    """Launch an autotuned kernel; after the first call for `key`, without the autotuner.

    triton.autotune benchmarks once per key, but its dispatch still runs on every call
    (a dict of all arguments, the key rebuilt, dtypes turned into strings): on the H100
    machine it added ~10 us of host time to a ~40 us launch (PERF.md, "Host overhead"),
    and at N = 1024 the training step is bound by host time. So the first call for a key
    chooses a config (`_choose`) and records it; later calls launch with it directly,
    through `launch_compiled`. `key` must hold everything the autotuner's own key holds.
    """
    chosen = _CHOSEN.get((tuned, key))
    if chosen is None:
        _not_to_repeat()  # this call's launches include the autotuner's timing runs
        chosen = _CHOSEN[(tuned, key)] = _choose(tuned, grid, args, kwargs)
        if chosen.pre_hook is not None:  # this call's arguments were made for any config
            chosen.pre_hook({**dict(zip(tuned.arg_names, args)), **kwargs, **chosen.all_kwargs()})
    LAST_CONFIG[0] = chosen
    if INTERPRET:
        tuned.fn[grid](*args, **kwargs, **chosen.all_kwargs())
    else:
        launch_compiled(tuned.fn, args[0].device, grid, *args, **kwargs, **chosen.all_kwargs())


AUTOTUNE_ROUNDS = 3  # the median of each config's times decides


def timed_once(fn, quantiles):
    """The autotuners' timing of one config in one round. Not shorter than this: timed
    for 10 + 40 ms instead of 25 + 80, the (64, 64, 4, 3, "tma") config read ~7% faster
    than it runs for longer, and won where it loses (PERF.md 3k)."""
    return triton.testing.do_bench(fn, warmup=25, rep=80, quantiles=quantiles)


def _choose(tuned, grid, args, kwargs):
    """The config of `tuned` (a triton.autotune kernel made with do_bench=timed_once)
    with the best median time over AUTOTUNE_ROUNDS rounds, each round timing every
    config once and starting one config further along the list. Why: on the H100 the
    GPU runs faster for its first second or so of load, so triton.autotune (each config
    once, in list order) favours the configs it times first: at fp16 D = 128, N = 4096
    the first config won 3 times of 3 while slower than two others in every later round
    (PERF.md 3j, 3k). The median drops a config's one fast reading. Uses Triton 3.6's
    Autotuner methods (`prune_configs`, `_bench`); the interpreter has one config."""
    tuned.nargs = dict(zip(tuned.arg_names, args))
    try:
        configs = tuned.prune_configs(kwargs)
        if len(configs) == 1:
            return configs[0]
        meta = dict(kwargs, grid=grid, warmup=False)
        times = {c: [] for c in configs}
        for r in range(AUTOTUNE_ROUNDS):
            start = r % len(configs)
            for c in configs[start:] + configs[:start]:
                times[c].append(tuned._bench(*args, config=c, **meta)[0])
        tuned.configs_timings = {c: statistics.median(t) for c, t in times.items()}
        return min(configs, key=tuned.configs_timings.get)
    finally:
        tuned.nargs = None


def _config(bq, bk, w, s, tag=None, maxnreg=None):
    """tag: None (pointer loads), "tma" (tensor descriptors) or "ws" (descriptors and
    warp specialization). Q_DEVICE: Q's descriptor is made by each program (`Q_DEVICE`
    in the kernel says why), for the 4-warp "ws" configs. maxnreg: registers per thread
    at most (ptxas's cap), so that more programs fit on an SM."""
    return triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk, "TMA": tag is not None, "WS": tag == "ws",
                          "Q_DEVICE": single_loop_only((bq, bk, w, s, tag))},
                         num_warps=w, num_stages=s, maxnreg=maxnreg,
                         pre_hook=_fit_descriptors if tag else None)


def _fit_descriptors(nargs):
    """The autotuner's pre_hook for descriptor configs: give the host-made descriptors
    the config's tiles (a descriptor's block shape is part of it)."""
    blocks = _block_shapes(nargs["BLOCK_Q"], nargs["BLOCK_K"], nargs["BLOCK_D"], nargs["V_T"])
    for desc, block in zip((nargs["Q_DESC"], nargs["K_DESC"], nargs["V_DESC"]), blocks):
        desc.block_shape = block[4 - len(desc.shape):]


def _block_shapes(block_q, block_k, block_d, v_t):
    """The tiles of Q, K and V's descriptors, one head at a time, as rank 4; a rank-3
    descriptor (`_layouts`) takes the last three."""
    return [1, 1, block_q, block_d], [1, 1, block_k, block_d], (
        [1, 1, block_d, block_k] if v_t else [1, 1, block_k, block_d])


def _shape(config):
    """A config as a shortlist names it: (BLOCK_Q, BLOCK_K, warps, stages[, "tma" | "ws"
    [, maxnreg]])."""
    shape = (config.kwargs["BLOCK_Q"], config.kwargs["BLOCK_K"], config.num_warps, config.num_stages)
    if config.kwargs.get("TMA"):
        shape += ("ws" if config.kwargs.get("WS") else "tma",)
        return shape + (config.maxnreg,) if config.maxnreg else shape
    return shape


def _configs():
    if INTERPRET:  # autotune with more than one config cannot run on the interpreter
        return [_config(64, 32, 4, 1)]
    lists = (SHORTLIST, SHORTLIST_FP8, SHORTLIST_TMA, SHORTLIST_TMA_FP8)
    shapes = [c for table in lists for short in table.values() for c in short]
    return [_config(*c) for c in dict.fromkeys(shapes + [SHORT_Q, FP32])]


def width_class(width):
    """The shortlist a tile width (the column blocks of the head dim together) uses."""
    return 64 if width <= 64 else 128 if width <= 128 else 192 if width <= 192 else 256


def single_loop_only(shape):
    """A 4-warp "ws" config compiles only where its loop is the program's one loop: with
    Triton 3.6 the warp specialization fails when the masked stage (causal, or ragged
    keys) follows it (PERF.md 3f). The autotuner offers it only where nothing is masked."""
    return shape[4:5] == ("ws",) and shape[2] == 4


def offered(shape, causal, n_k):
    """Whether the autotuner may try the config `shape` with these keys (`single_loop_only`;
    causal, BLOCK_Q a multiple of BLOCK_K: the causal split needs it)."""
    return not ((single_loop_only(shape) and (causal or n_k % shape[1]))
                or (causal and shape[0] % shape[1]))


def _even_k(args):
    """The keys fill whole blocks of the config's BLOCK_K (a heuristic: computed per launch)."""
    return args["N_K"] % args["BLOCK_K"] == 0


def _long_k(args):
    """At least one whole key block (a heuristic, per launch): where nothing is causal,
    the loop over whole blocks runs at least once."""
    return args["N_K"] >= args["BLOCK_K"]


def _prune(configs, named_args, **kwargs):
    """Benchmark only the shortlist for this shape, and only configs that fit in
    shared memory (module 07's `prune_configs`; its `smem_bytes` summed over the head
    dim's column blocks when there are two;
    causal, BLOCK_Q is a multiple of BLOCK_K: `offered`). Where tensor
    descriptors may be used (TMA_OK), the descriptor configs compete too."""
    if INTERPRET:
        return configs
    args = {**named_args, **kwargs}
    parts = [w for w in (args["BLOCK_D"], args.get("BLOCK_D2", 0)) if w]
    n_q, q = args["N_Q"], args["Q"]
    fp8 = q.element_size() == 1
    if q.element_size() == 4:
        wanted = [FP32]
    elif n_q <= 64:
        wanted = [SHORT_Q]
    else:
        width = width_class(sum(parts))
        wanted = (SHORTLIST_FP8 if fp8 else SHORTLIST)[width]
        if args.get("TMA_OK") and len(parts) == 1 and parts[0] == args.get("HEAD_DIM"):
            wanted = wanted + (SHORTLIST_TMA_FP8 if fp8 else SHORTLIST_TMA).get(width, [])
    wanted = [w for w in wanted if offered(w, args["CAUSAL"], args["N_K"])]
    limit = torch.cuda.get_device_properties(q.device).shared_memory_per_block_optin
    by_shape = {_shape(c): c for c in configs}
    if len(parts) == 1:
        fits = prune_configs(wanted, parts[0], q.dtype, limit)
    else:  # two column blocks: two tiles of each kind, one per block
        fits = [w for w in wanted
                if sum(smem_bytes(w[0], w[1], part, q.dtype, w[3]) for part in parts) <= limit]
    return [by_shape[w] for w in fits] or [by_shape[FP32]]


_CAPABILITY = {}  # device index -> compute capability


def _capability(device):
    cap = _CAPABILITY.get(device.index)
    if cap is None:
        cap = _CAPABILITY[device.index] = torch.cuda.get_device_capability(device)
    return cap


def _tma_ok(q, k, v, v_t):
    """Whether the descriptor configs ("tma", "ws") may run: a Hopper GPU (or the
    interpreter, for tests), Q, K and V 16-byte aligned with 16-byte strides. A stride
    of 0 (a tensor `expand`ed over the batch or heads) runs the pointer configs, which
    take any stride: no GPU run here has tried a tensor map with a stride of 0."""
    if not TRY_WS or not (INTERPRET or _capability(k.device)[0] == 9):
        return False
    size = k.element_size()
    return not any(t.data_ptr() % 16 or strides[-1] != 1 or any(x == 0 or x * size % 16 for x in strides[:-1])
                   for t, _, strides in _layouts(q, k, v, v_t))


def _layouts(q, k, v, v_t):
    """(tensor, shape, strides) of q, k, v as their descriptors see them: [B, H, N, D];
    V_T stores V's keys contiguous, so its descriptor is [B, H, D, N]. FP8's K and V, where
    their batch and head dims merge (as in a contiguous tensor), are seen as [B * Hkv, N, D]:
    a program's coordinates are then (b * Hkv + h_kv, row, 0), which the kernel has before its
    loop, and the loop keeps one coordinate fewer. Measured on the H200 (PERF.md 4c): FP8
    0.4-0.7% faster, fp16 up to 3.8% slower, so fp16 and bf16 keep rank 4."""
    def merged(t, shape, strides):
        if t.dtype in FP8_DTYPES and strides[0] == shape[1] * strides[1]:
            return t, [shape[0] * shape[1], *shape[2:]], strides[1:]
        return t, shape, strides
    v_layout = (v, [*v.shape[:2], v.shape[3], v.shape[2]], [v.stride(0), v.stride(1), v.stride(3), 1]
                ) if v_t else (v, [*v.shape], [*v.stride()])
    return ((q, [*q.shape], [*q.stride()]), merged(k, [*k.shape], [*k.stride()]), merged(*v_layout))


def _scratch(size, alignment, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _scratch_allocator():
    """Descriptors made on the device (Q_DEVICE) take global scratch memory from the
    allocator `triton.set_allocator` sets: ours, where none is set. Checked at each
    launch: the setting is per thread (a ContextVar)."""
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


_THREAD = threading.local()  # .devices: the device indices whose context this thread has made current


def cuda_context_on_this_thread(device):
    """Make `device`'s CUDA context current on this thread (once per thread and device).
    Triton 3.6 encodes a launch's host-made TMA descriptors before its launcher makes the
    context current, and on a thread that has not called CUDA yet that fails ("Failed to
    create tensor map descriptor: invalid device context"): autograd's backward thread,
    or any new thread, when the caching allocator serves every buffer (PERF.md 3r). A
    stream query is a CUDA runtime call, which makes the context current."""
    devices = getattr(_THREAD, "devices", None)
    if devices is None:
        devices = _THREAD.devices = set()
    if device.index not in devices:
        torch.cuda.current_stream(device).query()
        devices.add(device.index)


_COMPILED = {}  # (kernel, device, what Triton specializes on) -> (compiled kernel, constexpr values)
_COMPILED_MAX = 4096  # entries: one per shape launched; cleared when full (a new JIT call refills)


def _specialization(arg):
    """What of a kernel argument decides which compiled kernel runs it: a descriptor's
    dtype, tiles and layout (its base, shape and strides are run-time values), a tensor's
    dtype and 16-byte alignment, any other value as it is (ints are specialized on
    being 1 or multiples of 16; equal values get the same)."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if hasattr(arg, "block_shape"):  # Gluon's layouts are made once (flash_gluon.descriptor)
        return arg.base.dtype, tuple(arg.block_shape), id(getattr(arg, "layout", None))
    return arg


def launch_compiled(kernel, device, grid, /, *args, **kwargs):
    """kernel[grid](*args, **kwargs), in less host time after the first launch of the same
    specialization: that first launch goes through Triton's JIT, which returns the
    compiled kernel; later ones call it (`CompiledKernel[grid]`) with every argument in
    the kernel's order, skipping the JIT's argument binding and specialization. Inside a
    training step a JIT launch took ~100-140 us of host time, and at N = 1024 the step
    is bound by its host time (PERF.md 3r, 3t). `kernel`: a JIT function, possibly under
    `triton.heuristics` layers, whose values are computed at the first launch (they
    depend on the key's values only); `grid`: a tuple, or a function of `kwargs`. A
    direct launch is also recorded for `recording` (launch plans)."""
    cuda_context_on_this_thread(device)
    # the device too: a compiled kernel's function handle belongs to one device's context
    key = (kernel, device.index, tuple(map(_specialization, args)), tuple(kwargs.items()))
    entry = _COMPILED.get(key)
    shape = grid(kwargs) if callable(grid) else grid
    if entry is None:
        _not_to_repeat()  # a compile, and Triton's own launch path
        compiled = kernel[shape](*args, **kwargs)
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[key] = compiled, _constexpr_values(kernel, args, kwargs)
        return
    compiled, tail = entry
    shape = shape + (1,) * (3 - len(shape))
    compiled[shape](*args, *tail)
    recorded = getattr(_THREAD, "recording", None)
    if recorded is not None:
        recorded.append((compiled, shape, args, tail))


# ---------------------------------------------------------------------------------------
# Launch plans: a wrapper call's launches, made again for the next call of its signature

_PLANS = {}  # plan_signature(...) -> LaunchPlan
_PLANS_MAX = 1024  # entries: one per signature called twice; cleared when full


def plan_signature(name, tensors, *values):
    """What decides every launch a wrapper call makes, as its plan's key: the wrapper's
    `name` and `values` (its other arguments, and the settings it reads besides this
    module's), this module's settings, and each tensor's type, shape, strides, dtype,
    device and 16-byte alignment. None where plans do not apply: in the interpreter, or
    where an argument is not a tensor (the call's checks then say what is wrong)."""
    if INTERPRET or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    try:
        hash(values)
    except TypeError:  # an odd argument (sm_scale a list): the call's checks say what is wrong
        return None
    return (name, TRY_WS, TRY_GLUON, SPLIT_D, ROWS_D256, GLUON_HEAD_DIMS, GLUON_D64_FULL_MAX_N, *values,
            *[(type(t), t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0) for t in tensors])


def run_plan(signature, inputs):
    """The outputs of the call `signature` names, by its plan, with `inputs` (the call's
    tensors, in the signature's order); None where it has no plan."""
    plan = _PLANS.get(signature)
    return None if plan is None else plan.run(inputs)


class recording:
    """`with recording(signature, inputs) as r:` records the launches made inside (by
    `launch_compiled`, on this thread); then `r.keep(returned, buffers)` makes them the
    plan of `signature` where every launch can be made again (see `LaunchPlan`).
    `returned`: the tensors the call returns, `buffers`: others it made; both made with
    torch.empty. A signature of None records nothing."""

    def __init__(self, signature, inputs):
        self.signature, self.inputs, self.launches = signature, inputs, []

    def __enter__(self):
        self.outer = getattr(_THREAD, "recording", None)
        if self.outer is not None:
            self.outer.append(None)  # a plan of the outer call would miss these launches
        _THREAD.recording = self.launches if self.signature is not None else None
        return self

    def __exit__(self, *exc):
        _THREAD.recording = self.outer

    def keep(self, returned, buffers=()):
        if self.signature is None or not self.launches or None in self.launches:
            return
        plan = LaunchPlan.of(self.inputs, returned, buffers, self.launches)
        if plan is not None:
            if len(_PLANS) >= _PLANS_MAX:
                _PLANS.clear()
            _PLANS[self.signature] = plan


def _not_to_repeat():
    """Mark the call being recorded as one not to plan from (see `recording`)."""
    recorded = getattr(_THREAD, "recording", None)
    if recorded is not None:
        recorded.append(None)


class LaunchPlan:
    """The launches of one wrapper call, made again for a later call of the same
    `plan_signature` with other tensors: fresh buffers of the same shapes, each of the
    call's tensors (or a descriptor over it) where the recorded call had its counterpart,
    every other argument as recorded, to the compiled kernels the recorded call found
    (`launch_compiled`). It skips what the signature decides: the wrappers' checks,
    choices and argument lists. Inside a training step at N = 1024 that host time was
    more than the kernels' GPU time (PERF.md 3v). Made only from calls whose every launch
    went to a compiled kernel found in the cache, with no autotuning and no other planned
    call inside, and whose every tensor argument is an input, or a contiguous buffer the
    call made, each a different tensor: else the call is not repeatable this way."""

    @classmethod
    def of(cls, inputs, returned, buffers, launches):
        tensors = (*inputs, *returned, *buffers)
        slot = {id(t): i for i, t in enumerate(tensors)}
        made = (*returned, *buffers)
        if len(slot) < len(tensors) or not all(t.is_contiguous() for t in made):
            return None  # a tensor in two roles (q is k): which one a launch took is unknown
        plan = cls()
        plan.n_returned = len(returned)
        plan.buffers = [(t.shape, t.dtype) for t in made]
        plan.device, plan.config, plan.launches = inputs[0].device, LAST_CONFIG[0], []
        # descriptors made on the device take scratch memory from `triton.set_allocator`'s
        plan.scratch = any(getattr(c.metadata, "global_scratch_size", 0) for c, *_ in launches)
        for compiled, grid, args, tail in launches:
            template, tensor_args, desc_args = [*args, *tail], [], []
            for i, arg in enumerate(args):
                base = arg.base if hasattr(arg, "block_shape") else arg
                if not isinstance(base, torch.Tensor):
                    continue
                if id(base) not in slot:
                    return None  # a tensor the call made otherwise (a copy of an input)
                if base is arg:
                    tensor_args.append((i, slot[id(arg)]))
                else:
                    desc_args.append((i, slot[id(base)], rebased(arg, None)))
                template[i] = None  # the plan keeps no tensor alive
            direct = DirectLaunch.of(compiled, grid, [*args, *tail], tensor_args, desc_args, plan.device.index)
            plan.launches.append((compiled, grid, template, tensor_args, desc_args, direct))
        return plan

    def run(self, inputs):
        """The call's returned tensors; None where a fresh buffer is not 16-byte aligned
        (as the recorded ones were; a caching allocator's always are)."""
        made = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in self.buffers]
        if any(t.data_ptr() % 16 for t in made):
            return None
        tensors = (*inputs, *made)
        _not_to_repeat()  # a call being recorded would miss these launches
        cuda_context_on_this_thread(self.device)
        if self.scratch:
            _scratch_allocator()
        hooks = hooks_set()  # a profiler's launch hooks: Triton's own launch path calls them
        for compiled, grid, template, tensor_args, desc_args, direct in self.launches:
            if direct is not None and not hooks:
                direct(tensors)
                continue
            args = template.copy()
            for i, s in tensor_args:
                args[i] = tensors[s]
            for i, s, desc in desc_args:
                args[i] = rebased(desc, tensors[s])
            compiled[grid](*args)
        LAST_CONFIG[0] = self.config
        return tuple(made[:self.n_returned])


def _constexpr_values(kernel, args, kwargs):
    """The values of the JIT function's parameters after `args`, as its JIT launch binds
    them: from kwargs, the heuristics' values (outermost layer first, as Triton applies
    them), else the parameter's default."""
    named = {}
    while not hasattr(kernel, "params"):  # triton.heuristics layers: .values, .fn
        for name, heuristic in kernel.values.items():
            named[name] = heuristic({**dict(zip(kernel.arg_names, args)), **kwargs, **named})
        kernel = kernel.fn
    named.update(kwargs)
    return [named[p.name] if p.name in named else p.default for p in kernel.params[len(args):]]


def _descriptors(q, k, v, v_t, blocks):
    """Tensor descriptors of q, k, v made on the host, over their whole shape, with the
    tiles `blocks` (`_block_shapes`). Made on the device instead, each program spent
    time on three of them before its first load: up to 22% of a forward at N = 1024
    on the H100 (PERF.md 3g)."""
    return tuple(TensorDescriptor(t, shape, strides, block[4 - len(shape):])
                 for (t, shape, strides), block in zip(_layouts(q, k, v, v_t), blocks))


def cdiv(a, b):
    """ceil(a / b) on the host (triton.cdiv is a JIT function: 1.5-6 us a host-side call)."""
    return (a + b - 1) // b


# CUDA caps a grid's second and third axes at 65535 programs, and the tuned kernels put
# batch * heads on the second (the FP8 forward: heads, and batch on the third): their
# wrappers run a larger batch in slices of whole batch entries. (The teaching kernels
# launch once: there batch * heads must fit the cap.)
MAX_GRID_Y = 65535


def batch_slices(B, H):
    """The batch slices that each fit one launch of B * H programs on the grid's second
    axis, or None where the whole batch fits. (The FP8 forward's grid puts H and B on axes
    1 and 2: slices of B * H <= MAX_GRID_Y fit there too.)"""
    if B * H <= MAX_GRID_Y:
        return None
    if H > MAX_GRID_Y:
        raise ValueError(f"{H} heads: the tuned kernels launch one program per (batch, head) "
                         f"on a grid axis that holds at most {MAX_GRID_Y}")
    step = MAX_GRID_Y // H
    return [slice(b, min(b + step, B)) for b in range(0, B, step)]


def by_batch_slices(slices, fn, *tensors):
    """fn run on each batch slice of the tensors, its results concatenated along the batch."""
    parts = [fn(*(t[s] for t in tensors)) for s in slices]
    return tuple(torch.cat(results) for results in zip(*parts))


def next_power_of_2(n):
    """The smallest power of two >= n, on the host (triton's is a JIT function too)."""
    return 1 << (n - 1).bit_length()


def column_blocks(head_dim, min_block=16):
    """(BLOCK_D, BLOCK_D2): the head dim as one power-of-two column block, or two.

    tl.arange needs power-of-two lengths. One block padded to the next power of two
    wastes up to 40% of the products at D = 160 (256 columns for 160); two blocks
    (128 + 32) waste none. The second block is used only where it saves columns;
    BLOCK_D2 = 0 means one block. Blocks are at least `min_block` wide (tl.dot: 16;
    FP8 products: 32).
    """
    padded = max(min_block, next_power_of_2(head_dim))
    first = max(min_block, 1 << (head_dim.bit_length() - 1))  # largest power of two <= D
    rest = head_dim - first
    second = max(min_block, next_power_of_2(rest)) if rest > 0 else 0
    if second == 0 or first + second >= padded:
        return padded, 0
    return first, second


@triton.jit
def _exponents(s, m_i, cols, rows, N_K, qk_scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               FP8: tl.constexpr):
    """(the base-2 exponents of P, the new running max) for raw scores s of key columns
    `cols`: scaled, with the running max subtracted; MASKED hides keys past N_K and,
    causal, keys after each row. FP8: the running max is kept minus P_SHIFT, so P comes
    out times 2**P_SHIFT, and the row max takes one fused multiply-add, not two steps."""
    if MASKED:
        valid = cols[None, :] < N_K
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        s = tl.where(valid, s * qk_scale, float("-inf"))
        row_max = tl.max(s, 1)
    else:
        # max of the raw scores, then one fused multiply-add per score
        row_max = tl.max(s, 1) * qk_scale
        s = s * qk_scale
    if FP8:
        row_max = row_max - P_SHIFT_C
    m_new = tl.maximum(m_i, row_max)
    return s - m_new[:, None], m_new


@triton.jit
def _attend(acc, acc2, l_i, m_i, q, q2, k_base, v_base, stride_kn, stride_vn, rows, lo, hi, N_K,
            qk_scale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
            BLOCK_K: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
            DOT_PRECISION: tl.constexpr, FP8: tl.constexpr, V_T: tl.constexpr):
    """Online softmax over key blocks [lo, hi). MASKED=False: every key is visible to
    every row, so that loop has no mask arithmetic and unpredicated loads.

    Columns [0, BLOCK_D) of the head dim live in q / acc, columns [BLOCK_D, BLOCK_D +
    BLOCK_D2) in q2 / acc2 (BLOCK_D2 = 0: none). V_T: V is stored transposed (keys
    contiguous, stride_vn between head-dim rows), as Hopper's FP8 products want it.
    FP8: P goes to the second product as e4m3, scaled by 2**P_SHIFT (see P_SHIFT)."""
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    PAD1: tl.constexpr = BLOCK_D > HEAD_DIM       # one block, padded
    d_ok = offs_d < HEAD_DIM
    kT_ptrs = k_base + offs_d[:, None]            # K read transposed: [BLOCK_D, BLOCK_K]
    if V_T:
        v_ptrs = v_base + offs_d[:, None] * stride_vn   # [BLOCK_D, BLOCK_K], keys contiguous
    else:
        v_ptrs = v_base + offs_d[None, :]               # [BLOCK_K, BLOCK_D]
    if BLOCK_D2 > 0:
        offs_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
        PAD2: tl.constexpr = BLOCK_D + BLOCK_D2 > HEAD_DIM
        d2_ok = offs_d2 < HEAD_DIM
        kT2_ptrs = k_base + offs_d2[:, None]
        if V_T:
            v2_ptrs = v_base + offs_d2[:, None] * stride_vn
        else:
            v2_ptrs = v_base + offs_d2[None, :]
    for start in tl.range(lo, hi, BLOCK_K):
        cols = start + offs_k
        key_ok = cols < N_K
        if MASKED:
            kT = tl.load(kT_ptrs + cols[None, :] * stride_kn, mask=d_ok[:, None] & key_ok[None, :],
                         other=0.0)
        elif PAD1:
            kT = tl.load(kT_ptrs + cols[None, :] * stride_kn, mask=d_ok[:, None], other=0.0)
        else:
            kT = tl.load(kT_ptrs + cols[None, :] * stride_kn)
        s = tl.dot(q, kT, input_precision=DOT_PRECISION)
        if BLOCK_D2 > 0:
            if MASKED:
                kT2 = tl.load(kT2_ptrs + cols[None, :] * stride_kn,
                              mask=d2_ok[:, None] & key_ok[None, :], other=0.0)
            elif PAD2:
                kT2 = tl.load(kT2_ptrs + cols[None, :] * stride_kn, mask=d2_ok[:, None], other=0.0)
            else:
                kT2 = tl.load(kT2_ptrs + cols[None, :] * stride_kn)
            s = tl.dot(q2, kT2, s, input_precision=DOT_PRECISION)
        s, m_new = _exponents(s, m_i, cols, rows, N_K, qk_scale, MASKED, CAUSAL, FP8)
        p = tl.exp2(s)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_T:
            if MASKED:
                vT = tl.load(v_ptrs + cols[None, :], mask=d_ok[:, None] & key_ok[None, :], other=0.0)
            elif PAD1:
                vT = tl.load(v_ptrs + cols[None, :], mask=d_ok[:, None], other=0.0)
            else:
                vT = tl.load(v_ptrs + cols[None, :])
            v = tl.trans(vT)
        else:
            if MASKED:
                v = tl.load(v_ptrs + cols[:, None] * stride_vn, mask=key_ok[:, None] & d_ok[None, :],
                            other=0.0)
            elif PAD1:
                v = tl.load(v_ptrs + cols[:, None] * stride_vn, mask=d_ok[None, :], other=0.0)
            else:
                v = tl.load(v_ptrs + cols[:, None] * stride_vn)
        if FP8:
            p_op = p.to(tl.float8e4nv)
        else:
            p_op = p.to(v.dtype)
        acc = tl.dot(p_op, v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        if BLOCK_D2 > 0:
            if V_T:
                if MASKED:
                    v2T = tl.load(v2_ptrs + cols[None, :], mask=d2_ok[:, None] & key_ok[None, :],
                                  other=0.0)
                elif PAD2:
                    v2T = tl.load(v2_ptrs + cols[None, :], mask=d2_ok[:, None], other=0.0)
                else:
                    v2T = tl.load(v2_ptrs + cols[None, :])
                v2 = tl.trans(v2T)
            else:
                if MASKED:
                    v2 = tl.load(v2_ptrs + cols[:, None] * stride_vn,
                                 mask=key_ok[:, None] & d2_ok[None, :], other=0.0)
                elif PAD2:
                    v2 = tl.load(v2_ptrs + cols[:, None] * stride_vn, mask=d2_ok[None, :], other=0.0)
                else:
                    v2 = tl.load(v2_ptrs + cols[:, None] * stride_vn)
            acc2 = tl.dot(p_op, v2, acc2 * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, acc2, l_i, m_i


@triton.jit
def _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, b, h_kv, bh_kv, rows, lo, hi, N_K, qk_scale,
                BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
                CAUSAL: tl.constexpr, FP8: tl.constexpr, V_T: tl.constexpr, WS: tl.constexpr):
    """`_attend` for one column block through tensor descriptors of head (b, h_kv), or of
    row bh_kv where K or V is rank 3 (TMA copies; keys past N_K arrive as zeros, and
    MASKED hides their scores); with WS in a warp-specialized loop (Hopper: TMA copies by
    producer warps, products and softmax by the others)."""
    offs_k = tl.arange(0, BLOCK_K)
    K_RANK3: tl.constexpr = len(k_desc.block_shape) == 3  # each merged or not (`_layouts`)
    V_RANK3: tl.constexpr = len(v_desc.block_shape) == 3
    for start in tl.range(lo, hi, BLOCK_K, warp_specialize=WS):
        if K_RANK3:
            k = k_desc.load([bh_kv, start, 0]).reshape(BLOCK_K, BLOCK_D)
        else:
            k = k_desc.load([b, h_kv, start, 0]).reshape(BLOCK_K, BLOCK_D)
        s = tl.dot(q, k.T)
        s, m_new = _exponents(s, m_i, start + offs_k, rows, N_K, qk_scale, MASKED, CAUSAL, FP8)
        p = tl.exp2(s)
        alpha = tl.exp2(m_i - m_new)
        l_ij = tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if V_RANK3 and V_T:
            v = v_desc.load([bh_kv, 0, start]).reshape(BLOCK_D, BLOCK_K).T
        elif V_RANK3:
            v = v_desc.load([bh_kv, start, 0]).reshape(BLOCK_K, BLOCK_D)
        elif V_T:
            v = v_desc.load([b, h_kv, 0, start]).reshape(BLOCK_D, BLOCK_K).T
        else:
            v = v_desc.load([b, h_kv, start, 0]).reshape(BLOCK_K, BLOCK_D)
        if FP8:
            acc = tl.dot(p.to(tl.float8e4nv), v, acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        l_i = l_i * alpha + l_ij
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_configs(), key=["N_Q", "N_K", "HEAD_DIM", "BLOCK_D2", "CAUSAL", "TMA_OK"],
                 prune_configs_by={"early_config_prune": _prune}, do_bench=timed_once)
@triton.heuristics({"EVEN_K": _even_k, "LONG_K": _long_k})
@triton.jit(do_not_specialize=["N_Q", "N_K", "TMA_OK"])  # one compile for all lengths
def flash_attention_fwd_kernel(
    Q, K, V, O, LSE, DESCALE_Q, DESCALE_K, DESCALE_V, Q_DESC, K_DESC, V_DESC,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_on,
    H, GROUP, N_Q, N_K, qk_scale, TMA_OK,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, FP8: tl.constexpr, V_T: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
    Q_DEVICE: tl.constexpr, EVEN_K: tl.constexpr, LONG_K: tl.constexpr,
):
    # The head dim must be contiguous (the wrapper sees to it): rows load as wide vectors.
    # V_T: V's keys are contiguous instead, and stride_vn is the stride of its head dim.
    # DESCALE_*: None, or one fp32 number each (FP8: q = q8 * descale_q, ...).
    # TMA_OK (unused here): 1 where the wrapper allows the descriptor configs; in the
    # autotuner's key. *_DESC: host-made descriptors of Q, K, V (`_descriptors`) for the
    # descriptor configs (TMA), else None.
    pid_q = tl.program_id(0)
    if CAUSAL:
        pid_q = tl.num_programs(0) - 1 - pid_q  # longest rows first
    if FP8:
        # (b, h) from grid axes 2 and 1: the division below came before Q's copy, its
        # coordinates waiting on it; FP8 read 0.1-0.9% faster this way. fp16 at the 64 x 64
        # causal tile read 3% slower, with the same code in its loop (PERF.md 4a).
        h32 = tl.program_id(1)
        b32 = tl.program_id(2)
        pid_bh = b32 * H + h32
    else:
        pid_bh = tl.program_id(1)
        b32 = pid_bh // H
        h32 = pid_bh % H
    h_kv32 = h32 // GROUP  # (int32: descriptors' coordinates)
    bh_kv32 = b32 * (H // GROUP) + h_kv32  # K and V's row where their descriptors are rank 3
    b = b32.to(tl.int64)  # int64 offsets: large tensors pass 2**31 elements
    h = h32.to(tl.int64)
    h_kv = h_kv32.to(tl.int64)

    q0 = pid_q * BLOCK_Q
    rows = q0 + tl.arange(0, BLOCK_Q)
    row_ok = rows < N_Q
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_rows = Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn
    if TMA:
        # A TMA copy leaves the Q tile in shared memory, where the products can read it:
        # loaded into registers, it takes 64 of them a thread with 4 warps at D = 128.
        tl.static_assert(BLOCK_D2 == 0 and BLOCK_D == HEAD_DIM)
        if Q_DEVICE:
            # A 4-warp warp-specialized loop gets two consumer warpgroups, and Triton 3.6
            # loads Q in two 64-row halves, one for each. The box of a host-made
            # descriptor is fixed at launch (BLOCK_Q rows): each half would copy 128 rows
            # into a 64-row buffer, and on the H100 the program never ends. The compiler
            # re-tiles a descriptor made here. For the second half it adds 64 to the
            # load's row, and to every other use of that value: with q0 itself as the
            # row, `rows` got the 64 twice. So the row is min(q0, N_Q): q0 (every block
            # starts before N_Q), but a value of its own (PERF.md 3j).
            q_desc = tl.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh,
                                               shape=[N_Q, HEAD_DIM], strides=[stride_qn, 1],
                                               block_shape=[BLOCK_Q, BLOCK_D])
            q = q_desc.load([tl.minimum(q0, N_Q), 0])
        else:
            q = Q_DESC.load([b32, h32, q0, 0]).reshape(BLOCK_Q, BLOCK_D)
    else:
        q = tl.load(q_rows + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
    if BLOCK_D2 > 0:
        offs_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
        d2_ok = offs_d2 < HEAD_DIM
        q2 = tl.load(q_rows + offs_d2[None, :], mask=row_ok[:, None] & d2_ok[None, :], other=0.0)
        acc2 = tl.zeros([BLOCK_Q, BLOCK_D2], tl.float32)
    else:
        q2 = q          # unused placeholders: the loop never touches them
        acc2 = acc
    if DESCALE_Q is not None:
        qk_scale = qk_scale * tl.load(DESCALE_Q)
    if DESCALE_K is not None:
        qk_scale = qk_scale * tl.load(DESCALE_K)
    k_base = K + b * stride_kb + h_kv * stride_kh
    v_base = V + b * stride_vb + h_kv * stride_vh
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)

    # Stage 1, no masks: whole key blocks that every row of this query block may see.
    full_end = (N_K // BLOCK_K) * BLOCK_K
    if CAUSAL:
        # q0 must be a key-block boundary (`offered` keeps other tiles from causal calls).
        tl.static_assert(BLOCK_Q % BLOCK_K == 0)
        full_end = tl.minimum(full_end, q0)
    elif LONG_K and not WS:
        # Told that the loop runs, the compiler drops its zero-trip path. On that path the
        # accumulator's zeros reached the loop's last wgmma wait through copies, and ptxas
        # then ran every wgmma of the kernel one at a time (C7515) at some FP8 tiles (PERF.md 3x, 3y).
        # Not with WS: Triton 3.6's warp specialization pass fails on the assume.
        tl.assume(full_end > 0)
    if TMA:
        # Tensor descriptors made on the host (TMA copies); with WS, Triton's warp
        # specialization too: producer warps issue the copies, the others compute.
        acc, l_i, m_i = _attend_tma(acc, l_i, m_i, q, K_DESC, V_DESC, b32, h_kv32, bh_kv32, rows, 0,
                                    full_end, N_K, qk_scale, BLOCK_D, BLOCK_K, False, CAUSAL, FP8,
                                    V_T, WS)
    else:
        acc, acc2, l_i, m_i = _attend(acc, acc2, l_i, m_i, q, q2, k_base, v_base, stride_kn,
                                      stride_vn, rows, 0, full_end, N_K, qk_scale, HEAD_DIM, BLOCK_D,
                                      BLOCK_D2, BLOCK_K, False, CAUSAL, DOT_PRECISION, FP8, V_T)
    # Stage 2, masked: the diagonal blocks (causal) and the ragged last block. Key 0 is
    # in the first block visited whatever the stages, so every row's max is finite.
    # EVEN_K (whole key blocks) and not causal: nothing is masked, and the stage is left
    # out when compiling: 1-5% faster in fp16, up to 10% in FP8 (PERF.md 3f).
    # The stage's keys, [full_end, min(N_K, q0 + BLOCK_Q)) causal or [full_end, N_K), lie
    # within full_end + BLOCK_Q (causal) or + BLOCK_K: bounds that give the loop a step
    # count known when compiling (one step: no loop at all); keys past N_K are masked.
    masked_end = full_end + (BLOCK_Q if CAUSAL else BLOCK_K)
    if CAUSAL or not EVEN_K:
        if TMA:
            acc, l_i, m_i = _attend_tma(acc, l_i, m_i, q, K_DESC, V_DESC, b32, h_kv32, bh_kv32, rows,
                                        full_end, masked_end, N_K, qk_scale, BLOCK_D, BLOCK_K, True,
                                        CAUSAL, FP8, V_T, False)
        else:
            acc, acc2, l_i, m_i = _attend(acc, acc2, l_i, m_i, q, q2, k_base, v_base, stride_kn,
                                          stride_vn, rows, full_end, masked_end, N_K, qk_scale,
                                          HEAD_DIM, BLOCK_D, BLOCK_D2, BLOCK_K, True, CAUSAL,
                                          DOT_PRECISION, FP8, V_T)

    inv_l = 1.0 / l_i
    if DESCALE_V is not None:
        if not O.dtype.element_ty.is_fp8():  # an FP8 O keeps V's scale: o = o8 * descale_v
            inv_l = inv_l * tl.load(DESCALE_V)
    o_rows = O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on
    tl.store(o_rows + offs_d[None, :], (acc * inv_l[:, None]).to(O.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    if BLOCK_D2 > 0:
        tl.store(o_rows + offs_d2[None, :], (acc2 * inv_l[:, None]).to(O.dtype.element_ty),
                 mask=row_ok[:, None] & d2_ok[None, :])
    # FP8: m_i is the max minus P_SHIFT, and l_i summed the probabilities times
    # 2**P_SHIFT, so the two shifts cancel here.
    lse2 = m_i + tl.log2(l_i)
    tl.store(LSE + pid_bh * N_Q + rows, lse2 * LN2, mask=row_ok)


def _launch_forward(q, k, v, o, lse, causal, scale, descales, fp8, v_t, key):
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    block_d, block_d2 = column_blocks(D, 32 if fp8 else 16) if SPLIT_D else (
        max(32 if fp8 else 16, next_power_of_2(D)), 0)
    tma_ok = block_d2 == 0 and block_d == D and _tma_ok(q, k, v, v_t)
    if tma_ok and not INTERPRET:
        _scratch_allocator()
        cuda_context_on_this_thread(q.device)  # here too: the autotuner's timing launches come first
    key = key + (block_d2, tma_ok)
    # Descriptors only for configs that read them: each costs host time at every launch.
    chosen = _CHOSEN.get((flash_attention_fwd_kernel, key))
    descs = (None, None, None)
    if tma_ok and chosen is None:  # the autotuner sets the tiles per config
        descs = _descriptors(q, k, v, v_t, _block_shapes(16, 16, 16, v_t))
    elif tma_ok and chosen.kwargs["TMA"]:
        descs = _descriptors(q, k, v, v_t, _block_shapes(chosen.kwargs["BLOCK_Q"],
                                                         chosen.kwargs["BLOCK_K"], block_d, v_t))

    def grid(meta):  # flash_grid's, with the host-side cdiv; FP8: (b, h) on two axes
        return (cdiv(Nq, meta["BLOCK_Q"]), H, B) if fp8 else (cdiv(Nq, meta["BLOCK_Q"]), B * H, 1)

    v_strides = (v.stride(0), v.stride(1), v.stride(3)) if v_t else v.stride()[:3]
    launch_tuned(
        flash_attention_fwd_kernel, grid, key,
        q, k, v, o, lse, *descales, *descs,
        *q.stride()[:3], *k.stride()[:3], *v_strides, *o.stride()[:3],
        H, H // Hkv, Nq, Nk, scale * LOG2E, int(tma_ok),
        HEAD_DIM=D, BLOCK_D=block_d, BLOCK_D2=block_d2, CAUSAL=bool(causal),
        DOT_PRECISION=dot_precision(q.dtype), FP8=fp8, V_T=v_t,
    )


def gluon_forward_takes(q, k, v, causal):
    """Whether the Gluon kernel runs this forward: `gluon_takes`, and at D = 64 without a
    causal mask only up to GLUON_D64_FULL_MAX_N queries."""
    return gluon_takes(q, k, v) and (causal or q.shape[3] != 64 or q.shape[2] <= GLUON_D64_FULL_MAX_N)


def gluon_takes(q, k, v, head_dims=GLUON_HEAD_DIMS):
    """Whether the Gluon forward can take these inputs (`gluon_forward_takes` adds where
    it is the faster one; with other head_dims: whether the backward's Gluon kernels may
    run, `flash_backward.gluon_backward_takes`): a Hopper GPU
    (compute capability 9.x) with Triton 3.6, fp16/bf16, a head dim in head_dims, as many
    keys as queries (its causal mask is the square one), and q, k, v contiguous
    [B, H, N, D] (its descriptors see [B * H, N, D]) on 16-byte boundaries. Everything
    else runs this file's kernel, which takes any strides."""
    return (TRY_GLUON and not INTERPRET and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
            and q.shape[3] in head_dims and q.shape[2] == k.shape[2]
            and triton.__version__.startswith(GLUON_TRITON) and _capability(q.device)[0] == 9
            and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v)))


def kernel_input(t, contiguous=False):
    """t as the tuned kernels take a tensor, copied where it is not already: the head dim
    contiguous (rows load as wide vectors; with `contiguous`, the whole tensor, for those
    the kernels index by shape), and the first element on a 16-byte boundary. Triton
    compiles apart the kernels for pointers it cannot prove aligned, and with Triton 3.6
    on the H200 such a launch at D = 160 faulted (PERF.md 3f); such inputs are rare (a
    tensor one element into a buffer), so copying them costs less than trusting them."""
    laid_out = t.is_contiguous() if contiguous else t.stride(-1) == 1
    if laid_out and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)  # a new buffer: aligned


def flash_attention_forward(q, k, v, causal=False, sm_scale=None):
    """FlashAttention forward, tuned. Returns (o, lse) like `flash_attention`:
    o in q's shape and dtype, lse [B, H, Nq] fp32 natural-log log-sum-exp of the scaled
    scores of each query row."""
    if getattr(q, "dtype", None) in FP8_DTYPES:
        raise TypeError(f"q has dtype {q.dtype}: FP8 inputs need per-tensor scales, "
                        "use solutions.flash_tuned.flash_attention_fp8")
    inputs = (q, k, v)
    signature = plan_signature("forward", inputs, bool(causal), sm_scale)
    made = run_plan(signature, inputs)
    if made is not None:  # a call of this signature ran before: its launches again
        return made
    B, H, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    slices = batch_slices(B, H)
    if slices:
        return by_batch_slices(slices, lambda *qkv: flash_attention_forward(*qkv, causal, sm_scale), q, k, v)
    scale = default_scale(sm_scale, D)
    q, k, v = (kernel_input(t) for t in (q, k, v))
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    with recording(signature, inputs) as recorded:
        if gluon_forward_takes(q, k, v, causal):
            from solutions import flash_gluon  # imported here: the interpreter has no Gluon
            LAST_CONFIG[0] = GLUON
            flash_gluon.forward(q, k, v, o, lse, causal, scale)
        else:
            key = (Nq, Nk, D, bool(causal), q.dtype)  # the autotuner's key, and the dtype
            _launch_forward(q, k, v, o, lse, causal, scale, (None, None, None), False, False, key)
    recorded.keep(returned=(o, lse))
    return o, lse


# ---------------------------------------------------------------------------------------
# FP8

def check_fp8_inputs(q, k, v, out_dtype):
    """Validate FP8 attention inputs; return (B, H, Hkv, Nq, Nk, D).

    q, k, v: float8_e4m3fn or float8_e5m2 (one dtype for all three) on a CUDA GPU of
    compute capability >= 8.9; shapes as `check_attention_inputs` wants them, with
    32 <= D <= 256 (FP8 products take at least 32 columns). out_dtype: fp16, bf16 or
    the inputs' FP8 dtype.
    Raises TypeError for dtypes, ValueError for shapes, RuntimeError for devices.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in FP8_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; flash_attention_fp8 takes "
                            "torch.float8_e4m3fn or torch.float8_e5m2 (quantize_fp8 makes them)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one FP8 dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if out_dtype not in (torch.float16, torch.bfloat16, q.dtype):
        raise TypeError(f"out_dtype must be torch.float16, torch.bfloat16 or the inputs' dtype "
                        f"({q.dtype}), got {out_dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, Hkv, Nq, Nk, D = _fp8_shapes(q.shape, k.shape, v.shape)
    if D < 32:
        raise ValueError(f"head_dim {D} not supported in FP8: must be in [32, 256]")
    if q.device.type != "cuda" or INTERPRET:
        raise RuntimeError("FP8 attention runs on a CUDA GPU of compute capability >= 8.9 "
                           "(Ada, Hopper or later); Triton's interpreter on the CPU has no "
                           f"FP8 products (q is on {q.device})")
    capability = _capability(q.device)
    if capability < FP8_MIN_CAPABILITY:
        raise RuntimeError(f"FP8 attention needs compute capability >= 8.9; "
                           f"{torch.cuda.get_device_name(q.device)} has {capability[0]}.{capability[1]}")
    return B, H, Hkv, Nq, Nk, D


@functools.lru_cache(maxsize=1024)
def _fp8_shapes(*shapes):
    """The fp16 kernels' shape rules (`check_attention_inputs`, which names fp16/bf16/fp32
    as its dtypes, so it checks same-shaped placeholders), once per set of shapes: the
    placeholders cost host time at every call (PERF.md 3g)."""
    return check_attention_inputs(*(torch.empty(s, dtype=torch.float16, device="meta")
                                    for s in shapes))


def fp8_max(dtype):
    """The largest finite value of an FP8 dtype (e4m3: 448, e5m2: 57344)."""
    return torch.finfo(dtype).max


def quantize_fp8(x, dtype=torch.float8_e4m3fn):
    """Per-tensor quantization: (x8, descale) with x ~= x8.float() * descale.

    descale = amax(|x|) / fp8_max(dtype) as a 1-element fp32 tensor on x's device, so
    the largest element lands on the FP8 format's largest value (no overflow) and
    nothing synchronizes with the host. x8 has x's shape and strides' order.
    """
    if dtype not in FP8_DTYPES:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    amax = x.detach().abs().amax().float().clamp(min=1e-12).reshape(1)
    descale = amax / fp8_max(dtype)
    x8 = (x.float() / descale).clamp(-fp8_max(dtype), fp8_max(dtype)).to(dtype)
    return x8, descale


def transpose_v_fp8(v):
    """V laid out as Hopper's FP8 products want it: a [B, Hkv, Nk, D] view of a
    [B, Hkv, D, Nk] contiguous buffer (keys contiguous). flash_attention_fp8 makes this
    copy itself when v is not so laid out; callers that keep V (a KV cache) may store it
    this way once and skip the copy on every call. Always a new (aligned) buffer."""
    return v.transpose(-1, -2).clone(memory_format=torch.contiguous_format).transpose(-1, -2)


def _descale_arg(value, device, name):
    """A descale as the kernel takes it: None for 1, else a 1-element fp32 tensor."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must hold one number (a per-tensor scale), got shape "
                             f"{tuple(value.shape)}")
        if value.device != device:
            raise ValueError(f"{name} must be on {device}, got {value.device}")
        if value.dtype == torch.float32 and value.dim() == 1:  # as quantize_fp8 returns it
            return value
        return value.reshape(1).float()
    return torch.full((1,), float(value), device=device, dtype=torch.float32)


def flash_attention_fp8(q, k, v, causal=False, sm_scale=None, *, descale_q=None,
                        descale_k=None, descale_v=None, out_dtype=torch.float16):
    """FP8 FlashAttention forward (no backward). Returns (o, lse) like
    `flash_attention_forward`: o [B, H, Nq, D] in out_dtype, lse fp32. out_dtype: fp16
    or bf16, or the inputs' FP8 dtype, for an output in V's scale (o ~= o8 * descale_v:
    a row of O is a weighted mean of V's rows, so it fits V's range) that a next FP8
    product can take as it is, in half the bytes. P's rounding can take a row a little
    past V's largest element; Triton's conversion saturates (cvt.rn.satfinite), so it is
    stored as the format's largest value.

    q, k, v: float8_e4m3fn or float8_e5m2, one dtype, shapes as in the fp16 kernels.
    descale_q / descale_k / descale_v: per-tensor scales (a number or a 1-element
    tensor; None = 1) such that the real inputs are q8 * descale_q etc. (quantize_fp8
    returns them). The scores are (q8 . k8) * descale_q * descale_k * sm_scale, with the
    FP8 products accumulated in fp32 (Hopper's FP8 MMA accumulates with reduced
    precision inside one instruction); the softmax runs in fp32; P is quantized to e4m3
    (scaled by 2**P_SHIFT, see P_SHIFT) for P @ V8 whatever the inputs' FP8 format, as
    FlashAttention-3 does; O is scaled by descale_v / rowsum at the end. The second
    product wants V with keys contiguous (`transpose_v_fp8`); other layouts are copied.
    """
    B, H, Hkv, Nq, Nk, D = check_fp8_inputs(q, k, v, out_dtype)
    slices = batch_slices(B, H)
    if slices:
        return by_batch_slices(slices, lambda *qkv: flash_attention_fp8(
            *qkv, causal, sm_scale, descale_q=descale_q, descale_k=descale_k, descale_v=descale_v,
            out_dtype=out_dtype), q, k, v)
    scale = default_scale(sm_scale, D)
    q, k = (kernel_input(t) for t in (q, k))
    if v.stride(-2) != 1 or v.data_ptr() % 16:
        v = transpose_v_fp8(v)
    descales = tuple(_descale_arg(d, q.device, n) for d, n in
                     ((descale_q, "descale_q"), (descale_k, "descale_k"), (descale_v, "descale_v")))
    o = torch.empty(q.shape, device=q.device, dtype=out_dtype)
    lse = torch.empty(B, H, Nq, device=q.device, dtype=torch.float32)
    key = (Nq, Nk, D, bool(causal), q.dtype, out_dtype)
    _launch_forward(q, k, v, o, lse, causal, scale, descales, True, True, key)
    return o, lse


def _dequantize(x8, descale):
    if descale is None:
        return x8.double()
    if isinstance(descale, torch.Tensor):
        descale = descale.to(device=x8.device, dtype=torch.float64).reshape(())
    return x8.double() * descale


def fp8_attention_reference(q8, k8, v8, causal=False, sm_scale=None, descale_q=None,
                            descale_k=None, descale_v=None, quantize_p=True):
    """What flash_attention_fp8 computes, in float64 PyTorch (no tiling): dequantized
    inputs, exact scores and softmax, and (quantize_p) P rounded to e4m3 after scaling
    by 2**P_SHIFT, as the kernel's second product sees it (the kernel scales each tile by
    the running max, not the row's final max, so its roundings differ slightly).
    Returns (o, lse): o [B, H, Nq, D] and lse [B, H, Nq] in float64. GQA as elsewhere."""
    from solutions.naive_attention import attention_scores, repeat_kv
    q, k = _dequantize(q8, descale_q), _dequantize(k8, descale_k)
    s = attention_scores(q, k, causal, sm_scale)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m) * 2.0 ** P_SHIFT
    l_sum = p.sum(-1, keepdim=True)
    if quantize_p:
        p = p.to(torch.float8_e4m3fn).double()
    o = (p @ repeat_kv(v8.double(), q.shape[1])) / l_sum
    o = o * _dequantize(torch.ones((), dtype=torch.float64, device=o.device), descale_v)
    lse = (m + torch.log(l_sum)).squeeze(-1) - P_SHIFT * 0.6931471805599453
    return o, lse
