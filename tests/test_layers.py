"""The package's layers: every labkit module sits on one floor, and imports only its own floor or
those below it (the science at the bottom, the book's tooling at the top), and no two modules
import each other at module level.

The floors are listed in labkit/__init__.py's docstring too; `python tests/test_layers.py` prints
the import graph floor by floor.
"""

import ast
from pathlib import Path

import pytest

import labkit

LABKIT = Path(labkit.__file__).parent
FLOORS = (
    ("records", ("runs", "cache", "state", "runtime", "memory")),
    ("task", ("task", "data", "verifier", "tokenizer", "config", "worked")),
    ("maths", ("losses", "objectives", "schedule", "variants", "metrics", "adam_step")),
    ("model", ("models", "scoring", "shared_prompt", "sampling", "static_sampler", "resume")),
    ("evaluation", ("evaluate", "paired", "agreement", "difficulty", "baselines", "checkpoint_curves")),
    ("learning", ("corpus", "answer_phase", "pretrain", "format_base", "sft", "grpo")),
    ("studies", ("group_size", "larger_run", "reward_model", "overoptimisation", "overoptimisation_summary",
                 "sweep", "tuning", "gradient_study", "ablations", "kl_gradients", "think_profile", "thinking_base", "reasoning", "reasoning_report")),
    ("book", ("plots", "plots_results", "plots_ablations", "knobs", "narrative", "results_page", "student", "book", "exercises",
              "bench", "smoke", "pipeline", "cli", "__main__", "plots_reasoning")),
)
FLOOR_OF = {module: i for i, (_, modules) in enumerate(FLOORS) for module in modules}


def top_level_modules() -> list[str]:
    names = [p.stem for p in LABKIT.glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in LABKIT.iterdir() if (p / "__init__.py").is_file()]
    return sorted(names)


def source_files(module: str) -> list[Path]:
    path = LABKIT / module
    return sorted(path.rglob("*.py")) if path.is_dir() else [LABKIT / f"{module}.py"]


def imported(module: str, module_level_only: bool = False) -> set[str]:
    """The labkit modules `module` imports (by their top-level name), anywhere or at module level only."""
    out = set()
    for path in source_files(module):
        depth = len(path.relative_to(LABKIT).parts) - 1  # 0 for labkit/x.py, 1 for labkit/pkg/y.py
        tree = ast.parse(path.read_text())
        nodes = tree.body if module_level_only else ast.walk(tree)
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.level:
                # level 1 is the file's own package; labkit itself is level depth + 1
                if node.level > depth + 1:
                    continue
                if node.level == depth + 1:  # relative to labkit itself
                    if node.module:
                        out.add(node.module.split(".")[0])
                    else:
                        out.update(a.name for a in node.names)
                else:
                    out.add(module)  # inside its own package
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit."):
                out.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("labkit."))
    return out - {module}


def test_every_module_sits_on_one_floor():
    listed = [m for _, modules in FLOORS for m in modules]
    assert len(listed) == len(set(listed)), "a module is listed on two floors"
    assert sorted(listed) == top_level_modules(), "list each labkit module on one floor of FLOORS"


@pytest.mark.parametrize("module", top_level_modules())
def test_imports_go_down_or_across_never_up(module):
    up = sorted(m for m in imported(module) if FLOOR_OF[m] > FLOOR_OF[module])
    assert up == [], (f"labkit.{module} (floor {FLOORS[FLOOR_OF[module]][0]!r}) imports from a higher floor: "
                      + ", ".join(f"{m} ({FLOORS[FLOOR_OF[m]][0]})" for m in up))


def test_no_two_modules_import_each_other_at_module_level():
    graph = {m: imported(m, module_level_only=True) for m in top_level_modules()}
    pairs = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    assert pairs == []


def test_the_package_docstring_lists_the_floors():
    for name, modules in FLOORS:
        assert f"{name}:" in labkit.__doc__, name


if __name__ == "__main__":
    for i, (name, modules) in enumerate(FLOORS):
        print(f"{i + 1}. {name}")
        for m in modules:
            below = sorted(imported(m), key=lambda x: (FLOOR_OF[x], x))
            print(f"     {m:<26} -> {', '.join(below) or '-'}")
