#include "request_log.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <utility>

#include "affinity.h"

namespace loadgen {
namespace {

std::atomic<uint64_t> next_log_id{1};

// Each thread's shard of the logs it appends to, by log id: a thread appends to one log
// at a time (its engine's), so a few slots suffice; a miss costs a mutex acquisition.
struct LogCacheSlot {
  uint64_t id = 0;
  void* shard = nullptr;
};
constexpr size_t kLogCacheSlots = 4;
thread_local LogCacheSlot tls_logs[kLogCacheSlots];

// Chunks kept for reuse: enough for a writer a little behind, bounded so that a burst
// that queued many chunks gives their memory back.
constexpr size_t kMaxFreeChunks = 8;
// The longest JSON line a record gives (every number at its widest) is under 400 bytes,
// its token events aside: each gap adds at most 20 bytes and a comma, each count 11 and one.
constexpr size_t kMaxLineBytes = 512;
constexpr size_t kMaxGapBytes = 21;
constexpr size_t kMaxTokensBytes = 12;
// A reused chunk whose arena grew past this many gaps gives the memory back.
constexpr size_t kMaxKeptArena = size_t{1} << 20;
// The side files of a spool, by index in side_.
const char* const kSideSuffixes[3] = {".events", ".itl", ".tokens"};

const char* status_name(uint8_t status) {
  switch (static_cast<RecordStatus>(status)) {
    case RecordStatus::kOk: return "ok";
    case RecordStatus::kFailed: return "failed";
    case RecordStatus::kTimedOut: return "timed_out";
    case RecordStatus::kCancelled: return "cancelled";
  }
  return "failed";
}

// Appends to a buffer with room for the whole line (checked once per line).
struct LineWriter {
  char* p;
  void text(const char* s) {
    const size_t n = std::strlen(s);
    std::memcpy(p, s, n);
    p += n;
  }
  void text(const std::string& s) {
    std::memcpy(p, s.data(), s.size());
    p += s.size();
  }
  void number(int64_t v) { p = std::to_chars(p, p + 24, v).ptr; }
  // A JSON list of `n` values (`[]` when `n` is 0).
  template <class T>
  void list(const T* v, size_t n) {
    *p++ = '[';
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) *p++ = ',';
      number(static_cast<int64_t>(v[i]));
    }
    *p++ = ']';
  }
  // `v`, or null when `present` is false.
  void number_or_null(bool present, int64_t v) {
    if (present) {
      number(v);
    } else {
      text("null");
    }
  }
};

}  // namespace

RequestLog::RequestLog(RequestLogSettings settings, std::function<void()> on_written)
    : id_(next_log_id.fetch_add(1)), s_(std::move(settings)), on_written_(std::move(on_written)) {
  if (s_.sink != RecordSink::kNone) {
    file_ = std::fopen(s_.path.c_str(), s_.sink == RecordSink::kSpool ? "wb" : "w");
    if (file_ == nullptr) {
      throw std::invalid_argument("record_requests: cannot write " + s_.path + ": " + std::strerror(errno));
    }
  }
  if (s_.sink == RecordSink::kSpool) {
    for (int i = 0; i < 3; ++i) {
      const std::string side = s_.path + kSideSuffixes[i];
      side_[i] = std::fopen(side.c_str(), "wb");
      if (side_[i] == nullptr) {
        const int err = errno;
        for (int j = 0; j < i; ++j) std::fclose(side_[j]);
        std::fclose(file_);
        throw std::invalid_argument("record_requests: cannot write " + side + ": " + std::strerror(err));
      }
    }
  }
}

RequestLog::~RequestLog() {
  seal();
  join();
  if (file_ != nullptr) std::fclose(file_);  // never started: nothing was written
  for (std::FILE* f : side_) {
    if (f != nullptr) std::fclose(f);
  }
}

void RequestLog::start() {
  if (s_.sink == RecordSink::kNone || writer_.joinable()) return;
  writer_ = std::thread([this] { writer_loop(); });
}

RequestLog::Shard* RequestLog::local() noexcept {
  LogCacheSlot& slot = tls_logs[id_ % kLogCacheSlots];
  if (slot.id == id_) return static_cast<Shard*>(slot.shard);
  return create_local();
}

