"""``terrain view``: a local web map of a store, served from this machine.

A stdlib ``ThreadingHTTPServer`` bound to 127.0.0.1 serves:

- ``/`` -- the page (``static/index.html``, ``static/view.js``) with MapLibre GL JS 4.7.1 shipped in
  ``static/`` (BSD-3-Clause, ``static/maplibre-gl-LICENSE.txt``): the page asks nothing of any other
  machine (no basemap, no fonts, no sprites);
- ``/tiles/{ARRAY}/{z}/{x}/{y}.png`` -- Web Mercator XYZ tiles of ARRAY as the store names it
  (``elevation``, ``fill/depth``), rendered on demand from its overviews (:mod:`.tiles`);
- ``/legend/{ARRAY}.png`` -- its legend band (the one under ``terrain export -o x.png``);
- ``/api/layers`` -- the layers, the DEM's bounds and the zoom range (JSON);
- ``/api/value?lon=&lat=`` -- the cell under a point and every layer's value there (JSON);
- ``/overlay/{i}.geojson`` -- the GeoJSON files given with ``--geojson``, in lon/lat.

Robustness: nothing of a URL reaches the disk -- static files are read into memory at start and
looked up by name, arrays by the layer table; a request the server cannot answer gets a 4xx with a
one-line text/plain reason (a malformed tile, an unknown array, a coordinate outside the tiling),
an error inside a 500 with one line (never a traceback); at most ``MAX_CLIENTS`` connections are
served at once (a further one is answered 503 at once) and at most ``MAX_RENDERS`` tiles rendered
at once.
"""
from __future__ import annotations

import json
import math
import re
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path

from ..errors import InputError, TerrainError
from .tiles import MAX_ZOOM, TileSource, png_bytes

MAX_CLIENTS = 32
MAX_RENDERS = 4
STATIC = {  # URL name -> (package file, content type)
    "index.html": ("index.html", "text/html; charset=utf-8"),
    "view.js": ("view.js", "text/javascript; charset=utf-8"),
    "maplibre-gl.js": ("maplibre-gl.js", "text/javascript; charset=utf-8"),
    "maplibre-gl.css": ("maplibre-gl.css", "text/css; charset=utf-8"),
}
_TILE = re.compile(r"^/tiles/(?P<array>[A-Za-z0-9_./-]+)/(?P<z>\d{1,2})/(?P<x>\d{1,8})/(?P<y>\d{1,8})\.png$")
_LEGEND = re.compile(r"^/legend/(?P<array>[A-Za-z0-9_./-]+)\.png$")
_OVERLAY = re.compile(r"^/overlay/(?P<i>\d{1,3})\.geojson$")


class Viewer:
    """What the server answers with: the store's tiles, the static files, the overlays."""

    def __init__(self, store_path, geojson=()):
        self.source = TileSource(store_path)
        folder = resources.files(__package__) / "static"
        self.static = {name: (folder.joinpath(file).read_bytes(), kind) for name, (file, kind) in STATIC.items()}
        self.overlays = [_overlay(path, self.source) for path in geojson]
        self.renders = threading.BoundedSemaphore(MAX_RENDERS)
        self._legends: dict[str, bytes] = {}

    def layers(self) -> dict:
        return {"layers": [layer.meta for layer in self.source.layers.values()],
                "bounds": self.source.bounds_lonlat(), "maxzoom": self.source.native_zoom(),
                "overlays": len(self.overlays), "store": self.source.store.path.name}

    def legend(self, name: str) -> bytes:
        if name not in self._legends:
            import numpy as np

            band = self.source.layers[name].legend(320)
            rgba = np.concatenate([band, np.full(band.shape[:2] + (1,), 255.0)], axis=-1)
            self._legends[name] = png_bytes(rgba.round().astype(np.uint8))
        return self._legends[name]


