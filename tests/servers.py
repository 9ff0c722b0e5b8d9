"""The servers that tests start (a Jupyter server, JupyterHub): a free port, waiting until
one answers, and stopping it."""
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_answering(process, log, answers, seconds):
    """Poll answers() (True once the server is up; OSError counts as not yet) until it is
    True; fail with the end of the server's log if the process exits or `seconds` pass."""
    deadline = time.time() + seconds
    while True:
        assert process.poll() is None, f"the server exited:\n{log.read_text()[-3000:]}"
        try:
            if answers():
                return
        except OSError:
            pass
        assert time.time() < deadline, f"the server did not answer:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def stop(process):
    """SIGTERM, then SIGKILL after 30 s."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
