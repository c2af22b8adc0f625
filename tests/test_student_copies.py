"""Student copies: solution cells become "your turn" stubs, everything else is kept and still runs."""

from __future__ import annotations

import copy

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from labkit.book import student
from labkit.cli import main as cli_main

CHAPTER_TO_EXECUTE = "01_verifier.ipynb"  # run in full; the other chapters are checked cell by cell


def _notebook(*cells):
    return new_notebook(cells=list(cells), metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                    "language": "python"}})


def _code(source, tags=(), output=None):
    cell = new_code_cell(source, metadata={"tags": list(tags)} if tags else {})
    if output is not None:
        cell.outputs = [new_output("stream", name="stdout", text=output)]
        cell.execution_count = 1
    return cell


SOLUTION = '''import math


def norm(x: list[float]) -> float:
    """Euclidean norm of x (length n) -> a float."""
    # the student should not see this line
    return math.sqrt(sum(v * v for v in x))
'''


def _exercise_notebook():
    return _notebook(
        new_markdown_cell("# Chapter 9\n\n## 9.1 Setup"),
        _code("x = [3.0, 4.0]", output="kept\n"),
        new_markdown_cell("## 9.2 Exercise: a norm"),
        _code(SOLUTION, tags=["solution"], output="solution output\n"),
        _code("assert check_norm(norm)", tags=["check"], output="correct\n"),
        _code("print(len(x))", output="2\n"),
    )


def _run(source, namespace):
    exec(compile(source, "<cell>", "exec"), namespace)


def test_solution_function_keeps_signature_and_docstring_and_raises_your_turn():
    nb = _exercise_notebook()
    copy_nb, exercises = student.student_notebook(nb, "ch09.ipynb")
    assert exercises == [student.Exercise("9.2 Exercise: a norm", 3, 4, "check_norm")]
    stub = copy_nb.cells[3].source
    assert "def norm(x: list[float]) -> float:" in stub
    assert '"""Euclidean norm of x (length n) -> a float."""' in stub
    assert "math.sqrt" not in stub and "should not see" not in stub
    assert "import math" in stub
    namespace = {}
    _run(stub, namespace)  # defining the stub works: later cells can still refer to it
    with pytest.raises(NotImplementedError) as error:
        namespace["norm"]([3.0, 4.0])
    message = str(error.value)
    assert message.startswith("Your turn: write norm() for exercise '9.2 Exercise: a norm'")
    assert "(check_norm)" in message


def test_outputs_cleared_only_for_solution_and_check_and_instructor_copy_untouched():
    nb = _exercise_notebook()
    before = copy.deepcopy(nb)
    copy_nb, _ = student.student_notebook(nb, "ch09.ipynb")
    assert nb == before
    assert copy_nb.cells[3].outputs == [] and copy_nb.cells[3].execution_count is None
    assert copy_nb.cells[4].outputs == [] and copy_nb.cells[4].source == "assert check_norm(norm)"
    for index in (0, 1, 2, 5):
        assert copy_nb.cells[index] == nb.cells[index]
    assert copy_nb.metadata["labkit"] == {"copy": "student"}


def test_solution_that_is_not_only_functions_is_replaced_whole():
    nb = _notebook(new_markdown_cell("## 3.4 Exercise: pick a value"),
                   _code("answer = 0.5\nprint(answer)", tags=["solution"]),
                   _code("exercises.check_ch03(answer)"))  # untagged, but it calls a checker
    copy_nb, exercises = student.student_notebook(nb, "ch03.ipynb")
    assert exercises == [student.Exercise("3.4 Exercise: pick a value", 1, 2, "exercises.check_ch03")]
    assert "answer = 0.5" not in copy_nb.cells[1].source
    with pytest.raises(NotImplementedError, match=r"^Your turn: write this cell for exercise '3.4 Exercise"):
        _run(copy_nb.cells[1].source, {})


@pytest.mark.parametrize("cells, message", [
    ([_code("check_x(f)", tags=["check"])], "tagged `check` but no `solution` cell precedes it"),
    ([_code("def f(): return 1", tags=["solution"]), _code("print(f())")], "has no checker after it"),
    ([new_markdown_cell("answer", metadata={"tags": ["solution"]})], "is markdown, not code"),
    ([_code("def f(): return 1", tags=["solution"]), _code("def g(): return 2", tags=["solution"])],
     "has no checker before the next solution"),
])
def test_broken_tag_conventions_are_refused_with_the_cell_named(cells, message):
    with pytest.raises(ValueError, match=message) as error:
        student.student_notebook(_notebook(*cells), "bad.ipynb")
    assert "bad.ipynb" in str(error.value)


