"""Answers a visible check compares with, where computing them would give the exercise
away (a count, a byte model, a block range, the classic mistakes' values): the learner's
copy holds recorded results, never the formula.

A check asks `answer("tiling", "dram_reads", m, n, k, tile)`. By default the value is read
from `course/recorded/tiling.json`, which `python -m grader build` writes by running the
lesson's visible checks against the answer key (grader/answer_key.py): results for the
visible checks' own inputs only. The grader runs hidden tests inside `computing(resolve)`,
where the same call computes the value with the answer key, so a hidden test may ask about
inputs no learner has seen. Arguments are numbers, strings, dtypes (named by their
string) and tensors (named by their values' digest, and found by a sample of their
values where the digest differs); values are JSON (numbers, strings,
lists, dicts), the same shape both ways. A classic mistake's tensor output is recorded as
a `signature`: the entries where it differs most from the right output.
Only what the checks ask while the answer key passes them is recorded: a check asks for
every answer it may need (the classic mistakes' values too) before it compares.
"""
import collections.abc
import contextlib
import functools
import hashlib
import json
import pathlib

import torch

FOLDER = pathlib.Path(__file__).with_name("recorded")
FINGERPRINTS = "(fingerprints)"  # a table's entry: each recorded tensor's sample values
_SAMPLES = 16
# An input drawn from the same seed may differ in its last bits on another CPU or torch
# build (so its digest differs): it is found by its samples, to about a float16 rounding.
_SAMPLE_RTOL, _SAMPLE_ATOL = 2e-3, 1e-6
_computing = []  # (resolve(topic, name) -> function, missing_only, recording) of the grader, if in use


def key(args) -> str:
    """The table key of a call's arguments."""
    return json.dumps(list(args), default=_name)


def _name(value):
    if isinstance(value, torch.dtype):  # torch.float16 -> "torch.float16"
        return str(value)
    if isinstance(value, torch.Tensor):  # by its values: the same on any device and layout
        data = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        return f"{str(value.dtype)[6:]}{list(value.shape)} {hashlib.sha1(data.tobytes()).hexdigest()[:16]}"
    raise TypeError(f"a recorded answer takes numbers, strings, dtypes and tensors, not "
                    f"{type(value).__name__}")


def fingerprint(tensor) -> list:
    """A tensor's values at _SAMPLES evenly spaced entries, in float64."""
    flat = tensor.detach().to("cpu", torch.float64).contiguous().reshape(-1)
    at = torch.linspace(0, max(flat.numel() - 1, 0), min(_SAMPLES, flat.numel())).round().long()
    return flat[at].tolist()


def fingerprints(args) -> dict:
    """{table name of a tensor argument: its fingerprint}."""
    return {_name(a): fingerprint(a) for a in args if isinstance(a, torch.Tensor)}


def find(entries: dict, probe: str, probe_prints: dict, prints: dict):
    """The value of `entries` (one name's {key: value}) under the key `probe`, or under a
    key that differs only by tensors whose fingerprints agree; KeyError if none."""
    if probe in entries:
        return entries[probe]
    wanted = json.loads(probe)

    def same(stored, want):
        if isinstance(want, str) and want in probe_prints:
            return (isinstance(stored, str) and stored.split(" ")[0] == want.split(" ")[0]
                    and stored in prints and len(prints[stored]) == len(probe_prints[want])
                    and torch.allclose(torch.tensor(prints[stored], dtype=torch.float64),
                                       torch.tensor(probe_prints[want], dtype=torch.float64),
                                       rtol=_SAMPLE_RTOL, atol=_SAMPLE_ATOL, equal_nan=True))
        return stored == want
    for stored, value in entries.items():
        stored = json.loads(stored)
        if len(stored) == len(wanted) and all(same(s, w) for s, w in zip(stored, wanted)):
            return value
    raise KeyError(probe)


def as_json(value):
    """value as it reads back from JSON (tuples become lists, dict keys strings)."""
    return json.loads(json.dumps(value, default=_name))


@functools.lru_cache(maxsize=None)
def _table(topic):
    path = FOLDER / f"{topic}.json"
    return json.loads(path.read_text()) if path.exists() else {}


class _Deferred(collections.abc.Mapping):
    """A mapping made on first use."""

    def __init__(self, make):
        self._make, self._made = make, None

    def _value(self):
        if self._made is None:
            self._made = self._make()
        return self._made

    def __getitem__(self, item):
        return self._value()[item]

    def __iter__(self):
        return iter(self._value())

    def __len__(self):
        return len(self._value())


def _computing_hidden():
    """Whether the grader computes every answer (a hidden test), neither reading the tables
    first nor recording them."""
    return bool(_computing) and not _computing[-1][1] and not _computing[-1][2]


def snapshot(*values):
    """The values themselves where the answers are asked at once; while the grader computes,
    the tensors among them copied (a deferred question must see the values as they were,
    whatever the learner's code does to them afterwards)."""
    if not _computing_hidden():
        return values
    return tuple(v.clone() if isinstance(v, torch.Tensor) else v for v in values)


def deferred(make):
    """make(): a mapping a check needs only once a result is wrong (its classic mistakes'
    outputs). Made at once where the tables are read or recorded; made when first used
    while the grader computes, so a hidden test that passes never computes its mistakes."""
    if _computing_hidden():
        return _Deferred(make)
    return make()


def answer(topic: str, name: str, *args):
    """The answer key's value of `name(*args)` for module `topic`: read from the recorded
    table, or computed while the grader has the answer key in use (see `computing`)."""
    if _computing and not _computing[-1][1]:
        return as_json(_computing[-1][0](topic, name)(*args))
    table = _table(topic)
    try:
        return find(table[name], key(args), fingerprints(args), table.get(FINGERPRINTS, {}))
    except KeyError:
        if _computing:  # the grader's visible check met an input no table holds
            return as_json(_computing[-1][0](topic, name)(*args))
        raise LookupError(f"no recorded answer for {name}{key(args)}: the visible checks "
                          "know the answers for their own inputs only") from None


def matches(output, signature, atol, rtol) -> bool:
    """Whether output (a float64 tensor on the CPU) agrees with a recorded signature."""
    if list(output.shape) != signature["shape"]:
        return False
    at = torch.tensor(signature["at"], dtype=torch.long)
    values = torch.tensor(signature["values"], dtype=torch.float64)
    return torch.allclose(output.reshape(-1)[at], values, atol=atol, rtol=rtol, equal_nan=True)


@contextlib.contextmanager
def computing(resolve, *, missing_only=False, recording=False):
    """Within the block, answer() computes with resolve(topic, name) (the grader's answer
    key) instead of reading the recorded tables; with missing_only, only what no table
    holds (the grader's run of a visible check: a table made with another torch, or a
    GPU-only input, never costs a learner points). recording: every answer is asked at
    once, deferred ones too (grader/answer_key.py records them)."""
    _computing.append((resolve, missing_only, recording))
    try:
        yield
    finally:
        _computing.pop()