RequestLog::Shard* RequestLog::create_local() noexcept {
  const std::thread::id me = std::this_thread::get_id();
  Shard* mine = nullptr;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : shards_) {
      if (s->owner == me) mine = s.get();
    }
    if (mine == nullptr) {
      auto s = std::make_unique<Shard>();
      s->owner = me;
      s->chunk = fresh_chunk_locked();
      mine = s.get();
      shards_.push_back(std::move(s));
    }
  } catch (...) {  // no memory for the shard: this record is lost (and counted)
    return nullptr;
  }
  tls_logs[id_ % kLogCacheSlots] = LogCacheSlot{id_, mine};
  return mine;
}

uint32_t RequestLog::keep_events(Chunk& c, const TokenEvents& e, size_t at) noexcept {
  const size_t n = std::min<size_t>(e.count, UINT32_MAX);
  const size_t gaps_before = c.itl_ns.size();
  const size_t tokens_before = c.event_tokens.size();
  try {
    // A fresh chunk's arena grows at once to what the rest of the chunk needs if its
    // records are like this one (up to kMaxKeptArena), not by doubling from empty.
    if (tokens_before + n > c.event_tokens.capacity()) {
      const size_t rest = std::min(n * (kChunkRecords - at), kMaxKeptArena);
      const size_t want = std::max({2 * c.event_tokens.capacity(), tokens_before + rest, tokens_before + n});
      c.event_tokens.reserve(want);
      c.itl_ns.reserve(want);
    }
    c.itl_ns.resize(gaps_before + n - 1);
    c.event_tokens.resize(tokens_before + n);
  } catch (...) {  // no memory for the arena to grow: the record goes without its events
    c.itl_ns.resize(gaps_before);
    c.event_tokens.resize(tokens_before);
    events_lost_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  int64_t* gaps = c.itl_ns.data() + gaps_before;
  for (size_t i = 1; i < n; ++i) gaps[i - 1] = e.event_ns[i] - e.event_ns[i - 1];
  int32_t* tokens = c.event_tokens.data() + tokens_before;
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(std::clamp<int64_t>(e.tokens[i], 0, INT32_MAX));
  return static_cast<uint32_t>(n);
}

std::unique_ptr<RequestLog::Chunk> RequestLog::fresh_chunk_locked() noexcept {
  if (!free_.empty()) {
    std::unique_ptr<Chunk> c = std::move(free_.back());
    free_.pop_back();
    c->itl_ns.clear();
    c->event_tokens.clear();
    return c;
  }
  return std::unique_ptr<Chunk>(new (std::nothrow) Chunk);
}

void RequestLog::enqueue_locked(std::unique_ptr<Chunk> c, size_t count) {
  c->count = count;
  buffered_ += static_cast<int64_t>(count);
  handed_ += static_cast<int64_t>(count);
  if (buffered_ > peak_buffered_) peak_buffered_ = buffered_;
  queue_.push_back(std::move(c));
}

void RequestLog::hand_off(Shard& s) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      enqueue_locked(std::move(s.chunk), kChunkRecords);
    } catch (...) {  // the queue could not grow: the chunk's records are lost
      lost_.fetch_add(static_cast<int64_t>(kChunkRecords), std::memory_order_relaxed);
      s.chunk.reset();
    }
    s.chunk = fresh_chunk_locked();
    s.filled.store(0, std::memory_order_relaxed);
  }
  cv_.notify_one();
}

void RequestLog::recycle(std::unique_ptr<Chunk> c) {
  if (c->itl_ns.capacity() > kMaxKeptArena || c->event_tokens.capacity() > kMaxKeptArena) {
    std::vector<int64_t>().swap(c->itl_ns);  // outside the lock: it frees
    std::vector<int32_t>().swap(c->event_tokens);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.size() < kMaxFreeChunks) free_.push_back(std::move(c));
}

