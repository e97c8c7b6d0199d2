"""The import rules of ARCHITECTURE.md, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"radixcache", "offload", "transfer", "events"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.mark.parametrize(
    ("package", "allowed"),
    [("events", set()), ("transfer", set()), ("offload", {"transfer", "events"})],
)
def test_lower_layers_import_nothing_above_them(package: str, allowed: set[str]) -> None:
    for path in (ROOT / package).rglob("*.py"):
        ours = top(imports(path)) & OURS - {package}
        assert ours <= allowed, f"{path.relative_to(ROOT)} imports {sorted(ours - allowed)}"


def test_only_events_talks_zmq_and_msgpack_only_offload_talks_lmdb() -> None:
    for path in ROOT.glob("*/**/*.py"):
        rel = path.relative_to(ROOT)
        pkg = rel.parts[0]
        if pkg not in OURS or rel.parts[:2] == ("radixcache", "bench"):
            continue  # benchmarks run plain msgpack/ZMQ/file baselines on purpose
        mods = top(imports(path))
        if pkg != "events":
            assert not mods & {"zmq", "msgpack"}, f"{path.relative_to(ROOT)} uses ZMQ/msgpack"
        if pkg != "offload":
            assert "lmdb" not in mods, f"{path.relative_to(ROOT)} uses LMDB"
        if pkg != "transfer":
            assert "cupy" not in mods, f"{path.relative_to(ROOT)} uses cupy"


def test_the_tree_knows_nothing_of_devices_storage_or_threads() -> None:
    for name in ("tree.py", "node.py", "eviction.py"):
        mods = top(imports(ROOT / "radixcache" / name))
        assert not mods & {"torch", "lmdb", "zmq", "msgpack", "cupy", "threading", "offload"}, name