def test_refuses_to_overwrite_the_instructor_notebooks():
    with pytest.raises(ValueError, match="refusing to overwrite the instructor notebook"):
        student.write_student_copies(student.NOTEBOOKS_DIR)


def _committed_notebooks():
    return sorted(student.NOTEBOOKS_DIR.glob("*.ipynb"))


def test_command_writes_every_chapter_and_keeps_every_other_cell(tmp_path, capsys):
    notebooks = _committed_notebooks()
    assert notebooks, f"no chapter notebooks in {student.NOTEBOOKS_DIR}"
    assert cli_main(["student", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for path in notebooks:
        instructor = nbformat.read(path, as_version=4)
        copy_nb = nbformat.read(tmp_path / path.name, as_version=4)
        exercises = student.find_exercises(instructor, path.name)
        assert f"{tmp_path / path.name}: {len(exercises)} exercise(s) stubbed" in printed
        if not path.name.startswith("appendix_"):  # every chapter has an exercise; an appendix may not
            assert len(exercises) >= 1, f"{path.name} has no exercise tagged `solution`"
        stubbed = {e.solution_index for e in exercises}
        checks = {e.check_index for e in exercises}
        assert len(copy_nb.cells) == len(instructor.cells)
        for index, (mine, theirs) in enumerate(zip(copy_nb.cells, instructor.cells)):
            if index in stubbed:
                assert "NotImplementedError" in mine.source and "Your turn" in mine.source
                assert mine.source != theirs.source and mine.outputs == []
            elif index in checks or student.REVEAL_TAG in theirs.metadata.get("tags", []):
                assert mine.source == theirs.source and mine.outputs == []  # a reveal: the answer is not shown
            elif student.PREDICTION_TAG in theirs.metadata.get("tags", []):  # the prediction is the student's own
                assert "\nprediction = None  # your prediction here" in "\n" + mine.source and mine.outputs == []
                assert "require_prediction_for(prediction, reveal_" in mine.source
            else:
                assert mine == theirs, f"{path.name} cell {index} changed in the student copy"
        # the instructor boxes (folded verification cells) stay in the student's copy, folded the same way
        boxes = [c for c in instructor.cells if "instructor" in c.metadata.get("tags", [])]
        assert [c for c in copy_nb.cells if "instructor" in c.metadata.get("tags", [])] == boxes


def test_student_copy_of_chapter_1_runs_and_its_check_says_your_turn(tmp_path):
    """Every cell runs except the checker, which fails with the stub's "your turn" message (not a NameError)."""
    from nbclient import NotebookClient

    source = student.NOTEBOOKS_DIR / CHAPTER_TO_EXECUTE
    assert source.is_file(), f"{source}: the chapter is missing"
    [(path, _)] = student.write_student_copies(tmp_path, [source])
    nb = nbformat.read(path, as_version=4)
    exercises = student.find_exercises(nb, path.name)
    checks = {e.check_index for e in exercises}
    # The kernel runs in notebooks/, where nbval runs the instructor copy; jupyter_client starts
    # the "python3" kernel with this interpreter.
    client = NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(student.NOTEBOOKS_DIR)}})
    client.execute()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if index in checks:
            # The checker may wrap the stub's error in its own; the student must still read "Your turn".
            assert len(errors) == 1 and "Your turn: write" in errors[0].evalue, f"check cell {index}: {errors}"
        else:
            assert errors == [], f"cell {index} fails in the student copy: {errors[0].ename}: {errors[0].evalue}"


def test_a_prediction_is_emptied_and_its_reveal_is_cleared():
    """Predict, then run: the student copy holds no prediction (the cell refuses to go on until the student
    writes one) and shows the answer only when the student runs the reveal cell."""
    nb = _notebook(new_markdown_cell("### Predict, then run"),
                   _code('# "stays", "halves" or "quarters"\nprediction = "halves"\nrequire(prediction)',
                         tags=["prediction"], output=""),
                   _code("result = reveal(prediction)", tags=["reveal"], output="Measured: halves\n"))
    copy_nb, exercises = student.student_notebook(nb, "ch02.ipynb")
    assert exercises == []
    assert copy_nb.cells[1].source == ('# "stays", "halves" or "quarters"\n'
                                       "prediction = None  # your prediction here, then run this cell\nrequire(prediction)")
    assert nb.cells[1].source.count('"halves"') == 2  # the instructor's chapter keeps its prediction
    assert copy_nb.cells[2].outputs == [] and copy_nb.cells[2].source == nb.cells[2].source
