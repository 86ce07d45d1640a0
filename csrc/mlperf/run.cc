#include "mlperf/run.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "atomic_ops.h"
#include "clock.h"
#include "require.h"

namespace loadgen {
namespace mlperf {
namespace {

using detail::require;

RecorderSettings recorder_settings(const RunSettings& s) {
  RecorderSettings r;
  r.highest_trackable_ns = std::max<int64_t>(s.highest_trackable_ns, 2);
  r.significant_figures = s.significant_figures;
  r.latency_bounds_ns = s.latency_bounds_ns;
  r.ttft_bounds_ns = s.ttft_bounds_ns;
  r.tpot_bounds_ns = s.tpot_bounds_ns;
  r.query_latency = s.scenario == Scenario::kMultiStream;
  return r;
}

constexpr int64_t kWaitSliceNs = 50'000'000;

// The next free block of query numbers in the process (see MlperfRun::reserve_numbers).
std::atomic<uint64_t> g_last_seq{0};

// The slot ring's capacity: table_capacity, at most 4 outside Server (only Server keeps
// many queries in flight; the other scenarios have at most two).
uint64_t ring_capacity(const RunSettings& s) {
  require(s.table_capacity >= 2 && (s.table_capacity & (s.table_capacity - 1)) == 0,
          "table_capacity must be a power of 2 >= 2");
  const int64_t capacity = s.scenario == Scenario::kServer ? s.table_capacity : std::min<int64_t>(s.table_capacity, 4);
  return static_cast<uint64_t>(capacity);
}

}  // namespace

MlperfRun::MlperfRun(RunSettings settings, GeneratorSettings generator)
    : s_(settings),
      gen_(std::move(generator)),
      sample_ids_(bits_for(static_cast<uint64_t>(gen_.samples_per_query()) - 1)),
      words_(bits_for(static_cast<uint64_t>(gen_.samples_per_query()))),
      ring_(ring_capacity(s_), words_),
      recorder_(recorder_settings(s_)) {
  require(s_.spin_ns >= 0 && s_.max_async_queries >= 0 && s_.max_query_count >= 0 &&
              s_.max_duration_ns >= 0,
          "spin, max_async_queries, max_query_count and max_duration must be >= 0");
  const uint64_t spq = static_cast<uint64_t>(gen_.samples_per_query());
  require(sample_ids_.bits() <= 40, "samples_per_query is too large");
  s_.table_capacity = static_cast<int64_t>(ring_.capacity());
  if (spq > 1) {
    bit_words_ = static_cast<size_t>((spq + 63) / 64);
    const size_t n = bit_words_ * static_cast<size_t>(s_.table_capacity);
    done_bits_.reset(new std::atomic<uint64_t>[n]);
    for (size_t i = 0; i < n; ++i) done_bits_[i].store(0, std::memory_order_relaxed);
  }
}

bool MlperfRun::mark_sample(uint64_t seq, uint64_t position) noexcept {
  const uint64_t index = ring_.index(seq);
  const Slot& slot = ring_.at(index);
  const uint64_t w = slot.word.load(std::memory_order_acquire);
  if (words_.tag(w) != seq || words_.low(w) == 0 ||
      position >= static_cast<uint64_t>(gen_.samples_per_query())) {
    return false;
  }
  std::atomic<uint64_t>& bits = done_bits_[index * bit_words_ + position / 64];
  const uint64_t bit = uint64_t{1} << (position % 64);
  if (bits.fetch_or(bit, std::memory_order_acq_rel) & bit) return false;  // twice
  if (words_.tag(slot.word.load(std::memory_order_acquire)) != seq) {
    bits.fetch_and(~bit, std::memory_order_acq_rel);  // the query ended meanwhile
    return false;
  }
  return true;
}

uint64_t MlperfRun::reserve_numbers() const noexcept {
  // Each run takes its own block of query numbers, so the ids of two runs never meet.
  // The slot word is (seq << count bits) | count and must not overflow: the block is
  // smaller when queries are large, and numbering starts over when the space runs out.
  const int block_bits = std::min(32, 58 - words_.bits());
  const uint64_t block = uint64_t{1} << block_bits;
  const uint64_t limit = uint64_t{1} << (63 - words_.bits());
  uint64_t base = g_last_seq.fetch_add(block, std::memory_order_relaxed);
  if (base >= limit - block) {
    g_last_seq.store(block, std::memory_order_relaxed);
    base = 0;
  }
  return base;
}

bool MlperfRun::claim(uint64_t seq, IssueSink& sink) {
  if (ring_.is_free(seq)) return true;
  ++result_.room_waits;
  sink.before_wait();
  for (;;) {
    Notifier::Ticket ticket(done_);
    if (ring_.is_free(seq)) return true;
    if (stop_.load(std::memory_order_acquire) || !sink.keep_waiting()) return false;
    ticket.wait(kWaitSliceNs);
  }
}

void MlperfRun::publish(uint64_t seq, int64_t n_samples, int64_t scheduled_ns, int64_t issued_ns) {
  Slot& slot = ring_.at(seq);
  slot.scheduled_ns.store(scheduled_ns, std::memory_order_relaxed);
  slot.issued_ns.store(issued_ns, std::memory_order_relaxed);
  slot.done_ns.store(0, std::memory_order_relaxed);
  slot.first_token_ns.store(0, std::memory_order_relaxed);
  if (bit_words_ != 0) {
    std::atomic<uint64_t>* bits = &done_bits_[ring_.index(seq) * bit_words_];
    const size_t used = static_cast<size_t>((n_samples + 63) / 64);
    for (size_t i = 0; i < used; ++i) bits[i].store(0, std::memory_order_relaxed);
  }
  ring_.publish(seq, seq, static_cast<uint64_t>(n_samples));
  recorder_.issue_delay(scheduled_ns, issued_ns);
}

bool MlperfRun::wait_done(uint64_t seq, IssueSink& sink) {
  auto done = [&] {
    const uint64_t w = ring_.load(seq);
    return words_.tag(w) != seq || words_.low(w) == 0;
  };
  if (done()) return true;
  sink.before_wait();
  // A brief spin first: an in-process SUT often answers within microseconds, and a
  // sleeping thread takes far longer than that to wake on a small VM.
  const int64_t spin_until = now_ns() + 20'000;
  while (now_ns() < spin_until) {
    if (done()) return true;
    cpu_relax();
  }
  for (;;) {
    Notifier::Ticket ticket(done_);
    if (done()) return true;
    if (stop_.load(std::memory_order_acquire) || !sink.keep_waiting()) return false;
    ticket.wait(kWaitSliceNs);
  }
}

void MlperfRun::issue_all(IssueSink& sink) {
  const Scenario sc = s_.scenario;
  const bool server = sc == Scenario::kServer;
  const bool closed = sc == Scenario::kSingleStream || sc == Scenario::kMultiStream;
  set_min_timer_slack();
  RunCounts& r = result_;
  r.ran_out_of_generated_queries = !server;
  std::vector<int64_t> samples;
  std::vector<int64_t> next_samples;
  std::vector<uint64_t> ids;
  std::vector<int64_t> indices;
  int64_t offset = 0;
  int64_t next_offset = 0;
  bool have_next = false;
  seq_base_ = reserve_numbers();
  uint64_t seq = seq_base_;
  int64_t queries_issued = 0;
  const int64_t start = now_ns();
  r.start_ns = start;

  auto fetch = [&](std::vector<int64_t>* out, int64_t* off) {
    return gen_.next(out, off);
  };
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) {
      r.interrupted = true;
      break;
    }
    if (have_next) {
      samples.swap(next_samples);
      offset = next_offset;
      have_next = false;
    } else if (!fetch(&samples, &offset)) {
      break;
    }
    // When to issue: closed loop after the previous query is done; Server at its time.
    if (closed && seq != seq_base_ && !wait_done(seq, sink)) {
      r.interrupted = true;
      break;
    }
    int64_t scheduled;
    int64_t now;
    if (server) {
      scheduled = start + offset;
      if (!wait_until_scheduled(scheduled, sink, &now)) {
        r.interrupted = true;
        break;
      }
    } else {
      now = now_ns();
      scheduled = sc == Scenario::kOffline ? start : now;
    }
    ids.clear();
    indices.clear();
    int64_t in_this_call = 0;
    auto add_query = [&](const std::vector<int64_t>& qs, int64_t sched) -> bool {
      if (!claim(seq + 1, sink)) return false;
      ++seq;
      add_to_call(seq, qs, sched, now, &ids, &indices);
      ++in_this_call;
      r.final_scheduled_offset_ns = sched - start;
      return true;
    };
    if (!add_query(samples, scheduled)) {
      r.interrupted = true;
      break;
    }
    if (server && s_.coalesce) {
      // Every later query already due goes into the same call.
      while (fetch(&next_samples, &next_offset)) {
        // Not yet due, or its slot still busy: it waits for the next call (claiming
        // here could wait on a query of this very batch, which nobody can complete yet).
        if (now < start + next_offset || !ring_.is_free(seq + 1)) {
          have_next = true;
          break;
        }
        if (!add_query(next_samples, start + next_offset)) {
          r.interrupted = true;
          break;
        }
      }
      if (r.interrupted) break;
    }
    queries_issued_.fetch_add(in_this_call, std::memory_order_relaxed);
    samples_issued_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
    ++r.issue_calls;
    r.final_issued_ns = now;
    if (!sink.issue(ids.data(), indices.data(), ids.size())) {
      r.interrupted = true;
      break;
    }
    queries_issued += in_this_call;
    if (!s_.accuracy && reached_end(queries_issued, now - start)) break;
  }
  if (r.interrupted) r.ran_out_of_generated_queries = false;
  r.issued = queries_issued;
  last_seq_ = last_published_;
}

