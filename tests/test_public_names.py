"""The public surface: what each package's ``__init__`` exports, exactly.

Deep module paths may move; these names may not, without this list (and the
README) changing with them. Every name must resolve, and the README's and the
examples' imports must come from these lists.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PUBLIC: dict[str, list[str]] = {
    "radixcache": [
        "CacheClosedError", "CacheConfig", "CacheStats", "ConfigError", "DEFAULT_NAMESPACE", "DeviceKVBuffer", "EvictionPolicy",
        "InsertResult", "KVSpec", "MatchResult", "Namespace", "Node", "OutOfPagesError",
        "RadixCache", "RadixTree", "Request", "RequestStateError", "TierConfig",
        "eviction_policy_names", "load_config", "make_eviction_policy", "register_eviction_policy",
    ],
    "radixcache.tree": [
        "EvictResult", "EvictionPolicy", "InsertResult", "LowerTiers", "MatchResult",
        "NoLowerTiers", "Node", "NullRecorder", "RadixTree", "Recorder",
        "eviction_policy_names", "make_eviction_policy", "register_eviction_policy",
    ],
    "radixcache.tiers": ["HostTiers", "NullTiers", "TierConfig", "TierCounters", "TierJob", "TierStats", "Tiers"],
    "radixcache.keys": [
        "EventIds", "ID_LIMIT", "KEY_BYTES", "PageKeys", "StorageIds", "block_id_of_sequence",
        "block_ids", "chain_keys", "namespace_seed", "split_keys",
    ],
    "radixcache.transfer": [
        "CopyEngine", "CopyRequest", "CpuCopyEngine", "DeviceKVBuffer", "Direction", "FutureTicket",
        "HostKVBuffer", "KVSpec", "PageAllocator", "PagePairs", "Ticket", "copy_device_to_host",
        "copy_host_to_device", "make_copy_engine",
    ],
    "radixcache.events": [
        "AllBlocksCleared", "BatchEncoder", "BatchSink", "BindError", "BlockRemoved", "BlockStored",
        "CPU_PINNED", "DISK", "DecodeError", "EXTERNAL", "EventBatch", "EventPublisher",
        "EventSubscriber", "GPU", "HASH_LIMIT", "IndexConfig", "IndexStats", "KvEvent", "KvIndex",
        "MEDIA", "Medium", "NullEventPublisher", "PublisherConfig", "PublisherStats",
        "RoutingDecision", "SequenceSource", "SubscriberConfig", "SubscriberStats", "TierOverlap",
        "WorkerEndpoint", "WorkerId", "ZmqEventPublisher", "check_events", "clock_base",
        "decode_batch", "encode_batch",
    ],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_each_package_exports_exactly_its_public_names(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    for name in PUBLIC[package]:
        assert getattr(module, name) is not None, f"{package}.{name}"


def _package_imports(text: str) -> list[tuple[str, str]]:
    """(module, name) of every ``from radixcache... import name`` in Python code."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("radixcache"):
            found.extend((node.module, alias.name) for alias in node.names)
    return found


def _readme_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return "\n".join(blocks)


@pytest.mark.parametrize("source", ["README.md", "examples/model_runner.py", "examples/router.py"])
def test_the_readme_and_the_examples_import_only_public_names(source: str) -> None:
    text = _readme_code() if source == "README.md" else (ROOT / source).read_text()
    imports = _package_imports(text)
    assert imports, source
    for module, name in imports:
        public = PUBLIC.get(module)
        if public is None:  # a module of its own (e.g. radixcache.metrics): the name must exist there
            assert hasattr(importlib.import_module(module), name), f"{source}: {module}.{name}"
        else:
            assert name in public, f"{source} imports {module}.{name}, which is not exported"