uint16_t RequestLog::intern_kind(const std::string& kind) {
  std::lock_guard<std::mutex> lock(kinds_mu_);
  for (size_t i = 1; i < kinds_.size(); ++i) {
    if (kinds_[i] == kind) return static_cast<uint16_t>(i);
  }
  if (kinds_.size() <= kMaxKinds) {
    kinds_.push_back(kind);
    return static_cast<uint16_t>(kinds_.size() - 1);
  }
  for (size_t i = kMaxKinds + 1; i < kinds_.size(); ++i) {
    if (kinds_[i] == "other_kinds") return static_cast<uint16_t>(i);
  }
  kinds_.push_back("other_kinds");
  return static_cast<uint16_t>(kinds_.size() - 1);
}

std::vector<std::string> RequestLog::kinds() const {
  std::lock_guard<std::mutex> lock(kinds_mu_);
  return kinds_;
}

void RequestLog::seal() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sealed_) return;
    for (auto& s : shards_) {
      const size_t n = s->filled.load(std::memory_order_acquire);
      if (n == 0 || s->chunk == nullptr) continue;
      try {
        enqueue_locked(std::move(s->chunk), n);
      } catch (...) {
        lost_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
      }
      s->chunk.reset();
      s->filled.store(0, std::memory_order_relaxed);
    }
    sealed_ = true;
  }
  cv_.notify_all();
  if (!writer_.joinable()) {
    // No writer thread (a run that never started): sealed is done.
    done_.store(true, std::memory_order_release);
    if (on_written_) on_written_();
  }
}

void RequestLog::join() {
  if (writer_.joinable()) writer_.join();
}

RequestLogStats RequestLog::stats() const {
  RequestLogStats st;
  std::lock_guard<std::mutex> lock(mu_);
  st.appended = handed_;
  if (!sealed_) {
    for (const auto& s : shards_) st.appended += static_cast<int64_t>(s->filled.load(std::memory_order_acquire));
  }
  st.written = written_.load();
  st.lost = lost_.load();
  st.events_lost = events_lost_.load();
  st.peak_buffered = peak_buffered_;
  st.bytes = bytes_.load();
  st.writer_cpu_ns = writer_cpu_ns_.load();
  st.error = error_;
  return st;
}

void RequestLog::writer_loop() {
  set_current_thread_name(kRecordsThreadName);
  std::string buf;
  std::vector<std::string> kinds = this->kinds();
  bool failed = false;
  for (;;) {
    std::unique_ptr<Chunk> c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !queue_.empty() || sealed_; });
      if (queue_.empty()) break;
      c = std::move(queue_.front());
      queue_.pop_front();
    }
    // After a failed write the rest is still taken off the queue (its memory given
    // back), but not written: the file is already incomplete, and says so in stats().
    if (!failed) failed = !write_chunk(*c, buf, kinds);
    {
      std::lock_guard<std::mutex> lock(mu_);
      buffered_ -= static_cast<int64_t>(c->count);
    }
    recycle(std::move(c));
  }
  finish_file();
  timespec cpu{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
    writer_cpu_ns_.store(int64_t{cpu.tv_sec} * 1'000'000'000 + cpu.tv_nsec, std::memory_order_relaxed);
  }
  done_.store(true, std::memory_order_release);
  if (on_written_) on_written_();
}

bool RequestLog::write_chunk(const Chunk& c, std::string& buf, std::vector<std::string>& kinds) {
  const char* data = reinterpret_cast<const char*>(c.records);
  size_t n = c.count * sizeof(RequestRecord);
  if (s_.sink == RecordSink::kJsonl) {
    n = format_jsonl(c, buf, kinds);
    data = buf.data();
  }
  if (std::fwrite(data, 1, n, file_) != n) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = "writing " + s_.path + " failed: " + std::strerror(errno);
    return false;
  }
  if (s_.sink == RecordSink::kSpool) {
    const std::pair<const void*, size_t> side[3] = {{c.events, c.count * sizeof(uint32_t)},
                                                    {c.itl_ns.data(), c.itl_ns.size() * sizeof(int64_t)},
                                                    {c.event_tokens.data(), c.event_tokens.size() * sizeof(int32_t)}};
    for (int i = 0; i < 3; ++i) {
      if (side[i].second != 0 && std::fwrite(side[i].first, 1, side[i].second, side_[i]) != side[i].second) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = "writing " + s_.path + kSideSuffixes[i] + " failed: " + std::strerror(errno);
        return false;
      }
      n += side[i].second;
    }
  }
  bytes_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  written_.fetch_add(static_cast<int64_t>(c.count), std::memory_order_relaxed);
  return true;
}

