"""Progress bars (tqdm) for the long phases: one look for every command.

Bars show only when asked for (``progress=True``, i.e. not ``terrain -q``) and stderr is a
terminal; they are erased when done, so logs and pipes stay clean.
"""
from __future__ import annotations


def progress_bar(enabled: bool, total: int, desc: str, unit: str = "tile"):
    """A tqdm bar (a do-nothing one when disabled); use as a context manager or call ``close()``."""
    from tqdm import tqdm

    scaled = unit in ("B", "cell")
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scaled, unit_divisor=1024 if unit == "B" else 1000,
                leave=False, dynamic_ncols=True, disable=None if enabled else True)
