"""Bounds checks for Triton's interpreter, so a wrong kernel gets a sentence, not a crash.

The interpreter does no bounds checking: a store past the end of a tensor writes into
whatever lies there, which corrupts the heap and kills the process (in JupyterLab the
kernel dies and the learner loses everything). Installed by `import course` when kernels
run in the interpreter, this checks every load and store of every launch before it
happens: each address a program touches (on the lanes its mask lets through) must lie
inside the storage of one of the tensors the launch was given, or of a tensor whose
address the launch was handed in an int64 table (pointer-array kernels). Otherwise the
launch stops with OutOfBounds, naming the program, the argument it strayed from, and
how far. Reads inside a tensor's storage stay allowed: the checks' guard margins are part
of the same storage, so their NaN and sentinel diagnostics keep working.
"""
import contextlib
import gc
import warnings

import numpy as np
import torch

_LAUNCH = {"kernel": "", "ranges": [], "tables": []}  # the current launch: its tensors'
# [(start, end, name)], and int64 arguments not yet searched as pointer tables
WATCHERS = []  # callables(kernel name, [(arg name, arg)]) told of every launch (tests use it)
_RECORD = None  # a list while `recording()` is on: one Access per load or store


class Access:
    """One tl.load or tl.store of one program: which tensor argument, which elements.

    `offsets` are element offsets from the start of that argument's storage, for the lanes
    the mask let through; `outside` counts those lanes that fell outside every tensor.
    """

    def __init__(self, program, verb, tensor, offsets, outside):
        self.program, self.verb, self.tensor = program, verb, tensor
        self.offsets, self.outside = offsets, outside


@contextlib.contextmanager
def recording():
    """Record every load and store of the launches made inside the block (interpreter
    only), for pictures of what a kernel did: `with recording() as accesses: ...`."""
    global _RECORD
    saved, _RECORD = _RECORD, []
    try:
        yield _RECORD
    finally:
        _RECORD = saved


class OutOfBounds(IndexError):
    """A kernel touched memory outside every tensor it was given."""


def _storage_range(tensor, name):
    storage = tensor.untyped_storage()
    return (storage.data_ptr(), storage.data_ptr() + storage.nbytes(), name)


def _tables_point_to(values):
    """Storages of live CPU tensors that contain any of these addresses (the tensors a
    pointer table refers to). Only launches that take int64 tensors pay for this search."""
    found = []
    addresses = np.unique(values.astype(np.uint64))
    with warnings.catch_warnings():  # isinstance() on some of torch's deprecated objects warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        if obj.device.type == "cpu":
            start, end, _ = _storage_range(obj, "")
            if end > start and bool(((addresses >= start) & (addresses < end)).any()):
                found.append((start, end, "a tensor the pointer table points to"))
    return found


def _ranges_of(named_args):
    """(ranges of the tensor arguments, int64 arguments that may be pointer tables)."""
    ranges, tables = [], []
    for name, arg in named_args:
        if isinstance(arg, torch.Tensor) and arg.device.type == "cpu":
            ranges.append(_storage_range(arg, name))
            if arg.dtype == torch.int64 and arg.numel():
                tables.append(arg.detach().reshape(-1).numpy())
    return ranges, tables


def _check(ptrs, mask, itemsize, verb):
    ranges = _LAUNCH["ranges"]
    if not ranges:
        return
    address = np.asarray(ptrs, dtype=np.uint64)
    lanes = np.broadcast_to(np.asarray(mask, dtype=bool), address.shape) if mask is not None \
        else np.ones(address.shape, dtype=bool)
    inside = np.zeros(address.shape, dtype=bool)
    for start, end, _ in ranges:
        inside |= (address >= start) & (address + itemsize <= end)
    bad = lanes & ~inside
    if bad.any() and _LAUNCH["tables"]:  # the tensors a pointer table points to, found once
        ranges += _tables_point_to(np.concatenate(_LAUNCH["tables"]))
        _LAUNCH["tables"] = []
        return _check(ptrs, mask, itemsize, verb)
    if _RECORD is not None:
        _record(address, lanes, itemsize, verb, bad)
    if not bad.any():
        return
    from triton.runtime.interpreter import interpreter_builder
    first = int(address[bad].flat[0])
    start, end, name = min(ranges, key=lambda r: min(abs(first - r[0]), abs(first - r[1])))
    where = (f"{(first - end) // itemsize + 1} element(s) past the end of {name}" if first >= end
             else f"{(start - first + itemsize - 1) // itemsize} element(s) before the start of {name}")
    raise OutOfBounds(
        f"program {tuple(interpreter_builder.grid_idx)} of {_LAUNCH['kernel']} tried to {verb} "
        f"{int(bad.sum())} element(s) outside every tensor it was given (the first {where}). "
        "Nothing stops this in the interpreter, and on a GPU it reads garbage or corrupts "
        f"memory: is every tl.{verb} masked (mask=offsets < n), and does the grid match the "
        "shapes (one program per row, per tile, ...)?")


