"""Statistics of a run: the HDR histogram wrapper, the HdrHistogram log format, and
MLPerf's early-stopping rule (the one implementation both scenario paths use)."""
