"""Checks that explain what is wrong.

Every comparison is made in float64 against a reference, with tolerances chosen per
dtype, and a failure says where and how the result differs instead of a bare
AssertionError. Visible checks (course/checks/) and hidden tests (grader/hidden/) both
build on these functions.
"""
import contextlib
import math

import torch

# (atol, rtol) against a float64 reference. On a GPU, tl.dot on fp32 uses TF32 by
# default (10-bit mantissa, like fp16), so fp32 gets fp16's tolerance there.
_TOLERANCES = {
    ("cpu", torch.float32): (1e-4, 1e-4),
    ("cuda", torch.float32): (1e-2, 1e-2),
    ("cpu", torch.float64): (1e-10, 1e-10),
    ("cuda", torch.float64): (1e-10, 1e-10),
    ("cpu", torch.float16): (1e-2, 1e-2),
    ("cuda", torch.float16): (1e-2, 1e-2),
    ("cuda", torch.bfloat16): (2e-2, 2e-2),
    ("cpu", torch.bfloat16): (2e-2, 2e-2),
}


class CheckFailed(AssertionError):
    """A check failed; the message says what is wrong and how to look for it."""


def fail(message: str):
    raise CheckFailed(message)


def join_hints(*hints):
    """The hints that apply (falsy ones left out), each on its own "hint:" line of a
    failure message; None if none applies."""
    return "\n  hint: ".join(h for h in hints if h) or None


@contextlib.contextmanager
def hinted(hint):
    """A check failing inside the block fails with the hint added to its message."""
    try:
        yield
    except CheckFailed as failure:
        if not hint:
            raise
        fail(f"{failure}\n  hint: {hint}")


def tolerance(dtype: torch.dtype, device="cpu"):
    """(atol, rtol) for results of this dtype computed on this device."""
    kind = torch.device(device).type
    try:
        return _TOLERANCES[(kind, dtype)]
    except KeyError:
        raise ValueError(f"no tolerance defined for {dtype} on {kind}") from None


def weight_tolerance(dtype: torch.dtype, n: int, device="cpu"):
    """(atol, rtol) for softmax weights over n entries: the absolute part is scaled by the
    average weight 1/n, or every weight of a wide row (all below atol) would pass whatever
    its value."""
    atol, rtol = tolerance(dtype, device)
    return atol / max(n, 1), rtol


def _where(index, dim_names):
    if dim_names and len(dim_names) == len(index):
        return ", ".join(f"{n}={i}" for n, i in zip(dim_names, index))
    return "[" + ", ".join(str(i) for i in index) + "]"


def _first_indices(mask: torch.Tensor, limit=3):
    return [tuple(int(i) for i in idx) for idx in mask.nonzero()[:limit]]


def _slices_that_differ(bad: torch.Tensor, dim_names):
    """Name the leading slices (rows, or (batch, head) pairs) that hold the errors."""
    if bad.dim() < 2:
        return ""
    lead = bad.flatten(start_dim=bad.dim() - 1).any(-1)  # one flag per row
    rows = _first_indices(lead, limit=6)
    total = int(lead.sum())
    names = dim_names[:-1] if dim_names else None
    shown = "; ".join(_where(r, names) for r in rows)
    more = f" (and {total - len(rows)} more)" if total > len(rows) else ""
    return f"\n  rows that differ: {total} of {lead.numel()}: {shown}{more}"


