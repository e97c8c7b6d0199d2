"""Strict decoders of the event stream as vLLM 0.33 and SGLang 0.5.23 declare it.

Written from the two projects' published field definitions of their KV
event types (``vllm/distributed/kv_events.py``,
``sglang/srt/disaggregation/kv_events.py``): a field without a default is
required, so a map that lacks it fails to decode; field types are checked
strictly; unknown keys are ignored (msgspec's default, as in both projects).
Events are maps tagged by ``"type"``; a batch is an array of 3.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import msgspec

# ---------------------------------------------------------------- vLLM 0.33


class VllmEvent(msgspec.Struct, tag_field="type", omit_defaults=True, gc=False):
    """Base of vLLM's tagged KV events."""


class VllmBlockStored(VllmEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None


class VllmBlockRemoved(VllmEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class VllmAllBlocksCleared(VllmEvent, tag="AllBlocksCleared"):
    pass


class VllmEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[VllmBlockStored, VllmBlockRemoved, VllmAllBlocksCleared]]
    data_parallel_rank: int | None = None


# ---------------------------------------------------------------- SGLang 0.5.23


class SglangEvent(msgspec.Struct, tag_field="type", omit_defaults=True, gc=False):
    """Base of SGLang's tagged KV events."""


class SglangBlockStored(SglangEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None
    cache_salt: Optional[str] = None


class SglangBlockRemoved(SglangEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Optional[str] = None


class SglangAllBlocksCleared(SglangEvent, tag="AllBlocksCleared"):
    pass


class SglangEventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Union[SglangBlockStored, SglangBlockRemoved, SglangAllBlocksCleared]]
    attn_dp_rank: Optional[int] = None


VLLM = msgspec.msgpack.Decoder(VllmEventBatch)
SGLANG = msgspec.msgpack.Decoder(SglangEventBatch)
