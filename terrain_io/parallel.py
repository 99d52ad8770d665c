"""Shard-aligned tasks on a scheduler: in-process (default), Dask threads or processes, a
``dask.distributed`` cluster the user runs (``tcp://...``), or ``local-cuda``: one single-threaded
worker per GPU of this host, started for the run (dask-cuda's ``LocalCUDACluster``; where dask-cuda
does not import, the same spec built from plain ``distributed`` nannies, each worker with its own
``CUDA_VISIBLE_DEVICES`` -- the recipe of dask-cuda's docs and of ``dask worker`` processes pinned by
hand).

The unit of work is a shard (or a shard-aligned group of tiles): no two tasks write into the same
shard file, workers read and write the store directly, and only small summaries (statistics,
contracted graphs) travel back to the client. A task writes whole shards, so running it twice
gives the same bytes: a task lost with a killed worker is simply run again (``retries``). The
default ``local`` scheduler imports no Dask at all.
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import os
import threading
from typing import Callable, Iterable, Iterator

from .errors import InputError, TerrainError
from .memory import format_bytes

LOCAL_CUDA = "local-cuda"
SCHEDULERS = ("local", "threads", "processes", LOCAL_CUDA)


def map_shards(func: Callable, items: Iterable, scheduler: str | None = "local", *, retries: int = 3,
               progress=None, announce: Callable[[str], None] | None = None) -> list:
    """``[func(item) for item in items]`` on ``scheduler``; results in the order of ``items``.

    ``scheduler``: ``local`` (this process, in order), ``threads`` / ``processes`` (Dask's local
    schedulers), ``local-cuda`` (a worker per GPU, :func:`local_cuda_address`) or the address of a
    running ``dask.distributed`` scheduler (``tcp://host:8786``). ``progress``: a bar with ``update(n)``, advanced once per finished item. ``announce`` receives
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
    scheduler = _address(scheduler, announce)
    if scheduler in ("threads", "processes"):
        tasks = [dask.delayed(func, pure=False)(item) for item in items]
        out = list(dask.compute(*tasks, **_local_options(scheduler)))
        if progress is not None:
            progress.update(len(out))
        return out
    return _on_cluster(func, items, scheduler, retries, progress, announce)


class Prefetch:
    """``func(task)`` for each of ``tasks`` (a sequence) in order (iterate), at most ``ahead`` submitted
    to ``pool`` (an executor) and not yet taken -- the results waiting to be taken are bounded, however
    slow the consumer; :meth:`close` cancels the rest and waits for those running."""

    def __init__(self, func, tasks, ahead: int, pool):
        self.func, self.tasks, self.ahead, self.pool = func, tasks, max(1, ahead), pool
        self.pending = [pool.submit(func, t) for t in tasks[:self.ahead]]

    def __iter__(self):
        for i in range(len(self.tasks)):
            if i + self.ahead < len(self.tasks):
                self.pending.append(self.pool.submit(self.func, self.tasks[i + self.ahead]))
            yield self.pending[i].result()
            self.pending[i] = None

    def close(self) -> None:
        for f in self.pending:
            if f is not None:
                f.cancel()
        concurrent.futures.wait([f for f in self.pending if f is not None])


def imap_shards(func: Callable, items: Iterable, scheduler: str | None = "local", *, in_flight: int | None = None,
                retries: int = 3, progress=None, announce: Callable[[str], None] | None = None) -> Iterator:
    """``func(item)`` for each item on ``scheduler``, yielded in the order of ``items``, with at most
    twice the workers' threads (and at most ``in_flight``) items submitted and not yet yielded.

    For large payloads or results (tile states shipped to tasks, blocks coming back to be written
    into one file): ``items`` may be a lazy iterable, only ``in_flight`` of them exist at a time.
    """
    scheduler = scheduler or "local"
    items = iter(items)
    if scheduler == "local":
        for item in items:
            yield func(item)
            if progress is not None:
                progress.update(1)
        return
    try:
        import dask
    except ImportError:
        raise TerrainError("--scheduler needs Dask: pip install 'dask[distributed]'") from None
    scheduler = _address(scheduler, announce)
    if scheduler in ("threads", "processes"):
        n = max(1, min(in_flight or 1 << 30, 2 * (os.cpu_count() or 1)))
        options = _local_options(scheduler)
        while batch := list(itertools.islice(items, n)):
            for out in dask.compute(*[dask.delayed(func, pure=False)(item) for item in batch], **options):
                yield out
                if progress is not None:
                    progress.update(1)
        return
    with _client(scheduler, announce) as client:
        n = max(1, min(in_flight or 1 << 30, 2 * sum(client.nthreads().values())))
        pending: collections.deque = collections.deque()
        while True:
            while len(pending) < n and (item := next(items, _END)) is not _END:
                pending.append(client.submit(_as_task(func), item, retries=retries, pure=False))
                del item
            if not pending:
                return
            future = pending.popleft()
            out = future.result()
            future.release()
            yield out
            if progress is not None:
                progress.update(1)


_END = object()

_pool = None


def _local_options(scheduler: str) -> dict:
    """``dask.compute``'s options for Dask's local schedulers. ``processes`` runs on one pool of
    worker processes kept for this process's life: Dask would start a pool at every compute, each
    worker importing the package and loading its kernels again, and the shard method of the SSSP
    computes once a round (benchmarks/RESULTS.md, "Measurements behind decisions in the code"). A broken
    pool (a worker killed) is replaced at the next compute."""
    global _pool
    if scheduler != "processes":
        return {"scheduler": scheduler}
    if _pool is None or getattr(_pool, "_broken", False):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        import dask

        context = multiprocessing.get_context(dask.config.get("multiprocessing.context", "spawn"))
        if _pool is None:
            atexit.register(_close_pool)
        _pool = ProcessPoolExecutor(os.cpu_count(), mp_context=context)
    return {"scheduler": scheduler, "pool": _pool}


def _close_pool() -> None:
    """Shut the pool down at exit while the modules it needs are still there (collected later, in
    the interpreter's teardown, it printed an ignored exception)."""
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)
        _pool = None


