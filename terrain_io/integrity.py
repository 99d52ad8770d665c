"""Store integrity: checksummed chunks, shard manifests, checked reads and ``terrain verify``.

A damaged or missing chunk must be an error, never a silently different result. Two layers:

1. Every chunk carries a crc32c (zarr's ``crc32c`` codec, last in the chunk's codec chain: after
   zstd in the sharded arrays, after the raw bytes in the plain-file arrays of the SSSP index), and
   every shard carries zarr's crc32c of its index. Plain zarr checks them too.
2. A manifest per array (``ARRAY/terrain-manifest.json``: every chunk or shard file and its size),
   written when the array is complete, just before its store or result is renamed into place
   (:func:`seal`). zarr reads a missing file as fill value (nodata); with the manifest, a listed
   file that is missing or of another size is damage, and a file it does not list is too. An
   all-fill shard that was never written is not listed, and reads as fill value as before.

Every read goes through one of three doors, and each checks: :class:`CheckedStore` (the zarr store
under :attr:`TerrainStore.group`: it checks a file's manifest entry and every checksum in it the
first time zarr asks for any part of it), ``store.read_shard`` and ``store.read_plain_chunk`` (the
direct decoders: they check each chunk they decode). A failure raises
:class:`~terrain_io.errors.DamagedStoreError`: ``STORE: array ARRAY chunk (r, c): PROBLEM``.

Stores of ``format_version`` 1 have no chunk checksums and no manifests: they open (with a
:class:`~terrain_io.errors.UnverifiedStoreWarning`), their shard indexes are still checked, and
:func:`verify` can only decode their chunks.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from zarr.storage import LocalStore

from .errors import DamagedStoreError, StoreError

MANIFEST = "terrain-manifest.json"
CRC_BYTES = 4
MANIFEST_ENTRY_BYTES = 256  # what one manifest entry holds once read (key, size, the JSON read), for budgets
NO_CHUNK = 2**64 - 1  # a shard index entry (offset, size) of a chunk not stored


def crc32c(data) -> bytes:
    """The crc32c of ``data`` (bytes or a C-contiguous numpy array) as zarr's codec stores it; of a
    chunk's bytes without holding the GIL (:func:`crc32c_function`), so that threads checksum at once."""
    import google_crc32c

    size = data.nbytes if hasattr(data, "nbytes") else len(data)
    unlocked = crc32c_function() if size >= _UNLOCKED_BYTES else None
    if unlocked is not None:
        view = np.frombuffer(data, np.uint8)
        return np.uint32(unlocked(view.ctypes.data, size)).astype("<u4").tobytes()
    return np.uint32(google_crc32c.value(data)).astype("<u4").tobytes()


_UNLOCKED_BYTES = 1 << 16  # (below, the foreign call's ~2 us cost more than holding the GIL)


