"""What a SUT may add to the result document: histograms it recorded itself (each with
its unit), and a report of its side of the run.

The engine records latency, service time, issue delay, time to first token and time per
output token for every SUT. A SUT that measures more (the OpenAI client: each inter-token
gap, output tokens per second per request) implements :class:`ReportingSUT`; the result
document then holds each of its histograms under its name, and lists it with its unit in
the document's ``"histograms"`` index. A SUT may also have ``live_histograms()``, the same
shape but callable from any thread during the run: live metrics (``--metrics-port``) serve
its ``itl_ns`` as ``loadgen_run_itl_seconds``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Protocol, runtime_checkable

from loadgen.stats.histogram import Histogram

__all__ = ["NamedHistogram", "ReportingSUT"]


@dataclasses.dataclass(frozen=True)
class NamedHistogram:
    """A histogram a SUT recorded, with the unit of its values.

    Attributes:
        histogram: what was recorded.
        unit: the unit of the values the document shows ("ns", "tokens/s").
        scale: recorded values per unit: a histogram holds integers, so a fractional
            quantity is recorded scaled up (tokens/s as milli-tokens/s: scale 1000) and the
            document divides its figures by ``scale``. 1 for values recorded as they are.
        recorded_unit: the unit of the recorded values (and of the encoded ``hdr``) when
            ``scale`` is not 1, e.g. "milli-tokens/s".
    """

    histogram: Histogram
    unit: str
    scale: float = 1.0
    recorded_unit: str = ""

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0; got {self.scale}")
        if self.scale != 1 and not self.recorded_unit:
            raise ValueError("a scaled histogram needs its recorded_unit (like 'milli-tokens/s')")


@runtime_checkable
class ReportingSUT(Protocol):
    """A SUT that adds to the result document (the network SUTs do).

    Both methods are called once, after the run has ended, on the thread that builds the
    document.
    """

    def histograms(self) -> Dict[str, NamedHistogram]:
        """The SUT's own histograms, by document key. A key names the quantity and ends in
        its unit (``itl_ns``, ``output_tokens_per_s``); a key the document already has is
        left out, and so is an empty histogram."""
        ...

    def report(self) -> Dict[str, Any]:
        """What the SUT says about its side of the run (JSON values); the document's
        ``"network"`` section. Empty for none."""
        ...
