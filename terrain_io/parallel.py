"""Shard-aligned tasks on a scheduler: in-process (default), Dask threads or processes, or a
``dask.distributed`` cluster (CPU workers, or dask-cuda's one worker per GPU).

The unit of work is a shard (or a shard-aligned group of tiles): no two tasks write into the same
shard file, workers read and write the store directly, and only small summaries (statistics,
contracted graphs) travel back to the client. A task writes whole shards, so running it twice
gives the same bytes: a task lost with a killed worker is simply run again (``retries``). The
default ``local`` scheduler imports no Dask at all.
"""
from __future__ import annotations

from typing import Callable, Iterable

from .errors import TerrainError

SCHEDULERS = ("local", "threads", "processes")


def map_shards(func: Callable, items: Iterable, scheduler: str | None = "local", *, retries: int = 3,
               progress=None, announce: Callable[[str], None] | None = None) -> list:
    """``[func(item) for item in items]`` on ``scheduler``; results in the order of ``items``.

    ``scheduler``: ``local`` (this process, in order), ``threads`` / ``processes`` (Dask's local
    schedulers), or the address of a running ``dask.distributed`` scheduler (``tcp://host:8786``).
    ``progress``: a bar with ``update(n)``, advanced once per finished item. ``announce`` receives
    the dashboard address of a distributed cluster.
    """
    items = list(items)
    scheduler = scheduler or "local"
    if scheduler == "local":
        out = []
        for item in items:
            out.append(func(item))
            if progress is not None:
                progress.update(1)
        return out
    try:
        import dask
    except ImportError:
        raise TerrainError("--scheduler needs Dask: pip install 'dask[distributed]'") from None
    if scheduler in ("threads", "processes"):
        tasks = [dask.delayed(func, pure=False)(item) for item in items]
        out = list(dask.compute(*tasks, scheduler=scheduler))
        if progress is not None:
            progress.update(len(out))
        return out
    return _on_cluster(func, items, scheduler, retries, progress, announce)


def _on_cluster(func, items, address, retries, progress, announce):
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise TerrainError("--scheduler ADDRESS needs dask.distributed: pip install 'dask[distributed]'") from None
    _probe(address)
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise TerrainError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    with client:
        if announce is not None:
            announce(f"dask dashboard: {client.dashboard_link}")
        futures = client.map(func, items, retries=retries, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        out = [None] * len(items)
        for future in as_completed(futures):
            out[index[future.key]] = future.result()
            if progress is not None:
                progress.update(1)
        return out


def _probe(address: str) -> None:
    """Fail at once on a refused TCP connection (distributed would retry until its timeout)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(address)
    if parts.scheme != "tcp" or not parts.hostname or not parts.port:
        return  # other transports (tls, ucx, inproc): leave it to distributed
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=5).close()
    except OSError as exc:
        raise TerrainError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


def check_scheduler(scheduler: str | None) -> str:
    """Validate a ``--scheduler`` value early (before any work starts)."""
    scheduler = scheduler or "local"
    if scheduler in SCHEDULERS or "://" in scheduler:
        return scheduler
    raise TerrainError(f"unknown scheduler {scheduler!r}: use local, threads, processes or a dask.distributed "
                       "address such as tcp://127.0.0.1:8786")
