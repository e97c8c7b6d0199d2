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
that. Our publisher always binds its endpoints. An unknown key or a value of
the wrong type raises ValueError naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from radixcache.events import PublisherConfig

# vLLM key -> PublisherConfig field (None: handled here, not a field)
KEYS: dict[str, str | None] = {
    "enable_kv_cache_events": None,
    "publisher": None,
    "endpoint": "endpoint",
    "replay_endpoint": "replay_endpoint",
    "buffer_steps": "replay_buffer_size",
    "hwm": "send_hwm",
    "max_queue_size": "queue_size",
    "topic": "topic",
}
PUBLISHERS = ("zmq", "null")


def _check_type(key: str, value: Any) -> None:
    if key == "enable_kv_cache_events":
        ok = isinstance(value, bool)
        want = "true or false"
    elif key in ("buffer_steps", "hwm", "max_queue_size"):
        ok = isinstance(value, int) and not isinstance(value, bool)
        want = "an integer"
    elif key == "replay_endpoint":
        ok = value is None or isinstance(value, str)
        want = "a string or null"
    else:
        ok = isinstance(value, str)
        want = "a string"
    if not ok:
        raise ValueError(f"kv-events-config: {key} must be {want}, got {value!r}")


def publisher_config(values: Mapping[str, Any], base: PublisherConfig) -> PublisherConfig | None:
    """The publisher ``values`` (vLLM ``KVEventsConfig`` keys) ask for, starting
    from ``base``; None when they leave events off. Raises ValueError for an
    unknown key, a wrong type or a value PublisherConfig rejects."""
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise ValueError(f"kv-events-config: unknown key(s) {', '.join(unknown)}; "
                         f"known: {', '.join(KEYS)}")
    for key, value in values.items():
        _check_type(key, value)
    enabled = bool(values.get("enable_kv_cache_events", False))
    kind = values.get("publisher") or ("zmq" if enabled else "null")
    if kind not in PUBLISHERS:
        raise ValueError(f"kv-events-config: publisher must be one of {', '.join(PUBLISHERS)}, "
                         f"got {kind!r}")
    fields = {f: v for k, v in values.items() if (f := KEYS[k]) is not None}
    config = replace(base, **fields)  # PublisherConfig checks the values
    return config if enabled and kind == "zmq" else None
