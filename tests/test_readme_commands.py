"""Every command line of the README runs: the user's contract, as a user would type it.

The lines starting with ``terrain`` in the README's fenced code blocks are run in order, in one
folder holding the files they name (a DEM store made from the bundled Jacksboro sample, georeferenced
in UTM so that the README's coordinates fall on it; point files, rasters and graphs written here, the
graphs' ground truth by scipy), and each must exit 0. The synopses of the command table are not
runnable as they stand (placeholders, alternatives): each alternative of each synopsis, with every
optional part and example values, must parse with the command's own options.
"""
from __future__ import annotations

import re
import shlex
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli

_register()

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
UTM = "EPSG:32617"  # the sample lies in UTM zone 17 (Tennessee); its cells are taken as 100 m here
X0, Y0, CELL = 510000.0, 4110000.0, 100.0


def fenced_commands() -> list[tuple[int, str]]:
    """(line number, command) of every ``terrain ...`` command in a fenced block (``a && terrain b``:
    the ``terrain b`` part), comments removed."""
    out, fence = [], False
    for number, line in enumerate(README.splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            continue
        for part in line.split("#")[0].split("&&"):
            if part.strip().startswith("terrain "):
                out.append((number, part.strip()))
    return out


def table_synopses() -> list[tuple[int, str]]:
    """(line number, synopsis) of the command table's first column."""
    return [(number, m.group(1).replace("\\|", "|")) for number, line in enumerate(README.splitlines(), 1)
            if (m := re.match(r"\| `(terrain [^`]+)` \|", line))]


def _run(args):
    return CliRunner().invoke(cli, args)


# --- the fenced command lines, run --------------------------------------------------------------

def _wkb_point(x, y):
    return struct.pack("<BIdd", 1, 1, x, y)


def _write_points(path, xy, crs, driver):
    pyogrio = pytest.importorskip("pyogrio")

    geometry = np.array([_wkb_point(x, y) for x, y in xy], dtype=object)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pyogrio.raw.write(str(path), geometry, [np.arange(len(xy), dtype=np.int32)], ["id"], driver=driver,
                          geometry_type="Point", crs=crs)


def _to_lonlat(xy):
    from pyproj import Transformer

    lon, lat = Transformer.from_crs(UTM, "EPSG:4326", always_xy=True).transform(*np.asarray(xy, float).T)
    return np.column_stack([lon, lat])


def _write_raster(path, values, like):
    import rasterio

    profile = dict(like.profile, driver="GTiff", dtype=values.dtype.name, nodata=None)
    with rasterio.open(path, "w", **profile) as ds:
        ds.write(values, 1)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder holding every file the README's command lines name (see the module's docstring)."""
    import rasterio
    import scipy.sparse as sp
    from rasterio.transform import from_origin
    from scipy.sparse.csgraph import minimum_spanning_tree

    folder = tmp_path_factory.mktemp("readme")
    with rasterio.open(ROOT / "sample_data" / "jacksboro_fault_dem.asc") as src:  # read by GDAL, not by us
        values = src.read(1).astype(np.float32)
    dem = folder / "dem.tif"
    with rasterio.open(dem, "w", driver="GTiff", width=values.shape[1], height=values.shape[0], count=1,
                       dtype="float32", crs=UTM, transform=from_origin(X0, Y0, CELL, CELL)) as ds:
        ds.write(values, 1)
    r = _run(["-q", "convert", str(dem), "-o", str(folder / "dem.zarr")])
    assert r.exit_code == 0, r.output
    with rasterio.open(dem) as like:
        rivers = np.zeros(values.shape, np.uint8)
        rivers[100, 50:300] = 1
        _write_raster(folder / "rivers.tif", rivers, like)
        cost = 1.0 + np.random.default_rng(0).random(values.shape).astype(np.float32)
        _write_raster(folder / "cost.tif", cost, like)
    _write_points(folder / "wells.gpkg", _to_lonlat([(520000, 4100000), (525000, 4095000)]), "EPSG:4326", "GPKG")
    _write_points(folder / "villages.shp", [(514000, 4106000), (530500, 4086500)], UTM, "ESRI Shapefile")
    gauges = _to_lonlat([(515000, 4105000), (535000, 4085000), (600000, 4000000)])  # the last: off the DEM
    (folder / "gauges.csv").write_text("lon,lat\n" + "".join(f"{float(x)!r},{float(y)!r}\n" for x, y in gauges))
    rng = np.random.default_rng(1)
    n = 40
    pairs = sorted({(int(a), int(b)) for a, b in rng.integers(0, n, (150, 2)) if a < b})
    u, v = np.array(pairs).T
    w = rng.permutation(len(u)) + 1  # distinct weights: one minimum spanning forest
    (folder / "edges.csv").write_text("u,v\n" + "".join(f"{a},{b}\n" for a, b in zip(u, v)))
    (folder / "graph.csv").write_text("source,target,weight\n" + "".join(f"{a},{b},{c}\n" for a, b, c in zip(u, v, w)))
    T = minimum_spanning_tree(sp.csr_matrix((w.astype(float), (u, v)), shape=(n, n))).tocoo()
    (folder / "graph_gt.csv").write_text(
        "source,target,weight\n" + "".join(f"{a},{b},{int(c)}\n" for a, b, c in zip(T.row, T.col, T.data)))
    W = np.full((n, n), np.inf)
    W[u, v] = w
    np.save(folder / "weights.npy", W)
    return folder


def test_the_readme_has_the_command_lines_this_test_runs():
    """The extraction finds the README's commands (a test that ran none would pass on nothing)."""
    commands = [c for _, c in fenced_commands()]
    assert len(commands) >= 16 and "terrain demo" in commands
    assert any(c.startswith("terrain graph bfs") for c in commands)
    assert len(table_synopses()) >= 13