size_t RequestLog::format_jsonl(const Chunk& c, std::string& buf, std::vector<std::string>& kinds) {
  buf.resize(c.count * kMaxLineBytes + c.itl_ns.size() * kMaxGapBytes + c.event_tokens.size() * kMaxTokensBytes);
  LineWriter w{buf.data()};
  const int64_t* gaps = c.itl_ns.data();
  const int32_t* tokens = c.event_tokens.data();
  for (size_t i = 0; i < c.count; ++i) {
    const RequestRecord& r = c.records[i];
    if (r.error_kind >= kinds.size()) kinds = this->kinds();  // interned after the last look
    const bool ok = r.status == static_cast<uint8_t>(RecordStatus::kOk);
    w.text("{\"query\":");
    w.number(r.query);
    w.text(",\"scheduled_ns\":");
    w.number(r.scheduled_ns);
    w.text(",\"issued_ns\":");
    w.number_or_null(r.issued_ns != 0, r.issued_ns);
    w.text(",\"completed_ns\":");
    w.number(r.completed_ns);
    w.text(",\"first_token_ns\":");
    w.number_or_null(r.first_token_ns != 0, r.first_token_ns);
    w.text(",\"latency_ns\":");
    w.number_or_null(ok, r.completed_ns - r.scheduled_ns);
    w.text(",\"status\":\"");
    w.text(status_name(r.status));
    w.text("\",\"error\":");
    if (ok) {
      w.text("null");
    } else {
      // Kinds are cleaned identifiers (letters, digits, "_.-:"): nothing to escape.
      w.text("\"");
      if (r.status != static_cast<uint8_t>(RecordStatus::kFailed)) {
        w.text(status_name(r.status));
      } else if (r.error_kind > 0 && r.error_kind < kinds.size()) {
        w.text(kinds[r.error_kind]);
      } else {
        w.text("error");
      }
      w.text("\"");
    }
    w.text(",\"sample_index\":");
    w.number(r.sample_index);
    w.text(",\"samples\":");
    w.number(r.samples);
    w.text(",\"input_tokens\":");
    w.number_or_null(r.input_tokens >= 0, r.input_tokens);
    w.text(",\"output_tokens\":");
    w.number_or_null(r.output_tokens >= 0, r.output_tokens);
    w.text(",\"worker_index\":");
    w.number(s_.worker_index);
    w.text(r.warmup ? ",\"warmup\":true" : ",\"warmup\":false");
    const uint32_t events = c.events[i];
    if (events == 0) {
      w.text(",\"itl_ns\":null,\"tokens_per_event\":null}\n");
      continue;
    }
    w.text(",\"itl_ns\":");
    w.list(gaps, events - 1);
    w.text(",\"tokens_per_event\":");
    w.list(tokens, events);
    w.text("}\n");
    gaps += events - 1;
    tokens += events;
  }
  return static_cast<size_t>(w.p - buf.data());
}

void RequestLog::finish_file() {
  if (file_ == nullptr) return;
  for (std::FILE*& f : side_) {
    if (f == nullptr) continue;
    const bool flushed_side = std::fflush(f) == 0;
    const bool ok = std::fclose(f) == 0 && flushed_side;
    f = nullptr;
    if (!ok) {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.empty()) error_ = "writing " + s_.path + " (its token events) failed: " + std::strerror(errno);
    }
  }
  const bool flushed = std::fflush(file_) == 0;
  const int flush_errno = errno;
  const bool closed = std::fclose(file_) == 0;
  const int close_errno = errno;
  file_ = nullptr;
  if (!flushed || !closed) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) {
      error_ = "writing " + s_.path + " failed: " + std::strerror(flushed ? close_errno : flush_errno);
    }
  }
}

}  // namespace loadgen
