#include "mlperf_run.h"

#include <algorithm>
#include <stdexcept>

#include "clock.h"

namespace loadgen {
namespace mlperf {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

int bits_for(uint64_t n) {  // bits needed to hold values 0..n
  int b = 0;
  while (b < 64 && (n >> b) != 0) ++b;
  return b;
}

// Shuffled 0, stride, 2*stride, ... below `end` (MLPerf's accuracy-mode draw order).
std::vector<int64_t> strided_shuffle(int64_t end, int64_t stride, Mt19937& rng) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < end; i += stride) v.push_back(i);
  shuffle(v, 0, v.size(), rng);
  return v;
}

template <class T>
void atomic_max(std::atomic<T>& a, T v) noexcept {
  T cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

constexpr int64_t kWaitSliceNs = 50'000'000;

// The next free block of query numbers in the process (see MlperfRun::reserve_numbers).
std::atomic<uint64_t> g_last_seq{0};

}  // namespace

QueryGenerator::QueryGenerator(GeneratorSettings s)
    : s_(std::move(s)), sample_rng_(s_.sample_index_rng_seed), schedule_rng_(s_.schedule_rng_seed) {
  const int64_t n = static_cast<int64_t>(s_.loaded_samples.size());
  require(n >= 1, "the loaded sample set is empty");
  require(s_.sample_distribution_end >= 1 && s_.sample_distribution_end <= n,
          "sample_distribution_end must be in 1..loaded set size");
  require(s_.samples_per_query >= 1, "samples_per_query must be >= 1");
  require(s_.target_duration_ns >= 0 && s_.min_query_count >= 0, "durations and counts must be >= 0");
  require(s_.target_qps > 0 && s_.target_qps < 1e300, "target_qps must be > 0");
  const bool offline = s_.scenario == Scenario::kOffline;
  const bool multi = s_.scenario == Scenario::kMultiStream;

  spq_ = s_.samples_per_query;
  if (s_.accuracy && offline) spq_ = s_.sample_distribution_end;
  gen_duration_ns_ = (s_.scenario == Scenario::kServer ? 1 : 2) * s_.target_duration_ns;
  min_queries_ = s_.min_query_count;
  if (s_.accuracy || s_.performance_issue_unique) {
    gen_duration_ns_ = 0;
    min_queries_ = n / spq_;
  }
  const int64_t stride = multi ? spq_ : 1;
  // MLPerf builds three sample distributions up front, each consuming the sample
  // stream in this order (even those the run never uses), so all three are built.
  if (s_.accuracy) mode_indices_ = strided_shuffle(s_.sample_distribution_end, stride, sample_rng_);
  unique_indices_ = strided_shuffle(s_.sample_distribution_end, stride, sample_rng_);
  equal_issue_ = s_.sample_concatenate_permutation;
  {
    std::vector<int64_t> perm(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
    for (int64_t j = 0; j < min_queries_; j += n) {
      if (equal_issue_ && !s_.accuracy) {
        shuffle(perm, 0, perm.size(), sample_rng_);
        equal_indices_.insert(equal_indices_.end(), perm.begin(), perm.end());
      } else {
        shuffle_draws(perm.size(), sample_rng_, [](size_t, size_t) {});  // draws only
      }
    }
  }
  if (!s_.accuracy && equal_issue_) {
    if (offline && spq_ % n != 0) {
      spq_ += n - spq_ % n;
    } else if (!offline && min_queries_ % n != 0) {
      min_queries_ += n - min_queries_ % n;
    }
  }
  require(!s_.performance_issue_same || (s_.performance_issue_same_index >= 0 &&
                                         s_.performance_issue_same_index < n),
          "performance_issue_same_index must be below the loaded set size");
  period_ns_ = seconds_to_ns(1.0 / s_.target_qps);
}

int64_t QueryGenerator::take(std::vector<int64_t>& from, size_t* pos) {
  if (from.empty()) throw std::out_of_range("the sample draw order is empty");
  // MLPerf's draw lists are used once through; the equal-issue list wraps around.
  if (*pos >= from.size()) {
    if (&from != &equal_indices_) throw std::out_of_range("more queries than unique samples");
    *pos = 0;
  }
  return from[(*pos)++];
}

int64_t QueryGenerator::draw_index() {
  if (s_.accuracy) return take(mode_indices_, &mode_pos_);
  return static_cast<int64_t>(uniform_int(sample_rng_, 0, static_cast<uint64_t>(s_.sample_distribution_end - 1)));
}

bool QueryGenerator::next(std::vector<int64_t>* samples, int64_t* scheduled_ns) {
  const auto& loaded = s_.loaded_samples;
  const int64_t n = static_cast<int64_t>(loaded.size());
  const bool offline = s_.scenario == Scenario::kOffline;
  if (!(prev_timestamp_ < gen_duration_ns_ || generated_ < min_queries_)) {
    // Offline accuracy runs end with a smaller query holding what did not divide.
    if (offline && s_.accuracy && !remainder_done_) {
      remainder_done_ = true;
      const int64_t rest = n % spq_;
      if (rest != 0) {
        samples->resize(static_cast<size_t>(rest));
        for (auto& x : *samples) x = loaded[static_cast<size_t>(draw_index())];
        *scheduled_ns = timestamp_;
        ++generated_;
        return true;
      }
    }
    return false;
  }
  samples->resize(static_cast<size_t>(spq_));
  auto& out = *samples;
  if (s_.scenario == Scenario::kMultiStream) {
    int64_t i = s_.performance_issue_unique ? take(unique_indices_, &unique_pos_)
                : s_.performance_issue_same ? s_.performance_issue_same_index
                                            : draw_index();
    for (auto& x : out) {
      if (i >= n) throw std::out_of_range("MultiStream query runs past the padded set");
      x = loaded[static_cast<size_t>(i++)];
    }
  } else if (offline) {
    if (s_.performance_issue_same) {
      std::fill(out.begin(), out.end(), loaded[static_cast<size_t>(s_.performance_issue_same_index)]);
    } else {
      const int64_t full = spq_ / n;
      const int64_t rest = spq_ % n;
      for (int64_t r = 0; r < full; ++r) {
        std::copy(loaded.begin(), loaded.end(), out.begin() + r * n);
        if (s_.sample_concatenate_permutation) {
          shuffle(out, static_cast<size_t>(r * n), static_cast<size_t>((r + 1) * n), sample_rng_);
        }
      }
      std::copy(loaded.begin(), loaded.begin() + rest, out.begin() + full * n);
    }
  } else {
    for (auto& x : out) {
      const int64_t i = s_.performance_issue_unique ? take(unique_indices_, &unique_pos_)
                        : s_.performance_issue_same ? s_.performance_issue_same_index
                        : equal_issue_              ? take(equal_indices_, &equal_pos_)
                                                    : draw_index();
      x = loaded[static_cast<size_t>(i)];
    }
  }
  *scheduled_ns = timestamp_;
  ++generated_;
  prev_timestamp_ = timestamp_;
  timestamp_ += s_.scenario == Scenario::kServer
                    ? seconds_to_ns(exponential(schedule_rng_, s_.target_qps))
                    : period_ns_;
  if (equal_issue_ && generated_ >= min_queries_ && prev_timestamp_ < gen_duration_ns_ && !offline) {
    min_queries_ += n;
  }
  return true;
}

void QueryGenerator::drain() {
  std::vector<int64_t> scratch;
  int64_t t = 0;
  while (next(&scratch, &t)) {
  }
}

MlperfRun::MlperfRun(RunSettings settings, GeneratorSettings generator)
    : s_(settings),
      gen_(std::move(generator)),
      sample_latency_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      query_latency_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      issue_delay_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      ttft_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures),
      tpot_(1, std::max<int64_t>(s_.highest_trackable_ns, 2), s_.significant_figures) {
  require(s_.table_capacity >= 2 && (s_.table_capacity & (s_.table_capacity - 1)) == 0,
          "table_capacity must be a power of 2 >= 2");
  require(s_.spin_ns >= 0 && s_.max_async_queries >= 0 && s_.max_query_count >= 0 &&
              s_.max_duration_ns >= 0,
          "spin, max_async_queries, max_query_count and max_duration must be >= 0");
  const uint64_t spq = static_cast<uint64_t>(gen_.samples_per_query());
  sample_bits_ = bits_for(spq - 1);
  count_bits_ = bits_for(spq);
  require(sample_bits_ <= 40, "samples_per_query is too large");
  // Only Server keeps many queries in flight; the other scenarios have at most two.
  if (s_.scenario != Scenario::kServer) s_.table_capacity = std::min<int64_t>(s_.table_capacity, 4);
  mask_ = static_cast<uint64_t>(s_.table_capacity) - 1;
  slots_.reset(new Slot[static_cast<size_t>(s_.table_capacity)]);
  if (spq > 1) {
    bit_words_ = static_cast<size_t>((spq + 63) / 64);
    const size_t n = bit_words_ * static_cast<size_t>(s_.table_capacity);
    done_bits_.reset(new std::atomic<uint64_t>[n]);
    for (size_t i = 0; i < n; ++i) done_bits_[i].store(0, std::memory_order_relaxed);
  }
}

