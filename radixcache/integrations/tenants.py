"""Tenants of a serving engine as radixcache namespaces, and the keys they own.

One mapping for both adapters (vLLM tier, SGLang backend): a request's
``cache_salt`` names its tenant, and ``tenant_namespace`` turns it into the
radixcache ``Namespace`` under which its pages are stored. Quotas, retention
and encryption per tenant hang off that namespace; nothing else in the
adapters interprets a salt.

Where the salt comes from (neither engine hands it to its storage tiers):

* vLLM 0.33 gives a secondary tier a ``ReqContext`` with the request's
  ``kv_transfer_params``; the tenant is ``kv_transfer_params["cache_salt"]``.
* SGLang 0.5.23 gives a storage backend a ``HiCacheStorageExtraInfo``; the
  tenant is ``extra_info.extra_info["cache_salt"]``.

Both engines already fold the request's own ``cache_salt`` into their page
hashes, so two tenants never share an engine key; the namespace adds the
tenant to radixcache's records (their namespace tag) and binds every stored
key to it, so a tenant is also kept apart when the engine keys agree.

Stored key of an engine key ``k`` (one form byte, so every stored key maps
back to exactly one engine key)::

    default namespace:  0x00 | k
    salted tenant:      0x01 | namespace digest (12 bytes) | k
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixcache.namespace import DEFAULT_NAMESPACE, Namespace

SALT_KEY = "cache_salt"  # the key both engines' per-request dicts name the tenant by
TENANT_DIGEST_BYTES = 12  # namespace digest bytes in a salted tenant's stored key
_DEFAULT_FORM = b"\x00"
_TENANT_FORM = b"\x01"
TENANT_KEY_OVERHEAD = 1 + TENANT_DIGEST_BYTES  # longest prefix a stored key adds


def tenant_namespace(cache_salt: object) -> Namespace:
    """The namespace of a tenant named by ``cache_salt``.

    None or "" (both engines treat an empty salt as none): the default,
    shared namespace. A str: ``Namespace(salt=cache_salt)``, the namespace
    the engine's own ``RadixCache`` gives a request with that salt. Anything
    else is refused here, when it enters (TypeError).
    """
    if cache_salt is None or cache_salt == "":
        return DEFAULT_NAMESPACE
    if not isinstance(cache_salt, str):
        raise TypeError(f"cache_salt must be a str, got {type(cache_salt).__name__}")
    return Namespace(salt=cache_salt)


def salt_of(params: Mapping[str, Any] | None) -> object:
    """The ``cache_salt`` entry of an engine's per-request dict (None if absent)."""
    if params is None:
        return None
    if not isinstance(params, Mapping):
        raise TypeError(f"per-request parameters must be a mapping, got {type(params).__name__}")
    return params.get(SALT_KEY)


def stored_key(namespace: Namespace, key: bytes) -> bytes:
    """The key a page of ``namespace`` is stored under (module docstring)."""
    if namespace == DEFAULT_NAMESPACE:
        return _DEFAULT_FORM + key
    return _TENANT_FORM + namespace.digest()[:TENANT_DIGEST_BYTES] + key


def engine_key(stored: bytes) -> bytes:
    """The engine key a stored key was made from (the inverse of ``stored_key``)."""
    form = stored[:1]
    if form == _DEFAULT_FORM:
        return stored[1:]
    if form == _TENANT_FORM and len(stored) > TENANT_KEY_OVERHEAD:
        return stored[TENANT_KEY_OVERHEAD:]
    raise ValueError(f"stored key {stored[:16].hex()}... has no tenant form byte")
