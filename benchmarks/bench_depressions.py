"""Depression hierarchy benchmark: ``terrain depressions`` against higra's ``bpt_canonical`` and our
own ``fill``, side by side on the same synthetic DEM (``terrain synth`` terrain, no nodata).

No pip package computes Barnes' depression hierarchy for Python 3.11 (RichDEM's is C++ only). The
nearest peer is higra (Perret et al. 2019): ``bpt_canonical`` is the binary partition tree by
altitude ordering -- Kruskal over the cell graph -- of the same graph (8-neighbour edges weighing
max(h_i, h_j), an outside vertex joined to the DEM's edge cells at h): the minimax hierarchy at the
level of cells, of which ours is the contraction to basins. Its time counts building the graph and
the tree from the DEM. Our tree is checked against it: every merge's level is the altitude of the
lowest common ancestor of its two children's pits in higra's tree, every root's spill that of its
pit and the outside vertex. Every tool runs in its own process (its peak RSS its own); our kernels
are compiled on a small DEM first.

    python benchmarks/bench_depressions.py --sizes 1024 4096
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from common import bench_parser, header, run_child, save_rows, synthetic_dem, work_folder  # noqa: E402 (benchmarks/ is on sys.path)


def one(what: str, store: str, out: str, memory: str | None) -> dict:
    """One measurement in this (fresh) process."""
    import numpy as np

    from terrain_io.memory import peak_rss
    from terrain_io.store import TerrainStore

    res = {"what": what}
    if what in ("ours", "ours-fill"):
        from terrain_io.grid.depressions import depressions
        from terrain_io.grid.fill import fill
        from terrain_io.synth import synthesize

        run = depressions if what == "ours" else fill
        warm = synthesize(Path(out).with_suffix(".warm.zarr"), 300, seed=2, tile=TerrainStore.open(store).tile_size,
                          overwrite=True)
        run(warm, device="cpu", progress=False)
        t = time.perf_counter()
        r = run(store, device="cpu", progress=False, memory=memory)
        res.update(seconds=time.perf_counter() - t, timings=r.timings, method=r.method)
        shutil.rmtree(warm.path)
        if what == "ours":
            tr = r.hierarchy
            res.update(leaves=r.leaves, merges=r.merges)
            np.savez(out, parent=tr.parent, spill=tr.spill, pit=tr.pit, n_leaves=tr.n_leaves)
    elif what == "higra":
        import higra as hg

        z = np.asarray(TerrainStore.open(store).elevation[...]).astype(np.float64)
        rows, cols = z.shape
        t = time.perf_counter()
        ids = np.arange(rows * cols).reshape(rows, cols)
        src, dst = [], []
        for a, b in ((0, 1), (1, -1), (1, 0), (1, 1)):
            r0, r1 = 0, rows - a
            c0, c1 = max(0, -b), cols - max(0, b)
            src.append(ids[r0:r1, c0:c1].ravel())
            dst.append(ids[r0 + a:r1 + a, c0 + b:c1 + b].ravel())
        edge = np.zeros((rows, cols), bool)
        edge[0], edge[-1], edge[:, 0], edge[:, -1] = True, True, True, True
        src.append(ids[edge])
        dst.append(np.full(int(edge.sum()), rows * cols))
        src, dst = np.concatenate(src), np.concatenate(dst)
        flat = z.ravel()
        w = np.maximum(flat[src], np.append(flat, -np.inf)[dst])
        g = hg.UndirectedGraph(rows * cols + 1)
        g.add_edges(src, dst)
        del src, dst
        tree, alt = hg.bpt_canonical(g, w)
        res["seconds"] = time.perf_counter() - t
        res["peak_rss"] = peak_rss()
        ours = np.load(out)
        parent, spill, pit = ours["parent"], ours["spill"], ours["pit"]
        kids = np.argsort(parent[1:], kind="stable") + 1  # nodes by parent: a merge's two children adjacent
        kids = kids[parent[kids] > 0]
        a, b = kids[0::2], kids[1::2]
        assert np.array_equal(parent[a], parent[b])
        tree.lowest_common_ancestor_preprocess()
        got = alt[tree.lowest_common_ancestor(pit[a], pit[b])]
        roots = np.nonzero((parent == 0) & ~np.isnan(spill))[0]
        roots = roots[roots > 0]
        got_r = alt[tree.lowest_common_ancestor(pit[roots], np.full(len(roots), rows * cols))]
        res["merges_checked"] = len(a)
        res["merges_differing"] = int(np.count_nonzero(got != spill[a]))
        res["roots_checked"] = len(roots)
        res["roots_differing"] = int(np.count_nonzero(got_r != spill[roots]))
        return res
    res["peak_rss"] = peak_rss()
    return res


def spawn(what, store, out, memory) -> dict:
    return run_child(what, __file__, "--one", what, store, out, memory or "")


def main():
    args = bench_parser(sizes=[1024, 4096], memory=True, peers=True, tile=True).parse_args()
    from terrain_io.memory import format_bytes

    work = work_folder(args, "depressions")
    header("cpu")
    rows = []
    for n in args.sizes:
        st = synthetic_dem(work, n, args.tile)
        print(f"\n{n}^2:", flush=True)
        out = str(work / "ours.npz")
        runs = {"ours": spawn("ours", str(st.path), out, args.memory)}
        runs["ours-fill"] = spawn("ours-fill", str(st.path), out, args.memory)
        if not args.no_peers:
            try:
                runs["higra"] = spawn("higra", str(st.path), out, None)
            except RuntimeError as exc:
                runs["higra"] = {"what": "higra", "error": str(exc)[-300:]}
        base = runs["ours"]["seconds"]
        for what, r in runs.items():
            if "seconds" not in r:
                print(f"  {what:10s} failed: {r.get('error')}")
                continue
            extra = ""
            if what == "ours":
                extra = f"  {r['leaves']:,} leaves, {r['merges']:,} merges {r['timings']} {r['method']}"
            elif what == "higra":
                extra = (f"  merges differing {r['merges_differing']}/{r['merges_checked']:,}, roots "
                         f"{r['roots_differing']}/{r['roots_checked']:,}")
            print(f"  {what:10s} {r['seconds']:8.2f} s  {r['seconds'] / base:6.2f}x ours  peak "
                  f"{format_bytes(r['peak_rss'])}{extra}", flush=True)
            rows.append({"n": n, **r})
    save_rows(rows, args.json)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        a = sys.argv[2:]
        print(json.dumps(one(a[0], a[1], a[2], a[3] or None)))
    else:
        main()
