"""The GRPO core's reading path: the code one reads to follow one iteration, measured from the source.

    python tests/reading_path.py          # the functions in reading order, then the totals

How it is measured.  Start at `labkit.grpo.core.run_iteration` and follow every call the source
makes, statically (Python's `ast`): a plain name (a function of the same module, or one imported by
name), `module.function` (a module imported by name), `self.method`, and the loop's variant: a call
through `loop.resolved.<field>` or `resolved.<field>` is followed to the function the protocol's
variant resolves that field to (`variants.resolve(Variant(), TINY)`, looked up here, once; a
`functools.partial` is followed to its function).  A function
reached is read whole, its docstring included (a `torch.autograd.Function`'s `.apply` reaches its
`forward` and its `backward`): its lines are counted from its first decorator to
its last line.  The path stops at the units below GRPO: a call into `labkit.models` (the samplers,
teacher-forced log-probs), `labkit.task` (the verifier), `labkit.train` (the update step),
`labkit.lab` or `labkit.config` is read by its docstring, as a from-scratch course reads
`model.generate`, its reward function and `optimizer.step()`.

Counted whole as well (issue 54: the path "counted honestly"):
- the GRPO package's data types the path's functions name, in an annotation or a call (`Loop`,
  `Sampled`, `Rows`, `LossBatch`, `Resolved`), each class from its first decorator to its last line: a
  reader needs to know what a `Loop` holds to follow `loop.model` (a class whose methods are already
  on the path, `_ExactPrefixKL`, is not counted twice).  The types of the units below (`Group`,
  `Batch`, `Rollout`, the preset's config) are read by their docstrings, as those units' functions
  are; the script prints them, and their lines, apart;
- the log-prob gather the path reaches (`labkit.models.scoring.response_logprobs` and what it calls in
  its own module): how a row's log-probs are read off the logits is part of the ratio.

The depth of the clipped surrogate is the fewest calls from `run_iteration` to
`labkit.grpo.losses.clipped_surrogate` (a function calling it directly is at depth 1 from itself).
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = ("labkit.grpo.core", "run_iteration")
TARGET = ("labkit.grpo.losses", "clipped_surrogate")
CORE = "labkit.grpo"
GATHER = ("labkit.models.scoring", "response_logprobs")  # the log-prob gather, read whole with its own module's callees


@dataclass(frozen=True)
class Function:
    module: str
    name: str  # "f" or "Class.method"
    path: Path
    first: int
    last: int
    node: ast.AST

    @property
    def lines(self) -> int:
        return self.last - self.first + 1


def _module_path(module: str) -> Path:
    base = ROOT / Path(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


class Module:
    """A module's functions (and methods) and what its names refer to."""

    def __init__(self, name: str):
        self.name = name
        self.path = _module_path(name)
        self.tree = ast.parse(self.path.read_text())
        self.functions: dict[str, Function] = {}
        self.names: dict[str, tuple[str, str | None]] = {}  # local name -> (module, attribute or None)
        package = name.split(".") if self.path.name == "__init__.py" else name.split(".")[:-1]
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._add(node.name, node)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self._add(f"{node.name}.{item.name}", item)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom):
                stem = ".".join(package[: len(package) - node.level + 1] + [node.module] if node.module
                                else package[: len(package) - node.level + 1]) if node.level else node.module
                for alias in node.names:
                    local = alias.asname or alias.name
                    if _module_path(f"{stem}.{alias.name}").exists():
                        self.names[local] = (f"{stem}.{alias.name}", None)
                    else:
                        self.names[local] = (stem, alias.name)

        self.classes = {node.name: node for node in self.tree.body if isinstance(node, ast.ClassDef)}

    def _add(self, name: str, node) -> None:
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        self.functions[name] = Function(self.name, name, self.path, first, node.end_lineno, node)


_MODULES: dict[str, Module] = {}


def module(name: str) -> Module:
    if name not in _MODULES:
        _MODULES[name] = Module(name)
    return _MODULES[name]


def protocol_fields() -> dict[str, tuple[str, str]]:
    """Each field of the protocol's resolved variant that is a function: (module, name) of that function."""
    variants = importlib.import_module("labkit.grpo.variants")
    resolved = variants.resolve(variants.Variant(), importlib.import_module("labkit.config").TINY)
    out = {}
    for f in fields(resolved):
        value = getattr(resolved, f.name)
        for attr, fn in [(f.name, value)] + [(f"{f.name}.{g.name}", getattr(value, g.name))
                                            for g in (fields(value) if hasattr(value, "__dataclass_fields__") else ())]:
            fn = getattr(fn, "func", fn)  # a functools.partial: the function it binds
            if callable(fn) and hasattr(fn, "__module__") and hasattr(fn, "__qualname__") \
                    and "<locals>" not in fn.__qualname__ and fn.__module__.startswith("labkit."):
                out[attr] = (fn.__module__, fn.__qualname__)
    return out


