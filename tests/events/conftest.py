"""Fixtures for the event tests: publishers on free loopback ports, sockets
that are always closed, subscribers into a fresh index."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import zmq
from tests.events.events_testkit import BS, MakePublisher

from radixcache.events import (
    EventSubscriber,
    IndexConfig,
    KvIndex,
    PublisherConfig,
    SubscriberConfig,
    WorkerEndpoint,
    ZmqEventPublisher,
)

ANY_PORT = "tcp://127.0.0.1:*"


@pytest.fixture
def make_publisher() -> Iterator[MakePublisher]:
    made: list[ZmqEventPublisher] = []

    def make(**overrides: object) -> ZmqEventPublisher:
        fields: dict[str, object] = {
            "endpoint": ANY_PORT,
            "replay_endpoint": ANY_PORT,
            "close_linger_ms": 200,
        }
        fields.update(overrides)
        pub = ZmqEventPublisher(PublisherConfig(**fields))  # type: ignore[arg-type]
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.close()


@pytest.fixture
def index() -> KvIndex:
    return KvIndex(IndexConfig(block_size=BS))


@pytest.fixture
def make_subscriber(index: KvIndex) -> Iterator[Callable[..., EventSubscriber]]:
    made: list[EventSubscriber] = []

    def make(*workers: WorkerEndpoint, replay_timeout_ms: int = 1_000) -> EventSubscriber:
        sub = EventSubscriber(index, workers, SubscriberConfig(replay_timeout_ms=replay_timeout_ms))
        made.append(sub)
        return sub

    yield make
    for sub in made:
        sub.close()


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    """A context for raw test sockets; every socket made from it is closed."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)
