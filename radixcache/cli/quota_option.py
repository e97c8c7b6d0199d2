"""``--quotas JSON``: per-tenant quotas for ``demo`` and ``replay``.

The value is the JSON form ``radixcache.tenants.parse_quotas`` reads (and
the ``[quotas]`` table of a config file holds)::

    --quotas '{"noisy": {"device_pages": 64}, "quiet": {"device_floor": 128}}'

(``"*"``: every tenant not listed; ``"(none)"``: requests without a salt.)
A mistake is argparse's one line, ``argument --quotas: <what is wrong>``.
``quota_document`` turns a ``QuotaBook`` back into that form, for the
commands to print what they ran with.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import Any

from radixcache.cli.options import json_object
from radixcache.tenants import NO_SALT, OTHERS, QuotaBook, TenantQuota, parse_quotas

_UNSET = TenantQuota()


def quotas_json(text: str) -> QuotaBook:
    """An argparse type: the ``QuotaBook`` of a JSON object of tenant -> quota."""
    document = json_object(text)  # malformed JSON, or not an object: ArgumentTypeError
    try:
        return parse_quotas(document)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_quotas_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--quotas JSON`` (dest ``quotas``, a QuotaBook; None: quotas off)."""
    parser.add_argument("--quotas", type=quotas_json, default=None, metavar="JSON",
                        help=help_text + " (JSON: tenant salt -> {device_pages, device_floor, "
                        "host_pages, host_floor}; \"*\": tenants not listed, \"(none)\": "
                        "requests without a salt; replaces a config file's [quotas])")


def _quota_fields(quota: TenantQuota) -> dict[str, int | None]:
    """The fields of ``quota`` that differ from an unbounded quota's."""
    return {f.name: getattr(quota, f.name) for f in fields(TenantQuota)
            if getattr(quota, f.name) != getattr(_UNSET, f.name)}


def quota_document(book: QuotaBook) -> dict[str, Any]:
    """``book`` in the JSON form ``parse_quotas`` reads (``parse_quotas`` of
    it gives the same quotas; a bytes salt, which JSON cannot name, shows as
    ``hex:...``): the default under ``"*"`` when it bounds anything, then
    each tenant's own, with only the fields it sets."""
    out: dict[str, Any] = {}
    if book.default.bounded:
        out[OTHERS] = _quota_fields(book.default)
    for salt, quota in book.items_by_salt():
        name = NO_SALT if salt is None else salt if isinstance(salt, str) else "hex:" + salt.hex()
        out[name] = _quota_fields(quota)
    return out


def describe_quotas(book: QuotaBook) -> str:
    """``book`` as one line of JSON (what a command prints it ran with)."""
    return json.dumps(quota_document(book))