@functools.cache
def crc32c_function():
    """google_crc32c's C ``crc32c_value(data, size)`` as a ctypes function, which releases the GIL
    while it runs (the extension module holds it; :mod:`terrain_io.chunkcodec` calls it from numba): a shard's reader threads and the codec pool
    checksummed their chunks one at a time (65 MB of a 4096^2 pyramid: ~6 ms under the GIL;
    benchmarks/RESULTS.md, issue 32); None where the library does not export it."""
    import ctypes

    try:
        from google_crc32c import _crc32c

        fn = ctypes.CDLL(_crc32c.__file__).crc32c_value
    except (ImportError, OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_uint32
    return fn


# ---------------------------------------------------------------------------------------------
# Layout of an array, from its zarr.json
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """How an array's chunk files are built (only what checking them needs)."""

    kind: str  # "sharded" (sharding codec, index at the end), "plain" (one chunk per file), "other"
    chunk_crc: bool  # each (inner) chunk ends in a crc32c
    per_shard: tuple[int, ...] = ()  # sharded: inner chunks per shard along each axis
    index_crc: bool = False  # sharded: the shard index ends in a crc32c
    zstd: bool = False  # chunks are zstd frames (before the crc, if any)

    @property
    def index_bytes(self) -> int:
        return int(np.prod(self.per_shard)) * 16 + (CRC_BYTES if self.index_crc else 0)


def layout_from_metadata(meta: dict) -> Layout:
    codecs = meta.get("codecs") or []
    names = [c.get("name") for c in codecs]
    if names and names[0] == "sharding_indexed":
        cfg = codecs[0].get("configuration", {})
        inner = [c.get("name") for c in cfg.get("codecs", [])]
        index = [c.get("name") for c in cfg.get("index_codecs", [])]
        shard = meta["chunk_grid"]["configuration"]["chunk_shape"]
        per = tuple(int(s) // int(c) for s, c in zip(shard, cfg["chunk_shape"]))
        if cfg.get("index_location", "end") != "end":
            return Layout("other", inner[-1:] == ["crc32c"])
        return Layout("sharded", inner[-1:] == ["crc32c"], per, index[-1:] == ["crc32c"], "zstd" in inner)
    return Layout("plain", names[-1:] == ["crc32c"], zstd="zstd" in names)


def chunk_coords(key: str) -> tuple[int, ...]:
    """(i, j, ...) of a chunk key ``c/i/j`` (zarr v3 default encoding); () for a 0-d array's ``c``."""
    parts = key.split("/")
    return tuple(int(p) for p in parts[1:]) if parts[0] == "c" else ()


def check_file_bytes(layout: Layout, raw, where) -> list[tuple[tuple[int, ...], str]]:
    """Problems found in the bytes of one chunk/shard file: ``[(chunk, problem)]`` (empty: sound).

    ``where`` is the file's chunk-grid coordinates (the shard's, for a sharded array); the chunks
    named in problems are global chunk coordinates (the shard's own when the shard as a whole is bad).
    """
    if layout.kind == "sharded":
        size = layout.index_bytes
        if len(raw) < size:
            return [(where, f"shard file truncated ({len(raw)} bytes, its index alone is {size})")]
        index_raw = raw[len(raw) - size:]
        if layout.index_crc and crc32c(index_raw[:-CRC_BYTES]) != bytes(index_raw[-CRC_BYTES:]):
            return [(where, "the shard index fails its checksum")]
        index = np.frombuffer(index_raw[: size - (CRC_BYTES if layout.index_crc else 0)], "<u8")
        index = index.reshape(*layout.per_shard, 2)
        problems = []
        body = len(raw) - size
        for inner in np.ndindex(*layout.per_shard):
            off, nb = (int(v) for v in index[inner])
            if off == NO_CHUNK and nb == NO_CHUNK:
                continue
            chunk = tuple(w * p + i for w, p, i in zip(where, layout.per_shard, inner))
            if off + nb > body:
                problems.append((chunk, "chunk lies outside its shard file (truncated or bad index)"))
            elif layout.chunk_crc and (nb < CRC_BYTES or crc32c(raw[off : off + nb - CRC_BYTES])
                                       != bytes(raw[off + nb - CRC_BYTES : off + nb])):
                problems.append((chunk, "chunk fails its checksum"))
        return problems
    if layout.chunk_crc:
        if len(raw) < CRC_BYTES or crc32c(raw[:-CRC_BYTES]) != bytes(raw[-CRC_BYTES:]):
            return [(where, "chunk fails its checksum")]
    return []


# ---------------------------------------------------------------------------------------------
# Manifests
# ---------------------------------------------------------------------------------------------
def _array_dirs(root: Path, unreadable: list | None = None):
    """(array path relative to ``root``, its folder, its metadata) for every zarr array under ``root``;
    the paths of nodes whose zarr.json cannot be read go to ``unreadable``."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if "zarr.json" not in filenames:
            continue
        try:
            with open(os.path.join(dirpath, "zarr.json")) as f:
                meta = json.load(f)
            kind = meta.get("node_type")
        except (OSError, ValueError, AttributeError):
            if unreadable is not None:
                unreadable.append(os.path.relpath(dirpath, root).replace(os.sep, "/"))
            continue
        if kind == "array":
            dirnames[:] = []  # an array's folder holds chunks, not nodes
            yield os.path.relpath(dirpath, root).replace(os.sep, "/"), Path(dirpath), meta


def chunk_files(array_dir: Path) -> dict[str, int]:
    """Every chunk/shard file of an array on disk: chunk key -> size."""
    found = {}
    base = os.path.join(array_dir, "c")
    if os.path.isfile(base):
        return {"c": os.stat(base).st_size}
    skip = len(str(array_dir)) + 1
    for dirpath, _, filenames in os.walk(base):
        for name in filenames:
            p = os.path.join(dirpath, name)
            found[p[skip:].replace(os.sep, "/")] = os.stat(p).st_size
    return found


def seal(root, staged: bool = False, ahead: "SealedAhead | None" = None) -> None:
    """Write the manifest of every array under ``root`` (a store or a result group being completed):
    the chunk files it holds now, with their sizes, and the tree it was sealed in: ``root``
    (relative to the array) and the digest of the metadata (zarr.json) of every node under it
    (:func:`metadata_digest`), so that a node's metadata deleted or edited later is told. (In the
    arrays' manifests, not a file of the group's: zarr warns about files in a group it does not
    know.) Called once the arrays are written, before the store or result is renamed into place.

    One walk, each zarr.json read once: every command that writes a result pays it (a pyramid of 4
    levels has 20 nodes and 16 arrays). ``staged``: ``root`` is a temporary that is renamed into
    place once sealed (:meth:`TerrainStore.write_result`), which no reader sees before: each manifest
    is written in place, not under a temporary name renamed over it (half the file-system calls:
    ~1 ms of a 4096^2 pyramid's seal, which runs after its last read). ``ahead``: what
    :func:`seal_ahead` did while the arrays were written; only the other arrays' manifests are
    written now."""
    root = str(Path(root))
    nodes, arrays = ahead.tree if ahead is not None else _sealed_tree(root)
    for rel, depth in arrays:
        if ahead is None or rel not in ahead.done:
            _write_manifest(root, rel, depth, nodes, staged)


@dataclass(frozen=True)
class SealedAhead:
    """:func:`seal_ahead`'s walk (the nodes' digests, the arrays) and the arrays it sealed."""

    tree: tuple[dict, list]
    done: frozenset


def seal_ahead(root, complete, written: dict | None = None) -> SealedAhead:
    """The part of :func:`seal` that need not wait for the last chunk: the walk, the nodes' digests and
    the manifests of the arrays whose path ``complete(rel)`` says are written -- for a staged result
    whose nodes are all written and stay as they are, which is then sealed with ``ahead=`` (an overview
    pyramid seals its 12 coordinate arrays before its base is read: ~2 ms less after the last read).
    ``written``: the metadata of every node below ``root`` as its writer wrote it (relative path ->
    zarr.json as a dict), so that only ``root``'s own is read back, and no folder is walked."""
    root = str(Path(root))
    tree = _sealed_tree(root) if written is None else _known_tree(root, written)
    done = frozenset(rel for rel, _ in tree[1] if complete(rel))
    for rel, depth in tree[1]:
        if rel in done:
            _write_manifest(root, rel, depth, tree[0], staged=True)
    return SealedAhead(tree, done)


def _sealed_tree(root: str) -> tuple[dict, list]:
    """The digests of the nodes under ``root`` and its arrays, (folder, depth below root)."""
    nodes, arrays = {}, []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = dirpath[len(root) + 1 :].replace(os.sep, "/")
        parts = rel.split("/") if rel else []
        in_array = any(rel.startswith(a + "/") for a, _ in arrays)
        meta = None
        if "zarr.json" in filenames:
            try:
                with open(os.path.join(dirpath, "zarr.json"), "rb") as f:
                    meta = json.loads(f.read())
            except (OSError, ValueError):
                if "c" not in parts:  # a node of the tree that cannot be read: not sealed
                    raise
            if meta is not None and "c" not in parts:
                nodes[rel] = _digest(dict(meta))
        is_array = isinstance(meta, dict) and meta.get("node_type") == "array" and not in_array
        if is_array:
            arrays.append((rel, len(parts)))
        # nodes below any folder but chunk folders ("c"); arrays not below an array
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not (d == "c" and (in_array or is_array)))
    return nodes, arrays


