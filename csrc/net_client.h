#pragma once
// What the native network clients share: the judging of responses by their bytes. A
// response's verdict (complete, or fail with an error kind and message) is a function of
// its status and body, so a cache (status and body -> verdict) answers most responses
// natively; the rest wait for the Python side's check, which takes them in batches
// (take_unchecked) and hands back verdicts (resolve), and the cache learns them.
//
// NetClient is the interface the engine drives (one SUT kind, SutKind::kNetClient): its
// two protocols, HTTP/1.1 with OpenAI's Server-Sent Events (http_client.h) and gRPC over
// HTTP/2 (grpc_client.h), implement it on the I/O core below (netio, IoThread). Which one
// a run gets is NetClientSettings::protocol (make_net_client()).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <sys/types.h>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hdr_histogram.h"

struct epoll_event;
struct sockaddr_storage;

namespace loadgen {

class CompletionSink;

/// Socket and epoll helpers of the native clients.
namespace netio {
/// `host` (numeric IPv4 or IPv6) and `port` as a socket address; false when host is not numeric.
bool parse_address(const std::string& host, int port, sockaddr_storage* addr, unsigned* len) noexcept;
/// A non-blocking TCP socket (TCP_NODELAY) whose connect to host:port has started; -1
/// with *err set when it failed at once.
int connect_nonblocking(const std::string& host, int port, int* err) noexcept;
/// Waits up to `timeout_ns` for a connect_nonblocking() socket's connect: 0 or its error.
int finish_connect(int fd, int64_t timeout_ns) noexcept;
/// read() that also returns, in *kernel_ns (now_ns() clock), when the kernel received the
/// last of the bytes read: the software receive stamp that SO_TIMESTAMPNS asks for (set on
/// every socket connect_nonblocking() makes). *kernel_ns is 0 when the kernel gave none.
ssize_t read_stamped(int fd, char* buf, size_t len, int64_t* kernel_ns) noexcept;
/// epoll_pwait2 to the nanosecond; epoll_wait in whole milliseconds on kernels before 5.11.
int wait_events(int epfd, epoll_event* events, int max, int64_t wait_ns) noexcept;
std::string errno_text(int err);
/// The error class of a failed connect, as the asyncio HTTP client names it.
const char* connect_kind(int err) noexcept;
}  // namespace netio

/// The wire protocol of a native network client.
enum class NetProtocol {
  kHttp1,  ///< HTTP/1.1 (http_client.h): KServe REST, request templates, OpenAI streams (sse)
  kGrpc,   ///< gRPC over HTTP/2 (grpc_client.h): unary calls of one method (nghttp2)
};

/// A native network client's settings. Durations in ns. Fields marked sse apply to
/// HTTP/1.1 only, those marked gRPC to gRPC only.
struct NetClientSettings {
  NetProtocol protocol = NetProtocol::kHttp1;
  std::string host = "127.0.0.1";  ///< a numeric IPv4 or IPv6 address
  int port = 0;
  /// HTTP/1.1: keep-alive connections, at most; gRPC: HTTP/2 connections (1..65536).
  int64_t connections = 1;
  int64_t warm_connections = 64;  ///< opened before the run (at most `connections`)
  int64_t io_threads = 1;      ///< epoll threads the connections are spread over (1..256)
  /// The prepared requests, by sample index (mod size): HTTP/1.1 requests (request line,
  /// headers, body), or gRPC request messages (serialized protobuf).
  std::vector<std::string> requests;
  bool head_only = false;      ///< HTTP/1.1: the requests are HEAD: responses have no body
  int64_t max_response_bytes = 64LL << 20;
  int64_t connect_timeout_ns = 10'000'000'000;
  /// Per-query timeout from the scheduled time (0: none): HTTP/1.1 closes a connection
  /// still waiting for its response then (the response could not be told from the
  /// next); gRPC resets the call's stream. The engine counts the timeout.
  int64_t timeout_ns = 0;
  /// The verdict cache: at most this many distinct responses, each at most this long.
  int64_t cache_entries = 4096;
  int64_t cache_body_bytes = 64 * 1024;
  std::vector<int> cpus;  ///< the I/O threads run on these CPUs (empty: not pinned)
  /// The scheduler slice the I/O threads ask for (EngineSettings::sched_slice_ns, which
  /// the engine copies here; 0: the kernel's default).
  int64_t sched_slice_ns = 0;
  /// sse: OpenAI streams: each body is Server-Sent Events, read as it arrives by an
  /// SseScanner (sse.h) with max_response_bytes as its per-event bound; the first token
  /// and the completion with its token count go to the sink natively, and a failed
  /// stream goes to the Python side (take_unchecked, with its SseProblem) for its message.
  bool sse = false;
  /// sse: the end-of-stream checks (tokens or a finish_reason; data: [DONE]) are made.
  bool sse_check = true;
  /// sse: the streams are /v1/responses ones (typed events; SseScanner's `responses`).
  bool sse_responses = false;
  /// sse: each request's input tokens, by sample index like `requests` (empty: not known).
  std::vector<int64_t> input_tokens;
  /// Each request's image data in bytes, by sample index like `requests` (empty: no
  /// images), and the images in each: counted as each prepared request is sent
  /// (SseFigures::images_sent, image_bytes_sent).
  std::vector<int64_t> image_bytes;
  int64_t images_per_request = 0;
  /// HTTP/1.1: each request's group (a model of a model mix: 0..group_count-1), by
  /// sample index like `requests` (empty: no groups). Each group keeps its own counts,
  /// output tokens and latency and TTFT histograms (HttpClient::sse_figures().groups).
  std::vector<int32_t> request_groups;
  /// HTTP/1.1: how many groups there are (0: none; up to 4096).
  int64_t group_count = 0;
  /// sse: the figures' histograms keep this many significant figures (1..5).
  int significant_figures = 3;
  /// HTTP/1.1: every response goes to the Python side's check, none to the verdict cache:
  /// whole responses (a non-streamed OpenAI answer, whose check counts its tokens), and
  /// with sse every good stream too, its bytes kept (a conversation's turn: the check
  /// reads the reply's text). The check's verdict may carry token counts
  /// (ResponseVerdict::output_tokens).
  bool check_each = false;
  /// HTTP/1.1 with check_each, not sse: the responses are non-streamed OpenAI completions
  /// or chat answers. A 200 answer that read_whole_answer() (sse.h) reads is counted and
  /// completed natively, its figures kept as a stream's are (HttpClient::sse_figures());
  /// any other goes to the Python side's check.
  bool whole_answers = false;
  /// gRPC: the path of the unary method every call invokes, /package.Service/Method
  /// (e.g. /inference.GRPCInferenceService/ModelInfer).
  std::string grpc_method;
  /// gRPC: the :authority of each call (host:port; empty: host and port).
  std::string authority;
  /// gRPC: metadata sent with each call (names in lower case).
  std::vector<std::pair<std::string, std::string>> metadata;
  /// gRPC: calls in flight at most, over all connections (>= 1); the rest wait in order.
  int64_t max_in_flight = 64;
  /// TLS (https://, grpcs://; tls.h): every connection is TLS, with ALPN http/1.1 or h2
  /// by protocol. Needs a build with OpenSSL (tls_available()).
  bool tls = false;
  /// TLS: the URL's host: the SNI name and what the certificate must be valid for
  /// (empty: `host`).
  std::string server_name;
  /// TLS: the PEM CA bundle that verifies the server (empty: the system's store).
  std::string ca_file;
  /// TLS: the server's certificate is not verified.
  bool insecure = false;
};

/// Checks every field, then the protocol's own (validate_http1(), validate_grpc()).
/// Throws std::invalid_argument naming the bad field (net.port, net.grpc_method, ...).
void validate(const NetClientSettings& s);

/// A response waiting for the Python side's verdict.
struct UncheckedResponse {
  int64_t id = 0;
  int64_t t_ns = 0;  ///< when its last bytes arrived (the completion time)
  int status = 0;
  std::string body;
  /// 0 for a response to judge by status and body. The HTTP client's OpenAI streams: why
  /// the stream failed (an SseProblem, sse.h), body holding its data (kNotJson, kNotObject,
  /// kErrorEvent), the bytes held (kHttpStatus) or the event's length in decimal (kTooLarge).
  int problem = 0;
  /// NetClientSettings::check_each (HTTP/1.1): the query's sample index and scheduled
  /// time, its input tokens (-1: not known) and, for a good stream, its output tokens as
  /// the client counted them (-1 otherwise).
  int64_t sample = 0;
  int64_t scheduled_ns = 0;
  int64_t input_tokens = -1;
  int64_t output_tokens = -1;
};

/// The Python side's verdict on one response: ok, or failed with an error kind and message.
struct ResponseVerdict {
  int64_t id = 0;
  int64_t t_ns = 0;
  int status = 0;
  std::string body;   ///< the response's body (for the cache)
  bool ok = true;
  std::string kind;
  std::string message;
  /// An ok verdict's token counts (-1: not known): either >= 0 completes the query with
  /// them (CompletionSink::complete_tokens_native), as the answer's check counted them.
  int64_t output_tokens = -1;
  int64_t input_tokens = -1;
};

/// Counters of a client (any thread; approximate while running).
struct NetClientStats {
  int64_t connects = 0;
  int64_t connect_failures = 0;
  int64_t connections_opened_before_run = 0;
  int64_t bytes_sent = 0;
  int64_t responses = 0;
  int64_t cache_hits = 0;
  int64_t checked_outside = 0;  ///< responses handed to the Python side's check
  int64_t closed_by_timeout = 0;
  int64_t queued = 0;  ///< queries that waited in the client for a free connection (HTTP) or call (gRPC)
  /// gRPC: queries the issuing thread handed to an I/O thread, which sent them, because
  /// that thread held the connection's lock (the issuing thread never waits for it).
  int64_t handed_over = 0;
  /// TLS: handshakes completed (each connection that opened: before the run and during
  /// it), and those that resumed an earlier connection's session.
  int64_t tls_handshakes = 0;
  int64_t tls_resumed = 0;
};

/// A native network client: a native SUT whose queries go to a real server.
class NetClient {
 public:
  /// An I/O thread: its epoll set and the eventfd that wakes it (data.ptr null in the set).
  /// A client's own I/O thread type derives from it.
  struct IoThread {
    int epfd = -1;
    int wake = -1;
    std::thread thread;
    /// How long received bytes waited in the socket before this thread read them (the
    /// kernel's receive stamp to the read), one value per read; under wait_mu.
    std::mutex wait_mu;
    std::unique_ptr<HdrHistogram> receive_wait;
  };

