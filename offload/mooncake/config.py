"""Configuration of the shared pool on Mooncake Store: master, metadata server, transport, limits.

URL form (every option may be left out)::

    mooncake://HOST[:PORT][?metadata=URL&metrics=URL&protocol=tcp&device=NAMES
                          &local_host=ADDR&segment_mib=0&replicas=1&tenant=NAME]

``HOST:PORT`` is the ``mooncake_master``'s RPC address (port 50051 by
default). ``metadata`` is the transfer engine's metadata server, by default
the master's built-in HTTP one, ``http://HOST:8080/metadata`` (its default
port; start the master with ``--enable_http_metadata_server=true``).
``metrics`` is the master's metrics/admin HTTP server (``http://HOST:9003``
for a master on its defaults); when given, ``stats()`` reports the pool's
key count, bytes in use and capacity from it, else they read 0.

Memory: by default an engine contributes **no memory** to the pool
(``segment_mib=0``). Mooncake keeps an object in the memory segment of the
client process the master placed it in, and a client that exits takes its
segment's objects with it (one that crashes leaves them unreadable until the
master's ``client_ttl``), so the pool's memory belongs in dedicated holder
processes (``python -m radixcache.offload.mooncake.holder``, one or more per
machine), not in engines that restart. ``segment_mib > 0`` makes the engine
a holder too, e.g. for a single-machine trial.

``tenant`` is Mooncake's own ``tenant_id``, which isolates keys only on a
master started with ``--enable_multi_tenants``; radixcache's namespaces are
kept apart with or without it (their keys and records differ).

Encryption at rest (``key_file`` / ``key_env``, which LMDB and a Valkey pool
take) is refused here: the reader sizes each record's head from the layout
of a record in the clear and receives the rest straight into the host page,
so sealed records would need a transport of their own. A configuration (or
URL) that names either raises ValueError naming both settings, so an engine
asked to encrypt never writes a Mooncake pool in the clear.
"""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from radixcache.offload.storage.crypt import NO_KEYS, KeySource

SCHEME = "mooncake"
DEFAULT_PORT = 50051  # mooncake_master's RPC port
DEFAULT_METADATA_PORT = 8080  # its built-in HTTP metadata server
PROTOCOLS = ("tcp", "rdma")
_URL_OPTIONS = {
    "metadata": "metadata_url",
    "metrics": "metrics_url",
    "protocol": "protocol",
    "device": "device",
    "local_host": "local_host",
    "segment_mib": "segment_mib",
    "replicas": "replicas",
    "tenant": "tenant",
    "key_file": "key_file",  # refused (see the module docstring), named for a clear error
    "key_env": "key_env",
}
_INT_OPTIONS = {"segment_mib", "replicas"}


