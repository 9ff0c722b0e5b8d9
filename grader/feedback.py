"""Feedback preprocessing: learners see what failed and why, never hidden code."""
import textwrap

from nbgrader.preprocessors import NbGraderPreprocessor


def _wrapped(text, width=100):
    """Feedback HTML shows tracebacks unwrapped: wrap long lines, keeping indents."""
    lines = []
    for line in text.split("\n"):
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        lines += textwrap.wrap(line, width=width, subsequent_indent=indent) or [""]
    return "\n".join(lines)


class ShortTracebacks(NbGraderPreprocessor):
    """Cut every traceback to its last line, `ExceptionName: message`.

    A test cell's error is the grader's one-line verdict already; a notebook cell's
    traceback is cut to the same shape, so feedback reads alike everywhere. (A custom preprocessor must
    subclass NbGraderPreprocessor, or nbgrader silently skips it: ARCHITECTURE.md.)
    """

    def preprocess_cell(self, cell, resources, index):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [_wrapped(f"{output['ename']}: {output['evalue']}")]
        return cell, resources
