// terrain view: the hillshaded elevation under one result layer at a time, a legend, the values of a
// clicked cell, and the GeoJSON overlays. Everything comes from the server that sent this page.
"use strict";
(async function () {
  const info = await (await fetch("/api/layers")).json();
  document.getElementById("title").textContent = "terrain view: " + info.store;
  const tiles = (name) => [location.origin + "/tiles/" + name + "/{z}/{x}/{y}.png"];
  const [w, s, e, n] = info.bounds;
  const sources = {}, layers = [];
  for (const l of info.layers) {
    sources["src:" + l.name] = {type: "raster", tiles: tiles(l.name), tileSize: 256, bounds: info.bounds,
                                maxzoom: info.maxzoom, minzoom: 0};
    layers.push({id: l.name, type: "raster", source: "src:" + l.name,
                 layout: {visibility: l.name === "elevation" ? "visible" : "none"},
                 paint: {"raster-opacity": l.name === "elevation" ? 1 : 0.8, "raster-resampling": "nearest",
                         "raster-fade-duration": 0}});
  }
  const map = new maplibregl.Map({
    container: "map", style: {version: 8, sources: sources, layers: layers},
    bounds: [[w, s], [e, n]], fitBoundsOptions: {padding: 20}, maxZoom: info.maxzoom + 2,
    attributionControl: false, fadeDuration: 0,
  });
  window.terrainMap = map;  // for tests and the console
  map.addControl(new maplibregl.NavigationControl(), "top-right");
  map.addControl(new maplibregl.ScaleControl(), "bottom-left");

  const select = document.getElementById("layer"), opacity = document.getElementById("opacity");
  for (const l of info.layers) {
    const o = document.createElement("option");
    o.value = l.name;
    o.textContent = l.name + (l.overviews_current ? "" : " (no overviews)");
    select.appendChild(o);
  }
  let current = "elevation";
  function show(name) {
    if (current !== "elevation") map.setLayoutProperty(current, "visibility", "none");
    current = name;
    map.setLayoutProperty(name, "visibility", "visible");
    if (name !== "elevation") map.setPaintProperty(name, "raster-opacity", Number(opacity.value));
    document.getElementById("legend").innerHTML = "";
    for (const n of name === "elevation" ? ["elevation"] : ["elevation", name]) {
      const img = document.createElement("img");
      img.src = "/legend/" + n + ".png";
      img.alt = "legend of " + n;
      document.getElementById("legend").appendChild(img);
    }
  }
  select.addEventListener("change", () => show(select.value));
  opacity.addEventListener("input", () => {
    if (current !== "elevation") map.setPaintProperty(current, "raster-opacity", Number(opacity.value));
  });
  map.on("load", async () => {
    show(select.value);
    for (let i = 0; i < info.overlays; i++) {
      const id = "overlay" + i;
      map.addSource(id, {type: "geojson", data: "/overlay/" + i + ".geojson"});
      map.addLayer({id: id + ":fill", type: "fill", source: id, filter: ["==", ["geometry-type"], "Polygon"],
                    paint: {"fill-color": "#e6550d", "fill-opacity": 0.25}});
      map.addLayer({id: id + ":line", type: "line", source: id,
                    paint: {"line-color": "#e6550d", "line-width": 2.5}});
      map.addLayer({id: id + ":point", type: "circle", source: id, filter: ["==", ["geometry-type"], "Point"],
                    paint: {"circle-color": "#e6550d", "circle-radius": 5, "circle-stroke-color": "#fff",
                            "circle-stroke-width": 1.5}});
    }
  });

  map.on("click", async (ev) => {
    const r = await fetch(`/api/value?lon=${ev.lngLat.lng}&lat=${ev.lngLat.lat}`);
    const got = await r.json();
    const box = document.createElement("div");
    box.className = "terrain-values";
    if (!got.cell) {
      box.textContent = "outside the DEM";
    } else {
      const table = document.createElement("table");
      const rows = [["cell", got.cell.join(", ")], ["x, y", Number(got.x.toPrecision(10)) + ", " + Number(got.y.toPrecision(10))]];
      for (const [k, v] of Object.entries(got.values)) rows.push([k, v === null ? "nodata" : String(v)]);
      for (const [k, v] of rows) {
        const tr = table.insertRow();
        tr.insertCell().textContent = k;
        const td = tr.insertCell();
        td.textContent = v;
        td.dataset.name = k;
      }
      box.appendChild(table);
    }
    new maplibregl.Popup({maxWidth: "360px"}).setLngLat(ev.lngLat).setDOMContent(box).addTo(map);
  });
})();
