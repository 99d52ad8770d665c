"""Progress bars (tqdm) for the long phases: one look for every command.

Bars show only when asked for (``progress=True``, i.e. not ``terrain -q``) and stderr is a
terminal, and only for a phase still running after ``DELAY`` seconds, so quick steps of many
print nothing (a phase of ``FEW`` steps or less, whose next update may be seconds away, shows at
once); they are erased when done, so logs and pipes stay clean. A terminal that reports no
size (a pseudo-terminal nobody sized: ``pty.openpty``, some CI runners and editor shells) gets
80 x 24 -- tqdm would otherwise take 0 rows and hide every bar.
"""
from __future__ import annotations

import os
import sys

DELAY = 1.0  # seconds a phase runs before its bar appears
FEW = 4  # a phase of at most this many steps shows its bar at once (its next update may be seconds away)
DEFAULT_COLUMNS, DEFAULT_ROWS = 80, 24


def _sized(stream) -> bool:
    """Whether ``stream`` is a terminal that reports its size (a pty nobody sized says 0 x 0)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return size.columns > 0 and size.lines > 0


def progress_bar(enabled: bool, total: int, desc: str, unit: str = "tile"):
    """A tqdm bar (a do-nothing one when disabled); use as a context manager or call ``close()``."""
    from tqdm import tqdm

    scaled = unit in ("B", "cell")
    stream = sys.stderr
    on = enabled and hasattr(stream, "isatty") and stream.isatty()
    size = {} if _sized(stream) else {"ncols": int(os.environ.get("COLUMNS") or DEFAULT_COLUMNS),
                                      "nrows": int(os.environ.get("LINES") or DEFAULT_ROWS)}
    delay = 0.0 if total <= FEW else DELAY  # a step of a phase of few may itself take long: show it at once
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scaled, unit_divisor=1024 if unit == "B" else 1000,
                leave=False, file=stream, disable=not on, delay=delay, dynamic_ncols=not size, **size)
