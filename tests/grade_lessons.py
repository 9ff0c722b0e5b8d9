"""Grade lessons on this machine, CPU or GPU, as a class would be graded: each lesson's
reference, its untouched release and its classic bugs, through `python -m grader
autograde` with several workers, then a table of each score against what it must be
(the reference full marks, the release 0, a bug below full marks on its own test cell).
For a GPU machine, where the test suite does not run; exits 1 if any row is wrong.

    python -m tests.grade_lessons 08_flash_backward 09_attention_patterns \
        [--bugs 2] [--workers 16] [--timeout 400] [--out DIR]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from grader import paths
from tests import submissions as subs


def write_submissions(lesson: str, folder: pathlib.Path, bugs: int) -> dict:
    """folder/<student>/<lesson>.ipynb for the reference, the untouched release and the
    first `bugs` classic bugs; returns those bugs by name."""
    subs.save(subs.solution_notebook(lesson), folder, "reference", lesson)
    subs.save(subs.release(lesson), folder, "untouched", lesson)
    chosen = dict(list(subs.bugs_of(lesson).items())[:bugs])
    for name, bug in chosen.items():
        subs.save(subs.with_bug(lesson, bug), folder, f"bug_{name}", lesson)
    return chosen


def verdicts(results: dict, bugs: dict) -> dict:
    """{student: (score, expected, right)} for one lesson's results."""
    full = results["max_score"]
    rows = {}
    for student, record in results["students"].items():
        score = record["score"]
        if student == "reference":
            rows[student] = (score, f"{full:g}", score == full)
        elif student == "untouched":
            rows[student] = (score, "0", score == 0)
        else:
            cell = bugs[student.removeprefix("bug_")].test_cell
            lost = record["tests"][cell] < results["tests"][cell]
            rows[student] = (score, f"< {full:g}, {cell} lost", lost and score < full)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="+")
    parser.add_argument("--bugs", type=int, default=2, help="classic bugs per lesson")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--timeout", type=int, default=400, help="seconds per cell")
    parser.add_argument("--out", type=pathlib.Path, help="copy each lesson's grades JSON here")
    args = parser.parse_args(argv)
    table, wrong = [], 0
    with tempfile.TemporaryDirectory(prefix="grade-lessons-") as work:
        for lesson in args.lessons:
            folder = pathlib.Path(work) / lesson
            bugs = write_submissions(lesson, folder, args.bugs)
            grades = pathlib.Path(work) / f"{lesson}.json"
            env = dict(os.environ, COURSE_DIR=str(pathlib.Path(work) / "course"))
            started = time.time()
            done = subprocess.run([sys.executable, "-m", "grader", "autograde", lesson, str(folder),
                                   "--workers", str(args.workers), "--timeout", str(args.timeout),
                                   "--json", str(grades)], cwd=paths.REPO, env=env)
            wall = time.time() - started
            if not grades.exists():
                print(f"{lesson}: autograde wrote no grades (exit {done.returncode})")
                wrong += 1
                continue
            results = json.loads(grades.read_text())
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / grades.name).write_text(grades.read_text())
            for student, (score, expected, right) in verdicts(results, bugs).items():
                record = results["students"][student]
                table.append((lesson, student, f"{score:g}/{results['max_score']:g}", expected,
                              "ok" if right else "WRONG", record.get("seconds", 0.0)))
                wrong += not right
                if not right:
                    for test, message in record["messages"].items():
                        print(f"  {lesson} {student} {test}: {message[:400]}")
            table.append((lesson, "(all, wall)", "", "", "", wall))
    print("\nlesson | student | score | must be | verdict | seconds")
    for row in table:
        print(" | ".join(str(x) for x in row[:-1]) + f" | {row[-1]:.0f}")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