def _overlay(path, source: TileSource) -> bytes:
    """A GeoJSON file as lon/lat GeoJSON: coordinates in the CRS its ``crs`` member names, else lon/lat
    when they all lie within -180..180 / -90..90, else in the store's CRS (``terrain path -o``)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read it as GeoJSON ({exc})") from None
    points = []

    def walk(c, fn):
        if isinstance(c, list) and c and isinstance(c[0], (int, float)):
            return fn(c)
        return [walk(v, fn) for v in c] if isinstance(c, list) else c

    def geometries(node):
        if isinstance(node, dict):
            if "coordinates" in node:
                yield node
            for key in ("features", "geometries"):
                for child in node.get(key) or []:
                    yield from geometries(child)
            if isinstance(node.get("geometry"), dict):
                yield from geometries(node["geometry"])

    geoms = list(geometries(doc))
    for g in geoms:
        walk(g["coordinates"], lambda c: points.append(c[:2]))
    crs = ((doc.get("crs") or {}).get("properties") or {}).get("name")
    lonlat = not crs and all(-180 <= x <= 180 and -90 <= y <= 90 for x, y in points)
    if crs and "CRS84" not in crs and not crs.endswith(":4326"):
        from pyproj import Transformer

        to = Transformer.from_crs(crs, "EPSG:4326", always_xy=True).transform
    elif lonlat or crs:
        to = None
    else:
        to = source.lonlat
    if to is not None:
        for g in geoms:
            g["coordinates"] = walk(g["coordinates"], lambda c: [*map(float, to(c[0], c[1])), *c[2:]])
    doc.pop("crs", None)
    return json.dumps(doc).encode()


class _Handler(BaseHTTPRequestHandler):
    server_version = "terrain-view"
    timeout = 10  # seconds a connection may idle: a silent client does not hold a slot for ever
    viewer: Viewer

    def log_message(self, format, *args):  # quiet: a map asks for hundreds of tiles
        pass

    def _send(self, status: int, body: bytes, kind: str, cache: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _fail(self, status: int, message: str) -> None:
        self._send(status, (message + "\n").encode(), "text/plain; charset=utf-8")

    def send_error(self, code, message=None, explain=None):
        """http.server's own refusals (a malformed request line, an unknown method) in one plain line too."""
        self.close_connection = True
        self.request_version = "HTTP/1.0"  # a request line it could not read: still a status line and headers
        self._fail(code, f"{code} {message or self.responses.get(code, ('',))[0]}")

    def do_HEAD(self):  # noqa: N802 -- http.server's name
        self.do_GET()

    def do_POST(self):  # noqa: N802
        self._fail(HTTPStatus.METHOD_NOT_ALLOWED, "only GET")

    do_PUT = do_DELETE = do_PATCH = do_POST

    def do_GET(self):  # noqa: N802
        try:
            self._route()
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 -- one line, never a traceback page
            try:
                self._fail(HTTPStatus.INTERNAL_SERVER_ERROR, f"error: {type(exc).__name__}: {exc}".splitlines()[0])
            except OSError:
                pass

    def _route(self) -> None:
        v = self.viewer
        url = urllib.parse.urlsplit(self.path)
        path = url.path
        if path == "/":
            path = "/index.html"
        if (m := _TILE.match(path)) is not None:
            return self._tile(m)
        if path.startswith("/tiles/"):
            return self._fail(HTTPStatus.BAD_REQUEST, "a tile is /tiles/ARRAY/Z/X/Y.png with whole numbers")
        if path[1:] in v.static:
            body, kind = v.static[path[1:]]
            return self._send(HTTPStatus.OK, body, kind, cache=path.endswith("maplibre-gl.js"))
        if path == "/favicon.ico":
            return self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        if path == "/api/layers":
            return self._send(HTTPStatus.OK, json.dumps(v.layers()).encode(), "application/json")
        if path == "/api/value":
            query = urllib.parse.parse_qs(url.query)
            try:
                lon, lat = float(query["lon"][0]), float(query["lat"][0])
            except (KeyError, ValueError, IndexError):
                return self._fail(HTTPStatus.BAD_REQUEST, "/api/value needs lon=DEGREES&lat=DEGREES")
            if not (math.isfinite(lon) and math.isfinite(lat) and -180 <= lon <= 180 and -90 <= lat <= 90):
                return self._fail(HTTPStatus.BAD_REQUEST, "lon must lie in -180..180 and lat in -90..90")
            return self._send(HTTPStatus.OK, json.dumps(v.source.values_at(lon, lat)).encode(), "application/json")
        if (m := _LEGEND.match(path)) is not None:
            if m["array"] not in v.source.layers:
                return self._fail(HTTPStatus.NOT_FOUND, f"no array {m['array']!r} in this store")
            return self._send(HTTPStatus.OK, v.legend(m["array"]), "image/png", cache=True)
        if (m := _OVERLAY.match(path)) is not None:
            i = int(m["i"])
            if i >= len(v.overlays):
                return self._fail(HTTPStatus.NOT_FOUND, f"no overlay {i}")
            return self._send(HTTPStatus.OK, v.overlays[i], "application/geo+json")
        return self._fail(HTTPStatus.NOT_FOUND, "not found")

    def _tile(self, m) -> None:
        v = self.viewer
        name, z, x, y = m["array"], int(m["z"]), int(m["x"]), int(m["y"])
        if name not in v.source.layers:
            return self._fail(HTTPStatus.NOT_FOUND, f"no array {name!r} in this store")
        if z > MAX_ZOOM or x >= 2**z or y >= 2**z:
            return self._fail(HTTPStatus.BAD_REQUEST,
                              f"no tile {z}/{x}/{y}: x and y lie in 0..2^z-1, z in 0..{MAX_ZOOM}")
        with v.renders:
            body = v.source.tile(name, z, x, y)
        self._send(HTTPStatus.OK, body, "image/png", cache=True)


class Server(ThreadingHTTPServer):
    """A ThreadingHTTPServer that serves at most MAX_CLIENTS connections at once (503 beyond)."""

    daemon_threads = True
    allow_reuse_address = False  # a port in use is an error, not shared

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self.clients = threading.BoundedSemaphore(MAX_CLIENTS)

    def process_request(self, request, client_address):
        if not self.clients.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                                b"Content-Length: 13\r\nConnection: close\r\n\r\ntoo many now\n")
            finally:
                self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.clients.release()


def make_server(store_path, *, port: int = 8000, host: str = "127.0.0.1", geojson=()) -> Server:
    """The server of the store (bound, not yet serving: ``serve_forever()``); ``port`` 0: any free one."""
    viewer = Viewer(store_path, geojson)
    handler = type("Handler", (_Handler,), {"viewer": viewer})
    try:
        server = Server((host, port), handler)
    except OSError as exc:
        raise TerrainError(f"cannot serve on {host}:{port}: {exc.strerror or exc} (choose another --port)") from None
    server.viewer = viewer
    return server
