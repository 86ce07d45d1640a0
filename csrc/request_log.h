#pragma once
// Per-request records (--record-requests): one fixed-size record per resolved query,
// appended on the thread that resolves it into that thread's own chunk, and written by a
// background thread: as JSON lines (formatted here), or as the raw records to a spool file
// that Python converts to Parquet once the run is over. See DESIGN.md, "Threads".

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loadgen {

/// How a query was resolved.
enum class RecordStatus : uint8_t { kOk = 0, kFailed = 1, kTimedOut = 2, kCancelled = 3 };

/// One resolved query: 64 bytes, plain data. Times are on the engine's clock (now_ns()).
struct RequestRecord {
  int64_t query = 0;           ///< sequence number, 1-based, in issue order (warm-up included)
  int64_t scheduled_ns = 0;
  int64_t issued_ns = 0;       ///< 0: never reached the SUT (timed out or cancelled while queued)
  int64_t completed_ns = 0;    ///< when it was resolved, however it was resolved
  int64_t first_token_ns = 0;  ///< 0: none
  int64_t sample_index = 0;    ///< the query's first sample
  int32_t output_tokens = -1;  ///< -1: not reported
  /// -1: not known. The engine does not see prompts: the SUT passes the count with
  /// the completion (Engine::complete's n_input), as the OpenAI target does.
  int32_t input_tokens = -1;
  int32_t samples = 1;
  uint16_t error_kind = 0;     ///< RequestLog::kinds() index; 0 when none
  uint8_t status = 0;          ///< a RecordStatus
  uint8_t warmup = 0;          ///< 1: scheduled in the warm-up
};
static_assert(sizeof(RequestRecord) == 64, "RequestRecord is one cache line");

/// A streamed request's token events, for its record (RequestLog::append): when each
/// event that held tokens came (now_ns() clock, in order) and the tokens it held as the
/// per-token inter-token latency counts them (SseScanner::event_token_counts). Borrowed
/// for the call only; `count` 0: no event (the record's lists are null).
struct TokenEvents {
  const int64_t* event_ns = nullptr;
  const int64_t* tokens = nullptr;
  size_t count = 0;
};

/// Where records go.
enum class RecordSink {
  kNone,    ///< not recorded
  kJsonl,   ///< written as JSON lines to `path` by the log's own thread ("lg-records")
  kSpool,   ///< the records as they are (64 bytes each, native byte order) to `path`, by
            ///< the same thread; converted to Parquet after the run (engine/records.py).
            ///< Beside it, in the same order: `path`.events (uint32 per record: its token
            ///< events), `path`.itl (int64: each record's gaps between them) and
            ///< `path`.tokens (int32: each record's tokens per event)
};

struct RequestLogSettings {
  RecordSink sink = RecordSink::kNone;
  std::string path;          ///< kJsonl, kSpool: the file (created or truncated)
  int64_t worker_index = 0;  ///< written in every JSON line
};

/// What a log did, read together.
struct RequestLogStats {
  int64_t appended = 0;       ///< records captured
  int64_t written = 0;        ///< records written to the file
  int64_t lost = 0;           ///< records that could not be kept (no memory for a chunk)
  int64_t events_lost = 0;    ///< records kept without their token events (no memory for them)
  int64_t peak_buffered = 0;  ///< most records waiting in full chunks for the writer at once
  int64_t bytes = 0;          ///< bytes written
  int64_t writer_cpu_ns = 0;  ///< CPU time of the writer thread, once it ended
  std::string error;          ///< why writing failed ("" when it did not)
};

/// Captures records from any number of threads and writes them in the background.
///
/// Thread-safety: append() from any thread, lock-free and allocation-free except once
/// per thread (its first chunk) and once per kChunkRecords records (a full chunk is
/// queued under the mutex; its replacement comes from the free list or is allocated).
/// A record's token events (a stream's gaps and tokens per event) go to its chunk's side
/// arena, whose vectors keep their capacity when the chunk is reused: they allocate only
/// while a thread's streams outgrow what its chunks held before.
/// A thread's chunk is written only by that thread; its fill count is published with a
/// release store, so seal() (which reads the partial chunks, under the mutex) sees every
/// record it counts. seal() must come after the last append() (the engine calls it once
/// every query is resolved). intern_kind(), stats() and kinds() from any thread.
class RequestLog {
 public:
  static constexpr size_t kChunkRecords = 4096;
  /// At most this many error kinds get their own index; later ones share "other_kinds"
  /// (the engine's error counts follow the same rule).
  static constexpr size_t kMaxKinds = 64;

  struct Chunk {
    RequestRecord records[kChunkRecords];
    /// The side arena: each record's token events (0: none), and their gaps (events - 1
    /// each) and tokens (events each), record after record.
    uint32_t events[kChunkRecords];
    std::vector<int64_t> itl_ns;
    std::vector<int32_t> event_tokens;
    size_t count = 0;
  };

  /// Opens (creates or truncates) the file; throws std::invalid_argument naming it and
  /// the system's reason when it cannot. `on_written` is called (from the writer
  /// thread) once everything is written and the file closed.
  RequestLog(RequestLogSettings settings, std::function<void()> on_written);
  ~RequestLog();
  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;

  /// Starts the writer thread. Once.
  void start();
  /// Appends one record on the calling thread, with a stream's token events when
  /// `events` is given. Never blocks on the writer.
  void append(const RequestRecord& r, const TokenEvents* events = nullptr) noexcept {
    Shard* s = local();
    if (s == nullptr || s->chunk == nullptr) {
      lost_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const size_t n = s->filled.load(std::memory_order_relaxed);
    s->chunk->events[n] = events != nullptr && events->count > 0 ? keep_events(*s->chunk, *events, n) : 0;
    s->chunk->records[n] = r;
    s->filled.store(n + 1, std::memory_order_release);
    if (n + 1 == kChunkRecords) hand_off(*s);
  }
  /// The index of a (cleaned) error kind, adding it when new (1..kMaxKinds, then the
  /// index of "other_kinds"). Takes a lock.
  uint16_t intern_kind(const std::string& kind);
  /// The error kinds by index (index 0 is "").
  std::vector<std::string> kinds() const;
  /// After the last append(): queues every partial chunk and ends the input; the writer
  /// writes what is queued, closes the file and stops. Idempotent.
  void seal() noexcept;
  /// True once everything sealed is written and the file closed.
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }
  /// Joins the writer thread (after done(); waits for it otherwise).
  void join();
  RequestLogStats stats() const;
  const RequestLogSettings& settings() const noexcept { return s_; }

 private:
  struct Shard {
    std::thread::id owner;
    std::unique_ptr<Chunk> chunk;  // changed only by its owner (under mu_) or by seal()
    std::atomic<size_t> filled{0};
  };
  Shard* local() noexcept;
  Shard* create_local() noexcept;
  // Puts `e`'s gaps and tokens in `c`'s arena for its record `at`; the events kept (0
  // when there was no memory).
  uint32_t keep_events(Chunk& c, const TokenEvents& e, size_t at) noexcept;
  void hand_off(Shard& s) noexcept;
  // Queues a chunk of `count` records (mu_ held).
  void enqueue_locked(std::unique_ptr<Chunk> c, size_t count);
  std::unique_ptr<Chunk> fresh_chunk_locked() noexcept;
  void recycle(std::unique_ptr<Chunk> c);
  void writer_loop();
  // Writes one chunk as JSON lines (kJsonl) or as it is (kSpool); false (and error_ set)
  // when the write failed.
  bool write_chunk(const Chunk& c, std::string& buf, std::vector<std::string>& kinds);
  size_t format_jsonl(const Chunk& c, std::string& buf, std::vector<std::string>& kinds);
  void finish_file();

  const uint64_t id_;  // never reused: a stale thread-local cache entry cannot match
  RequestLogSettings s_;
  std::function<void()> on_written_;
  std::FILE* file_ = nullptr;
  // kSpool: the side arena's files (path.events, path.itl, path.tokens).
  std::FILE* side_[3] = {nullptr, nullptr, nullptr};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::deque<std::unique_ptr<Chunk>> queue_;
  std::vector<std::unique_ptr<Chunk>> free_;
  int64_t buffered_ = 0;       // records in queue_ (mu_)
  int64_t peak_buffered_ = 0;  // (mu_)
  int64_t handed_ = 0;         // records in chunks handed off so far (mu_)
  bool sealed_ = false;        // (mu_)
  std::string error_;          // (mu_)

  mutable std::mutex kinds_mu_;
  std::vector<std::string> kinds_{""};

  std::atomic<int64_t> written_{0};
  std::atomic<int64_t> lost_{0};
  std::atomic<int64_t> events_lost_{0};
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> writer_cpu_ns_{0};
  std::atomic<bool> done_{false};
  std::thread writer_;
};

}  // namespace loadgen
