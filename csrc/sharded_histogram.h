#pragma once
// Recording one histogram from many threads without sharing a cache line between
// writers: each thread records into its own shard with the single-writer record(), and
// readers merge the shards. bench/bench_histogram.py compares this with record_atomic()
// on one shared histogram; see bench/RESULTS.md for why the engine records this way.

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hdr_histogram.h"

namespace loadgen {

/// A histogram sharded per recording thread, merged on read.
/// Thread-safety: record() and local() from any thread; snapshot() from any thread while
/// others record; reset() needs recording to be stopped.
class ShardedHistogram {
 public:
  /// Same arguments and validation as HdrHistogram.
  ShardedHistogram(int64_t lowest_discernible_value, int64_t highest_trackable_value,
                   int significant_figures);
  ShardedHistogram(const ShardedHistogram&) = delete;
  ShardedHistogram& operator=(const ShardedHistogram&) = delete;

  /// The calling thread's shard, created on its first use (one mutex acquisition per
  /// thread and instance; afterwards a thread-local cache lookup).
  HdrHistogram& local();
  /// Records into the calling thread's shard. Wait-free after the thread's first call.
  bool record(int64_t value) noexcept { return local().record(value); }
  bool record_n(int64_t value, int64_t count) noexcept { return local().record_n(value, count); }
  /// All shards added together, as one histogram.
  HdrHistogram snapshot() const;
  /// The shards' total counts added (cheap: no merge, no allocation).
  int64_t total_count() const;
  /// Clears every shard.
  void reset();
  /// Number of threads that have recorded so far.
  size_t shard_count() const;

 private:
  struct Shard {
    std::thread::id owner;
    std::unique_ptr<HdrHistogram> histogram;
  };
  HdrHistogram& create_local();

  const uint64_t id_;  // never reused, so stale thread-local cache entries cannot match
  HdrHistogram prototype_;
  mutable std::mutex mutex_;
  std::vector<Shard> shards_;
};

}  // namespace loadgen
