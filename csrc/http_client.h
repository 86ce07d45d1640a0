#pragma once
// The native network client over HTTP/1.1 (NetProtocol::kHttp1): sends prepared request
// bytes over keep-alive connections and completes queries natively as their responses
// arrive. The issue thread writes each request on a free connection itself, at the
// query's scheduled time; I/O threads (epoll) read and parse the responses
// (http_parser.h). A response is judged by its bytes: a verdict cache (status and body ->
// verdict) answers most natively; the rest wait for the Python side's check, which
// takes them in batches (take_unchecked) and hands back verdicts (resolve).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hdr_histogram.h"
#include "net_client.h"
#include "sse.h"
#include "tls.h"

namespace loadgen {

class CompletionSink;

/// One request group's figures (NetClientSettings::request_groups: a model of a model
/// mix): what the asyncio client's ModelFigures keeps, with the same meaning.
struct GroupFigures {
  explicit GroupFigures(int significant_figures);
  int64_t sent = 0;           ///< requests sent (submitted)
  int64_t answered = 0;       ///< requests answered and counted in the core
  int64_t output_tokens = 0;  ///< their output tokens
  HdrHistogram latency_ns;    ///< completion - scheduled (>= 1 ns)
  HdrHistogram ttft_ns;       ///< first token - scheduled (streams with a first token)
  /// An answer of `n` output tokens completed at `t_ns` (`first_ns`: its first token, 0: none).
  void record(int64_t scheduled_ns, int64_t first_ns, int64_t t_ns, int64_t n) noexcept;
  void add(const GroupFigures& other);
};

/// The figures of the streams completed (sse): what the asyncio client's OpenAISUT
/// keeps, with the same meaning. Histogram values are in [1, 3.6e12].
struct SseFigures {
  explicit SseFigures(int significant_figures);
  HdrHistogram itl_ns;               ///< each inter-token gap (>= 1 ns)
  HdrHistogram tokens_per_s_milli;   ///< each request's output tokens per second, x1000
  HdrHistogram input_length_tokens;  ///< input tokens of each request answered (when known)
  HdrHistogram output_length_tokens; ///< output tokens of each request answered (> 0)
  std::vector<std::pair<int64_t, int64_t>> output_lengths;  ///< output tokens -> requests (sorted)
  int64_t tokens_from_usage = 0;     ///< requests counted from usage.completion_tokens
  int64_t tokens_from_chunks = 0;    ///< requests counted from their token chunks
  int64_t output_tokens = 0;
  int64_t input_tokens_sent = 0;     ///< input tokens of the requests sent (when known)
  int64_t images_sent = 0;           ///< images in the requests sent (NetClientSettings::image_bytes)
  int64_t image_bytes_sent = 0;      ///< their image data, in bytes
  int64_t checked = 0;               ///< streams checked (sse_check) and found good
  SseStreamFigures stream;           ///< reasoning, per-token inter-token latency (sse.h)
  std::vector<GroupFigures> groups;  ///< by request group (NetClientSettings::group_count)
};

/// The HTTP/1.1 part of validate(const NetClientSettings&): each request starts with a
/// well-formed request line. Throws std::invalid_argument naming net.requests[i].
void validate_http1(const NetClientSettings& s);

class HttpClient final : public NetClient {
 public:
  /// `settings.protocol` is NetProtocol::kHttp1; throws std::invalid_argument on bad settings.
  explicit HttpClient(NetClientSettings settings);
  ~HttpClient() override;

  void start(CompletionSink& sink) override;
  /// Sends query `id` (its request is requests[sample % size]), scheduled at
  /// `scheduled_ns`. Called by the issue thread.
  void submit(int64_t id, int64_t sample, int64_t scheduled_ns) noexcept override;
  void close() noexcept override;
  /// Takes a one-off request for the next query of `sample` (see NetClient::add_request).
  bool add_request(int64_t sample, std::string request, int64_t input_tokens, int32_t group = -1) override;
  /// sse: the figures so far, over all I/O threads. Any thread, during a run too.
  SseFigures sse_figures() const;