def scheduler_threads(scheduler: str) -> int:
    """How many tasks a Dask ``scheduler`` runs at once: the workers' threads (the cores for local Dask)."""
    if scheduler in ("threads", "processes"):
        return os.cpu_count() or 1
    with _client(_address(scheduler, None), None) as client:
        return max(1, sum(client.nthreads().values()))


def scheduler_workers(scheduler: str, announce: Callable[[str], None] | None = None) -> int:
    """How many worker processes a ``dask.distributed`` ``scheduler`` (``local-cuda``, an address) has:
    a pipeline that runs whole on each worker (the MST's runs of tiles) splits its work that many ways."""
    with _client(_address(scheduler, announce), announce) as client:
        return max(1, len(client.nthreads()))


_clients: dict = {}  # scheduler address -> this process's Client of it, kept for later phases and rounds


@contextlib.contextmanager
def _client(address: str, announce):
    """This process's ``distributed.Client`` of ``address``, connected on first use and kept (the
    shard method of the SSSP maps a round at a time: a connection each cost it 0.1-0.3 s a round);
    closed by :func:`close_clusters` or at exit. One that lost its scheduler is connected again."""
    try:
        from distributed import Client
    except ImportError:
        raise TerrainError("--scheduler ADDRESS needs dask.distributed: pip install 'dask[distributed]'") from None
    client = _clients.get(address)
    if client is None or client.status not in ("running", "connecting"):
        _probe(address)
        try:
            # local-cuda: results straight from the workers, not through the scheduler, which runs in
            # this process on the loop the client shares (the MST's tile graphs: 6.5 MB a shard)
            local = any(c.scheduler_address == address for c in _clusters.values())
            client = Client(address, timeout="10s", set_as_default=False, direct_to_workers=local or None)
        except (OSError, TimeoutError) as exc:
            raise TerrainError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
        _close_at_exit()
        _clients[address] = client
    if announce is not None:
        announce(f"dask dashboard: {client.dashboard_link}")
    yield client


_task_thread = threading.local()


def owns_cores() -> bool:
    """Whether this thread may spread its work over the cores (the store's codec pool): the main
    thread, or a Dask worker's thread running one of our cluster tasks -- a ``local-cuda`` worker has
    one thread, and its shard's decode and encode would otherwise run on one core while the
    host's others idle."""
    return threading.current_thread() is threading.main_thread() or getattr(_task_thread, "active", False)


def _as_task(func: Callable) -> Callable:
    """``func`` as a cluster task: run with :func:`owns_cores` true in its worker thread."""
    return functools.partial(_run_as_task, func)


def _run_as_task(func: Callable, item):
    _task_thread.active = True
    try:
        return func(item)
    finally:
        _task_thread.active = False


def run_on_worker(func: Callable, item, scheduler: str, announce: Callable[[str], None] | None = None):
    """``func(item)`` as one task on ``scheduler``'s workers (a pipeline that runs whole on one GPU,
    such as the in-core GPU fill: its GPU is a worker's, not the client's)."""
    return map_shards(func, [item], scheduler, announce=announce)[0]


# --- local-cuda: a worker per GPU of this host, for the run -------------------------------------

