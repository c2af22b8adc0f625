"""Every chapter's cell tags keep their promises.

- A cell whose output nbval does not compare (`nbval-ignore-output`) is still checked: its
  source asserts something or calls an exercise checker.  The one exception is a cell that
  only shows wall-clock times or memory: it carries a second tag, `timing`, and defines
  nothing that a later cell uses (so it can only show, never feed, the chapter).
- No cell is skipped by nbval (`nbval-skip`, `nbval-ignore-output` on a whole notebook, ...).
- Every exercise solution (`solution`) is folded in the instructor's book (`hide-input`): the
  toggle reads "Show solution".  A verification cell (digests, rounding tolerances, replays) may be
  folded whole as an instructor box (`instructor` with `hide-cell`, the toggle "For instructors:
  how this is verified", set in the cell's `mystnb` metadata).  A predict-then-run answer (`reveal`)
  has its output folded (`hide-output`, the toggle "Show the answer the runs give"), so that the book
  asks before it answers.  What a student need not read to follow a chapter is folded too (issue 57):
  a long cell's code (`long-code` with `hide-input`, the toggle "Show the code") and a full table the
  prose sums up (`details` with `hide-output`, "Show the full output"; a cell with both: "Show the full
  {type}", which the book writes as "source" and "output").  Nothing else is folded, and every chapter
  shows at most SHOWN_CODE_LINES lines of code and SHOWN_OUTPUT_WORDS words of output unfolded.  Student copies keep the instructor boxes
  (tests/test_student_copies.py); chapters 2, 5 and 6 have them.
"""

from __future__ import annotations

import ast
import re

import nbformat
import pytest

from labkit.lab.runs import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
IGNORE = "nbval-ignore-output"
CHECKED = re.compile(r"^\s*assert\b|\bcheck_\w+\(", re.MULTILINE)
SKIPPING_TAGS = {"nbval-skip", "skip-execution", "raises-exception", "nbval-raises-exception"}
INSTRUCTOR_PROMPT = "For instructors: how this is verified"


def _tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _names(source: str, kind) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:  # IPython magics: not parsed, nothing defined
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, kind):
            found.add(node.id)
        elif kind is ast.Store and isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.add(node.name)
    return found


REVEAL_PROMPT = "Show the answer the runs give"
FOLD_PROMPTS = {frozenset({"long-code"}): "Show the code", frozenset({"details"}): "Show the full output",
                frozenset({"long-code", "details"}): "Show the full {type}"}
SHOWN_CODE_LINES, SHOWN_OUTPUT_WORDS = 450, 2500


def shown(nb) -> tuple[int, int]:
    """(lines of code, words of text output) a chapter shows unfolded in the book."""
    lines = words = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = _tags(cell)
        if not tags & {"hide-input", "hide-cell"}:
            lines += cell.source.count("\n") + 1
        if not tags & {"hide-output", "hide-cell"}:
            words += sum(len(str(o.get("text", "")).split()) for o in cell.get("outputs", []))
    return lines, words


def tag_problems(nb) -> list[str]:
    """One line per broken promise in a notebook (see the module docstring); empty when all hold."""
    problems = []
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for k, (index, cell) in enumerate(code):
        tags = _tags(cell)
        where = f"code cell {k} (cell {index})"
        if tags & SKIPPING_TAGS:
            problems.append(f"{where} is skipped or allowed to raise ({sorted(tags & SKIPPING_TAGS)})")
        if "timing" in tags:
            if IGNORE not in tags:
                problems.append(f"{where} is tagged timing but its output is compared: add {IGNORE}")
            # names a later cell reads without setting them itself (a loop variable is its own)
            later = set().union(set(), *(_names(c.source, ast.Load) - _names(c.source, ast.Store) for _, c in code[k + 1:]))
            fed = sorted(_names(cell.source, ast.Store) & later)
            if fed:
                problems.append(f"{where} is tagged timing but defines {fed}, used later: a timing cell only shows")
        elif IGNORE in tags and not CHECKED.search(cell.source):
            problems.append(f"{where} has {IGNORE} but neither asserts nor calls a checker: its values go unchecked")
        if ("hide-input" in tags) != bool(tags & {"solution", "long-code"}):
            problems.append(f"{where}: hide-input goes with solution or long-code, and only with them (tags {sorted(tags)})")
        folds = tags & {"long-code", "details"}
        if folds and cell.metadata.get("mystnb", {}).get("code_prompt_show") != FOLD_PROMPTS[frozenset(folds)]:
            problems.append(f"{where}: a folded cell's toggle must read {FOLD_PROMPTS[frozenset(folds)]!r} "
                            "(metadata mystnb.code_prompt_show)")
        if ("hide-cell" in tags) != ("instructor" in tags):
            problems.append(f"{where}: hide-cell goes with instructor, and only with it (tags {sorted(tags)})")
        if "instructor" in tags and cell.metadata.get("mystnb", {}).get("code_prompt_show") != INSTRUCTOR_PROMPT:
            problems.append(f"{where}: an instructor box's toggle must read {INSTRUCTOR_PROMPT!r} "
                            "(metadata mystnb.code_prompt_show)")
        if ("hide-output" in tags) != bool(tags & {"reveal", "details"}):  # an answer is folded until asked for
            problems.append(f"{where}: hide-output goes with reveal or details, and only with them (tags {sorted(tags)})")
        if "reveal" in tags and cell.metadata.get("mystnb", {}).get("code_prompt_show") != REVEAL_PROMPT:
            problems.append(f"{where}: a reveal's toggle must read {REVEAL_PROMPT!r} (metadata mystnb.code_prompt_show)")
        if tags & {"remove-cell", "remove-input", "remove-output"}:
            problems.append(f"{where} is hidden or removed from the book ({sorted(tags)}): fold it as an instructor box")
    return problems


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src, metadata={"tags": list(tags)}) for src, tags in cells]
    return nb