def _known_tree(root: str, written: dict) -> tuple[dict, list]:
    """:func:`_sealed_tree` of a tree whose nodes below ``root`` are ``written`` (path -> metadata): the same
    digests, in the walk's order (a folder, then its children in sorted order)."""
    top = Path(root, "zarr.json")
    metas = {**({"": json.loads(top.read_bytes())} if top.is_file() else {}), **written}
    nodes, arrays = {}, []
    for rel in sorted(metas, key=lambda rel: rel.split("/") if rel else []):
        meta = metas[rel]
        if any(rel.startswith(a + "/") for a, _ in arrays):
            continue  # (below an array: its chunks, no node)
        nodes[rel] = _digest(dict(meta))
        if meta.get("node_type") == "array":
            arrays.append((rel, len(rel.split("/")) if rel else 0))
    return nodes, arrays


def _write_manifest(root: str, rel: str, depth: int, nodes: dict, staged: bool) -> None:
    folder = os.path.join(root, rel) if rel else root
    text = json.dumps({"chunks": dict(sorted(chunk_files(folder).items())), "tree": "/".join([".."] * depth) or ".",
                       "nodes": nodes}, separators=(",", ":"))
    if staged:
        with open(os.path.join(folder, MANIFEST), "w") as f:
            f.write(text)
    else:
        _write_text(Path(folder) / MANIFEST, text)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# Attributes written after a result is complete (how long its run took): not part of what it is.
