"""Depression filling (``terrain fill``): the tiled pipeline in :mod:`.pipeline`, numba kernels in
:mod:`._cpu`, the in-core CuPy route in :mod:`._gpu`; :mod:`._tiled` holds what fill and the
depression hierarchy share (outlets, boundary-graph geometry, halo reads). The names below are
imported on first use (:mod:`...lazy`)."""
from ...lazy import exports

exports(__name__, dict.fromkeys(("OUTPUTS", "TABLE_COLUMNS", "FillResult", "check_outputs", "fill", "fill_array",
                                 "read_fill", "write_table"), ".pipeline"))
