"""What a piece of the lab's code does, fingerprinted: the definitions an entry point can reach,
each digested without its docstrings, comments or layout.

A cached step is stale when the code that made it would now do something else.  Its file's bytes are
a poor proxy for that: a comment, a docstring or a re-wrapped line changes them and changes nothing
the step computes.  So a step's code is named by its entry points ("labkit.grpo.loop:run_grpo") and
fingerprinted in three moves:

1. every module of the package is parsed (`ast`), and each top-level definition (a function, a
   class with all its methods, a module-level assignment) becomes one *symbol*; the statements a
   module runs when it is imported (everything but its imports and definitions) are one more symbol,
   `<module>:<import>`, reached with any symbol of that module;
2. from the entry points, every symbol a reached one names is reached too: a name of its module, a
   name imported from another labkit module (`from ..grpo import losses` then `losses.kl_exact`), a
   late import inside a function; a labkit module used whole (passed as a value, `getattr` on it)
   brings all of its symbols.  Names that leave the package (torch, the standard library) are part
   of the symbol's digest as what they resolve to ("torch.nn.functional");
3. each reached symbol is digested as `ast.dump` of its definition with every docstring removed
   (line numbers, comments and layout are not in the tree), every name that leaves it written as what
   it stands for and the package's own imports dropped (`Sources.canonical`: importing a module under
   another name changes nothing), and the step's fingerprint is the table {"module:symbol": digest}.

So a comment, a docstring, a re-wrapped line or a function no step uses changes no fingerprint, and
a changed statement in a reached function changes exactly the steps that reach it.  Nothing here
knows which steps exist: the step graph is `labkit.steps`, on top of the package.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "labkit"
IMPORT_TIME = "<import>"  # the symbol of the statements a module runs when it is imported
DIGEST_CHARS = 16  # 64 bits a symbol: the table names what changed, the step's digest covers the table


def strip_docstrings(tree: ast.AST) -> ast.AST:
    """`tree` without the docstring of any module, class or function in it (the tree is changed)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


@dataclass
class Module:
    """One parsed module: its symbols, the statements it runs on import, and its imports' bindings."""

    name: str
    is_package: bool
    symbols: dict[str, list[ast.stmt]] = field(default_factory=dict)
    import_time: list[ast.stmt] = field(default_factory=list)
    bindings: dict[str, tuple] = field(default_factory=dict)  # name -> ("module", m) | ("symbol", m, n) | ("outside", dotted)


