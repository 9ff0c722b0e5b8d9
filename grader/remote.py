"""The grader's side of a grading worker (grader/worker.py): start it in the sandbox, run
the notebook's cells in it, and reach the notebook's functions through proxies.

A proxy behaves like the object it stands for, as far as checks use it: a RemoteFunction
is called with tensors and returns tensors; a RemoteKernel is launched with
`kernel[grid](...)` and writes into the grader's tensors (their whole storage comes back,
so guard margins do too). Only data crosses (grader/wire.py), so nothing the notebook
does to torch, to the checks or to Python inside the worker reaches the grader's process.

Every request runs under the current test's deadline. When the worker dies or runs out of
time, the request raises WorkerFailure and the worker is started again for the next test,
replaying the cells that ran before.
"""
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import time

import torch

from grader import sandbox, wire

_HERE = pathlib.Path(__file__).resolve().parent


class WorkerFailure(Exception):
    """The notebook's process died or ran out of time; the message says which."""


class LearnerError(RuntimeError):
    """An exception raised by the notebook's code, of a type the grader does not rebuild."""


_REBUILT = (ValueError, TypeError, NotImplementedError, RuntimeError, AssertionError, IndexError,
            KeyError, AttributeError, NameError, ZeroDivisionError, OverflowError)


def _rebuilt(ename, evalue):
    """The notebook's exception as one the checks can catch: the builtin type of that name
    (check_rejects expects ValueError or TypeError), CheckFailed, or else LearnerError."""
    from course.testing import CheckFailed
    if ename == "CheckFailed":
        return CheckFailed(evalue)
    for kind in _REBUILT:
        if kind.__name__ == ename:
            return kind(evalue)
    return LearnerError(f"{ename}: {evalue}")


class _DeadlineReader:
    """A raw pipe read under a deadline (select), so a silent worker cannot hang us."""

    def __init__(self, fd):
        self.fd, self.deadline = fd, None

    def read(self, n):
        left = None if self.deadline is None else self.deadline - time.monotonic()
        if left is not None and left <= 0 or not select.select([self.fd], [], [], left)[0]:
            raise TimeoutError
        return os.read(self.fd, min(n, 1 << 20))


def _death(code):
    if code is None:
        return "stopped"
    if code < 0:
        name = signal.Signals(-code).name
        why = {"SIGSEGV": "a kernel that reads or writes outside its tensors does this under "
                          "the interpreter: is every tl.load and tl.store masked, and does the "
                          "grid match the shapes?",
               "SIGABRT": "a kernel that writes outside its tensors does this under the "
                          "interpreter (it corrupts the heap): are the stores masked, and "
                          "does the grid match the shapes?",
               "SIGKILL": "it was killed, most likely for using too much memory",
               "SIGXCPU": "it used up its CPU time"}.get(name, "")
        return f"crashed ({name})" + (f": {why}" if why else "")
    return f"exited with code {code} (does the code call exit() or os._exit()?)"


class Worker:
    """One submission's worker process. `cells` are (index, source) of the code to run."""

    def __init__(self, scratch: pathlib.Path, timeout: float):
        self.scratch, self.timeout = pathlib.Path(scratch), timeout
        self.proc = None
        self.ran_ok = []      # cells that ran without error: replayed after a restart
        self.deadline = None  # set per test by the caller (see `budget`)

    # -- process ---------------------------------------------------------------------
    def _start(self):
        self.scratch.mkdir(parents=True, exist_ok=True)
        for name in ("worker.py", "wire.py"):
            shutil.copy(_HERE / name, self.scratch / name)
        home = sandbox.scratch_path(self.scratch, "")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
               "MPLBACKEND": "Agg", "MPLCONFIGDIR": os.path.join(home, ".matplotlib"),
               "TRITON_CACHE_DIR": os.path.join(home, ".triton"), "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"}
        for key in ("COURSE_MODE", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES",
                    "TRITON_DEFAULT_FP_FUSION", "LD_LIBRARY_PATH"):  # CUDA's libraries
            if key in os.environ:
                env[key] = os.environ[key]
        # Which grading run a process belongs to (tests look for processes left behind).
        env["GRADER_RUN"] = run_id()
        import course  # the worker imports it from where this process does (an editable
        env["PYTHONPATH"] = str(pathlib.Path(course.__file__).resolve().parent.parent)  # install or not)
        command = sandbox.command([sys.executable, "worker.py"], self.scratch)
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, cwd=self.scratch, env=env,
                                     start_new_session=True)
        self.reader = _DeadlineReader(self.proc.stdout.fileno())
        self.reader.deadline = time.monotonic() + 300
        try:  # the worker says it is ready once Python, torch and course are imported
            ready = wire.read(self.reader)
        except (TimeoutError, EOFError, wire.WireError) as error:
            self._kill()
            raise RuntimeError(f"the grading worker could not start ({type(error).__name__}); "
                               "try: python -m grader autograde ... with GRADER_SANDBOX=none to "
                               "see whether the sandbox is the cause") from None
        if ready.get("op") != "ready":
            self._kill()
            raise RuntimeError("the grading worker started wrongly")
        replay, self.ran_ok = self.ran_ok, []
        for index, source in replay:
            self.run_cell(index, source)

    def close(self):
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                wire.write(self.proc.stdin, {"op": "exit"})
                self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 (it is being stopped either way)
            pass
        self._kill()

    def _kill(self):
        if self.proc is not None:  # the whole group: children the notebook forked too
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc is not None:
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
        self.proc = None

    # -- requests --------------------------------------------------------------------
    def request(self, message, on_launch=None):
        """Send one request and return its reply (a dict). A launch check the worker asks
        for is answered with on_launch(reply) -> None (go) or a message (stop)."""
        if self.proc is None:
            self._start()
        self.reader.deadline = self.deadline
        try:
            wire.write(self.proc.stdin, message)
            while True:
                reply = wire.read(self.reader)
                if reply.get("op") != "launch":
                    return reply
                stop = on_launch(reply) if on_launch else None
                wire.write(self.proc.stdin, {"op": "stop", "message": stop} if stop else {"op": "go"})
        except TimeoutError:
            self._kill()
            raise WorkerFailure(f"it ran for more than its {self.timeout:g} s and was stopped "
                                "(an endless loop?)") from None
        except (EOFError, BrokenPipeError, wire.WireError) as error:
            self.proc.wait()
            code = self.proc.returncode
            self._kill()
            if isinstance(error, wire.WireError):
                raise WorkerFailure(f"the notebook's process sent something unreadable ({error})") from None
            raise WorkerFailure(f"the notebook's process {_death(code)}") from None

    def budget(self, seconds):
        """Start a time budget for the next requests (one test cell)."""
        self.deadline = time.monotonic() + seconds

    def run_cell(self, index, source):
        """Run one cell; returns its outputs (nbformat dicts). A cell that kills the worker
        or runs out of time gets an error output; the next cell gets a fresh worker."""
        self.budget(self.timeout)
        try:
            reply = self.request({"op": "cell", "index": index, "source": source})
        except WorkerFailure as failure:
            return [{"output_type": "error", "ename": "CellFailed", "evalue": str(failure),
                     "traceback": [f"CellFailed: this cell could not finish: {failure}"]}]
        if reply.get("op") != "cell_done" or not isinstance(reply.get("outputs"), list):
            return []
        if reply.get("ok"):
            self.ran_ok.append((index, source))
        return [o for o in reply["outputs"] if isinstance(o, dict)]

    def describe(self, name):
        return self._result(self.request({"op": "describe", "name": name}))

    def _result(self, reply):
        if reply.get("op") == "error":
            where = reply.get("where") or []
            error = _rebuilt(str(reply.get("ename")), str(reply.get("evalue")))
            error.where = [str(w) for w in where]
            raise error
        if reply.get("op") != "result":
            raise WorkerFailure("the notebook's process answered out of turn")
        return reply


