"""The sandbox a submission's code runs in: the worker process of grader/worker.py.

What it is made of (Linux tools from util-linux, present on Debian):
- `unshare --mount --pid --net --ipc --uts --fork`: its own mounts, process ids (it cannot
  see, signal or ptrace the grader), no network, no shared memory with the grader;
- a new root (`chroot`) holding only what Python needs, read-only: /usr, /lib*, /etc,
  /dev (with its own /dev/shm), /sys, the Python installation, the virtual environment and
  the `course` package; plus the submission's scratch folder (the only writable place
  besides a small /tmp). grader/, solutions/, the gradebook and every other submission are
  simply not in that root;
- `setpriv` to the unprivileged user `nobody` when the grader runs as root (in a user
  namespace, `unshare --user --map-root-user`, when it does not);
- `prlimit`: address space, processes, file size, open files, CPU seconds, no core files.

An instructor whose machine cannot make namespaces (a container without the right, macOS)
gets level "none": the worker is still a separate process with the same resource limits,
so the grade is still decided outside the learner's code, but it can read what the
grader's user can read. `python -m grader autograde` says which level it used.
"""
import functools
import os
import pathlib
import resource
import shlex
import shutil
import subprocess
import sys

NOBODY = 65534
LIMITS = {  # prlimit name: (resource, value)
    "as": (resource.RLIMIT_AS, 64 << 30 if os.environ.get("COURSE_MODE") != "interpret"
           and shutil.which("nvidia-smi") else 12 << 30),  # CUDA maps a huge address space
    "nproc": (resource.RLIMIT_NPROC, 1024),    # per user: threads of every worker count
    "fsize": (resource.RLIMIT_FSIZE, 256 << 20),
    "nofile": (resource.RLIMIT_NOFILE, 1024),
    "cpu": (resource.RLIMIT_CPU, 3600),
    "core": (resource.RLIMIT_CORE, 0),
}

_SETUP = r'''
set -e
R="$SANDBOX_ROOT"
mount --make-rprivate /
mount -t tmpfs -o mode=755,size=16m sandbox "$R"
# /tmp first: a checkout under /tmp (a CI clone) is bound below it, not hidden by it.
mkdir -p "$R/tmp"
mount -t tmpfs -o size=256m,mode=1777 tmp "$R/tmp"
for d in /usr /bin /sbin /lib /lib32 /lib64 /libx32 /etc $SANDBOX_READ; do
    [ -e "$d" ] || continue
    mkdir -p "$R$(dirname "$d")"
    if [ -L "$d" ]; then cp -P "$d" "$R$d"; continue; fi
    mkdir -p "$R$d"
    mount --rbind "$d" "$R$d"
    mount -o remount,bind,ro "$R$d"
done
mkdir -p "$R/dev" "$R/sys" "$R/proc" "$R/submission"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o size=64m,mode=1777 shm "$R/dev/shm"
mount --rbind /sys "$R/sys"
mount -t proc proc "$R/proc"
mount --bind "$SANDBOX_SCRATCH" "$R/submission"
cd /
exec chroot "$R" /bin/sh -c 'cd /submission && exec "$@"' sh "$@"
'''


def _read_only_paths():
    """What the worker must read besides the system: Python, the venv, `course`."""
    import course
    paths = {pathlib.Path(sys.base_prefix).resolve(), pathlib.Path(sys.prefix).resolve(),
             pathlib.Path(course.__file__).resolve().parent}
    return sorted(str(p) for p in paths)


def _prlimit_args():
    return ["prlimit"] + [f"--{name}={value}" for name, (_, value) in LIMITS.items()] + ["--"]


@functools.lru_cache(maxsize=None)
def level() -> str:
    """'nobody' (root: namespaces + unprivileged user), 'userns' (namespaces as a normal
    user), or 'none' (a plain process with limits), whichever works here."""
    if os.environ.get("GRADER_SANDBOX") == "none" or not all(
            shutil.which(t) for t in ("unshare", "chroot", "mount", "prlimit")):
        return "none"
    for candidate in (("nobody",) if os.geteuid() == 0 else ()) + ("userns",):
        try:
            probe = subprocess.run(_wrap(candidate, [sys.executable, "-c", "import course"],
                                         scratch=None), capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return candidate
    return "none"


def _wrap(kind, argv, scratch):
    import tempfile
    scratch = scratch or tempfile.mkdtemp(prefix="grader-probe-")
    root = tempfile.mkdtemp(prefix="grader-root-")
    env = ["env", f"SANDBOX_ROOT={root}", f"SANDBOX_SCRATCH={scratch}",
           "SANDBOX_READ=" + " ".join(shlex.quote(p) for p in _read_only_paths())]
    namespaces = ["unshare", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child"]
    if kind == "userns":
        namespaces[1:1] = ["--user", "--map-root-user"]
        drop = []
    else:
        drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                "--no-new-privs"]
    return env + namespaces + ["/bin/sh", "-c", _SETUP, "sandbox"] + drop + _prlimit_args() + argv


def command(argv, scratch: pathlib.Path):
    """The command that runs argv (paths as the worker sees them: its scratch folder is
    /submission) in the sandbox, and the working directory for level 'none'."""
    kind = level()
    if kind == "none":
        return _prlimit_args() + argv if shutil.which("prlimit") else argv
    if kind == "nobody":
        os.chown(scratch, NOBODY, NOBODY)
    return _wrap(kind, argv, str(scratch))


def scratch_path(scratch: pathlib.Path, path: str) -> str:
    """A path inside the scratch folder as the worker sees it."""
    return str(pathlib.Path("/submission") / path) if level() != "none" else str(scratch / path)