bool MlperfRun::mark_sample(uint64_t seq, uint64_t position) noexcept {
  const Slot& slot = slots_[seq & mask_];
  const uint64_t count_mask = (uint64_t{1} << count_bits_) - 1;
  const uint64_t w = slot.word.load(std::memory_order_acquire);
  if ((w >> count_bits_) != seq || (w & count_mask) == 0 ||
      position >= static_cast<uint64_t>(gen_.samples_per_query())) {
    return false;
  }
  std::atomic<uint64_t>& bits = done_bits_[(seq & mask_) * bit_words_ + position / 64];
  const uint64_t bit = uint64_t{1} << (position % 64);
  if (bits.fetch_or(bit, std::memory_order_acq_rel) & bit) return false;  // twice
  if ((slot.word.load(std::memory_order_acquire) >> count_bits_) != seq) {
    bits.fetch_and(~bit, std::memory_order_acq_rel);  // the query ended meanwhile
    return false;
  }
  return true;
}

uint64_t MlperfRun::reserve_numbers() const noexcept {
  // Each run takes its own block of query numbers, so the ids of two runs never meet.
  // The slot word is (seq << count_bits_) | count and must not overflow: the block is
  // smaller when queries are large, and numbering starts over when the space runs out.
  const int block_bits = std::min(32, 58 - count_bits_);
  const uint64_t block = uint64_t{1} << block_bits;
  const uint64_t limit = uint64_t{1} << (63 - count_bits_);
  uint64_t base = g_last_seq.fetch_add(block, std::memory_order_relaxed);
  if (base >= limit - block) {
    g_last_seq.store(block, std::memory_order_relaxed);
    base = 0;
  }
  return base;
}