 private:
  struct Conn;
  struct Io;
  struct Pending {
    int64_t id;
    int64_t sample;
    int64_t deadline;  // 0: none
    int64_t scheduled;
  };
  // How a stream ended (sse), decided under its connection's lock and acted on after.
  struct StreamEnd {
    int64_t id = -1;
    int64_t t = 0;
    int64_t n = 0;
    int64_t n_input = -1;
    int status = 0;
    int problem = 0;
    std::string body;
    bool check = false;  // check_each: a good stream goes to the Python side's check (body: its bytes)
    bool events = false;  // its token events are in its I/O thread's end_event_* (for its record)
    int64_t sample = 0;
    int64_t scheduled = 0;
  };
  // A one-off request (add_request()) and its input tokens.
  struct OneOff {
    std::string request;
    int64_t input_tokens = -1;
    int32_t group = -1;
  };
  // What one readiness event on a connection leaves to do once its lock is released.
  struct EventOutcome {
    int64_t done_id = -1;  // a whole response to judge (not sse)
    int64_t done_t = 0;
    int done_status = 0;
    std::string done_body;
    int64_t done_sample = 0;  // check_each: what the Python side's check is told besides
    int64_t done_scheduled = 0;
    int64_t done_input = -1;
    int32_t done_group = -1;
    StreamEnd stream_end;  // sse: a stream that ended (id >= 0)
    bool reuse = false;    // the connection is idle again: it goes back to the pool
  };
  // An I/O thread: waits for events, handles each, scans for timeouts.
  void io_loop(Io* io);
  // One readiness event `ev` on `c`: under c's lock, a finished connect, the rest of a
  // request or the responses read; then, unlocked, what they leave to do.
  void on_event(Conn* c, uint32_t ev, std::vector<char>& buf) noexcept;
  // c's non-blocking connect ended (c's lock held): idle and reusable, or failed.
  void on_connected(Conn* c, uint32_t ev, EventOutcome* out) noexcept;
  // Reads and parses what c has (c's lock held), at most kMaxReadsPerEvent reads.
  void read_responses(Conn* c, std::vector<char>& buf, EventOutcome* out) noexcept;
  // TLS: read_responses over c's TlsConn; a read that needs the socket writable waits for it.
  void read_tls(Conn* c, std::vector<char>& buf, EventOutcome* out) noexcept;
  // TLS: the next step of c's handshake (c's lock held): idle and reusable once done.
  void step_handshake(Conn* c, EventOutcome* out) noexcept;
  // TLS: the whole handshake of a warm connection, before the run; false when it failed.
  bool handshake_blocking(Conn* c) noexcept;
  // TLS: counts a finished handshake of c.
  void count_handshake(Conn* c) noexcept;
  // TLS: asks epoll for what c waits for: readable always, writable while a write has
  // more to send (and the socket is what it waits for) or a read waits for the socket.
  void update_interest(Conn* c) noexcept;
  // Closes c's socket (and its TLS first), out of the epoll set. c's lock held.
  void drop_socket(Conn* c) noexcept;
  // A read failed with errno `err`: c closes, failing its query.
  void close_after_read_error(Conn* c, int err) noexcept;
  // The server closed c at `t`: a response that ends at EOF is whole, else its query fails.
  void close_at_eof(Conn* c, int64_t t, EventOutcome* out) noexcept;
  // Parses `n` bytes read at `t` on c (`filled`: the read filled the buffer, so more may
  // wait). True when c should be read again.
  bool parse_read(Conn* c, const char* data, size_t n, int64_t t, bool filled, EventOutcome* out) noexcept;
  // A whole response on c, complete at `t`: its stream ends (sse), or it waits to be judged.
  void take_response(Conn* c, int64_t t, EventOutcome* out) noexcept;
  // Opens `c` (non-blocking connect, finished by its I/O thread). False on an immediate failure.
  bool open(Conn* c, std::string* error, int* err);
  bool connect_blocking(Conn* c, int64_t timeout_ns);
  // Sends pending work on `c`, now free, or returns it to the idle list.
  void release(Conn* c) noexcept;
  // Sends query `p` on `c` (whose lock the caller holds).
  void send_locked(Conn* c, const Pending& p) noexcept;
  // Closes `c` (lock held); fails its query with kind/message when it has one and kind is non-empty.
  void close_locked(Conn* c, const char* kind, const std::string& message) noexcept;
  void on_writable(Conn* c) noexcept;
  // Writes what is left of c's request: 0 when all is written, EAGAIN when the socket is
  // full, else the error.
  int write_some(Conn* c) noexcept;
  // Closes c after a failed write, failing its query as the asyncio client would.
  void fail_write(Conn* c, int err) noexcept;
  // sse: ends c's stream (its lock held) at t with `status`: records a good one in its
  // I/O thread's figures, or says why it failed.
  void end_stream(Conn* c, int64_t t, int status, StreamEnd* out) noexcept;
  // Copies a good stream's token events and their tokens (as the per-token ITL counts
  // them) into `io`'s end_event_*; false when there was no memory.
  bool keep_token_events(Io& io, const SseScanner& s) noexcept;
  // sse: acts on a stream's end (no lock held): completes its query, or hands it over.
  // `io`: the thread's, which holds the stream's token events (StreamEnd::events).
  void finish_stream(Io& io, StreamEnd&& e) noexcept;
  // check_each: out's whole response (no lock held) goes to the Python side's check, unless
  // (whole_answers) it is an answer read_whole_answer() counts, which completes here.
  void check_whole(Io& io, EventOutcome& out) noexcept;
  // An answer of `n` output tokens (`usage`: from usage, else counted from its chunks),
  // `elapsed_ns` from its scheduled time, of `n_input` input tokens (-1: not known), in
  // io's figures; io.fig_mu held.
  static void record_answer(Io& io, int64_t n, bool usage, int64_t elapsed_ns, int64_t n_input) noexcept;
  // sse: after a read was parsed (c's lock held): reports a first token, or ends a
  // stream whose event went over the limit (true: c was closed, *out says why).
  bool sse_read(Conn* c, StreamEnd* out) noexcept;
  void want_connection() noexcept;
  // A connect (or its TLS handshake) of c failed: one waiting query fails as `kind`
  // (null: the class of errno `err`).
  void connect_failed(Conn* c, int err, const std::string& what, const char* kind = nullptr) noexcept;
  void expire(Io* io, int64_t now) noexcept;

