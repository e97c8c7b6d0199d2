"""The event layer: tells routers, in order, where every page of the cache lives.

The stream
    Each engine step that changed residency publishes one batch on a ZMQ PUB
    socket as three frames: ``topic`` (UTF-8, empty by default), ``seq`` (8-byte
    big-endian signed, +1 per batch, never backwards across restarts: see
    ``events.sequence``) and ``payload``: a msgpack array of exactly three,
    ``[ts, events, dp_rank]``. ``events`` is never empty; each event is a map
    whose first key is ``"type"``: ``BlockStored`` (block_hashes,
    parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
    all always present, nil where empty; plus cache_salt and per-block
    extra_keys for a salted namespace), ``BlockRemoved`` (block_hashes,
    medium) or ``AllBlocksCleared``. vLLM, SGLang and NVIDIA Dynamo consumers
    decode it.

Media
    ``"GPU"`` (device memory), ``"CPU_PINNED"`` (the pinned host tier),
    ``"DISK"`` (committed to the local storage tier) and ``"EXTERNAL"`` (a
    shared pool); the "vllm" vocabulary writes GPU / CPU / STORAGE. A page may
    be resident on several media at once; each medium is tracked on its own.

Block hashes
    Integers in ``[0, 2**63)`` (they read the same as u64 and as i64), derived
    from the chained page key: stable across media and restarts, unique per
    namespace.

Ordering
    Batches arrive in sequence order; inside a batch, events apply in list
    order. Per page, the store on a new medium comes before the removal from
    the old one, and a store is published only once the data is really there
    (copy completed, transaction committed). A consumer that applies every
    batch in order holds exactly the engine's residency, medium by medium.

Replay
    The publisher keeps its last N batches (10,000 by default) and serves
    them on a ZMQ ROUTER socket: a DEALER sends ``[b"", start_seq]`` (8-byte
    big-endian) and receives ``[b"", topic, seq, payload]`` for every buffered
    batch with ``seq >= start_seq``, then ``[b"", b"", seq=-1, b""]``. A batch
    takes its sequence number and its replay slot before the bounded send
    queue, so one dropped from a full queue is still replayable. Answers are
    paced and bounded per client (see ``events.zmq_publisher``).

Restarts
    A publisher's first batch is ``[AllBlocksCleared]``, replayable before
    its sockets are bound. Live subscribers cannot receive it (they reconnect
    after it was sent), so a consumer asks replay whenever its connection to
    an engine is (re-)established; ``EventSubscriber`` does, which makes an
    idle restart visible within the reconnect interval. For consumers that
    ask replay only on a gap in the live sequence (Dynamo's indexer), the
    live socket is an XPUB: when a subscriber joins, the newest batch is sent
    again, unchanged, and its number shows the gap (``events.resync``).

Robustness
    A record ``publish`` refuses (not a well-formed record) raises at once
    in the caller. An event that passes those checks but still cannot be
    encoded (a value out of msgpack's range) is dropped alone on the
    publisher thread and counted in ``encode_errors``; the rest of its
    batch is sent, live and on replay. The cache cannot produce such an
    event: its namespaces are checked for the wire when they are built.

Threads
    ``ZmqEventPublisher.publish`` is called by the cache's owner thread and
    never blocks; a publisher thread owns the sockets, encodes and sends.
    In a child forked from the publisher's process (where that thread does
    not exist) ``publish`` raises RuntimeError.
    ``EventSubscriber`` runs on the caller's thread through ``poll`` (or on a
    background thread after ``start``) and applies batches to a ``KvIndex``,
    which answers, per worker, how many leading blocks of a request sit on
    GPU, host and disk, and picks a worker by a tier-aware cost.

This package imports nothing else of the project.
"""

from __future__ import annotations

from radixcache.events.codec import (
    BatchEncoder,
    DecodeError,
    check_events,
    decode_batch,
    encode_batch,
)
from radixcache.events.index.kv_index import (
    IndexConfig,
    IndexStats,
    KvIndex,
    RoutingDecision,
    TierOverlap,
    WorkerId,
)
from radixcache.events.publisher import (
    BindError,
    EventPublisher,
    NullEventPublisher,
    PublisherConfig,
    PublisherStats,
)
from radixcache.events.subscriber import (
    BatchSink,
    EventSubscriber,
    SubscriberConfig,
    SubscriberStats,
    WorkerEndpoint,
)
from radixcache.events.sequence import SequenceSource, clock_base
from radixcache.events.types import (
    CPU_PINNED,
    DISK,
    EXTERNAL,
    GPU,
    HASH_LIMIT,
    MEDIA,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    Medium,
)
from radixcache.events.zmq_publisher import ZmqEventPublisher

__all__ = [
    "CPU_PINNED",
    "DISK",
    "EXTERNAL",
    "GPU",
    "HASH_LIMIT",
    "MEDIA",
    "AllBlocksCleared",
    "BatchEncoder",
    "BatchSink",
    "BindError",
    "BlockRemoved",
    "BlockStored",
    "DecodeError",
    "EventBatch",
    "EventPublisher",
    "EventSubscriber",
    "IndexConfig",
    "IndexStats",
    "KvEvent",
    "KvIndex",
    "Medium",
    "NullEventPublisher",
    "PublisherConfig",
    "PublisherStats",
    "RoutingDecision",
    "SequenceSource",
    "SubscriberConfig",
    "SubscriberStats",
    "TierOverlap",
    "WorkerEndpoint",
    "WorkerId",
    "ZmqEventPublisher",
    "check_events",
    "clock_base",
    "decode_batch",
    "encode_batch",
]
