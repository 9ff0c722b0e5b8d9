"""Rules checked on the submitted source, where a dynamic check needs the worker's
cooperation: the worker counts kernel launches and forbids PyTorch's own version of the
work, and a notebook that patches torch, triton, the checks or Python itself could make
it lie. So the grader also reads the code: each test cell's rules (`course/rules.py`:
Launches, JitKernel, Avoids, Int64Offsets; the visible checks apply the same ones), and

- `tampering(cells)`: the notebook changes torch, triton, the course's checks or Python's
  machinery (attribute assignment, setattr, sys.modules, import hooks, eval/exec). Such a
  notebook fails every test, with the line named.
"""
import ast

from course.rules import _line, _parse

# Names a notebook's code may not assign into (modules the checks and PyTorch rely on).
PROTECTED = {"torch", "triton", "tl", "F", "nn", "np", "numpy", "course", "checks", "plots",
             "sys", "builtins", "math", "linecache", "inspect", "importlib", "io", "os"}
ALLOWED_ROOTS = {("torch", "backends")}  # e.g. torch.backends.cudnn.benchmark = True
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "setattr", "delattr", "globals",
                   "get_ipython", "breakpoint", "vars"}
FORBIDDEN_MODULES = {"ctypes", "importlib", "gc", "inspect", "builtins", "subprocess",
                     "multiprocessing", "signal", "threading", "socket", "pickle", "marshal"}
# sys may be imported (to print to stderr, say); these of its parts change Python itself.
SYS_MACHINERY = {"modules", "meta_path", "path_hooks", "path_importer_cache", "settrace",
                 "setprofile", "addaudithook", "_getframe", "displayhook", "excepthook"}


def _root(node):
    """The chain of names of an attribute target: torch.nn.functional.softmax -> [torch, nn, ...]."""
    chain = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        chain.append(node.id)
    elif isinstance(node, ast.Call):
        chain.append("<call>")
    return list(reversed(chain))


def tampering(cells, kernels=()):
    """[description] of every place where the notebook patches what the checks rely on.
    kernels: names of the notebook's kernels (their attributes may not be assigned either)."""
    found = []
    protected = PROTECTED | set(kernels)
    parsed = list(_parse(cells))
    # `import torch as T` makes T torch: follow the aliases of imported modules.
    alias = {a.asname: a.name.split(".")[0] for _, tree in parsed for node in ast.walk(tree)
             if isinstance(node, ast.Import) for a in node.names if a.asname}
    for cell, tree in parsed:
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                    chain = _root(t)
                    chain[:1] = [alias.get(c, c) for c in chain[:1]]
                    if isinstance(t, (ast.Attribute, ast.Subscript)) and chain and \
                            chain[0] in protected and tuple(chain[:2]) not in ALLOWED_ROOTS:
                        found.append(f"it changes {'.'.join(chain)} ({_line(cell, node)})")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in FORBIDDEN_CALLS:
                found.append(f"it calls {node.func.id}() ({_line(cell, node)})")
            if isinstance(node, ast.Attribute) and node.attr in ("__dict__", "__globals__", "__code__",
                                                                  "__builtins__", "__class__",
                                                                  "__subclasses__", "__getattribute__"):
                found.append(f"it reaches into {node.attr} ({_line(cell, node)})")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and alias.get(node.value.id, node.value.id) == "sys" and node.attr in SYS_MACHINERY:
                found.append(f"it uses sys.{node.attr} ({_line(cell, node)})")
            if isinstance(node, ast.Name) and node.id == "__builtins__":
                found.append(f"it reaches into __builtins__ ({_line(cell, node)})")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for name in names:
                    if name.split(".")[0] in FORBIDDEN_MODULES:
                        found.append(f"it imports {name} ({_line(cell, node)})")
                if isinstance(node, ast.ImportFrom) and node.module == "sys" and \
                        any(a.name in SYS_MACHINERY or a.name == "*" for a in node.names):
                    found.append(f"it imports Python's machinery from sys ({_line(cell, node)})")
    return found
