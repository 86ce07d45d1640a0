"""Merging the results of the workers of one scaled-out run into one result: what
``loadgen merge`` does.

Histograms are added exactly (every histogram's encoded ``hdr`` payload decoded and
added; percentiles are never averaged), counts and the exact over-bound counts summed,
and the time series aligned on the wall clock. The merged parts make a
:class:`~loadgen.engine.RunResult` again, and the metric, validity and early stopping are
those of the scenario's own code over the whole, with the options of the total load (the
workers' ``worker.total``): the merged document is a ``loadgen.result/1`` document like
any run's, with a ``"merge"`` section of the workers' own figures.

The time series: interval lengths are the workers' ``--interval-s``. In a merged
interval the counts (issued, completed, failed, timed_out, tokens, errors by kind) and
``outstanding`` are summed and the latency percentiles come from the added interval
histograms; the issue delay and TTFT percentiles, which carry no interval histogram,
are the largest of the workers' (an upper bound; exact for ``issue_delay_max_ns``).
Worker w's
interval at ``t_s`` starts on the wall clock at ``started_at_epoch_s(w) + t_s``; it goes
to the merged interval k whose start ``t0 + k * interval_s`` is nearest, where ``t0`` is
the earliest worker's start. Workers that started within half an interval of each other
(``--start-at``) put their interval k in merged interval k.

Beside the engine's figures: the ``network`` section's counts are summed and its other
values kept per worker (:func:`merge_network`); an OpenAI target's ``llm`` section keeps
the first worker's workload with the requests' counts summed (:func:`merge_llm`); the server's metrics are counted once per
server, the servers summed, the gauges pooled and kept per worker
(:func:`merge_server_metrics`); a sweep's points merged are written as a sweep folder
(:func:`sweep_records`, :func:`merged_manifest`).

The merge is invalid, saying why, when a worker of ``0..N-1`` is missing or given twice,
when a worker was interrupted, is partial or started late, when the workers' settings
do not match (scenario, SUT, latency bounds, histogram layout, worker count, total
load), and by the scenario's rules on the merged figures. The merged result's diagnosis
(:mod:`loadgen.scenarios.diagnosis`) is made from the merged figures; each worker's own,
with its host figures, is in its entry of the ``"merge"`` section.

The package's modules: ``workers`` (the inputs and the reasons a merge is invalid before
any figure is added), ``figures`` (the engine's figures), ``sections`` (the sections
beside them), ``sweeps`` (sweep folders) and ``run`` (the merges themselves).
"""

from loadgen.results.merge.run import merge_results, merge_sweeps
from loadgen.results.merge.sections import merge_gpu, merge_llm, merge_network, merge_server_metrics
from loadgen.results.merge.sweeps import merged_manifest, sweep_key, sweep_records
from loadgen.results.merge.workers import Input

__all__ = ["Input", "merge_gpu", "merge_llm", "merge_network", "merge_results", "merge_server_metrics", "merge_sweeps",
           "merged_manifest", "sweep_key", "sweep_records"]
