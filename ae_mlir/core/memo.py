"""In-memory caches of a call's derived values (module texts, cache keys, tile tables): a value
is made once per key, and a cache past its size starts over, so a process that sees ever new
shapes or call sites does not grow without bound."""
from __future__ import annotations


def kept(cache: dict, key, make, limit: int):
    """cache[key], made by `make()` and kept when missing; past `limit` entries the cache is
    emptied first."""
    found = cache.get(key)
    if found is None:
        if len(cache) > limit:
            cache.clear()
        found = cache[key] = make()
    return found