  /// `cache_entries` distinct responses at most in the verdict cache, each at most
  /// `cache_body_bytes` long; `cacheable` false: no verdict is cached (a verdict that is
  /// not a function of the bytes alone).
  NetClient(int64_t cache_entries, int64_t cache_body_bytes, bool cacheable)
      : cache_entries_(cache_entries), cache_body_bytes_(cache_body_bytes), cacheable_(cacheable) {}
  virtual ~NetClient() = default;
  NetClient(const NetClient&) = delete;
  NetClient& operator=(const NetClient&) = delete;

  /// Opens the warm connections and starts the I/O threads; completions go to `sink`.
  virtual void start(CompletionSink& sink) = 0;
  /// Sends query `id` (its request is the prepared request sample % size), scheduled at
  /// `scheduled_ns`. Called by the issuing thread.
  virtual void submit(int64_t id, int64_t sample, int64_t scheduled_ns) noexcept = 0;
  /// Closes every connection and joins the threads. Idempotent.
  virtual void close() noexcept = 0;
  /// A request sent once, in place of the prepared one, by the next query of sample
  /// index `sample` (a multi-turn conversation's follow-up turn, whose body holds the
  /// conversation so far), with `input_tokens` input tokens (-1: not known). Call it
  /// before the query is scheduled. `group`: the request's group (request_groups; -1:
  /// none). False when the client takes none (gRPC). Any thread.
  virtual bool add_request(int64_t sample, std::string request, int64_t input_tokens, int32_t group = -1) {
    (void)sample;
    (void)request;
    (void)input_tokens;
    (void)group;
    return false;
  }
  /// The client's counters.
  NetClientStats stats() const;
  /// Every I/O thread's receive waits (IoThread::receive_wait), merged: how late the
  /// client read what the kernel had received, in ns. Any thread.
  HdrHistogram receive_wait() const;

