"""The store's tiling: default tile and shard sizes, and the rule they obey (see :mod:`.store`).

Apart from :mod:`.store` so that the command line shows the defaults without importing zarr."""
from __future__ import annotations

from .errors import StoreError

DEFAULT_TILE = 256
DEFAULT_SHARD = 8


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def check_tiling(tile: int, shard: int) -> None:
    """Tiles and shards are powers of two so that the quadtree of tiles nests in the one of shards."""
    if not _is_pow2(tile) or not 8 <= tile <= 8192:
        raise StoreError(f"tile size must be a power of two between 8 and 8192, got {tile}")
    if not _is_pow2(shard) or shard > 1024:
        raise StoreError(f"shard size (tiles per shard side) must be a power of two <= 1024, got {shard}")
