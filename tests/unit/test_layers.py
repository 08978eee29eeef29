"""The layers hold: the pure packages import no I/O (their packages' faces included), no class name
is defined twice in smgrl/, and no module takes a private name from another package.

An import-linter-like check over the source (``ast``, nothing is imported): every module under
the pure packages, and every first-party module they reach through their import statements
(followed as import-linter follows them: ``from journal.codec import x`` depends on
``journal.codec``), must not import an I/O module.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ("smgrl/state", "smgrl/core", "smgrl/routing")
FIRST_PARTY = ("smgrl", "journal")
FORBIDDEN = ("trio", "httpx", "sqlite3", "socket")


@functools.cache  # asked for the same names thousands of times in one run
def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # the tree does not change during a run; the pure-module cases walk it ~100 times
def _imports(path: Path) -> frozenset[str]:
    """The modules ``path`` imports (``from a.b import c`` gives a.b.c when that is a module)."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if _module_file(f"{base}.{a.name}"))
    # Importing smgrl.a.b runs smgrl/a/__init__ first: a package's face is reached too (a face that
    # loaded an I/O shell would make every module of its package impure). journal's face is not
    # followed: it loads its stores by design, and the pure folds use only journal.codec (through smgrl.events).
    found.update(
        ".".join(name.split(".")[:n])
        for name in list(found)
        if name.startswith("smgrl.")
        for n in range(2, name.count(".") + 1)
    )
    return frozenset(found)


def _reach(start: str) -> dict[str, str]:
    """Every module ``start`` reaches through first-party import statements: name -> importer."""
    seen, todo = {start: ""}, [start]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None:
            continue
        for imported in _imports(path):
            if imported not in seen:
                seen[imported] = name
                if imported.split(".")[0] in FIRST_PARTY:
                    todo.append(imported)
    return seen


def _pure_modules() -> list[str]:
    return sorted(_module_name(p) for pkg in PURE for p in (ROOT / pkg).rglob("*.py"))


def test_the_check_sees_imports():
    # It must be able to fail: the I/O shells reach every forbidden module.
    reached = {m.split(".")[0] for shell in ("smgrl.runtime.server", "smgrl.testing") for m in _reach(shell)}
    assert set(FORBIDDEN) <= reached
    assert len(_pure_modules()) > 20


@pytest.mark.parametrize("module", _pure_modules())
def test_pure_modules_import_no_io(module):
    reached = _reach(module)
    bad = sorted(m for m in reached if m.split(".")[0] in FORBIDDEN)
    chains = []
    for m in bad:
        chain = [m]
        while reached[chain[-1]]:
            chain.append(reached[chain[-1]])
        chains.append(" <- ".join(chain))
    assert not chains, f"{module} reaches I/O: {chains}"


# Class names defined in two modules on purpose, each with its reason.
SAME_NAME_ALLOWED = {
    # smgrl/rl.py is the drop-in client: its public names are the contract and stay as they are.
    "RlError": "smgrl/rl.py is the client: its RlError is what callers catch",
    "Worker": "smgrl/rl.py is the client: its Worker is the client's view of a worker entry",
    # The fake engines' response to send (smgrl/fake/http.py) and the upstream client's response
    # received (smgrl/upstream/response.py): two sides of one exchange, in separate trees.
    "Response": "server-side response of the fakes vs client-side response of the upstream pool",
}


def test_no_class_is_defined_twice():
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "smgrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(path.relative_to(ROOT)))
    twice = {name: files for name, files in where.items() if len(files) > 1 and name not in SAME_NAME_ALLOWED}
    assert not twice, f"classes defined more than once: {twice}"
    assert all(len(where[name]) == 2 for name in SAME_NAME_ALLOWED), "an allowed pair is gone: drop it"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def _private_uses(source: str, module: str, is_package: bool = False) -> list[str]:
    """Private names (``_x``, or a name inside a ``_x`` module) that ``module`` takes from a
    first-party module of another package: ``from p.m import _x``, ``from p._m import x``, and
    ``m._x`` where ``m`` was imported as a module."""
    package = _package_of(module, is_package)
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> first-party module it names
    tree = ast.parse(source)

    def foreign(target: str) -> bool:
        return (
            _package_of(
                target, _module_file(target) is not None and _module_file(target).name == "__init__.py"
            )
            != package
        )

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FIRST_PARTY:
                    modules[alias.asname or alias.name] = alias.name
                    if foreign(alias.name) and any(_private(p) for p in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] not in FIRST_PARTY:
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _module_file(full) is not None:  # a module imported by name
                    modules[alias.asname or alias.name] = full
                    target = full
                else:
                    target = node.module
                parts = [*node.module.split("."), alias.name]
                if foreign(target) and any(_private(p) for p in parts):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
            target = modules.get(node.value.id)
            if target is not None and foreign(target):
                found.append(f"{node.lineno}: {target}.{node.attr}")
    return found


