"""An adversarial corpus for module 01, graded through the real CLI, and the counts that
say whether grading can be trusted with a class.

Every submission is derived from the lesson source (never hand-written notebooks) and
carries what grading must give it:
- correct-but-different solutions (warnings of every kind, stderr, editor mangling:
  duplicated cells, stripped or malformed metadata, moved cells, checkpoints, magics):
  full marks;
- a classic bug of the catalog for each test cell: loses its own test (and at most the
  cells it lists);
- cheats (input and AST transformers, a fake hidden-test module, patched torch or
  checks, a fake kernel, torch's softmax reached by getattr, reading the answer key):
  no point they did not earn;
- attacks on the gradebook, on other students' files, on the hidden tests, on the
  grader's process, on memory and output size: they cost the attacker only; the victims
  graded after them keep full marks (or lose what their own bug costs);
- broken notebooks (raises, syntax error, endless loop, os._exit, not JSON).

`python -m tests.corpus [FOLDER]` grades the corpus and prints the counts.
"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass, field

import nbformat

from grader import paths
from tests import submissions as subs

LESSON = "01_softmax"
TIMEOUT = 20  # seconds per cell: the endless loop costs this much


@dataclass
class Expect:
    kind: str                    # correct, mangled, bug, cheat, attack, broken, victim
    lost: object = ()            # tests it must lose: a set, or "all"
    may_lose: tuple = ()         # tests it may lose too (a bug's later cells)
    files: dict = field(default_factory=dict)  # extra files beside the notebook {relpath: text}


def _insert_into(nb, grade_id, anchor, line):
    """Add `line` right after `anchor` (a line that occurs once) in cell grade_id."""
    return subs.patch(nb, grade_id, anchor, anchor + "\n" + line)


def _without_metadata(nb):
    for c in nb.cells:
        c.metadata.pop("nbgrader", None)
    return nb


def _code(source):
    return nbformat.v4.new_code_cell(source)


def _copied(cell):
    """A cell as JupyterLab pastes a copy: the same source and nbgrader metadata, its own id
    (nbformat renames a repeated id when writing, with a warning)."""
    copy = nbformat.from_dict(json.loads(json.dumps(cell)))
    copy.id = f"{cell.id}-copy"
    return copy


def _index(nb, grade_id):
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def correct():
    ref = subs.solution_notebook
    out = {"ok_reference": ref(LESSON)}
    out["ok_warns_itself"] = _insert_into(ref(LESSON), "softmax_stable", "def softmax_stable(x, dim=-1):",
                                          '    import warnings; warnings.warn("my own reminder")')
    out["ok_deprecated_torch_range"] = _insert_into(ref(LESSON), "softmax_naive", "def softmax_naive(x, dim=-1):",
                                                    "    _ = torch.range(0, 2)  # deprecated: warns on every call")
    out["ok_tensor_of_tensor"] = _insert_into(ref(LESSON), "softmax_stable", "def softmax_stable(x, dim=-1):",
                                              "    x = torch.tensor(x)  # UserWarning: copy-construct")
    out["ok_numpy_runtime_warning"] = _insert_into(
        ref(LESSON), "online_softmax", "def online_softmax(x, block_size, history=None):",
        "    import numpy as np; np.log(np.array([-1.0]))  # RuntimeWarning: invalid value")
    out["ok_prints_to_stderr"] = _insert_into(ref(LESSON), "softmax_naive", "def softmax_naive(x, dim=-1):",
                                              '    import sys; print("debug", x.shape, file=sys.stderr)')
    nb = ref(LESSON)
    nb.cells.insert(_index(nb, "softmax_stable"), _code("def row_max(x, dim):\n    return x.max(dim=dim, keepdim=True).values"))
    out["ok_helper_cell"] = subs.patch(nb, "softmax_stable", "x.max(dim=dim, keepdim=True).values", "row_max(x, dim)")
    nb = ref(LESSON)
    nb.cells.insert(_index(nb, "setup"), _code("%matplotlib inline\n!echo hello"))
    out["ok_magic_lines"] = nb
    return {k: (v, Expect("correct")) for k, v in out.items()}


def mangled():
    ref = subs.solution_notebook
    out = {}
    nb = ref(LESSON)
    i = _index(nb, "test_softmax_stable")
    nb.cells.insert(i + 1, _copied(nb.cells[i]))
    out["mangled_duplicated_test_cell"] = nb
    out["mangled_stripped_metadata"] = _without_metadata(ref(LESSON))
    nb = _without_metadata(ref(LESSON))
    tests = [c for c in nb.cells if c.source.startswith("checks.")]
    nb.cells = tests + [c for c in nb.cells if not c.source.startswith("checks.")]
    out["mangled_stripped_tests_first"] = nb
    nb = ref(LESSON)
    cell = nb.cells.pop(_index(nb, "softmax_naive"))
    nb.cells.insert(_index(nb, "test_softmax_naive") + 1, cell)
    out["mangled_solution_moved_below_its_test"] = nb
    nb = ref(LESSON)
    first = _copied(nb.cells[_index(nb, "softmax_stable")])
    first.source = first.source.replace("z = x - x.max(dim=dim, keepdim=True).values", "z = x")
    nb.cells.insert(_index(nb, "softmax_stable"), first)
    out["mangled_exercise_cell_copied_then_fixed"] = nb
    nb = ref(LESSON)
    nb.cells[_index(nb, "test_softmax")].metadata["nbgrader"].update(points="lots", grade="yes")
    nb.cells[_index(nb, "softmax_kernel")].metadata["nbgrader"].pop("schema_version")
    nb.cells[_index(nb, "online_softmax")].metadata["nbgrader"]["grade_id"] = "softmax_stable"
    out["mangled_malformed_metadata"] = nb
    expect = {k: Expect("mangled") for k in out}
    # The real notebook has another name; a stale blank checkpoint sorts before it.
    out["mangled_checkpoint_beside"] = ref(LESSON)
    expect["mangled_checkpoint_beside"] = Expect("mangled", files={
        ".ipynb_checkpoints/my_softmax-checkpoint.ipynb": nbformat.writes(subs.release(LESSON))})
    return {k: (v, expect[k]) for k, v in out.items()}


def bug_sample() -> dict:
    """The catalog's first bug of each test cell: the CLI's chain is the same for every bug
    (tests/test_bugs.py runs every one in process; the whole catalog here cost CI 90 s)."""
    first = {}
    for name, bug in subs.bugs_of(LESSON).items():
        first.setdefault(bug.test_cell, (name, bug))
    return dict(first.values())


def bugs():
    return {f"bug_{name}": (subs.with_bug(LESSON, bug), Expect("bug", {bug.test_cell}, bug.also))
            for name, bug in bug_sample().items()}


def _release_with(source):
    nb = subs.release(LESSON)
    nb.cells.insert(_index(nb, "setup") + 1, _code(source))
    return nb


def cheats():
    release_cheats = {
        "cheat_input_transformer": "get_ipython().input_transformers_cleanup.append(lambda lines: [])",
        "cheat_ast_transformer": (
            "import ast\nclass Shield(ast.NodeTransformer):\n"
            "    def visit_Module(self, node):\n"
            "        return ast.Module(body=[ast.Try(body=node.body, handlers=[ast.ExceptHandler("
            "type=None, name=None, body=[ast.Pass()])], orelse=[], finalbody=[])], type_ignores=[])\n"
            "get_ipython().ast_transformers.append(Shield())"),
        "cheat_fake_hidden_module": (
            "import sys, types\nfake = types.ModuleType('grader.hidden')\n"
            "fake.load = lambda topic: types.SimpleNamespace(**{n: (lambda *a: None) for n in dir(fake)})\n"
            "sys.modules['grader.hidden'] = fake"),
        "cheat_patched_torch": (
            "torch.allclose = lambda *a, **k: True\n"
            "torch.Tensor.any = lambda self, *a, **k: torch.tensor(False)\n"
            "torch.Tensor.all = lambda self, *a, **k: torch.tensor(True)"),
        "cheat_patched_checks": (
            "import course.testing as T\nT.assert_close = lambda *a, **k: 0.0\n"
            "checks.check_softmax_stable = lambda f: None\nchecks.assert_close = lambda *a, **k: 0.0"),
        "cheat_setattr": "setattr(torch, 'allclose', lambda *a, **k: True)",
        "cheat_reads_answer_key": (
            "exec(open('" + str(paths.SOLUTIONS / "softmax.py") + "').read())\n"
            "from solutions.softmax import *"),
    }
    out = {k: (_release_with(v), Expect("cheat", "all")) for k, v in release_cheats.items()}
    # Solved notebooks whose wrapper or kernel cheats: they lose those tests.
    fake_kernel = subs.patch(
        subs.solution_notebook(LESSON), "softmax", "def softmax(x):",
        "class _Fake:\n    def __getitem__(self, grid):\n"
        "        def run(out, x, *args, **kwargs):\n"
        "            out.copy_(x.float().exp().div(x.float().exp().sum(-1, keepdim=True)))\n"
        "        return run\nsoftmax_kernel = _Fake()\n\ndef softmax(x):")
    out["cheat_fake_kernel"] = (fake_kernel, Expect("cheat", {"test_softmax_kernel", "test_softmax"}))
    hidden_call = subs.patch(subs.solution_notebook(LESSON), "softmax", "    n_rows, n_cols = x.shape\n",
                             '    return getattr(torch, "soft" + "max")(x, -1)\n    n_rows, n_cols = x.shape\n')
    out["cheat_softmax_by_getattr"] = (hidden_call, Expect("cheat", {"test_softmax"}))
    unforbid = subs.patch(subs.solution_notebook(LESSON), "softmax", "def softmax(x):",
                          "import contextlib, course.testing\n"
                          "course.testing.forbid_torch = lambda *a: contextlib.nullcontext()\n\n"
                          "def softmax(x):\n    return torch.softmax(x, -1)\n\ndef _unused(x):")
    out["cheat_disables_forbid"] = (unforbid, Expect("cheat", "all"))
    return out


def attacks(folder: pathlib.Path, course_dir: pathlib.Path):
    """Attackers sort before their victims (zz_...), so they are graded first."""
    repo = paths.REPO
    victim_nb = folder / "zz_victim_2" / f"{LESSON}.ipynb"
    sources = {
        "attack_gradebook": (
            "import sqlite3\n"
            f"con = sqlite3.connect('{course_dir / 'gradebook.db'}')\n"
            "con.execute('update grade set auto_score = 100')\ncon.commit()"),
        "attack_deletes_classmates": (
            "import shutil\n"
            f"shutil.rmtree('{course_dir / 'submitted'}')\n"
            f"shutil.rmtree('{folder / 'zz_victim_1'}')"),
        "attack_overwrites_classmate_input": f"open('{victim_nb}', 'w').write('{{}}')",
        "attack_overwrites_hidden_tests": (
            f"for p in ['{repo / 'grader' / 'lessons' / LESSON / 'hidden.py'}',"
            f" '{repo / 'course' / 'checks' / 'softmax.py'}']:\n"
            "    open(p, 'w').write('def __getattr__(name):\\n    return lambda *a, **k: None\\n')"),
        "attack_kills_the_grader": (
            "import os\nfor pid in range(1, 5000):\n    try:\n        os.kill(pid, 9) if pid != os.getpid() else None\n"
            "    except OSError:\n        pass\nos.kill(os.getppid(), 9)"),
        "attack_prints_hidden_tests": (
            f"print(open('{repo / 'grader' / 'lessons' / LESSON / 'hidden.py'}').read())"),
        "attack_huge_output": "print('x' * 50_000_000)",
        "attack_memory": "hog = bytearray(200 << 30)",
        "attack_leaves_children": (
            "import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        time.sleep(600)\n        os._exit(0)"),
    }
    out = {k: (_release_with(v), Expect("attack", "all")) for k, v in sources.items()}
    for n in (1, 2, 3):
        out[f"zz_victim_{n}"] = (subs.solution_notebook(LESSON), Expect("victim"))
    bug = subs.bugs_of(LESSON)["rescale_order"]
    out["zz_victim_with_a_bug"] = (subs.with_bug(LESSON, bug), Expect("victim", {bug.test_cell}, bug.also))
    return out


def broken():
    ref = subs.solution_notebook
    out = {
        "broken_raises": (subs.patch(ref(LESSON), "online_softmax", "def online_softmax",
                                     "raise RuntimeError('boom')\ndef online_softmax"), {"test_online_softmax"}),
        "broken_syntax_error": (subs.patch(ref(LESSON), "softmax_stable", "def softmax_stable(x, dim=-1):",
                                           "def softmax_stable(x, dim=-1:"), {"test_softmax_stable"}),
        "broken_endless_loop": (subs.patch(ref(LESSON), "online_softmax", "    x32 = x.to(torch.float32)\n",
                                           "    while True:\n        pass\n"), {"test_online_softmax"}),
        "broken_exits_in_wrapper": (subs.patch(ref(LESSON), "softmax", "    n_rows, n_cols = x.shape\n",
                                               "    import os; os._exit(1)\n"), {"test_softmax"}),
        "broken_edits_test_cell": (subs.patch(subs.with_bug(LESSON, subs.bugs_of(LESSON)["rescale_order"]),
                                              "test_online_softmax", "checks.check_online_softmax(online_softmax)",
                                              "pass"), {"test_online_softmax"}),
    }
    nb = subs.with_bug(LESSON, subs.bugs_of(LESSON)["rescale_order"])
    nb.cells.pop(_index(nb, "test_online_softmax"))
    out["broken_deletes_test_cell"] = (nb, {"test_online_softmax"})
    return {k: (v, Expect("broken", lost)) for k, (v, lost) in out.items()}


def write(folder: pathlib.Path, course_dir: pathlib.Path) -> dict:
    """Write every submission under folder/<student>/; returns {student: Expect}."""
    corpus = {**correct(), **mangled(), **bugs(), **cheats(), **broken(), **attacks(folder, course_dir)}
    expect = {}
    for student, (nb, exp) in corpus.items():
        name = "my_softmax.ipynb" if exp.files else f"{LESSON}.ipynb"
        target = folder / student / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(nbformat.writes(nb))
        for rel, text in exp.files.items():
            (folder / student / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / student / rel).write_text(text)
        expect[student] = exp
    (folder / "broken_not_a_notebook").mkdir(exist_ok=True)
    (folder / "broken_not_a_notebook" / f"{LESSON}.ipynb").write_text("{ this is not json")
    expect["broken_not_a_notebook"] = Expect("broken", "all")
    return expect


def _hashes(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _cli(*args, course_dir):
    env = dict(os.environ, COURSE_DIR=str(course_dir))
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=paths.REPO, env=env,
                          capture_output=True, text=True, timeout=3600)


def hidden_lines(lesson=LESSON):
    """Lines of the hidden tests long enough to be recognised if they leaked."""
    text = (paths.lesson_path(lesson).parent / "hidden.py").read_text()
    return [l.strip() for l in text.splitlines() if len(l.strip()) > 30 and not l.strip().startswith("#")]


def _left_behind(course_dir):
    """Processes of this grading run still alive (by the run id in their environment)."""
    from grader.remote import run_id
    marker = f"GRADER_RUN={run_id(course_dir.resolve())}".encode()
    alive = []
    for proc in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                alive.append(proc.name)
        except OSError:
            continue
    return alive


def run(work: pathlib.Path) -> dict:
    """Grade the corpus through the CLI (autograde, feedback, export); return the facts."""
    from grader import sandbox
    if sandbox.level() == "none":  # the attacks would really overwrite the repository
        raise RuntimeError("this machine cannot sandbox a worker (grader/sandbox.py): "
                           "grading a class here is not safe, and the corpus's attacks would "
                           "damage this checkout")
    folder, course_dir = work / "submissions", work / "course"
    folder.mkdir(parents=True, exist_ok=True)
    expect = write(folder, course_dir)
    victims_before = {s: _hashes(folder / s) for s, e in expect.items() if e.kind == "victim"}
    grader_before = _hashes(paths.REPO / "grader") | _hashes(paths.REPO / "course")
    graded = _cli("autograde", LESSON, str(folder), "--timeout", str(TIMEOUT), "--json",
                  str(work / "results.json"), course_dir=course_dir)
    feedback = _cli("feedback", LESSON, course_dir=course_dir)
    export = _cli("export", "--to", str(work / "grades.csv"), course_dir=course_dir)
    results = json.loads((work / "results.json").read_text()) if (work / "results.json").exists() else {}
    strays = _left_behind(course_dir)
    return dict(expect=expect, results=results, graded=graded, feedback_run=feedback, export=export,
                victims_before=victims_before, folder=folder, course_dir=course_dir,
                victims_after={s: _hashes(folder / s) for s in victims_before},
                grader_changed=grader_before != (_hashes(paths.REPO / "grader") | _hashes(paths.REPO / "course")),
                csv=(work / "grades.csv").read_text() if (work / "grades.csv").exists() else "",
                feedback={p.parent.parent.name: p.read_text()
                          for p in (course_dir / "feedback").glob(f"*/{LESSON}/*.html")},
                stray_processes=strays)


def counts(facts) -> dict:
    """The figures the issue asks for, from one graded corpus."""
    r, expect = facts["results"], facts["expect"]
    tests, students = r.get("tests", {}), r.get("students", {})
    c = dict(submissions=len(expect), false_full_marks=[], false_deductions=[], successful_cheats=[],
             not_scored=[], files_changed=[], hidden_lines_in_feedback=[], largest_feedback_bytes=0)
    for student, exp in expect.items():
        record = students.get(student)
        if record is None or f",{student}," not in facts["csv"]:
            c["not_scored"].append(student)
            continue
        lost = set(tests) if exp.lost == "all" else set(exp.lost)
        got_lost = {t for t, points in tests.items() if record["tests"][t] < points}
        if lost and not lost <= got_lost:
            (c["successful_cheats"] if exp.kind in ("cheat", "attack") else c["false_full_marks"]).append(
                (student, sorted(lost - got_lost)))
        if got_lost - lost - set(exp.may_lose):
            c["false_deductions"].append((student, sorted(got_lost - lost - set(exp.may_lose)),
                                          {t: record.get("messages", {}).get(t, "")[:200]
                                           for t in got_lost - lost}))
    if facts["grader_changed"] or r.get("grader_files_changed"):
        c["files_changed"].append("grader files")
    c["files_changed"] += [s for s in facts["victims_before"]
                           if facts["victims_before"][s] != facts["victims_after"][s]]
    secrets = hidden_lines()
    for student, html in facts["feedback"].items():
        c["largest_feedback_bytes"] = max(c["largest_feedback_bytes"], len(html))
        leaked = [l for l in secrets if l in html]
        if leaked:
            c["hidden_lines_in_feedback"].append((student, leaked[:2]))
    c["stray_processes"] = facts["stray_processes"]
    seconds = [s.get("seconds", 0) for s in students.values()]
    c["seconds_per_notebook_median"] = sorted(seconds)[len(seconds) // 2] if seconds else None
    return c


if __name__ == "__main__":
    import tempfile
    work = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="corpus-"))
    facts = run(work)
    print(facts["graded"].stdout[-6000:], facts["graded"].stderr[-3000:])
    print(json.dumps(counts(facts), indent=1, default=str))
