"""Shared test set-up. `import course` first: it selects Triton's interpreter on a CPU
before anything imports triton."""
import course  # noqa: F401
import pytest


@pytest.fixture
def device():
    return course.DEVICE