def run_id(course_dir=None):
    """A short id of the course folder being graded, set in every worker's environment."""
    import hashlib
    from grader import paths
    return hashlib.sha1(str(course_dir or paths.COURSE).encode()).hexdigest()[:12]


def _copy_back(local, remote):
    """Copy the storage of `remote` (as it came back) into `local`'s storage."""
    if not isinstance(local, torch.Tensor) or not isinstance(remote, torch.Tensor):
        return
    flat_local = torch.empty(0, dtype=local.dtype, device=local.device).set_(local.untyped_storage())
    flat_remote = torch.empty(0, dtype=remote.dtype, device=remote.device).set_(remote.untyped_storage())
    if flat_local.numel() == flat_remote.numel():
        flat_local.copy_(flat_remote)


class RemoteFunction:
    """A notebook function, called across the worker boundary."""

    def __init__(self, worker, name):
        self.worker, self.remote_name, self.__name__ = worker, name, name

    def __call__(self, *args, **kwargs):
        reply = self.worker._result(self.worker.request(
            {"op": "call", "name": self.remote_name, "args": list(args), "kwargs": kwargs}))
        return reply.get("value")

    def remote_watched_call(self, args, kwargs, *, kernel, forbid, before_launch, measure_products):
        """course.testing.watched_call, done in the worker; the grid of each launch is
        checked here, in the grader, before the worker may launch."""
        def on_launch(reply):
            if before_launch is None:
                return None
            from course.testing import CheckFailed
            launch = dict(reply.get("meta") or {}, grid=tuple(reply.get("grid") or ()))
            try:
                before_launch(launch, int(reply.get("count") or 0))
            except CheckFailed as failure:
                return str(failure)
            return None
        watch = {"kernel": getattr(kernel, "remote_name", None), "forbid": list(forbid),
                 "check_launch": before_launch is not None, "measure_products": measure_products}
        reply = self.worker._result(self.worker.request(
            {"op": "call", "name": self.remote_name, "args": list(args), "kwargs": kwargs,
             "watch": watch}, on_launch=on_launch))
        report = reply.get("report") if isinstance(reply.get("report"), dict) else {}
        return reply.get("value"), {"launches": int(report.get("launches") or 0),
                                    "largest_product": int(report.get("largest_product") or 0)}


class RemoteKernel:
    """A notebook @triton.jit kernel: `kernel[grid](*args)` launches it in the worker."""

    run = None  # count_launches asks for it: this is a kernel

    def __init__(self, worker, name):
        self.worker, self.remote_name, self.__name__ = worker, name, name

    def __getitem__(self, grid):
        if callable(grid):
            raise TypeError("checks launch a notebook's kernel on a fixed grid")

        def launch(*args, **kwargs):
            reply = self.worker._result(self.worker.request(
                {"op": "launch", "name": self.remote_name, "grid": [int(g) for g in grid],
                 "args": list(args), "kwargs": kwargs}))
            for local, remote in zip(args, reply.get("value") or []):
                _copy_back(local, remote)
        return launch
