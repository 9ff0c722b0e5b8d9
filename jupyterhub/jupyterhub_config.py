"""JupyterHub for one class on one machine (set-up steps: jupyterhub/README.md).

    sudo COURSE_HUB_ROOT=/srv/course /path/to/repo/.venv/bin/jupyterhub \
        -f /path/to/repo/jupyterhub/jupyterhub_config.py

People log in with their Unix accounts (PAM). Members of the Unix group `instructors` get
the instructor's JupyterLab: every nbgrader extension (formgrader, create assignment), the
course folder and `python -m grader`, in the course's own environment (the one the hub
runs from). Members of `learners` get the learner's: the assignment list (fetch, submit,
fetch feedback) and validate, in the learner copy's environment, which holds no answers.
Every server runs as its user (LocalProcessSpawner).

Environment variables:
    COURSE_HUB_ROOT          the class's folder (default /srv/course): exchange/ (nbgrader's
                             exchange), course/ (the nbgrader course folder, instructors
                             only), jupyter/ (the two roles' Jupyter config), hub/ (the
                             hub's database and cookie secret)
    COURSE_HUB_LEARNER_ENV   the Python environment of learners' servers (default
                             $COURSE_HUB_ROOT/learner/.venv)
    COURSE_HUB_INSTRUCTOR_GROUP, COURSE_HUB_LEARNER_GROUP
                             the Unix groups (default instructors, learners)
    COURSE_HUB_TEST=1        the same hub without system users (tests/test_jupyterhub.py):
                             any name logs in (DummyAuthenticator), every server runs as the
                             hub's own user with its home in $COURSE_HUB_ROOT/home/NAME
                             (SimpleLocalProcessSpawner), and the instructors are the
                             comma-separated names in COURSE_HUB_INSTRUCTORS.
"""
import grp
import os
import pathlib
import sys

from grader import jupyter_roles
from grader.nbgrader_setup import COURSE_ID

c = get_config()  # noqa: F821 (defined by JupyterHub's config loader)

TEST = os.environ.get("COURSE_HUB_TEST") == "1"
ROOT = pathlib.Path(os.environ.get("COURSE_HUB_ROOT", "/srv/course")).resolve()
INSTRUCTOR_GROUP = os.environ.get("COURSE_HUB_INSTRUCTOR_GROUP", "instructors")
LEARNER_GROUP = os.environ.get("COURSE_HUB_LEARNER_GROUP", "learners")
INSTRUCTOR_ENV = pathlib.Path(sys.prefix)  # the hub runs from the course's own environment
LEARNER_ENV = pathlib.Path(os.environ.get("COURSE_HUB_LEARNER_ENV", ROOT / "learner" / ".venv"))
EXCHANGE, COURSE, HUB = ROOT / "exchange", ROOT / "course", ROOT / "hub"

# The exchange: everyone reads releases from it and drops submissions into it; the sticky
# bit keeps one user from deleting another's files (nbgrader makes its own folders below).
EXCHANGE.mkdir(parents=True, exist_ok=True)
EXCHANGE.chmod(0o1777)
# The course folder holds the answers, the submissions and the gradebook: instructors
# only, and what one of them creates stays in their group (setgid).
COURSE.mkdir(parents=True, exist_ok=True)
HUB.mkdir(parents=True, exist_ok=True)
HUB.chmod(0o700)
if not TEST:
    os.chown(COURSE, -1, grp.getgrnam(INSTRUCTOR_GROUP).gr_gid)
    COURSE.chmod(0o2770)

LEARNER_CONFIG = jupyter_roles.write_learner_config(ROOT / "jupyter" / "learner", EXCHANGE, COURSE_ID)
INSTRUCTOR_CONFIG = jupyter_roles.write_instructor_config(ROOT / "jupyter" / "instructor",
                                                          COURSE, EXCHANGE, COURSE_ID)

c.JupyterHub.db_url = f"sqlite:///{HUB / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(HUB / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(HUB / "proxy.pid")
# `npm install --prefix .venv/hub configurable-http-proxy` puts the proxy next to the
# course's environment; otherwise it is looked up on PATH (`npm install -g`).
_proxy = INSTRUCTOR_ENV / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
if _proxy.exists():
    c.ConfigurableHTTPProxy.command = [str(_proxy)]
c.Spawner.default_url = "/lab"
# A class logging in at once starts many servers on one machine: each may be slow to come up.
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120

if TEST:
    c.JupyterHub.authenticator_class = "dummy"
    c.JupyterHub.spawner_class = "simple"
    c.SimpleLocalProcessSpawner.home_dir_template = str(ROOT / "home" / "{username}")
    if os.getuid() == 0:  # every server runs as the hub's user, here root
        c.Spawner.args = ["--allow-root"]
else:
    c.JupyterHub.authenticator_class = "pam"
    c.PAMAuthenticator.allowed_groups = {LEARNER_GROUP, INSTRUCTOR_GROUP}
    c.JupyterHub.spawner_class = "localprocess"


def is_instructor(name):
    """Read at each server start: someone added to the group gets the instructor's server
    the next time theirs starts."""
    if TEST:
        return name in os.environ.get("COURSE_HUB_INSTRUCTORS", "").split(",")
    return name in grp.getgrnam(INSTRUCTOR_GROUP).gr_mem


def pre_spawn_hook(spawner):
    """Start the server of the user's role: its Python environment and its Jupyter config
    (first on JUPYTER_CONFIG_PATH: the user's own ~/.jupyter, settings and workspaces stay
    theirs)."""
    name = spawner.user.name
    instructor = is_instructor(name)
    env = INSTRUCTOR_ENV if instructor else LEARNER_ENV
    spawner.cmd = [str(env / "bin" / "jupyterhub-singleuser")]
    config = INSTRUCTOR_CONFIG if instructor else LEARNER_CONFIG
    # A new dict: the configured one is shared by every spawner.
    spawner.environment = {**spawner.environment, **jupyter_roles.server_environment(config),
                           "PATH": os.pathsep.join([str(env / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])}
    if instructor:
        # `python -m grader` and nbgrader work on the course folder and this exchange; the
        # formgrader needs the course folder inside the server's root.
        spawner.environment.update(COURSE_DIR=str(COURSE), EXCHANGE_DIR=str(EXCHANGE))
        spawner.notebook_dir = str(COURSE)
    elif TEST:
        # Every test server runs as one OS user, whose name nbgrader would take as every
        # learner's student id: each learner's is their hub name instead.
        own = ROOT / "jupyter" / "users" / name
        own.mkdir(parents=True, exist_ok=True)
        (own / "nbgrader_config.py").write_text(
            f"c = get_config()\nc.CourseDirectory.student_id = {name!r}\n")
        spawner.environment["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
            [str(own), spawner.environment["JUPYTER_CONFIG_PATH"]])


c.Spawner.pre_spawn_hook = pre_spawn_hook
