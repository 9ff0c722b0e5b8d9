"""How long each visible check takes for a learner: run the solved student notebook
(no hidden tests) in a fresh kernel and print one line per test cell."""
import datetime
import os
import time

from nbclient import NotebookClient

from grader.build import solution_notebook


def _seconds(cell):
    ex = cell.metadata.get("execution", {})
    start, end = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
    if not (start and end):
        return float("nan")
    parse = datetime.datetime.fromisoformat
    return (parse(end) - parse(start)).total_seconds()  # 3.11+ reads the trailing Z


def check_times(lesson: str):
    import course  # noqa: F401  (the kernel inherits TRITON_INTERPRET on a CPU)
    nb = solution_notebook(lesson)
    started = time.time()
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=True,
                   resources={"metadata": {"path": os.getcwd()}}).execute()
    rows = [(c.metadata["nbgrader"]["grade_id"], _seconds(c)) for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")]
    print(f"{lesson}: visible checks on this machine (whole notebook {time.time() - started:.1f} s)")
    for grade_id, seconds in rows:
        print(f"  {grade_id:<32} {seconds:6.2f} s")
    return rows
