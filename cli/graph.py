"""``terrain graph ...``: general-graph algorithms on edge lists (terrain_io.graph)."""
from __future__ import annotations

import click

from .main import cli


@cli.group()
def graph():
    """General graphs: list ranking, components, BFS, APSP, MST on edge lists."""
