"""The shape of the tree: the layer table of docs/architecture.md checked against the imports.

    python scripts/layout_report.py          # the report; exit 1 when a target is missed

Prints modules directly in ``smgrl/`` (target <= 6), import cycles counting function-level imports
(target 0), modules over 700 lines outside tests and generated code, non-CLI modules that import
CLI code (target none), and every import that crosses the layer table the wrong way. Reads the
source with ``ast``; nothing is imported. ``tests/unit/test_layers.py`` runs the same checks.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("smgrl", "journal")
GENERATED = ("_generated", "/protos/")  # generated code: exempt from the size rule
MAX_LINES = 700
MAX_ROOT_MODULES = 6
CLI = ("smgrl.cli", "smgrl.demo", "smgrl.launch_router", "smgrl.__main__")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def source_files() -> list[Path]:
    return sorted(p for tree in TREES for p in (ROOT / tree).rglob("*.py"))


def imports_of(path: Path) -> set[str]:
    """First-party modules ``path`` imports anywhere (function bodies too), resolved to modules."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    # Imports under ``if TYPE_CHECKING:`` never run (annotations only): they make no cycle and
    # cross no layer at run time, so they are left out (import-linter's exclude_type_checking_imports).
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            subs = {f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}")}
            found.update(subs or {base})
            if len(subs) < len(node.names):
                found.add(base)
    out = set()
    for mod in found:
        if mod.split(".")[0] not in TREES:
            continue
        while mod and module_file(mod) is None:
            mod = mod.rpartition(".")[0]
        if mod and mod != name:
            out.add(mod)
    return out


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in source_files()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in g:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(g.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


# -- the layer table ---------------------------------------------------------------------------

TABLE_START = "<!-- layer table -->"


def layer_table(text: str | None = None) -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """The table of docs/architecture.md: layers top to bottom, each with its packages, and the
    exceptions (``module -> reason``) listed under it."""
    text = text if text is not None else (ROOT / "docs/architecture.md").read_text()
    block = text.split(TABLE_START, 1)[1].split("\n\n", 1)[0]
    layers: list[tuple[str, list[str]]] = []
    for line in block.strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("layer", "") or set(cells[0]) <= {"-", ":"}:
            continue
        layers.append((cells[0], re.findall(r"`([\w.]+)`", cells[1])))
    exceptions = dict(re.findall(r"^- exception `([\w.]+)`: (.+)$", text, re.MULTILINE))
    return layers, exceptions


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    best, where = -1, None
    for i, (_, packages) in enumerate(layers):
        for pkg in packages:
            if (module == pkg or module.startswith(pkg + ".")) and len(pkg) > best:
                best, where = len(pkg), i
    return where


def layer_violations(g: dict[str, set[str]], layers=None, exceptions=None) -> list[str]:
    """Imports from a module to a module of a higher layer (layers are listed top first). Within a
    layer, packages may import each other only where they do not form a cycle (checked apart)."""
    if layers is None:
        layers, exceptions = layer_table()
    exceptions = exceptions or {}
    out = []
    for mod, deps in sorted(g.items()):
        mine = layer_of(mod, layers)
        if mine is None:
            out.append(f"{mod}: in no layer of the table")
            continue
        if mod in exceptions:
            continue
        for dep in sorted(deps):
            theirs = layer_of(dep, layers)
            if theirs is not None and theirs < mine:
                out.append(f"{mod} ({layers[mine][0]}) imports {dep} ({layers[theirs][0]})")
    return out


def root_modules() -> list[str]:
    return sorted(p.name for p in (ROOT / "smgrl").glob("*.py"))


def long_modules() -> list[tuple[str, int]]:
    out = []
    for p in source_files():
        rel = str(p.relative_to(ROOT))
        if any(g in rel for g in GENERATED):
            continue
        n = len(p.read_text().splitlines())
        if n > MAX_LINES:
            out.append((rel, n))
    return sorted(out, key=lambda x: -x[1])


def cli_importers(g: dict[str, set[str]]) -> list[str]:
    def is_cli(m: str) -> bool:
        return any(m == c or m.startswith(c + ".") for c in CLI)

    return sorted(f"{m} -> {d}" for m, deps in g.items() if not is_cli(m) for d in deps if is_cli(d))


def report(out=sys.stdout) -> int:
    g = graph()
    cyc, viol, cli, long, roots = (
        cycles(g),
        layer_violations(g),
        cli_importers(g),
        long_modules(),
        root_modules(),
    )
    rows: Iterable[tuple[str, object, str]] = [
        ("modules directly in smgrl/", len(roots), f"target <= {MAX_ROOT_MODULES}: {', '.join(roots)}"),
        (
            "import cycles (function-level imports count)",
            len(cyc),
            "target 0 (type-checking-only imports left out)",
        ),
        (f"modules over {MAX_LINES} lines outside tests", len(long), "target 0"),
        ("non-CLI modules importing CLI code", len(cli), "target 0"),
        ("imports against the layer table", len(viol), "target 0"),
    ]
    for what, n, note in rows:
        print(f"{what:48} {n!s:>4}   {note}", file=out)
    for c in cyc:
        print("  cycle: " + " <-> ".join(c), file=out)
    for name, n in long:
        print(f"  long: {name} ({n} lines)", file=out)
    for line in cli + viol:
        print(f"  {line}", file=out)
    failed = len(roots) > MAX_ROOT_MODULES or cyc or cli or viol
    return 1 if failed else 0


def group_by_package(names: Iterable[str]) -> dict[str, list[str]]:
    out: defaultdict[str, list[str]] = defaultdict(list)
    for n in names:
        out[".".join(n.split(".")[:2])].append(n)
    return dict(out)


if __name__ == "__main__":
    sys.exit(report())