class Sources:
    """The package's modules as one snapshot (a folder, or a git commit), parsed once.

    texts: {dotted module name: source text}; packages are named by their __init__'s module name."""

    def __init__(self, texts: dict[str, str], packages: set[str]):
        self.texts = texts
        self._references: dict[tuple[str, str], tuple] = {}  # what each symbol uses, found once (steps share most)
        self._digests: dict[tuple[str, str], str] = {}
        self._lines: dict[str, list[str]] = {}
        self.modules: dict[str, Module] = {}
        for name, text in texts.items():
            self.modules[name] = self._parse(name, text, name in packages)

    # -- reading the snapshot -------------------------------------------------------------------------

    @classmethod
    def in_folder(cls, root: str | Path) -> "Sources":
        """The package as it is under `root` (the folder that holds labkit/)."""
        root = Path(root)
        texts, packages = {}, set()
        for path in sorted((root / PACKAGE).rglob("*.py")):
            name, is_package = _module_name(path.relative_to(root).as_posix())
            texts[name] = path.read_text(encoding="utf-8")
            if is_package:
                packages.add(name)
        return cls(texts, packages)

    @classmethod
    def at_commit(cls, repo: str | Path, commit: str) -> "Sources":
        """The package as git commit `commit` of the repository at `repo` holds it."""
        listing = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", commit, PACKAGE + "/"],
                                 capture_output=True, text=True, check=True).stdout.split()
        texts, packages = {}, set()
        for rel in listing:
            if rel.endswith(".py"):
                name, is_package = _module_name(rel)
                texts[name] = git_show(repo, commit, rel).decode("utf-8")
                if is_package:
                    packages.add(name)
        return cls(texts, packages)

    # -- parsing ------------------------------------------------------------------------------------

    def _parse(self, name: str, text: str, is_package: bool) -> Module:
        module = Module(name, is_package)
        for stmt in ast.parse(text).body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                    module.import_time.append(stmt)  # changes what the module's code means
                else:
                    module.bindings.update(self._bindings(module, stmt))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                module.symbols.setdefault(stmt.name, []).append(stmt)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                for target in names:
                    module.symbols.setdefault(target, []).append(stmt)
                if not names:  # e.g. `obj.attr = value` at module level: it runs on import
                    module.import_time.append(stmt)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                continue  # the module's docstring (or a bare string): prose
            else:  # if / try / for / a call at module level: it runs on import
                module.import_time.append(stmt)
                for node in ast.walk(stmt):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        module.bindings.update(self._bindings(module, node))
                    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        module.symbols.setdefault(node.name, []).append(stmt)
        return module

    def _bindings(self, module: Module, stmt: ast.Import | ast.ImportFrom) -> dict[str, tuple]:
        """The names an import statement binds, each to a labkit module, a labkit symbol or an outside name."""
        out = {}
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    out[alias.asname] = self._module_or_outside(alias.name)
                else:  # `import a.b` binds a
                    top = alias.name.split(".")[0]
                    out[top] = self._module_or_outside(top)
            return out
        if stmt.level:
            package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
            base = package[: len(package) - stmt.level + 1]
            stem = ".".join(base + ([stmt.module] if stmt.module else []))
        else:
            stem = stmt.module or ""
        for alias in stmt.names:
            local = alias.asname or alias.name
            if stem != PACKAGE and not stem.startswith(PACKAGE + "."):
                out[local] = ("outside", f"{stem}.{alias.name}")
            elif f"{stem}.{alias.name}" in self.texts:
                out[local] = ("module", f"{stem}.{alias.name}")
            else:
                out[local] = ("symbol", stem, alias.name)
        return out

    def _module_or_outside(self, dotted: str) -> tuple:
        return ("module", dotted) if dotted in self.texts else ("outside", dotted)

    # -- reaching -----------------------------------------------------------------------------------

    def resolve_symbol(self, module: str, name: str, seen: frozenset = frozenset()) -> list[tuple[str, str]]:
        """The symbols `module.name` stands for, following re-exports; a module stands for all of its own."""
        if (module, name) in seen or module not in self.modules:
            return []
        mod = self.modules[module]
        if name in mod.symbols:
            return [(module, name)]
        if name in mod.bindings:
            return self._binding_targets(mod.bindings[name], seen | {(module, name)})
        if f"{module}.{name}" in self.modules:
            return self.whole_module(f"{module}.{name}")
        return self.whole_module(module)  # an attribute we cannot place: count the whole module

    def _binding_targets(self, binding: tuple, seen: frozenset = frozenset()) -> list[tuple[str, str]]:
        if binding[0] == "module":
            return self.whole_module(binding[1])
        if binding[0] == "symbol":
            return self.resolve_symbol(binding[1], binding[2], seen)
        return []

    def whole_module(self, module: str) -> list[tuple[str, str]]:
        mod = self.modules[module]
        return [(module, IMPORT_TIME)] + [(module, name) for name in mod.symbols]

    def nodes_of(self, module: str, name: str) -> list[ast.stmt]:
        mod = self.modules[module]
        return mod.import_time if name == IMPORT_TIME else mod.symbols[name]

    def references(self, module: str, name: str) -> tuple[list[tuple[str, str]], list[str]]:
        """What symbol `module:name` uses: (labkit symbols it reaches, outside names it resolves to)."""
        mod = self.modules[module]
        nodes = self.nodes_of(module, name)
        local = self._local_bindings(mod, nodes)
        reached: list[tuple[str, str]] = []
        outside: set[str] = set()
        for node in nodes:
            for inner, is_attribute, _ in _global_uses(node):
                if is_attribute:  # `root.a.b` whose root is not a local name
                    root, attrs = inner
                    binding = local.get(root) if root not in mod.symbols else None
                    if binding is not None and binding[0] == "module":
                        reached += self._through_module(binding[1], attrs)
                        continue
                    inner = root
                if inner in mod.symbols:
                    if inner != name:
                        reached.append((module, inner))
                elif inner in local:
                    binding = local[inner]
                    if binding[0] == "outside":
                        outside.add(f"{inner}={binding[1]}")
                    else:
                        reached += self._binding_targets(binding)
        return reached, sorted(outside)

    def _local_bindings(self, mod: Module, nodes: list[ast.AST]) -> dict[str, tuple]:
        """The module's import bindings, and those of the late imports inside `nodes` (a function's
        `from ..lab import cache`)."""
        local = dict(mod.bindings)
        for node in nodes:
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)) and not (
                        isinstance(inner, ast.ImportFrom) and inner.module == "__future__"):
                    local.update(self._bindings(mod, inner))
        return local

    def canonical(self, module: str, name: str) -> list[str]:
        """`ast.dump` of the definition of `module:name` as the digest sees it: docstrings removed, every
        name that leaves the definition written as what it stands for ("labkit.grpo.loop" for a module
        imported as `grpo`, "labkit.grpo.losses:kl_exact" for `kl_exact`, "outside:torch.nn" for `nn`),
        and the package's own imports dropped (the names say where they lead).  So importing a module
        under another name, or a symbol from where it is re-exported, changes no digest."""
        mod = self.modules[module]
        copies = [strip_docstrings(self._fresh_copy(module, node)) for node in self.nodes_of(module, name)]
        local = self._local_bindings(mod, copies)
        replace: dict[int, str] = {}  # id of a node -> the name that stands for it
        for node in copies:
            for inner, is_attribute, where in _global_uses(node):
                root, name_node = (inner[0], where[0]) if is_attribute else (inner, where)
                if root in mod.symbols:
                    replace[id(name_node)] = f"{module}:{root}"
                    continue
                binding = local.get(root)
                if binding is None:
                    continue  # a builtin
                if binding[0] == "module" and is_attribute:  # `losses.kl_exact`: the chain becomes its symbol
                    target, used = self._chain_target(binding[1], inner[1])
                    replace[id(where[1][used - 1] if used else name_node)] = target
                elif binding[0] == "module":
                    replace[id(name_node)] = binding[1]
                elif binding[0] == "symbol":
                    targets = self.resolve_symbol(binding[1], binding[2])
                    replace[id(name_node)] = (f"{targets[0][0]}:{targets[0][1]}" if len(targets) == 1
                                              else f"{binding[1]}:{binding[2]}")
                else:
                    replace[id(name_node)] = f"outside:{binding[1]}"
        named = [_Rename(replace).visit(node) for node in copies]
        return [ast.dump(_drop_package_imports(node), include_attributes=False) for node in named]

    def _fresh_copy(self, module: str, node: ast.stmt) -> ast.stmt:
        """A new tree of the top-level statement `node`, parsed again from its lines (much faster than a
        deep copy; the same tree but for positions, which no digest reads)."""
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if module not in self._lines:
            self._lines[module] = self.texts[module].splitlines(keepends=True)
        lines = self._lines[module][start - 1: node.end_lineno]
        try:
            body = ast.parse("".join(lines)).body
        except SyntaxError:
            body = []
        return body[0] if len(body) == 1 else _copy(node)  # two statements on one line: copy the node itself

    def _walk_chain(self, module: str, attrs: list[str]) -> tuple[str, int]:
        """Follow `module.a.b...` through submodules and re-exported modules: (the last module reached,
        how many attributes that took); the attribute after them, if any, names a symbol of that module."""
        for i, attr in enumerate(attrs):
            mod = self.modules[module]
            binding = mod.bindings.get(attr)
            if f"{module}.{attr}" in self.modules and attr not in mod.symbols:
                module = f"{module}.{attr}"
            elif binding is not None and binding[0] == "module" and attr not in mod.symbols:
                module = binding[1]
            else:
                return module, i
        return module, len(attrs)

    def _chain_target(self, module: str, attrs: list[str]) -> tuple[str, int]:
        """(what `module.a.b...` stands for, how many attributes that took): a symbol "m:n", or a module."""
        module, used = self._walk_chain(module, attrs)
        if used == len(attrs):
            return module, used
        targets = self.resolve_symbol(module, attrs[used])
        one = len(targets) == 1 and targets[0][1] != IMPORT_TIME
        return (f"{targets[0][0]}:{targets[0][1]}" if one else f"{module}:{attrs[used]}"), used + 1

    def _through_module(self, module: str, attrs: list[str]) -> list[tuple[str, str]]:
        """`module.a.b...`: the symbol the chain lands on, or every symbol of the module it ends at (a
        module used as a value)."""
        module, used = self._walk_chain(module, attrs)
        return self.whole_module(module) if used == len(attrs) else self.resolve_symbol(module, attrs[used])

    def reach(self, entries: list[str]) -> dict[str, list[str]]:
        """{"module:symbol": outside names it uses} for every symbol reachable from `entries`
        ("labkit.grpo.loop:run_grpo"), each module's import-time statements with it."""
        todo = []
        for entry in entries:
            module, _, name = entry.partition(":")
            if module not in self.modules or not (name in self.modules[module].symbols or name in self.modules[module].bindings):
                raise ValueError(f"entry point {entry!r}: no such definition in the package")
            todo += self.resolve_symbol(module, name)
        seen: dict[tuple[str, str], list[str]] = {}
        while todo:
            key = todo.pop()
            if key in seen:
                continue
            if key not in self._references:
                self._references[key] = self.references(*key)
            reached, outside = self._references[key]
            seen[key] = outside
            todo += reached
            todo.append((key[0], IMPORT_TIME))
        return {f"{m}:{n}": seen[(m, n)] for m, n in sorted(seen)}

    def fingerprint(self, entries: list[str]) -> dict[str, str]:
        """{"module:symbol": digest} of every symbol reachable from `entries` (see the module's docstring)."""
        out = {}
        for key, outside in self.reach(entries).items():
            module, _, name = key.partition(":")
            if (module, name) not in self._digests:
                text = json.dumps({"code": self.canonical(module, name), "outside": outside})
                self._digests[(module, name)] = hashlib.sha256(text.encode("utf-8")).hexdigest()[:DIGEST_CHARS]
            out[key] = self._digests[(module, name)]
        return out

    def files_of(self, keys) -> set[str]:
        """The source files (relative to the repository) that hold these "module:symbol" keys."""
        out = set()
        for key in keys:
            module = key.partition(":")[0]
            path = module.replace(".", "/") + ("/__init__.py" if self.modules[module].is_package else ".py")
            out.add(path)
        return out


