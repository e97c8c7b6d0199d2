"""SGLang's ``UnifiedRadixCache`` with its Rust tree core, on the CPU: the peer
the tree benchmark compares with, driven the way SGLang's scheduler drives it.

Optional: needs ``sglang==0.5.23`` (installed with ``--no-deps``) and the few
small packages its radix-cache module imports (README, "Benchmarks").
``load()`` returns None, with the reason, when it cannot be imported.

SGLang's package imports multimodal model configs at start-up, and those
import ``torchvision``; no torchvision build matching this machine's torch
(2.13, CPU) is installable here. While SGLang is imported, a placeholder
module stands in for ``torchvision``: nothing on the radix-cache path calls
into it (the placeholder is removed from ``sys.modules`` afterwards).

Per request, like SGLang's scheduler: ``match_prefix``, the matched device
indices (``path_device_indices``), ``lock``; allocate the missing tokens
(evicting first when the pool is short); ``insert`` the whole page-aligned
key with its indices; free the duplicates the tree already held; ``unlock``.
Token keys (``RadixKey`` over an int64 ``array``) are built before timing.
Events are off (``enable_kv_cache_events=False``): the peer is timed at its
fastest, so ratios against it are conservative.

The core alone, a stricter yardstick: ``match`` is the Rust tree core's walk
and nothing else (``tree_core.match_prefix``: no device indices, no lock,
which the scheduler's path above adds), and ``serve`` also times its
``insert`` call alone (``insert_s``). On a 4k-token hit the walk is about a
third of the scheduler's path (the indices and the lock take the rest).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import Any

import numpy as np

P = 16


class _Anything:
    """Any attribute, call or base class: what the placeholder hands out."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Anything:
        return _Anything()

    def __getattr__(self, name: str) -> _Anything:
        return _Anything()

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)


class _Placeholder(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Placeholder(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        setattr(module, "__version__", "0.28.0")  # the release matching torch 2.13


@contextmanager
def _torchvision_placeholder() -> Iterator[None]:
    try:
        importlib.import_module("torchvision")
    except Exception:
        finder = _PlaceholderFinder()
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
                del sys.modules[name]
        return
    yield


class SglangTree:
    """One ``UnifiedRadixCache`` (Rust tree core, CPU) with a token pool."""

    def __init__(self, mod: Any, capacity_pages: int) -> None:
        import torch

        self._m = mod
        size = capacity_pages * P
        server_args = mod.ServerArgs(model_path="dummy", page_size=P)
        mod.set_global_server_args_for_scheduler(server_args)
        req_pool = mod.ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
        kv = mod.MHATokenToKVPool(
            size=size, page_size=P, dtype=torch.bfloat16, head_num=1, head_dim=1,
            layer_num=1, device="cpu", enable_memory_saver=False,
        )
        # The allocator SGLang uses for pages of more than one token; sorted,
        # staged frees (its cheaper mode).
        self.alloc = mod.PagedTokenToKVPoolAllocator(
            size=size, page_size=P, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=True
        )
        params = mod.CacheInitParams(
            req_to_token_pool=req_pool, token_to_kv_pool_allocator=self.alloc, page_size=P,
            disable=False, tree_components=(mod.ComponentType.FULL,), enable_kv_cache_events=False,
        )
        self.cache = mod.UnifiedRadixCache(params=params)
        if self.cache._tree_core_backend != "rust":
            raise RuntimeError(f"SGLang chose the {self.cache._tree_core_backend!r} tree core, not rust")

        self.insert_s: list[float] = []  # each ``serve``'s insert call alone, seconds

    def key(self, tokens: np.ndarray) -> Any:
        n = tokens.size - tokens.size % P
        return self._m.RadixKey(array("q", tokens[:n].astype(np.int64).tobytes()))

    def probe(self, key: Any) -> int:
        """Match, take the indices, lock, unlock."""
        c = self.cache
        m = c.match_prefix(self._m.MatchPrefixParams(key=key))
        c.path_device_indices(m.last_device_node)[: m.device_prefix_len]
        c.unlock(c.lock(m.last_device_node))
        return int(m.device_prefix_len)

    def match(self, key: Any) -> int:
        """The Rust core's walk alone (what the scheduler's ``match_prefix``
        calls first); the matched device tokens."""
        return int(self.cache.tree_core.match_prefix(self._m.MatchPrefixParams(key=key)).device_prefix_len)

    def serve(self, key: Any) -> int:
        """A request: match + lock, allocate (evicting if short), insert, unlock."""
        c = self.cache
        m = c.match_prefix(self._m.MatchPrefixParams(key=key))
        hit = int(m.device_prefix_len)
        prefix = c.path_device_indices(m.last_device_node)[:hit]
        lock = c.lock(m.last_device_node)
        need = len(key) - hit
        short = need - self.alloc.available_size()
        if short > 0:
            c.evict(self._m.EvictParams(num_tokens=short))
        import torch

        new = self.alloc.alloc(need)
        assert new is not None, "pool exhausted"
        value = torch.cat([prefix, new])
        t0 = perf_counter()
        res = c.insert(self._m.InsertParams(key=key, value=value))
        self.insert_s.append(perf_counter() - t0)
        if res.prefix_len > hit:
            self.alloc.free(value[hit : res.prefix_len])
        c.unlock(lock)
        return hit

    def evict_pages(self, pages: int) -> int:
        before = self.alloc.available_size()
        self.cache.evict(self._m.EvictParams(num_tokens=pages * P))
        return (self.alloc.available_size() - before) // P

    def cached_pages(self) -> int:
        return int(self.cache.evictable_size() + self.cache.protected_size()) // P


def load() -> tuple[Callable[[int], SglangTree] | None, str]:
    """(a factory of ``SglangTree``, a note), or (None, why it is skipped)."""
    names = {
        "sglang.srt.mem_cache.allocator": ["PagedTokenToKVPoolAllocator"],
        "sglang.srt.mem_cache.base_prefix_cache": ["EvictParams", "InsertParams", "MatchPrefixParams"],
        "sglang.srt.mem_cache.cache_init_params": ["CacheInitParams"],
        "sglang.srt.mem_cache.memory_pool": ["MHATokenToKVPool", "ReqToTokenPool"],
        "sglang.srt.mem_cache.radix_cache": ["RadixKey"],
        "sglang.srt.mem_cache.unified_cache.components.base": ["ComponentType"],
        "sglang.srt.mem_cache.unified_radix_cache": ["UnifiedRadixCache"],
        "sglang.srt.server_args": ["ServerArgs", "set_global_server_args_for_scheduler"],
    }
    found: dict[str, Any] = {}
    try:
        with _torchvision_placeholder():
            sglang = importlib.import_module("sglang")
            for module, attrs in names.items():
                loaded = importlib.import_module(module)
                found.update({a: getattr(loaded, a) for a in attrs})
    except Exception as exc:  # any import failure: the baseline is skipped, with the reason
        return None, f"sglang not importable: {type(exc).__name__}: {exc}"
    mod = types.SimpleNamespace(**found)
    version = getattr(sglang, "__version__", "?")
    return (lambda capacity: SglangTree(mod, capacity)), f"sglang {version}, UnifiedRadixCache, Rust tree core, CPU"