  /// Up to `max` responses waiting for a verdict, waiting up to `timeout_ns` for one.
  /// Returns false once the client is closed and none is left.
  bool take_unchecked(std::vector<UncheckedResponse>* out, size_t max, int64_t timeout_ns);
  /// Completes or fails each response's query by its verdict, and remembers the
  /// verdict for those bytes.
  void resolve(std::vector<ResponseVerdict>& verdicts);

 protected:
  /// Completes or fails query `id` by the cached verdict for (status, body), or hands the
  /// response to the Python side's check.
  void judge(int64_t id, int64_t t, int status, std::string&& body) noexcept;
  /// Hands a response to the Python side's check.
  void hand_over(UncheckedResponse&& u) noexcept;
  /// The client is closing: take_unchecked() returns false once nothing is left.
  void close_checks() noexcept;

  /// Opens `io`'s epoll set and eventfd (not its thread) and keeps it among the client's
  /// I/O threads; throws std::runtime_error. `io` lives until close_io_threads().
  void open_io_thread(IoThread* io, const char* who);
  /// Wakes every I/O thread (closing_ is set) and joins it.
  void join_io_threads() noexcept;
  /// Closes the I/O threads' descriptors (the derived client's destructor, after close()).
  void close_io_threads() noexcept;
  /// Names the calling I/O thread, pins it to `cpus` (when given) and asks the kernel for
  /// a scheduler slice of `slice_ns` (0: the default; see request_sched_slice()), so that
  /// on a busy core it reads a response soon after it arrives.
  static void enter_io_thread(const char* name, const std::vector<int>& cpus, int64_t slice_ns) noexcept;
  /// How long an I/O thread waits for events before it looks at its timeouts again.
  static constexpr int64_t kIoWaitNs = 5'000'000;
  /// Records a read's receive wait: `read_ns` (when the thread read) less the kernel's
  /// receive stamp `kernel_ns` (0: none, nothing recorded). The I/O thread `io`'s own.
  static void note_receive_wait(IoThread& io, int64_t read_ns, int64_t kernel_ns) noexcept {
    if (kernel_ns <= 0 || read_ns < kernel_ns) return;
    std::lock_guard<std::mutex> lock(io.wait_mu);
    io.receive_wait->record(read_ns - kernel_ns);
  }
  /// Empties an I/O thread's wake-up eventfd.
  static void drain_wake(const IoThread& io) noexcept;

