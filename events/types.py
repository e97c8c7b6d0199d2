"""Event records: what the cache tells routers about its pages.

Three records mirror the wire format one to one (see ``events.codec``):

* ``BlockStored``   -- consecutive pages (blocks) became resident on a medium;
* ``BlockRemoved``  -- pages stopped being resident on a medium;
* ``AllBlocksCleared`` -- every page of this engine is gone, on every medium.

A batch of records published together is an ``EventBatch``: one per engine
step, carrying the publish timestamp and the data-parallel rank.

Block hashes are integers in ``[0, 2**63)``. That range is what both kinds of
decoders in the field accept: a consumer that reads them as unsigned 64-bit
(``u64``) and one that reads them as signed 64-bit (``i64``) see the same
value, and msgpack encodes them as a plain unsigned integer either way.

The records are values: the owner thread builds them and hands the list to a
publisher, which copies the list (not the records) and keeps the records until
it has encoded them. ``BlockStored`` and ``BlockRemoved`` are built per engine
step and per decoded event, so they are slotted but not frozen (a frozen
dataclass costs about three times as much to build); treat them as immutable
all the same, before and after publishing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, Union

import numpy as np
import numpy.typing as npt

Medium = Literal["GPU", "CPU_PINNED", "DISK", "EXTERNAL"]

GPU: Final = "GPU"  # device memory (HBM, or a CPU tensor without a GPU)
CPU_PINNED: Final = "CPU_PINNED"  # pinned host memory (the host tier)
DISK: Final = "DISK"  # committed to the local storage tier (LMDB)
EXTERNAL: Final = "EXTERNAL"  # committed to a shared pool (a storage server)

MEDIA: Final[tuple[Medium, ...]] = (GPU, CPU_PINNED, DISK, EXTERNAL)  # best tier first

# Medium vocabularies on the wire. Records always use SGLang's names (the
# default vocabulary); an encoder set to "vllm" writes vLLM's names instead,
# and the decoder reads either.
SGLANG_NAMES: Final[dict[str, str]] = {m: m for m in MEDIA}
VLLM_NAMES: Final[dict[str, str]] = {
    GPU: "GPU", CPU_PINNED: "CPU", DISK: "STORAGE", EXTERNAL: "EXTERNAL",
}
VOCABULARIES: Final[dict[str, dict[str, str]]] = {"sglang": SGLANG_NAMES, "vllm": VLLM_NAMES}
# wire name -> record medium, for both vocabularies
MEDIUM_OF_WIRE: Final[dict[str, Medium]] = {
    **{v: k for k, v in VLLM_NAMES.items()},  # type: ignore[misc]
    **{m: m for m in MEDIA},
}

HASH_LIMIT: Final = 1 << 63  # block hashes are ints in [0, HASH_LIMIT)

TokenIds = Union[list[int], npt.NDArray[np.integer[Any]]]  # a store's token ids, either form


@dataclass(slots=True)
class BlockStored:
    """``len(block_hashes)`` consecutive blocks became resident on ``medium``.

    ``token_ids`` holds all tokens of these blocks, concatenated, so its
    length is ``len(block_hashes) * block_size``: a list of ints, or a 1-D
    integer numpy array (an engine's own token array; it goes on the wire as
    the same list of ints, and decoded records always hold lists). A salted
    namespace sets ``cache_salt``; a namespace with a salt or extra keys also sets
    ``extra_keys``, one entry per block (what a router mixes into that
    block's hash to keep namespaces apart). Block ``i`` chains to block
    ``i - 1``; the first one chains to ``parent_block_hash`` (None for a block
    that starts a sequence). ``medium=None`` means the device tier, as peers
    read an unnamed medium; the encoder always writes the medium out.
    """

    block_hashes: list[int]  # one per block, each in [0, 2**63)
    parent_block_hash: int | None  # hash of the block before the first, if any
    token_ids: TokenIds  # all tokens of the blocks, concatenated
    block_size: int  # tokens per block (the page size P)
    lora_id: int | None = None  # adapter id of the namespace, if any
    medium: Medium | None = None  # where the blocks now live; None means GPU
    lora_name: str | None = None  # adapter name of the namespace, if any
    cache_salt: str | None = None  # tenant salt of the namespace (SGLang's key)
    # vLLM's per-block extra keys (one tuple or None per block), or None
    extra_keys: list[tuple[Any, ...] | None] | None = None


@dataclass(slots=True)
class BlockRemoved:
    """The blocks stopped being resident on ``medium`` (other media keep theirs)."""

    block_hashes: list[int]  # blocks leaving the medium, each in [0, 2**63)
    medium: Medium | None  # the medium they left; None means GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every block of the engine is gone from every medium.

    A new publisher sends this as its first batch, so a consumer drops what
    it believed about an earlier incarnation of the same engine.
    """


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published batch: the events of one engine step, in order."""

    ts: float  # wall-clock time of publish, seconds since the epoch
    events: list[KvEvent]  # never empty on the wire
    dp_rank: int | None = None  # data-parallel rank of the engine, if any
