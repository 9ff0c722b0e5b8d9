"""Which of nbgrader's Jupyter extensions a learner or an instructor sees, written as a
Jupyter config folder for one role.

nbgrader 0.9.6 enables all of them for everyone who shares its Python environment
(etc/jupyter/jupyter_server_config.d/nbgrader.json). A learner must not get the
formgrader (it grades and releases), the create-assignment toolbar (it edits grade
cells) or the course list (an instructor's courses); the assignment list (fetch, submit,
fetch feedback) and validate stay.

    write_learner_config(config_dir)
    write_instructor_config(config_dir, course_dir, exchange_root, course_id)

    server_environment(config_dir)  # the variable that makes a Jupyter server read it

The folder must come first on the server's Jupyter config path, which
JUPYTER_CONFIG_PATH does; JUPYTER_CONFIG_DIR does not: in a virtual environment that the
user owns, jupyter_core reads the environment's etc/jupyter before it (measured with
jupyter_core 5). Settings go into `.d` folders, so a user's own
jupyter_server_config.json and page_config.json in the same folder are kept (and win).
"""
import json
import os
import pathlib

# Server extension modules (jupyter_server's ServerApp.jpserver_extensions).
INSTRUCTOR_SERVER_EXTENSIONS = ("nbgrader.server_extensions.formgrader",
                                "nbgrader.server_extensions.course_list")
LEARNER_SERVER_EXTENSIONS = ("nbgrader.server_extensions.assignment_list",
                             "nbgrader.server_extensions.validate_assignment")
# JupyterLab plugin ids (nbgrader/labextension; `jupyter labextension disable ID`).
# create-assignment has no server part.
INSTRUCTOR_LAB_PLUGINS = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                          "@jupyter/nbgrader:course-list")
LEARNER_LAB_PLUGINS = ("@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:validate-assignment")

_NAME = "nbgrader-role.json"


def write_learner_config(config_dir, exchange_root=None, course_id=None):
    """Instructor extensions off, learner ones on. With exchange_root (and course_id), also
    the nbgrader_config.py that fetch, submit and fetch_feedback read."""
    config_dir = _write(config_dir, instructor=False)
    if exchange_root is not None:
        _nbgrader_config(config_dir, {"Exchange.root": str(exchange_root),
                                      **({"CourseDirectory.course_id": course_id} if course_id else {})})
    return config_dir


def write_instructor_config(config_dir, course_dir, exchange_root, course_id):
    """Every nbgrader extension on, and an nbgrader_config.py that loads the course's own
    (course_dir/nbgrader_config.py, if any: our autograde step) and then names the course,
    its folder and the exchange. The formgrader needs course_dir inside the server's
    root_dir."""
    config_dir, course_dir = _write(config_dir, instructor=True), pathlib.Path(course_dir)
    own = course_dir / "nbgrader_config.py"
    if own.resolve() == (config_dir / "nbgrader_config.py").resolve():
        raise ValueError(f"{config_dir} is the course folder: its nbgrader_config.py would load itself")
    _nbgrader_config(config_dir, {"CourseDirectory.root": str(course_dir),
                                  "CourseDirectory.course_id": course_id,
                                  "Exchange.root": str(exchange_root)}, include=course_dir)
    return config_dir


def server_environment(config_dir):
    """{name: value} to add to a Jupyter server's environment so that it reads config_dir
    before any other Jupyter config folder."""
    earlier = os.environ.get("JUPYTER_CONFIG_PATH")
    return {"JUPYTER_CONFIG_PATH": os.pathsep.join([str(config_dir)] + ([earlier] if earlier else []))}


def _write(config_dir, instructor):
    config_dir = pathlib.Path(config_dir)
    enabled = {name: instructor for name in INSTRUCTOR_SERVER_EXTENSIONS}
    enabled.update({name: True for name in LEARNER_SERVER_EXTENSIONS})
    # `false` too, so that a level below this one that disabled a plugin is overridden.
    disabled = {name: not instructor for name in INSTRUCTOR_LAB_PLUGINS}
    disabled.update({name: False for name in LEARNER_LAB_PLUGINS})
    for path, data in ((config_dir / "jupyter_server_config.d" / _NAME,
                        {"ServerApp": {"jpserver_extensions": enabled}}),
                       (config_dir / "labconfig" / "page_config.d" / _NAME,
                        {"disabledExtensions": disabled})):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    return config_dir


def _nbgrader_config(config_dir, settings, include=None):
    lines = ["# Written by grader/jupyter_roles.py.", "c = get_config()"]
    if include is not None:
        lines.append(f"load_subconfig('nbgrader_config.py', path={str(include)!r})")
    lines += [f"c.{key} = {value!r}" for key, value in settings.items()]
    (config_dir / "nbgrader_config.py").write_text("\n".join(lines) + "\n")
