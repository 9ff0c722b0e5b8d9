"""Helper library of the attention-kernels course.

Import it before triton: it decides where kernels run (a CUDA GPU when there is one,
otherwise Triton's interpreter on the CPU) and sets TRITON_INTERPRET accordingly. In the
interpreter it also turns a kernel's out-of-bounds load or store into an error
(course/bounds.py) instead of a corrupted, then dead, process, and hides NumPy's
floating-point warnings from the interpreter's arithmetic (below). In JupyterLab it shows
a failed check as its message, not as a traceback (course/display.py).
"""
import warnings

from course.mode import DEVICE, INTERPRET, describe, pick

# The interpreter computes a kernel's arithmetic in NumPy, which warns where a GPU
# silently follows IEEE rules: exp2 of a large number is inf, 0 * inf is nan. Correct
# kernels do that on lanes they then mask (module 08's answer key on causal scores above
# the diagonal, for one), and the checks judge the results, NaN included: the warning
# would only tell a learner with a correct kernel that something is wrong.
INTERPRETER_FP_WARNINGS = dict(category=RuntimeWarning, module=r"triton\.runtime\.interpreter",
                               message=r"(overflow|underflow|invalid value|divide by zero) encountered")
if INTERPRET:
    from course import bounds as _bounds
    _bounds.install()
    warnings.filterwarnings("ignore", **INTERPRETER_FP_WARNINGS)
from course import display as _display  # noqa: E402
_display.install()  # short error messages in JupyterLab (a no-op outside IPython)

__all__ = ["DEVICE", "INTERPRET", "describe", "pick"]
