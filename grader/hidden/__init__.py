"""Hidden tests, one file per module, run only at autograde.

Test cells call `load("softmax").test_x(fn)`. `load` executes the file afresh, with
fresh copies of the `course` modules it imports, so a submission that replaced a check
function or patched course.testing cannot make a hidden test pass.
"""
import importlib.util
import pathlib
import sys

_HERE = pathlib.Path(__file__).resolve().parent


def load(topic: str):
    saved = {name: mod for name, mod in sys.modules.items()
             if name == "course" or name.startswith("course.")}
    for name in saved:
        del sys.modules[name]
    try:
        spec = importlib.util.spec_from_file_location(f"_hidden_{topic}", _HERE / f"{topic}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        # The fresh course modules stay referenced by the hidden module; the learner's
        # namespace keeps its own.
        for name in [n for n in sys.modules if n == "course" or n.startswith("course.")]:
            del sys.modules[name]
        sys.modules.update(saved)
