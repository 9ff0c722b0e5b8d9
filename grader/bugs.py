"""Classic-bug catalogs, one file per module: each bug must lose points where it belongs."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    exercise: str   # grade_id of the solution cell the bug is planted in
    find: str       # text of the reference solution, found exactly once in that cell
    replace: str    # the buggy text
    says: str       # a word the learner's feedback must contain
    also: tuple = ()  # later test cells that may fail too (they use this exercise's code)

    @property
    def test_cell(self):
        return f"test_{self.exercise}"  # the test cell that must lose points
