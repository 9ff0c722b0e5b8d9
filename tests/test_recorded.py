"""The recorded answers of the visible checks (course/recorded.py): the committed tables
equal a fresh recording from the answer key, the checks read them (no formula needed in
the learner's copy), and hidden tests compute the same answers for unseen inputs."""
import json
import math

import pytest
import torch

from course import recorded
from course.testing import randn
from grader import answer_key, paths

pytestmark = pytest.mark.xdist_group("build")  # reads lessons, like tests/test_build.py


def _close(a, b):
    """Equal, numbers to 1e-6 (float64 sums differ with the CPU and the thread count), and a
    mistake's signature by the values of the entries both recordings picked (near-ties among
    its largest differences may pick others)."""
    if isinstance(a, dict) and {"shape", "at", "values"} <= a.keys() and isinstance(b, dict):
        values = [dict(zip(s["at"], s["values"])) for s in (a, b)]
        common = values[0].keys() & values[1].keys()
        return (a["shape"] == b["shape"] and 2 * len(common) >= len(values[0])
                and all(_close(values[0][i], values[1][i]) for i in common))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


# A check names the first classic mistake whose signature an output matches, with the
# check's tolerance: fp16's, fp32's, and tighter.
TOLERANCES = ((1e-2, 1e-2), (1e-4, 1e-4), (1e-6, 1e-6))


def _capture_signatures(lesson, monkeypatch):
    """Make every signature the lesson's answers record land in the returned list: one
    list per answer asked, of (output, signature, right output), all float64."""
    calls = []
    module = answer_key.answers_of(lesson)

    def keep(wrong, sig, right):
        wrong = torch.as_tensor(wrong).detach().to("cpu", torch.float64)
        right = torch.as_tensor(right).detach().to("cpu", torch.float64).expand_as(wrong)
        calls[-1].append((wrong, sig, right))

    def single(wrong, right, _original=answer_key.signature):
        sig = _original(wrong, right)
        keep(wrong, sig, right)
        return sig

    def several(outputs, right, _original=answer_key.signatures):
        found = _original(outputs, right)
        for key, wrong in outputs.items():
            keep(wrong, found[key], right)
        return found

    def resolve(topic, name, _original=answer_key.resolve):
        compute = _original(topic, name)

        def call(*args):
            calls.append([])
            return compute(*args)
        return call
    monkeypatch.setattr(answer_key, "resolve", resolve)
    monkeypatch.setattr(answer_key, "signatures", several)  # (telling() calls it)
    for name, replacement in (("signature", single), ("signatures", several)):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, replacement)
    return calls


def _misnamed(calls):
    """(output shape, tolerance) of each mistake whose output matches another mistake's
    signature, made against the same right output, although the two outputs differ."""
    found = []
    for kept in calls:
        for wrong, _, right in kept:
            for other, sig, other_right in kept:
                if other is wrong or other.shape != wrong.shape or not torch.equal(
                        right.nan_to_num(0.5), other_right.nan_to_num(0.5)):
                    continue
                found += [(tuple(wrong.shape), tol) for tol in TOLERANCES
                          if recorded.matches(wrong, sig, *tol)
                          and not torch.allclose(wrong, other, *reversed(tol), equal_nan=True)]
    return found


@pytest.mark.parametrize("lesson", answer_key.lessons())
def test_recorded_answers_equal_a_fresh_recording(lesson, monkeypatch):
    """...and in the fresh recording no classic mistake's output matches another's
    signature (the check would name the wrong mistake)."""
    committed = recorded.FOLDER / f"{paths.topic_of(lesson)}.json"
    assert committed.exists(), f"{committed} is missing: run `python -m grader build {lesson}`"
    calls = _capture_signatures(lesson, monkeypatch)
    committed, fresh = json.loads(committed.read_text()), answer_key.record(lesson)
    misnamed = _misnamed(calls)
    assert not misnamed, f"{len(misnamed)} mistakes would be named as another, e.g. {misnamed[:5]}"
    stale = f"course/recorded/{paths.topic_of(lesson)}.json is stale: run `python -m grader build {lesson}`"
    assert sorted(committed) == sorted(fresh), stale
    prints = fresh.get(recorded.FINGERPRINTS, {}), committed.get(recorded.FINGERPRINTS, {})
    for name, entries in fresh.items():
        if name == recorded.FINGERPRINTS:
            continue
        assert len(committed[name]) == len(entries), (stale, name)
        for args, value in entries.items():
            try:
                kept = recorded.find(committed[name], args, *prints)
            except KeyError:
                raise AssertionError(f"{stale}: {name}{args} is not recorded") from None
            assert _close(kept, value), (stale, name, args)


def test_an_input_whose_last_bits_differ_finds_its_recorded_answer():
    """Seeded inputs may differ in their last bits on another CPU or torch build."""
    x = torch.linspace(-3, 9, 23) + 0.1 * randn(23, seed=3)  # check_online_softmax's first case
    recorded_value = recorded.answer("softmax", "online_mistakes", x, 5)
    nudged = torch.nextafter(x, torch.full_like(x, math.inf))
    assert recorded.key([nudged]) != recorded.key([x])
    assert recorded.answer("softmax", "online_mistakes", nudged, 5) == recorded_value
    with pytest.raises(LookupError):
        recorded.answer("softmax", "online_mistakes", x + 0.1, 5)


@pytest.mark.parametrize("lesson", answer_key.lessons())
def test_the_answer_key_passes_the_visible_checks_from_the_tables_alone(lesson):
    """What a learner's copy does: no answer computed, every one read (the grader computes
    an answer a table lacks, so tests/test_bugs.py would not notice a missing one)."""
    answer_key.run_checks(lesson)


def test_every_recorded_table_belongs_to_a_lesson_with_answers():
    topics = {paths.topic_of(lesson) for lesson in answer_key.lessons()}
    assert {p.stem for p in recorded.FOLDER.glob("*.json")} == topics


def test_answers_come_from_the_table_and_are_computed_only_with_the_answer_key():
    assert recorded.answer("tiling", "dram_reads", 100, 70, 64, 32) == 37120
    with pytest.raises(LookupError, match=r"no recorded answer for dram_reads\[3, 5, 7, 2\]"):
        recorded.answer("tiling", "dram_reads", 3, 5, 7, 2)
    with recorded.computing(answer_key.resolve):
        assert recorded.answer("tiling", "dram_reads", 3, 5, 7, 2) == 3 * 7 * 3 + 7 * 5 * 2  # m k ceil(n/2) + k n ceil(m/2)
        # Both ways give JSON-shaped values: tuples come back as lists.
        model = recorded.answer("tiling", "dispatch_model", 2, 4, 100, 100, 64, torch.float16, 64)
    assert model == recorded.answer("tiling", "dispatch_model", 2, 4, 100, 100, 64, torch.float16, 64)
    assert model["loop"] == [8, 569600]
    # The grader's run of a visible check reads the table, and computes only what it lacks.
    with recorded.computing(lambda topic, name: None, missing_only=True):
        assert recorded.answer("tiling", "dram_reads", 100, 70, 64, 32) == 37120
    with recorded.computing(answer_key.resolve, missing_only=True):
        assert recorded.answer("tiling", "dram_reads", 3, 5, 7, 2) == 133
