"""Configuration of the shared pool on Valkey: server URL, credentials, TLS, limits.

URL forms (``valkeys://`` and ``rediss://`` use TLS)::

    valkey://[user[:password]@]host[:port][/db][?option=value&...]
    valkey://[user[:password]@]host1:port1,host2:port2,...?cluster=true
    redis://...   rediss://...   valkeys://...

``key_file`` / ``key_env`` seal the records with the master keys of a key
file or an environment variable (encryption at rest, offload/storage/crypt/).

A password may come in the URL or in ``password``; either way it is kept out
of ``repr()``, ``describe()``, log lines and error messages (``describe()``
shows the URL with the password replaced by ``***``). A cluster is named by
``?cluster=true`` and one or more of its nodes (seeds): the client learns
the others from whichever seed, or node it learnt of before, answers.

Options in the query (``URL_OPTIONS``): ``cluster``, ``chunk_pages``,
``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``, ``socket_timeout_s``,
``connect_timeout_s``, ``key_file``, ``key_env``, so that everything an
engine and a router must agree on (or need to connect) fits in the one URL
both are given.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qs, unquote, urlsplit

from radixcache.offload.storage.checks import positive_float, positive_int
from radixcache.offload.storage.contract import Clock
from radixcache.offload.storage.crypt import KeySource

SCHEMES = {"valkey": False, "redis": False, "valkeys": True, "rediss": True}  # -> TLS
DEFAULT_PORT = 6379
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
URL_OPTIONS = (
    "cluster", "chunk_pages", "tls_ca_file", "tls_cert_file", "tls_key_file",
    "socket_timeout_s", "connect_timeout_s", "key_file", "key_env",
)  # fmt: skip
# Pages per value when ``chunk_pages`` is None: as many as fit in this many
# bytes, at most MAX_AUTO_CHUNK_PAGES (README, "What the pool holds": measured).
AUTO_CHUNK_BYTES = 4 << 20
MAX_AUTO_CHUNK_PAGES = 1
MAX_CHUNK_PAGES = 256

Node = tuple[str, int]  # (host, port)
TenantLimits = Mapping[bytes | None, int | None]  # tenant -> pool bytes (None: no limit)


@dataclass(frozen=True, slots=True)
class ValkeyConfig:
    """Where the pool is and how this process uses it. Validated on construction.

    Build it with ``ValkeyConfig.from_url(url, ...)``: the URL's parts land in
    the fields below (a password in the URL moves to ``password``).
    """

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    db: int = 0  # database number (a cluster has only 0)
    cluster: bool = False  # the server is one node of a Valkey cluster
    tls: bool = False  # valkeys:// or rediss://
    username: str | None = None  # ACL user (None: the default user)
    password: str | None = field(default=None, repr=False)  # never shown
    tls_ca_file: str | None = None  # CA bundle to verify the server with
    tls_cert_file: str | None = None  # client certificate (mutual TLS)
    tls_key_file: str | None = None  # its private key
    socket_timeout_s: float = 1.0  # one command's reply; past it, the pool counts as down
    connect_timeout_s: float = 0.5  # opening a connection
    retry_after_s: float = 1.0  # after a failure, lookups answer "nothing" this long
    ttl_s: int | None = 7 * 24 * 3600  # records' time to live (None: none); see the README
    key_prefix: bytes = b"rxkv:"  # every key this library writes starts with it
    num_readers: int = 2  # threads serving get()
    batch_pages: int = 64  # pages per pipeline (bounds the bytes in flight per call)
    lookup_first_round: int = 64  # pages asked in a lookup's first round trip
    observe_removals: bool = True  # subscribe to keyspace events where the server sends them
    seeds: tuple[Node, ...] = ()  # more cluster nodes to learn the cluster from (besides host:port)
    # Pages per stored value on average (writer and readers must agree; see
    # offload/valkey/layout.py); None: from the page size (``pages_per_value``).
    chunk_pages: int | None = None
    namespace_shards: int = 256  # sets a namespace's index is split into (by hash slot)
    # Encryption at rest: a file of master keys, or the name of an environment
    # variable holding them (never the keys themselves); neither: in the clear.
    key_file: str | None = None
    key_env: str | None = None
    # Per-tenant limits on value bytes in the pool (offload/valkey/lifetime/quotas.py):
    # tenant (as put() names it; None: the default tenant) -> bytes, None: no
    # limit; tenants not listed get ``tenant_quota_default`` (None: no limit).
    tenant_quotas: TenantLimits = field(default_factory=dict, hash=False, repr=False)
    tenant_quota_default: int | None = None
    # Wall clock that retention deadlines (PutMeta.expires_at) are compared with.
    clock: Clock = field(default=time.time, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty str, got {self.host!r}")
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 < self.port < 65536:
            raise ValueError(f"port must be an int in [1, 65535], got {self.port!r}")
        if not isinstance(self.db, int) or isinstance(self.db, bool) or self.db < 0:
            raise ValueError(f"db must be a non-negative int, got {self.db!r}")
        if self.cluster and self.db != 0:
            raise ValueError(f"a Valkey cluster has only database 0, got db={self.db}")
        for name in ("username", "password", "tls_ca_file", "tls_cert_file", "tls_key_file"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
        positive_float("socket_timeout_s", self.socket_timeout_s)
        positive_float("connect_timeout_s", self.connect_timeout_s)
        positive_float("retry_after_s", self.retry_after_s)
        if self.ttl_s is not None:
            positive_int("ttl_s", self.ttl_s)
        if not isinstance(self.key_prefix, bytes) or not 0 < len(self.key_prefix) <= 32:
            raise ValueError(f"key_prefix must be 1 to 32 bytes, got {self.key_prefix!r}")
        positive_int("num_readers", self.num_readers)
        positive_int("batch_pages", self.batch_pages)
        positive_int("lookup_first_round", self.lookup_first_round)
        positive_int("namespace_shards", self.namespace_shards)
        if self.namespace_shards > 4096:
            raise ValueError(f"namespace_shards must be at most 4096, got {self.namespace_shards}")
        if self.chunk_pages is not None:
            positive_int("chunk_pages", self.chunk_pages)
            if self.chunk_pages > MAX_CHUNK_PAGES:
                raise ValueError(f"chunk_pages must be <= {MAX_CHUNK_PAGES}, got {self.chunk_pages}")
        if not isinstance(self.seeds, tuple):
            raise TypeError(f"seeds must be a tuple of (host, port), not {type(self.seeds).__name__}")
        for seed in self.seeds:
            if (
                not isinstance(seed, tuple) or len(seed) != 2 or not isinstance(seed[0], str)
                or not seed[0] or not isinstance(seed[1], int) or not 0 < seed[1] < 65536
            ):  # fmt: skip
                raise ValueError(f"a seed is (host, port in [1, 65535]), got {seed!r}")
        if self.seeds and not self.cluster:
            raise ValueError("several nodes name a cluster: add ?cluster=true (cluster=True)")
        KeySource(self.key_file, self.key_env)  # validates them
        limits, default = check_tenant_limits(self.tenant_quotas, self.tenant_quota_default)
        object.__setattr__(self, "tenant_quotas", limits)  # a private, checked copy (a dict: configs are pickled into spawned engines)
        if not callable(self.clock):
            raise TypeError(f"clock must be a callable returning seconds, got {self.clock!r}")

    def tenant_limit(self, tenant: bytes | None) -> int | None:
        """The pool bytes ``tenant`` may keep (None: no limit), as configured."""
        return self.tenant_quotas.get(tenant, self.tenant_quota_default)

    @property
    def keys(self) -> KeySource:
        """Where the pool's master keys come from (none: records in the clear)."""
        return KeySource(self.key_file, self.key_env)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node the configuration names, the first one first (seeds of a cluster)."""
        return ((self.host, self.port), *(s for s in self.seeds if s != (self.host, self.port)))

    def pages_per_value(self, page_bytes: int) -> int:
        """Pages a stored value holds on average for pages of ``page_bytes``:
        ``chunk_pages``, or as many as fit in ``AUTO_CHUNK_BYTES`` (1 to
        ``MAX_AUTO_CHUNK_PAGES``)."""
        if self.chunk_pages is not None:
            return self.chunk_pages
        return max(1, min(MAX_AUTO_CHUNK_PAGES, AUTO_CHUNK_BYTES // max(1, page_bytes)))

    @classmethod
    def from_url(cls, url: str, **overrides: object) -> ValkeyConfig:
        """Parse ``url`` (see the module docstring); ``overrides`` set other fields.

        Raises ValueError naming the problem; the message never contains the
        password.
        """
        if not isinstance(url, str):
            raise TypeError(f"a pool URL must be a str, got {type(url).__name__}")
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        shown = redact_url(url)
        if scheme not in SCHEMES:
            raise ValueError(f"pool URL {shown!r}: scheme must be one of {sorted(SCHEMES)}")
        nodes = _nodes(parts.netloc.rpartition("@")[2], shown)
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ValueError(f"pool URL {shown!r}: the path must be a database number")
        fields: dict[str, object] = {
            "host": nodes[0][0],
            "port": nodes[0][1],
            "seeds": tuple(nodes[1:]),
            "db": int(path) if path else 0,
            "tls": SCHEMES[scheme],
            "username": unquote(parts.username) if parts.username else None,
            "password": unquote(parts.password) if parts.password is not None else None,
        }
        for name, values in parse_qs(parts.query).items():
            fields[name] = _option(name, values[-1], shown)
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]

    def with_password(self, password: str | None) -> ValkeyConfig:
        return replace(self, password=password)

    def describe(self) -> str:
        """The pool's URL for messages: the password (if any) shown as ``***``."""
        scheme = "valkeys" if self.tls else "valkey"
        user = self.username or ""
        auth = f"{user}:***@" if self.password is not None else (f"{user}@" if user else "")
        tail = "?cluster=true" if self.cluster else f"/{self.db}"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.nodes)
        return f"{scheme}://{auth}{hosts}{tail}"


