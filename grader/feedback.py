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

    Tracebacks of hidden tests quote the lines of grader/hidden/*.py they ran through;
    the message our checks raise already names the problem. (A custom preprocessor must
    subclass NbGraderPreprocessor, or nbgrader silently skips it: NOTES.md.)
    """

    def preprocess_cell(self, cell, resources, index):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [_wrapped(f"{output['ename']}: {output['evalue']}")]
        return cell, resources