  NetClientSettings s_;
  std::unique_ptr<TlsContext> tls_;  // TLS: the connections' context (null: plain TCP)
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<std::unique_ptr<Io>> ios_;
  // The idle connections and the queries waiting for one.
  std::mutex pool_mutex_;
  std::vector<Conn*> idle_;
  std::deque<Pending> pending_;
  std::atomic<int64_t> open_{0};  // connections open or opening

  std::atomic<int64_t> input_tokens_sent_{0};
  std::atomic<int64_t> images_sent_{0};
  std::atomic<int64_t> image_bytes_sent_{0};

  // One-off requests by sample index (add_request()); one_offs_ counts them, so that
  // submit() takes the lock only while there are any.
  std::mutex one_off_mutex_;
  std::unordered_map<int64_t, OneOff> one_off_;
  std::atomic<int64_t> one_offs_{0};
  // Takes the one-off request of `sample` into c (its lock held); false when none.
  bool take_one_off(Conn* c, int64_t sample) noexcept;
  // The input tokens of query sample `sample`: its one-off's, else the prepared request's;
  // *one_off says which, and its group is in *group (-1: none).
  int64_t input_tokens_of(int64_t sample, bool* one_off, int32_t* group) noexcept;
  // The group of prepared request sample `sample` (-1: no groups).
  int32_t group_of(int64_t sample) const noexcept {
    return s_.request_groups.empty() ? -1 : s_.request_groups[static_cast<size_t>(sample) % s_.request_groups.size()];
  }
  // An answer of query group `group` (-1: none) in io's figures; io.fig_mu held.
  static void record_group(Io& io, int32_t group, int64_t scheduled_ns, int64_t first_ns, int64_t t_ns,
                           int64_t n) noexcept;
  // Requests sent, by group (group_count of them).
  std::unique_ptr<std::atomic<int64_t>[]> group_sent_;
};

}  // namespace loadgen