bool MlperfRun::slot_free(uint64_t seq) const noexcept {
  const uint64_t count_mask = (uint64_t{1} << count_bits_) - 1;
  return (slots_[seq & mask_].word.load(std::memory_order_acquire) & count_mask) == 0;
}

bool MlperfRun::claim(uint64_t seq, IssueSink& sink) {
  Slot& slot = slots_[seq & mask_];
  const uint64_t count_mask = (uint64_t{1} << count_bits_) - 1;
  if ((slot.word.load(std::memory_order_acquire) & count_mask) == 0) return true;
  ++result_.table_waits;
  sink.before_wait();
  for (;;) {
    Notifier::Ticket ticket(done_);
    if ((slot.word.load(std::memory_order_acquire) & count_mask) == 0) return true;
    if (stop_.load(std::memory_order_acquire) || !sink.keep_waiting()) return false;
    ticket.wait(kWaitSliceNs);
  }
}

void MlperfRun::publish(uint64_t seq, int64_t n_samples, int64_t scheduled_ns, int64_t issued_ns) {
  Slot& slot = slots_[seq & mask_];
  slot.scheduled_ns.store(scheduled_ns, std::memory_order_relaxed);
  slot.issued_ns = issued_ns;
  slot.done_ns.store(0, std::memory_order_relaxed);
  slot.first_token_ns.store(0, std::memory_order_relaxed);
  if (bit_words_ != 0) {
    std::atomic<uint64_t>* bits = &done_bits_[(seq & mask_) * bit_words_];
    const size_t used = static_cast<size_t>((n_samples + 63) / 64);
    for (size_t i = 0; i < used; ++i) bits[i].store(0, std::memory_order_relaxed);
  }
  slot.word.store((seq << count_bits_) | static_cast<uint64_t>(n_samples), std::memory_order_release);
  issue_delay_.record(issued_ns - scheduled_ns);
}

