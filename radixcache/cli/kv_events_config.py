"""vLLM's ``KVEventsConfig`` keys, mapped onto our ``PublisherConfig``.

``--kv-events-config '{json}'`` takes the keys a vLLM user already writes:

    vLLM key                 ours (PublisherConfig)     note
    enable_kv_cache_events   -                          false (vLLM's default): no events
    publisher                -                          "zmq" or "null"; default "zmq" when enabled
    endpoint                 endpoint                   PUB socket
    replay_endpoint          replay_endpoint            ROUTER socket; null: no replay
    buffer_steps             replay_buffer_size         batches kept for replay
    hwm                      send_hwm                   ZMQ high-water mark
    max_queue_size           queue_size                 batches queued for the sender
    topic                    topic                      first frame of every message

A key left out keeps our default, which binds loopback only; vLLM's default
endpoint ``tcp://*:5557`` binds every interface, so pass it explicitly to get
that. Our publisher always binds its endpoints. The JSON is decoded by type
(``KVEventsDocument``, strict, unknown keys forbidden): an unknown key or a
value of the wrong type raises ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

import msgspec

from radixcache.events import PublisherConfig


Unset = msgspec.UnsetType
UNSET = msgspec.UNSET


class KVEventsDocument(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The keys of vLLM's ``KVEventsConfig`` we take, with their types; UNSET:
    left out (our default applies)."""

    enable_kv_cache_events: bool = False
    publisher: Literal["zmq", "null"] | Unset = UNSET  # left out: "zmq" when enabled
    endpoint: str | Unset = UNSET
    replay_endpoint: str | None | Unset = UNSET  # null: no replay
    buffer_steps: int | Unset = UNSET
    hwm: int | Unset = UNSET
    max_queue_size: int | Unset = UNSET
    topic: str | Unset = UNSET


# vLLM key -> PublisherConfig field
FIELDS = {"endpoint": "endpoint", "replay_endpoint": "replay_endpoint",
          "buffer_steps": "replay_buffer_size", "hwm": "send_hwm",
          "max_queue_size": "queue_size", "topic": "topic"}


def publisher_config(values: Mapping[str, Any], base: PublisherConfig) -> PublisherConfig | None:
    """The publisher ``values`` (vLLM ``KVEventsConfig`` keys) ask for, starting
    from ``base``; None when they leave events off. Raises ValueError for an
    unknown key, a wrong type or a value PublisherConfig rejects."""
    try:
        doc = msgspec.convert(dict(values), KVEventsDocument, strict=True)
    except msgspec.ValidationError as err:
        raise ValueError(f"kv-events-config: {err}") from None
    fields = {f: v for key, f in FIELDS.items() if (v := getattr(doc, key)) is not UNSET}
    config = replace(base, **fields)  # PublisherConfig checks the values
    kind = doc.publisher if doc.publisher is not UNSET else (
        "zmq" if doc.enable_kv_cache_events else "null")
    return config if doc.enable_kv_cache_events and kind == "zmq" else None
