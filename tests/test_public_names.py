"""The modules the chapters import are the ones labkit/__init__.py lists, no more and no fewer."""

import ast
import importlib.util
import json
import re
from pathlib import Path

import labkit

ROOT = Path(__file__).resolve().parents[1]


def listed() -> set[str]:
    """The modules of the package docstring's table: "labkit.<unit>  a, b, c" (continued on indented lines)."""
    table = labkit.__doc__.split("What the chapters import")[1]
    out, unit = set(), None
    for line in table.splitlines():
        match = re.match(r"\s{4}(labkit\.\w+)\s*(.*)$", line)
        if match:
            unit, rest = match.group(1), match.group(2)
            if not rest:
                out.add(unit)  # a module of its own (labkit.config)
        elif unit and line.startswith(" " * 8) and line.strip():
            rest = line
        else:
            continue
        out.update(f"{unit}.{name.strip()}" for name in rest.split(",") if name.strip())
    return out


def chapter_code() -> dict[str, list[str]]:
    """Each chapter's code cells (notebook file name -> their sources), without IPython's % and ! lines."""
    return {path.name: ["\n".join(line for line in "".join(cell["source"]).splitlines()
                                  if not line.lstrip().startswith(("%", "!")))
                        for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "code"]
            for path in sorted((ROOT / "notebooks").glob("*.ipynb"))}


def imported_by_chapters() -> set[str]:
    """Every labkit module a chapter's code cell imports (a name imported from a module counts as its module)."""
    out = set()
    for cells in chapter_code().values():
        for source in cells:
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
                    for alias in node.names:
                        full = f"{node.module}.{alias.name}"
                        out.add(full if _is_module(full) else node.module)
                elif isinstance(node, ast.Import):
                    out.update(a.name for a in node.names if a.name.startswith("labkit"))
    return out


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_the_table_reads_as_written():
    names = listed()
    assert {"labkit.config", "labkit.grpo.core", "labkit.studies.reasoning_report", "labkit.book.exercises"} <= names


def test_the_chapters_import_exactly_the_listed_modules():
    listed_now, imported = listed(), imported_by_chapters()
    assert imported - listed_now == set(), f"imported by a chapter, not listed in labkit/__init__.py: {sorted(imported - listed_now)}"
    assert listed_now - imported == set(), f"listed, imported by no chapter: {sorted(listed_now - imported)}"


def rebound_imports(source: str) -> list[str]:
    """The names a notebook's code imports from labkit and then binds again (an assignment, a loop
    variable, a function or its argument): after the rebinding the name no longer means the module."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name.split(".")[0]
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit")
                or isinstance(node, ast.Import) and any(a.name.startswith("labkit") for a in node.names)
                for alias in node.names}
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return sorted(imported & bound)


def test_rebound_imports_are_found():
    assert rebound_imports("from labkit.models import rollouts\nrollouts = [1]\n") == ["rollouts"]
    assert rebound_imports("from labkit.models import sampling as s\nfor s in range(2):\n    pass\n") == ["s"]
    assert rebound_imports("from labkit.models import rollouts\ndef f(rollouts):\n    pass\n") == ["rollouts"]
    assert rebound_imports("from labkit.models import rollouts\nrows = rollouts.Rollout\n") == []


def test_no_chapter_rebinds_a_name_it_imports_from_labkit():
    """Chapter 6 once imported the module `rollouts` and named its list of rows `rollouts` too: the
    module's `rollouts.Rollout` then failed in a later cell.  A chapter's cells share one namespace."""
    rebound = {name: rebound_imports("\n".join(cells)) for name, cells in chapter_code().items()}
    clashes = {name: names for name, names in rebound.items() if names}
    assert clashes == {}, f"names imported from labkit and bound again in the same chapter: {clashes}"
