"""The recorded answers of the visible checks (course/recorded.py): the committed tables
equal a fresh recording from the answer key, the checks read them (no formula needed in
the learner's copy), and hidden tests compute the same answers for unseen inputs."""
import json

import pytest
import torch

from course import recorded
from grader import answer_key, paths

pytestmark = pytest.mark.xdist_group("build")  # reads lessons, like tests/test_build.py


@pytest.mark.parametrize("lesson", answer_key.lessons())
def test_recorded_answers_equal_a_fresh_recording(lesson):
    committed = recorded.FOLDER / f"{paths.topic_of(lesson)}.json"
    assert committed.exists(), f"{committed} is missing: run `python -m grader build {lesson}`"
    assert json.loads(committed.read_text()) == answer_key.record(lesson), \
        f"{committed} is stale: run `python -m grader build {lesson}`"


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
    with pytest.raises(LookupError, match=r"no recorded answer for dram_reads\(3, 5, 7, 2\)"):
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
