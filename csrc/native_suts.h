#pragma once
// Systems under test built into the engine, for calibration, microbenchmarks and demos:
// no Python per query. The null SUT completes each query at once; the fixed-delay SUT a
// fixed time after issue; the demo SUT simulates a batching inference server.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "net_client.h"
#include "notifier.h"
#include "request_log.h"

namespace loadgen {

/// Where queries go.
enum class SutKind {
  kNull,        ///< completes each query at once, on the issue thread
  kFixedDelay,  ///< completes each query `delay_ns` after issue, from a completion thread
  kQueue,       ///< a consumer (the Python dispatcher) takes batches with take_batch()
  kDemo,        ///< a simulated batching inference server (see NativeSutSettings)
  kNetClient,   ///< the native network client (net_client.h: HTTP/1.1 or gRPC) to a real server
};

/// Which SUT a run drives, and the native SUTs' parameters. Durations in ns.
struct NativeSutSettings {
  SutKind kind = SutKind::kNull;
  int64_t delay_ns = 0;  ///< fixed-delay SUT: service time (>= 0)
  // The demo SUT: `workers` workers; a free worker takes up to `max_batch` waiting
  // queries at once and serves them in service_ns + per_item_ns * (batch - 1), times a
  // lognormal factor of median 1 and shape `sigma`. Queueing and batching make its
  // latency rise with load, as a real server's does.
  int64_t workers = 4;             ///< demo: 1..4096
  int64_t max_batch = 8;           ///< demo: >= 1
  int64_t service_ns = 2'000'000;  ///< demo: >= 0
  int64_t per_item_ns = 250'000;   ///< demo: >= 0
  double sigma = 0.25;             ///< demo: 0..3
  uint64_t seed = 0;               ///< demo: seed of the service-time draws
  /// The fixed-delay and demo SUTs' thread runs on these CPUs (empty: not pinned), as
  /// --pin auto places an in-process SUT away from the issue thread and dispatcher.
  std::vector<int> cpus;
  /// The native network client's settings (kind kNetClient).
  NetClientSettings net;
};

/// Throws std::invalid_argument naming the bad field (sut.delay_ns, sut.workers, ...).
void validate(const NativeSutSettings& settings);

/// Where a native SUT reports completions (the engine). Called on the SUT's thread.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  /// Query `id` completed at `t_ns`. A query no longer in flight (timed out, cancelled)
  /// is ignored by the sink.
  virtual void complete_native(int64_t id, int64_t t_ns) noexcept = 0;
  /// Query `id` completed at `t_ns` with `n_tokens` output tokens (>= 0) and `n_input`
  /// input tokens (-1: not known), as Engine::complete.
  virtual void complete_tokens_native(int64_t id, int64_t t_ns, int64_t n_tokens, int64_t n_input) noexcept {
    (void)n_tokens;
    (void)n_input;
    complete_native(id, t_ns);
  }
  /// complete_tokens_native() with a stream's token events for the query's record
  /// (borrowed for the call). Asked for only when wants_token_events().
  virtual void complete_stream_native(int64_t id, int64_t t_ns, int64_t n_tokens, int64_t n_input,
                                      const TokenEvents& events) noexcept {
    (void)events;
    complete_tokens_native(id, t_ns, n_tokens, n_input);
  }
  /// Whether completions should carry their token events (the per-request records keep them).
  virtual bool wants_token_events() const noexcept { return false; }
  /// The first token of query `id` arrived at `t_ns` (Engine::first_token).
  virtual void first_token_native(int64_t id, int64_t t_ns) noexcept {
    (void)id;
    (void)t_ns;
  }
  /// Query `id` failed with an error kind and message (see Engine::fail).
  virtual void fail_native(int64_t id, const std::string& kind, const std::string& message) noexcept = 0;
  /// Queries were resolved on this thread: the sink may issue the next ones here
  /// (closed loop with inline issuing). No lock of the SUT's may be held.
  virtual void issue_ready() noexcept {}
};

/// A native SUT: the null SUT completes on the submitting thread; the fixed-delay and
/// demo SUTs receive queries through a single-producer ring and complete them from a
/// thread of their own. Thread-safety: submit() and finish() from the one issuing
/// thread; close() from any one thread.
class NativeSut {
 public:
  /// `ring_capacity`: a power of 2 at least the most queries in flight at once.
  /// `spin_ns`: spin this long before each completion time (0: sleep only).
  NativeSut(const NativeSutSettings& settings, uint64_t ring_capacity, int64_t spin_ns);
  ~NativeSut();
  NativeSut(const NativeSut&) = delete;
  NativeSut& operator=(const NativeSut&) = delete;

  /// Starts the completion thread (fixed delay and demo), reporting to `sink`, which
  /// must outlive close().
  void start(CompletionSink& sink);
  /// Hands over query `id`, issued at `issued_ns` (its first sample and scheduled time
  /// for the network client).
  void submit(int64_t id, int64_t issued_ns, int64_t sample = 0, int64_t scheduled_ns = 0) noexcept;
  /// The native network client (kind kNetClient), else null.
  NetClient* net() noexcept { return net_.get(); }
  /// No more queries will be submitted: the thread ends once it completed them all.
  void finish() noexcept;
  /// Stops completing (outstanding queries are left to the caller) and joins. Idempotent.
  void close() noexcept;

 private:
  // Pins the SUT's thread to settings.cpus, if any.
  void pin_sut_thread() noexcept;
  void fixed_delay_loop();
  void demo_loop();

  NativeSutSettings s_;
  int64_t spin_ns_;
  uint64_t mask_;
  CompletionSink* sink_ = nullptr;
  // Issue thread -> completion thread, in submission order.
  std::unique_ptr<std::atomic<int64_t>[]> ring_;
  std::unique_ptr<std::atomic<int64_t>[]> due_;  // when each ring entry is due (fixed delay)
  std::atomic<uint64_t> tail_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> closing_{false};
  Notifier submitted_;
  std::thread thread_;
  std::unique_ptr<NetClient> net_;
};

}  // namespace loadgen
