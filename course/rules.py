"""Rules read off a notebook's source, where running the code cannot show the problem
(PyTorch's exp in a wrapper still gives the right numbers) or the worker's counts could be
made to lie. The grader applies them to the submitted notebook (`grader/rules.py`, which
adds `tampering`); the visible checks apply the same rules to the notebook's functions as
they are defined now (`checked`), so a learner sees the problem before submitting.

- `Launches(wrapper, kernel, forbid)`: the wrapper (and the notebook functions it calls)
  launches `kernel[grid](...)`, names none of the forbidden PyTorch functions, and the
  kernel is one `@triton.jit` function defined once.
- `JitKernel(kernel)`: the kernel is one `@triton.jit` function defined once.
- `Avoids(function, names, why)`: the function (and the notebook functions it calls) uses
  none of these attribute or function names (e.g. nan_to_num where the lesson asks not to
  compute NaN at all).
- `Int64Offsets(kernel)`: the kernel converts something to tl.int64 (the lesson asks for
  int64 offsets; a CPU cannot allocate the 2**31 elements that would prove it by running).

A checks module lists its rules by test cell: RULES = {"test_softmax": [Launches(...)], ...}.
"""
import ast
import functools
import inspect
import textwrap
from dataclasses import dataclass

from course.testing import fail

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


def _line(cell, node):
    text = cell.source.split("\n")[node.lineno - 1].strip()
    return f"{cell.name}, line {node.lineno}: {text[:120]}"


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


def notebook_cells(*objects):
    """One Cell per function and @triton.jit kernel of the notebook that defined `objects`
    (the learner's functions, as defined now), or [] where they come from elsewhere (the
    answer key's modules, the grader's stand-ins): there the grader's own reading counts."""
    namespace = None
    for obj in objects:
        fn = getattr(obj, "fn", obj)  # a JIT kernel wraps its Python function
        if inspect.isfunction(fn) and fn.__module__ == "__main__":
            namespace = fn.__globals__
            break
    if namespace is None:
        return []
    cells = []
    for name, obj in list(namespace.items()):
        fn = getattr(obj, "fn", obj)
        if inspect.isfunction(fn) and fn.__module__ == "__main__":
            try:
                cells.append(Cell(name, textwrap.dedent(inspect.getsource(fn))))
            except (OSError, TypeError):  # no source to read (defined by exec without one)
                continue
    return cells


def checked(rules):
    """Decorate each visible check named check_X with the rules of its test cell test_X:
    once the check passes, the rules read the notebook's functions it was given."""
    def decorate(check):
        cell_rules = rules.get("test_" + check.__name__.removeprefix("check_"))
        if not cell_rules:
            return check

        @functools.wraps(check)
        def run(*args, **kwargs):
            result = check(*args, **kwargs)  # what the code computes first, then how
            cells = notebook_cells(*args, *kwargs.values())
            found = problems(cell_rules, cells) if cells else []
            if found:
                fail("the results are right, but the grader also reads your code, and this "
                     "would cost the test's points: " + "; ".join(found))
            return result
        return run
    return decorate
