"""terrain view in a real browser: Playwright driving Chromium (Debian's ``chromium``, or Playwright's own).

Marker ``browser`` (left out of the default run: ~10-20 s of a software-rendered WebGL): ``pytest -m
browser``; CI runs them in their own job, ``.ci/browser``, which installs Chromium where missing.
Skipped, saying why, where Playwright or a Chromium is missing.
"""
from __future__ import annotations

import os
import shutil
import threading
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from references import utm_store
from terrain_io.overviews import write_overviews

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[1]


def _chromium():
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the browser extra)")
    for path in (os.environ.get("TERRAIN_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if path:
            return playwright, path
    return playwright, None  # Playwright's own download, if any (p.chromium.launch finds it)


@pytest.fixture
def browser_page(tmp_path):
    playwright, exe = _chromium()
    pytest.importorskip("pyproj")
    from terrain_io.view import make_server

    rng = np.random.default_rng(5)
    z = (np.add.outer(np.arange(200), np.arange(240)) * 0.8 + rng.random((200, 240)) * 5 + 300).astype(np.float32)
    z[40:70, 60:100] = np.nan
    st = utm_store(tmp_path / "b.zarr", z, tile=32, shard=2)
    depth = np.where(np.arange(240)[None, :] < 120, 0.0, np.linspace(0, 12, 240)[None, :]) * np.ones((200, 1))
    depth[np.isnan(z)] = np.nan
    with st.write_result("fill") as w:
        w.create_array("depth", "float32", float("nan"))[...] = depth.astype(np.float32)
    write_overviews(tmp_path / "b.zarr")
    path = tmp_path / "path.geojson"  # a traced path in the store's CRS, as terrain path writes one
    path.write_text('{"type": "LineString", "coordinates": [[501000, 4097000], [506000, 4095000]]}')
    server = make_server(tmp_path / "b.zarr", port=0, geojson=[path])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with playwright.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--use-angle=swiftshader",
                                                                    "--enable-unsafe-swiftshader"])
        except Exception as exc:  # noqa: BLE001 -- no browser to run here
            pytest.skip(f"no Chromium runs here: {str(exc).splitlines()[0]}")
        page = browser.new_page(viewport={"width": 800, "height": 600})
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        yield page, server, z, depth, requests, errors
        browser.close()
    server.shutdown()
    server.server_close()


def _idle(page):
    page.wait_for_function("window.terrainMap && window.terrainMap.loaded() && window.terrainMap.areTilesLoaded()",
                           timeout=60_000)


def _cell_at(page, px, py):
    """The store cell under a page pixel, through the map's own unprojection and pyproj."""
    from pyproj import Transformer

    lng, lat = page.evaluate(f"(() => {{ const p = window.terrainMap.unproject([{px}, {py}]); "
                             "return [p.lng, p.lat]; })()")
    x, y = Transformer.from_crs("EPSG:4326", "EPSG:32633", always_xy=True).transform(lng, lat)
    return (4100000.0 - y) / 30.0, (x - 500000.0) / 30.0


def _near_edge(v) -> bool:
    return abs(v % 1 - 0.5) > 0.3


def test_view_in_the_browser(browser_page, tmp_path):
    page, server, z, depth, requests, errors = browser_page
    port = server.server_address[1]
    page.goto(f"http://127.0.0.1:{port}/")
    _idle(page)
    shot = page.screenshot()
    from rasterio.io import MemoryFile

    def pixels(png):
        import warnings

        from rasterio.errors import NotGeoreferencedWarning

        with warnings.catch_warnings(), MemoryFile(png) as f:
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            with f.open() as ds:
                return ds.read().transpose(1, 2, 0)[..., :3].astype(int)

    img = pixels(shot)
    map_part = img[250:, 400:]  # away from the panel
    assert map_part.std() > 10  # tiles drawn: not one flat colour
    # known pixels: over a nodata cell the page's background shows, over a valid one a tint
    background = np.array([0xE8, 0xE8, 0xE8])
    seen = {"nodata": 0, "valid": 0}
    for py in range(260, 590, 23):
        for px in range(380, 790, 23):
            row, col = _cell_at(page, px + 0.5, py + 0.5)
            if _near_edge(row) or _near_edge(col):
                continue  # near a cell edge (a cell is only ~2.5 pixels here)
            r, c = int(np.floor(row)), int(np.floor(col))
            outside = not (0 <= r < 200 and 0 <= c < 240) or np.isnan(z[r, c])
            if outside:
                assert np.abs(img[py, px] - background).max() <= 2, (r, c, img[py, px])
                seen["nodata"] += 1
            else:
                assert np.abs(img[py, px] - background).max() > 2, (r, c, img[py, px])
                seen["valid"] += 1
    assert seen["valid"] > 20 and seen["nodata"] > 0, seen
    # a layer switch: the lakes of fill/depth in blues over the right half
    page.select_option("#layer", "fill/depth")
    _idle(page)
    assert page.evaluate("window.terrainMap.getLayoutProperty('fill/depth', 'visibility')") == "visible"
    after = pixels(page.screenshot())
    wet = dry = 0
    for py in range(260, 590, 17):
        for px in range(20, 790, 17):
            row, col = _cell_at(page, px + 0.5, py + 0.5)
            r, c = int(np.floor(row)), int(np.floor(col))
            if not (0 <= r < 200 and 0 <= c < 240) or _near_edge(row) or _near_edge(col) or np.isnan(z[r, c]):
                continue
            before, now = img[py, px], after[py, px]
            if depth[r, c] > 0:  # a lake: drawn in blues over the relief
                assert (now[2] - now[0]) > (before[2] - before[0]) + 20, (r, c, before, now)
                wet += 1
            else:  # dry: clear, the relief as it was
                assert np.abs(now - before).max() <= 2, (r, c, before, now)
                dry += 1
    assert wet > 10 and dry > 10, (wet, dry)
    page.screenshot(path=str(tmp_path / "view.png"))
    # a click on a cell: the popup's values are the store's
    for px, py in ((600, 420), (700, 300)):
        row, col = _cell_at(page, px, py)
        r, c = int(np.floor(row)), int(np.floor(col))
        if not (0 <= r < 200 and 0 <= c < 240) or np.isnan(z[r, c]):
            continue
        page.mouse.click(px, py)
        page.wait_for_selector(".terrain-values td[data-name='elevation']", timeout=20_000)
        text = page.inner_text(".terrain-values td[data-name='elevation']")
        cell = page.inner_text(".terrain-values td[data-name='cell']")
        assert cell == f"{r}, {c}" and np.float32(text) == z[r, c]  # the stored float32, read back exactly
        assert np.float32(page.inner_text(".terrain-values td[data-name='fill/depth']")) == np.float32(depth[r, c])
        break
    else:
        pytest.fail("no valid cell under the clicks")
    assert page.evaluate("window.terrainMap.getLayer('overlay0:line') !== undefined")  # the GeoJSON drawn
    assert any(u.endswith("/overlay/0.geojson") for u in requests)
    assert not errors, errors
    off = [u for u in requests if urllib.parse.urlsplit(u).hostname not in ("127.0.0.1", None)
           and not u.startswith(("data:", "blob:"))]
    assert not off, off  # the page asked nothing of another machine
    assert any("/tiles/fill/depth/" in u for u in requests)
    if os.environ.get("TERRAIN_SCREENSHOT"):  # the README's picture: TERRAIN_SCREENSHOT=docs/view.png
        shutil.copy(tmp_path / "view.png", os.environ["TERRAIN_SCREENSHOT"])
