"""``terrain graph ...``: general-graph algorithms on edge lists (terrain_io.graph)."""
from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from terrain_io.atomic import atomic_file
from terrain_io.backend import to_host
from terrain_io.errors import InputError, TerrainError
from terrain_io.tables import write_csv

from .common import Timer, device_option, new_output_file, output_option, overwrite_files_option, say
from .main import cli


# One default for every command whose graph may be directed: as scipy.sparse.csgraph and terrain_io.graph.
directed_option = click.option("--directed/--undirected", default=True, show_default=True,
                               help="Follow edges u -> v only, or every edge both ways (edge lists).")


@cli.group(short_help="General graphs: listrank, cc, bfs, apsp, mst on edge lists.")
def graph():
    """General graphs: list ranking, components, BFS, APSP, MST on edge lists."""


def graph_command(name: str, short_help: str, output_help: str, methods: list[str], method_help: str):
    """A ``terrain graph NAME`` command with what they all take: the SOURCE file, ``-o/--output``
    (``output_help``; an existing file replaced only with ``--overwrite``) and ``--method`` (auto or
    one of ``methods``). The command's own options follow them."""
    def command(f):
        f = click.option("--method", type=click.Choice(["auto", *methods]), default="auto", show_default=True,
                         help=method_help)(f)
        f = output_option(output_help, callback=new_output_file)(f)
        f = overwrite_files_option(f)
        f = click.argument("source", type=click.Path(dir_okay=False))(f)
        return graph.command(name, short_help=short_help)(f)

    return command


# --- apsp and mst (General graphs II) ---------------------------------------------------------

@graph_command("apsp", "All-pairs shortest paths of a matrix or edge list.",
               "Write the distance matrix (.npy, float64, inf = unreachable).",
               ["minplus", "floyd_warshall", "blocked"],
               "Repeated min-plus squaring, Floyd-Warshall or blocked Floyd-Warshall.")
@directed_option
@device_option
def apsp_command(source, output, method, directed, device):
    """All-pairs shortest paths of SOURCE: a square weight matrix (.npy, inf = no edge; integer
    matrices: the dtype's maximum) or an edge list (CSV source,target,weight or .npz). Writes the
    distances as float64 .npy, inf = unreachable (as scipy.sparse.csgraph), whatever the input's type."""
    from terrain_io.graph.apsp import apsp, as_float_distances, dense_from_edges
    from terrain_io.graph.io import read_edge_list

    timer = Timer()
    path = Path(source)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if path.suffix.lower() == ".npy":
        try:
            W = np.load(path, allow_pickle=False)
        except Exception as exc:
            raise InputError(f"{path}: not a readable .npy file ({exc})") from None
    else:
        e = read_edge_list(path)
        W = dense_from_edges(e.u, e.v, e.w, e.n, directed=directed)
    D = as_float_distances(to_host(apsp(W, method=method, device=device)))  # inf = unreachable, any input dtype
    n = D.shape[0]
    unreachable = int(np.sum(~np.isfinite(D)))
    if output:
        with atomic_file(output) as tmp, open(tmp, "wb") as f:
            np.save(f, D)  # a file object: np.save would append ".npy" to the temporary's name
    say(f"apsp: {n} vertices, {n * n - unreachable} reachable pairs, {timer.elapsed:.3f} s"
        + (f" -> {output}" if output else ""))


@graph_command("mst", "Minimum spanning forest of an edge list.", "Write the forest's edges (CSV).",
               ["kruskal", "filter_kruskal", "boruvka"], "Kruskal, Filter-Kruskal or Borůvka (auto: Borůvka on the GPU).")
@click.option("--check", is_flag=True, help="Compare with the ground truth XYZ_gt.csv beside XYZ.csv.")
@device_option
def mst_command(source, output, method, check, device):
    """Minimum spanning forest of the edge list SOURCE (CSV source,target,weight or .npz)."""
    from terrain_io.graph.io import check_forest, ground_truth_path, read_edge_list, write_edge_list
    from terrain_io.graph.mst import forest_edges, minimum_spanning_forest

    timer = Timer()
    edges = read_edge_list(source)
    read_s = timer.elapsed
    forest = minimum_spanning_forest(edges, method=method, device=device)
    result = forest_edges(edges, forest)
    if output:
        write_edge_list(output, result.u, result.v, result.w)
    say(f"mst: {edges.n} vertices, {edges.m} edges -> {result.m} forest edges, {forest.trees} trees, "
        f"weight {forest.weight:.17g}, read {read_s:.3f} s, total {timer.elapsed:.3f} s"
        + (f" -> {output}" if output else ""))
    if check:
        gt = ground_truth_path(source)
        truth = read_edge_list(gt, n=edges.n)
        w = edges.w
        distinct = w is not None and len(np.unique(w)) == len(w)
        problems = check_forest(result, truth, distinct)
        if problems:
            raise TerrainError(f"check against {gt.name} failed: " + "; ".join(problems))
        say(f"check: agrees with {gt.name}" + (" (same edge set)" if distinct else " (size and weight)"))


