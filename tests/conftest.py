"""Shared test set-up. `import course` first: it selects Triton's interpreter on a CPU
before anything imports triton."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")  # lesson plot cells run in-process: no windows

import course  # noqa: F401
