"""``terrain graph ...``: general-graph algorithms on edge lists (terrain_io.graph)."""
from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from terrain_io.backend import to_host
from terrain_io.errors import InputError, TerrainError

from .common import Timer, device_option, say
from .main import cli


@cli.group()
def graph():
    """General graphs: list ranking, components, BFS, APSP, MST on edge lists."""


# --- apsp and mst (General graphs II) ---------------------------------------------------------

@graph.command("apsp")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the distance matrix (.npy).")
@click.option("--method", type=click.Choice(["auto", "minplus", "floyd_warshall", "blocked"]), default="auto",
              show_default=True, help="Repeated min-plus squaring, Floyd-Warshall or blocked Floyd-Warshall.")
@click.option("--undirected", is_flag=True, help="Edge lists: every edge goes both ways.")
@device_option
def apsp_command(source, output, method, undirected, device):
    """All-pairs shortest paths of SOURCE: a square weight matrix (.npy, inf = no edge) or an edge list
    (CSV source,target,weight or .npz)."""
    from terrain_io.graph.apsp import apsp, dense_from_edges
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
        W = dense_from_edges(e.u, e.v, e.w, e.n, directed=not undirected)
    D = to_host(apsp(W, method=method, device=device))
    n = D.shape[0]
    unreachable = int(np.sum(~np.isfinite(D))) if D.dtype.kind == "f" else int(np.sum(D == np.iinfo(D.dtype).max))
    if output:
        tmp = Path(output).with_name(f".{Path(output).name}.partial.npy")
        np.save(tmp, D)
        tmp.replace(output)
    say(f"apsp: {n} vertices, {n * n - unreachable} reachable pairs, {timer.elapsed:.3f} s"
        + (f" -> {output}" if output else ""))


@graph.command("mst")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the forest's edges (CSV).")
@click.option("--method", type=click.Choice(["auto", "kruskal", "filter_kruskal", "boruvka"]), default="auto",
              show_default=True, help="Kruskal, Filter-Kruskal or Borůvka (auto: Borůvka on the GPU).")
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
