"""The package's import graph: no circles, no hidden imports, no arrow back up the layers.

How the graph is measured (static, with `ast`; nothing is imported):

* Nodes are the modules of ``minimind_trl`` (every ``.py`` file inside a folder with an
  ``__init__.py``; a package is its ``__init__``). ``eval/tool_math_metric/`` is loaded by
  `evaluate` from a path, not imported, and is not a node.
* Every ``import`` / ``from ... import`` statement counts, wherever it stands: module level,
  ``if`` / ``try`` blocks, ``TYPE_CHECKING`` blocks and function bodies. Relative imports are
  resolved against the importing module; ``from pkg import name`` is an arrow to ``pkg.name``
  when ``name`` is a submodule of ``pkg`` and to ``pkg`` otherwise. ``importlib.import_module``
  with a literal string counts too (the CLI dispatcher's table of command modules is a dict of
  strings, so the dispatcher's arrows are not seen, which is the point of a dispatcher).
* Importing ``a.b.c`` runs ``a/b/__init__.py`` first, so an arrow to ``a.b.c`` from outside the
  package ``a.b`` is also an arrow to ``a.b``. From inside ``a.b`` it is not: that package is
  already being imported. The root package ``minimind_trl`` is never such an arrow target (every
  module is inside it).

The checks:

(a) no import circles: Tarjan's strongly connected components over the module graph; every
    component with more than one module (or a module importing itself) is a circle;
(b) no function-local import of a ``minimind_trl`` module, except in the top-level command
    dispatcher ``minimind_trl/cli.py`` (house rule: a module's dependencies are readable at its
    top; a lazy import that hides a circle is a circle); the same for any other module
    (third-party, standard library);
(c) no arrow runs back up ``LAYERS`` below: an arrow from a module of layer i to a
    module of layer j > i (counted once per pair of layers, with the module arrows listed);
(d) every module is in a layer (a new module is placed in the order by whoever adds it), and no
    module imports an area's command module (what puts those in the top layer).

The layer order (lowest first), from the real dependencies of the finished restructuring:

0. ground floor -- leaf modules anyone may import: ``conversation`` (the conversation schema),
   ``fsio`` (atomic files, JSONL), ``metric_names``, ``plugins`` (the leaf loader), ``objectives``
   (pure torch formulas), ``subprocess_runner`` (child ``minimind-trl`` commands), ``run_folder``
   (a training run folder's layout, which eval, sweep and demo read), ``targets`` (the one rule
   every command checks its output target with);
1. ``tokenization`` -- tokenizer building, loading and the chat template;
2. ``modeling`` -- the model, its config, checkpoints (with the tokenizer each is loaded with),
   exports and the aux-loss wrapper for TRL's fused head;
3. ``engine`` -- the decode loop over one KV cache, per-row sampling (token ids only: no tools);
4. ``envs`` -- tools, the tool registry, the token / observation protocol, rollouts;
5. ``data`` -- task generation (needs the tools' constants: ``EXCHANGE_RATES``, ``UNIT_FACTORS``),
   gold trajectories (run the registry), splits and manifests, the default tokenizer's corpus
   (renders gold trajectories with the tokenizer package);
6. ``rewards`` -- the verifier and reward functions (judge completions against the run's tools);
7. ``trainer`` -- recipes, the GRPO and SFT trainers, run set-up;
8. ``eval`` -- frozen evaluation of a run's checkpoints, statistics, reports, figures;
9. ``sweep``, ``demo`` and ``push`` -- drive training and evaluation as subprocesses; upload to the Hub;
10. the dispatcher ``cli``, the root ``__init__`` and every area's command module ``<area>.cli``
   (``data.cli``, ``modeling.cli``, ...): a command front-end sits above everything it drives,
   wherever its file lives, and no module imports one (checked below).

``envs`` sits below ``data`` because data's generator and gold trajectories need the tools
(constants and the registry) while the environment and the protocol need only the conversation
schema, which lives on the ground floor. ``tokenization`` sits below both: it renders
conversations and needs nothing from tasks or tools (the default corpus, which does, lives in
``data.tokenizer_corpus``), and below ``modeling``, whose checkpoint loader picks the tokenizer a
checkpoint is evaluated or exported with. With that order no arrow needs to run up, and none may
(issue 27: a re-export kept at an old path while its importers move would be one).

Run ``python tests/test_import_graph.py`` for the whole report (circles, hidden imports, arrows up).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "minimind_trl"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

# The one module allowed to import modules of the package inside functions (lazily, per command).
DISPATCHER = f"{PACKAGE}.cli"

# Lowest first; each entry lists module-name prefixes relative to the package ("" = the root
# __init__). A module belongs to the layer of its longest matching prefix. Names that do not
# exist yet (modules other restructuring steps create) simply match nothing.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ground floor", ("conversation", "fsio", "metric_names", "plugins", "objectives", "subprocess_runner",
                      "run_folder", "targets")),
    ("tokenization", ("tokenization",)),
    ("modeling", ("modeling",)),
    ("engine", ("engine",)),
    ("envs", ("envs",)),
    ("data", ("data",)),
    ("rewards", ("rewards",)),
    ("trainer", ("trainer",)),
    ("eval", ("eval",)),
    ("drivers", ("sweep", "demo", "push")),
    ("cli", ("cli", "")),
]

MAX_UPWARD_ARROWS = 0


@dataclass(frozen=True)
class ImportArrow:
    """One import statement's arrow: `source` imports `target` (module names) at `line`."""

    source: str
    target: str
    line: int
    function_local: bool
    file: str  # the source's file, relative to the repository root
    implicit: bool = False  # the package __init__ run by importing one of its submodules

    def where(self) -> str:
        return f"{self.file}:{self.line}"


