"""Tags on namespaces, for ``RadixCache.invalidate(tag)``.

A tag (``Namespace.tags``: ``"model:v3"``, ``"template:v8"``, ``"user:42"``)
labels a namespace without being part of its identity: two ``Namespace``
values that differ only in tags are the same partition, so tagging never
changes a key, an event or a hit. ``TagBook`` remembers, for one cache, which
namespaces were admitted carrying which tags (the union over every admission);
storage keeps its own durable tag index (``PutMeta.tags``), which covers what
earlier processes and other engines stored.

Owner thread only.
"""

from __future__ import annotations

from radixcache.namespace import Namespace


class TagBook:
    """Tag -> namespaces, and namespace -> tags, as admissions showed them."""

    def __init__(self) -> None:
        self._by_tag: dict[str, set[Namespace]] = {}
        self._of: dict[Namespace, tuple[str, ...]] = {}

    def note(self, namespace: Namespace) -> None:
        """``namespace`` was admitted; remember its tags (cheap when it has none
        or the same ones as before)."""
        tags = namespace.tags
        if not tags:
            return
        known = self._of.get(namespace)
        if known is not None and (known is tags or set(tags) <= set(known)):
            return
        merged = tuple(dict.fromkeys((*(known or ()), *tags)))
        self._of[namespace] = merged
        for tag in tags:
            self._by_tag.setdefault(tag, set()).add(namespace)

    def tags_of(self, namespace: Namespace) -> tuple[str, ...]:
        """Every tag ``namespace`` was admitted with (storage records them)."""
        return self._of.get(namespace, ())

    def take(self, tag: str) -> list[Namespace]:
        """The namespaces carrying ``tag``, forgotten here with it (they are
        about to be forgotten; a later admission tags them again)."""
        namespaces = self._by_tag.pop(tag, set())
        for ns in namespaces:
            left = tuple(t for t in self._of.get(ns, ()) if t != tag)
            if left:
                self._of[ns] = left
            else:
                self._of.pop(ns, None)
        return sorted(namespaces, key=lambda ns: ns.digest())

    def clear(self) -> None:
        self._by_tag.clear()
        self._of.clear()

    def __len__(self) -> int:
        return len(self._of)
