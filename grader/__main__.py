"""Instructor commands: python -m grader COMMAND ... (one per step of teaching the course).

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

    def grading_options(p):
        p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default 120)")
        p.add_argument("--json", default=None, help="also write the results here")
        p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                       help="notebooks graded at once, each in its own process (default: the CPU count)")
        p.add_argument("--regrade", action="store_true",
                       help="grade again students whose unchanged submission already has a grade")

    p = sub.add_parser("autograde", help="autograde one notebook or a folder of submissions")
    p.add_argument("lesson", help="e.g. 01_softmax")
    p.add_argument("path", help="a .ipynb (one student) or a folder: one sub-folder or .ipynb per student")
    grading_options(p)

    p = sub.add_parser("feedback", help="HTML feedback without hidden tests")
    p.add_argument("lesson")
    p.add_argument("--student", default=None, help="one student id (default: all)")

    p = sub.add_parser("export", help="export all grades to CSV")
    p.add_argument("--to", default=str(paths.COURSE / "grades.csv"))

    p = sub.add_parser("release", help="put a lesson's student notebook into nbgrader's exchange")
    p.add_argument("lesson")
    p.add_argument("--force", action="store_true", help="replace a release already in the exchange")

    p = sub.add_parser("collect", help="collect each learner's latest submission from the exchange "
                       "and autograde them")
    p.add_argument("lesson")
    grading_options(p)

    p = sub.add_parser("collect-zip", help="collect an LMS download of submissions (nbgrader "
                       "zip_collect) and autograde them")
    p.add_argument("lesson")
    p.add_argument("archives", nargs="+", help="the downloaded .zip file(s) (or loose notebooks)")
    p.add_argument("--names", required=True,
                   help="how to read student and notebook from the file names: canvas, moodle, or a "
                   "regular expression with (?P<student_id>...) and (?P<file_id>...) that nbgrader "
                   "matches against each extracted file's whole path")
    grading_options(p)

    p = sub.add_parser("release-feedback", help="write feedback and release it through the exchange")
    p.add_argument("lesson")

    # Listed for --help only: `lab ...` hands everything after it to JupyterLab.
    sub.add_parser("lab", help="the instructor's JupyterLab with nbgrader's formgrader on this course "
                   "(what `bash run.sh lab` opens; options go to jupyter lab)")

    p = sub.add_parser("check-times", help="time each visible check of the solved notebook")
    p.add_argument("lessons", nargs="*", help="lesson names (default: all)")

    p = sub.add_parser("learner-copy", help="the course for learners: notebooks and runtime, no answers")
    p.add_argument("target", help="a new folder")
    p.add_argument("--class", dest="in_class", action="store_true",
                   help="for a class: nbgrader's learner tools (fetch, submit, feedback) on the "
                   "exchange, notebooks from there")
    p.add_argument("--exchange", default=None,
                   help="with --class: the exchange folder on the class machine (default: the "
                   "one these commands use, EXCHANGE_DIR or the course folder's exchange/)")

    # Listed for --help only: `bench ...` is handed to solutions.bench before parsing.
    sub.add_parser("bench", help="GPU benchmark of the reference kernels against PyTorch SDPA "
                   "(python -m grader bench --help)")

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # everything after `bench` belongs to solutions.bench
        from solutions import bench
        bench.main(argv[1:])
        return 0
    if argv[:1] == ["lab"]:  # everything after `lab` belongs to jupyter lab
        from grader import lab
        return lab.main(argv[1:])  # (it becomes the JupyterLab process)
    args = parser.parse_args(argv)
    grading = {k: getattr(args, k, None) for k in ("timeout", "workers", "regrade")}
    grading["json_path"] = getattr(args, "json", None)
    if args.command == "build":
        from grader.build import build
        build(args.lessons or None)
    elif args.command == "autograde":
        from grader.autograde import autograde, print_table
        print_table(autograde(args.lesson, args.path, **grading))
    elif args.command == "release":
        from grader.exchange import release
        release(args.lesson, force=args.force)
    elif args.command == "collect":
        from grader.autograde import print_table
        from grader.exchange import collect
        print_table(collect(args.lesson, **grading))
    elif args.command == "collect-zip":
        from grader.autograde import print_table
        from grader.exchange import collect_zip
        print_table(collect_zip(args.lesson, args.archives, args.names, **grading))
    elif args.command == "release-feedback":
        from grader.exchange import release_feedback
        release_feedback(args.lesson)
    elif args.command == "feedback":
        from grader.autograde import feedback
        feedback(args.lesson, args.student)
    elif args.command == "export":
        from grader.autograde import export
        export(args.to)
    elif args.command == "learner-copy":
        from grader.learner_copy import build_learner_copy
        from grader.nbgrader_setup import exchange_root
        if args.exchange and not args.in_class:
            parser.error("--exchange goes with --class")
        build_learner_copy(args.target, (args.exchange or exchange_root()) if args.in_class else None)
    elif args.command == "check-times":
        from grader.timing import check_times
        for lesson in args.lessons or paths.lesson_names():
            check_times(lesson)
    return 0


if __name__ == "__main__":
    sys.exit(main())
