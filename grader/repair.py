"""Put a submitted notebook back into the release's shape before it is graded.

Editors and learners mangle notebooks in ways that must not cost points: a test cell
copied and pasted (two cells with one grade_id), nbgrader's metadata stripped by another
editor, cells moved or deleted. The graded notebook is therefore the release's list of
cells, in the release's order, where:
- every locked cell (setup, given values, demos, test cells) is the release's own;
- every solution cell holds the learner's code for it, found by its grade_id or, when
  the metadata is gone, by the names it defines (a cell that defines `softmax_stable` is
  the softmax_stable exercise); when two cells claim one exercise, the last one is it
  and the earlier ones stay as plain cells (as in the learner's kernel, the last
  definition wins);
- cells the learner added (helpers, experiments) stay, after the release cell they
  followed.
A missing solution cell becomes an empty one (the functions may live in another cell).
"""
import ast
import copy

import nbformat


def _meta(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def _defines(source):
    """Names a cell defines at top level (functions, classes, assignments)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _normal(source):
    return "\n".join(line.rstrip() for line in source.strip().split("\n"))


def repair(submitted, release, reference=None):
    """(repaired notebook, [notes]). `reference`: the instructor's source notebook, whose
    solution cells say which names each exercise defines (default: the release's)."""
    notes = []
    solution_ids = [_meta(c)["grade_id"] for c in release.cells if _meta(c).get("solution")]
    locked = {_normal(c.source): _meta(c).get("grade_id") for c in release.cells
              if not _meta(c).get("solution") and c.cell_type == "code"}
    wanted = {_meta(c).get("grade_id"): _defines(c.source)
              for c in (reference or release).cells if _meta(c).get("solution")}

    # 1. Name every submitted cell: ("solution", id), ("locked", id) or ("extra", None).
    roles, matched = [], []
    for cell in submitted.cells:
        grade_id = _meta(cell).get("grade_id")
        defined = _defines(cell.source) if cell.cell_type == "code" else set()
        content = [g for g, names in wanted.items() if names and names <= defined]
        if grade_id in solution_ids and wanted.get(grade_id) and not wanted[grade_id] <= defined \
                and content:  # the metadata names another exercise than the code holds
            roles.append(("solution", content[0]))
            notes.append(f"a cell labelled {grade_id} holds the {content[0]} exercise")
        elif grade_id in solution_ids:
            roles.append(("solution", grade_id))
        elif grade_id and grade_id in {_meta(c).get("grade_id") for c in release.cells}:
            roles.append(("locked", grade_id))
        elif cell.cell_type == "code" and _normal(cell.source) in locked:
            roles.append(("locked", locked[_normal(cell.source)]))
            matched.append(locked[_normal(cell.source)])
        elif cell.cell_type == "code":
            if content:
                roles.append(("solution", content[0]))
                matched.append(content[0])
            else:
                roles.append(("extra", None))
        else:
            roles.append(("markdown", None))

    if matched:
        notes.append(f"{len(matched)} cells had lost their nbgrader metadata and were "
                     "recognised by their content")

    # 2. The last cell that claims an exercise is it; earlier ones become plain cells.
    last = {}
    for i, (role, grade_id) in enumerate(roles):
        if role == "solution":
            last[grade_id] = i
    for i, (role, grade_id) in enumerate(roles):
        if role == "solution" and last[grade_id] != i:
            roles[i] = ("extra", None)
            notes.append(f"two cells claim the {grade_id} exercise: the last one is graded")
    counts = {}
    for role, grade_id in roles:
        if role == "locked":
            counts[grade_id] = counts.get(grade_id, 0) + 1
    notes += [f"locked cell {g} appears {n} times: the release's one is used"
              for g, n in counts.items() if n > 1]

    # 3. Rebuild in the release's order; added cells follow what preceded them.
    start = object()  # the anchor of cells added before any release cell
    after = {}  # release grade_id (or start) -> added cells that followed it
    anchor = start
    for cell, (role, grade_id) in zip(submitted.cells, roles):
        if role in ("solution", "locked"):
            anchor = grade_id
        elif role == "extra":
            after.setdefault(anchor, []).append(_plain(cell))
    learner = {grade_id: submitted.cells[i] for grade_id, i in last.items()}
    cells = list(after.get(start, []))
    for cell in release.cells:
        grade_id = _meta(cell).get("grade_id")
        mine = copy.deepcopy(cell)
        if grade_id in learner:
            mine.source = learner[grade_id].source
        elif grade_id in solution_ids:  # not the release's stub: it would redefine, as
            # NotImplementedError, a function the learner wrote in another cell
            mine.source = "# this exercise's cell was missing from the submission"
        cells.append(mine)
        if grade_id:
            cells += after.get(grade_id, [])
    missing = [g for g in solution_ids if g not in learner]
    if missing:
        notes.append("exercise cells missing (graded as unfilled): " + ", ".join(missing))
    repaired = copy.deepcopy(release)
    repaired.cells = cells
    for index, cell in enumerate(repaired.cells):
        cell["id"] = f"cell-{index:03d}"
    return nbformat.from_dict(repaired), notes


def _plain(cell):
    """An added cell, as a plain cell without nbgrader metadata."""
    kind = nbformat.v4.new_code_cell if cell.cell_type == "code" else nbformat.v4.new_markdown_cell
    return kind(source=cell.get("source", ""))
