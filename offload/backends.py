"""Choosing the storage backend by configuration: an LMDB directory, a Valkey or a Mooncake pool.

The one module that knows every backend (``offload/lmdb/``, ``offload/valkey/``,
``offload/mooncake/``);
the backends know nothing of each other. A new backend adds its scheme here.

``storage_config(target)`` turns what a user wrote into a backend's frozen
config; ``open_backend(target, spec, fingerprint)`` opens the backend::

    None                                  -> no storage tier (NullStorage)
    "lmdb:///var/cache/rx?capacity_gib=64" -> LmdbStorage (also a bare path: "./rx-data")
    "lmdb:///var/cache/rx?key_file=/etc/rx/storage.key"  -> ... records sealed (encrypted)
    "valkey://10.0.0.5:6379/0"            -> ValkeyStorage on one server
    "valkey://10.0.0.5:6379/0?key_env=RADIXCACHE_STORAGE_KEY" -> ... records sealed
    "valkeys://user@pool.internal:6380/0" -> ... over TLS (rediss:// too)
    "valkey://10.0.0.5:7000?cluster=true" -> ... on a Valkey cluster
    "mooncake://10.0.0.5:50051"           -> MooncakeStorage (a Mooncake Store master)
    StorageConfig(...) / ValkeyConfig(...) / MooncakeConfig(...) -> as given

Only opening a pool imports its client library (the ``valkey`` extra:
redis-py and hiredis; the ``mooncake`` extra: Mooncake's transfer engine);
LMDB-only users need neither.

Passwords: a URL may carry one (``valkey://user:secret@host``), but a command
line is visible to every user of the machine, so a pool URL without a password
takes it from the environment variable ``RADIXCACHE_VALKEY_PASSWORD`` when that
is set. The config object keeps it out of its repr; error messages show the
URL redacted.

Encryption at rest (offload/storage/crypt/): ``key_file=PATH`` names a file of
master keys, ``key_env=NAME`` an environment variable holding them; a URL
never carries a key itself.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

from radixcache.offload.lmdb import DURABILITY_MODES, StorageConfig, open_lmdb_storage
from radixcache.offload.mooncake import SCHEME as MOONCAKE_SCHEME
from radixcache.offload.mooncake import MooncakeConfig
from radixcache.offload.storage import ModelFingerprint, NullStorage, StorageOpening
from radixcache.offload.valkey import SCHEMES, ValkeyConfig, redact_url
from radixcache.transfer.layout import KVSpec

PASSWORD_ENV = "RADIXCACHE_VALKEY_PASSWORD"
StorageTarget = str | os.PathLike[str] | StorageConfig | ValkeyConfig | MooncakeConfig | None
BackendConfig = StorageConfig | ValkeyConfig | MooncakeConfig
_LMDB_OPTIONS = ("capacity_gib", "durability", "num_readers", "key_file", "key_env")


def storage_config(target: StorageTarget) -> BackendConfig | None:
    """The backend config ``target`` names (see the module docstring).

    Raises ValueError (URL redacted) for an unknown scheme or option, TypeError
    for anything that is not a target.
    """
    if target is None or isinstance(target, (StorageConfig, ValkeyConfig, MooncakeConfig)):
        return target
    if isinstance(target, os.PathLike):
        return StorageConfig(path=target)
    if not isinstance(target, str):
        raise TypeError(
            f"storage must be None, a URL or path str, a StorageConfig, ValkeyConfig or MooncakeConfig; "
            f"got {type(target).__name__}"
        )
    if not target:
        raise ValueError("storage must not be an empty string (None disables the tier)")
    scheme = urlsplit(target).scheme.lower() if "://" in target else ""
    if scheme in SCHEMES:
        config = ValkeyConfig.from_url(target)
        password = os.environ.get(PASSWORD_ENV)
        if config.password is None and password:
            config = config.with_password(password)
        return config
    if scheme == MOONCAKE_SCHEME:
        return MooncakeConfig.from_url(target)
    if scheme == "lmdb":
        return _lmdb_config(target)
    if scheme:
        raise ValueError(
            f"storage URL {redact_url(target)!r}: unknown scheme {scheme!r} "
            f"(known: lmdb, {MOONCAKE_SCHEME}, {', '.join(sorted(SCHEMES))})"
        )
    return StorageConfig(path=target)  # a bare directory path


def _lmdb_config(url: str) -> StorageConfig:
    parts = urlsplit(url)
    path = parts.netloc + parts.path
    if not path:
        raise ValueError(f"storage URL {url!r}: no directory (use lmdb:///abs/dir or lmdb://rel/dir)")
    fields: dict[str, object] = {"path": path}
    for name, values in parse_qs(parts.query).items():
        value = values[-1]
        if name == "capacity_gib":
            try:
                fields["capacity_bytes"] = int(float(value) * (1 << 30))
            except ValueError:
                raise ValueError(f"storage URL {url!r}: capacity_gib must be a number") from None
        elif name == "durability":
            if value not in DURABILITY_MODES:
                raise ValueError(f"storage URL {url!r}: durability must be one of {DURABILITY_MODES}")
            fields["durability"] = value
        elif name == "num_readers":
            if not value.isdigit():
                raise ValueError(f"storage URL {url!r}: num_readers must be a positive int")
            fields["num_readers"] = int(value)
        elif name in ("key_file", "key_env"):
            fields[name] = value
        else:
            raise ValueError(f"storage URL {url!r}: unknown option {name!r} (known: {_LMDB_OPTIONS})")
    return StorageConfig(**fields)  # type: ignore[arg-type]


def open_backend(
    target: StorageTarget, spec: KVSpec, fingerprint: ModelFingerprint
) -> StorageOpening:
    """Open the backend ``target`` names, bound to ``fingerprint``.

    LMDB: as ``open_lmdb_storage`` (a damaged store is moved aside, an
    unusable one disables the tier, unless ``on_open_error="strict"``). A
    pool (Valkey, Mooncake) is always "opened": one that is down is a miss on
    every call until it answers (the engine reconnects). None:
    ``NullStorage``, "disabled".
    """
    config = storage_config(target)
    if config is None:
        return StorageOpening(NullStorage(), "disabled")
    if isinstance(config, ValkeyConfig):
        try:  # the client library is an extra: only a pool needs it
            from radixcache.offload.valkey.storage import ValkeyStorage
        except ImportError as exc:
            raise ImportError(
                f"a Valkey pool needs the client library ({exc.name}): "
                "pip install 'radixcache[valkey]'"
            ) from exc
        return StorageOpening(ValkeyStorage(config, spec, fingerprint), "opened")
    if isinstance(config, MooncakeConfig):
        try:  # the client library is an extra: only a pool needs it
            from radixcache.offload.mooncake.storage import MooncakeStorage
        except ImportError as exc:
            raise ImportError(
                f"a Mooncake pool needs the client library ({exc.name or exc}): "
                "apt-get install libibverbs1 && pip install 'radixcache[mooncake]'"
            ) from exc
        return StorageOpening(MooncakeStorage(config, spec, fingerprint), "opened")
    return open_lmdb_storage(config, spec, fingerprint)
