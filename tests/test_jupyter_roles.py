"""Who sees which of nbgrader's tools in JupyterLab (grader/jupyter_roles.py), on real
servers: the instructor's `python -m grader lab` (what `bash run.sh lab` runs) answers from
the formgrader with our released assignment and no warning; a class copy's own `bash run.sh`
(python -m grader learner-copy --class) disables the instructor plugins, has no formgrader,
and fetches and submits through the assignment list."""
import contextlib
import http.client
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.parse

import pytest

from grader import jupyter_roles, paths
from grader.learner_copy import build_learner_copy
from grader.nbgrader_setup import COURSE_ID
from tests import servers
from tests.test_exchange import _instructor

pytestmark = pytest.mark.xdist_group("jupyter_roles")  # one module fixture, one worker

LESSON = "00_foundations"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course folder with LESSON released into its exchange."""
    course = tmp_path_factory.mktemp("roles") / "nbgrader_course"
    _instructor(course, "release", LESSON)
    return course


@contextlib.contextmanager
def _server(command, cwd, work, env=None):
    """A Jupyter server started by `command`, with config, data and runtime folders of its
    own (nothing from this machine's user); yields request(method, path) -> (status,
    headers, body)."""
    port, token = servers.free_port(), secrets.token_hex(16)
    env = dict(os.environ, **(env or {}), HOME=str(work / "home"),
               JUPYTER_CONFIG_DIR=str(work / "config"), JUPYTER_DATA_DIR=str(work / "data"),
               JUPYTER_RUNTIME_DIR=str(work / "runtime"))
    env.pop("JUPYTER_CONFIG_PATH", None)
    log = work / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(command + ["--no-browser", f"--port={port}",
                                            f"--IdentityProvider.token={token}"],
                                  cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)

    def request(method, path):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request(method, path, headers={"Authorization": f"token {token}"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()

    try:
        servers.wait_until_answering(server, log, lambda: request("GET", "/api/status")[0] == 200, 120)
        yield request
    finally:
        servers.stop(server)


def _page_config(request):
    status, _, html = request("GET", "/lab")
    assert status == 200
    found = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(found[1])


def test_the_instructors_lab_has_a_working_formgrader_on_the_course(course, tmp_path):
    with _server([sys.executable, "-m", "grader", "lab"], tmp_path, tmp_path,
                 {"COURSE_DIR": str(course)}) as request:
        status, _, body = request("GET", "/formgrader/api/assignments")
        assert status == 200, body[-2000:]
        assert [(a["name"], a["status"]) for a in json.loads(body)] == [(LESSON, "released")]
        status, _, page = request("GET", "/formgrader/manage_assignments")
        assert status == 200, page[-2000:]
        # No warning (exchange missing, no course id) and our autograde step in its config.
        assert 'class="alert' not in page and "GradeInWorker" in page
        status, headers, _ = request("GET", "/")
        root = os.path.commonpath([paths.REPO, course])  # holds both: the formgrader needs it
        assert status == 302, status
        assert urllib.parse.urlsplit(headers["Location"]).path.endswith(
            f"/lab/tree/{paths.MODULES.relative_to(root)}")
        page_config = _page_config(request)
    assert not [p for p in page_config["disabledExtensions"] if p.startswith("@jupyter/nbgrader")]


def test_a_class_copy_shows_learner_tools_only(course, tmp_path):
    copy = build_learner_copy(tmp_path / "copy", exchange_root=course / "exchange")
    listing = ["README.md", "course", "jupyter", "modules", "pyproject.toml", "run.sh"]
    assert sorted(p.name for p in copy.iterdir()) == listing and not any((copy / "modules").iterdir())
    assert '"nbgrader==' in (copy / "pyproject.toml").read_text()
    (copy / ".venv").symlink_to(sys.prefix)  # set up already: run.sh goes straight to JupyterLab
    inbound = course / "exchange" / COURSE_ID / "inbound"
    before = set(inbound.iterdir())
    with _server(["bash", "run.sh"], copy, tmp_path) as request:
        page_config = _page_config(request)
        for path in ("/formgrader", "/formgrader/api/assignments", "/formgraders"):
            assert request("GET", path)[0] == 404, path
        status, _, body = request("GET", f"/assignments?course_id={COURSE_ID}")
        listed = json.loads(body)
        assert status == 200 and listed["success"], body
        assert [(a["assignment_id"], a["status"]) for a in listed["value"]] == [(LESSON, "released")]
        query = f"assignment_id={LESSON}&course_id={COURSE_ID}"
        for action in ("fetch", "submit"):  # the Assignments tab's two buttons
            status, _, body = request("POST", f"/assignments/{action}?{query}")
            assert status == 200 and json.loads(body)["success"], body
    disabled = set(page_config["disabledExtensions"])
    assert set(jupyter_roles.INSTRUCTOR_LAB_PLUGINS) <= disabled
    assert not set(jupyter_roles.LEARNER_LAB_PLUGINS) & disabled
    # The plugins are there to disable: it is the learner config that hides them.
    assert "@jupyter/nbgrader" in [e["name"] for e in page_config["federated_extensions"]]
    assert (copy / "modules" / LESSON / f"{LESSON}.ipynb").is_file()
    assert len(set(inbound.iterdir()) - before) == 1
