"""Compile a learner's kernel for a CUDA GPU, on a machine without one.

The interpreter accepts things a real GPU compiler rejects (tl.dot with K < 16, `break`,
`if` on a block tensor: ARCHITECTURE.md, "Facts about the tools"). Compiling to PTX needs no GPU, but it cannot happen in
a process whose triton runs in interpreter mode, so the kernel's source (and the sources
of the @triton.jit helpers and constants it uses) is compiled in a fresh subprocess.
"""
import inspect
import os
import subprocess
import sys
import tempfile
import textwrap

from course.testing import fail

_PROGRAM = """
import triton, triton.language as tl
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
{sources}
triton.compile(ASTSource(fn={name}, signature={signature!r}, constexprs={constexprs!r}),
               target=GPUTarget("cuda", {capability}, 32))
"""


def _python_fn(kernel):
    return getattr(kernel, "fn", kernel)


def _dependencies(fn, seen):
    """Sources of the jit functions and plain constants that `fn` refers to, callees first."""
    parts = []
    for name in fn.__code__.co_names:
        value = fn.__globals__.get(name)
        if value is None or name in seen:
            continue
        inner = getattr(value, "fn", None)
        if inner is not None and callable(inner) and hasattr(value, "run"):
            seen.add(name)
            parts += _dependencies(inner, seen)
            parts.append(textwrap.dedent(inspect.getsource(inner)))
        elif type(value).__name__ == "constexpr":
            seen.add(name)
            parts.append(f"{name} = tl.constexpr({value.value!r})")
        elif isinstance(value, (int, float, bool)):
            seen.add(name)  # kept as a plain global, which a GPU compiler rejects too
            parts.append(f"{name} = {value!r}")
    return parts


def compile_for_gpu(kernel, signature: dict, constexprs: dict = None, capability: int = 90):
    """Compile `kernel` to PTX for a CUDA GPU of this compute capability (90 = H100).

    signature: argument name -> type, e.g. {"x_ptr": "*fp32", "n_cols": "i32",
    "BLOCK": "constexpr"}. constexprs: values of the constexpr arguments.
    Raises CheckFailed with the compiler's message if a GPU would reject the kernel.
    """
    fn = _python_fn(kernel)
    sources = _dependencies(fn, {fn.__name__}) + [textwrap.dedent(inspect.getsource(fn))]
    if any("raise NotImplementedError" in source for source in sources):
        raise NotImplementedError(f"{fn.__name__} is not written yet: fill in its exercise, then "
                                  "run this cell again to compile it for a GPU")
    program = _PROGRAM.format(sources="\n".join(sources), name=fn.__name__,
                              signature=signature, constexprs=constexprs or {},
                              capability=capability)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(program)
    try:
        result = subprocess.run([sys.executable, f.name], env=env, capture_output=True,
                                text=True, timeout=300)
    finally:
        os.unlink(f.name)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        # Triton's CompilationError quotes the offending line with a caret: show that part.
        start = next((i for i, line in enumerate(lines) if "CompilationError" in line or
                      line.startswith("at ")), max(0, len(lines) - 12))
        fail(f"{fn.__name__} runs in the interpreter but a GPU compiler rejects it:\n"
             + "\n".join(lines[start:start + 20]))
    print(f"ok  {fn.__name__} compiles for a CUDA GPU (sm_{capability})")