def _dotted(node) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def callees(fn: Function, resolved_fields: dict) -> list[tuple[str, str]]:
    """(module, function) of each call in `fn` that resolves to a labkit function, in source order."""
    mod = module(fn.module)
    out = []
    for node in ast.walk(fn.node):
        if not isinstance(node, ast.Call):
            continue
        parts = _dotted(node.func)
        if not parts:
            continue
        target = None
        if len(parts) == 1:
            name = parts[0]
            if name in mod.functions:
                target = (fn.module, name)
            elif name in mod.names and mod.names[name][1] is not None:
                target = mod.names[name]
        elif len(parts) == 2 and parts[1] == "apply" and f"{parts[0]}.forward" in mod.functions:
            # a torch.autograd.Function: `.apply` runs its forward, and its backward runs in backward()
            for method in ("forward", "backward"):
                if (fn.module, f"{parts[0]}.{method}") not in out:
                    out.append((fn.module, f"{parts[0]}.{method}"))
            continue
        elif parts[0] == "self" and len(parts) == 2 and "." in fn.name:
            target = (fn.module, f"{fn.name.split('.')[0]}.{parts[1]}")
        elif parts[0] in mod.names and mod.names[parts[0]][1] is None and len(parts) == 2:
            target = (mod.names[parts[0]][0], parts[1])
        else:
            tail = parts[2:] if parts[:2] == ["loop", "resolved"] else parts[1:] if parts[0] == "resolved" else None
            if tail is not None and ".".join(tail) in resolved_fields:
                target = resolved_fields[".".join(tail)]
        if target and target not in out:
            out.append(target)
    return out


def types_named(fn: Function) -> list[tuple[str, str]]:
    """(module, class) of each labkit class `fn` names (annotations, calls, attributes), in source order."""
    mod = module(fn.module)
    out = []
    for node in ast.walk(fn.node):
        parts = _dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if not parts:
            continue
        target = None
        if len(parts) == 1 and parts[0] in mod.classes:
            target = (fn.module, parts[0])
        elif len(parts) == 1 and parts[0] in mod.names and mod.names[parts[0]][1] is not None:
            target = mod.names[parts[0]]
        elif len(parts) == 2 and parts[0] in mod.names and mod.names[parts[0]][1] is None:
            target = (mod.names[parts[0]][0], parts[1])
        if target and target[0].startswith("labkit.") and target not in out:
            try:
                if target[1] in module(target[0]).classes:
                    out.append(target)
            except (FileNotFoundError, SyntaxError):
                pass
    return out


def class_lines(key: tuple[str, str]) -> Function:
    """The class `key` as one readable unit (its first decorator to its last line)."""
    node = module(key[0]).classes[key[1]]
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return Function(key[0], key[1], module(key[0]).path, first, node.end_lineno, node)


def find(target: tuple[str, str]) -> Function | None:
    try:
        return module(target[0]).functions.get(target[1])
    except (FileNotFoundError, SyntaxError):
        return None


def measure() -> dict:
    """The reading path from START: its functions in reading order (depth first), their lines and files,
    the boundary calls, and the depth of TARGET."""
    resolved_fields = protocol_fields()
    order, boundary = [], []
    seen = set()

    def visit(key):
        if key in seen:
            return
        seen.add(key)
        fn = find(key)
        if fn is None:
            return
        order.append(fn)
        for callee in callees(fn, resolved_fields):
            if callee[0].startswith(CORE):
                visit(callee)
            elif callee not in boundary:
                boundary.append(callee)

    visit(START)
    # the log-prob gather, whole, with what it calls in its own module
    gather, queue = [], [GATHER]
    while queue:
        key = queue.pop(0)
        fn = find(key)
        if fn is None or fn in gather:
            continue
        gather.append(fn)
        queue += [c for c in callees(fn, resolved_fields) if c[0] == GATHER[0]]
    types, below, queue = [], [], [t for fn in order + gather for t in types_named(fn)]
    on_path = {(f.module, f.name.split(".")[0]) for f in order if "." in f.name}
    for key in queue:
        if key in on_path or key in [(t.module, t.name) for t in types + below]:
            continue
        (types if key[0].startswith(CORE) else below).append(class_lines(key))
    # depths along the shortest chains (a breadth-first pass over the same graph)
    shortest, frontier = {START: 0}, [START]
    while frontier:
        nxt = []
        for key in frontier:
            fn = find(key)
            if fn is None or not key[0].startswith(CORE):
                continue
            for callee in callees(fn, resolved_fields):
                if callee not in shortest:
                    shortest[callee] = shortest[key] + 1
                    nxt.append(callee)
        frontier = nxt
    read = order + gather + types
    files = sorted({str(f.path.relative_to(ROOT)) for f in read})
    return {"functions": order, "gather": gather, "types": types, "types_below": below,
            "lines": sum(f.lines for f in read),
            "files": files, "boundary": [b for b in boundary if b not in [(g.module, g.name) for g in gather]],
            "target_depth": shortest.get(TARGET)}


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(ROOT))
    result = measure()
    for what in ("functions", "gather", "types"):
        print({"functions": "the path", "gather": "the log-prob gather", "types": "the data types"}[what])
        for fn in result[what]:
            print(f"  {fn.lines:4d}  {fn.path.relative_to(ROOT)}:{fn.first}  {fn.name}")
    print(f"\n{len(result['functions'])} functions, {len(result['types'])} data types and the gather: "
          f"{result['lines']} lines, {len(result['files'])} files: "
          f"{', '.join(result['files'])}")
    print(f"clipped surrogate: {result['target_depth']} calls deep from run_iteration")
    below = result["types_below"]
    print(f"data types of the units below, read by their docstrings: "
          + ", ".join(f"{t.module.removeprefix('labkit.')}.{t.name} ({t.lines} lines)" for t in below)
          + f"; with them, {result['lines'] + sum(t.lines for t in below)} lines in "
          f"{len(set(result['files']) | {str(t.path.relative_to(ROOT)) for t in below})} files")
    print("read by their docstrings (below GRPO): " + ", ".join(f"{m.removeprefix('labkit.')}.{n}"
                                                              for m, n in result["boundary"]))