bool MlperfRun::wait_done(uint64_t seq, IssueSink& sink) {
  const Slot& slot = slots_[seq & mask_];
  const uint64_t count_mask = (uint64_t{1} << count_bits_) - 1;
  auto done = [&] {
    const uint64_t w = slot.word.load(std::memory_order_acquire);
    return (w >> count_bits_) != seq || (w & count_mask) == 0;
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
      now = now_ns();
      if (now < scheduled) sink.before_wait();
      while (now < scheduled && !stop_.load(std::memory_order_acquire)) {
        // Slices, so that a signal or a stop request is seen while waiting long gaps.
        const int64_t slice_end = std::min(scheduled, now + kWaitSliceNs);
        wait_until_ns(slice_end, slice_end == scheduled ? s_.spin_ns : 0, &stop_);
        now = now_ns();
        if (now < scheduled && !sink.keep_waiting()) stop();
      }
      if (stop_.load(std::memory_order_acquire)) {
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
      publish(seq, static_cast<int64_t>(qs.size()), sched, now);
      last_published_ = seq;
      for (size_t k = 0; k < qs.size(); ++k) {
        ids.push_back((seq << sample_bits_) | k);
        indices.push_back(qs[k]);
      }
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
        if (now < start + next_offset || !slot_free(seq + 1)) {
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
    if (s_.accuracy) continue;
    const int64_t duration = now - start;
    if (server) {
      if (s_.max_async_queries != 0 &&
          queries_issued - queries_completed_.load(std::memory_order_relaxed) > s_.max_async_queries) {
        r.too_many_outstanding = true;
        break;
      }
    } else if (queries_issued >= s_.min_query_count && duration >= s_.target_duration_ns) {
      r.ran_out_of_generated_queries = false;
      r.ended_naturally = true;
      break;
    }
    if (s_.max_query_count != 0 && queries_issued >= s_.max_query_count) {
      r.ran_out_of_generated_queries = false;
      r.max_query_count_reached = true;
      break;
    }
    if (s_.max_duration_ns != 0 && duration > s_.max_duration_ns) {
      r.ran_out_of_generated_queries = false;
      r.max_duration_reached = true;
      break;
    }
  }
  if (r.interrupted) r.ran_out_of_generated_queries = false;
  r.queries_issued = queries_issued;
  last_seq_ = last_published_;
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
  Slot& slot = slots_[seq & mask_];
  const uint64_t count_mask = (uint64_t{1} << count_bits_) - 1;
  uint64_t w = slot.word.load(std::memory_order_acquire);
  int64_t scheduled = 0;
  int64_t first_token = 0;
  bool last = false;
  for (;;) {
    if ((w >> count_bits_) != seq || static_cast<int64_t>(w & count_mask) < count) {
      *unknown += count;
      return;
    }
    // Everything read from the slot is read before the samples are counted: once the
    // count reaches 0 the issue thread may refill the slot. A successful exchange
    // proves the slot still held this query when these reads were made.
    scheduled = slot.scheduled_ns.load(std::memory_order_relaxed);
    first_token = slot.first_token_ns.load(std::memory_order_relaxed);
    last = (w & count_mask) == static_cast<uint64_t>(count);
    if (last) slot.done_ns.store(t_ns, std::memory_order_relaxed);
    if (slot.word.compare_exchange_weak(w, w - static_cast<uint64_t>(count), std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
      break;
    }
  }
  const int64_t latency = t_ns - scheduled;
  sample_latency_.record_n(latency, count);
  latency_sum_.fetch_add(latency * count, std::memory_order_relaxed);
  atomic_max(max_latency_, latency);
  atomic_max(max_completion_, t_ns);
  if (tokens > 0) tokens_.fetch_add(tokens, std::memory_order_relaxed);
  if (tpot_tokens > 1 && first_token != 0) tpot_.record((t_ns - first_token) / (tpot_tokens - 1));
  if (last) {
    if (s_.scenario == Scenario::kMultiStream) {
      query_latency_.record(latency);
      query_latency_sum_.fetch_add(latency, std::memory_order_relaxed);
    }
    queries_completed_.fetch_add(1, std::memory_order_relaxed);
  }
}

int64_t MlperfRun::complete(const uint64_t* ids, size_t n, int64_t t_ns, const int64_t* n_tokens) noexcept {
  int64_t unknown = 0;
  size_t i = 0;
  while (i < n) {
    const uint64_t seq = ids[i] >> sample_bits_;
    size_t j = i + 1;
    int64_t tokens = n_tokens ? std::max<int64_t>(n_tokens[i], 0) : 0;
    while (j < n && (ids[j] >> sample_bits_) == seq) {
      if (n_tokens) tokens += std::max<int64_t>(n_tokens[j], 0);
      ++j;
    }
    // Time per output token needs each sample's own first token: only queries of one
    // sample carry it (Server and SingleStream, where token runs happen).
    const int64_t tpot_tokens = (n_tokens != nullptr && j - i == 1) ? n_tokens[i] : 0;
    int64_t fresh = static_cast<int64_t>(j - i);
    if (bit_words_ != 0) {
      const uint64_t position_mask = (uint64_t{1} << sample_bits_) - 1;
      for (size_t k = i; k < j; ++k) {
        if (!mark_sample(seq, ids[k] & position_mask)) --fresh;
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
  const uint64_t count_mask = (uint64_t{1} << count_bits_) - 1;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t seq = ids[i] >> sample_bits_;
    Slot& slot = slots_[seq & mask_];
    const uint64_t w = slot.word.load(std::memory_order_acquire);
    if ((w >> count_bits_) != seq || (w & count_mask) == 0) {
      ++unknown;
      continue;
    }
    int64_t expected = 0;
    if (slot.first_token_ns.compare_exchange_strong(expected, t_ns, std::memory_order_acq_rel)) {
      const int64_t scheduled = slot.scheduled_ns.load(std::memory_order_relaxed);
      // The query may have finished and its slot been refilled meanwhile: then the mark
      // is taken back and the call counted as late.
      if ((slot.word.load(std::memory_order_acquire) >> count_bits_) != seq) {
        int64_t mine = t_ns;
        slot.first_token_ns.compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
        ++unknown;
        continue;
      }
      ttft_.record(t_ns - scheduled);
    }
  }
  if (unknown) unknown_.fetch_add(unknown, std::memory_order_relaxed);
  return unknown;
}

RunCounts MlperfRun::counts() const {
  RunCounts c = result_;
  c.samples_issued = samples_issued_.load(std::memory_order_acquire);
  c.queries_completed = queries_completed_.load(std::memory_order_acquire);
  c.samples_completed = samples_completed_.load(std::memory_order_acquire);
  c.unknown_completions = unknown_.load(std::memory_order_acquire);
  c.latency_sum_ns = latency_sum_.load(std::memory_order_acquire);
  c.query_latency_sum_ns = query_latency_sum_.load(std::memory_order_acquire);
  c.max_latency_ns = max_latency_.load(std::memory_order_acquire);
  c.max_completion_ns = max_completion_.load(std::memory_order_acquire);
  c.tokens = tokens_.load(std::memory_order_acquire);
  if (last_seq_ != 0) {  // a query was published
    c.final_done_ns = slots_[last_seq_ & mask_].done_ns.load(std::memory_order_acquire);
  }
  return c;
}

std::vector<std::vector<int64_t>> loadable_sets(int64_t total_sample_count, int64_t qsl_total_count,
                                                int64_t set_size, int64_t padding,
                                                uint64_t qsl_rng_seed) {
  require(total_sample_count >= 0 && qsl_total_count >= 0, "sample counts must be >= 0");
  require(set_size >= 1, "performance sample count must be >= 1");
  require(padding >= 0, "padding must be >= 0");
  Mt19937 rng(qsl_rng_seed);
  const int64_t count = std::min(total_sample_count, qsl_total_count);
  std::vector<int64_t> all(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) all[static_cast<size_t>(i)] = i;
  shuffle(all, 0, all.size(), rng);
  std::vector<std::vector<int64_t>> sets;
  for (int64_t i = 0; i < count; i += set_size) {
    const int64_t end = std::min(count, i + set_size);
    sets.emplace_back(all.begin() + i, all.begin() + end);
  }
  for (auto& set : sets) {
    const size_t base = set.size();
    for (int64_t k = 0; k < padding; ++k) set.push_back(set[static_cast<size_t>(k) % base]);
  }
  return sets;
}

}  // namespace mlperf
}  // namespace loadgen