  CompletionSink* sink_ = nullptr;
  std::atomic<bool> closing_{false};
  std::vector<IoThread*> io_threads_;
  std::atomic<int64_t> connects_{0}, connect_failures_{0}, warm_{0}, bytes_sent_{0}, responses_{0},
      closed_by_timeout_{0}, queued_{0}, handed_over_{0}, tls_handshakes_{0}, tls_resumed_{0};

 private:
  struct Verdict {
    bool ok = true;
    std::string kind;
    std::string message;
  };
  /// A response body's hash: 8 bytes a step (std::hash's murmur was a sixth of the I/O
  /// thread's instructions per response). Equal keys are still compared byte for byte.
  struct BodyHash {
    size_t operator()(const std::string& s) const noexcept;
  };
  using VerdictMap = std::unordered_map<std::string, Verdict, BodyHash>;

  const int64_t cache_entries_;
  const int64_t cache_body_bytes_;
  const bool cacheable_;
  mutable std::shared_mutex cache_mutex_;
  std::vector<std::pair<int, VerdictMap>> cache_;  // per status, body -> verdict
  size_t cache_size_ = 0;

  std::mutex unchecked_mutex_;
  std::condition_variable unchecked_cv_;
  std::deque<UncheckedResponse> unchecked_;
  std::atomic<int64_t> cache_hits_{0}, checked_outside_{0};
};

/// The client `settings.protocol` names, validated and not started. Throws
/// std::invalid_argument on bad settings, std::runtime_error for gRPC in a build
/// without nghttp2 (grpc_client_available()).
std::unique_ptr<NetClient> make_net_client(const NetClientSettings& settings);

}  // namespace loadgen