bool MlperfRun::wait_until_scheduled(int64_t scheduled_ns, IssueSink& sink, int64_t* now) {
  *now = now_ns();
  if (*now < scheduled_ns) sink.before_wait();
  while (*now < scheduled_ns && !stop_.load(std::memory_order_acquire)) {
    // Slices, so that a signal or a stop request is seen while waiting long gaps.
    const int64_t slice_end = std::min(scheduled_ns, *now + kWaitSliceNs);
    wait_until_ns(slice_end, slice_end == scheduled_ns ? s_.spin_ns : 0, &stop_);
    *now = now_ns();
    if (*now < scheduled_ns && !sink.keep_waiting()) stop();
  }
  return !stop_.load(std::memory_order_acquire);
}

void MlperfRun::add_to_call(uint64_t seq, const std::vector<int64_t>& samples, int64_t scheduled_ns,
                            int64_t issued_ns, std::vector<uint64_t>* ids, std::vector<int64_t>* indices) {
  publish(seq, static_cast<int64_t>(samples.size()), scheduled_ns, issued_ns);
  last_published_ = seq;
  for (size_t k = 0; k < samples.size(); ++k) {
    ids->push_back(sample_ids_.pack(seq, k));
    indices->push_back(samples[k]);
  }
}

bool MlperfRun::reached_end(int64_t queries_issued, int64_t duration_ns) {
  RunCounts& r = result_;
  if (s_.scenario == Scenario::kServer) {
    if (s_.max_async_queries != 0 &&
        queries_issued - queries_completed_.load(std::memory_order_relaxed) > s_.max_async_queries) {
      r.too_many_outstanding = true;
      return true;
    }
  } else if (queries_issued >= s_.min_query_count && duration_ns >= s_.target_duration_ns) {
    r.ran_out_of_generated_queries = false;
    r.ended_naturally = true;
    return true;
  }
  if (s_.max_query_count != 0 && queries_issued >= s_.max_query_count) {
    r.ran_out_of_generated_queries = false;
    r.max_query_count_reached = true;
    return true;
  }
  if (s_.max_duration_ns != 0 && duration_ns > s_.max_duration_ns) {
    r.ran_out_of_generated_queries = false;
    r.max_duration_reached = true;
    return true;
  }
  return false;
}

