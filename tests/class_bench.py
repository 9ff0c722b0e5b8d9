"""Grading a class: N submissions of module 01 (correct ones, every classic bug, broken
notebooks, cycled), graded through the CLI with 1 worker and with more, timed; prints a
table. A benchmark, not a test:

    python -m tests.class_bench [--students 100] [--workers 1 2] [--timeout 20]
"""
import argparse
import itertools
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import nbformat

from grader import paths
from tests import corpus


def write_class(folder: pathlib.Path, students: int) -> dict:
    """folder/<student>/01_softmax.ipynb for `students` students; {student: kind}."""
    kinds = {**corpus.correct(), **corpus.bugs(), **corpus.broken()}
    written = {}
    for i, (name, (nb, expect)) in zip(range(students), itertools.cycle(kinds.items())):
        student = f"s{i:03d}_{name}"
        (folder / student).mkdir(parents=True)
        (folder / student / f"{corpus.LESSON}.ipynb").write_text(nbformat.writes(nb))
        written[student] = expect.kind
    return written


def grade(folder, course_dir, workers, timeout):
    """Wall seconds of `python -m grader autograde` on the class, and its output."""
    env = dict(os.environ, COURSE_DIR=str(course_dir))
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "grader", "autograde", corpus.LESSON, str(folder),
                           "--workers", str(workers), "--timeout", str(timeout)],
                          cwd=paths.REPO, env=env, capture_output=True, text=True)
    return time.time() - started, done


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--timeout", type=int, default=corpus.TIMEOUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="class-bench-") as work:
        folder = pathlib.Path(work) / "submissions"
        kinds = write_class(folder, args.students)
        counts = {k: list(kinds.values()).count(k) for k in sorted(set(kinds.values()))}
        print(f"{args.students} submissions of {corpus.LESSON}: "
              + ", ".join(f"{n} {k}" for k, n in counts.items()) + f"; {os.cpu_count()} CPUs")
        rows = []
        for workers in args.workers:
            seconds, done = grade(folder, pathlib.Path(work) / f"course{workers}", workers, args.timeout)
            scored = sum(1 for line in done.stdout.splitlines() if line.startswith("["))
            rows.append((workers, seconds, scored, done.returncode))
            print(f"  {workers} worker(s): {seconds:.0f} s, {scored} graded, exit {done.returncode}", flush=True)
    base = rows[0][1]
    print("\nworkers | wall s | s per notebook | speed-up | notebooks graded | exit")
    for workers, seconds, scored, rc in rows:
        print(f"{workers:7d} | {seconds:6.0f} | {seconds / args.students:14.2f} | {base / seconds:8.2f} "
              f"| {scored:16d} | {rc}")


if __name__ == "__main__":
    main()
