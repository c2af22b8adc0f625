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


def imported_by_chapters() -> set[str]:
    """Every labkit module a chapter's code cell imports (a name imported from a module counts as its module)."""
    out = set()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "\n".join(line for line in "".join(cell["source"]).splitlines()
                               if not line.lstrip().startswith(("%", "!")))
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
