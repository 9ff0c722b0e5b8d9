"""A class through nbgrader's exchange, or an LMS's zip of submissions, with our grader on
top. Each command is nbgrader's own step plus ours:

    python -m grader release LESSON            generate_assignment, release_assignment
        learners: nbgrader fetch_assignment LESSON; nbgrader submit LESSON (or the
        Assignments tab of JupyterLab)
    python -m grader collect LESSON            collect (each learner's latest submission),
                                               then our autograde
    python -m grader collect-zip LESSON ZIP    zip_collect of an LMS download, then autograde
    python -m grader release-feedback LESSON   our feedback (no hidden test), release_feedback
        learners: nbgrader fetch_feedback LESSON

Collected submissions go to collected/LESSON/<student>/LESSON/ in the course folder
(nbgrader's layout, with CourseDirectory.submitted_directory = collected/LESSON) and stay
as the learners sent them; autograde writes its repaired copy into submitted/ as always.
"""
import pathlib
import shutil
import subprocess
import sys

from grader import build, paths
from grader.autograde import autograde, feedback
from grader.nbgrader_setup import api as make_api, write_config

# FileNameCollectorPlugin.named_regexp for the file names of LMS downloads. nbgrader
# matches it against the whole path of each extracted file, hence the leading `.*/`.
LMS_PATTERNS = {
    # lastfirst_[LATE_]userid_submissionid_filename[-N].ipynb; the id is Canvas's user id
    # (the key of its grade import); -N is Canvas's suffix for a resubmitted file name.
    "canvas": r".*/[^/]+?_(?:LATE_)?(?P<student_id>\d+)_\d+_(?P<file_id>[^/]+?)(?:-\d+)?\.ipynb$",
    # Full Name_participantid_assignsubmission_file_filename.ipynb, or the same name as a
    # folder holding the file ("download submissions in folders"); the id is "Full Name_id".
    "moodle": r".*/(?P<student_id>[^/]+?_\d+)_assignsubmission_file(?:_|/)(?P<file_id>[^/]+?)\.ipynb$",
}


def collected_dir(lesson: str) -> pathlib.Path:
    return paths.COURSE / "collected" / lesson


def _check(result: dict, step: str):
    if not result["success"]:
        raise SystemExit(f"nbgrader {step} failed:\n{result.get('error') or result.get('log')}")
    return result


def release(lesson: str, force=False):
    """Generate the student version (as `python -m grader build` does) and put it into the
    exchange; with force, replace a release that is already there."""
    paths.lesson_path(lesson)
    api = make_api()
    build.release(lesson, api)
    api.config.ExchangeReleaseAssignment.force = force
    _check(api.release_assignment(lesson), "release_assignment")
    print(f"released {lesson} to {api.exchange_root}/{api.course_id}/outbound/{lesson}")


def collect(lesson: str, **grading) -> dict:
    """Collect the latest submission of every learner from the exchange and autograde them;
    `grading`: autograde's options (timeout, workers, json_path, regrade)."""
    paths.lesson_path(lesson)
    api = make_api()
    # Into collected/LESSON, not submitted/: autograde writes its repaired copies there.
    api.coursedir.submitted_directory = str(collected_dir(lesson).relative_to(paths.COURSE))
    _check(api.collect(lesson), "collect")
    if not collected_dir(lesson).is_dir():
        raise SystemExit(f"no submission of {lesson} in the exchange {api.exchange_root} yet")
    return autograde(lesson, collected_dir(lesson), **grading)


def collect_zip(lesson: str, archives, names: str, **grading) -> dict:
    """nbgrader zip_collect of an LMS download (zip files, or loose notebooks), then
    autograde. `names`: a key of LMS_PATTERNS, or a FileNameCollectorPlugin named_regexp."""
    paths.lesson_path(lesson)
    pattern = LMS_PATTERNS.get(names, names)
    write_config()  # the course's nbgrader_config.py, which nbgrader's CLI reads in its folder
    archive = paths.COURSE / "downloaded" / lesson / "archive"
    shutil.rmtree(archive, ignore_errors=True)  # the files given are the whole download
    archive.mkdir(parents=True)
    for path in archives:
        shutil.copy2(path, archive)
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", "zip_collect", lesson, "--force",
         f"--CourseDirectory.submitted_directory={collected_dir(lesson).relative_to(paths.COURSE)}",
         f"--FileNameCollectorPlugin.named_regexp={pattern}"],
        cwd=paths.COURSE, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"nbgrader zip_collect failed:\n{done.stdout}{done.stderr}")
    for line in done.stderr.splitlines():
        if "Skipped" in line:  # a file whose name the pattern does not read
            print(f"zip_collect: {line}")
    return autograde(lesson, collected_dir(lesson), **grading)


def release_feedback(lesson: str):
    """Write every student's feedback, then release it through the exchange to the students
    who submitted through it (their feedback folder holds the submission's secret, which
    names the file fetch_feedback looks for)."""
    paths.lesson_path(lesson)
    feedback(lesson)
    api = make_api()
    released, other = [], []
    for folder in sorted((paths.COURSE / "feedback").glob(f"*/{lesson}")):
        student = folder.parent.name
        if (folder / "submission_secret.txt").is_file():
            _check(api.release_feedback(lesson, student), f"release_feedback ({student})")
            released.append(student)
        else:
            other.append(student)
    print(f"feedback on {lesson} released to {len(released)} student(s): {', '.join(released)}")
    if other:
        print(f"not submitted through the exchange, feedback only in {paths.COURSE / 'feedback'}: "
              + ", ".join(other))
    return released