RUNNABLE = [(n, c) for n, c in fenced_commands() if c != "terrain demo"]


@pytest.mark.parametrize("line,command", RUNNABLE, ids=[f"L{n}" for n, _ in RUNNABLE])
def test_readme_command_line_exits_0(workspace, monkeypatch, line, command):
    """Each line, in the README's order (later lines use earlier results), exits 0."""
    monkeypatch.chdir(workspace)
    r = _run(shlex.split(command)[1:])
    assert r.exit_code == 0, f"README line {line}: {command}\n{r.output}"
    if "--check" in command:  # graph mst --check: our forest against scipy's, written above
        assert "agrees with graph_gt.csv" in r.output, r.output


@pytest.mark.slow
def test_readme_demo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _run(["demo"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "terrain-demo" / "elevation.png").exists()


def test_readme_version_line():
    from importlib.metadata import version

    r = _run(["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"terrain-io {version('terrain-io')}"


# --- the command table's synopses, parsed -------------------------------------------------------

EXAMPLES = {"SRC": "dem.asc", "STORE": "dem.zarr", "OUT.zarr": "out.zarr", "N": "2", "M": "3", "S": "1",
            "F": "0.1", "X,Y": "1,2", "FILE": "points.csv", "CRS": "EPSG:4326", "C": "10", "W": "absdiff",
            "D": "2", "DIR": "out", "INPUT": "edges.csv", "ARRAY": "elevation"}


def _variant(synopsis: str, k: int) -> list[str]:
    """The synopsis with every optional part, alternative k of each choice (the last where fewer),
    placeholders as example values. ``--a X|--b Y`` is a choice of two options with their values."""
    phrases = re.sub(r"(--[\w-]+ [^\s|\[\]]+)\|(--[\w-]+ [^\s|\[\]]+)", r"{\1|\2}", synopsis)
    args = []
    for m in re.finditer(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]|\{([^}]*)\}|(\S+)", phrases):
        if m.group(2) is not None:
            alts = m.group(2).split("|")
            words = alts[min(k, len(alts) - 1)].split()
        else:  # (an optional part inside an optional part: taken too)
            words = (m.group(1) or m.group(3)).replace("[", "").replace("]", "").split()
        for word in words:
            alts = word.split("|")
            word = alts[min(k, len(alts) - 1)]
            args.append(EXAMPLES.get(word, word))
    return args[1:]  # without "terrain"


def _parse(args: list[str]):
    """Parse ``terrain ARGS`` (a subcommand, under ``graph`` a second one, then its arguments) with the
    command's own options, as click does before running it."""
    import click

    cmd, ctx = cli, click.Context(cli, info_name="terrain")
    while isinstance(cmd, click.Group):
        name, args = args[0], args[1:]
        cmd = cmd.get_command(ctx, name)
        assert cmd is not None, f"no command {name!r}"
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd, info_name=name, parent=ctx)
    return cmd.make_context(name, list(args), parent=ctx)


SYNOPSES = table_synopses()


@pytest.mark.parametrize("line,synopsis", SYNOPSES, ids=[f"L{n}" for n, _ in SYNOPSES])
def test_readme_table_synopsis_parses(line, synopsis):
    """Every option the table names exists, takes the values it shows, and the arguments fit."""
    alternatives = max(len(part.split("|")) for part in synopsis.split())
    for k in range(alternatives):
        args = _variant(synopsis, k)
        try:
            _parse(args)
        except Exception as exc:  # noqa: BLE001 -- click's usage errors: the message is the test's answer
            pytest.fail(f"README line {line}: terrain {' '.join(args)}: {type(exc).__name__}: {exc}")
