"""Import graph of the project's packages, read from source (ast; nothing is imported), and its cycles.

    python -m sao_jax.devtools.imports [ROOT]     prints the file and package cycles (exit 1 if any)

Every `import` counts, wherever it stands: a lazy import inside a function or one under
`if TYPE_CHECKING:` breaks a cycle at run time but not in the design, which is what this checks.
An import names the deepest project module it reaches: `from pkg import mod` depends on
`pkg.mod` when that is a module (Python imports the submodule; it reads nothing from
`pkg/__init__.py`), `from pkg.mod import name` on `pkg.mod`, `import a.b.c` on the longest
prefix that is a module. The packages above the imported module (whose `__init__` runs first)
are not counted: otherwise every package whose `__init__` re-exports its parts would be a
cycle.

Package level: a module's unit is the child of its top-level package that holds it
(`sao_jax.train.learner` -> `sao_jax.train`; `atdp_io.loader` -> itself); a package cycle is
a cycle between units.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

PACKAGES = ("sao_jax", "atdp_io", "serving", "experiments")


def find_modules(root: Path, packages: Sequence[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> source file, for every `.py` under `root/<package>`."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    if not modules:
        raise ValueError(f"no Python modules under {root} for packages {list(packages)}")
    return modules


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of dotted `name` that is a project module (None: not ours)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> set[str]:
    """The project modules that `module` (source `path`) imports, itself left out."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as e:
        raise ValueError(f"{path}: cannot parse: {e}") from e
    # the package a relative import starts from: the module's own for an __init__
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [_resolve(alias.name, modules) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond the top")
                anchor = parts[: len(parts) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [
                f"{base}.{alias.name}"
                if f"{base}.{alias.name}" in modules
                else _resolve(base, modules)
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t is not None and t != module)
    return found


def import_graph(root: Path, packages: Sequence[str] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the project modules it imports (every module of `packages` is a key)."""
    modules = find_modules(root, packages)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def unit_of(module: str) -> str:
    """The package-level unit of `module`: its top-level package's child that holds it."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The graph between units (`unit_of`); imports inside one unit are left out."""
    units: dict[str, set[str]] = {unit_of(m): set() for m in graph}
    for module, targets in graph.items():
        units[unit_of(module)].update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    return units


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (sorted), largest first.

    Iterative Tarjan (no recursion limit on deep graphs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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
                    if len(component) > 1:
                        components.append(sorted(component))
    components.sort(key=lambda c: (-len(c), c))
    return components


def shortest_cycle(component: Sequence[str], graph: Mapping[str, Iterable[str]]) -> list[str]:
    """A shortest cycle from the component's first member back to it (a path to read)."""
    members, start = set(component), component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1]
                if nxt in members and nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise ValueError(f"{component} is not a cycle of the graph")


def describe(component: Sequence[str], graph: Mapping[str, Iterable[str]]) -> str:
    """`a -> b -> a`, plus the component's other members when the shortest cycle through its
    first member leaves some out."""
    cycle = shortest_cycle(component, graph)
    text = " -> ".join([*cycle, cycle[0]])
    others = sorted(set(component) - set(cycle))
    return f"{text} (in a cycle with {', '.join(others)} too)" if others else text


def report(root: Path, packages: Sequence[str] = PACKAGES) -> tuple[list[str], list[str]]:
    """(file cycles, package cycles) under `root`, each described as `a -> b -> a`."""
    graph = import_graph(root, packages)
    units = package_graph(graph)
    return (
        [describe(c, graph) for c in cycles(graph)],
        [describe(c, units) for c in cycles(units)],
    )


def main(argv: Sequence[str] | None = None, packages: Sequence[str] = PACKAGES) -> int:
    """Prints the cycles under ROOT (the first argument; default: the working directory)."""
    args = sys.argv[1:] if argv is None else list(argv)
    root = Path(args[0]) if args else Path.cwd()
    files, units = report(root, packages)
    for title, found in (("file cycles", files), ("package cycles", units)):
        print(f"{title}: {len(found)}")
        for line in found:
            print(f"  {line}")
    return 1 if files or units else 0


if __name__ == "__main__":
    sys.exit(main())
