"""Execution mode: CUDA GPU or Triton's interpreter on the CPU.

The interpreter must be chosen before `import triton` (ARCHITECTURE.md, "Facts about the tools": set afterwards, kernels
using tl.max/tl.sum fail and launches find "0 active drivers"), so this module runs
first, from `import course`.
Override with COURSE_MODE=gpu or COURSE_MODE=interpret.
"""
import os
import sys

import torch


def _choose() -> bool:
    forced = os.environ.get("COURSE_MODE", "").lower()
    if forced not in ("", "gpu", "interpret"):
        raise ValueError(f"COURSE_MODE must be 'gpu' or 'interpret', not {forced!r}")
    if forced == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("COURSE_MODE=gpu but PyTorch sees no CUDA GPU")
    interpret = forced == "interpret" or (forced == "" and not torch.cuda.is_available())
    if interpret and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            raise RuntimeError(
                "triton was imported before `import course`, so it cannot switch to the "
                "interpreter any more. Restart the kernel and run `import course` first.")
        os.environ["TRITON_INTERPRET"] = "1"
    return interpret


# Triton 3.9 warns on every import unless this is set; 1 keeps its current behaviour.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
INTERPRET: bool = _choose()
DEVICE: str = "cpu" if INTERPRET else "cuda"


def pick(cpu, gpu):
    """Choose a value by mode: small sizes for the interpreter, real ones for a GPU."""
    return cpu if INTERPRET else gpu


def describe() -> str:
    import triton
    where = ("Triton interpreter on the CPU (TRITON_INTERPRET=1): small sizes, no speed"
             if INTERPRET else f"CUDA GPU: {torch.cuda.get_device_name()}")
    return f"kernels run on: {where} | torch {torch.__version__}, triton {triton.__version__}"
