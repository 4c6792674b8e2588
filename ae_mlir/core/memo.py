"""In-memory caches of a call's derived values (module texts, cache keys, tile tables): a value
is made once per key, and a cache at its size drops its oldest entry, so a process that sees ever
new shapes or call sites does not grow without bound, while the entries one training step makes
together (a forward's tables, then its backward's) stay together."""
from __future__ import annotations


def kept(cache: dict, key, make, limit: int):
    """cache[key], made by `make()` and kept when missing; a cache of `limit` entries first drops
    the one made longest ago (dicts keep insertion order; a hit reorders nothing, so it costs one
    lookup)."""
    found = cache.get(key)
    if found is None:
        while len(cache) >= limit:
            del cache[next(iter(cache))]
        found = cache[key] = make()
    return found