RUN_REPORT = frozenset({"timings"})


def metadata_digest(path: Path) -> str:
    """sha256 of a node's zarr.json as JSON (key order and spacing aside), without :data:`RUN_REPORT`'s
    attributes: its shape, data type, chunking, codecs, fill value and attributes (georeferencing,
    nodata, the generation of the elevation a result was computed from)."""
    with open(path, "rb") as f:
        return _digest(json.loads(f.read()))


def _digest(meta: dict) -> str:
    import hashlib

    if isinstance(meta.get("attributes"), dict):
        meta["attributes"] = {k: v for k, v in meta["attributes"].items() if k not in RUN_REPORT}
    return hashlib.sha256(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def node_attrs(path: Path) -> dict:
    try:
        with open(path / "zarr.json") as f:
            attrs = json.load(f).get("attributes")
        return attrs if isinstance(attrs, dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}


def tree_of(root, array: str) -> tuple[str, dict] | None:
    """(tree, its nodes' metadata digests) that array ``array`` of store ``root`` was sealed in, as
    its manifest tells (``""``: the store itself, else a result group); None without one."""
    try:
        with open(Path(root) / array / MANIFEST) as f:
            manifest = json.load(f)
        rel, nodes = manifest["tree"], manifest["nodes"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no manifest, or one of before the metadata digests: the chunk checks tell the rest
    prefix = os.path.normpath(os.path.join(array, rel)).replace(os.sep, "/")
    return ("" if prefix == "." else prefix), nodes


def read_nodes_ahead(root, array: str) -> None:
    """Ask the kernel to read ahead, all at once, the metadata and manifests that the first read of
    ``array`` checks (:meth:`Integrity.check_trees`): those of the store's own nodes and of every node
    of the result group the array lies in. Read cold one after another, they cost a disk's latency
    each -- 9 of them ~0.13 s on the H100 machine's disk, longer than its 8192^2 float32 array's
    shards take to arrive (benchmarks/RESULTS.md, issue 31)."""
    if not hasattr(os, "posix_fadvise"):
        return
    root = str(root)
    top = array.split("/", 1)[0]
    with os.scandir(root) as entries:
        folders = [root] + [e.path for e in entries if e.is_dir() and not e.name.startswith(".")]
    if "/" in array:  # a result group: its nodes below its first level too
        for dirpath, dirnames, _ in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if d != "c" and not d.startswith(".")]
            folders += [os.path.join(dirpath, d) for d in dirnames]
    for folder in folders:
        for leaf in ("zarr.json", MANIFEST):
            try:
                fd = os.open(os.path.join(folder, leaf), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)


def tree_problems(root, prefix: str, nodes: dict, listing: bool = True) -> list["Problem"]:
    """What is wrong with the sealed tree ``prefix`` of the store ``root`` (``""``: the store itself,
    else a result group), as its manifest tells: a node whose zarr.json is missing or not the one it
    was sealed with (a shape edited, an array's metadata deleted); with ``listing``, each listed
    array's chunk files against its own manifest; and for a result, an elevation other than the
    store's (its ``generation`` differs: the store was replaced after the result was written)."""
    root = Path(root)
    base = root / prefix if prefix else root
    problems = []
    version = int(node_attrs(root).get("format_version", 1))
    for node, digest in sorted(nodes.items()):
        name = "/".join(p for p in (prefix, node) if p) or "/"
        meta_path = base / node / "zarr.json" if node else base / "zarr.json"
        try:
            same = metadata_digest(meta_path) == digest
        except FileNotFoundError:
            problems.append(Problem(name, None, "node", "its zarr.json is missing (the store lists it)"))
            continue
        except (OSError, ValueError, AttributeError) as exc:
            problems.append(Problem(name, None, "node", f"its zarr.json cannot be read ({exc})"))
            continue
        if not same:
            problems.append(Problem(name, None, "node", "its zarr.json is not the one it was written with "
                                    "(edited afterwards: shape, data type, codecs or attributes)"))
        elif listing and node_is_array(meta_path):
            problems += _listing_problems(name, meta_path.parent, version)
    if prefix:
        made_from, current = node_attrs(base).get("generation"), node_attrs(root).get("generation")
        if made_from is not None and current is not None and made_from != current:
            problems.append(Problem(prefix, None, "result", "was computed from another elevation than the store "
                                    "holds now (the store was replaced after it was written): compute it again"))
    return problems


def node_is_array(meta_path: Path) -> bool:
    try:
        with open(meta_path) as f:
            return json.load(f).get("node_type") == "array"
    except (OSError, ValueError, AttributeError):
        return False


def sealed_trees(root) -> dict[str, dict]:
    """The sealed trees of a store, as its arrays' manifests tell: tree -> its nodes' digests."""
    root = Path(root)
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "c")
        if MANIFEST in filenames:
            dirnames[:] = []
            tree = tree_of(root, os.path.relpath(dirpath, root).replace(os.sep, "/"))
            if tree is not None:
                found.setdefault(*tree)
    return found


