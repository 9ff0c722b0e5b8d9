"""Helper library of the attention-kernels course.

Import it before triton: it decides where kernels run (a CUDA GPU when there is one,
otherwise Triton's interpreter on the CPU) and sets TRITON_INTERPRET accordingly.
"""
from course.mode import DEVICE, INTERPRET, describe, pick

__all__ = ["DEVICE", "INTERPRET", "describe", "pick"]
