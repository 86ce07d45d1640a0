#pragma once
// Timed loops that stay entirely in C++, so that bench/ can report the cost of a
// record without any Python in the measurement.

#include <cstddef>
#include <cstdint>

namespace loadgen {

/// How the threads of a recording microbenchmark share their histogram(s).
enum class RecordMode {
  kSingleWriter,  ///< one HdrHistogram per thread, record() (the per-thread scheme)
  kAtomicShared,  ///< one HdrHistogram shared by all threads, record_atomic()
  kSharded,       ///< one ShardedHistogram shared by all threads, record()
};

/// Each of `threads` threads records values[0..n) once, in order, into histograms of
/// range [1, 3.6e12] at 3 significant figures, as `mode` says. Returns the wall time of
/// the recording phase in nanoseconds per record per thread (so 1 thread and 2 threads
/// compare directly when the scheme scales). threads: 1..64.
double time_record_ns(const int64_t* values, size_t n, int threads, RecordMode mode);

/// Appends `n` (>= 1) per-request records on the calling thread to a RequestLog writing
/// JSON lines to `path`, as the engine does when it resolves queries. Writes the
/// nanoseconds per append (the hot path's cost) to `append_ns`, and the wall time from
/// the first append until the file is written and closed to `total_ns`. With
/// `events_per_record` > 0 each record carries a stream of that many token events (10 ms
/// apart, one token each), as a streamed LLM request's does.
void time_request_log(size_t n, const char* path, double* append_ns, double* total_ns,
                      size_t events_per_record = 0);

/// Runs `queries` (>= 1) closed-loop queries of `samples_per_query` (>= 1) samples each
/// (SingleStream for one sample, MultiStream for more) through the MLPerf issue loop with
/// an SUT that, inside each issue call, stamps the query's first token and completes it:
/// the loop's slot claim, publish, first-token stamp and completion with no Python in
/// the measurement. Returns the wall time per query in nanoseconds; throws
/// std::runtime_error when a sample went missing.
double time_mlperf_loop(int64_t queries, int64_t samples_per_query);

}  // namespace loadgen
