"""The package's layers: labkit's sub-packages sit in one order, from the run records at the bottom
to the commands at the top; every module imports only from its own unit or the units below it,
anywhere in the file (a function's late import counts too), and no chain of imports between
modules comes back to where it started.

The order is labkit/__init__.py's docstring, and each sub-package's docstring names the units it
may import.  `python tests/test_layers.py` prints the import graph unit by unit.
"""

import ast
import re
from pathlib import Path

import pytest

import labkit

LABKIT = Path(labkit.__file__).parent
# (unit, what it holds): a unit is a sub-package, or one module (config) or the commands on top.
UNITS = (
    ("lab", "run folders, digests, states, the cache's records, runtime, memory"),
    ("task", "StockArithmetic-v1: problems, verifier, data files, worked answers"),
    ("config", "every setting: one typed config per preset"),
    ("models", "load and build models, the tokenizer, prompts and log-probs, the samplers"),
    ("train", "schedules, the update step, supervised training, the tiny base's pretraining"),
    ("grpo", "the GRPO step: losses, objectives, variants, metrics, the loop"),
    ("eval", "evaluating a policy, paired tests, profiles"),
    ("studies", "each chapter's experiments, built on the units below"),
    ("book", "figures, pages, student copies, exercises"),
    ("commands", "the command line, the pipeline, the live run, the smoke run, the benchmarks"),
)
COMMANDS = ("cli", "__main__", "pipeline", "steps", "fill", "live", "smoke", "bench")
ORDER = {name: i for i, (name, _) in enumerate(UNITS)}


def module_files() -> dict[str, Path]:
    """Every labkit module by its dotted name (packages by their __init__)."""
    out = {}
    for path in sorted(LABKIT.rglob("*.py")):
        parts = list(path.relative_to(LABKIT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = module_files()


def unit_of(module: str) -> str | None:
    """The unit of a dotted labkit module name; None for labkit's own __init__."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return "commands" if parts[1] in COMMANDS else parts[1]


def _resolve(name: str) -> str:
    """The module a dotted name refers to: itself, or the package (or module) it is an attribute of."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, module_level_only: bool = False) -> set[str]:
    """The labkit modules `module` imports, by dotted name, anywhere in it (or at module level only)."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    tree = ast.parse(path.read_text())
    out = set()
    for node in (tree.body if module_level_only else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            if not stem.startswith("labkit"):
                continue
            for alias in node.names:
                target = f"{stem}.{alias.name}"
                out.add(target if target in MODULES else _resolve(stem))
        elif isinstance(node, ast.Import):
            out.update(_resolve(a.name) for a in node.names if a.name.startswith("labkit."))
    return out - {module, "labkit"}


def test_every_module_belongs_to_a_unit():
    units = {unit_of(m) for m in MODULES} - {None}
    assert units <= set(ORDER), f"not in UNITS: {sorted(units - set(ORDER))}"
    loose = sorted(p.name for p in LABKIT.glob("*.py")
                   if p.stem not in ("__init__", "config", *COMMANDS))
    assert loose == [], f"modules loose in labkit/ (put each in a sub-package): {loose}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if unit_of(m)))
def test_imports_go_down_or_across_never_up(module):
    mine = ORDER[unit_of(module)]
    up = sorted(m for m in imports_of(module) if unit_of(m) and ORDER[unit_of(m)] > mine)
    assert up == [], f"{module} (unit {unit_of(module)!r}) imports from a higher unit: {up}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_finds_a_circle_and_only_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_chain_of_imports_between_modules_comes_back():
    """No circle, late imports included (the old sampling <-> static_sampler pair was one)."""
    graph = {m: {i for i in imports_of(m) if i in MODULES and unit_of(i)} for m in MODULES if unit_of(m)}
    assert cycles(graph) == []


SUBPACKAGES = sorted(name for name, _ in UNITS if (LABKIT / name / "__init__.py").is_file())


@pytest.mark.parametrize("unit", SUBPACKAGES)
def test_each_subpackage_says_what_it_holds_and_what_it_may_import(unit):
    doc = ast.get_docstring(ast.parse((LABKIT / unit / "__init__.py").read_text())) or ""
    match = re.search(r"May import: (.*)", doc)
    assert match, f"labkit/{unit}/__init__.py's docstring needs a line 'May import: ...'"
    said = [s.strip(" .") for s in match.group(1).split(",") if s.strip(" .")]
    below = [name for name, _ in UNITS[: ORDER[unit]]]
    assert said == (below or ["nothing of labkit"]), f"labkit.{unit} may import {below}, its docstring says {said}"
    for name in sorted(p.stem for p in (LABKIT / unit).glob("*.py") if p.stem != "__init__"):
        assert re.search(rf"\b{name}\b", doc), f"labkit/{unit}/__init__.py's docstring does not list {name}"


@pytest.mark.parametrize("unit", SUBPACKAGES)
def test_a_subpackage_init_holds_only_its_docstring(unit):
    """Importing labkit.<unit>.x runs labkit/<unit>/__init__.py: it must run nothing, so that it is not
    a hidden input of every cached step (labkit.lab.cache records the modules a step imports)."""
    body = ast.parse((LABKIT / unit / "__init__.py").read_text()).body
    assert [type(n).__name__ for n in body] == ["Expr"], f"labkit/{unit}/__init__.py holds code"


def test_the_package_docstring_lists_the_units_in_order():
    positions = [labkit.__doc__.find(f"\n    {name}/") if name in SUBPACKAGES else labkit.__doc__.find(f"\n    {name}")
                 for name, _ in UNITS]
    assert -1 not in positions, [name for (name, _), p in zip(UNITS, positions) if p == -1]
    assert positions == sorted(positions)


if __name__ == "__main__":
    for name, holds in UNITS:
        print(f"{ORDER[name] + 1}. {name}: {holds}")
        for m in sorted(m for m in MODULES if unit_of(m) == name):
            targets = sorted(imports_of(m), key=lambda x: (ORDER.get(unit_of(x) or "", -1), x))
            print(f"     {m.removeprefix('labkit.'):<32} -> {', '.join(t.removeprefix('labkit.') for t in targets) or '-'}")
