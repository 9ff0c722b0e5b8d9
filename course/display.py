"""How errors look in a learner's notebook: the message first, then their own line.

A failed check raises CheckFailed, whose message already says what is wrong; the
traceback through course/ internals that Jupyter would print around it (30-50 lines)
buries it. Registered with IPython by `import course`, this shows instead:
- a failed check: its message, then the line of the learner's code it came through;
- an exercise not written yet (the stub's NotImplementedError, or a name it should define
  that is not defined): "fill in X first", and any figure the cell had started is
  closed, so nothing half-drawn is shown;
- an out-of-bounds access under the interpreter (course/bounds.py): its sentence;
- any other error: IPython's usual traceback, plus a hint when the message is a classic
  PyTorch mistake (a missing keepdim, an integer mask, the tuple of x.max(dim)).
"""
import re
import sys
import traceback

HINTS = [  # (pattern of the error message, hint)
    (r"must match the size of tensor .* at non-singleton dimension",
     "two tensors do not broadcast: a reduction along `dim` (sum, max) drops that dimension "
     "unless you pass keepdim=True"),
    (r"masked_fill.* (only supports boolean masks|expected mask dtype to be Bool)|"
     r"expected .*mask.* to be.*bool",
     "the mask must be a bool tensor: build it with a comparison (e.g. j > i) or call .bool()"),
    (r"return_types\.max|return_types\.min|'max' object|unsupported operand type.*return_types",
     "x.max(dim) returns a pair (values, indices): use x.max(dim).values "
     "(or x.amax(dim))"),
    (r"expected scalar type .* but found|expected both vectors to have same dtype|"
     r"mat1 and mat2 must have the same dtype",
     "the tensors have different dtypes: convert one (e.g. .to(torch.float32)) before combining"),
]


def hint_for(message):
    for pattern, hint in HINTS:
        if re.search(pattern, message):
            return hint
    return None


def _learner_frames(tb):
    """Frames in notebook cells (IPython names their files <ipython-input-...> or
    .../ipykernel_<pid>/<hash>.py)."""
    return [f for f in traceback.extract_tb(tb)
            if f.filename.startswith("<ipython-input") or "ipykernel_" in f.filename
            or f.filename.startswith("<cell")]


def _unwrap(value):
    """Triton's interpreter wraps a kernel's error in InterpreterError: show the cause."""
    if type(value).__name__ == "InterpreterError" and value.__cause__ is not None:
        return value.__cause__
    return value


def _not_written(value, tb):
    """The exercise whose stub raised NotImplementedError, or None."""
    if not isinstance(value, NotImplementedError):
        return None
    if str(value):  # our own "X is not written yet: ..." messages
        return str(value)
    frames = _learner_frames(tb)
    if frames and frames[-1].line and "NotImplementedError" in frames[-1].line:
        if frames[-1].name == "<module>":  # the exercise cell itself
            return ("this exercise is not written yet: replace `raise NotImplementedError()` "
                    "with your answer, then run the cell")
        return (f"{frames[-1].name} is not written yet: fill in its exercise above first, then "
                "run this cell again")
    return None


def short_lines(etype, value, tb):
    """The lines shown for an error, or None for IPython's usual traceback."""
    from course.testing import CheckFailed
    unwrapped = _unwrap(value)
    if unwrapped is not value:  # the kernel's own error: its frames say where, not Triton's
        value, tb = unwrapped, unwrapped.__traceback__ or tb
    where = [f"  your code: {f.name}, line {f.lineno}: {f.line}" for f in _learner_frames(tb)[-2:]
             if f.line and not f.line.startswith("checks.")]
    if isinstance(value, CheckFailed):
        return [f"CheckFailed: {value}"] + where
    if isinstance(value, NameError) and getattr(value, "name", None):
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")
        return [f"Not written yet: {value.name} is not defined: fill in its exercise above (and "
                "run the cells above in order), then run this cell again"]
    not_written = _not_written(value, tb)
    if not_written:
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")  # draw nothing half
        return [f"Not written yet: {not_written}"]
    if type(value).__name__ == "OutOfBounds":
        return [f"OutOfBounds: {value}"] + where
    return None


def install():
    """Show errors this way in IPython (JupyterLab), if it is running."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None or not hasattr(ip, "set_custom_exc"):
        return

    def handler(shell, etype, value, tb, tb_offset=None):
        lines = short_lines(etype, value, tb)
        if lines is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            hint = hint_for(str(value))
            if hint:
                print(f"hint: {hint}", file=sys.stderr)
            return None
        # An error output (so Jupyter and nbgrader still see the cell failed), short.
        shell._showtraceback(etype, value, lines)
        return None

    ip.set_custom_exc((Exception,), handler)
