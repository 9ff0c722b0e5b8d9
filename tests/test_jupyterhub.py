"""A class on JupyterHub, end to end on this machine, in a real browser.

jupyterhub/jupyterhub_config.py runs in its test mode (any name logs in, every server is a
local process of this user with its home in a temp folder), with one instructor and one
learner; headless Chromium (Playwright) plays the learner. The instructor releases
00_foundations from their server's environment; the learner fetches it in the Assignments
tab, runs the setup cell, answers Q1, saves and submits; the instructor collects,
autogrades and releases feedback; the learner fetches it and reads the score. Only the
instructor's JupyterLab offers nbgrader's instructor tools. One test, so that one hub
starts, whatever the xdist worker.

Needs Chromium and JupyterHub's proxy (configurable-http-proxy, from npm); .ci/run installs
both. Without them the test skips, except in CI (COURSE_CI=1), where it fails. Screenshots
of what each user saw, and the hub's log, are left in the test's temp folders.
"""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import types
import urllib.request

import pytest
from playwright.sync_api import expect, sync_playwright

from grader import paths
from tests import servers
from tests import submissions as subs

LESSON, EXERCISE = "00_foundations", "q01_l2_norm"
INSTRUCTOR, LEARNER = "teacher", "learner"
INSTRUCTOR_PLUGINS = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:course-list")
# Chromium in a container: no sandbox (root), no GPU, and nothing that calls out.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Where `npm install --prefix .venv/hub configurable-http-proxy` puts the proxy (the hub's
# config looks there first, then on PATH).
LOCAL_PROXY = pathlib.Path(sys.prefix) / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"


def _needed(found, what):
    if found:
        return found
    message = f"{what} not found (.ci/run installs it)"
    if os.environ.get("COURSE_CI"):
        pytest.fail(message)
    pytest.skip(message)


def _processes_naming(marker: bytes):
    """Pids of the processes whose environment names `marker` (the hub's temp folder):
    the hub, its proxy, the servers, their kernels and terminals, grading workers."""
    found = []
    for environ in pathlib.Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return [pid for pid in found if pid != os.getpid()]


def _home(root, user):
    """A user's home as the spawner will use it, with JupyterLab's news toast off (it would
    cover the page) and matplotlib's font cache built (the setup cell would wait for it)."""
    home = root / "home" / user
    settings = home / ".jupyter/lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # Only HOME and PATH, as the spawner gives: the cache goes where the kernel will look.
    subprocess.run([sys.executable, "-c", "import matplotlib.pyplot"], check=True,
                   env={"HOME": str(home), "PATH": os.environ["PATH"]})


@pytest.fixture
def hub(tmp_path_factory):
    chromium = _needed(shutil.which("chromium"), "Chromium")
    _needed(LOCAL_PROXY.exists() or shutil.which("configurable-http-proxy"), "configurable-http-proxy")
    root = tmp_path_factory.mktemp("hub")
    for user in (INSTRUCTOR, LEARNER):
        _home(root, user)
    port = servers.free_port()
    env = {**os.environ, "COURSE_HUB_TEST": "1", "COURSE_HUB_ROOT": str(root),
           "COURSE_HUB_INSTRUCTORS": INSTRUCTOR,
           # The learners' servers run from this environment: installing the learner copy
           # into a new one would take minutes (tests/test_learner_copy.py does that).
           "COURSE_HUB_LEARNER_ENV": sys.prefix}
    log = root / "hub.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(pathlib.Path(sys.prefix) / "bin" / "jupyterhub"),
             "-f", str(paths.REPO / "jupyterhub" / "jupyterhub_config.py"),
             "--ip=127.0.0.1", f"--port={port}", f"--JupyterHub.hub_port={servers.free_port()}",
             f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{servers.free_port()}"],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        servers.wait_until_answering(
            process, log, lambda: bool(urllib.request.urlopen(f"{url}/hub/api", timeout=2)), 60)
        yield types.SimpleNamespace(url=url, root=root, course=root / "course", chromium=chromium)
    finally:
        # SIGTERM: the hub stops every server (and so their kernels) and its proxy. Anything
        # still running after that is killed, and must then be gone.
        servers.stop(process)
        marker = str(root).encode()
        for pid in _processes_naming(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1)
        assert not _processes_naming(marker), "processes of the hub test outlived it"


@pytest.fixture
def browser(hub):
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=hub.chromium, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _login(browser, hub, user):
    """A fresh browser session of `user`, on their JupyterLab (the hub starts the server)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "any")  # DummyAuthenticator takes any password
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=120_000)
    page.get_by_role("menuitem", name="Nbgrader", exact=True).wait_for()
    return page


def _nbgrader_menu(page, screenshot):
    """The labels in JupyterLab's Nbgrader menu (opened, photographed, closed)."""
    page.get_by_role("menuitem", name="Nbgrader", exact=True).click()
    menu = page.locator(".lm-Menu-content")
    menu.wait_for()
    page.screenshot(path=screenshot)
    items = menu.locator(".lm-Menu-itemLabel").all_inner_texts()
    page.keyboard.press("Escape")
    return [item.strip() for item in items]


def _server_environment(hub, user):
    """The environment the hub gave `user`'s server: what a terminal in it would have."""
    for pid in set(_processes_naming(str(hub.root).encode())) & set(
            _processes_naming(f"JUPYTERHUB_USER={user}".encode())):
        proc = pathlib.Path("/proc") / str(pid)
        if b"jupyterhub-singleuser" in (proc / "cmdline").read_bytes():
            pairs = (proc / "environ").read_bytes().decode().split("\0")
            return dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    raise AssertionError(f"no server of {user} is running")