def read_manifest(array_dir: Path) -> dict[str, int] | None:
    try:
        with open(array_dir / MANIFEST) as f:
            return {str(k): int(v) for k, v in json.load(f)["chunks"].items()}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedStoreError(array_dir.parent, array_dir.name, None, f"unreadable manifest ({exc})") from None


# ---------------------------------------------------------------------------------------------
# Checking reads
# ---------------------------------------------------------------------------------------------
class Integrity:
    """What the readers of one opened store know: the layouts and manifests of its arrays, and the
    files already found sound (by path, size and modification time)."""

    def __init__(self, root, strict: bool):
        self.root = Path(root)
        self.strict = strict  # format_version >= 2: an array without a manifest is damage
        self._arrays: dict[str, tuple[Layout, dict | None]] = {}
        self._sound: set = set()
        self._trees: set = set()  # sealed trees (the store, a result) found whole
        self._lock = threading.Lock()
        self._first: dict[str, threading.Lock] = {}  # array -> the lock its first reader checks it under

    def __getstate__(self):
        return {"root": self.root, "strict": self.strict}

    def __setstate__(self, state):
        self.__init__(state["root"], state["strict"])

    def array(self, name: str) -> tuple[Layout, dict | None]:
        """(layout, manifest or None) of array ``name`` (its path in the store): the first caller reads
        and checks them, the metadata it needs read ahead all at once (:func:`read_nodes_ahead`); parallel
        readers of its shards wait for that one."""
        got = self._arrays.get(name)
        if got is not None:
            return got
        with self._first.setdefault(name, threading.Lock()):
            got = self._arrays.get(name)
            if got is not None:
                return got
            read_nodes_ahead(self.root, name)
            self.check_trees(name)
            array_dir = self.root / name
            with open(array_dir / "zarr.json") as f:
                layout = layout_from_metadata(json.load(f))
            manifest = read_manifest(array_dir)
            if manifest is None and self.strict:
                raise DamagedStoreError(self.root, name, None, f"no manifest ({MANIFEST}): the list of its "
                                        "shard files is lost, so a missing one could not be told")
            got = self._arrays[name] = (layout, manifest)
            return got

    def check_trees(self, name: str) -> None:
        """Before the first read of array ``name``: the sealed trees it lies in -- the store's own and
        its result's -- as :func:`tree_problems` checks them (metadata, chunk listings, generation),
        once each; raises DamagedStoreError on the first problem that a second look a moment later
        finds too (a result being swapped into place by another process is briefly absent)."""
        for array in (name, "elevation"):  # the result's tree, and the store's (the elevation's)
            tree = tree_of(self.root, array)
            if tree is None or tree[0] in self._trees:
                continue
            prefix, nodes = tree
            problems = tree_problems(self.root, prefix, nodes)
            if problems:
                import time

                time.sleep(0.2)
                tree = tree_of(self.root, array) or tree
                problems = tree_problems(self.root, *tree)
            if problems:
                p = problems[0]
                raise DamagedStoreError(self.root, p.array, p.chunk, p.problem, unit=p.unit)
            with self._lock:
                self._trees.add(prefix)

    def check_entry(self, name: str, key: str, size: int | None, _again: bool = True) -> bool:
        """Check a chunk file against the manifest: ``size`` is its size on disk, None when missing.
        Returns whether the file exists; raises DamagedStoreError if it should not be as it is (after
        reading the manifest once more: another process may have replaced the result since)."""
        if _again:
            try:
                return self.check_entry(name, key, size, _again=False)
            except DamagedStoreError:
                self._arrays.pop(name, None)
                path = self.root / name / key
                size = os.stat(path).st_size if path.is_file() else None
        layout, manifest = self.array(name)
        if manifest is None:
            return size is not None
        want = manifest.get(key)
        unit = "shard" if layout.kind == "sharded" else "chunk"
        if want is None and size is not None:
            raise DamagedStoreError(self.root, name, chunk_coords(key), f"{unit} file {key} is not in the "
                                    "array's manifest (written after the array was completed)", unit=unit)
        if want is not None and size is None:
            raise DamagedStoreError(self.root, name, chunk_coords(key), f"{unit} file {key} is missing "
                                    f"(the manifest lists {want} bytes)", unit=unit)
        if want is not None and size != want:
            raise DamagedStoreError(self.root, name, chunk_coords(key), f"{unit} file {key} is {size} bytes, "
                                    f"the manifest lists {want} (truncated or overwritten)", unit=unit)
        return size is not None

    def check_file(self, name: str, key: str) -> None:
        """Check chunk file ``key`` of array ``name`` whole (manifest entry and every checksum), once
        per file version; raises DamagedStoreError on the first problem."""
        path = self.root / name / key
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if not self.check_entry(name, key, st.st_size if st is not None else None):
            return
        stamp = (name, key, st.st_size, st.st_mtime_ns, st.st_ino)
        if stamp in self._sound:
            return
        layout, _ = self.array(name)
        with open(path, "rb") as f:
            raw = f.read()
        problems = check_file_bytes(layout, raw, chunk_coords(key))
        if problems:
            chunk, problem = problems[0]
            unit = "shard" if layout.kind == "sharded" and chunk == chunk_coords(key) and "shard" in problem \
                else "chunk"
            raise DamagedStoreError(self.root, name, chunk, problem, unit=unit)
        with self._lock:
            self._sound.add(stamp)

    def raise_damage(self, name: str, chunk, problem: str, unit: str = "chunk"):
        raise DamagedStoreError(self.root, name, chunk, problem, unit=unit)