def discover_modules(package_dir: Path = PACKAGE_DIR, package: str = PACKAGE) -> dict[str, Path]:
    """Module name -> file, for every module reachable through packages with an ``__init__.py``."""
    modules: dict[str, Path] = {}

    def walk(folder: Path, name: str) -> None:
        modules[name] = folder / "__init__.py"
        for path in sorted(folder.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                walk(path, f"{name}.{path.name}")
            elif path.suffix == ".py" and path.name != "__init__.py":
                modules[f"{name}.{path.stem}"] = path

    walk(package_dir, package)
    return modules


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _resolve_relative(module: str, level: int, target: str | None, modules: dict[str, Path]) -> str:
    base = module if _is_package(module, modules) else module.rpartition(".")[0]
    for _ in range(level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{target}" if target else base


class _ImportCollector(ast.NodeVisitor):
    """Collects (imported module name, alias names, line, inside a function) for one file."""

    def __init__(self, module: str, modules: dict[str, Path]):
        self.module = module
        self.modules = modules
        self.depth = 0  # function nesting
        self.found: list[tuple[str, list[str], int, bool]] = []

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, [], node.lineno, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            target = _resolve_relative(self.module, node.level, node.module, self.modules)
        else:
            target = node.module or ""
        self.found.append((target, [alias.name for alias in node.names], node.lineno, self.depth > 0))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if (
            name == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            self.found.append((node.args[0].value, [], node.lineno, self.depth > 0))
        self.generic_visit(node)


def _known_module(name: str, modules: dict[str, Path]) -> str | None:
    """`name` or its longest prefix that is a module of the package (``pkg.mod.attr`` -> ``pkg.mod``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_arrows(modules: dict[str, Path] | None = None) -> list[ImportArrow]:
    """Every arrow between modules of the package (see the module docstring for what counts)."""
    modules = discover_modules() if modules is None else modules
    root = min(modules, key=len)
    arrows: list[ImportArrow] = []
    for module, path in modules.items():
        collector = _ImportCollector(module, modules)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        file = path.relative_to(modules[root].parents[1]).as_posix()
        for target, names, line, local in collector.found:
            if not (target == root or target.startswith(root + ".")):
                continue
            targets = []
            submodules = [f"{target}.{name}" for name in names if f"{target}.{name}" in modules]
            if len(submodules) < len(names) or not names:
                known = _known_module(target, modules)
                if known is not None and known != root:  # the root package runs before any module
                    targets.append(known)
            targets.extend(submodules)
            for resolved in targets:
                arrows.append(ImportArrow(module, resolved, line, local, file))
                # importing pkg.sub runs pkg/__init__ first, unless `module` is inside pkg already
                parts = resolved.split(".")
                for cut in range(2, len(parts)):
                    parent = ".".join(parts[:cut])
                    if parent != resolved and not (module == parent or module.startswith(parent + ".")):
                        arrows.append(ImportArrow(module, parent, line, local, file, implicit=True))
    return [arrow for arrow in arrows if arrow.source != arrow.target or not _is_package(arrow.source, modules)]


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components in reverse topological order, members sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def _graph(arrows: list[ImportArrow], modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for arrow in arrows:
        graph[arrow.source].add(arrow.target)
    return graph


def import_circles(arrows: list[ImportArrow], modules: dict[str, Path]) -> list[str]:
    """One line per circle: its members and the import statements that close it."""
    graph = _graph(arrows, modules)
    lines = []
    for component in strongly_connected_components(graph):
        if len(component) == 1 and component[0] not in graph[component[0]]:
            continue
        members = set(component)
        inside = sorted(
            {f"{a.where()} -> {a.target}{' (package init)' if a.implicit else ''}"
             for a in arrows if a.source in members and a.target in members}
        )
        lines.append(f"circle of {len(component)}: {', '.join(component)}\n    " + "\n    ".join(inside))
    return lines


def hidden_imports(arrows: list[ImportArrow]) -> list[str]:
    """Function-local imports of package modules outside the dispatcher."""
    return sorted(
        {f"{a.where()} imports {a.target}" for a in arrows if a.function_local and not a.implicit
         and a.source != DISPATCHER}
    )


def is_command_module(module: str) -> bool:
    """An area's command module (``<area>.cli``): run by the dispatcher, imported by no module."""
    return module.endswith(".cli") and module != DISPATCHER


def hidden_outside_imports(modules: dict[str, Path] | None = None) -> list[str]:
    """Function-local imports of anything else (third-party or standard library) outside the dispatcher."""
    modules = discover_modules() if modules is None else modules
    root = min(modules, key=len)
    found = []
    for module, path in modules.items():
        if module == DISPATCHER:
            continue
        collector = _ImportCollector(module, modules)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        file = path.relative_to(modules[root].parents[1]).as_posix()
        found += [f"{file}:{line} imports {target}" for target, _, line, local in collector.found
                  if local and not (target == root or target.startswith(root + "."))]
    return sorted(found)


def layer_of(module: str) -> int | None:
    """The position in LAYERS of `module` (its longest matching prefix), None when no entry matches."""
    if is_command_module(module):
        return len(LAYERS) - 1
    relative = module[len(PACKAGE) + 1:] if module != PACKAGE else ""
    best, best_length = None, -1
    for position, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = relative == prefix or (prefix and relative.startswith(prefix + "."))
            if matches and len(prefix) > best_length:
                best, best_length = position, len(prefix)
    return best


def upward_arrows(arrows: list[ImportArrow]) -> dict[tuple[str, str], list[str]]:
    """(lower layer, higher layer) -> the module arrows that run up from the one to the other."""
    found: dict[tuple[str, str], set[str]] = defaultdict(set)
    for arrow in arrows:
        low, high = layer_of(arrow.source), layer_of(arrow.target)
        if low is not None and high is not None and high > low:
            found[(LAYERS[low][0], LAYERS[high][0])].add(f"{arrow.where()} -> {arrow.target}")
    return {pair: sorted(lines) for pair, lines in sorted(found.items())}


def _format_upward(found: dict[tuple[str, str], list[str]]) -> str:
    return "\n".join(f"{low} -> {high}:\n    " + "\n    ".join(lines) for (low, high), lines in found.items())


# ---------------------------------------------------------------- tests


def _measured():
    modules = discover_modules()
    return modules, import_arrows(modules)


def test_collector_sees_local_conditional_relative_and_submodule_imports(tmp_path):
    """The measurement itself: every import form is an arrow, resolved to the right module."""
    pkg = tmp_path / "minimind_trl"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .leaf import X\n")
    (pkg / "sub" / "leaf.py").write_text("X = 1\n")
    (pkg / "top.py").write_text(
        "import importlib\n"
        "from minimind_trl import sub\n"  # line 2: a submodule named in a from-import
        "try:\n    from minimind_trl.sub.leaf import X\nexcept ImportError:\n    pass\n"  # line 4
        "def f():\n    from .sub import leaf\n"  # line 8: local, relative, submodule
        "    import json\n"  # line 9: a function-local standard-library import
        "    return importlib.import_module('minimind_trl.other')\n"  # not a module: ignored
    )
    (pkg / "other_user.py").write_text("from minimind_trl.top import f\n")
    modules = discover_modules(pkg, "minimind_trl")
    arrows = import_arrows(modules)
    seen = {(a.source, a.target, a.line, a.function_local, a.implicit) for a in arrows}
    assert ("minimind_trl.top", "minimind_trl.sub", 2, False, False) in seen
    assert ("minimind_trl.top", "minimind_trl.sub.leaf", 4, False, False) in seen
    assert ("minimind_trl.top", "minimind_trl.sub", 4, False, True) in seen  # package init runs
    assert ("minimind_trl.top", "minimind_trl.sub.leaf", 8, True, False) in seen
    assert ("minimind_trl.sub", "minimind_trl.sub.leaf", 1, False, False) in seen
    assert not any(a.target == "minimind_trl" for a in arrows)  # the root package is no arrow target
    assert hidden_imports(arrows) == ["minimind_trl/top.py:8 imports minimind_trl.sub.leaf"]
    assert hidden_outside_imports(modules) == ["minimind_trl/top.py:9 imports json"]
    assert import_circles(arrows, modules) == []


def test_a_circle_closed_through_a_package_init_is_reported(tmp_path):
    """envs.tools -> data.formats runs data/__init__, which imports data.gold -> envs.tools: a circle."""
    pkg = tmp_path / "minimind_trl"
    for folder in (pkg, pkg / "envs", pkg / "data"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text("from minimind_trl.data.gold import gold\n")
    (pkg / "data" / "gold.py").write_text("from minimind_trl.envs.tools import TOOLS\ngold = TOOLS\n")
    (pkg / "data" / "formats.py").write_text("FORMAT = 1\n")
    (pkg / "envs" / "tools.py").write_text("from minimind_trl.data.formats import FORMAT\nTOOLS = FORMAT\n")
    modules = discover_modules(pkg, "minimind_trl")
    (circle,) = import_circles(import_arrows(modules), modules)
    assert circle.startswith("circle of 3: minimind_trl.data, minimind_trl.data.gold, minimind_trl.envs.tools")
    assert "minimind_trl/envs/tools.py:1 -> minimind_trl.data (package init)" in circle


def test_tarjan_finds_every_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}, "f": set()}
    components = strongly_connected_components(graph)
    assert sorted(components) == [["a", "b", "c"], ["d"], ["e"], ["f"]]


def unlayered_modules(modules: dict[str, Path]) -> list[str]:
    return sorted(module for module in modules if layer_of(module) is None)


def test_every_module_has_a_layer():
    missing = unlayered_modules(discover_modules())
    assert not missing, "modules in no layer of LAYERS (add them to the documented order): " + ", ".join(missing)


def test_no_import_circles():
    modules, arrows = _measured()
    circles = import_circles(arrows, modules)
    assert not circles, "import circles between modules:\n" + "\n".join(circles)


def test_no_function_local_imports_of_package_modules():
    _, arrows = _measured()
    hidden = hidden_imports(arrows)
    assert not hidden, (
        f"function-local imports of {PACKAGE} modules (move them to the module top; only "
        f"{DISPATCHER} imports its commands lazily):\n" + "\n".join(hidden)
    )


def test_no_function_local_imports_of_other_modules():
    """The same house rule for third-party and standard-library modules: every dependency at the top."""
    hidden = hidden_outside_imports()
    assert not hidden, "function-local imports (move them to the module top):\n" + "\n".join(hidden)


def test_command_modules_are_imported_by_no_module():
    """Each area's ``cli.py`` sits in the top layer with the dispatcher; that holds only while no
    module imports one (the dispatcher names them as strings)."""
    _, arrows = _measured()
    importers = sorted({f"{a.where()} -> {a.target}" for a in arrows if is_command_module(a.target)})
    assert not importers, "command modules imported by other modules:\n" + "\n".join(importers)


def test_at_most_one_arrow_runs_back_up_the_layers():
    _, arrows = _measured()
    found = upward_arrows(arrows)
    assert len(found) <= MAX_UPWARD_ARROWS, (
        f"{len(found)} arrows run back up the layer order (at most {MAX_UPWARD_ARROWS}; "
        f"order: {' < '.join(name for name, _ in LAYERS)}):\n" + _format_upward(found)
    )


if __name__ == "__main__":
    measured_modules, measured_arrows = _measured()
    upward = upward_arrows(measured_arrows)
    report = {
        "modules in no layer": unlayered_modules(measured_modules),
        "circles": import_circles(measured_arrows, measured_modules),
        "function-local imports": hidden_imports(measured_arrows),
        "function-local imports (not the package)": hidden_outside_imports(measured_modules),
        "command modules imported": sorted(
            {f"{a.where()} -> {a.target}" for a in measured_arrows if is_command_module(a.target)}
        ),
        f"arrows up (at most {MAX_UPWARD_ARROWS})": [_format_upward({pair: lines}) for pair, lines in upward.items()],
    }
    for title, lines in report.items():
        print(f"== {title}: {len(lines)}")
        for line in lines:
            print(line)
    sys.exit(1 if any(lines for title, lines in report.items() if not title.startswith("arrows up"))
             or len(upward) > MAX_UPWARD_ARROWS else 0)