def assert_close(actual, expected, *, name="output", atol=None, rtol=None,
                 dim_names=None, mistakes=None, hint=None, quiet=False):
    """Compare `actual` with `expected` (ideally computed in float64).

    dim_names: names of the dimensions, used in the message (e.g. ("row", "col")).
    mistakes: {description: tensor} outputs of classic bugs; if `actual` matches one,
        the message names it.
    hint: a sentence added to any failure message.
    Returns the max absolute error. Prints a one-line pass message unless quiet.
    """
    if not isinstance(actual, torch.Tensor):
        fail(f"{name} should be a torch.Tensor, got {type(actual).__name__}"
             + (" (did you forget a `return`?)" if actual is None else ""))
    expected = torch.as_tensor(expected)
    if tuple(actual.shape) != tuple(expected.shape):
        fail(f"{name} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if atol is None or rtol is None:
        d_atol, d_rtol = tolerance(actual.dtype if actual.is_floating_point() else torch.float64,
                                   actual.device)
        atol = d_atol if atol is None else atol
        rtol = d_rtol if rtol is None else rtol
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    extra = f"\n  hint: {hint}" if hint else ""

    nan = torch.isnan(a) & ~torch.isnan(e)
    if nan.any():
        idx = _first_indices(nan)
        fail(f"{name} has NaN at {int(nan.sum())} of {a.numel()} entries, first at "
             + ", ".join(_where(i, dim_names) for i in idx)
             + _slices_that_differ(nan, dim_names)
             + _mistake_text(a, mistakes, atol, rtol) + extra)
    # Infinities must match exactly (a -inf mask entry is right, a +inf overflow is not).
    both_inf = torch.isinf(a) & torch.isinf(e) & (a == e)
    err = torch.where(both_inf | (torch.isnan(a) & torch.isnan(e)), torch.zeros_like(a), (a - e).abs())
    err = torch.nan_to_num(err, nan=math.inf)
    bad = err > atol + rtol * torch.nan_to_num(e.abs(), posinf=0.0)
    if bad.any():
        worst = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
        fail(f"{name} differs from the reference at {int(bad.sum())} of {a.numel()} entries "
             f"(atol={atol:g}, rtol={rtol:g}).\n"
             f"  largest error {float(err[worst]):.3g} at {_where(worst, dim_names)}: "
             f"got {float(a[worst]):.6g}, expected {float(e[worst]):.6g}"
             + _slices_that_differ(bad, dim_names)
             + _mistake_text(a, mistakes, atol, rtol) + extra)
    max_err = float(err.max()) if err.numel() else 0.0
    if not quiet:
        print(f"ok  {name}: {tuple(actual.shape)} {dtype_name(actual.dtype)}, "
              f"max error {max_err:.2g}")
    return max_err


def _mistake_text(a, mistakes, atol, rtol):
    from course import recorded  # a mistake's output may be a recorded signature
    for description, wrong in (mistakes or {}).items():
        if isinstance(wrong, dict):
            same = recorded.matches(a, wrong, atol, rtol)
        else:
            wrong = torch.as_tensor(wrong).detach().to("cpu", torch.float64)
            same = wrong.shape == a.shape and torch.allclose(a, wrong, atol=atol, rtol=rtol, equal_nan=True)
        if same:
            return f"\n  this matches a classic mistake: {description}"
    return ""


def assert_not_trivial(actual, *, name="output"):
    """A constant (or all-zero) output is never a right answer here."""
    a = actual.detach().to("cpu", torch.float64)
    if a.numel() > 1 and bool((a == a.flatten()[0]).all()):
        fail(f"{name} is constant ({float(a.flatten()[0]):g} everywhere): is the function "
             "really computing anything?")


def check_choice(answer, name, options="abcd"):
    """The form of a multiple-choice answer (one letter), then right or wrong at once
    where the lesson sealed the answer (course/quiz.py); hidden tests grade the letter."""
    check_choice_form(answer, name, options)
    from course import quiz  # here: course.quiz imports this module
    if not quiz.judge(name, answer):
        print(f"ok  {name}: one letter (whether it is right is checked when you submit)")


def graded_choice(answer, name, right, why):
    """A hidden test's verdict on a letter: the form, then the key, with a hint if wrong."""
    check_choice_form(answer, name)
    if answer.strip().lower() != right:
        fail(f"{name} is not the right choice: {why}")


def check_choice_form(answer, name, options="abcd"):
    """One letter among `options`, or a failure saying what the form should be."""
    if not isinstance(answer, str):
        fail(f'{name} should be a string holding one letter, e.g. {name} = "a"; '
             f"got {type(answer).__name__}")
    if len(answer.strip()) != 1 or answer.strip().lower() not in options:
        fail(f"{name} is {answer!r}: answer with one letter among " + ", ".join(f'"{o}"' for o in options))


def dtype_name(dtype):
    """float16, not torch.float16: how messages name a dtype."""
    return str(dtype).replace("torch.", "")


def randn(*shape, dtype=torch.float32, device="cpu", seed=None):
    """Fresh random inputs (never zeros), reproducible when a seed is given."""
    g = torch.Generator(device="cpu")
    g.manual_seed(torch.seed() if seed is None else seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------
# Guard buffers: the interpreter does no bounds checking (ARCHITECTURE.md, "Facts about the tools"), so inputs are placed
# between NaN margins (a load past the end reads NaN, which shows in the output) and
# outputs between sentinel margins (a store past the end changes them). With `gaps`, the
# tensor is a window of a wider block (rows longer than the tensor's, say), so its strides
# are not those of a contiguous tensor, and the gaps between its rows are guarded too.

_SENTINEL = 12345.0
_UNWRITTEN = -1024.0  # what an output holds before the kernel runs: entries still equal to it were never stored


class Guarded:
    """A tensor living inside a larger buffer whose margins we can inspect.

    gaps: entries left after each index of each dim (e.g. (0, 5): every row is followed by
    5 entries that are not part of the tensor), filled like the margins.
    """

    def __init__(self, shape, dtype, device, fill, margin=None, gaps=None):
        gaps = tuple(gaps) if gaps else (0,) * len(shape)
        block = tuple(s + g for s, g in zip(shape, gaps))
        self.numel = math.prod(block)
        self.margin = margin if margin is not None else max(4096, self.numel)
        self.fill = fill
        self.buffer = torch.full((self.numel + 2 * self.margin,), fill, dtype=dtype, device=device)
        self.block = self.buffer[self.margin:self.margin + self.numel].view(block)
        self.window = tuple(slice(0, s) for s in shape)
        self.tensor = self.block[self.window]

    def _changed(self, part):
        return int((~torch.isnan(part)).sum()) if math.isnan(self.fill) else int((part != self.fill).sum())

    def margins_touched(self):
        """Number of margin elements (before, after) that no longer hold the fill value."""
        m = self.margin
        return self._changed(self.buffer[:m]), self._changed(self.buffer[m + self.numel:])

    def gaps_touched(self):
        """Number of elements in the gaps between rows that no longer hold the fill value."""
        in_gaps = torch.ones(self.block.shape, dtype=torch.bool, device=self.block.device)
        in_gaps[self.window] = False
        return self._changed(self.block[in_gaps])


def guarded_input(x: torch.Tensor, gaps=None, margin=None) -> torch.Tensor:
    """A copy of x with NaN just before and after it in memory (and, with gaps, between its
    rows: see Guarded), contiguous unless gaps are asked for. margin: entries of NaN on
    each side (default: as many as x has, at least 4096)."""
    g = Guarded(tuple(x.shape), x.dtype, x.device, float("nan"), margin=margin, gaps=gaps)
    g.tensor.copy_(x)
    return g.tensor


def _layout(t):
    """How a message describes where entry [i, j, ...] of a strided view lives."""
    terms = " + ".join(f"{'ijklmnop'[d]} * {s}" for d, s in enumerate(t.stride()))
    return (f"It is a slice of a wider tensor here, strides {tuple(t.stride())}: entry "
            f"[{', '.join('ijklmnop'[:t.dim()])}] lives at ptr + {terms}. Compute addresses with the "
            "stride arguments you are given, never with the row length")


@contextlib.contextmanager
def guarded_output(shape, dtype, device, name="output", gaps=None, margin=None):
    """Yield an output tensor framed by sentinels (a strided window of a wider block, with
    sentinels in the gaps, when gaps are given: see Guarded; margin as in guarded_input);
    on exit, fail if a store went past it or into a gap, or if an entry was never stored
    (NaN is left for loads past a guarded input)."""
    g = Guarded(tuple(shape), dtype, device, _SENTINEL, margin=margin, gaps=gaps)
    g.tensor.fill_(_UNWRITTEN)
    yield g.tensor
    before, after = g.margins_touched()
    if before or after:
        fail(f"your kernel wrote outside {name}: {before} element(s) before it and {after} "
             "after it in memory. Are the stores masked (mask=offsets < n)? On a GPU this "
             "corrupts other tensors or crashes.")
    between = g.gaps_touched()
    if between:
        fail(f"your kernel wrote outside {name}, into the memory between its rows: {between} "
             f"element(s) there changed. Are the stores masked, and does each row start where "
             f"its stride says? {_layout(g.tensor)}.")
    never = g.tensor == _UNWRITTEN
    if never.any():
        first = tuple(int(i) for i in never.nonzero()[0])
        fail(f"{int(never.sum())} of {g.tensor.numel()} entries of {name} were never written, "
             f"first at {first}. Does every program store its block, and does the grid cover "
             "the whole output?" + (f" {_layout(g.tensor)}." if gaps else ""))


@contextlib.contextmanager
def guarded_allocations():
    """Inside the block, float tensors made by torch.empty/empty_like/zeros/zeros_like
    (a wrapper's output buffers) live between sentinel margins; on exit, fail if a
    kernel stored past one of them (instead of corrupting the heap). What torch.empty
    makes holds _UNWRITTEN, not leftover memory, so an entry no kernel stored reads the
    same on every run."""
    guards = []
    names = ("empty", "empty_like", "zeros", "zeros_like")
    originals = {n: getattr(torch, n) for n in names}

    def guarded(original):
        def allocate(*args, **kwargs):
            t = original(*args, **kwargs)
            if not t.is_floating_point() or t.numel() == 0:
                return t
            g = Guarded(tuple(t.shape), t.dtype, t.device, _SENTINEL)
            if original in (originals["empty"], originals["empty_like"]):
                g.tensor.fill_(_UNWRITTEN)
            else:
                g.tensor.copy_(t)
            guards.append(g)
            return g.tensor
        return allocate

    for n in names:
        setattr(torch, n, guarded(originals[n]))
    try:
        yield
    finally:
        for n in names:
            setattr(torch, n, originals[n])
    for g in guards:
        before, after = g.margins_touched()
        if before or after:
            fail(f"a kernel wrote outside a {tuple(g.tensor.shape)} tensor made with torch.empty/"
                 f"zeros: {before} element(s) before it and {after} after it in memory. Are the "
                 "stores masked (mask=offsets < n)? On a GPU this corrupts memory or crashes.")


def row_margin(n_cols):
    """A guard margin for kernels that load a row as one power-of-two block: room for the
    lanes past the end of the last row (capped: a store or load beyond the margin is
    stopped by course.bounds anyway), and no more, since every guarded byte travels to the
    grading worker and back."""
    block = 1 << max(n_cols - 1, 0).bit_length()
    return max(256, min(block - n_cols, 4096))


def explain_nan_from_guards(actual, *, name="output", gaps=False):
    """Inputs were guarded: NaN in the output means a load read past an input (or, with
    gaps, between its rows)."""
    if torch.isnan(actual).any():
        fail(f"{name} has NaN. The inputs were surrounded by NaN in memory, so your kernel "
             "read past the end of an input: is every tl.load masked (mask=offsets < n)?"
             + (" Here the input's rows (and batch entries) are not one after another in memory "
                "(NaN lies between them): a row starts where the stride arguments you are given "
                "say (in_ptr + row * row stride [+ batch * batch stride]), never where the row "
                "length says." if gaps else ""))


# ---------------------------------------------------------------------------------------
# Proof that a Triton kernel ran, and that PyTorch did not do the work instead.

@contextlib.contextmanager
def count_launches(kernel, before_launch=None):
    """Count launches of a @triton.jit kernel inside the block: `with count_launches(k) as n:`.

    before_launch(launch_kwargs, count), if given, runs before each launch and may fail
    it (e.g. a wrong grid, which under the interpreter would write past a tensor).
    """
    if not hasattr(kernel, "run"):
        fail(f"{getattr(kernel, '__name__', kernel)!r} is not a @triton.jit kernel")
    counter = [0]
    original = kernel.run

    def counting_run(*args, **kwargs):
        counter[0] += 1
        if before_launch is not None:
            before_launch(kwargs, counter[0])
        return original(*args, **kwargs)

    kernel.run = counting_run
    try:
        yield counter
    finally:
        del kernel.run  # back to the class's method


class LargestProduct(torch.overrides.TorchFunctionMode):
    """Records the largest matrix side taken by any PyTorch matrix product inside it."""

    largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _PRODUCTS:
            sides = [s for t in args if isinstance(t, torch.Tensor) for s in t.shape[-2:]]
            self.largest = max([self.largest] + sides)
        return func(*args, **(kwargs or {}))


def watched_call(fn, *args, kernel=None, forbid=(), before_launch=None, measure_products=False,
                 **kwargs):
    """Call fn(*args, **kwargs) the way checks watch a learner's function: `forbid`'s
    PyTorch functions raise (see forbid_torch), float tensors from torch.empty/zeros are
    guarded, launches of `kernel` are counted (before_launch as in count_launches), and with
    measure_products the largest side of any PyTorch matrix product is recorded.

    Returns (output, {"launches": n, "largest_product": side}). When the function lives in
    a grading worker (grader/remote.py) the same happens there: fn.remote_watched_call.
    """
    remote = getattr(fn, "remote_watched_call", None)
    if remote is not None:
        return remote(args, kwargs, kernel=kernel, forbid=tuple(forbid),
                      before_launch=before_launch, measure_products=measure_products)
    with contextlib.ExitStack() as stack:
        count = (stack.enter_context(count_launches(kernel, before_launch))
                 if kernel is not None else [0])
        stack.enter_context(forbid_torch(*forbid))
        stack.enter_context(guarded_allocations())
        products = stack.enter_context(LargestProduct()) if measure_products else None
        out = fn(*args, **kwargs)
    return out, {"launches": count[0], "largest_product": products.largest if products else 0}


def run_wrapper(wrapper, kernel, *args, forbid, name, launches=None, hint="", before_launch=None,
                **kwargs):
    """Call a learner's wrapper the way every check does (watched_call): PyTorch's own
    version of the work (`forbid`) raises, its allocations are guarded, and `kernel` must be
    launched (exactly `launches` times, if given). Returns the wrapper's output."""
    out, report = watched_call(wrapper, *args, kernel=kernel, forbid=(forbid,),
                               before_launch=before_launch, **kwargs)
    kernel_name = getattr(kernel, "__name__", "the kernel")
    if report["launches"] == 0:
        fail(f"{name}: {kernel_name} was never launched; the wrapper must launch it")
    if launches is not None and report["launches"] != launches:
        fail(f"{name}: {kernel_name} was launched {report['launches']} times, expected {launches}"
             + (f": {hint}" if hint else ""))
    return out


def check_rejects(calls, *, name):
    """Each (description, thunk) must raise ValueError or TypeError with a message."""
    for description, call in calls:
        try:
            call()
        except (ValueError, TypeError) as error:
            if not str(error):
                fail(f"{name} raised {type(error).__name__} without a message for {description}: "
                     "say what is wrong")
            continue
        except Exception as error:  # noqa: BLE001 (any other error is the finding)
            fail(f"{name} raised {type(error).__name__} for {description}; check the inputs "
                 "first and raise ValueError or TypeError with a clear message")
        fail(f"{name} accepted {description}: check the inputs and raise ValueError or TypeError")


_MATMULS = ("matmul", "mm", "bmm", "einsum", "tensordot", "addmm", "addbmm", "baddbmm", "addmv",
            "mv", "dot", "vdot", "inner", "chain_matmul", "linear", "bilinear")
_PRODUCTS = {getattr(owner, name) for owner in (torch, torch.Tensor, torch.nn.functional, torch.linalg)
             for name in _MATMULS + ("__matmul__", "__rmatmul__", "multi_dot") if hasattr(owner, name)}
_SOFTMAXES = ("softmax", "log_softmax", "softmin", "gumbel_softmax", "scaled_dot_product_attention")
# What each rule forbids: every PyTorch path that computes the exercise's answer.
_FORBIDDEN = {
    "softmax": [(torch, _SOFTMAXES), (torch.Tensor, _SOFTMAXES), (torch.nn.functional, _SOFTMAXES),
                (torch.special, _SOFTMAXES)],
    "attention": [(torch.nn.functional, ("scaled_dot_product_attention",))],
    "matmul": [(torch, _MATMULS), (torch.Tensor, _MATMULS + ("__matmul__", "__rmatmul__")),
               (torch.nn.functional, _MATMULS), (torch.linalg, ("matmul", "multi_dot", "vecdot"))],
}


@contextlib.contextmanager
def forbid_torch(*names):
    """Make PyTorch functions raise inside the block (groups of _FORBIDDEN: "softmax",
    "matmul", "attention")."""
    places = {name: [(owner, attr) for owner, attrs in groups for attr in attrs if hasattr(owner, attr)]
              for name, groups in _FORBIDDEN.items()}
    saved = []
    for name in names:
        for owner, attr in places[name]:
            original = getattr(owner, attr)
            saved.append((owner, attr, original))

            def refuse(*args, _attr=attr, **kwargs):
                fail(f"this exercise must compute with your Triton kernel, but it called "
                     f"torch's {_attr}")
            setattr(owner, attr, refuse)
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)