def test_the_rule_catches_each_broken_promise():
    assert tag_problems(_nb(("x = 1\nassert x == 1", [IGNORE]), ("print(x)", []))) == []
    assert tag_problems(_nb(("assert check_ch01_x(f)", [IGNORE]))) == []
    assert tag_problems(_nb(("print(seconds)", [IGNORE, "timing"]))) == []
    [unchecked] = tag_problems(_nb(("print(kl)", [IGNORE])))
    assert "neither asserts nor calls a checker" in unchecked
    [feeds] = tag_problems(_nb(("t = time()", [IGNORE, "timing"]), ("print(t)", [])))
    assert "defines ['t'], used later" in feeds
    [compared] = tag_problems(_nb(("print(seconds)", ["timing"])))
    assert "add nbval-ignore-output" in compared
    [skipped] = tag_problems(_nb(("assert 1", ["nbval-skip"])))
    assert "skipped" in skipped
    [unfolded] = tag_problems(_nb(("def f(): pass", ["solution"])))
    assert "hide-input goes with solution or long-code" in unfolded
    box = tag_problems(_nb(("assert 1", ["instructor"])))
    assert len(box) == 2 and "hide-cell goes with instructor" in box[0]
    [prompt] = tag_problems(_nb(("assert 1", ["instructor", "hide-cell"])))
    assert "an instructor box's toggle must read" in prompt


# Chapter 6's resume timings moved to the appendix with the rest of the run's bookkeeping (issue 44).
@pytest.mark.parametrize(("chapter", "at_least"), [("02_one_group", 3), ("05_exact_kl", 3), ("06_grpo_run", 2),
                                                  ("appendix_runs", 1)])
def test_the_verification_cells_of_chapters_2_5_and_6_are_instructor_boxes(chapter, at_least):
    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{chapter}.ipynb", as_version=4)
    boxes = [c for c in nb.cells if "instructor" in _tags(c)]
    assert len(boxes) >= at_least and all(CHECKED.search(c.source) for c in boxes)


def test_there_are_chapters_to_check():
    assert len(NOTEBOOKS) >= 8


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_what_a_chapter_shows_unfolded_is_one_sitting(path):
    """Issue 57: chapters 7 and 10 showed 770 and 957 lines of code and 4,300 words of generated output."""
    lines, words = shown(nbformat.read(path, as_version=4))
    assert lines <= SHOWN_CODE_LINES and words <= SHOWN_OUTPUT_WORDS, (path.name, lines, words)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_uncompared_cell_is_still_checked(path):
    assert tag_problems(nbformat.read(path, as_version=4)) == []


PREDICTING = [p for p in NOTEBOOKS if p.name[:2] in {"02", "03", "04", "05", "06", "07", "08"}]


@pytest.mark.parametrize("path", PREDICTING, ids=lambda p: p.name)
def test_chapters_2_to_8_each_have_a_predict_then_run_exercise(path):
    """A `prediction` cell that sets `prediction`, right after a Markdown cell that asks the question
    ("Predict, then run"), and right before a `reveal` cell that compares it with the runs."""
    cells = nbformat.read(path, as_version=4).cells
    found = [k for k, c in enumerate(cells) if "prediction" in _tags(c)]
    assert found, f"{path.name} has no cell tagged 'prediction'"
    for k in found:
        assert re.search(r"^prediction = ", cells[k].source, re.MULTILINE), f"{path.name} cell {k} sets no prediction"
        assert cells[k - 1].cell_type == "markdown" and "Predict, then run" in cells[k - 1].source
        assert "reveal" in _tags(cells[k + 1]) and re.search(r"\b(reveal_\w+|check_prediction)\(prediction[,)]",
                                                            cells[k + 1].source), f"{path.name} cell {k + 1}"
        assert any("Your prediction" in o.get("text", "") for o in cells[k + 1].outputs), \
            f"{path.name} cell {k + 1}: the stored output shows no comparison"
