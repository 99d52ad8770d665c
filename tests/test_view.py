"""Looking at results: overviews in the store (terrain_io.overviews), Cloud-Optimized GeoTIFF export,
and the `terrain view` server (robustness over plain HTTP here; the browser in tests/test_view_browser.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import _register, cli
from references import overview_max as ref_max
from references import overview_mean as ref_mean
from references import overview_mode as ref_mode
from references import check_cog_layout, utm_store
from terrain_io.integrity import verify
from terrain_io.overviews import write_overviews
from terrain_io.store import TerrainStore

SHAPE = (150, 97)  # odd sides: the edge blocks of every level have fewer than 4 cells

_register()


def _values(seed=0):
    rng = np.random.default_rng(seed)
    z = (rng.random(SHAPE) * 300 + 100).astype(np.float32)
    z[rng.random(SHAPE) < 0.1] = np.nan
    z[:9, :13] = np.nan  # a block of nodata: levels keep it as nodata
    return z


def _store(path, tile=16, shard=2, seed=0):
    """A UTM store with elevation and three results of the three kinds: ids (mode), accumulation (max),
    codes (mode)."""
    z = _values(seed)
    st = utm_store(path, z, tile=tile, shard=shard)
    rng = np.random.default_rng(seed + 1)
    ids = rng.integers(0, 4, SHAPE).astype(np.uint32)  # few ids: ties and majorities both occur
    acc = np.where(np.isnan(z), np.nan, rng.random(SHAPE) * 1e4)
    codes = rng.integers(0, 10, SHAPE).astype(np.uint8)
    with st.write_result("fill") as w:
        w.create_array("depression", "uint32", 0)[...] = ids
    with st.write_result("flow") as w:
        w.create_array("accumulation", "float64", float("nan"))[...] = acc
        w.create_array("direction", "uint8", 255)[...] = codes
    return z, ids, acc, codes


def _level(path, name, k):
    leaf = name.rsplit("/", 1)[-1]
    return TerrainStore.open(path, mode="r").group[f"overviews/{name}/{k}/{leaf}"][...]


def test_overviews_each_level_is_the_reduction_of_the_level_below(tmp_path):
    z, ids, acc, codes = _store(tmp_path / "s.zarr")
    done = write_overviews(tmp_path / "s.zarr")
    assert done == {"elevation": 4, "fill/depression": 4, "flow/accumulation": 4, "flow/direction": 4}
    for name, base, ref in (("elevation", z, ref_mean), ("flow/accumulation", acc, ref_max),
                            ("fill/depression", ids, lambda a: ref_mode(a, 0)),
                            ("flow/direction", codes, lambda a: ref_mode(a, 255))):
        below = base
        for k in range(1, 5):
            got = _level(tmp_path / "s.zarr", name, k)
            want = ref(below)
            assert got.dtype == base.dtype and got.shape == want.shape, (name, k)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} level {k}")
            below = got
        assert max(below.shape) <= 16  # down to one tile
    assert np.isnan(_level(tmp_path / "s.zarr", "elevation", 2)[:2, :3]).all()  # the nodata block stays nodata
    assert verify(tmp_path / "s.zarr").sound  # sealed: checksums and manifests as every array
    info = CliRunner().invoke(cli, ["info", str(tmp_path / "s.zarr"), "--json"])
    assert info.exit_code == 0 and "overviews" not in json.loads(info.output)["results"]  # levels are no results


def _files(path: Path) -> dict[str, bytes]:
    root = path / "overviews"
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()
            and f.name != "zarr.json" and f.name != "terrain-manifest.json"}


def test_overviews_same_bytes_for_any_tiling_budget_and_scheduler(tmp_path):
    _store(tmp_path / "a.zarr", tile=16, shard=2)
    write_overviews(tmp_path / "a.zarr")
    _store(tmp_path / "b.zarr", tile=16, shard=2)
    write_overviews(tmp_path / "b.zarr", memory="80kB", scheduler="threads")  # one shard in flight
    assert _files(tmp_path / "a.zarr") == _files(tmp_path / "b.zarr")
    for tile, shard in ((8, 4), (32, 1), (16, 8)):
        path = tmp_path / f"t{tile}_{shard}.zarr"
        _store(path, tile=tile, shard=shard)
        write_overviews(path)
        for name in ("elevation", "fill/depression", "flow/accumulation"):
            for k in range(1, 3):  # the levels both have (down to one tile of each)
                assert _level(path, name, k).tobytes() == _level(tmp_path / "a.zarr", name, k).tobytes()


def test_overviews_open_in_xarray_with_coordinates(tmp_path):
    xr = pytest.importorskip("xarray")
    z, *_ = _store(tmp_path / "s.zarr")
    write_overviews(tmp_path / "s.zarr", ["elevation", "flow/accumulation"])
    for k in range(1, 5):
        ds = xr.open_zarr(tmp_path / "s.zarr", group=f"overviews/elevation/{k}", consolidated=False)
        da = ds.elevation
        assert da.dims == ("y", "x") and da.shape == _level(tmp_path / "s.zarr", "elevation", k).shape
        step = 30.0 * 2**k
        np.testing.assert_allclose(da.x.values, 500000.0 + (np.arange(da.shape[1]) + 0.5) * step)
        np.testing.assert_allclose(da.y.values, 4100000.0 - (np.arange(da.shape[0]) + 0.5) * step)
        assert "GeoTransform" in ds.spatial_ref.attrs
    tree = xr.open_datatree(tmp_path / "s.zarr" / "overviews" / "flow" / "accumulation", engine="zarr",
                            consolidated=False)
    assert sorted(tree.children) == ["1", "2", "3", "4"]
    assert tree["3"].dataset.accumulation.shape == _level(tmp_path / "s.zarr", "flow/accumulation", 3).shape
    meta = tree.attrs["multiscales"]
    assert [e["asset"] for e in meta["layout"]] == ["1", "2", "3", "4"]
    assert meta["layout"][1] | {} == meta["layout"][1] and meta["layout"][1]["derived_from"] == "1"
    assert meta["layout"][1]["transform"]["scale"] == [2.0, 2.0] and tree.attrs["source"] == "flow/accumulation"


def test_overviews_bad_input(tmp_path):
    _store(tmp_path / "s.zarr")
    run = CliRunner().invoke
    r = run(cli, ["overviews", str(tmp_path / "s.zarr"), "nope/array"])
    assert r.exit_code == 1 and r.output.strip().splitlines()[-1].startswith("terrain: error: ") and "nope" in r.output
    r = run(cli, ["overviews", str(tmp_path / "s.zarr"), "--memory", "1kB"])
    assert r.exit_code == 1 and "--memory" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "s.zarr" / "overviews").exists()
    r = run(cli, ["overviews", str(tmp_path / "s.zarr"), "elevation"])
    assert r.exit_code == 0, r.output


# -- Cloud-Optimized GeoTIFF ----------------------------------------------------------------------
def test_cog_export_layout_and_pixels(tmp_path):
    import rasterio

    z = _values(3)
    big = np.tile(z, (5, 8))[:700, :650]  # larger than one 512 block: overviews
    st = utm_store(tmp_path / "s.zarr", big, tile=64, shard=2)
    with st.write_result("fill") as w:
        w.create_array("depression", "uint32", 0)[...] = (np.arange(big.size).reshape(big.shape) // 1000) % 7
    run = CliRunner().invoke
    for name in ("elevation", "fill/depression"):
        out = tmp_path / f"{name.replace('/', '_')}.tif"
        r = run(cli, ["export", str(tmp_path / "s.zarr"), name, "-o", str(out), "--cog"])
        assert r.exit_code == 0, r.output
        assert check_cog_layout(out) >= 1
        want = TerrainStore.open(tmp_path / "s.zarr", mode="r").group[name][...]
        with rasterio.open(out) as ds:
            assert ds.tags(ns="IMAGE_STRUCTURE")["LAYOUT"] == "COG" and ds.overviews(1)
            assert ds.crs.to_epsg() == 32633 and tuple(ds.transform)[:6] == (30.0, 0.0, 500000.0, 0.0, -30.0, 4100000.0)
            got = ds.read(1)
            if name == "elevation":
                assert np.isnan(ds.nodata)
                np.testing.assert_array_equal(got, want)  # NaN where the store's nodata is
            else:
                assert ds.nodata == 2**32 - 1
                np.testing.assert_array_equal(got[~np.isnan(big)], want[~np.isnan(big)])
                assert (got[np.isnan(big)] == ds.nodata).all()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch left
    r = run(cli, ["export", str(tmp_path / "s.zarr"), "-o", str(tmp_path / "x.png"), "--cog"])
    assert r.exit_code == 1 and "terrain: error: --cog writes a GeoTIFF" in r.output


# -- terrain view: the server over plain HTTP ------------------------------------------------------------
import http.client  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402


def view_store(path):
    """A 96 x 128 UTM store whose result ``sssp/t/distance`` is 0 on the left half and 100 on the right
    (the ends of its colour ramp), with a nodata block; overviews made."""
    z = (np.add.outer(np.arange(96), np.arange(128)) * 0.5 + 200).astype(np.float32)
    z[10:30, 20:50] = np.nan
    st = utm_store(path, z, tile=16, shard=2)
    d = np.where(np.arange(128)[None, :] < 64, 0.0, 100.0) * np.ones((96, 1))
    d[np.isnan(z)] = np.nan
    with st.write_result("sssp/t", attrs={"weight": "absdiff"}) as w:
        w.create_array("distance", "float64", float("nan"))[...] = d
    write_overviews(path)
    return z, d


@pytest.fixture
def served(tmp_path):
    pytest.importorskip("pyproj")
    from terrain_io.view import make_server

    z, d = view_store(tmp_path / "v.zarr")
    server = make_server(tmp_path / "v.zarr", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], z, d, server
    server.shutdown()
    server.server_close()


def get(port, path, method="GET"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, r.getheader("Content-Type"), body


def raw(port, line: bytes):
    """The status line and body of a request sent as it is (no client normalises its path)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(line + b"\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def decode_png(body):
    """(h, w, 4) uint8 through GDAL's PNG reader (not ours)."""
    import warnings

    from rasterio.errors import NotGeoreferencedWarning
    from rasterio.io import MemoryFile

    with warnings.catch_warnings(), MemoryFile(body) as f:
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with f.open() as ds:
            return ds.read().transpose(1, 2, 0)


def test_view_tiles_match_the_store(served):
    from pyproj import Transformer

    port, z, d, server = served
    source = server.viewer.source
    zoom = source.native_zoom()  # a pixel about a cell
    to_utm = Transformer.from_crs("EPSG:3857", "EPSG:32633", always_xy=True).transform
    half = 20037508.342789244
    w, s, e, n = source.bounds_lonlat()
    lon, lat = (w + e) / 2, (s + n) / 2
    mx, my = np.radians(lon) * 6378137.0, np.log(np.tan(np.pi / 4 + np.radians(lat) / 2)) * 6378137.0
    size = 2 * half / 2**zoom
    checked = {"low": 0, "high": 0, "clear": 0}
    for dx_t in (-1, 0, 1):
        for dy_t in (-1, 0, 1):
            tx, ty = int((mx + half) // size) + dx_t, int((half - my) // size) + dy_t
            status, kind, body = get(port, f"/tiles/sssp/t/distance/{zoom}/{tx}/{ty}.png")
            assert status == 200 and kind == "image/png"
            img = decode_png(body)
            status, _, body = get(port, f"/tiles/elevation/{zoom}/{tx}/{ty}.png")
            elev = decode_png(body)
            for py in range(2, 256, 9):
                for px in range(3, 256, 9):
                    x, y = to_utm(-half + (tx + (px + 0.5) / 256) * size, half - (ty + (py + 0.5) / 256) * size)
                    col, row = (x - 500000.0) / 30.0, (4100000.0 - y) / 30.0
                    if min(abs(col - round(col)), abs(row - round(row))) < 0.05:
                        continue  # on a cell edge: either cell
                    r, c = int(np.floor(row)), int(np.floor(col))
                    if not (0 <= r < 96 and 0 <= c < 128) or np.isnan(z[r, c]):
                        assert img[py, px, 3] == 0 and elev[py, px, 3] == 0, (r, c)
                        checked["clear"] += 1
                        continue
                    assert elev[py, px, 3] == 255
                    want = (0, 0, 4) if d[r, c] == 0 else (252, 253, 191)  # magma's two ends
                    assert tuple(img[py, px, :3]) == want and img[py, px, 3] == 255, (r, c, d[r, c])
                    checked["low" if d[r, c] == 0 else "high"] += 1
    assert min(checked.values()) > 20, checked  # both halves and nodata seen
    status, _, body = get(port, "/tiles/elevation/3/1/1.png")  # far from the DEM: clear
    assert status == 200 and decode_png(body)[..., 3].max() == 0


def test_view_bad_requests_are_4xx_with_one_line(served):
    port, *_ = served
    for path, want in (("/tiles/nope/1/0/0.png", 404), ("/tiles/elevation/1/2/0.png", 400),
                       ("/tiles/elevation/25/0/0.png", 400), ("/tiles/elevation/-1/0/0.png", 400),
                       ("/tiles/elevation/1/0/0.jpg", 400), ("/tiles/elevation/1/0.png", 400),
                       ("/tiles/elevation/99999999999/0/0.png", 400), ("/tiles/sssp/t/1/0/0.png", 404),
                       ("/legend/nope.png", 404), ("/api/value?lon=x&lat=1", 400), ("/api/value?lon=200&lat=1", 400),
                       ("/api/value", 400), ("/overlay/0.geojson", 404), ("/nothing", 404)):
        status, kind, body = get(port, path)
        assert status == want, (path, status, body)
        assert kind.startswith("text/plain") and body.count(b"\n") == 1 and b"Traceback" not in body, path
    assert get(port, "/tiles/elevation/1/0/0.png", "POST")[0] == 405
    for line in (b"GET /../../../../etc/passwd HTTP/1.0", b"GET /static/../../../etc/passwd HTTP/1.0",
                 b"GET /tiles/../../../../etc/passwd/1/0/0.png HTTP/1.0", b"GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.0",
                 b"GET /tiles/..%2f..%2fzarr.json/1/0/0.png HTTP/1.0", b"GET /tiles/elevation/../zarr.json HTTP/1.0",
                 b"GET //etc/passwd HTTP/1.0", b"GET /legend/../../zarr.json.png HTTP/1.0"):
        status, body = raw(port, line)
        assert status in (400, 404), (line, status)
        assert b"root:" not in body and b"zarr_format" not in body and b"Traceback" not in body
    status, body = raw(port, b"GET /x HTTP/9.9.9")
    assert status == 400 and body.count(b"\n") == 1
    status, body = raw(port, b"BREW /pot HTTP/1.0")
    assert status == 501 and body.count(b"\n") == 1
    status, kind, body = get(port, "/api/layers")
    assert status == 200 and [l["name"] for l in json.loads(body)["layers"]] == ["elevation", "sssp/t/distance"]


def test_view_serves_concurrent_clients_bounded(served):
    from terrain_io.view import MAX_CLIENTS

    port, _, _, server = served
    zoom = server.viewer.source.native_zoom()
    paths = [f"/tiles/{a}/{zoom - 2}/{x}/{y}.png" for a in ("elevation", "sssp/t/distance")
             for x in range(2**(zoom - 2) // 2 - 1, 2**(zoom - 2) // 2 + 2) for y in range(2**(zoom - 2) // 2 - 1,
                                                                                              2**(zoom - 2) // 2 + 2)]
    want = {p: get(port, p)[2] for p in paths}
    results, errors = [], []

    def client(k):
        try:
            for p in paths[k % len(paths):] + paths[: k % len(paths)]:
                results.append((p, *get(port, p)))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 12 * len(paths)
    assert all(status == 200 and body == want[p] for p, status, _, body in results)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CLIENTS)]  # silent clients
    try:
        import time

        time.sleep(0.3)
        status, body = raw(port, b"GET /api/layers HTTP/1.0")
        assert status == 503  # bounded: answered at once, not queued
    finally:
        for s in idle:
            s.close()
    import time

    for _ in range(50):  # the slots come back as the silent clients go
        status, _ = raw(port, b"GET /api/layers HTTP/1.0")
        if status == 200:
            break
        time.sleep(0.1)
    assert status == 200


def test_view_command_errors(tmp_path):
    view_store(tmp_path / "v.zarr")
    run = CliRunner().invoke
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = run(cli, ["view", str(tmp_path / "v.zarr"), "--port", str(port)])
    last = r.output.strip().splitlines()[-1]
    assert r.exit_code == 1 and last.startswith("terrain: error: cannot serve on 127.0.0.1:")
    r = run(cli, ["view", str(tmp_path / "nothing.zarr")])
    assert r.exit_code == 1 and "terrain: error:" in r.output and "Traceback" not in r.output


def test_view_ignores_overviews_older_than_their_array(tmp_path):
    pytest.importorskip("pyproj")
    from terrain_io.view.tiles import TileSource

    z, d = view_store(tmp_path / "v.zarr")
    assert all(layer.current and len(layer.levels) == 4 for layer in TileSource(tmp_path / "v.zarr").layers.values())
    st = TerrainStore.open(tmp_path / "v.zarr")
    with st.write_result("sssp/t", attrs={"weight": "absdiff"}) as w:  # the result computed again: other bytes
        w.create_array("distance", "float64", float("nan"))[...] = np.where(np.isnan(d), np.nan, 7.0)
    layers = TileSource(tmp_path / "v.zarr").layers
    assert layers["elevation"].current and not layers["sssp/t/distance"].current
    assert layers["sssp/t/distance"].levels == ["sssp/t/distance"]  # the array itself, not the stale levels


def test_view_geojson_overlays_in_lon_lat(tmp_path):
    pyproj = pytest.importorskip("pyproj")
    from terrain_io.view import make_server

    view_store(tmp_path / "v.zarr")
    utm = {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {"cost": 3.5},
           "geometry": {"type": "LineString", "coordinates": [[500015.0, 4099985.0], [501000.0, 4098000.0, 12.0]]}}]}
    named = dict(utm, crs={"type": "name", "properties": {"name": "urn:ogc:def:crs:EPSG::32633"}})
    lonlat = {"type": "Point", "coordinates": [15.0, 37.0]}
    paths = []
    for i, doc in enumerate((utm, named, lonlat)):
        paths.append(tmp_path / f"o{i}.geojson")
        paths[-1].write_text(json.dumps(doc))
    server = make_server(tmp_path / "v.zarr", port=0, geojson=paths)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        to = pyproj.Transformer.from_crs("EPSG:32633", "EPSG:4326", always_xy=True).transform
        want = [list(to(500015.0, 4099985.0)), [*to(501000.0, 4098000.0), 12.0]]
        for i in (0, 1):  # no crs member: the store's CRS (as terrain path writes); a named crs
            status, kind, body = get(port, f"/overlay/{i}.geojson")
            got = json.loads(body)
            assert status == 200 and kind == "application/geo+json" and "crs" not in got
            np.testing.assert_allclose(np.array(got["features"][0]["geometry"]["coordinates"][0]), want[0])
            np.testing.assert_allclose(np.array(got["features"][0]["geometry"]["coordinates"][1]), want[1])
            assert got["features"][0]["properties"] == {"cost": 3.5}
        assert json.loads(get(port, "/overlay/2.geojson")[2]) == lonlat  # lon/lat already
        assert json.loads(get(port, "/api/layers")[2])["overlays"] == 3
    finally:
        server.shutdown()
        server.server_close()
    r = CliRunner().invoke(cli, ["view", str(tmp_path / "v.zarr"), "--geojson", str(tmp_path / "none.geojson")])
    assert r.exit_code == 1 and "terrain: error:" in r.output and "none.geojson" in r.output
