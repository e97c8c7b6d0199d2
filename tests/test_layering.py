"""The import rules of ARCHITECTURE.md, checked on the source, under the one
import name: ``radixcache.events`` and ``radixcache.transfer`` import nothing
else of ours, ``radixcache.offload`` only those two, the tree none of them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("events", "transfer", "offload")  # top-level folders, radixcache.<name>


def module_name(path: Path) -> str:
    """Installed module name of a source file (offload/x.py -> radixcache.offload.x)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in LAYERS:
        parts.insert(0, "radixcache")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.add(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                found.add(node.module)
    return found


def layer(module: str) -> str | None:
    """Which of our layers a module belongs to: 'events', ..., 'engine', or None."""
    parts = module.split(".")
    if parts[0] != "radixcache":
        return None
    if len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return "engine"


def sources(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py"))


def test_top_level_folders_are_linked_into_the_one_package() -> None:
    for name in LAYERS:
        link = ROOT / "radixcache" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), link


@pytest.mark.parametrize(
    ("package", "allowed"),
    [("events", set()), ("transfer", set()), ("offload", {"transfer", "events"})],
)
def test_lower_layers_import_nothing_above_them(package: str, allowed: set[str]) -> None:
    for path in sources(package):
        ours = {layer(m) for m in imports(path)} - {None, package}
        assert ours <= allowed, f"{path.relative_to(ROOT)} imports {sorted(ours - allowed)}"  # type: ignore[type-var]


def test_no_old_top_level_imports() -> None:
    for folder in ("radixcache", *LAYERS, "tests", "examples"):
        for path in sources(folder):
            if path.is_relative_to(ROOT / "radixcache") and path.parts[len(ROOT.parts) + 1] in LAYERS:
                continue  # the linked folders are checked under their own name
            bad = {m for m in imports(path) if m.split(".")[0] in LAYERS}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)} (use radixcache.<layer>)"


def test_only_events_talks_zmq_and_msgpack_only_offload_talks_lmdb() -> None:
    for folder in ("radixcache", *LAYERS):
        for path in sources(folder):
            rel = path.relative_to(ROOT)
            if rel.parts[0] == "radixcache" and rel.parts[1] in LAYERS:
                continue  # seen through the top-level folder
            if rel.parts[:3] == ("radixcache", "cli", "bench"):
                continue  # benchmarks run plain msgpack/ZMQ/file baselines on purpose
            mods = {m.split(".")[0] for m in imports(path)}
            if folder != "events":
                assert not mods & {"zmq", "msgpack"}, f"{rel} uses ZMQ/msgpack"
            if folder != "offload":
                assert "lmdb" not in mods, f"{rel} uses LMDB"
                assert not mods & {"redis", "valkey", "glide", "mooncake"}, f"{rel} talks to a storage server"
            if folder != "transfer":
                assert "cupy" not in mods, f"{rel} uses cupy"


def engine_part(module: str) -> str | None:
    """The engine subpackage of a module (radixcache.tree.node -> 'tree'), or
    None for the engine's top-level modules and other layers."""
    parts = module.split(".")
    if layer(module) != "engine" or len(parts) < 3:
        return None
    return parts[1]


def test_the_tree_knows_nothing_of_devices_storage_events_tiers_or_threads() -> None:
    """The tree package imports, of ours, only itself, the ids and keys of
    pages, and namespaces: no tiers, recorder, request, events, offload or
    transfer; and no torch, storage, ZMQ or threads."""
    paths = sources("radixcache/tree")
    assert len(paths) >= 9, paths
    allowed = {"radixcache.namespace", "radixcache.native"}
    for path in paths:
        rel = path.relative_to(ROOT)
        mods = imports(path)
        tops = {m.split(".")[0] for m in mods}
        assert not tops & {"torch", "lmdb", "zmq", "msgpack", "cupy", "threading", "redis"}, rel
        ours = {m for m in mods if m.startswith("radixcache")}
        bad = {m for m in ours if engine_part(m) not in ("tree", "keys") and m not in allowed}
        assert not bad, f"{rel} imports {sorted(bad)}"


def test_the_keys_of_pages_know_no_tree_tiers_or_events() -> None:
    """Ids and keys are computed from tokens and namespaces; the tree nodes
    they are cached on are named by a contract (keys/chain.py), so the tree
    can import the keys and not the other way round."""
    for path in sources("radixcache/keys"):
        rel = path.relative_to(ROOT)
        parts = {engine_part(m) for m in imports(path)}
        assert not parts & {"tree", "tiers", "cli", "integrations"}, rel
        assert not {layer(m) for m in imports(path)} & {"events"}, rel


