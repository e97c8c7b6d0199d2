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
all the same, before and after publishing. Their block ids may be handed in
as an int64 array, or as ``DeferredIds`` that compute the array: the
Python ints of the list that ``block_hashes`` reads as (and, deferred, the
ids themselves) are then built by whoever reads it first (the publisher's
thread), not by the owner thread that recorded them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Final, Literal, Union

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


class DeferredIds:
    """``count`` block ids computed when first read: ``build()`` returns them
    as an int64 array. What the cache's recorder hands over for removed
    pages: their ids are recomputed from the pages' tokens (the tree keeps
    no id per page), by whoever reads them first."""

    __slots__ = ("count", "build")

    def __init__(self, count: int, build: Callable[[], npt.NDArray[np.int64]]) -> None:
        self.count = count
        self.build = build

    def __len__(self) -> int:
        return self.count


# A record's block ids as given to it: a list of ints, an int64 numpy array
# (what the cache's recorder hands over for stores, with no Python int built
# on the owner thread), or ``DeferredIds`` (its removals).
BlockHashes = Union[list[int], npt.NDArray[np.int64], DeferredIds]


class _Blocks:
    """The block ids of a record. Given as an array (or ``DeferredIds``),
    they become the list of ints that ``block_hashes`` returns the first
    time anyone reads them (the publisher's thread, when it publishes),
    once; equal lists either way."""

    __slots__ = ("_hashes",)
    _hashes: BlockHashes

    @property
    def block_hashes(self) -> list[int]:
        """The block ids, a list of ints in ``[0, 2**63)``."""
        h = self._hashes
        if type(h) is DeferredIds:
            h = h.build()
        if not isinstance(h, np.ndarray):
            return h  # type: ignore[return-value]  # (as given: the checks name anything that is no list of ints)
        ids: list[int] = h.tolist()
        self._hashes = ids  # (two threads reading at once build equal lists)
        return ids

    @property
    def num_blocks(self) -> int:
        """``len(block_hashes)``, without building the list."""
        return len(self._hashes)

    # Values, as the dataclasses they replace: equal when of one type with
    # equal fields (``block_hashes`` read as lists), printed field by field,
    # unhashable (mutable).
    __match_args__: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__match_args__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in zip(self.__match_args__, self._values()))
        return f"{type(self).__name__}({fields})"


class BlockStored(_Blocks):
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
    ``block_hashes`` may be given as an int64 array (see ``_Blocks``); it
    always reads as a list.
    """

    # (radixcache's compiled core builds an insert's record through these
    # slots: ``STORED_SLOTS`` of radixcache/native/victims.pxi.)
    __slots__ = ("parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                 "cache_salt", "extra_keys")
    __match_args__ = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                      "lora_name", "cache_salt", "extra_keys")

    def __init__(
        self,
        block_hashes: BlockHashes,  # one per block, each in [0, 2**63)
        parent_block_hash: int | None,  # hash of the block before the first, if any
        token_ids: TokenIds,  # all tokens of the blocks, concatenated
        block_size: int,  # tokens per block (the page size P)
        lora_id: int | None = None,  # adapter id of the namespace, if any
        medium: Medium | None = None,  # where the blocks now live; None means GPU
        lora_name: str | None = None,  # adapter name of the namespace, if any
        cache_salt: str | None = None,  # tenant salt of the namespace (SGLang's key)
        # vLLM's per-block extra keys (one tuple or None per block), or None
        extra_keys: list[tuple[Any, ...] | None] | None = None,
    ) -> None:
        self._hashes = block_hashes
        self.parent_block_hash = parent_block_hash
        self.token_ids = token_ids
        self.block_size = block_size
        self.lora_id = lora_id
        self.medium = medium
        self.lora_name = lora_name
        self.cache_salt = cache_salt
        self.extra_keys = extra_keys


class BlockRemoved(_Blocks):
    """The blocks stopped being resident on ``medium`` (other media keep
    theirs). ``block_hashes``: blocks leaving the medium, each in
    ``[0, 2**63)``, a list, an int64 array or ``DeferredIds`` (see
    ``_Blocks``); ``medium``:
    the medium they left, None meaning GPU."""

    __slots__ = ("medium",)
    __match_args__ = ("block_hashes", "medium")

    def __init__(self, block_hashes: BlockHashes, medium: Medium | None) -> None:
        self._hashes = block_hashes
        self.medium = medium


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
