"""Systems under test: the forms a SUT may take (:mod:`loadgen.sut.forms`) and loading
one from a ``--sut`` spec (:mod:`loadgen.sut.spec`)."""

from loadgen.sut.forms import Batch, DemoSUT, FixedDelaySUT, LoopSUT, NullSUT, SUTForm, classify_sut
from loadgen.sut.spec import SutSpecError, load_sut

__all__ = ["Batch", "DemoSUT", "FixedDelaySUT", "LoopSUT", "NullSUT", "SUTForm", "SutSpecError",
           "classify_sut", "load_sut"]