# --- listrank, cc and bfs (General graphs I) --------------------------------------------------

def _read_graph_input(source, vertices):
    from terrain_io.graph.io import read_edge_list

    edges = read_edge_list(source, n=vertices)
    if edges.n == 0:
        raise InputError(f"{source}: empty graph (no vertices)")
    return edges


def _write_table(path, names, columns):
    """Write columns as .npy (2-D int64) or CSV with a header (:func:`terrain_io.tables.write_csv`, lines
    ending in LF), atomically (temporary file, rename)."""
    path = Path(path)
    columns = [to_host(c).astype(np.int64) for c in columns]
    if path.suffix.lower() != ".npy":
        write_csv(dict(zip(names, columns)), path, newline=b"\n")
        return
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        np.save(f, np.column_stack(columns))  # a file object: np.save would append ".npy" to the temporary's name


@graph_command("listrank", "Rank the linked lists of an edge list.", "Write vertex,rank (CSV or .npy).",
               ["recursive_hj", "helman_jaja", "wyllie", "sequential"], "List-ranking algorithm.")
@click.option("--origin", type=click.Choice(["head", "tail"]), default="head", show_default=True,
              help="Rank = position from the head, or distance to the tail.")
@click.option("--vertices", type=int, help="Number of elements (default: largest id + 1).")
@device_option
def listrank_command(source, output, method, origin, vertices, device):
    """Rank the linked lists of SOURCE: each edge u,v says v follows u (CSV u,v[,w] or .npz)."""
    from terrain_io.graph.listrank import list_rank

    timer = Timer()
    edges = _read_graph_input(source, vertices)
    u, v = edges.u, edges.v
    if len(np.unique(u)) != len(u):
        raise InputError(f"{source}: an element has more than one successor")
    succ = np.full(edges.n, -1, dtype=np.int64)
    succ[u] = v
    ranks = to_host(list_rank(succ, method=method, origin=origin, device=device))
    if output:
        _write_table(output, ["vertex", "rank"], [np.arange(edges.n), ranks])
    lists = edges.n - len(u)
    say(f"listrank: {edges.n} elements in {lists} lists, longest {int(ranks.max()) + 1}, "
        f"{timer.elapsed:.3f} s" + (f" -> {output}" if output else ""))


@graph_command("cc", "Connected components of an undirected graph.",
               "Write vertex,label (label = smallest vertex id of the component; CSV or .npy).", ["union_find", "sv"],
               "Union-find (ECL-CC style) or Shiloach-Vishkin hooking + pointer jumping.")
@click.option("--vertices", type=int, help="Number of vertices (default: largest id + 1).")
@device_option
def cc_command(source, output, method, vertices, device):
    """Connected components of the undirected graph SOURCE (CSV u,v[,w] or .npz)."""
    from terrain_io.graph.components import connected_components

    timer = Timer()
    edges = _read_graph_input(source, vertices)
    count, labels = connected_components(edges, method=method, device=device)
    labels = to_host(labels)
    if output:
        _write_table(output, ["vertex", "label"], [np.arange(edges.n), labels])
    largest = int(np.bincount(labels).max())
    say(f"cc: {edges.n} vertices, {edges.m} edges -> {count} components (largest {largest}), "
        f"{timer.elapsed:.3f} s" + (f" -> {output}" if output else ""))


@graph_command("bfs", "Breadth-first search from one vertex.", "Write vertex,depth,parent (CSV or .npy).",
               ["frontier", "naive"],
               "Direction-optimising frontier BFS, top-down frontier only, or the every-edge baseline.")
@click.option("--from", "--source", "start", type=int, default=0, show_default=True, help="Source vertex.")
@directed_option
@click.option("--vertices", type=int, help="Number of vertices (default: largest id + 1).")
@device_option
def bfs_command(source, start, output, method, directed, vertices, device):
    """Breadth-first search of the graph SOURCE (CSV u,v[,w] or .npz) from one vertex."""
    from terrain_io.graph.bfs import bfs

    timer = Timer()
    edges = _read_graph_input(source, vertices)
    depth, parent, info = bfs(edges, start, method=method, directed=directed, device=device, return_info=True)
    depth, parent = to_host(depth), to_host(parent)
    if output:
        _write_table(output, ["vertex", "depth", "parent"], [np.arange(edges.n), depth, parent])
    say(f"bfs: {edges.n} vertices, {edges.m} edges, {int(np.count_nonzero(depth >= 0))} reached from {start} "
        f"in {int(depth.max())} levels, {timer.elapsed:.3f} s" + (f" -> {output}" if output else ""))
