"""Tags and retention on a Mooncake pool: another engine's ``invalidate_tag``
forgets the namespaces a tag lists; a put with a retention deadline writes
nothing (retention is not supported on Mooncake yet) and is counted."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from radixcache.offload import PutMeta

if TYPE_CHECKING:
    from tests.offload.mooncake.mooncake_pools import MooncakeKit


def _meta(n: int, tags: tuple[str, ...] = (), expires_at: float | None = None) -> PutMeta:
    return PutMeta(list(range(n)), None, 0, tags=tags, expires_at=expires_at)


def test_another_engine_invalidates_a_tag_and_a_deadline_is_refused(mooncake_kit: MooncakeKit) -> None:
    kit = mooncake_kit
    writer, other = kit.pool(), kit.pool()
    host = kit.host(16)
    tagged, kept = kit.keys(4, b"t"), kit.keys(3, b"k")
    toks_t, toks_k = kit.tokens(4), kit.tokens(3, 4)
    pages = np.arange(4, dtype=np.int32)
    assert kit.done(writer.put(tagged, toks_t, host, pages, b"ns-1", meta=_meta(4, ("doc:1",)))) == 4
    assert kit.done(writer.put(kept, toks_k, host, pages[:3], b"ns-2", meta=_meta(3, ("doc:2",)))) == 3

    assert kit.done(other.invalidate_tag("doc:1")) == 4  # the markers of its 4 pages
    assert kit.done(writer.get(tagged, toks_t, host, np.arange(8, 12, dtype=np.int32), b"ns-1")) == 0
    assert kit.done(writer.get(kept, toks_k, host, np.arange(8, 11, dtype=np.int32), b"ns-2")) == 3
    assert kit.done(other.invalidate_tag("doc:1")) == 0

    late = kit.keys(2, b"late")
    ticket = writer.put(late, kit.tokens(2), host, pages[:2], b"ns-3", meta=_meta(2, expires_at=time.time() + 3600))
    assert kit.done(ticket) == 0
    assert writer.longest_prefix(late) == 0
    assert writer.pool_stats().past_deadline == 2
