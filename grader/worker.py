"""The grading worker: runs ONE submission's notebook code, inside the sandbox.

It is copied, with wire.py, into the submission's scratch folder and started there by
grader/remote.py; it imports nothing of the grader, which is not in the sandbox. It talks
to the grader over its stdin/stdout (moved to private descriptors first, so what the
notebook prints cannot mix with the messages) and does what it is asked:

  cell      run one code cell; reply with its outputs (text capped, figures as PNG)
  describe  say what a name is: missing, a value (sent as data), a function or a kernel
  call      call a function with data arguments (optionally watched: launches counted,
            PyTorch's version forbidden, allocations guarded; a launch's grid is first sent
            to the grader, which answers go or stop)
  launch    launch a kernel on a grid; reply with the tensors it was given, after the launch

Nothing here decides a grade: the grader compares what comes back, in its own process.
"""
import ast
import base64
import builtins
import io
import linecache
import os
import sys
import traceback

import wire

CELL_TEXT_CAP = 20_000       # characters of text output kept per cell and stream
FIGURE_CAP = 1_000_000       # bytes of PNG kept per figure


class CappedText(io.TextIOBase):
    """A text stream that keeps the first `cap` characters and counts the rest."""

    def __init__(self, cap=CELL_TEXT_CAP):
        self.parts, self.kept, self.dropped, self.cap = [], 0, 0, cap

    def writable(self):
        return True

    def write(self, text):
        text = str(text)
        room = self.cap - self.kept
        self.parts.append(text[:max(room, 0)])
        self.kept += min(len(text), max(room, 0))
        self.dropped += max(len(text) - max(room, 0), 0)
        return len(text)

    def value(self):
        more = f"\n[... {self.dropped} more characters not kept]" if self.dropped else ""
        return "".join(self.parts) + more


def _learner_frames(tb):
    """The traceback's frames that are in notebook cells (not torch's or ours)."""
    return [f for f in traceback.extract_tb(tb) if f.filename.startswith("<cell ")]


def error_output(exc):
    frames = _learner_frames(exc.__traceback__)
    lines = [f"{f.filename[1:-1]}, line {f.lineno}: {f.line}" for f in frames[-3:]]
    return {"output_type": "error", "ename": type(exc).__name__, "evalue": str(exc)[:4000],
            "traceback": lines + [f"{type(exc).__name__}: {str(exc)[:4000]}"]}


def _figures():
    if "matplotlib.pyplot" not in sys.modules:
        return []
    plt = sys.modules["matplotlib.pyplot"]
    out = []
    for number in plt.get_fignums():
        buffer = io.BytesIO()
        try:
            plt.figure(number).savefig(buffer, format="png", dpi=60)
        except Exception:  # noqa: BLE001 (a half-drawn figure is simply not shown)
            continue
        if buffer.tell() <= FIGURE_CAP:
            out.append({"output_type": "display_data", "metadata": {},
                        "data": {"image/png": base64.b64encode(buffer.getvalue()).decode(),
                                 "text/plain": "<Figure>"}})
    plt.close("all")
    return out


def _without_magics(source):
    """IPython's `%magic` and `!shell` lines are not Python: comment them out."""
    return "\n".join("# " + line if line.lstrip().startswith(("%", "!")) else line
                     for line in source.split("\n"))


