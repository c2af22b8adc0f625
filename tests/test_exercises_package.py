"""The shape of labkit.book.exercises: one module per chapter, one place that calls the student's code.

These tests read the package's source and the notebooks; they run no checker.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from labkit.book import exercises

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "labkit" / "book" / "exercises"
HELPER = "_calling"
PREDICT, REVEAL = "predict", "reveal"  # predict-then-run: the one comparison checker, and each chapter's reveal
# The chapters, named by the notebooks: 01_verifier.ipynb -> ch01, ...
CHAPTERS = sorted(f"ch{p.name[:2]}" for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def module_source(name: str) -> str:
    return (PACKAGE / f"{name}.py").read_text()


def test_the_old_single_module_is_gone_and_every_chapter_has_its_module():
    assert not (ROOT / "labkit" / "exercises.py").exists(), "labkit/book/exercises.py would shadow nothing but confuse"
    assert CHAPTERS == [f"ch{n:02d}" for n in range(1, 12)]
    modules = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert modules == sorted(["__init__", HELPER, PREDICT, REVEAL, *CHAPTERS])


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_chapter_module_holds_its_own_checkers_and_no_others(chapter):
    source = module_source(chapter)
    functions = [node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]
    checkers = [name for name in functions if name.startswith("check_")]
    assert checkers, f"{chapter}.py defines no checker"
    assert all(name.startswith(f"check_{chapter}_") for name in checkers), checkers
    # Every chapter-numbered name in the module (check_chNN_*, _chNN_*, CHNN_*) is this chapter's.
    numbers = {a or b for a, b in re.findall(r"\bch(\d\d)_\w+|\bCH(\d\d)_\w+", source.replace("_ch", " ch"))}
    assert numbers == {chapter[2:]}, numbers


def test_every_checker_the_package_exports_comes_from_its_chapter_module():
    exported = [name for name in dir(exercises) if name.startswith("check_") and name != "check_prediction"]
    assert {name[len("check_"):][:4] for name in exported} == set(CHAPTERS), exported
    assert exercises.check_prediction.__module__ == f"labkit.book.exercises.{PREDICT}"
    reveals = [name for name in dir(exercises) if name.startswith("reveal_")]
    assert reveals and all(getattr(exercises, n).__module__ == f"labkit.book.exercises.{REVEAL}" for n in reveals)
    for name in exported:
        chapter = name[len("check_"):][:4]
        assert getattr(exercises, name).__module__ == f"labkit.book.exercises.{chapter}", name
    assert exercises.ExerciseError.__module__ == f"labkit.book.exercises.{HELPER}"
    assert exercises.call_student.__module__ == f"labkit.book.exercises.{HELPER}"


def _student_calls_in_try_blocks(tree: ast.Module) -> list[tuple[str, int]]:
    """(function, line) of every `try` whose body calls a parameter of an enclosing function.

    A checker's parameters are the student's answers, so such a `try` is a
    call-the-student try/except (a `try: float(got)` calls no parameter).
    """
    found = []

    def visit(node, params: frozenset, where: str):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            names = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
            names |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
            params = params | names
            where = getattr(node, "name", where)
        if isinstance(node, ast.Try):
            for statement in node.body:
                for sub in ast.walk(statement):
                    if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in params:
                        found.append((where, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, params, where)

    visit(tree, frozenset(), "<module>")
    return found


def _broad_handlers(tree: ast.Module) -> list[int]:
    """Lines of every `except Exception` (or bare `except`): catching whatever the student raised."""
    return [h.lineno for h in ast.walk(tree) if isinstance(h, ast.ExceptHandler)
            and (h.type is None or (isinstance(h.type, ast.Name) and h.type.id in ("Exception", "BaseException")))]


def test_only_the_shared_helper_calls_the_student_inside_a_try():
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        calls, broad = _student_calls_in_try_blocks(tree), _broad_handlers(tree)
        if path.stem == HELPER:
            assert [name for name, _ in calls] == ["call_student"], calls
            assert len(broad) == 1, broad
        else:
            assert calls == [], f"{path.name} calls the student's function in its own try/except at {calls}"
            assert broad == [], f"{path.name} catches every exception itself at lines {broad}"


def test_the_scan_would_see_a_copied_try_except():
    copied = ast.parse("def check_x(f):\n    try:\n        got = f(1)\n    except Exception as err:\n        raise\n")
    assert _student_calls_in_try_blocks(copied) == [("check_x", 2)]
    assert _broad_handlers(copied) == [4]
    nested = ast.parse("def check_x(f):\n    def call(x):\n        try:\n            return f(x)\n        except ValueError:\n"
                       "            raise\n    return call\n")
    assert _student_calls_in_try_blocks(nested) == [("call", 3)]
    harmless = ast.parse("def check_x(f):\n    got = f(1)\n    try:\n        v = float(got)\n    except TypeError:\n"
                         "        raise\n")
    assert _student_calls_in_try_blocks(harmless) == []


def _names_used_by_notebooks() -> set[str]:
    names = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            names |= set(re.findall(r"\bexercises\.(\w+)", source))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ImportFrom) and node.module == "labkit.book.exercises":
                    names |= {alias.name for alias in node.names}
    return names


def test_the_package_still_exposes_every_name_the_notebooks_use():
    names = _names_used_by_notebooks()
    assert {f"check_ch{n:02d}" for n in range(1, 11)} <= {name[:10] for name in names}, names
    missing = sorted(name for name in names if not hasattr(exercises, name))
    assert missing == [], f"labkit.book.exercises no longer exposes {missing}, which the notebooks use"


def test_the_package_still_exposes_every_name_the_tests_use():
    names = set()
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "exercises":
                names.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module == "labkit.book.exercises":
                names |= {alias.name for alias in node.names}
    assert {"ExerciseError", "_ch06_cases"} <= names
    missing = sorted(name for name in names if not hasattr(exercises, name))
    assert missing == [], f"labkit.book.exercises no longer exposes {missing}, which the tests use"
