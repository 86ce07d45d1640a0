"""Systems under test: the forms a SUT may take (:mod:`loadgen.sut.forms`), loading one
from a ``--sut`` spec (:mod:`loadgen.sut.spec`), and what a SUT may add to the result
document (:mod:`loadgen.sut.report`)."""

from loadgen.sut.forms import Batch, CallbackSUT, DemoSUT, FixedDelaySUT, LoopSUT, NullSUT, SUTForm, classify_sut
from loadgen.sut.report import NamedHistogram, ReportingSUT
from loadgen.sut.spec import SutSpecError, is_network_sut, load_sut

__all__ = ["Batch", "CallbackSUT", "DemoSUT", "FixedDelaySUT", "LoopSUT", "NamedHistogram", "NullSUT",
           "ReportingSUT", "SUTForm", "SutSpecError", "classify_sut", "is_network_sut", "load_sut"]