class Worker:
    def __init__(self, inbox, outbox):
        self.inbox, self.outbox = inbox, outbox
        self.namespace = {"__name__": "__main__", "__builtins__": builtins, "display": print}
        import course  # noqa: F401  (picks the GPU or the interpreter before any cell imports triton)

    def send(self, **message):
        try:
            wire.write(self.outbox, message)
        except wire.WireError as error:
            wire.write(self.outbox, {"op": "error", "ename": "TypeError", "check": False,
                                     "evalue": f"{error}"})

    def receive(self):
        # A tensor arrives on the device it left from, as the learner's own kernel would get
        # it: a check of a PyTorch exercise passes CPU tensors even on a GPU machine.
        return wire.read(self.inbox, resolve=self.namespace.__getitem__)

    def serve(self):
        while True:
            message = self.receive()
            op = message.get("op")
            if op == "exit":
                return
            handler = getattr(self, f"do_{op}", None)
            if handler is None:
                self.send(op="error", ename="RuntimeError", evalue=f"unknown op {op!r}", check=False)
                continue
            try:
                handler(message)
            except Exception as error:  # noqa: BLE001 (e.g. a name the notebook never defined)
                self.send(op="error", ename=type(error).__name__, evalue=str(error)[:4000], check=False)

    # ---------------------------------------------------------------------------------
    def do_cell(self, message):
        index, source = message["index"], _without_magics(message["source"])
        filename = f"<cell {index}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        out, err = CappedText(), CappedText()
        outputs, saved = [], (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = out, err
        try:
            tree = ast.parse(source, filename)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, filename, "exec"), self.namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace)
                if value is not None:
                    print(repr(value)[:CELL_TEXT_CAP])
            error = None
        except BaseException as exc:  # noqa: BLE001 (SystemExit and KeyboardInterrupt too)
            error = error_output(exc)
        finally:
            sys.stdout, sys.stderr = saved
        for name, stream in (("stdout", out), ("stderr", err)):
            if stream.value():
                outputs.append({"output_type": "stream", "name": name, "text": stream.value()})
        outputs += _figures()
        if error:
            outputs.append(error)
        self.send(op="cell_done", outputs=outputs, ok=error is None)

    def do_describe(self, message):
        name = message["name"]
        if name not in self.namespace:
            return self.send(op="result", value={"kind": "missing"})
        obj = self.namespace[name]
        if type(obj).__name__ in ("JITFunction", "InterpretedFunction") and hasattr(obj, "run"):
            return self.send(op="result", value={"kind": "kernel"})
        if callable(obj) and not isinstance(obj, type):
            return self.send(op="result", value={"kind": "function"})
        try:
            wire.encode(obj)
        except wire.WireError:
            return self.send(op="result", value={"kind": "unsendable", "type": type(obj).__name__})
        self.send(op="result", value={"kind": "value", "value": obj})

    def _quietly(self, thunk):
        """Run learner code with its prints dropped; reply with its result or its error."""
        saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = CappedText(0), CappedText(0)
        try:
            result = thunk()
        except BaseException as exc:  # noqa: BLE001
            sys.stdout, sys.stderr = saved
            from course.display import _unwrap
            from course.testing import CheckFailed
            where = _learner_frames(exc.__traceback__)
            exc = _unwrap(exc)  # a kernel's own error, not Triton's InterpreterError around it
            self.send(op="error", ename=type(exc).__name__, evalue=str(exc)[:4000],
                      check=isinstance(exc, CheckFailed),
                      where=[f"{f.filename[1:-1]}, line {f.lineno}: {f.line}" for f in where[-2:]])
            return
        sys.stdout, sys.stderr = saved
        self.send(op="result", **result)

    def do_call(self, message):
        fn = self.namespace[message["name"]]
        args, kwargs, watch = message["args"], message["kwargs"], message.get("watch")
        if not watch:
            return self._quietly(lambda: {"value": fn(*args, **kwargs)})
        from course.testing import watched_call
        kernel = self.namespace.get(watch["kernel"]) if watch.get("kernel") else None
        before_launch = self._ask_before_launch if watch.get("check_launch") else None

        def call():
            out, report = watched_call(fn, *args, kernel=kernel, forbid=watch.get("forbid", ()),
                                       before_launch=before_launch,
                                       measure_products=watch.get("measure_products", False),
                                       **kwargs)
            return {"value": out, "report": report}
        self._quietly(call)

    def _ask_before_launch(self, launch, count):
        """The grader checks a launch's grid before it runs (a wrong one would write past
        a tensor); it answers go, or stop with the message to fail with."""
        from course.testing import fail
        grid = launch.get("grid")
        grid = grid(launch) if callable(grid) else grid
        meta = {k: v for k, v in launch.items() if isinstance(v, (bool, int, float, str))}
        self.send(op="launch", grid=[int(g) for g in grid], meta=meta, count=count)
        answer = self.receive()
        if answer.get("op") != "go":
            fail(answer.get("message", "the grader stopped this launch"))

    def do_launch(self, message):
        kernel = self.namespace[message["name"]]
        args, kwargs, grid = message["args"], message["kwargs"], tuple(message["grid"])

        def launch():
            kernel[grid](*args, **kwargs)
            return {"value": args}
        self._quietly(launch)


def main():
    inbox = os.fdopen(os.dup(0), "rb", buffering=0)
    outbox = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(os.open("worker.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
    sys.stdin = open(os.devnull)
    sys.stdout = sys.stderr = open(2, "w", closefd=False)
    try:
        worker = Worker(inbox, outbox)
        worker.send(op="ready")
        worker.serve()
    except EOFError:
        pass


if __name__ == "__main__":
    main()
