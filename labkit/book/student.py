"""Student copies of the chapter notebooks: the exercise solutions become "your turn" stubs.

The committed notebooks in `notebooks/` are the instructor version.  The student version of
each is written by one command and never committed by hand:

    python -m labkit student --out student/        (or `make student`)

Cell-tag convention for chapter authors (set tags in the cell metadata, `"tags": [...]`):

- `solution`: the cell that holds the answer to the chapter's exercise.  Write it as one or more
  top-level function definitions (imports may precede them); give each function the docstring
  the student should see, with the shapes of its inputs and outputs.  In the student copy each
  function keeps its signature and docstring and its body becomes
  `raise NotImplementedError("Your turn: ...")`, naming the exercise and the checker to run.  A
  solution cell that holds anything else (an assignment of an answer, a loop) is replaced whole
  by a cell that raises that error.
- `check`: the code cell that calls the exercise's checker from `labkit.book.exercises` on the
  solution, e.g. `assert check_ch01_is_valid_answer(is_valid_answer)`.  It follows its solution
  cell.  It is kept in the student copy (with its outputs cleared) and raises the stub's "your
  turn" error until the student writes the solution.  If no cell after a solution is tagged
  `check`, the first later code cell that calls a function named `check...` is taken as its
  checker; tag it anyway.
- `prediction` and `reveal`: a predict-then-run exercise.  The `prediction` cell holds
  `prediction = ...` (the instructor's stored prediction in the chapter, which nbval runs; `prediction =
  None` in the student copy, so that the cell refuses to go on until the student writes one) and checks
  it (`require_prediction_for`); the `reveal` cell after it loads the committed runs and calls
  `labkit.book.exercises.check_prediction`.  Its outputs are cleared in the student copy, so that the
  answer is not on the page before the student has predicted, and folded in the book (hide-output).
- Every other cell must run without the solution: nothing outside `check` cells may use what
  the solution defines.  tests/test_student_copies.py executes the student copies and holds
  every chapter to this.

The exercise is named after the last Markdown heading above its solution cell (e.g.
"1.8 Exercise: a validity check that never raises").  Outputs of `solution` and `check` cells
are cleared; every other cell, with its outputs, is kept as it is.
"""

from __future__ import annotations

import ast
import copy
import json
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..lab.runs import REPO_ROOT

SOLUTION_TAG = "solution"
HIDDEN_SOLUTION_TAG = "hide-input"  # every solution cell also carries it: folded in the instructor's book
CHECK_TAG = "check"
PREDICTION_TAG, REVEAL_TAG = "prediction", "reveal"  # a predict-then-run exercise's two cells
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"


