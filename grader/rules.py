"""Rules checked on the submitted source, where a dynamic check needs the worker's
cooperation: the worker counts kernel launches and forbids PyTorch's own version of the
work, and a notebook that patches torch, triton, the checks or Python itself could make
it lie. So the grader also reads the code:

- `tampering(cells)`: the notebook changes torch, triton, the course's checks or Python's
  machinery (attribute assignment, setattr, sys.modules, import hooks, eval/exec). Such a
  notebook fails every test, with the line named.
- `Launches(wrapper, kernel, forbid)`: the wrapper (and the notebook functions it calls)
  launches `kernel[grid](...)`, names none of the forbidden PyTorch functions, and the
  kernel is one `@triton.jit` function defined once.
- `JitKernel(kernel)`: the kernel is one `@triton.jit` function defined once.
- `Avoids(function, names, why)`: the function (and the notebook functions it calls) uses
  none of these attribute or function names (e.g. nan_to_num where the lesson asks not to
  compute NaN at all).
- `Int64Offsets(kernel)`: the kernel converts something to tl.int64 (the lesson asks for
  int64 offsets; a CPU cannot allocate the 2**31 elements that would prove it by running).

A hidden test file lists its rules: RULES = {"test_softmax": [Launches(...)], ...}.
"""
import ast
from dataclasses import dataclass

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
# What each forbid group names (course.testing._FORBIDDEN is the dynamic side).
FORBIDDEN_NAMES = {
    "softmax": {"softmax", "log_softmax", "softmin", "gumbel_softmax", "scaled_dot_product_attention"},
    "matmul": {"matmul", "mm", "bmm", "einsum", "tensordot", "addmm", "addbmm", "baddbmm", "addmv",
               "mv", "dot", "vdot", "inner", "chain_matmul", "linear", "bilinear", "multi_dot",
               "vecdot", "__matmul__", "__rmatmul__"},
    "attention": {"scaled_dot_product_attention"},
}


@dataclass
class Cell:
    name: str      # how messages name the cell (its grade_id, or "cell N")
    source: str


def _parse(cells):
    for cell in cells:
        try:
            yield cell, ast.parse(cell.source)
        except SyntaxError:
            continue


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


def _line(cell, node):
    text = cell.source.split("\n")[node.lineno - 1].strip()
    return f"{cell.name}, line {node.lineno}: {text[:120]}"


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


def _definitions(cells):
    """{name: [(cell, node)]} for every def and every assignment to a plain name."""
    defs = {}
    for cell, tree in _parse(cells):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defs.setdefault(node.name, []).append((cell, node))
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                        if isinstance(t, ast.Name):
                            defs.setdefault(t.id, []).append((cell, node))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    defs.setdefault((alias.asname or alias.name).split(".")[0], []).append((cell, node))
    return defs


def _is_jit(node):
    for d in getattr(node, "decorator_list", []):
        d = d.func if isinstance(d, ast.Call) else d
        if (isinstance(d, ast.Attribute) and d.attr == "jit") or (isinstance(d, ast.Name) and d.id == "jit"):
            return True
    return False


def _kernel_problem(defs, kernel):
    places = defs.get(kernel, [])
    functions = [(c, n) for c, n in places if isinstance(n, ast.FunctionDef)]
    if len(places) != 1 or not functions or not _is_jit(functions[0][1]):
        where = "; ".join(_line(c, n) for c, n in places) or "nowhere"
        return (f"{kernel} must be defined once, as a @triton.jit function, and never assigned "
                f"anything else (it is defined at: {where})")
    return None


@dataclass
class JitKernel:
    kernel: str

    def problems(self, defs):
        problem = _kernel_problem(defs, self.kernel)
        return [problem] if problem else []


def _reachable(defs, start):
    """[(name, cell, FunctionDef)] of `start` and every notebook function it names, not
    following @triton.jit kernels."""
    functions = {name: [(c, n) for c, n in places if isinstance(n, ast.FunctionDef)]
                 for name, places in defs.items()}
    seen, todo, found = set(), [start], []
    while todo:
        name = todo.pop()
        if name in seen or not functions.get(name) or _is_jit(functions[name][-1][1]):
            continue
        seen.add(name)
        cell, node = functions[name][-1]
        found.append((name, cell, node))
        todo += [sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)
                 and functions.get(sub.id) and sub.id != name]
    return found


def _uses(node, names, matmul_operator=False, defined=()):
    """Nodes in `node` that name one of `names` (attribute or bare name), or use @."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in names:
            yield sub, sub.attr
        elif isinstance(sub, ast.Name) and sub.id in names and sub.id not in defined:
            yield sub, sub.id
        elif matmul_operator and isinstance(sub, (ast.BinOp, ast.AugAssign)) \
                and isinstance(sub.op, ast.MatMult):
            yield sub, "@"


@dataclass
class Avoids:
    function: str
    names: tuple
    why: str

    def problems(self, defs):
        return [f"{name} uses {what} ({_line(cell, sub)}): {self.why}"
                for name, cell, node in _reachable(defs, self.function)
                for sub, what in _uses(node, set(self.names))]


@dataclass
class Int64Offsets:
    kernel: str

    def problems(self, defs):
        places = [n for _, n in defs.get(self.kernel, []) if isinstance(n, ast.FunctionDef)]
        if places and not any(isinstance(sub, ast.Attribute) and sub.attr == "int64"
                              for sub in ast.walk(places[-1])):
            return [f"{self.kernel} computes its offsets in int32: convert the program id (or "
                    "the row index) to tl.int64 before multiplying by a stride, as the lesson "
                    "says, or offsets past 2**31 elements wrap around on a GPU"]
        return []


@dataclass
class Launches:
    wrapper: str
    kernel: str
    forbid: str = ""

    def problems(self, defs):
        found = []
        problem = _kernel_problem(defs, self.kernel)
        if problem:
            found.append(problem)
        reachable = _reachable(defs, self.wrapper)
        if not reachable:
            return found + [f"{self.wrapper} is not defined as a function"]
        launches = False
        for name, cell, node in reachable:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Subscript) \
                        and isinstance(sub.func.value, ast.Name) and sub.func.value.id == self.kernel:
                    launches = True
            found += [f"{name} uses PyTorch's {what} ({_line(cell, sub)}): this exercise must "
                      "compute with your Triton kernel"
                      for sub, what in _uses(node, FORBIDDEN_NAMES.get(self.forbid, set()),
                                             self.forbid == "matmul", defs)]
        if not launches:
            found.append(f"{self.wrapper} never launches {self.kernel}[grid](...), itself or "
                         "through the notebook functions it calls")
        return found


def problems(rules, cells):
    """Every problem the rules find in the notebook's code cells."""
    defs = _definitions(cells)
    return [p for rule in rules for p in rule.problems(defs)]