@dataclass(frozen=True, slots=True)
class MooncakeConfig:
    """Where the pool's master is and how this process uses it. Validated on construction.

    Build it with ``MooncakeConfig.from_url(url, ...)``; keyword overrides set
    the fields the URL does not carry (timeouts, batch sizes, key prefix).
    """

    host: str = "127.0.0.1"  # the master's RPC address
    port: int = DEFAULT_PORT
    metadata_url: str | None = None  # None: http://host:8080/metadata
    metrics_url: str | None = None  # the master's metrics server; None: pool sizes unknown
    protocol: str = "tcp"  # transfer engine: "tcp" (loopback, Ethernet) or "rdma"
    device: str = ""  # RDMA device names ("" for TCP)
    local_host: str | None = None  # address this process advertises; None: see resolved_local_host
    segment_mib: int = 0  # memory this process contributes to the pool (0: none; see above)
    replicas: int = 1  # copies of each object (on different segments where there are several)
    tenant: str = "default"  # Mooncake tenant_id (needs the master's multi-tenant mode)
    key_prefix: str = "rxkv/"  # every key this library writes starts with it
    num_readers: int = 2  # threads serving get()
    batch_pages: int = 64  # pages per batch call (bounds the bytes one call moves)
    connect_timeout_s: float = 5.0  # how long opening waits for the client's setup
    retry_after_s: float = 1.0  # after a failure, calls answer "unavailable" this long
    setup_retries: int = 1  # Mooncake's own setup retries (each ~4.5 s against a dead master)
    log_level: str = "ERROR"  # the client library's log level (MC_LOG_LEVEL)
    # Encryption at rest is not supported on this backend: either set raises
    # ValueError (see the module docstring); kept so that every backend config
    # takes the same key settings.
    key_file: str | None = None
    key_env: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty str, got {self.host!r}")
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 < self.port < 65536:
            raise ValueError(f"port must be an int in [1, 65535], got {self.port!r}")
        for name in ("metadata_url", "metrics_url"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, str) and value.startswith(("http://", "https://", "etcd://"))
            ):
                raise ValueError(f"{name} must be an http:// URL (or etcd:// for metadata), got {value!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if not isinstance(self.device, str):
            raise TypeError(f"device must be a str, got {type(self.device).__name__}")
        if self.local_host is not None and (not isinstance(self.local_host, str) or not self.local_host):
            raise ValueError(f"local_host must be a non-empty str or None, got {self.local_host!r}")
        if not isinstance(self.segment_mib, int) or isinstance(self.segment_mib, bool) or self.segment_mib < 0:
            raise ValueError(f"segment_mib must be an int >= 0, got {self.segment_mib!r}")
        positive_int("replicas", self.replicas)
        if not isinstance(self.tenant, str) or not self.tenant:
            raise ValueError(f"tenant must be a non-empty str, got {self.tenant!r}")
        if not isinstance(self.key_prefix, str) or not 0 < len(self.key_prefix) <= 32 or any(
            c.isspace() for c in self.key_prefix
        ):
            raise ValueError(f"key_prefix must be 1 to 32 characters without spaces, got {self.key_prefix!r}")
        positive_int("num_readers", self.num_readers)
        positive_int("batch_pages", self.batch_pages)
        positive_float("connect_timeout_s", self.connect_timeout_s)
        positive_float("retry_after_s", self.retry_after_s)
        positive_int("setup_retries", self.setup_retries)
        if self.log_level not in ("INFO", "WARNING", "ERROR"):
            raise ValueError(f"log_level must be INFO, WARNING or ERROR, got {self.log_level!r}")
        if self.key_file is not None or self.key_env is not None:
            raise ValueError(
                "key_file / key_env (encryption at rest) are not supported on a Mooncake pool: "
                "seal records on LMDB or a Valkey pool, or use this pool in the clear"
            )

    @property
    def keys(self) -> KeySource:
        """Where the pool's master keys come from: none (records in the clear)."""
        return NO_KEYS

    @classmethod
    def from_url(cls, url: str, **overrides: object) -> MooncakeConfig:
        """Parse ``url`` (see the module docstring); ``overrides`` set other fields.

        Raises ValueError naming the problem.
        """
        if not isinstance(url, str):
            raise TypeError(f"a pool URL must be a str, got {type(url).__name__}")
        parts = urlsplit(url)
        if parts.scheme.lower() != SCHEME:
            raise ValueError(f"pool URL {url!r}: the scheme must be {SCHEME}://")
        if parts.username or parts.password:
            raise ValueError(f"pool URL {url!r}: Mooncake takes no credentials")
        if parts.path.strip("/"):
            raise ValueError(f"pool URL {url!r}: no path expected (options go after '?')")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"pool URL {url!r}: the port is not a number in [0, 65535]") from None
        fields: dict[str, object] = {"host": parts.hostname or "127.0.0.1", "port": port}
        for name, values in parse_qs(parts.query, keep_blank_values=True).items():
            field = _URL_OPTIONS.get(name)
            if field is None:
                raise ValueError(
                    f"pool URL {url!r}: unknown option {name!r} (known: {', '.join(_URL_OPTIONS)})"
                )
            value: object = values[-1]
            if name in _INT_OPTIONS:
                if not values[-1].isdigit():
                    raise ValueError(f"pool URL {url!r}: {name} must be a whole number, got {values[-1]!r}")
                value = int(values[-1])
            fields[field] = value
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]

    @property
    def master_address(self) -> str:
        """``host:port`` of the master's RPC server."""
        return f"{self.host}:{self.port}"

    @property
    def resolved_metadata_url(self) -> str:
        """The metadata server: as given, or the master's built-in one."""
        return self.metadata_url or f"http://{self.host}:{DEFAULT_METADATA_PORT}/metadata"

    @property
    def resolved_local_host(self) -> str:
        """The address this process advertises to the others: as given, else
        127.0.0.1 when the master is on loopback (everything on this machine),
        else this machine's host name."""
        if self.local_host is not None:
            return self.local_host
        if _is_loopback(self.host):
            return "127.0.0.1"
        import socket

        return socket.gethostname()

    def describe(self) -> str:
        """The pool's URL for messages."""
        return f"{SCHEME}://{self.host}:{self.port}"

    def client_settings(self) -> dict[str, Any]:
        """What ``MooncakeDistributedStore.setup`` takes, for this configuration."""
        return {
            "local_hostname": self.resolved_local_host,
            "metadata_server": self.resolved_metadata_url,
            "global_segment_size": self.segment_mib << 20,
            "local_buffer_size": 0,  # every transfer is zero-copy from registered memory
            "protocol": self.protocol,
            "rdma_devices": self.device,
            "master_server_addr": self.master_address,
            "tenant_id": self.tenant,
        }

    def configure_client_environment(self) -> None:
        """Set the client library's environment settings that are not set yet
        (it reads them from the process environment: the first client of a
        process decides). ``MC_LOG_LEVEL`` counts only before the library is
        loaded."""
        local = self.resolved_local_host
        if _is_address(local):  # the address the transfer engine advertises for its data
            os.environ.setdefault("MC_TCP_BIND_ADDRESS", local)
        os.environ.setdefault("MC_LOG_LEVEL", self.log_level)
        os.environ.setdefault("MC_STORE_CLIENT_SETUP_RETRIES", str(self.setup_retries))


def positive_int(name: str, value: object) -> int:
    """``value`` if it is an int (not a bool) above 0; else ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def positive_float(name: str, value: object) -> float:
    """``value`` as a float if it is a finite number above 0; else ValueError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
