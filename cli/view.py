"""Looking at results: ``terrain overviews`` (pyramids in the store) and ``terrain view`` (a local web map)."""
from __future__ import annotations

from pathlib import Path

import click

from .common import memory_option, scheduler_option, write_overviews_of
from .main import cli


@cli.command(short_help="Write overviews (a pyramid of coarser levels) of a store's arrays.")
@click.argument("store", type=click.Path(path_type=Path))
@click.argument("arrays", nargs=-1)
@memory_option
@scheduler_option
def overviews(store, arrays, memory, scheduler):
    """Write the overviews of ARRAYS (default: elevation and every result) into STORE/overviews/ARRAY:
    levels 1, 2, ... each half the last (mean of continuous values, the most frequent of codes and
    ids, the maximum of flow accumulation and stream orders) down to one tile, laid out after the
    Zarr multiscales convention (GeoZarr), so xarray opens each level with its coordinates.
    """
    write_overviews_of(store, arrays, memory, scheduler)


@cli.command(short_help="Look at a store in the browser: a local web map of its arrays.")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port on 127.0.0.1 (0: any free one).")
@click.option("--open", "open_browser", is_flag=True, help="Open the map in the default browser.")
@click.option("--geojson", "geojson", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="A GeoJSON file to draw on top (a traced path, outlets; repeatable): lon/lat, the CRS its 'crs' "
                   "member names, or the store's CRS.")
def view(store, port, open_browser, geojson):
    """Serve a web map of STORE on http://127.0.0.1:PORT/ until Ctrl-C: the hillshaded elevation, each
    result with its colour ramp and legend (a layer at a time, opacity), the values of a clicked cell.

    Tiles are rendered on demand from the overviews (make them first with 'terrain overviews STORE';
    without, tiles read the full-resolution arrays, and zoomed-out tiles of a large one stay empty).
    """
    import webbrowser

    from terrain_io.view import make_server

    server = make_server(store, port=port, geojson=geojson)
    host, port = server.server_address[:2]
    url = f"http://{host}:{port}/"
    for name, layer in server.viewer.source.layers.items():
        if not layer.current:
            click.echo(f"terrain: note: {name}: no current overviews (terrain overviews {store} makes them)", err=True)
    click.echo(f"terrain view: {url} (Ctrl-C to stop)", err=True)
    if open_browser:
        webbrowser.open(url)
    with server:
        server.serve_forever()
