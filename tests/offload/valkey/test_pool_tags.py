"""Tags in the pool: a put records its namespace under each of its tags, and any
engine's ``invalidate_tag`` forgets those namespaces, on a server and a cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from radixcache.offload import PutMeta
from radixcache.offload.valkey.lifetime.tags import TagSets

if TYPE_CHECKING:
    from tests.offload.conftest import PoolKit
    from tests.offload.valkey.valkey_servers import ValkeyServer


def _put(kit: PoolKit, pool, keys: list[bytes], ns: bytes, tags: tuple[str, ...], host) -> int:  # type: ignore[no-untyped-def]
    n = len(keys)
    meta = PutMeta(block_ids=list(range(n)), parent_block_id=None, first_depth=0, tags=tags)
    result: int = kit.done(pool.put(keys, kit.tokens(n), host, np.arange(n, dtype=np.int32), ns, meta=meta))
    return result


def test_another_engine_invalidates_every_namespace_of_a_tag(pool_kit: PoolKit) -> None:
    writer, other = pool_kit.pool(), pool_kit.pool()  # two engines on one pool
    host = pool_kit.host(16)
    doc1, both, elsewhere, untagged = (pool_kit.keys(n, salt) for n, salt in
                                      ((5, b"a"), (3, b"b"), (4, b"c"), (2, b"d")))
    assert _put(pool_kit, writer, doc1, b"ns-1", ("doc:1",), host) == 5
    assert _put(pool_kit, writer, both, b"ns-2", ("doc:1", "team/x"), host) == 3
    assert _put(pool_kit, writer, elsewhere, b"ns-3", ("doc:2",), host) == 4
    assert _put(pool_kit, writer, untagged, b"ns-4", (), host) == 2

    assert pool_kit.done(other.invalidate_tag("doc:1")) == 8
    assert writer.longest_prefix(doc1) == 0
    assert writer.longest_prefix(both) == 0
    assert writer.longest_prefix(elsewhere) == 4
    assert writer.longest_prefix(untagged) == 2
    assert other.stats().deleted == 8
    assert pool_kit.done(other.invalidate_tag("doc:1")) == 0  # nothing left under it
    assert pool_kit.done(writer.invalidate_tag("team/x")) == 0  # its namespace is gone already
    assert pool_kit.done(writer.invalidate_tag("doc:2")) == 4
    assert writer.longest_prefix(elsewhere) == 0
    # the invalidating engine's own pages are reported as removals
    assert set(writer.take_removed()) >= set(elsewhere)


def test_pages_put_after_an_invalidation_stay_and_are_tagged_again(pool_kit: PoolKit) -> None:
    pool = pool_kit.pool()
    host = pool_kit.host(8)
    keys = pool_kit.keys(3)
    _put(pool_kit, pool, keys, b"ns", ("t",), host)
    assert pool_kit.done(pool.invalidate_tag("t")) == 3
    assert _put(pool_kit, pool, keys, b"ns", ("t",), host) == 3
    assert pool.longest_prefix(keys) == 3
    assert pool_kit.done(pool.invalidate_tag("t")) == 3


def test_the_tag_set_is_scoped_to_the_model_and_emptied(
    single_kit: PoolKit, valkey_server: ValkeyServer
) -> None:
    from radixcache.offload import ModelFingerprint

    pool = single_kit.pool()
    other_model = single_kit.pool(ModelFingerprint("another-model", single_kit.spec.describe(), 0))
    host = single_kit.host(8)
    keys = single_kit.keys(2)
    _put(single_kit, pool, keys, b"ns", ("shared-label",), host)
    _put(single_kit, other_model, keys, b"ns", ("shared-label",), host)
    assert single_kit.done(other_model.invalidate_tag("shared-label")) == 2
    assert pool.longest_prefix(keys) == 2  # the other model's namespaces only
    sets = TagSets(pool.config.key_prefix, pool.fingerprint.digest())
    with valkey_server.client() as raw:
        assert raw.exists(sets.key("shared-label")) == 1
        assert single_kit.done(pool.invalidate_tag("shared-label")) == 2
        assert raw.exists(sets.key("shared-label")) == 0


@pytest.mark.parametrize("tag", ["", "has space", "x" * 129, "caf\u00e9", "tab\t"])
def test_a_bad_tag_is_refused_when_called(single_kit: PoolKit, tag: str) -> None:
    pool = single_kit.pool()
    with pytest.raises(ValueError, match="printable ASCII"):
        pool.invalidate_tag(tag)
    with pytest.raises(TypeError):
        pool.invalidate_tag(b"bytes")  # type: ignore[arg-type]
