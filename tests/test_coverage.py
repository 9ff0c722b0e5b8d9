"""Visible checks try every kind of case their hidden tests try (issue: checks that match
grading). For each test cell, the tensors handed to the learner's functions and kernels are
classified by dtype, layout (contiguous, transposed, strided) and magnitude (near zero, far
above, far below); every class a hidden test uses must also appear in the visible check, so
a learner who passes the visible check has met every kind of input grading will use (the
hidden tests differ in sizes and seeds)."""
import contextlib
import io

import pytest
import torch

from course import bounds
from grader import grading
from tests import submissions as subs


def _layout(t):
    if t.is_contiguous():
        return "contiguous"
    if t.dim() >= 2 and t.stride(-1) != 1:
        return "transposed"
    return "strided"


def _magnitude(t):
    values = t.detach().double().flatten()
    values = values[torch.isfinite(values)]
    if values.numel() < 2 or bool((values == values[0]).all()):
        return None  # a constant: an output buffer, a mask of ones
    middle = float(values.median())
    return "far above zero" if middle > 100 else "far below zero" if middle < -100 else "near zero"


def _kinds(args, seen):
    for arg in args:
        if isinstance(arg, (list, tuple)):
            _kinds(arg, seen)
        elif isinstance(arg, torch.Tensor) and arg.is_floating_point() and arg.numel() > 1:
            seen.add(("dtype", str(arg.dtype).replace("torch.", "")))
            seen.add(("layout", _layout(arg)))
            magnitude = _magnitude(arg)
            if magnitude:
                seen.add(("magnitude", magnitude))


class _Recording:
    """A notebook function that notes the kinds of the tensors it accepted."""

    def __init__(self, fn, seen):
        self.fn, self.seen, self.__name__ = fn, seen, getattr(fn, "__name__", "fn")

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)  # inputs a function rightly rejects are no kind of case
        _kinds(list(args) + list(kwargs.values()), self.seen)
        return out


def _seen(lesson_obj, namespace, grade_id, which):
    check, names, keywords = grading.parse_test_cell(lesson_obj.test_cells[grade_id])
    seen = set()
    objects = []
    for n in names:
        value = lesson_obj.given_value(n) if n in lesson_obj.given else namespace[n]
        is_kernel = type(value).__name__ in ("JITFunction", "InterpretedFunction")
        objects.append(_Recording(value, seen) if callable(value) and not is_kernel else value)
    watcher = lambda kernel, named: _kinds([a for _, a in named], seen)  # noqa: E731
    bounds.WATCHERS.append(watcher)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if which == "visible":
                getattr(lesson_obj.visible, check)(*objects, **keywords)
            else:
                getattr(lesson_obj.hidden, grade_id)(*objects)
    finally:
        bounds.WATCHERS.remove(watcher)
    return seen


CASES = [(lesson, grade_id) for lesson in subs.lessons_with_bugs()
         for grade_id in grading.Lesson(lesson).test_cells]


@pytest.mark.parametrize("lesson, grade_id", CASES)
def test_visible_check_tries_every_kind_the_hidden_test_tries(lesson, grade_id):
    lesson_obj = grading.Lesson(lesson)
    namespace = subs.execute(lesson, subs.solution_notebook(lesson))
    visible = _seen(lesson_obj, namespace, grade_id, "visible")
    hidden = _seen(lesson_obj, namespace, grade_id, "hidden")
    missing = sorted(hidden - visible)
    assert not missing, f"{lesson} {grade_id}: the hidden test tries {missing}, the visible check never does"
