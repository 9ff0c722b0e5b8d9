"""python -m grader lab [JUPYTER LAB OPTIONS]: the instructor's JupyterLab, what
`bash run.sh lab` opens.

nbgrader's formgrader in it reads the course's nbgrader_config.py (our autograde step),
the course folder and the exchange through an instructor Jupyter config
(grader/jupyter_roles.py) in COURSE/jupyter_config, which the server reads first. The
formgrader only works on a course folder inside the server's root, so the root is the
folder that holds both the repository and the course; JupyterLab opens on modules/.
"""
import os
import pathlib
import sys

from grader import jupyter_roles, nbgrader_setup, paths


def main(argv):
    nbgrader_setup.write_config()
    config = jupyter_roles.write_instructor_config(
        paths.COURSE / "jupyter_config", paths.COURSE, nbgrader_setup.exchange_root(),
        nbgrader_setup.COURSE_ID)
    root = pathlib.Path(os.path.commonpath([paths.REPO, paths.COURSE]))
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}",
               f"--LabApp.default_url=/lab/tree/{paths.MODULES.relative_to(root)}"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    os.execve(sys.executable, command + list(argv),
              dict(os.environ, **jupyter_roles.server_environment(config)))
