"""Helper library of the attention-kernels course.

Import it before triton: it decides where kernels run (a CUDA GPU when there is one,
otherwise Triton's interpreter on the CPU) and sets TRITON_INTERPRET accordingly. In the
interpreter it also turns a kernel's out-of-bounds load or store into an error
(course/bounds.py) instead of a corrupted, then dead, process, and in JupyterLab it
shows a failed check as its message, not as a traceback (course/display.py).
"""
from course.mode import DEVICE, INTERPRET, describe, pick

if INTERPRET:
    from course import bounds as _bounds
    _bounds.install()
from course import display as _display  # noqa: E402
_display.install()  # short error messages in JupyterLab (a no-op outside IPython)

__all__ = ["DEVICE", "INTERPRET", "describe", "pick"]
