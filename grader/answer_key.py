"""The grader's side of course/recorded.py: what the visible checks ask the answer key.

grader/lessons/<lesson>/answers.py defines each function a check may ask for (the answer
key's own, imported from solutions/, and the values of the classic mistakes) and names in
CHECKS the visible checks that ask. `record(lesson)` runs those checks' test cells on the
answer key and keeps every answer they asked for: the table that `python -m grader build`
writes to course/recorded/<topic>.json for the learner's copy. `resolve` is what the
grader computes with while a hidden test runs (`hidden(lesson)`).
"""
import contextlib
import functools
import importlib
import io
import json
import math

import torch

from grader import paths


SIGNATURE_ENTRIES = 32


def signature(wrong, right) -> dict:
    """A classic mistake's output as course/recorded.py keeps it: its shape and its values
    at the SIGNATURE_ENTRIES entries where it differs most from the right output (all of
    them in a small output), which is what tells the mistake apart."""
    return signatures({"": wrong}, right)[""]


def _finite(x):
    """x with NaN and infinities replaced by finite stand-ins far from any value and from
    one another, so that one relative difference tells any two entries apart."""
    x = torch.where(torch.isinf(x), x.sign() * 1e299, x)
    return torch.where(torch.isnan(x), 1e300, x)


def signatures(outputs, right) -> dict:
    """{mistake: signature} of the outputs of a check's classic mistakes: each one's
    SIGNATURE_ENTRIES entries where it differs most from the right output (as
    signature picks them), plus, for every other mistake, the entry where the
    two differ most. The check names the first mistake whose signature an output matches:
    one mistake's output must not match another's where their whole outputs differ.
    Computed on the outputs' device (a GPU's hidden tests compare large outputs)."""
    right = torch.as_tensor(right).detach().to(torch.float64)
    flat = {key: torch.as_tensor(wrong).detach().to(right.device, torch.float64).reshape(-1)
            for key, wrong in outputs.items()}
    at = {}
    for key, wrong in outputs.items():
        expected = right.expand_as(torch.as_tensor(wrong)).reshape(-1)
        gap = (flat[key] - expected).abs()
        gap = torch.where(torch.isnan(flat[key]) != torch.isnan(expected), math.inf,
                          gap.nan_to_num(nan=0.0))
        at[key] = set(torch.argsort(gap, descending=True, stable=True)[:SIGNATURE_ENTRIES].tolist())
    finite = {key: _finite(x) for key, x in flat.items()}
    size = {key: x.abs() for key, x in finite.items()}
    keys = list(flat)
    for i, one in enumerate(keys):
        for other in keys[i + 1:]:
            if flat[one].shape == flat[other].shape:
                gap = (finite[one] - finite[other]).abs_().div_(1 + size[one] + size[other])
                most = int(gap.argmax())
                if gap[most] > 0:
                    at[one].add(most)
                    at[other].add(most)
    return {key: {"shape": list(torch.as_tensor(outputs[key]).shape), "at": sorted(at[key]),
                  "values": flat[key][sorted(at[key])].tolist()} for key in keys}


def telling(outputs, right) -> dict:
    """signatures() of the outputs that differ from the right one, None for those equal to
    it (a signature of the right values would name the mistake for any right output)."""
    differ = {key: wrong for key, wrong in outputs.items() if not torch.equal(wrong, right)}
    found = signatures(differ, right) if differ else {}
    return {key: found.get(key) for key in outputs}


def lessons() -> list:
    """The lessons whose checks ask for recorded answers."""
    return [name for name in paths.lesson_names() if (paths.LESSONS / name / "answers.py").exists()]


@functools.lru_cache(maxsize=None)
def answers_of(lesson: str):
    """grader/lessons/<lesson>/answers.py, loaded once (a hidden test asks it thousands of times)."""
    return paths.lesson_file(lesson, "answers")


def _answers(topic: str):
    lesson, = [name for name in lessons() if paths.topic_of(name) == topic]
    return answers_of(lesson)


def resolve(topic: str, name: str):
    """The function that computes answer(topic, name, ...)."""
    return getattr(_answers(topic), name)


class _Hidden:
    """A lesson's hidden tests, each run with the answer key in use."""

    def __init__(self, lesson):
        self._module = paths.lesson_file(lesson, "hidden")

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if not (name.startswith("test_") and callable(value)):
            return value

        def test(*args, **kwargs):
            from course import recorded
            with recorded.computing(resolve):
                return value(*args, **kwargs)
        return test


def hidden(lesson: str):
    """grader/lessons/<lesson>/hidden.py, whose test functions compute the answers their
    checks ask for (a hidden test's inputs are not the recorded, visible ones)."""
    return _Hidden(lesson)


def run_checks(lesson: str):
    """Run the test cells of the checks named in answers.CHECKS on the answer key (its
    functions under the notebook's names), their ok lines silenced."""
    from grader.build import _lesson_cells
    topic = paths.topic_of(lesson)
    checks = answers_of(lesson).CHECKS
    cells = [c.source for c in _lesson_cells(lesson).cells
             if c.metadata.get("nbgrader", {}).get("grade")
             and any(f"checks.{check}(" in c.source for check in checks)]
    if len(cells) != len(checks):
        raise ValueError(f"{lesson}: answers.CHECKS names {checks}, found {len(cells)} test cells")
    namespace = dict(vars(importlib.import_module(f"solutions.{topic}")),
                     checks=importlib.import_module(f"course.checks.{topic}"))
    with contextlib.redirect_stdout(io.StringIO()):
        for source in cells:
            exec(source, namespace)


def record(lesson: str) -> dict:
    """{name: {arguments key: value}} of every answer the lesson's CHECKS ask for when
    their test cells run on the answer key, and of the calls in answers.EXTRA (inputs a
    check uses only in the other mode, CPU or GPU)."""
    from course import recorded
    topic = paths.topic_of(lesson)
    table, prints = {}, {}

    def recording(topic_asked, name):
        if topic_asked != topic:
            raise ValueError(f"{lesson}: a check asked {topic_asked}'s answer {name}: each module "
                             "asks its own answers.py")
        compute = resolve(topic_asked, name)

        def call(*args):
            value = compute(*args)
            table.setdefault(name, {})[recorded.key(args)] = recorded.as_json(value)
            prints.update(recorded.fingerprints(args))
            return value
        return call

    with recorded.computing(recording, recording=True):
        run_checks(lesson)
        for name, args in getattr(answers_of(lesson), "EXTRA", []):
            recorded.answer(topic, name, *args)
    if prints:
        table[recorded.FINGERPRINTS] = prints
    return {name: dict(sorted(values.items())) for name, values in sorted(table.items())}


def write(lesson: str):
    """course/recorded/<topic>.json from record(lesson)."""
    from course import recorded
    recorded.FOLDER.mkdir(exist_ok=True)
    path = recorded.FOLDER / f"{paths.topic_of(lesson)}.json"
    table = record(lesson)
    # One line per answer, so that a change of the answer key reads as a diff of lines.
    names = [f" {json.dumps(name)}: {{\n" + ",\n".join(f"  {json.dumps(args)}: {json.dumps(value)}"
                                                      for args, value in values.items()) + "\n }"
             for name, values in table.items()]
    path.write_text("{\n" + ",\n".join(names) + "\n}\n")
    assert json.loads(path.read_text()) == table
    return path
