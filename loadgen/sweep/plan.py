"""A sweep's plan: every point's options resolved and checked before anything runs, its
key (what makes a point the same point when a sweep is resumed), its folder, and the
order the runs take."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from loadgen.net.options import Redactor, options_redactor
from loadgen.options import SWEEP_TABLE, RunOptions, resolve
from loadgen.results.thresholds import parse_threshold
from loadgen.runner import plan
from loadgen.sut.spec import is_network_sut, load_sut
from loadgen.sweep.files import POINTS_DIR
from loadgen.sweep.grid import LABEL_PREFIX, SweepError, point_slug, value_env
from loadgen.sweep.settings import SweepSettings
from loadgen.workers import splitmix64

__all__ = ["KEY_EXCLUDED", "PlannedRun", "base_options", "describe", "key_options", "plan_runs", "point_key",
           "repeat_seed", "values_redactor"]

#: Options left out of a point's key and of the base compared on resume: where and how
#: the results are shown, not what runs (``storage_option``: how they reach the storage).
KEY_EXCLUDED = ("output", "no_html", "json", "quiet", "config", "start_at", "metrics_port", "metrics_addr",
                "metrics_linger_s", "record_requests", "storage_option")
#: Also left out of a point's key (but not of the base): the worker index, so that the
#: workers of a scaled-out sweep give a point the same key and ``loadgen merge`` can match
#: their points.
_POINT_KEY_EXCLUDED = ("worker_index",)


@dataclass(frozen=True)
class PlannedRun:
    """One run of a point: its index in the grid, its repeat, its values, its resolved
    options (and what was given, for the result), its key, folder and planned length."""

    index: int
    repeat: int
    values: Dict[str, Any]
    options: RunOptions
    given: Dict[str, Any]
    key: str
    dir: str
    planned_s: Optional[float]

    def describe(self) -> str:
        """The point's values as text, like ``concurrency=4 label.config=a`` (secrets
        redacted, as in every file the sweep writes)."""
        text = describe(self.values) + (f" repeat={self.repeat}" if self.repeat else "")
        return options_redactor(self.options).text(text)


class _Values:
    """A point's values read as run options (None where the point sets none)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Any:
        return self._values.get(name)


def values_redactor(values: Mapping[str, Any]) -> Redactor:
    """The redactor of a point's own values: the secrets of the headers, URLs and
    template it sets."""
    return options_redactor(_Values(values))


def describe(values: Mapping[str, Any]) -> str:
    """Values as ``name=value`` words (``(base options)`` for none); the secrets the
    values carry (credential headers, URL passwords and keys) are redacted."""
    text = " ".join(f"{n}={value_env(v)}" for n, v in values.items()) or "(base options)"
    return values_redactor(values).text(text)


def key_options(options: RunOptions) -> Dict[str, Any]:
    """The options that define a run: all but :data:`KEY_EXCLUDED`."""
    return {k: v for k, v in options.as_dict().items() if k not in KEY_EXCLUDED}


_MASK64 = (1 << 64) - 1
#: Set in the input of a repeat's seed, so that it never equals a worker's stream input
#: (``2 * index + stream``, :func:`loadgen.workers.worker_seed`).
_REPEAT_DOMAIN = 1 << 62


def repeat_seed(seed: int, repeat: int) -> int:
    """The base seed (``--seed``) of repeat ``repeat`` of a point whose seed is ``seed``:
    ``seed`` itself for repeat 0 (a sweep of one repeat runs what ``loadgen run`` would),
    else ``splitmix64(splitmix64(seed) ^ (2**62 + repeat))``: reproducible, and different
    for every repeat, so that repeats are independent samples. The schedule and sample
    seeds follow it unless ``--schedule-seed``/``--sample-seed`` pin them."""
    if repeat == 0:
        return seed
    return splitmix64(splitmix64(seed & _MASK64) ^ ((_REPEAT_DOMAIN + repeat) & _MASK64))


