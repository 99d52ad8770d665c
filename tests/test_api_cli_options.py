"""The command line's shared options (cli/common.py, as rasterio's rio/options.py): one --memory, one
-o/--output (old --out kept hidden), one index-rebuild name, one directed default across ``terrain graph``,
--device offering only what a command has kernels for, and short help lines that are whole sentences."""
from __future__ import annotations

import click
import numpy as np
import pytest
import scipy.sparse as sp
from click.testing import CliRunner
from scipy.sparse.csgraph import shortest_path

from cli.common import MemorySize
from cli.main import _register, cli

_register()


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def commands(group=cli, path=()):
    """(path, command) for every command under ``group``."""
    for name, cmd in group.commands.items():
        yield path + (name,), cmd
        if hasattr(cmd, "commands"):
            yield from commands(cmd, path + (name,))


@pytest.mark.parametrize("group", [(), ("graph",)])
def test_short_help_is_not_cut(group):
    """Each command's line in ``terrain --help`` / ``terrain graph --help`` is whole (click cuts a long
    first sentence with '...', e.g. mid-citation)."""
    r = run(*group, "--help")
    assert r.exit_code == 0
    listing = r.output.split("Commands:")[1]
    assert listing.strip()
    assert "..." not in listing, listing


def test_one_memory_option():
    found = [(p, o) for p, c in commands() for o in c.params if "--memory" in getattr(o, "opts", ())]
    assert {p[0] for p, _ in found} >= {"sssp", "index", "fill", "mst", "depressions"}
    for path, opt in found:
        assert isinstance(opt.type, MemorySize) and opt.metavar == "SIZE", path
        assert opt.help == found[0][1].help, path


@pytest.mark.parametrize("command", ["sssp", "index", "fill", "mst", "depressions"])
def test_bad_memory_is_a_usage_error_before_any_work(tmp_path, command):
    """An unreadable size is refused by the option, before the store is even opened (it does not exist)."""
    args = [command, tmp_path / "missing.zarr", "--memory", "12X"]
    if command == "sssp":
        args += ["--source", "1,1"]
    r = run(*args)
    assert r.exit_code == 2
    assert r.output.startswith("terrain: error: Invalid value for '--memory': cannot read memory size '12X'")


def test_output_is_o_or_output_everywhere_and_out_is_hidden():
    for path, cmd in commands():
        outs = [o for o in cmd.params if {"-o", "--out", "--output"} & set(getattr(o, "opts", ()))]
        if not outs:
            continue
        (opt,) = outs
        assert opt.opts[:2] == ["-o", "--output"], path
        shown = opt.get_help_record(click.Context(cmd))[0]
        assert "--output" in shown and "--out," not in shown and not shown.endswith("--out"), path


def test_a_missing_output_names_only_the_shown_spellings(tmp_path):
    r = run("export", tmp_path / "x.zarr")
    assert r.exit_code == 2 and "Missing option '-o' / '--output'." in r.output, r.output


def test_out_alias_still_works(tmp_path):
    (tmp_path / "g.csv").write_text("0,1\n1,2\n3,4\n")
    for spelling in ("-o", "--output", "--out"):
        out = tmp_path / f"labels{spelling}.csv"
        r = run("graph", "cc", tmp_path / "g.csv", spelling, out)
        assert r.exit_code == 0, r.output
        labels = np.loadtxt(out, delimiter=",", skiprows=1, dtype=np.int64)[:, 1]
        np.testing.assert_array_equal(labels, [0, 0, 0, 3, 3])


def test_one_name_for_rebuilding_the_index():
    for name in ("sssp", "index"):
        (opt,) = [o for o in cli.commands[name].params if o.name == "rebuild_index"]
        assert "--rebuild-index" in opt.opts
        assert "--rebuild-index" in opt.get_help_record(click.Context(cli.commands[name]))[0]
    index = cli.commands["index"]
    assert "--rebuild" in [o for p in index.params for o in p.opts]  # the old spelling parses
    assert "--rebuild " not in run("index", "--help").output


def test_crs_coords_is_not_offered():
    assert "--crs-coords" not in run("sssp", "--help").output


def test_device_lists_only_what_the_command_supports():
    out = run("depressions", "--help").output
    assert "[auto|cpu]" in out and "gpu" not in out.split("--device")[1].split("\n")[0]
    r = run("depressions", "x.zarr", "--device", "gpu")
    assert r.exit_code == 2 and "'gpu' is not one of 'auto', 'cpu'" in r.output
    assert "[auto|cpu|gpu]" in run("fill", "--help").output


@pytest.mark.slow  # long: the default run keeps CI under its 15 minutes (the slow run covers it)
def test_graph_commands_share_the_directed_default(tmp_path):
    """bfs and apsp read an edge list the same way without a flag: directed, as scipy.sparse.csgraph."""
    rng = np.random.default_rng(5)
    n = 25
    u, v = rng.integers(0, n, (2, 50))
    keep = u != v
    u, v = u[keep], v[keep]
    (tmp_path / "g.csv").write_text("".join(f"{a},{b},1\n" for a, b in zip(u, v)))
    mat = sp.csr_matrix((np.ones(len(u)), (u, v)), shape=(n, n))
    for directed in (True, False):
        flag = [] if directed else ["--undirected"]
        ref = shortest_path(mat, unweighted=True, directed=directed)
        r = run("graph", "bfs", tmp_path / "g.csv", "--from", 0, "--vertices", n, "-o", tmp_path / "b.csv",
                "--overwrite", "--device", "cpu", *flag)
        assert r.exit_code == 0, r.output
        depth = np.loadtxt(tmp_path / "b.csv", delimiter=",", skiprows=1, dtype=np.int64)[:, 1]
        np.testing.assert_array_equal(np.where(depth < 0, np.inf, depth), ref[0])
        r = run("graph", "apsp", tmp_path / "g.csv", "-o", tmp_path / "D.npy", "--overwrite", "--device", "cpu",
                *flag)
        assert r.exit_code == 0, r.output
        D = np.load(tmp_path / "D.npy")
        m = D.shape[0]
        np.testing.assert_array_equal(D, ref[:m, :m])


def test_info_names_the_crs_through_units_crs_label(tmp_path):
    """One home for a CRS's short name (terrain_io.units.crs_label): info's line, with the projection."""
    from references import utm_store

    st = utm_store(tmp_path / "u.zarr", np.arange(16, dtype=np.float32).reshape(4, 4))
    r = run("info", st.path)
    assert r.exit_code == 0, r.output
    assert "crs:        EPSG:32633 (utm)\n" in r.output  # EPSG 32633: WGS 84 / UTM zone 33N
