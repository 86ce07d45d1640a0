#include "microbench.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "clock.h"
#include "hdr_histogram.h"
#include "mlperf/run.h"
#include "request_log.h"
#include "sharded_histogram.h"

namespace loadgen {
namespace {
constexpr int64_t kLowest = 1;
constexpr int64_t kHighest = 3'600'000'000'000;  // one hour in ns
constexpr int kDigits = 3;
// Completes every query in the call that issues it, after stamping its first token.
class InstantSink : public mlperf::IssueSink {
 public:
  explicit InstantSink(mlperf::MlperfRun* run) : run_(run) {}
  bool issue(const uint64_t* ids, const int64_t*, size_t n) override {
    run_->first_token(ids, n, now_ns());
    run_->complete(ids, n, now_ns(), nullptr);
    return true;
  }
  bool keep_waiting() override { return true; }

 private:
  mlperf::MlperfRun* run_;
};
}  // namespace

double time_record_ns(const int64_t* values, size_t n, int threads, RecordMode mode) {
  if (threads < 1 || threads > 64) throw std::invalid_argument("threads must be in 1..64");
  if (n == 0) throw std::invalid_argument("values must not be empty");
  std::vector<std::unique_ptr<HdrHistogram>> own;
  for (int t = 0; t < threads; ++t) own.push_back(std::make_unique<HdrHistogram>(kLowest, kHighest, kDigits));
  HdrHistogram shared(kLowest, kHighest, kDigits);
  ShardedHistogram sharded(kLowest, kHighest, kDigits);

  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<size_t> recorded(threads, 0);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (mode == RecordMode::kSharded) sharded.local();  // registration is not timed
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      size_t ok = 0;
      switch (mode) {
        case RecordMode::kSingleWriter: {
          HdrHistogram& h = *own[t];
          for (size_t i = 0; i < n; ++i) ok += h.record(values[i]);
          break;
        }
        case RecordMode::kAtomicShared:
          for (size_t i = 0; i < n; ++i) ok += shared.record_atomic(values[i]);
          break;
        case RecordMode::kSharded:
          for (size_t i = 0; i < n; ++i) ok += sharded.record(values[i]);
          break;
      }
      recorded[t] = ok;
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  const auto stop = std::chrono::steady_clock::now();
  // The sums keep the loops from being optimised away and check that nothing was lost.
  size_t total = 0;
  for (size_t r : recorded) total += r;
  int64_t counted = 0;
  if (mode == RecordMode::kSingleWriter) {
    for (auto& h : own) counted += h->total_count();
  } else if (mode == RecordMode::kAtomicShared) {
    counted = shared.total_count();
  } else {
    counted = sharded.snapshot().total_count();
  }
  if (static_cast<size_t>(counted) != total) throw std::runtime_error("record count mismatch");
  const double ns = std::chrono::duration<double, std::nano>(stop - start).count();
  return ns / static_cast<double>(n);
}

void time_request_log(size_t n, const char* path, double* append_ns, double* total_ns,
                      size_t events_per_record) {
  if (n == 0) throw std::invalid_argument("n must be >= 1");
  std::vector<int64_t> times(events_per_record), tokens(events_per_record, 1);
  TokenEvents events{times.data(), tokens.data(), events_per_record};
  RequestLogSettings settings;
  settings.sink = RecordSink::kJsonl;
  settings.path = path;
  RequestLog log(settings, nullptr);
  log.start();
  RequestRecord r;
  r.samples = 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < n; ++i) {
    r.query = static_cast<int64_t>(i) + 1;
    r.scheduled_ns = 1'000'000'000'000 + static_cast<int64_t>(i) * 10'000;
    r.issued_ns = r.scheduled_ns + 300;
    r.completed_ns = r.scheduled_ns + 2'000'000 + static_cast<int64_t>(i % 997) * 1'000;
    r.sample_index = static_cast<int64_t>(i % 24576);
    if (events_per_record > 0) {
      for (size_t j = 0; j < events_per_record; ++j) {
        times[j] = r.scheduled_ns + 50'000'000 + static_cast<int64_t>(j) * 10'000'000 + static_cast<int64_t>(i % 7);
      }
      log.append(r, &events);
    } else {
      log.append(r);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  log.seal();
  log.join();
  const auto t2 = std::chrono::steady_clock::now();
  *append_ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
  *total_ns = std::chrono::duration<double, std::nano>(t2 - t0).count();
}

double time_mlperf_loop(int64_t queries, int64_t samples_per_query) {
  if (queries < 1 || samples_per_query < 1) throw std::invalid_argument("queries and samples_per_query must be >= 1");
  const mlperf::Scenario scenario = samples_per_query == 1 ? mlperf::Scenario::kSingleStream
                                                           : mlperf::Scenario::kMultiStream;
  mlperf::GeneratorSettings g;
  g.scenario = scenario;
  // MultiStream queries are contiguous runs of the set: it is padded with their length.
  for (int64_t i = 0; i < 1024 + samples_per_query - 1; ++i) g.loaded_samples.push_back(i % 1024);
  g.sample_distribution_end = 1024;
  g.samples_per_query = samples_per_query;
  g.min_query_count = queries;
  mlperf::RunSettings s;
  s.scenario = scenario;
  s.min_query_count = queries;
  s.max_query_count = queries;
  mlperf::MlperfRun run(s, g);
  InstantSink sink(&run);
  const auto t0 = std::chrono::steady_clock::now();
  run.issue_all(sink);
  const auto t1 = std::chrono::steady_clock::now();
  const mlperf::RunCounts c = run.counts();
  if (c.samples_completed != queries * samples_per_query || c.unknown_completions != 0) {
    throw std::runtime_error("the MLPerf loop lost samples");
  }
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(queries);
}

}  // namespace loadgen
