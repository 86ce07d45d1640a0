#include "sharded_histogram.h"

#include <atomic>

namespace loadgen {
namespace {

std::atomic<uint64_t> next_instance_id{1};

// A small direct-mapped per-thread cache from instance id to that thread's shard. An
// engine records into a handful of histograms per thread, so a few slots suffice; a
// miss only costs a mutex acquisition.
struct CacheSlot {
  uint64_t id = 0;
  HdrHistogram* histogram = nullptr;
};
constexpr size_t kCacheSlots = 16;
thread_local CacheSlot tls_cache[kCacheSlots];

}  // namespace

ShardedHistogram::ShardedHistogram(int64_t lowest_discernible_value,
                                   int64_t highest_trackable_value, int significant_figures)
    : id_(next_instance_id.fetch_add(1)),
      prototype_(lowest_discernible_value, highest_trackable_value, significant_figures) {}

HdrHistogram& ShardedHistogram::local() {
  CacheSlot& slot = tls_cache[id_ % kCacheSlots];
  if (slot.id == id_) return *slot.histogram;
  return create_local();
}

HdrHistogram& ShardedHistogram::create_local() {
  const std::thread::id me = std::this_thread::get_id();
  HdrHistogram* mine = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Shard& s : shards_) {
      if (s.owner == me) mine = s.histogram.get();
    }
    if (!mine) {
      auto h = std::make_unique<HdrHistogram>(prototype_.lowest_discernible_value(),
                                              prototype_.highest_trackable_value(),
                                              prototype_.significant_figures());
      mine = h.get();
      shards_.push_back(Shard{me, std::move(h)});
    }
  }
  tls_cache[id_ % kCacheSlots] = CacheSlot{id_, mine};
  return *mine;
}

HdrHistogram ShardedHistogram::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  // One recording thread (the common case: the issue thread records every issue
  // delay): a copy of its shard, without a pass of atomic adds.
  if (shards_.size() == 1) return HdrHistogram(*shards_.front().histogram);
  HdrHistogram merged(prototype_);
  for (const Shard& s : shards_) merged.add(*s.histogram);
  return merged;
}

int64_t ShardedHistogram::total_count() const {
  int64_t n = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Shard& s : shards_) n += s.histogram->total_count();
  return n;
}

void ShardedHistogram::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Shard& s : shards_) s.histogram->reset();
}

size_t ShardedHistogram::shard_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shards_.size();
}

}  // namespace loadgen