bool MlperfRun::wait_all(int64_t timeout_ns) {
  const int64_t deadline = timeout_ns < 0 ? INT64_MAX : now_ns() + timeout_ns;
  for (;;) {
    Notifier::Ticket ticket(done_);
    if (samples_completed_.load(std::memory_order_acquire) >= samples_issued_.load(std::memory_order_acquire)) {
      return true;
    }
    const int64_t now = now_ns();
    if (now >= deadline) return false;
    ticket.wait(std::min(deadline - now, kWaitSliceNs));
  }
}

void MlperfRun::finish_group(uint64_t seq, int64_t count, int64_t t_ns, int64_t tokens,
                             int64_t tpot_tokens, int64_t* unknown) noexcept {
  Slot& slot = ring_.at(seq);
  uint64_t w = slot.word.load(std::memory_order_acquire);
  int64_t scheduled = 0;
  int64_t issued = 0;
  int64_t first_token = 0;
  bool last = false;
  for (;;) {
    if (words_.tag(w) != seq || static_cast<int64_t>(words_.low(w)) < count) {
      *unknown += count;
      return;
    }
    // Everything read from the slot is read before the samples are counted: once the
    // count reaches 0 the issue thread may refill the slot. A successful exchange
    // proves the slot still held this query when these reads were made.
    scheduled = slot.scheduled_ns.load(std::memory_order_relaxed);
    issued = slot.issued_ns.load(std::memory_order_relaxed);
    first_token = slot.first_token_ns.load(std::memory_order_relaxed);
    last = words_.low(w) == static_cast<uint64_t>(count);
    if (last) slot.done_ns.store(t_ns, std::memory_order_relaxed);
    if (slot.word.compare_exchange_weak(w, w - static_cast<uint64_t>(count), std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
      break;
    }
  }
  const int64_t latency = t_ns - scheduled;
  // Out of range: counted by the recorder and left out of every latency figure; the
  // samples count as completed all the same.
  const bool recorded = recorder_.complete(scheduled, issued, t_ns, count, tokens, tpot_tokens, first_token);
  if (recorded) {
    latency_sum_.fetch_add(latency * count, std::memory_order_relaxed);
    atomic_max(max_latency_, latency);
    atomic_max(max_completion_, t_ns);
  }
  if (last) {
    if (recorded && s_.scenario == Scenario::kMultiStream) {
      recorder_.record_query_latency(latency);
      query_latency_sum_.fetch_add(latency, std::memory_order_relaxed);
    }
    queries_completed_.fetch_add(1, std::memory_order_relaxed);
  }
}

int64_t MlperfRun::complete(const uint64_t* ids, size_t n, int64_t t_ns, const int64_t* n_tokens) noexcept {
  int64_t unknown = 0;
  size_t i = 0;
  while (i < n) {
    const uint64_t seq = sample_ids_.tag(ids[i]);
    size_t j = i + 1;
    int64_t tokens = n_tokens ? std::max<int64_t>(n_tokens[i], 0) : 0;
    while (j < n && sample_ids_.tag(ids[j]) == seq) {
      if (n_tokens) tokens += std::max<int64_t>(n_tokens[j], 0);
      ++j;
    }
    // Time per output token needs each sample's own first token: only queries of one
    // sample carry it (Server and SingleStream, where token runs happen).
    const int64_t tpot_tokens = (n_tokens != nullptr && j - i == 1) ? n_tokens[i] : 0;
    int64_t fresh = static_cast<int64_t>(j - i);
    if (bit_words_ != 0) {
      for (size_t k = i; k < j; ++k) {
        if (!mark_sample(seq, sample_ids_.low(ids[k]))) --fresh;
      }
      unknown += static_cast<int64_t>(j - i) - fresh;
    }
    if (fresh > 0) finish_group(seq, fresh, t_ns, tokens, tpot_tokens, &unknown);
    i = j;
  }
  samples_completed_.fetch_add(static_cast<int64_t>(n) - unknown, std::memory_order_release);
  if (unknown) unknown_.fetch_add(unknown, std::memory_order_relaxed);
  done_.notify();
  return unknown;
}

int64_t MlperfRun::first_token(const uint64_t* ids, size_t n, int64_t t_ns) noexcept {
  int64_t unknown = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t seq = sample_ids_.tag(ids[i]);
    const uint64_t w = ring_.load(seq);
    if (words_.tag(w) != seq || words_.low(w) == 0) {
      ++unknown;
      continue;
    }
    const int64_t scheduled = ring_.at(seq).scheduled_ns.load(std::memory_order_relaxed);
    // The query may finish and its slot be refilled meanwhile: then the stamp is taken
    // back and the call counted as late.
    const FirstTokenStamp r =
        ring_.stamp_first_token(seq, t_ns, [&](uint64_t now) { return words_.tag(now) == seq; });
    if (r == FirstTokenStamp::kGone) ++unknown;
    if (r == FirstTokenStamp::kStamped) recorder_.first_token(scheduled, t_ns);
  }
  if (unknown) unknown_.fetch_add(unknown, std::memory_order_relaxed);
  return unknown;
}

RunCounts MlperfRun::counts() const {
  RunCounts c = result_;
  c.samples_issued = samples_issued_.load(std::memory_order_acquire);
  c.completed = queries_completed_.load(std::memory_order_acquire);
  c.samples_completed = samples_completed_.load(std::memory_order_acquire);
  c.unknown_completions = unknown_.load(std::memory_order_acquire);
  c.latency_sum_ns = latency_sum_.load(std::memory_order_acquire);
  c.query_latency_sum_ns = query_latency_sum_.load(std::memory_order_acquire);
  c.max_latency_ns = max_latency_.load(std::memory_order_acquire);
  c.max_completion_ns = max_completion_.load(std::memory_order_acquire);
  static_cast<RecorderCounts&>(c) = recorder_.counts();
  if (last_seq_ != 0) {  // a query was published
    c.final_done_ns = ring_.at(last_seq_).done_ns.load(std::memory_order_acquire);
  }
  return c;
}

}  // namespace mlperf
}  // namespace loadgen