_clusters: dict = {}  # LOCAL_CUDA -> the running cluster (started once, closed at exit or close_clusters())


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (indices or UUIDs):
    that variable when set, else every device the driver lists (NVML, else the CUDA runtime; neither
    makes a CUDA context). Empty without a GPU or ``TERRAIN_DISABLE_GPU``."""
    if os.environ.get("TERRAIN_DISABLE_GPU"):
        return []
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        return [d.strip() for d in named.split(",") if d.strip() and not d.strip().startswith("-")]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML: ask the runtime
        pass
    try:
        import cupy

        return [str(i) for i in range(cupy.cuda.runtime.getDeviceCount())]
    except Exception:
        return []


def gpu_cluster(devices: list[str] | None = None, *, dask_cuda: bool | None = None, memory_limit="auto"):
    """Start a cluster of one single-threaded worker per GPU in ``devices`` (default
    :func:`visible_gpus`) and return ``(cluster, how)``.

    Worker ``i`` sees ``CUDA_VISIBLE_DEVICES`` rotated to start at ``devices[i]`` (as dask-cuda
    does), so its device 0 -- the one CuPy takes -- is its own GPU and no two workers share a
    GPU context. One thread a worker: a task holds a whole shard, within ``--memory``, on its
    worker's GPU, so a worker holds one task's memory at a time. ``dask_cuda``: None takes
    dask-cuda's ``LocalCUDACluster`` when it imports, else the same spec from plain
    ``distributed`` nannies (True / False insist on one). ``how`` says which, and why.
    """
    devices = visible_gpus() if devices is None else [str(d) for d in devices]
    if not devices:
        raise TerrainError("--scheduler local-cuda: no CUDA GPU visible (CUDA_VISIBLE_DEVICES, NVML); "
                           "use threads or processes on the CPU")
    why = "dask-cuda not asked for"
    if dask_cuda is not False:
        try:
            from dask_cuda import LocalCUDACluster
        except Exception as exc:  # ImportError, or its CUDA bindings failing to load
            if dask_cuda:
                raise TerrainError(f"--scheduler local-cuda: dask-cuda does not import: {exc}") from None
            why = f"dask-cuda does not import: {type(exc).__name__}: {exc}"
        else:
            cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(devices), n_workers=len(devices),
                                       threads_per_worker=1, memory_limit=memory_limit, dashboard_address=":0",
                                       silence_logs=logging.ERROR)
            return cluster, f"dask-cuda LocalCUDACluster, {len(devices)} GPU workers"
    from distributed import Nanny, Scheduler, SpecCluster

    def pinned(i: int) -> dict:
        return {"cls": Nanny, "options": {
            "nthreads": 1, "memory_limit": memory_limit, "name": f"gpu-{devices[i]}", "silence_logs": logging.ERROR,
            "env": {"CUDA_VISIBLE_DEVICES": ",".join(devices[i:] + devices[:i])}}}

    cluster = SpecCluster(workers={f"gpu-{d}": pinned(i) for i, d in enumerate(devices)},
                          scheduler={"cls": Scheduler, "options": {"dashboard_address": ":0"}},
                          silence_logs=logging.ERROR, name="terrain-local-cuda")
    return cluster, f"distributed workers pinned by CUDA_VISIBLE_DEVICES, {len(devices)} GPU workers ({why})"


def local_cuda_address(announce: Callable[[str], None] | None = None) -> str:
    """The scheduler address of this process's ``local-cuda`` cluster, started on first use (one
    line to ``announce`` says which kind) and kept for the process's later phases and runs;
    closed by :func:`close_clusters` (the CLI, after each command) or at exit."""
    if LOCAL_CUDA not in _clusters:
        cluster, how = gpu_cluster()
        _close_at_exit()
        _clusters[LOCAL_CUDA] = cluster
        if announce is not None:
            announce(f"local-cuda: {how}")
    return _clusters[LOCAL_CUDA].scheduler_address


_exit_hook: list = []


def _close_at_exit() -> None:
    """Register :func:`close_clusters` at exit once, after distributed's own hooks (atexit runs the
    last registered first: ours closes before distributed tears its loop down)."""
    if not _exit_hook:
        _exit_hook.append(atexit.register(close_clusters))


def close_clusters() -> None:
    """Close this process's clients and the clusters it started (``local-cuda``): workers stopped,
    GPUs released."""
    while _clients:
        _, client = _clients.popitem()
        with contextlib.suppress(Exception):  # its scheduler already gone
            client.close()
    while _clusters:
        _, cluster = _clusters.popitem()
        try:
            cluster.close()
        except Exception:  # already gone (interpreter teardown, a signal): nothing more to free
            pass


def _address(scheduler: str, announce) -> str:
    """A Dask scheduler's name as map_shards runs it: ``local-cuda`` becomes its cluster's address."""
    return local_cuda_address(announce) if scheduler == LOCAL_CUDA else scheduler


def _on_cluster(func, items, address, retries, progress, announce):
    from distributed import as_completed

    with _client(address, announce) as client:
        futures = client.map(_as_task(func), items, retries=retries, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        out = [None] * len(items)
        for future in as_completed(futures, loop=client.loop):
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


def check_task_memory(need: int, budget: int, phase: str) -> None:
    """A shard task holds a whole shard on its worker: refuse, before any work starts, one whose
    ``phase`` needs more than the memory budget."""
    if need > budget:
        raise InputError(f"with --scheduler every task is a whole shard, whose {phase} needs {format_bytes(need)}, "
                         f"more than the memory budget {format_bytes(budget)} (raise --memory or use smaller shards)")


def check_scheduler(scheduler: str | None) -> str:
    """Validate a ``--scheduler`` value early (before any work starts)."""
    scheduler = scheduler or "local"
    if scheduler in SCHEDULERS or "://" in scheduler:
        return scheduler
    raise TerrainError(f"unknown scheduler {scheduler!r}: use local, threads, processes, local-cuda or a "
                       "dask.distributed address such as tcp://127.0.0.1:8786")
