"""Sweeps: many runs over a grid or a list of points, resumable, with per-point hooks.

- :mod:`.grid`: ``--vary``, the ``[sweep]`` table and ``--points`` into points;
- :mod:`.settings`: the sweep's own settings (hooks, order, repeats);
- :mod:`.plan`: every point resolved and checked first, its key and folder, the order;
- :mod:`.state`: the folder's manifest and records: resume, refuse, mix or restart;
- :mod:`.hooks`: the before/after shell commands;
- :mod:`.run`: running the points;
- :mod:`.files`: sweep.json, sweep.jsonl, sweep.csv, and :func:`load_sweep`.
"""

from loadgen.sweep.files import is_sweep_folder, load_sweep
from loadgen.sweep.grid import SweepError

__all__ = ["SweepError", "is_sweep_folder", "load_sweep"]
