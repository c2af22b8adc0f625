"""The shape issue 14 asked of labkit: no giant functions, thin training loops, no dead names.

These tests read the source; they run nothing.  A function's length is counted from its
`def` line to its last line, docstring and comments included (what a reader scrolls through).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

LABKIT = Path(__file__).resolve().parents[1] / "labkit"
LONGEST_FUNCTION = 100
THIN_LOOPS = {("grpo/loop.py", "run_grpo"): 80, ("train/sft.py", "run_branch"): 80}


def functions() -> list[tuple[str, str, int]]:
    """(module path relative to labkit/, function name, lines) for every function and method in labkit."""
    found = []
    for path in sorted(LABKIT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((path.relative_to(LABKIT).as_posix(), node.name, node.end_lineno - node.lineno + 1))
    return found


def test_the_walk_finds_the_functions_it_should():
    names = {(module, name) for module, name, _ in functions()}
    assert {("train/pretrain.py", "pretrain"), ("grpo/loop.py", "run_grpo"), ("train/sft.py", "run_branch"),
            ("book/exercises/ch01.py", "check_ch01_is_valid_answer")} <= names


def test_no_function_in_labkit_is_over_100_lines():
    too_long = [f"{module}:{name} has {lines} lines" for module, name, lines in functions() if lines > LONGEST_FUNCTION]
    assert not too_long, f"functions over {LONGEST_FUNCTION} lines: {too_long}"


@pytest.mark.parametrize("module, name", sorted(THIN_LOOPS))
def test_the_training_loops_are_thin(module, name):
    lines = {(m, n): length for m, n, length in functions()}[(module, name)]
    assert lines < THIN_LOOPS[(module, name)], f"{module}:{name} has {lines} lines"


def test_no_module_level_constant_is_defined_and_never_used():
    """A module-level UPPER_CASE name must be read somewhere in the repository's code, tests or notebooks."""
    root = LABKIT.parent
    sources = [p.read_text() for p in [*LABKIT.rglob("*.py"), *(root / "tests").glob("*.py")]]
    sources += [p.read_text() for p in (root / "notebooks").glob("*.ipynb")]
    words = Counter(word for source in sources for word in re.findall(r"\b[A-Z_][A-Z0-9_]*\b", source))
    unused = []
    for path in sorted(LABKIT.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    if words[target.id] < 2:  # the definition itself is one
                        unused.append(f"{path.relative_to(LABKIT).as_posix()}:{target.id}")
    assert not unused, f"defined and never used: {unused}"


def test_every_config_class_lives_in_config_py():
    """One home for settings: every `...Config` dataclass of labkit is defined in labkit/config.py."""
    elsewhere = []
    for path in sorted(LABKIT.rglob("*.py")):
        if path.name == "config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Config"):
                elsewhere.append(f"{path.relative_to(LABKIT).as_posix()}: {node.name}")
    assert elsewhere == []


def test_run_folders_are_named_by_one_constructor():
    """runs/<preset>/... is built by `runs.preset_folder` alone, not by joining "runs" and a preset by hand."""
    by_hand = re.compile(r'"runs"\s*/\s*(preset|config\.name|spec\[)')
    found = [f"{path.relative_to(LABKIT).as_posix()}:{number}"
             for path in sorted(LABKIT.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if by_hand.search(line)]
    assert found == []
