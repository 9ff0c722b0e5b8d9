"""Instructor commands: python -m grader {build,autograde,feedback,export,check-times,learner-copy,bench} ...

Run `python -m grader COMMAND --help` for each command's options.
"""
import argparse
import os
import sys

from grader import paths


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build student notebooks (modules/) and nbgrader sources")
    p.add_argument("lessons", nargs="*", help="lesson names (default: all)")

    p = sub.add_parser("autograde", help="autograde one notebook or a folder of submissions")
    p.add_argument("lesson", help="e.g. 01_softmax")
    p.add_argument("path", help="a .ipynb (one student) or a folder: one sub-folder or .ipynb per student")
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default 120)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="notebooks graded at once, each in its own process (default: the CPU count)")
    p.add_argument("--regrade", action="store_true",
                   help="grade again students whose unchanged submission already has a grade")

    p = sub.add_parser("feedback", help="HTML feedback without hidden tests")
    p.add_argument("lesson")
    p.add_argument("--student", default=None, help="one student id (default: all)")

    p = sub.add_parser("export", help="export all grades to CSV")
    p.add_argument("--to", default=str(paths.COURSE / "grades.csv"))

    p = sub.add_parser("check-times", help="time each visible check of the solved notebook")
    p.add_argument("lessons", nargs="*", help="lesson names (default: all)")

    p = sub.add_parser("learner-copy", help="the course for learners: notebooks and runtime, no answers")
    p.add_argument("target", help="a new folder")

    # Listed for --help only: `bench ...` is handed to solutions.bench before parsing.
    sub.add_parser("bench", help="GPU benchmark of the reference kernels against PyTorch SDPA "
                   "(python -m grader bench --help)")

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after `bench` belongs to solutions.bench
        from solutions import bench
        bench.main(argv[1:])
        return 0
    args = parser.parse_args(argv)
    if args.command == "build":
        from grader.build import build
        build(args.lessons or None)
    elif args.command == "autograde":
        from grader.autograde import autograde, print_table
        results = autograde(args.lesson, args.path, timeout=args.timeout, json_path=args.json,
                            workers=args.workers, regrade=args.regrade)
        print_table(results)
    elif args.command == "feedback":
        from grader.autograde import feedback
        feedback(args.lesson, args.student)
    elif args.command == "export":
        from grader.autograde import export
        export(args.to)
    elif args.command == "learner-copy":
        from grader.learner_copy import build_learner_copy
        build_learner_copy(args.target)
    elif args.command == "check-times":
        from grader.timing import check_times
        for lesson in args.lessons or paths.lesson_names():
            check_times(lesson)
    return 0


if __name__ == "__main__":
    sys.exit(main())