def test_the_tiers_are_below_the_facade() -> None:
    """The tiers package never imports the cache facade or its config (the
    facade wires the tiers, not the other way round)."""
    for path in sources("radixcache/tiers"):
        bad = {m for m in imports(path)
               if m in ("radixcache.cache", "radixcache.cache_config", "radixcache.cache_check")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


BACKENDS = ("lmdb", "valkey", "mooncake")  # offload/<backend>/: one folder each
CLIENTS = {"lmdb": {"lmdb"}, "valkey": {"redis", "valkey", "glide"}, "mooncake": {"mooncake"}}  # what each may talk to


def offload_part(module: str) -> str | None:
    """The offload part of a module: 'storage', 'lmdb', 'backends', ... or None."""
    parts = module.split(".")
    if parts[:2] != ["radixcache", "offload"] or len(parts) < 3:
        return None
    return parts[2]


def test_offload_backends_are_their_transport_on_one_base() -> None:
    """The contract and shared base import no backend and no client library;
    a backend imports the base and never another backend; only backends.py
    knows every backend; each client library belongs to one backend."""
    for backend in BACKENDS:
        assert (ROOT / "offload" / backend / "__init__.py").is_file(), backend
    for path in sources("offload"):
        rel = path.relative_to(ROOT)
        here = rel.parts[1] if len(rel.parts) > 2 else rel.stem
        mods = imports(path)
        parts = {offload_part(m) for m in mods} - {None, here}
        tops = {m.split(".")[0] for m in mods}
        if here == "storage":
            assert not parts & {*BACKENDS, "backends", "controller", "host"}, rel
        if here in BACKENDS:
            assert not parts & ({*BACKENDS, "backends"} - {here}), f"{rel} imports {sorted(parts)}"
        if here not in ("backends", "__init__"):  # the package's lazy exports name them all
            assert len(parts & set(BACKENDS)) <= 1 or here in BACKENDS, rel
        for backend, clients in CLIENTS.items():
            if here != backend:
                assert not tops & clients, f"{rel} talks to {sorted(tops & clients)}"


PACKAGE_FOLDERS = ("radixcache", "events", "transfer", "offload")
MAX_MODULES = 12  # modules per package folder, __init__ and __main__ aside
MAX_LINES = 420  # lines per module (the guideline is about 400)


def test_every_package_is_small_enough_to_find_things_in() -> None:
    """A newcomer finds each concept from the folder names alone: no folder
    of more than about 12 modules, no module of more than about 400 lines."""
    for top in PACKAGE_FOLDERS:
        for folder in [ROOT / top, *(d for d in (ROOT / top).rglob("*") if d.is_dir())]:
            if folder.is_symlink() or "__pycache__" in folder.parts or folder.name == "fixtures":
                continue
            if top == "radixcache" and folder.relative_to(ROOT).parts[1:2] and \
                    folder.relative_to(ROOT).parts[1] in LAYERS:
                continue  # the linked layers are checked under their own folder
            found = [*folder.glob("*.py"), *folder.glob("*.pyx"), *folder.glob("*.pxi")]
            modules = [p for p in found  # compiled ones, and the files they include, count
                       if p.name not in ("__init__.py", "__main__.py")]
            assert len(modules) <= MAX_MODULES, f"{folder.relative_to(ROOT)}: {len(modules)} modules"
            for module in modules:
                lines = len(module.read_text().splitlines())
                assert lines <= MAX_LINES, f"{module.relative_to(ROOT)}: {lines} lines"


def test_nothing_below_the_engine_imports_the_apps() -> None:
    for folder in ("radixcache", *LAYERS):
        for path in sources(folder):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("radixcache", "cli") or rel == Path("radixcache/__main__.py"):
                continue  # the apps themselves; ``python -m radixcache`` runs them
            apps = {m for m in imports(path) if m.startswith("radixcache.cli")}
            assert not apps, f"{rel} imports the applications {sorted(apps)}"


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for folder in ("radixcache", *LAYERS):
        for path in sources(folder):
            rel = path.relative_to(ROOT)
            if rel.parts[0] == "radixcache" and len(rel.parts) > 2 and rel.parts[1] in LAYERS:
                continue
            graph[module_name(path)] = {m for m in imports(path) if m.startswith("radixcache")}
    return graph


def test_no_import_circles() -> None:
    """No two of our modules import each other, directly or through others
    (package __init__ re-exports aside: a package importing its own modules)."""
    graph = import_graph()
    names = set(graph)

    def resolve(m: str) -> str | None:
        while m and m not in names:
            m = m.rpartition(".")[0]
        return m or None

    edges = {
        a: {b for b in (resolve(m) for m in deps) if b and b != a and not a.startswith(b + ".")
            and not b.startswith(a + ".") and a != "radixcache"}
        for a, deps in graph.items()
    }
    edges["radixcache"] = set()  # lazy re-exports only
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


@pytest.mark.parametrize(
    ("module", "banned"),
    [
        ("radixcache.transfer", ("lmdb", "zmq", "msgpack", "redis", "radixcache.cache",
                                 "radixcache.tree.radix_tree", "radixcache.offload", "radixcache.events")),
        ("radixcache.events", ("lmdb", "torch", "redis", "radixcache.cache", "radixcache.tree.radix_tree",
                               "radixcache.offload", "radixcache.transfer")),
        ("radixcache", ("lmdb", "zmq", "torch", "radixcache.cache")),
        ("radixcache.tree", ("lmdb", "zmq", "torch", "radixcache.cache", "radixcache.tiers",
                             "radixcache.offload", "radixcache.transfer", "radixcache.events",
                             "radixcache.recorder")),
        ("radixcache.keys", ("lmdb", "zmq", "torch", "radixcache.tree", "radixcache.tiers",
                             "radixcache.offload", "radixcache.events")),
        ("radixcache.offload", ("redis", "lmdb", "torch", "mooncake", "radixcache.offload.lmdb",
                                "radixcache.offload.valkey", "radixcache.offload.mooncake",
                                "radixcache.cache")),
    ],
)
def test_importing_a_layer_loads_only_what_it_needs(module: str, banned: tuple[str, ...]) -> None:
    code = (
        f"import sys, {module};"
        f"bad = sorted({{m for m in sys.modules for b in {banned!r} if m == b or m.startswith(b + '.')}});"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