def split_key(key: str) -> tuple[str, str] | None:
    """(array path, chunk key) of a store key that names a chunk file, else None (metadata)."""
    if key.endswith("zarr.json") or key.endswith(MANIFEST):
        return None
    if key.startswith("c/") or key == "c":
        return "", key
    if key.endswith("/c"):  # the one chunk of a 0-d array
        return key[:-2], "c"
    head, sep, tail = key.rpartition("/c/")  # the last "c" segment: chunk coordinates are numbers
    if sep:
        return head, "c/" + tail
    return None


class CheckedStore(LocalStore):
    """A zarr LocalStore that checks every chunk file against its array's manifest and checksums the
    first time any part of it is read (:meth:`Integrity.check_file`), then reads as LocalStore does."""

    def __init__(self, root, *, read_only: bool = False, integrity: Integrity | None = None):
        super().__init__(root, read_only=read_only)
        self.integrity = integrity if integrity is not None else Integrity(root, strict=False)

    def with_read_only(self, read_only: bool = False):
        return type(self)(self.root, read_only=read_only, integrity=self.integrity)

    def __reduce__(self):
        return (_rebuild_store, (str(self.root), self.read_only, self.integrity))

    async def list_dir(self, prefix: str):
        """LocalStore's listing without hidden names: the temporaries and scratch folders staged inside
        the store (:mod:`terrain_io.atomic`) are no members of its hierarchy."""
        async for key in super().list_dir(prefix):
            if not key.startswith("."):
                yield key

    def _check(self, key: str) -> None:
        parts = split_key(key)
        if parts is not None and (self.root / parts[0] / "zarr.json").is_file():
            self.integrity.check_file(*parts)

    def _check_metadata(self, key: str, buf) -> None:
        if buf is not None and key.endswith("zarr.json"):
            try:
                json.loads(buf.to_bytes())
            except ValueError as exc:
                node = key[: -len("zarr.json")].rstrip("/") or "/"
                raise DamagedStoreError(self.root, node, None, f"its zarr.json is not valid JSON ({exc})") from None

    async def get(self, key, prototype=None, byte_range=None):
        await asyncio.to_thread(self._check, key)
        buf = await super().get(key, prototype, byte_range)
        self._check_metadata(key, buf)
        return buf

    async def get_partial_values(self, prototype, key_ranges):
        key_ranges = list(key_ranges)
        for key in {k for k, _ in key_ranges}:
            await asyncio.to_thread(self._check, key)
        return await super().get_partial_values(prototype, key_ranges)

    def get_sync(self, key, *, prototype=None, byte_range=None):
        self._check(key)
        buf = super().get_sync(key, prototype=prototype, byte_range=byte_range)
        self._check_metadata(key, buf)
        return buf


