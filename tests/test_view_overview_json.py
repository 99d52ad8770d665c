"""The levels' zarr.json written by ``store.write_node`` (issue 32): the text of the standard library's
``json.dumps(value, allow_nan=True, indent=2)``, which is how zarr formats its nodes, for every kind of
value a node holds -- so the faster indenting encoder changes no byte of any pyramid."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from terrain_io.store import _indented_json, tiled_array_metadata, write_node

VALUES = [
    {},
    [],
    {"a": {}, "b": [], "c": [[]], "d": [{}]},
    {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "zero": -0.0, "tiny": 5e-324, "big": 1.7976931348623157e308},
    {"floats": [0.1, 1 / 3, 1e16, 1e-7, 123456789.125, np.float64(2.5)], "ints": [0, -1, 2**63, -(2**70)]},
    {"flags": [True, False, None], "text": ["", "é", "\u2603", "\U0001f600", "a\"b\\c\n\t\x00", "/"]},
    {"crs_wkt": 'PROJCS["WGS 84 / UTM zone 33N",GEOGCS["WGS 84"]]', "GeoTransform": "500000.0 30.0 0.0"},
    [1, [2, [3, [4, {"deep": [None]}]]]],
    "a bare string",
    3.5,
    None,
    {1: "int key", 2.5: "float key", True: "bool key", None: "none key"},
    ("a", "tuple"),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_indented_json_is_the_standard_librarys(value):
    assert _indented_json(value) == json.dumps(value, allow_nan=True, indent=2)


@pytest.mark.parametrize("value", [{"a": b"xy"}, np.arange(2.0), {1, 2}, {(1, 2): 3}], ids=["bytes", "ndarray", "set", "tuple-key"])
def test_what_json_refuses_is_refused(value):
    with pytest.raises(TypeError):
        json.dumps(value)
    with pytest.raises(TypeError):
        _indented_json(value)


@pytest.mark.parametrize("dtype,fill", [("float32", math.nan), ("float64", -math.inf), ("uint8", 255), ("int64", -9)])
def test_level_node_file_is_the_standard_librarys_text(tmp_path, dtype, fill):
    meta = tiled_array_metadata((4097, 3), np.dtype(dtype), 256, 8, fill, {"level": 1, "units": "m", "long_name": "é"})
    write_node(tmp_path / "a", meta)
    assert (tmp_path / "a" / "zarr.json").read_text() == json.dumps(meta, allow_nan=True, indent=2)