def point_key(options: RunOptions, repeat: int) -> str:
    """A stable hash of a point's options and repeat index (16 hex digits)."""
    opts = {k: v for k, v in key_options(options).items() if k not in _POINT_KEY_EXCLUDED}
    text = json.dumps({"options": opts, "repeat": repeat}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _point_flags(run_flags: Mapping[str, Any], base_labels: Sequence[str], values: Mapping[str, Any]) -> Dict[str, Any]:
    """The flags of a point: the run's flags with the swept values set, swept labels
    added after every other label (so they win over a base label of the same name)."""
    flags = dict(run_flags)
    labels = [f"{n[len(LABEL_PREFIX):]}={v}" for n, v in values.items() if n.startswith(LABEL_PREFIX)]
    if labels:
        flags["label"] = [*base_labels, *labels]
    flags.update((n, v) for n, v in values.items() if not n.startswith(LABEL_PREFIX))
    return flags


def base_options(run_flags: Mapping[str, Any], environ: Optional[Mapping[str, str]]) -> RunOptions:
    """The options every point starts from: defaults < config < environment < flags."""
    options, _ = resolve(dict(run_flags), environ, config_tables=(SWEEP_TABLE,))
    return options


def _check_point(run_flags: Mapping[str, Any], base: RunOptions, index: int, values: Dict[str, Any],
                 environ: Optional[Mapping[str, str]]) -> Tuple[RunOptions, Dict[str, Any], Dict[str, Any],
                                                                   Optional[float]]:
    """A point's options, what was given, its flags and its planned length, checked;
    SweepError naming the point otherwise."""
    flags = _point_flags(run_flags, base.label, values)
    try:
        options, given = resolve(flags, environ, config_tables=(SWEEP_TABLE,))
        for expr in [*options.fail_if, *options.require]:
            parse_threshold(expr)
        _, effective, _ = plan(options)
        if not is_network_sut(effective.sut) and not effective.sut.strip().startswith("python:"):
            load_sut(effective.sut)  # demo, null, sleep: cheap to make; a python: SUT is imported when it runs
    except ValueError as e:
        raise SweepError(f"point {index} ({describe(values)}): {e}") from None
    planned = effective.duration_s + effective.unmeasured_s if effective.duration_s else None
    if options.start_at is not None and planned is None:
        raise SweepError(f"point {index} ({describe(values)}): with --start-at every point needs a known length "
                         "(--duration-s), so that the workers start each point together")
    return options, given, flags, planned


def plan_runs(run_flags: Mapping[str, Any], points: Sequence[Dict[str, Any]], settings: SweepSettings,
              environ: Optional[Mapping[str, str]] = None) -> Tuple[RunOptions, List[PlannedRun],
                                                                    List[Dict[str, Any]]]:
    """The base options, the runs in the order they take, and each run's flags (in the
    same order, for the CLI's checks). Every point is resolved and checked here
    (options, thresholds, the scenario's settings), so a bad value at any point fails
    before the first runs.

    Raises:
        SweepError: a point's options are bad (the message names the point and option),
            or two points run the same options.
    """
    base = base_options(run_flags, environ)
    runs: List[PlannedRun] = []
    flag_sets: List[Dict[str, Any]] = []
    seen: Dict[str, int] = {}
    width = max(3, len(str(len(points) - 1)))
    for index, values in enumerate(points):
        options, given, flags, planned = _check_point(run_flags, base, index, values, environ)
        slug = point_slug(options_redactor(options).doc(values))  # no secret in a folder's name
        for repeat in range(settings.repeat):
            key = point_key(options, repeat)  # the point's options: a repeat's seed follows from them and the repeat
            run_options = dataclasses.replace(options, seed=repeat_seed(options.seed, repeat))
            if key in seen:
                raise SweepError(f"points {seen[key]} and {index} ({describe(values)}) run the same options")
            seen[key] = index
            folder = f"{POINTS_DIR}/{index:0{width}d}-{slug}" + (f"-r{repeat}" if repeat else "")
            runs.append(PlannedRun(index, repeat, dict(values), run_options, given, key, folder, planned))
            flag_sets.append(flags)
    order = sorted(range(len(runs)), key=lambda i: (runs[i].repeat, runs[i].index))
    if settings.order == "shuffled":
        seed = settings.order_seed if settings.order_seed is not None else base.seed
        random.Random(seed).shuffle(order)
    return base, [runs[i] for i in order], [flag_sets[i] for i in order]