def test_the_private_name_check_finds_a_planted_violation():
    planted = (
        "from journal._chain import snapshot_hash\n"
        "from smgrl.http.routes.rl_routes import _engine_path\n"
        "from smgrl.core import printable\n"
        "import smgrl.http.routes.rl_routes as routes\n"
        "printable._code\n"
        "routes._engine_path\n"
    )
    assert _private_uses(planted, "smgrl.control.writes") == [
        "1: from journal._chain import snapshot_hash",
        "2: from smgrl.http.routes.rl_routes import _engine_path",
        "5: smgrl.core.printable._code",
        "6: smgrl.http.routes.rl_routes._engine_path",
    ]
    # Inside one package a module may use its neighbours' private names.
    assert _private_uses("from smgrl.core.printable import _code\n", "smgrl.core.view") == []
    assert _private_uses("from journal._chain import chain_hash\n", "journal.store") == []


def test_no_module_imports_a_private_name_from_another_package():
    """Packages meet through their public names (each package's ``__init__`` lists them in
    ``__all__``); a private name stays inside its package."""
    found = [
        f"{path.relative_to(ROOT)}:{use}"
        for top in FIRST_PARTY
        for path in sorted((ROOT / top).rglob("*.py"))
        for use in _private_uses(path.read_text(), _module_name(path), path.name == "__init__.py")
    ]
    assert not found, found


# -- the layer table of docs/architecture.md, and the faces --------------------------------------
# The checks themselves live in scripts/layout_report.py (the report prints them with the tree's
# counts); these tests run them, each beside a planted violation that must be caught.

sys.path.insert(0, str(ROOT / "scripts"))
import layout_report

_graph = functools.cache(layout_report.graph)  # three checks read one unchanged tree

# Packages whose face (``__init__``'s ``__all__``) is the only way in from other packages' code.
# smgrl.core is the base library of small value modules (config, errors, auth, ...): its modules
# are imported by name, and its face lists the small helpers.
FACED = (
    "control",
    "registry",
    "refit",
    "tito",
    "sessions",
    "upstream",
    "dataplane",
    "state",
    "routing",
    "events",
)


def test_the_layer_table_is_read_from_the_docs():
    layers, exceptions = layout_report.layer_table()
    names = [name for name, _ in layers]
    assert names[0] == "entry" and names[-1] == "base" and "services" in names
    assert "smgrl.dataplane.testing" in exceptions
    every = {pkg for _, pkgs in layers for pkg in pkgs}
    assert {"smgrl.http", "smgrl.runtime", "journal", "smgrl.core"} <= every


def test_the_layer_check_finds_a_planted_violation():
    layers, _ = layout_report.layer_table()
    planted = {
        "smgrl.core.view": {"smgrl.dataplane.service"},  # the pure core reaching up into a service
        "smgrl.control.service": {"smgrl.http.app"},  # a service reaching up into the HTTP layer
        "smgrl.http.app": {"smgrl.control.service"},  # down: allowed
    }
    assert layout_report.layer_violations(planted, layers, {}) == [
        "smgrl.control.service (services) imports smgrl.http.app (http)",
        "smgrl.core.view (core) imports smgrl.dataplane.service (services)",
    ]


def test_every_import_follows_the_layer_table():
    assert layout_report.layer_violations(_graph()) == []


def test_the_cycle_check_finds_a_planted_cycle():
    assert layout_report.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_not_even_through_function_level_imports():
    assert layout_report.cycles(_graph()) == []


def test_no_module_outside_the_cli_imports_cli_code():
    assert layout_report.cli_importers(_graph()) == []


def test_the_package_root_holds_few_modules():
    assert len(layout_report.root_modules()) <= layout_report.MAX_ROOT_MODULES


def _past_faces(source: str, module: str) -> list[str]:
    """``from smgrl.P.sub import x`` in a module outside package P, for a P in FACED."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            parts = node.module.split(".")
            if (
                len(parts) > 2
                and parts[0] == "smgrl"
                and parts[1] in FACED
                and not module.startswith(f"smgrl.{parts[1]}")
            ):
                names = [a.name for a in node.names if _module_file(f"{node.module}.{a.name}") is None]
                if names:
                    found.append(f"{node.lineno}: from {node.module} import {', '.join(names)}")
    return found


def test_the_face_check_finds_a_planted_walk_around():
    planted = "from smgrl.control.service import ControlService\nfrom smgrl.control import ControlService\n"
    assert _past_faces(planted, "smgrl.http.app") == ["1: from smgrl.control.service import ControlService"]
    assert _past_faces(planted, "smgrl.control.writes") == []  # inside its own package


@pytest.mark.parametrize(
    "path", sorted((ROOT / "smgrl").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_other_packages_are_used_through_their_faces(path):
    module = _module_name(path)
    if module in layout_report.layer_table()[1]:  # a documented exception (a compatibility shim)
        return
    assert _past_faces(path.read_text(), module) == []