def digest_of(table: dict[str, str]) -> str:
    """One SHA-256 for a fingerprint table (what a run's folder name may carry)."""
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode("utf-8")).hexdigest()


def changed(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The symbols whose digest differs, or that one side reaches and the other does not."""
    return sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))


def git_show(repo: str | Path, commit: str, rel: str) -> bytes:
    """The bytes of file `rel` at `commit` (CalledProcessError when the commit lacks it)."""
    return subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{rel}"], capture_output=True, check=True).stdout


def _module_name(rel: str) -> tuple[str, bool]:
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _global_uses(node: ast.AST):
    """The names `node` reads from its module's scope, as Python scopes them: a name a function assigns
    (an argument, an assignment, a loop target, a nested def) is that function's own and is skipped.
    Yields (name, False, Name node), or ((root, [attr, ...]), True, (root's Name node, [the chain's
    Attribute nodes, root outwards])) for an attribute chain `root.attr...`."""
    out: list = []
    _visit(node, [], out)
    return out


def _visit(node: ast.AST, scopes: list[set[str]], out: list) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = node.args
        for default in [*args.defaults, *[d for d in args.kw_defaults if d is not None]]:
            _visit(default, scopes, out)
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                _visit(decorator, scopes, out)
            for annotation in [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                                      args.vararg, args.kwarg) if a is not None and a.annotation]:
                _visit(annotation, scopes, out)
            if node.returns is not None:
                _visit(node.returns, scopes, out)
        body = node.body if isinstance(node.body, list) else [node.body]
        own = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
        own |= _assigned(body)
        for stmt in body:
            _visit(stmt, scopes + [own], out)
        return
    if isinstance(node, ast.ClassDef):
        for part in (*node.decorator_list, *node.bases, *node.keywords):
            _visit(part, scopes, out)
        for stmt in node.body:  # a class body reads the module's names; its methods do not see its own
            _visit(stmt, scopes, out)
        return
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        own = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        for child in ast.iter_child_nodes(node):
            _visit(child, scopes + [own], out)
        return
    if isinstance(node, ast.Attribute):
        chain = []
        root = node
        while isinstance(root, ast.Attribute):
            chain.append(root)
            root = root.value
        if isinstance(root, ast.Name):
            if not any(root.id in scope for scope in scopes):
                out.append(((root.id, [a.attr for a in chain[::-1]]), True, (root, chain[::-1])))
            return
        _visit(root, scopes, out)
        return
    if isinstance(node, ast.Name):
        if not any(node.id in scope for scope in scopes):
            out.append((node.id, False, node))
        return
    for child in ast.iter_child_nodes(node):
        _visit(child, scopes, out)


def _assigned(body: list[ast.stmt]) -> set[str]:
    """The names a function body binds itself (not inside nested functions or classes), less its
    `global` ones and the names its imports bind (those are read through the import)."""
    names, declared_global = set(), set()
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Global):
            declared_global.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        todo.extend(ast.iter_child_nodes(node))
    return names - declared_global


class _Rename(ast.NodeTransformer):
    """Replace the nodes named by id with a Name of what they stand for."""

    def __init__(self, replace: dict[int, str]):
        self.replace = replace

    def visit(self, node):
        if id(node) in self.replace:
            return ast.Name(id=self.replace[id(node)], ctx=getattr(node, "ctx", ast.Load()))
        return super().visit(node)


def _drop_package_imports(node: ast.AST) -> ast.AST:
    """`node` without the imports of the package's own modules (relative, or of labkit), in place."""
    for inner in ast.walk(node):
        for field_name in ("body", "orelse", "finalbody"):
            body = getattr(inner, field_name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.AST):
                kept = [stmt for stmt in body if not _is_package_import(stmt)]
                if len(kept) != len(body):
                    setattr(inner, field_name, kept or ([ast.Pass()] if field_name == "body" else []))
    return node


def _is_package_import(stmt: ast.AST) -> bool:
    if isinstance(stmt, ast.ImportFrom):
        return bool(stmt.level) or (stmt.module or "").split(".")[0] == PACKAGE
    if isinstance(stmt, ast.Import):
        return all(alias.name.split(".")[0] == PACKAGE for alias in stmt.names)
    return False


def _copy(node: ast.AST) -> ast.AST:
    import copy

    return copy.deepcopy(node)
