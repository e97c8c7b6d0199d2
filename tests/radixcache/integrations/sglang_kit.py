"""SGLang's real host KV pools and cache controller on the CPU.

``sglang.srt.mem_cache.pool_host`` and ``memory_pool`` import SGLang's model
configs (``sglang.srt.configs``), several of which import ``torchvision`` at
module level (image transforms of multimodal models). torchvision cannot be
installed beside the torch 2.13.0 CPU build this project runs on: PyPI's
wheel fails at import (``operator torchvision::nms does not exist``) and no
matching build is published. So exactly ONE import is stubbed, while SGLang's
modules are imported: ``torchvision`` (with its submodules), whose every
attribute is a placeholder that raises if it is ever called. Nothing the
tests run uses it (no image is transformed); the stub is removed again right
after the import, so later code sees no torchvision at all. transformers
decides that torchvision is absent before the stub exists.

Everything else is SGLang's own: ``MHATokenToKVPool`` / ``MLATokenToKVPool``
device pools on the CPU, ``MHATokenToKVPoolHost`` (``page_first`` and
``layer_first``) and ``MLATokenToKVPoolHost`` host pools, and
``HiCacheController`` with its prefetch and backup threads.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

STUBBED = "torchvision"  # the one stubbed import (see the module docstring)
PAGE = 4  # tokens per page
LAYERS, HEADS, DIM = 2, 2, 8
MLA_LORA, MLA_ROPE = 16, 8  # MLA latent and rope widths


class _Placeholder(type):
    """A torchvision attribute: any attribute of it is another, a call raises."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (), {})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{STUBBED} is stubbed in these tests; {cls.__name__} was called")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == STUBBED or name.startswith(STUBBED + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder(name, (), {})

        module.__getattr__ = attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@contextmanager
def _torchvision_stubbed() -> Iterator[None]:
    if importlib.util.find_spec(STUBBED) is not None:  # a real, working one: use it
        yield
        return
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached: absent, before the stub exists
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m == STUBBED or m.startswith(STUBBED + ".")]:
            del sys.modules[name]


with _torchvision_stubbed():
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost


def mha_pools(layout: str, tokens: int = 64, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, Any]:
    """(device pool, host pool) of an MHA model, both SGLang's, on the CPU."""
    device = MHATokenToKVPool(tokens, PAGE, dtype, HEADS, DIM, LAYERS, "cpu", False,
                              start_layer=0, end_layer=LAYERS - 1)
    host = MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout, pin_memory=False,
        device_capacity_tokens=device.size, start_layer=device.start_layer,
        end_layer=device.end_layer,
    )
    return device, host


def mla_pools(layout: str = "page_first", tokens: int = 64) -> tuple[Any, Any]:
    """(device pool, host pool) of an MLA model, both SGLang's, on the CPU."""
    device = MLATokenToKVPool(tokens, PAGE, torch.bfloat16, MLA_LORA, MLA_ROPE, LAYERS, "cpu",
                              False, start_layer=0, end_layer=LAYERS - 1)
    host = MLATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info, 2.0, 0, PAGE, layout, pin_memory=False,
        device_capacity_tokens=device.size, start_layer=device.start_layer,
        end_layer=device.end_layer, target_layer_num=device.layer_num,
        override_kv_cache_dim=device.kv_cache_dim,
    )
    return device, host


def host_bytes(host: Any) -> torch.Tensor:
    """Every byte of a host pool's KV buffer(s), flat (K and V, or the MLA latent)."""
    buffer = host.kv_buffer
    return buffer.view(-1).view(torch.uint8)


def page_bytes(host: Any, first_token: int) -> bytes:
    """The bytes of one host page, gathered from SGLang's own page pieces."""
    import ctypes

    ptrs, sizes = host.get_page_buffer_meta(torch.arange(first_token, first_token + PAGE))
    return b"".join(ctypes.string_at(int(p), int(n)) for p, n in zip(ptrs, sizes))


def fill(host: Any, seed: int) -> None:
    """Random KV in every host slot."""
    flat = host_bytes(host)
    gen = torch.Generator().manual_seed(seed)
    flat.copy_(torch.randint(0, 256, (flat.numel(),), generator=gen, dtype=torch.uint8))


def indices(*pages: int) -> torch.Tensor:
    """Host token indices of whole pages."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def keys(n: int, start: int = 1) -> list[str]:
    return [f"{i:064x}" for i in range(start, start + n)]


def controller(device: Any, host: Any, extra_config: dict[str, Any], model: str) -> Any:
    """SGLang's ``HiCacheController`` with the ``dynamic`` backend of ``extra_config``.

    Needs a torch.distributed group (a gloo group of one is started if none
    is) and SGLang's parallel context (one rank, no parallelism)."""
    import threading

    import torch.distributed as dist
    from sglang.srt.runtime_context import get_parallel

    if not dist.is_initialized():
        import tempfile

        store = tempfile.mkdtemp(prefix="radixcache-gloo-")
        dist.init_process_group("gloo", init_method=f"file://{store}/pg", rank=0, world_size=1)
    allocator = PagedTokenToKVPoolAllocator(device.size, PAGE, device.dtype, "cpu", device, False)
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1,
                                 attn_dcp_rank=0):
        return HiCacheController(
            allocator, host, PAGE, dist.group.WORLD, threading.Event(),
            write_policy="write_through", storage_backend="dynamic", model_name=model,
            storage_backend_extra_config=dict(extra_config),
        )


def stop(cc: Any) -> None:
    cc._stop_storage_threads()
    cc.storage_backend.close()


def extra_config(path: Any, **extra: Any) -> dict[str, Any]:
    """The README's ``--hicache-storage-backend-extra-config``, with ``path``."""
    return {"backend_name": "radixcache", "module_path": "radixcache.integrations.sglang",
            "class_name": "RadixcacheHiCacheStorage", "interface_v1": 1, "path": str(path),
            "kv_dtype": "bfloat16", "capacity_bytes": 1 << 22, **extra}


def storage_config(path: Any, host: Any, tp_rank: int = 0, tp_size: int = 1,
                   **extra: Any) -> Any:
    """SGLang's ``HiCacheStorageConfig`` as its controller derives it for ``host``."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=isinstance(host, MLATokenToKVPoolHost), enable_storage_metrics=False,
        is_page_first_layout=host.layout == "page_first", model_name="org/tiny-model",
        extra_config=extra_config(path, **extra),
    )


def equal_pages(host: Any, a: Sequence[int], b: Sequence[int]) -> bool:
    return all(page_bytes(host, x * PAGE) == page_bytes(host, y * PAGE) for x, y in zip(a, b))