def _as_instructor(hub, *args):
    """`python -m grader ARGS` as the instructor would run it in their server's terminal."""
    env = _server_environment(hub, INSTRUCTOR)
    done = subprocess.run(["python", "-m", "grader", *args], env=env, cwd=env["COURSE_DIR"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"python -m grader {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _nbgrader_tools(page, hub, user, screenshot):
    """What of nbgrader `user`'s JupyterLab offers: the instructor plugins its page config
    leaves enabled, two entries of the Nbgrader menu, the Create Assignment sidebar, and
    whether the server itself serves the formgrader (HTTP status)."""
    disabled = set(json.loads(page.locator("#jupyter-config-data").text_content())
                   .get("disabledExtensions", []))
    menu = _nbgrader_menu(page, screenshot)
    return {"instructor plugins": sorted(set(INSTRUCTOR_PLUGINS) - disabled),
            "Formgrader in the menu": "Formgrader" in menu,
            "Assignment List in the menu": "Assignment List" in menu,
            "Create Assignment sidebar":
                "Create Assignment" in page.locator(".jp-SideBar.jp-mod-right").inner_text(),
            "formgrader route": page.request.get(f"{hub.url}/user/{user}/formgrader").status}


def test_release_fetch_submit_collect_and_feedback_in_a_browser(hub, browser, tmp_path):
    print(f"screenshots in {tmp_path}, hub log in {hub.root / 'hub.log'}")
    answer = subs.cell(subs.solution_notebook(LESSON), EXERCISE).source
    # The notebook's cells in JupyterLab are the release's, in its order.
    index = {c.metadata.get("nbgrader", {}).get("grade_id"): i
             for i, c in enumerate(subs.release(LESSON).cells)}
    instructor = _login(browser, hub, INSTRUCTOR)  # starts the instructor's server
    assert _nbgrader_tools(instructor, hub, INSTRUCTOR, tmp_path / "0-instructor-menu.png") == {
        "instructor plugins": sorted(INSTRUCTOR_PLUGINS), "Formgrader in the menu": True,
        "Assignment List in the menu": True, "Create Assignment sidebar": True, "formgrader route": 200}
    _as_instructor(hub, "release", LESSON)

    page = _login(browser, hub, LEARNER)
    # The learner's has none of them, and not only hidden: their server has no formgrader.
    assert _nbgrader_tools(page, hub, LEARNER, tmp_path / "0-learner-menu.png") == {
        "instructor plugins": [], "Formgrader in the menu": False,
        "Assignment List in the menu": True, "Create Assignment sidebar": False, "formgrader route": 404}
    page.get_by_role("menuitem", name="Nbgrader", exact=True).click()
    page.get_by_role("menuitem", name="Assignment List", exact=True).click()
    page.locator("#released_assignments_list").get_by_role("button", name="Fetch", exact=True).click()
    fetched = page.locator("#fetched_assignments_list")
    fetched.locator(".assignment-notebooks-link", has_text=LESSON).click()
    fetched.locator(".nested_list_item a", has_text=LESSON).click()
    expect(page.get_by_text("Python 3 (ipykernel) | Idle")).to_be_visible(timeout=120_000)

    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
    setup, exercise, check = (cells.nth(index[grade_id])
                              for grade_id in ("setup", EXERCISE, f"test_{EXERCISE}"))
    setup.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    expect(setup.locator(".jp-OutputArea")).to_contain_text("kernels run on: ", timeout=120_000)
    exercise.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(answer)
    page.keyboard.press("Shift+Enter")  # runs the exercise, then the check cell under it
    page.keyboard.press("Shift+Enter")
    expect(check.locator(".jp-OutputArea")).to_contain_text(f"ok  {EXERCISE}")
    page.keyboard.press("Control+s")
    saved = hub.root / "home" / LEARNER / LESSON / f"{LESSON}.ipynb"
    deadline = time.time() + 30
    while answer.splitlines()[-1] not in saved.read_text():
        assert time.time() < deadline, "the notebook was not saved"
        time.sleep(0.5)
    page.screenshot(path=tmp_path / "1-learner-notebook.png")

    page.get_by_role("tab", name="Assignments").click()
    fetched.get_by_role("button", name="Submit", exact=True).click()
    submitted = page.locator("#submitted_assignments_list")
    expect(submitted.locator(".nested_list_item")).to_have_count(1)
    page.screenshot(path=tmp_path / "2-learner-submitted.png")

    _as_instructor(hub, "collect", LESSON, "--workers", "1")
    grades = json.loads((hub.course / "grades" / f"{LESSON}.json").read_text())
    record = grades["students"][LEARNER]
    points = grades["tests"][f"test_{EXERCISE}"]
    # Only Q1 was answered, and it was answered right.
    assert record["tests"][f"test_{EXERCISE}"] == points and record["score"] == points, record
    _as_instructor(hub, "release-feedback", LESSON)

    submitted.get_by_role("button", name="Fetch Feedback", exact=True).click()
    submitted.get_by_text("view feedback").click()  # the file browser goes to the feedback
    page.locator(".jp-DirListing-item", has_text=f"{LESSON}.html").dblclick()
    feedback = page.frame_locator(".jp-HTMLViewer iframe").locator("body")
    expect(feedback).to_contain_text(
        f"{LESSON} (Score: {record['score']:.1f} / {grades['max_score']:.1f})")
    page.screenshot(path=tmp_path / "3-learner-feedback.png")