def _rebuild_store(root, read_only, integrity):
    return CheckedStore(root, read_only=read_only, integrity=integrity)


# ---------------------------------------------------------------------------------------------
# terrain verify
# ---------------------------------------------------------------------------------------------
@dataclass
class Problem:
    array: str
    chunk: tuple[int, ...] | None
    unit: str
    problem: str

    def line(self) -> str:
        where = f" {self.unit} {self.chunk}" if self.chunk is not None else ""
        return f"{'result' if self.unit == 'result' else 'array'} {self.array}{where}: {self.problem}"


@dataclass
class VerifyReport:
    store: str
    format_version: int
    arrays: int = 0
    files: int = 0
    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)

    @property
    def checksums(self) -> bool:
        return self.format_version >= 2

    @property
    def sound(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"store": self.store, "format_version": self.format_version, "checksums": self.checksums,
                "sound": self.sound, "arrays": self.arrays, "files": self.files, "chunks": self.chunks,
                "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "problems": [{"array": p.array, "chunk": list(p.chunk) if p.chunk is not None else None,
                              "unit": p.unit, "problem": p.problem} for p in self.problems]}


def check_manifests(path) -> list[Problem]:
    """The cheap part of :func:`verify` (no chunk is read): every array's chunk files against its
    manifest -- missing, of another size, or not listed; format 2 arrays without a manifest.
    A problem is reported only if a second look a moment later finds it too (a result being swapped
    into place by another process is briefly absent)."""
    import time

    first = _check_manifests(path)
    if not first:
        return first
    time.sleep(0.2)
    again = {p.line() for p in _check_manifests(path)}
    return [p for p in first if p.line() in again]


def _check_manifests(path) -> list[Problem]:
    root = Path(path)
    with open(root / "zarr.json") as f:
        version = int(json.load(f).get("attributes", {}).get("format_version", 1))
    problems = []
    for name, array_dir, meta in _array_dirs(root):
        problems += _listing_problems(name, array_dir, version, meta)
    for prefix, nodes in sealed_trees(root).items():
        problems += tree_problems(root, prefix, nodes, listing=False)
    return problems


def _listing_problems(name: str, array_dir: Path, version: int, meta: dict | None = None) -> list[Problem]:
    """An array's chunk files against its manifest: missing, of another size, or not listed."""
    if meta is None:
        with open(array_dir / "zarr.json") as f:
            meta = json.load(f)
    unit = "shard" if layout_from_metadata(meta).kind == "sharded" else "chunk"
    try:
        manifest = read_manifest(array_dir)
    except DamagedStoreError as exc:
        return [Problem(name, None, unit, exc.problem)]
    if manifest is None:
        return [Problem(name, None, unit, f"no manifest ({MANIFEST})")] if version >= 2 else []
    problems = []
    on_disk = chunk_files(array_dir)
    for key in sorted(set(manifest) | set(on_disk)):
        want, got = manifest.get(key), on_disk.get(key)
        if want is None:
            problems.append(Problem(name, chunk_coords(key), unit, f"{unit} file {key} is not in the manifest"))
        elif got is None:
            problems.append(Problem(name, chunk_coords(key), unit, f"{unit} file {key} is missing"))
        elif got != want:
            problems.append(Problem(name, chunk_coords(key), unit, f"{unit} file {key} is {got} bytes, "
                                    f"the manifest lists {want}"))
    return problems


