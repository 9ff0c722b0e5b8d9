"""A compiled Triton kernel launched through its C launcher, past Triton's Python layers.

Launch plans (`flash_tuned.LaunchPlan`) repeat a wrapper call's launches with the next
call's tensors. Inside a training step at N = 1024 the host's time bounds the step, and
of one launch's 13-21 us of host time on the H200's machine, Triton 3.6's Python layers
took 6-14 (PERF.md 4g): `CompiledKernel[grid]`'s runner with its launch metadata and
hooks, the launcher's scratch allocations, and for each TMA descriptor argument its
encoding (`make_tensordesc_arg`), made again at every launch. A plan's launch has the
same kernel, grid and layouts every time; only the tensors change. So `DirectLaunch`
keeps the C function and, per descriptor argument, the encoded descriptor of each base
address it has seen: the encoding is a function of the address and of the layout, which
the plan fixes, and a caching allocator hands out the same addresses step after step.

It relies on how Triton 3.6's CUDA backend builds a launcher (a C function, wrapped in
a closure where the kernel takes descriptors); `DirectLaunch.of` returns None for
anything else, and the plan then launches through `CompiledKernel[grid]`.
"""
from triton import knobs
from triton.runtime import driver

MAPS_MAX = 64  # encoded descriptors kept per descriptor argument: one per address seen


# The C function's arguments before the kernel's, as Triton 3.6 lays them out: grid (3),
# stream, function, cooperative grid, PDL, two scratch buffers, kernel metadata, launch
# metadata, two hooks. Another layout: no direct launches.
C_HEAD = "iiiKKppOOOOOO"


def supported():
    """Whether this Triton's CUDA launcher takes its arguments as Triton 3.6's does."""
    from triton.backends.nvidia import driver as nvidia
    return getattr(nvidia, "_BASE_ARGS_FORMAT", None) == C_HEAD and hasattr(nvidia, "make_tensordesc_arg")


def _launcher_parts(compiled):
    """(C launch function, descriptor metadata, descriptor argument indices) of a
    compiled kernel's launcher, or None where it is not Triton 3.6's CUDA launcher, needs
    scratch memory (made per launch) or runs more than one CTA per program."""
    run = getattr(compiled, "run", None)
    launch = getattr(run, "launch", None)
    if (launch is None or not supported()
            or not all(hasattr(compiled, a) for a in ("function", "packed_metadata"))
            or not all(hasattr(run, a) for a in ("launch_cooperative_grid", "launch_pdl"))
            or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1)
            or getattr(run, "num_ctas", 0) != 1):
        return None
    code = getattr(launch, "__code__", None)
    if code is None:  # the C function itself: the kernel takes no descriptors
        return launch, [], set()
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in launch.__closure__ or ())))
    parts = cells.get("launcher"), cells.get("tensordesc_meta"), cells.get("tensordesc_indices")
    return parts if None not in parts and None not in parts[1] else None


def rebased(desc, base):
    """A copy of the tensor descriptor desc over another tensor of the same layout."""
    copy = object.__new__(type(desc))
    copy.__dict__.update(desc.__dict__)
    copy.base = base
    return copy


def hooks_set():
    """Whether launch hooks are installed (a profiler's): direct launches would skip them."""
    return any(getattr(h, "calls", h) for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


class DirectLaunch:
    """One launch of a plan: `compiled` on `grid` (3 ints) with `args` (the recorded
    call's arguments, constexpr values included, as `CompiledKernel[grid]` takes them),
    where `tensor_args` [(index, slot)] and `desc_args` [(index, slot, descriptor
    template)] name the arguments a later call replaces with its tensors, and
    descriptors over them, by slot; on device `device_index`'s current stream. Keeps no
    tensor alive."""

    @classmethod
    def of(cls, compiled, grid, args, tensor_args, desc_args, device_index):
        parts = _launcher_parts(compiled)
        if parts is None or {i for i, *_ in desc_args} != parts[2]:
            return None
        from triton.backends.nvidia.driver import make_tensordesc_arg
        self = cls()
        self.c_launch, metas, _ = parts
        self.encode, self.stream, self.grid = make_tensordesc_arg, driver.active.get_current_stream, grid
        self.device_index = device_index
        run = compiled.run  # the C function's arguments before the kernel's, after the stream:
        self.rest = (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,  # no scratch
                     compiled.packed_metadata, None, None, None)  # no launch metadata, no hooks
        meta_of = {i: metas[n] for n, i in enumerate(sorted(i for i, *_ in desc_args))}
        replaced = {i for i, _ in tensor_args}
        self.template, position = [], {}
        for i, arg in enumerate(args):
            position[i] = len(self.template)
            if i in meta_of:  # the C function takes a descriptor's encoding, shape and strides
                self.template.extend([None, *make_tensordesc_arg(arg, meta_of[i])[1:]])
            else:
                self.template.append(None if i in replaced else arg)
        self.tensor_args = [(position[i], s) for i, s in tensor_args]
        self.desc_args = [(position[i], s, desc, meta_of[i], {}) for i, s, desc in desc_args]
        return self

    def __call__(self, tensors):
        """Launch with `tensors` in the slots; a descriptor over a tensor is encoded where
        its address is new."""
        args = self.template.copy()
        for i, s in self.tensor_args:
            args[i] = tensors[s]
        for i, s, desc, meta, encoded in self.desc_args:
            t = tensors[s]
            address = t.data_ptr()
            args[i] = encoded.get(address)
            if args[i] is None:  # (one lookup: another thread may clear the dict meanwhile)
                args[i] = self.encode(rebased(desc, t), meta)[0]
                if len(encoded) >= MAPS_MAX:
                    encoded.clear()
                encoded[address] = args[i]
        self.c_launch(*self.grid, self.stream(self.device_index), *self.rest, *args)