def record(launch):
    """Run launch() recording its loads and stores -> (accesses, None), or (accesses so
    far, the message) when it strayed out of bounds: a picture of the way there helps."""
    if not _installed():
        raise RuntimeError("recording a kernel's accesses needs Triton's interpreter "
                           "(TRITON_INTERPRET=1): on a GPU there is nothing to record")
    with recording() as accesses:
        try:
            launch()
        except Exception as error:  # noqa: BLE001 (the interpreter wraps OutOfBounds)
            cause = error
            while cause is not None and not isinstance(cause, OutOfBounds):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
            return accesses, str(cause)
    return accesses, None


def _installed():
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    return getattr(interpreter, "_course_bounds", False)


def _record(address, lanes, itemsize, verb, bad):
    from triton.runtime.interpreter import interpreter_builder
    program = tuple(int(i) for i in interpreter_builder.grid_idx)
    for start, end, name in _LAUNCH["ranges"]:
        hit = lanes & (address >= start) & (address + itemsize <= end)
        if hit.any():
            _RECORD.append(Access(program, verb, name, (address[hit] - start) // itemsize, 0))
    if bad.any():
        _RECORD.append(Access(program, verb, None, np.zeros(0, np.int64), int(bad.sum())))


def install():
    """Wrap the interpreter's launches and memory operations (once)."""
    from triton.runtime import interpreter as it
    if getattr(it, "_course_bounds", False):
        return
    it._course_bounds = True
    builder = it.InterpreterBuilder
    launch = it.GridExecutor.__call__

    def checked_launch(self, *args, **kwargs):
        named = list(zip(self.arg_names, args)) + list(kwargs.items())
        for watcher in WATCHERS:
            watcher(getattr(self.fn, "__name__", "kernel"), named)
        saved = dict(_LAUNCH)
        ranges, tables = _ranges_of(named)
        _LAUNCH.update(kernel=getattr(self.fn, "__name__", "the kernel"), ranges=ranges, tables=tables)
        try:
            return launch(self, *args, **kwargs)
        finally:
            _LAUNCH.update(saved)

    def size(handle):
        return np.dtype(it._get_np_dtype(handle.get_element_ty())).itemsize

    load, store = builder.create_masked_load, builder.create_masked_store

    # (**options: tensor descriptors' loads and stores pass cache policies by name)
    def masked_load(self, ptrs, mask, other, *rest, **options):
        _check(ptrs.data, mask.data, size(ptrs), "load")
        return load(self, ptrs, mask, other, *rest, **options)

    def masked_store(self, ptrs, value, mask, *rest, **options):
        _check(ptrs.data, mask.data, size(ptrs), "store")
        return store(self, ptrs, value, mask, *rest, **options)

    it.GridExecutor.__call__ = checked_launch
    builder.create_masked_load, builder.create_masked_store = masked_load, masked_store
    if hasattr(builder, "create_atomic_rmw"):
        rmw = builder.create_atomic_rmw

        def atomic_rmw(self, op, ptr, val, mask, *rest):
            _check(ptr.data, mask.data, size(ptr), "store")
            return rmw(self, op, ptr, val, mask, *rest)
        builder.create_atomic_rmw = atomic_rmw
    if hasattr(builder, "create_atomic_cas"):
        cas = builder.create_atomic_cas

        def atomic_cas(self, ptr, cmp, val, *rest):
            _check(ptr.data, None, size(ptr), "store")
            return cas(self, ptr, cmp, val, *rest)
        builder.create_atomic_cas = atomic_cas