def _check_one(root: Path, name: str, layout: Layout, key: str, want: int | None, decode: bool):
    """(problems, chunks checked, bytes read) of one chunk file listed in a manifest or on disk."""
    path = root / name / key
    unit = "shard" if layout.kind == "sharded" else "chunk"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return [Problem(name, chunk_coords(key), unit, f"{unit} file {key} is missing"
                        + (f" (the manifest lists {want} bytes)" if want is not None else ""))], 0, 0
    except OSError as exc:
        return [Problem(name, chunk_coords(key), unit, f"{unit} file {key} unreadable: {exc.strerror or exc}")], 0, 0
    if want is not None and len(raw) != want:
        return [Problem(name, chunk_coords(key), unit, f"{unit} file {key} is {len(raw)} bytes, the manifest "
                        f"lists {want} (truncated or overwritten)")], 0, len(raw)
    found = check_file_bytes(layout, raw, chunk_coords(key))
    problems = [Problem(name, c, "shard" if "shard" in p and c == chunk_coords(key) and layout.kind == "sharded"
                        else "chunk", p) for c, p in found]
    chunks = 1
    if layout.kind == "sharded" and len(raw) >= layout.index_bytes:
        index = np.frombuffer(raw[len(raw) - layout.index_bytes:][: int(np.prod(layout.per_shard)) * 16], "<u8")
        chunks = int(np.count_nonzero(index.reshape(-1, 2)[:, 0] != NO_CHUNK))
        if decode and not problems and layout.zstd:  # no checksums (format 1): zstd frames at least decode
            from numcodecs import Zstd

            zstd = Zstd()
            for inner in np.ndindex(*layout.per_shard):
                off, nb = (int(v) for v in index.reshape(*layout.per_shard, 2)[inner])
                if off == NO_CHUNK:
                    continue
                try:
                    zstd.decode(raw[off : off + nb])
                except Exception as exc:  # noqa: BLE001 -- any decoder failure is damage
                    chunk = tuple(w * p + i for w, p, i in zip(chunk_coords(key), layout.per_shard, inner))
                    problems.append(Problem(name, chunk, "chunk", f"chunk does not decode ({exc})"))
    return problems, chunks, len(raw)


def verify(path, progress: bool = False, threads: int | None = None) -> VerifyReport:
    """Read every chunk file of every array of the store at ``path`` and check it: its manifest entry
    (missing, truncated, unlisted files), its shard index checksum and every chunk's checksum
    (format 1 stores: shard index checksums and zstd decoding only). Files are read by parallel threads."""
    import time

    from .progress import progress_bar

    t0 = time.perf_counter()
    root = Path(path)
    try:
        with open(root / "zarr.json") as f:
            version = int(json.load(f).get("attributes", {}).get("format_version", 1))
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise StoreError(f"{path}: cannot read the store's zarr.json: {exc}") from None
    report = VerifyReport(str(path), version)
    jobs = []
    unreadable: list[str] = []
    for name, array_dir, meta in _array_dirs(root, unreadable):
        report.arrays += 1
        layout = layout_from_metadata(meta)
        try:
            manifest = read_manifest(array_dir)
        except DamagedStoreError as exc:
            report.problems.append(Problem(name, None, "chunk", exc.problem))
            manifest = None
        on_disk = chunk_files(array_dir)
        if manifest is None and version >= 2:
            report.problems.append(Problem(name, None, "chunk", f"no manifest ({MANIFEST}): a missing shard "
                                           "file could not be told"))
        if manifest is not None:
            for key in sorted(set(on_disk) - set(manifest)):
                report.problems.append(Problem(name, chunk_coords(key), "shard" if layout.kind == "sharded"
                                               else "chunk", f"file {key} is not in the array's manifest"))
        keys = sorted(set(manifest or {}) | (set(on_disk) if manifest is None else set()))
        if version < 2 and not layout.chunk_crc and layout.kind == "plain" and not layout.zstd:
            keys = []  # nothing to check in plain unchecksummed chunks
        for key in keys:
            jobs.append((name, layout, key, (manifest or {}).get(key), not layout.chunk_crc))
    report.problems += [Problem(name, None, "chunk", "its zarr.json cannot be read") for name in unreadable]
    for prefix, nodes in sealed_trees(root).items():
        report.problems += tree_problems(root, prefix, nodes, listing=False)  # the listing: the chunk checks below
    report.files = len(jobs)
    bar = progress_bar(progress, len(jobs), f"verify {root.name}", unit="file")
    try:
        with ThreadPoolExecutor(threads or max(2, min(16, 2 * (os.cpu_count() or 1)))) as pool:
            for (name, layout, key, want, decode), (problems, chunks, nbytes) in zip(
                    jobs, pool.map(lambda j: _check_one(root, *j), jobs)):
                report.problems.extend(problems)
                report.chunks += chunks
                report.bytes += nbytes
                bar.update(1)
    finally:
        bar.close()
    report.problems.sort(key=lambda p: (p.array, p.chunk or ()))
    report.seconds = time.perf_counter() - t0
    return report