@dataclass(frozen=True)
class Exercise:
    """Where one exercise sits in a notebook: its solution cell, its checker cell, its names."""

    title: str
    solution_index: int
    check_index: int
    checker: str


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _heading(markdown: str) -> str | None:
    """The text of the last Markdown heading in a cell, or None."""
    found = None
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and stripped.lstrip("#").startswith(" "):
            found = stripped.lstrip("#").strip()
    return found


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def checker_name(source: str) -> str | None:
    """The first function called in `source` whose name starts with `check` (e.g. `exercises.check_x`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        name = _dotted_name(call.func)
        if name and name.split(".")[-1].startswith("check"):
            return name
    return None


def find_exercises(nb, name: str = "notebook") -> list[Exercise]:
    """Each `solution` cell with its checker cell and the exercise's title.

    Raises ValueError, naming the notebook and the cell, when a `check` cell has no solution
    before it, when a solution has no checker after it, or when a tagged cell is not code.
    """
    exercises = []
    title = None
    pending: int | None = None  # the solution cell still waiting for its checker
    for index, cell in enumerate(nb.cells):
        cell_tags = tags(cell)
        if cell.cell_type == "markdown":
            title = _heading(cell.source) or title
        if (SOLUTION_TAG in cell_tags or CHECK_TAG in cell_tags) and cell.cell_type != "code":
            raise ValueError(f"{name}: cell {index} is tagged {cell_tags} but is {cell.cell_type}, not code")
        if SOLUTION_TAG in cell_tags:
            if pending is not None:
                raise ValueError(f"{name}: solution cell {pending} has no checker before the next solution "
                                 f"(cell {index}); tag the cell that calls its checker `{CHECK_TAG}`")
            pending = index
            pending_title = title or f"exercise in cell {index}"
            continue
        if cell.cell_type != "code":
            continue
        is_check = CHECK_TAG in cell_tags
        if is_check and pending is None:
            raise ValueError(f"{name}: cell {index} is tagged `{CHECK_TAG}` but no `{SOLUTION_TAG}` cell precedes it")
        if pending is not None and (is_check or checker_name(cell.source)):
            checker = checker_name(cell.source) or cell.source.strip().splitlines()[0]
            exercises.append(Exercise(pending_title, pending, index, checker))
            pending = None
    if pending is not None:
        raise ValueError(f"{name}: solution cell {pending} has no checker after it; add a code cell that calls "
                         f"its checker from labkit.book.exercises and tag it `{CHECK_TAG}`")
    return exercises


def your_turn_message(what: str, exercise: Exercise) -> str:
    return (f"Your turn: write {what} for exercise '{exercise.title}', "
            f"then run the checker cell below ({exercise.checker}).")


def _raise_lines(message: str, indent: str) -> str:
    """`raise NotImplementedError(...)` with the message split over lines of about 80 characters."""
    words, lines, line = message.split(" "), [], ""
    for word in words:
        if line and len(line) + len(word) + 1 > 76:
            lines.append(line + " ")
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    # json.dumps: always double quotes, and a valid Python literal for any text.
    body = "\n".join(f"{indent}    {json.dumps(piece, ensure_ascii=False)}" for piece in lines)
    return f"{indent}raise NotImplementedError(\n{body}\n{indent})"


_PLACEHOLDER = "__labkit_your_turn__"


def stub_source(source: str, exercise: Exercise) -> str:
    """The student's version of a solution cell: signatures and docstrings kept, bodies raise.

    Top-level imports are kept; each top-level function keeps its decorators, signature and
    docstring, and its body becomes `raise NotImplementedError(...)`.  A cell holding anything
    else is replaced whole by a cell that raises.
    """
    header = (f"# Your turn: exercise '{exercise.title}'.\n"
              f"# Replace the stub below with your code, then run the checker cell below.\n")
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics, or a cell left broken: stub the whole cell
        tree = None
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    functions = [n for n in tree.body if isinstance(n, kinds)] if tree else []
    others = [n for n in tree.body if not isinstance(n, kinds + (ast.Import, ast.ImportFrom))] if tree else [None]
    if not functions or others:
        return header + _raise_lines(your_turn_message("this cell", exercise), "") + "\n"
    pieces = []
    for node in tree.body:
        if not isinstance(node, kinds):
            pieces.append(ast.unparse(node))
            continue
        stub = copy.deepcopy(node)
        docstring = ast.get_docstring(node, clean=False)
        placeholder = ast.parse(f"raise {_PLACEHOLDER}").body[0]
        stub.body = ([ast.Expr(ast.Constant(docstring))] if docstring is not None else []) + [placeholder]
        text = ast.unparse(ast.fix_missing_locations(stub))
        lines = text.split("\n")
        at = next(i for i, line in enumerate(lines) if line.strip() == f"raise {_PLACEHOLDER}")
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        lines[at] = _raise_lines(your_turn_message(f"{node.name}()", exercise), indent)
        pieces.append("\n".join(lines))
    return header + "\n\n\n".join(pieces) + "\n"


def _clear_outputs(cell) -> None:
    cell.outputs = []
    cell.execution_count = None


def empty_prediction(source: str) -> str:
    """A prediction cell with its `prediction = ...` line emptied (`prediction = None`): the cell then
    refuses to go on until the student writes one (`require_prediction_for`)."""
    import re

    emptied, count = re.subn(r"^prediction = .*$", "prediction = None  # your prediction here, then run this cell",
                             source, flags=re.M)
    if count != 1:
        raise ValueError(f"a prediction cell must set `prediction = ...` on one line of its own, found {count}")
    return emptied


def student_notebook(nb, name: str = "notebook"):
    """A student copy of `nb` (a new notebook; `nb` is not changed) and the exercises it stubbed."""
    student = copy.deepcopy(nb)
    exercises = find_exercises(student, name)
    for exercise in exercises:
        solution = student.cells[exercise.solution_index]
        solution.source = stub_source(solution.source, exercise)
        # The instructor's book folds solutions away (hide-input); a student's stub is theirs to see.
        solution.metadata["tags"] = [t for t in tags(solution) if t != HIDDEN_SOLUTION_TAG]
        _clear_outputs(solution)
        _clear_outputs(student.cells[exercise.check_index])
    for cell in student.cells:  # a prediction's answer is revealed only when the student runs the cell
        if REVEAL_TAG in tags(cell):
            _clear_outputs(cell)
        if PREDICTION_TAG in tags(cell):  # the prediction is the student's own: none is given
            cell.source = empty_prediction(cell.source)
            _clear_outputs(cell)
    student.metadata.setdefault("labkit", {})["copy"] = "student"
    return student, exercises


def write_student_copies(out_dir: str | Path, notebooks: list[Path] | None = None) -> list[tuple[Path, int]]:
    """Write the student copy of every chapter into out_dir; returns [(written path, exercises stubbed)].

    notebooks defaults to every `notebooks/*.ipynb`.  An instructor notebook is never written to.
    """
    out_dir = Path(out_dir)
    notebooks = sorted(NOTEBOOKS_DIR.glob("*.ipynb")) if notebooks is None else [Path(p) for p in notebooks]
    if not notebooks:
        raise ValueError(f"no notebooks to copy (looked in {NOTEBOOKS_DIR})")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        target = out_dir / path.name
        if target.resolve() == path.resolve():
            raise ValueError(f"refusing to overwrite the instructor notebook {path}: choose another --out")
        nb = nbformat.read(path, as_version=4)
        student, exercises = student_notebook(nb, path.name)
        nbformat.write(student, target)
        written.append((target, len(exercises)))
    return written