def check_tenant_limits(
    quotas: object, default: object
) -> tuple[Mapping[bytes | None, int | None], int | None]:
    """A checked copy of per-tenant pool limits and the checked
    default; TypeError / ValueError name what is wrong (a tenant is shown by
    its length only: a salt may be a secret)."""
    if not isinstance(quotas, Mapping):
        raise TypeError(
            f"tenant_quotas must be a mapping of tenant -> bytes, got {type(quotas).__name__}"
        )
    checked: dict[bytes | None, int | None] = {}
    for tenant, limit in quotas.items():
        if tenant is not None and not isinstance(tenant, bytes):
            raise TypeError(f"tenant_quotas: a tenant is bytes or None, got {type(tenant).__name__}")
        name = "None" if tenant is None else f"<{len(tenant)}-byte tenant>"
        checked[tenant] = _limit(limit, f"tenant_quotas[{name}]")
    return checked, _limit(default, "tenant_quota_default")


def _limit(value: object, where: str) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise ValueError(f"{where} must be a non-negative int of bytes or None, got {value!r}")
    return value


def _nodes(hostlist: str, shown: str) -> list[Node]:
    """The ``host[:port]`` entries of a URL's host part (comma-separated)."""
    out: list[Node] = []
    for entry in hostlist.split(",") if hostlist else [""]:
        part = urlsplit(f"//{entry}")
        try:
            port = part.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"pool URL {shown!r}: a port is not a number in [0, 65535]") from None
        out.append((part.hostname or "127.0.0.1", port))
    return out


def _option(name: str, value: str, shown: str) -> object:
    """A query option's value, checked (the config checks ranges)."""
    if name not in URL_OPTIONS:
        known = ", ".join(URL_OPTIONS)
        raise ValueError(f"pool URL {shown!r}: unknown option {name!r} (known: {known})")
    if name == "cluster":
        if value.lower() not in _TRUE | _FALSE:
            raise ValueError(f"pool URL {shown!r}: cluster must be true or false, got {value!r}")
        return value.lower() in _TRUE
    if name == "chunk_pages":
        if not value.isdigit():
            raise ValueError(f"pool URL {shown!r}: chunk_pages must be an int >= 1, got {value!r}")
        return int(value)
    if name.endswith("_s"):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"pool URL {shown!r}: {name} must be a number: {value!r}") from None
    return value  # a file path


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()
