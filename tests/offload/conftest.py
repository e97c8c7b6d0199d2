"""Fixtures shared by the offload tests: stores, pools on real servers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.offload.storekit import RECORD_BYTES, SPEC, PoolKit, StoreKit  # noqa: F401


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[StoreKit]:
    k = StoreKit(tmp_path)
    yield k
    k.close_all()


# -- the shared pool on real Valkey servers (tests/offload/valkey/valkey_servers.py) ------------
from tests.offload.valkey.valkey_servers import ValkeyCluster, ValkeyServer  # noqa: E402


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[ValkeyServer]:
    """One server for the session (256 MiB, volatile-lru, removal notifications)."""
    server = ValkeyServer(maxmemory=256 << 20)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[ValkeyCluster]:
    """A 3-node cluster for the session."""
    cluster = ValkeyCluster()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["single", "cluster"])
def pool_kit(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[PoolKit]:
    """A ``PoolKit`` on the session's single server, then on its cluster (both emptied)."""
    servers = request.getfixturevalue(
        "valkey_server" if request.param == "single" else "valkey_cluster"
    )
    servers.flush()
    kit = PoolKit(tmp_path, servers.url)
    yield kit
    kit.close_all()


@pytest.fixture
def pool_kit_at(tmp_path: Path) -> Iterator[Callable[[str], PoolKit]]:
    """Makes ``PoolKit`` on any pool URL (e.g. a test's own server); closes them at teardown."""
    kits: list[PoolKit] = []

    def make(url: str) -> PoolKit:
        kit = PoolKit(tmp_path / f"kit{len(kits)}", url)
        kits.append(kit)
        return kit

    yield make
    for kit in kits:
        kit.close_all()


@pytest.fixture
def single_kit(valkey_server: ValkeyServer, tmp_path: Path) -> Iterator[PoolKit]:
    """A ``PoolKit`` on the session's single server (emptied)."""
    valkey_server.flush()
    kit = PoolKit(tmp_path, valkey_server.url)
    yield kit
    kit.close_all()


# -- the shared pool on a real Mooncake master (tests/offload/mooncake/mooncake_pools.py) -------
from tests.offload.mooncake.mooncake_pools import MooncakeKit, require_mooncake  # noqa: E402

if TYPE_CHECKING:
    from radixcache.offload.mooncake import MasterProcess


@pytest.fixture(scope="session")
def mooncake_master() -> Iterator[MasterProcess]:
    """A master for the session (client_ttl 2 s) with one holder process of 256 MiB."""
    require_mooncake()
    from radixcache.offload.mooncake import HolderProcess, MasterProcess

    master = MasterProcess(client_ttl_s=2).start()
    try:
        holder = HolderProcess(master.url, 256).start()
    except BaseException:
        master.kill()
        raise
    yield master
    holder.kill()
    master.kill()


@pytest.fixture
def mooncake_kit(mooncake_master: MasterProcess, tmp_path: Path) -> Iterator[MooncakeKit]:
    """A ``MooncakeKit`` on the session's master (emptied)."""
    kit = MooncakeKit(tmp_path, mooncake_master.url)
    kit.empty()
    yield kit
    kit.close_all()


@pytest.fixture
def mooncake_kit_at(tmp_path: Path) -> Iterator[Callable[[str], MooncakeKit]]:
    """Makes ``MooncakeKit`` on any pool URL (e.g. a test's own master); closes them at teardown."""
    require_mooncake()
    kits: list[MooncakeKit] = []

    def make(url: str) -> MooncakeKit:
        kit = MooncakeKit(tmp_path / f"kit{len(kits)}", url)
        kits.append(kit)
        return kit

    yield make
    for kit in kits:
        kit.close_all()


# -- every backend, for the storage conformance tests (tests/offload/storage/) -----------------
from tests.offload.storage.backends_under_test import (  # noqa: E402
    BACKENDS,
    SHARED_BACKENDS,
    Backend,
    backend_under_test,
)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each backend in turn: LMDB, a Valkey server, a Valkey cluster, a Mooncake pool."""
    with backend_under_test(request.param, request, tmp_path) as under_test:
        yield under_test


@pytest.fixture(params=SHARED_BACKENDS)
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Each pool several engines open at once (LMDB has one owner: not here)."""
    with backend_under_test(request.param, request, tmp_path) as under_test:
        assert under_test.shared
        yield under_test
