#include "grpc_client.h"

#include <cctype>
#include <stdexcept>
#include <string>

#include "require.h"

#ifdef LOADGEN_HAVE_NGHTTP2
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "affinity.h"
#include "clock.h"
#include "native_suts.h"
#include "tls.h"
#endif

namespace loadgen {

using detail::require;

void validate_grpc(const NetClientSettings& s) {
  require(s.grpc_method.size() > 1 && s.grpc_method[0] == '/',
          "net.grpc_method must be a method's path such as /package.Service/Method, got '" + s.grpc_method + "'");
  require(!s.sse && !s.head_only, "net.sse and net.head_only are HTTP/1.1's, not gRPC's");
  require(s.max_in_flight >= 1, "net.max_in_flight must be >= 1, got " + std::to_string(s.max_in_flight));
  require(s.max_response_bytes <= (int64_t{1} << 32),
          "net.max_response_bytes must be at most 4 GiB for gRPC (a gRPC message's length is 32 bits)");
  for (const auto& [name, value] : s.metadata) {
    bool ok = !name.empty() && name[0] != ':';
    for (char ch : name) ok = ok && !std::isupper(static_cast<unsigned char>(ch)) && ch > ' ' && ch < 127;
    require(ok, "net.metadata names must be non-empty lower-case tokens, got '" + name + "'");
    for (char ch : value) require(ch != '\r' && ch != '\n' && ch != '\0', "net.metadata value of '" + name +
                                                                               "' holds a line break or NUL");
  }
}

#ifndef LOADGEN_HAVE_NGHTTP2

bool grpc_client_available() noexcept { return false; }
const char* grpc_client_nghttp2_version() noexcept { return ""; }

GrpcUnaryResult grpc_unary_call(const NetClientSettings& settings, const std::string&, const std::string&, int64_t) {
  return make_grpc_client(settings), GrpcUnaryResult{};  // throws: no nghttp2
}

std::unique_ptr<NetClient> make_grpc_client(const NetClientSettings& settings) {
  validate(settings);
  throw std::runtime_error(
      "this build of loadgen has no native gRPC client: nghttp2's header was missing when it was built "
      "(install libnghttp2-dev, or your system's nghttp2 development package, and reinstall loadgen)");
}

#else

bool grpc_client_available() noexcept { return true; }
const char* grpc_client_nghttp2_version() noexcept { return nghttp2_version(0)->version_str; }

namespace {

using netio::errno_text;

constexpr size_t kReadChunk = 64 * 1024;
constexpr int32_t kWindow = 64 << 20;  // the window each stream and the connection offer the server

// gRPC status codes (grpc/status.h).
enum Code : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kResourceExhausted = 8,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDeadlineExceeded = 4,
  kPermissionDenied = 7,
  kUnauthenticated = 16,
};

// The gRPC status of an HTTP status other than 200 (the spec's http-grpc-status-mapping).
int code_of_http_status(int status) {
  switch (status) {
    case 400:
      return kInternal;
    case 401:
      return kUnauthenticated;
    case 403:
      return kPermissionDenied;
    case 404:
      return kUnimplemented;
    case 429:
    case 502:
    case 503:
    case 504:
      return kUnavailable;
    default:
      return kUnknown;
  }
}

// The gRPC status of a stream reset with an HTTP/2 error code (as grpc core maps it).
int code_of_reset(uint32_t error_code) {
  switch (error_code) {
    case NGHTTP2_CANCEL:
      return kCancelled;
    case NGHTTP2_ENHANCE_YOUR_CALM:
      return kResourceExhausted;
    case NGHTTP2_INADEQUATE_SECURITY:
      return kPermissionDenied;
    case NGHTTP2_REFUSED_STREAM:
      return kUnavailable;
    default:
      return kInternal;
  }
}

int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

// grpc-message is percent-encoded (the spec's Status-Message); a bad escape stays as it is.
std::string percent_decoded(const uint8_t* v, size_t n) {
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const char ch = static_cast<char>(v[i]);
    if (ch == '%' && i + 2 < n) {
      const int hi = hex_digit(static_cast<char>(v[i + 1])), lo = hex_digit(static_cast<char>(v[i + 2]));
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(ch);
  }
  return out;
}

bool header_is(const uint8_t* name, size_t n, const char* what) {
  const size_t len = std::strlen(what);
  return n == len && std::memcmp(name, what, len) == 0;
}

nghttp2_nv header(const std::string& name, const std::string& value) {
  nghttp2_nv nv;
  nv.name = reinterpret_cast<uint8_t*>(const_cast<char*>(name.data()));
  nv.namelen = name.size();
  nv.value = reinterpret_cast<uint8_t*>(const_cast<char*>(value.data()));
  nv.valuelen = value.size();
  nv.flags = NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE;
  return nv;
}

class GrpcClient;
struct Conn;

// An I/O thread's batch: while it acts on what one event brought (ended calls, the calls
// they make room for, the next ones issued inline), the connections it submits calls on
// are written once, after the batch, not once per call: fewer writes for us and fewer
// packets (and wake-ups) for the server. Null on every other thread, which writes at once.
thread_local std::vector<Conn*>* tl_cork = nullptr;

// One call in progress on a connection.
struct Call {
  int64_t id = -1;
  int64_t deadline = 0;  // 0: none
  const std::string* req = nullptr;  // the framed request
  size_t offset = 0;                 // of req, handed to nghttp2
  size_t live_index = 0;             // in its connection's `live`
  int32_t stream_id = 0;
  int http_status = 0;
  int grpc_status = -1;  // -1: none received
  std::string grpc_message;
  std::string body;  // the DATA received: gRPC-framed messages
  bool too_large = false;
  bool expired = false;  // reset for its timeout: the engine counts it
};

// A call's end, acted on once its connection's lock is released.
struct Ended {
  enum What { kJudge, kNoMessage, kExpired };
  What what = kJudge;
  int64_t id = -1;
  int64_t t = 0;
  int code = 0;
  std::string text;  // the response message (code 0) or the status message
};

// One response header or trailer of `call`: its HTTP status, grpc-status, grpc-message.
void take_header(Call& call, const uint8_t* name, size_t namelen, const uint8_t* value, size_t valuelen) {
  if (header_is(name, namelen, ":status")) {
    int st = 0;
    for (size_t i = 0; i < valuelen && i < 4; ++i) st = st * 10 + (value[i] - '0');
    call.http_status = st;
  } else if (header_is(name, namelen, "grpc-status")) {
    int code = 0;
    bool ok = valuelen > 0 && valuelen <= 3;
    for (size_t i = 0; ok && i < valuelen; ++i) {
      ok = value[i] >= '0' && value[i] <= '9';
      code = code * 10 + (value[i] - '0');
    }
    call.grpc_status = ok ? code : kUnknown;
    if (!ok) call.grpc_message = "a grpc-status that is not a number";
  } else if (header_is(name, namelen, "grpc-message") && call.grpc_message.empty()) {
    call.grpc_message = percent_decoded(value, valuelen);
  }
}

// How `call` ended (`error_code`: its stream's reset, NGHTTP2_NO_ERROR if none): its
// status code and message, or its one response message, in *e.
void judge_end(Call& call, uint32_t error_code, Ended* e) {
  if (call.expired) {
    e->what = Ended::kExpired;
  } else if (call.too_large) {
    e->code = kResourceExhausted;
    e->text = std::move(call.grpc_message);
  } else if (call.grpc_status < 0) {
    if (call.http_status != 0 && call.http_status != 200) {
      e->code = code_of_http_status(call.http_status);
      e->text = "Received http2 header with status: " + std::to_string(call.http_status);
    } else if (error_code != NGHTTP2_NO_ERROR) {
      e->code = code_of_reset(error_code);
      e->text = std::string("the stream was reset by the server (HTTP/2 ") + nghttp2_http2_strerror(error_code) + ")";
    } else {
      e->code = kUnknown;
      e->text = "the call ended without a grpc-status";
    }
  } else if (call.grpc_status != kOk) {
    e->code = call.grpc_status;
    e->text = std::move(call.grpc_message);
  } else {
    // OK: exactly one uncompressed message.
    const std::string& b = call.body;
    if (b.empty()) {
      e->what = Ended::kNoMessage;
    } else if (b.size() < 5) {
      e->code = kInternal;
      e->text = "a truncated response message";
    } else {
      const uint64_t n = (uint64_t{static_cast<uint8_t>(b[1])} << 24) | (uint64_t{static_cast<uint8_t>(b[2])} << 16) |
                         (uint64_t{static_cast<uint8_t>(b[3])} << 8) | uint64_t{static_cast<uint8_t>(b[4])};
      if (b[0] != 0) {
        e->code = kInternal;
        e->text = "a compressed response message, and no compression was asked for";
      } else if (n + 5 > b.size()) {
        e->code = kInternal;
        e->text = "a truncated response message";
      } else if (n + 5 < b.size()) {
        e->code = kUnimplemented;
        e->text = "more than one response message to a unary call";
      } else {
        e->text.assign(b, 5, std::string::npos);
      }
    }
  }
}

struct Pending {
  int64_t id;
  int64_t sample;
  int64_t deadline;  // 0: none
};

// A call handed to a connection whose lock another thread held (a lock-free stack).
struct InboxNode {
  Pending p;
  InboxNode* next = nullptr;
};

struct Io;

struct Conn {
  enum State { kClosed, kConnecting, kHandshaking, kOpen, kDraining };
  GrpcClient* client = nullptr;
  Io* io = nullptr;
  std::mutex mu;
  std::atomic<State> state{kClosed};  // written under mu
  int fd = -1;
  nghttp2_session* session = nullptr;
  std::string out;     // bytes made by nghttp2 and not yet taken by the socket
  size_t out_off = 0;
  bool want_out = false;  // EPOLLOUT is asked for
  bool settings_seen = false;
  int64_t connect_deadline = 0;
  int64_t read_t = 0;  // when the bytes being read arrived
  std::vector<Call*> live;
  std::vector<std::unique_ptr<Call>> spare;
  std::vector<Ended>* ended = nullptr;  // where calls that end under the lock go
  bool corked = false;  // calls submitted on its I/O thread wait for that thread's flush
  // Calls the issue thread handed over because the lock was held (see hand_over_call).
  std::atomic<InboxNode*> inbox{nullptr};
  // TLS: the connection's session, and what its last read and write wait for.
  std::unique_ptr<TlsConn> tls;
  bool read_wants_write = false;
  bool write_wants_read = false;
};

struct Io : NetClient::IoThread {
  std::vector<Conn*> conns;
};

class GrpcClient final : public NetClient {
 public:
  explicit GrpcClient(const NetClientSettings& settings);
  ~GrpcClient() override;
  void start(CompletionSink& sink) override;
  void submit(int64_t id, int64_t sample, int64_t scheduled_ns) noexcept override;
  void close() noexcept override;

  // nghttp2's callbacks (user_data: the Conn).
  static int on_header(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                       const uint8_t* value, size_t valuelen, uint8_t flags, void* user_data);
  static int on_data(nghttp2_session* session, uint8_t flags, int32_t stream_id, const uint8_t* data, size_t len,
                     void* user_data);
  static int on_frame(nghttp2_session* session, const nghttp2_frame* frame, void* user_data);
  static int on_close(nghttp2_session* session, int32_t stream_id, uint32_t error_code, void* user_data);
  static ssize_t read_body(nghttp2_session* session, int32_t stream_id, uint8_t* buf, size_t length,
                           uint32_t* data_flags, nghttp2_data_source* source, void* user_data);

 private:
  // Starts c's session once its socket is connected (c->mu held): the preface and settings.
  bool begin_session(Conn* c) noexcept;
  // Starts c's session on an event that found it connected (and its TLS done): true once
  // it is open (counted), else c is closed.
  bool open_session(Conn* c) noexcept;
  // Writes what nghttp2 has to send on c (c->mu held); false when the connection failed.
  bool flush(Conn* c) noexcept;
  // Closes c (c->mu held); its calls end as UNAVAILABLE with `why` (into c->ended).
  void close_conn(Conn* c, const std::string& why) noexcept;
  // Starts query p on an open connection; false when none is open. `hand_off`: never
  // wait for a connection's lock (the issue thread): when every open connection's lock
  // is held, the call goes to one's inbox (hand_over_call) and counts as sent.
  bool send(const Pending& p, bool hand_off = false) noexcept;
  // Starts p on c; with `busy` non-null only if c's lock is free at once (else *busy).
  bool send_on(Conn* c, const Pending& p, bool* busy = nullptr) noexcept;
  // Submits p on c (c->mu held); false when c is not open. Calls that end as it writes
  // go to `ended`.
  bool start_call_locked(Conn* c, const Pending& p, std::vector<Ended>* ended) noexcept;
  // Puts p in c's inbox and wakes c's I/O thread, which sends it (take_inbox).
  void hand_over_call(Conn* c, const Pending& p) noexcept;
  // Sends the calls in c's inbox, in the order they were handed over (c's I/O thread).
  void take_inbox(Conn* c) noexcept;
  // Acts on ended calls (no lock held), and starts waiting queries in the room they made.
  void deliver(std::vector<Ended>& ended) noexcept;
  // `n` calls ended: waiting queries take their places.
  void refill(int64_t n) noexcept;
  // Opens a closed connection (non-blocking) when queries wait and none is open.
  void reconnect() noexcept;
  // A connect of c failed (c->mu held): every waiting query fails as UNAVAILABLE, with
  // `why` (empty: errno `err`'s text).
  void connect_failed(Conn* c, int err, const std::string& why = "") noexcept;
  // Reads from c's socket, or its TLS (c->mu held): > 0 bytes, 0 at the end, -1 with
  // *err (EAGAIN: nothing now; a TLS failure also sets *why).
  ssize_t receive(Conn* c, char* buf, size_t len, int64_t* kernel_t, int* err, std::string* why) noexcept;
  // TLS: the next step of c's handshake (c->mu held); true once it is done.
  bool step_handshake(Conn* c) noexcept;
  // TLS: counts a finished handshake of c.
  void count_handshake(Conn* c) noexcept;
  void expire(Io* io, int64_t now) noexcept;
  void io_loop(Io* io);
  void on_event(Conn* c, uint32_t ev, std::vector<char>& buf, std::vector<Ended>& ended) noexcept;
  void watch(Conn* c, bool out) noexcept;
  // Ends an I/O thread's batch (tl_cork): writes the calls submitted on each connection.
  void uncork(std::vector<Conn*>& cork, std::vector<Ended>& ended) noexcept;
  std::string unavailable(const std::string& why) const {
    return "connection to " + s_.host + ":" + std::to_string(s_.port) + " " + why;
  }

  NetClientSettings s_;
  std::unique_ptr<TlsContext> tls_;  // TLS: the connections' context (null: plain TCP)
  std::vector<std::string> framed_;  // each request with its 5-byte gRPC prefix
  std::vector<std::string> names_, values_;
  std::vector<nghttp2_nv> nva_;
  nghttp2_session_callbacks* callbacks_ = nullptr;
  nghttp2_option* option_ = nullptr;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<std::unique_ptr<Io>> ios_;
  std::atomic<uint64_t> next_conn_{0};

  std::mutex pool_mutex_;  // in_flight_ and pending_
  int64_t in_flight_ = 0;  // calls started and not ended
  std::deque<Pending> pending_;
};

GrpcClient::GrpcClient(const NetClientSettings& settings)
    : NetClient(settings.cache_entries, settings.cache_body_bytes, true), s_(settings) {
  require(s_.protocol == NetProtocol::kGrpc, "the gRPC client needs net.protocol grpc");
  validate(s_);
  if (s_.tls) {
    if (s_.server_name.empty()) s_.server_name = s_.host;
    tls_ = std::make_unique<TlsContext>(s_.ca_file, s_.insecure, "h2");
  }
  if (s_.authority.empty()) {
    s_.authority = (s_.host.find(':') != std::string::npos ? "[" + s_.host + "]" : s_.host) + ":" +
                   std::to_string(s_.port);
  }
  for (const std::string& r : s_.requests) {
    require(r.size() < (uint64_t{1} << 32), "net.requests: a gRPC message over 4 GiB");
    std::string f(5, '\0');
    const uint32_t n = static_cast<uint32_t>(r.size());
    f[1] = static_cast<char>(n >> 24);
    f[2] = static_cast<char>(n >> 16);
    f[3] = static_cast<char>(n >> 8);
    f[4] = static_cast<char>(n);
    f += r;
    framed_.push_back(std::move(f));
  }
  s_.requests.clear();
  s_.requests.shrink_to_fit();
  const std::pair<std::string, std::string> fixed[] = {
      {":method", "POST"}, {":scheme", s_.tls ? "https" : "http"}, {":path", s_.grpc_method}, {":authority", s_.authority},
      {"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "loadgen-native-grpc"}};
  for (const auto& [n, v] : fixed) {
    names_.push_back(n);
    values_.push_back(v);
  }
  for (const auto& [n, v] : s_.metadata) {
    names_.push_back(n);
    values_.push_back(v);
  }
  for (size_t i = 0; i < names_.size(); ++i) nva_.push_back(header(names_[i], values_[i]));

  nghttp2_session_callbacks_new(&callbacks_);
  nghttp2_session_callbacks_set_on_header_callback(callbacks_, &GrpcClient::on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks_, &GrpcClient::on_data);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks_, &GrpcClient::on_frame);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks_, &GrpcClient::on_close);
  nghttp2_option_new(&option_);
  nghttp2_option_set_no_auto_window_update(option_, 0);

  const int64_t nio = std::min<int64_t>(s_.io_threads, s_.connections);
  for (int64_t i = 0; i < nio; ++i) {
    auto io = std::make_unique<Io>();
    open_io_thread(io.get(), "grpc client");
    ios_.push_back(std::move(io));
  }
  for (int64_t i = 0; i < s_.connections; ++i) {
    auto c = std::make_unique<Conn>();
    c->client = this;
    c->io = ios_[static_cast<size_t>(i) % ios_.size()].get();
    c->io->conns.push_back(c.get());
    conns_.push_back(std::move(c));
  }
}

GrpcClient::~GrpcClient() {
  close();
  close_io_threads();
  nghttp2_session_callbacks_del(callbacks_);
  nghttp2_option_del(option_);
}

// ---- nghttp2's callbacks

int GrpcClient::on_header(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                          const uint8_t* value, size_t valuelen, uint8_t, void*) {
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  auto* call = static_cast<Call*>(nghttp2_session_get_stream_user_data(session, frame->hd.stream_id));
  if (call != nullptr) take_header(*call, name, namelen, value, valuelen);
  return 0;
}

int GrpcClient::on_data(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data, size_t len,
                        void* user_data) {
  auto* call = static_cast<Call*>(nghttp2_session_get_stream_user_data(session, stream_id));
  if (call == nullptr || call->too_large || call->expired) return 0;
  auto* c = static_cast<Conn*>(user_data);
  // A unary response is one message: its 5-byte prefix and at most max_response_bytes.
  if (call->body.size() + len > static_cast<size_t>(c->client->s_.max_response_bytes) + 5) {
    call->too_large = true;
    call->grpc_message = "Received message larger than max (" + std::to_string(call->body.size() + len - 5) +
                         " vs. " + std::to_string(c->client->s_.max_response_bytes) + ")";
    call->body.clear();
    call->body.shrink_to_fit();
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
    return 0;
  }
  call->body.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int GrpcClient::on_frame(nghttp2_session*, const nghttp2_frame* frame, void* user_data) {
  auto* c = static_cast<Conn*>(user_data);
  if (frame->hd.type == NGHTTP2_SETTINGS && !(frame->hd.flags & NGHTTP2_FLAG_ACK)) c->settings_seen = true;
  if (frame->hd.type == NGHTTP2_GOAWAY && c->state.load() == Conn::kOpen) c->state = Conn::kDraining;
  return 0;
}

int GrpcClient::on_close(nghttp2_session* session, int32_t stream_id, uint32_t error_code, void* user_data) {
  auto* call = static_cast<Call*>(nghttp2_session_get_stream_user_data(session, stream_id));
  if (call == nullptr) return 0;
  auto* c = static_cast<Conn*>(user_data);
  nghttp2_session_set_stream_user_data(session, stream_id, nullptr);
  Ended e;
  e.id = call->id;
  e.t = c->read_t != 0 ? c->read_t : now_ns();
  judge_end(*call, error_code, &e);
  if (call->grpc_status >= 0 || call->too_large) c->client->responses_.fetch_add(1, std::memory_order_relaxed);
  if (c->ended != nullptr) c->ended->push_back(std::move(e));
  // Back to the spares, its body's capacity kept for the next call.
  Call* last = c->live.back();
  c->live[call->live_index] = last;
  last->live_index = call->live_index;
  c->live.pop_back();
  call->body.clear();
  call->grpc_message.clear();
  c->spare.emplace_back(call);
  return 0;
}

ssize_t GrpcClient::read_body(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* data_flags,
                              nghttp2_data_source* source, void*) {
  auto* call = static_cast<Call*>(source->ptr);
  const size_t n = std::min(length, call->req->size() - call->offset);
  std::memcpy(buf, call->req->data() + call->offset, n);
  call->offset += n;
  if (call->offset == call->req->size()) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

// ---- connections

void GrpcClient::watch(Conn* c, bool out) noexcept {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0u);
  ev.data.ptr = c;
  epoll_ctl(c->io->epfd, EPOLL_CTL_MOD, c->fd, &ev);
  c->want_out = out;
}

bool GrpcClient::open_session(Conn* c) noexcept {
  c->want_out = true;  // flush() asks for readable only once all is written
  if (begin_session(c) && flush(c)) {
    connects_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (c->state.load() != Conn::kClosed) close_conn(c, "failed to start HTTP/2");
  return false;
}

bool GrpcClient::begin_session(Conn* c) noexcept {
  if (nghttp2_session_client_new2(&c->session, callbacks_, c, option_) != 0) return false;
  const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                             {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kWindow}};
  nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, 2);
  nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, kWindow);
  c->settings_seen = false;
  c->out.clear();
  c->out_off = 0;
  c->state = Conn::kOpen;
  return true;
}

bool GrpcClient::flush(Conn* c) noexcept {
  if (c->session == nullptr) return true;
  for (;;) {
    const uint8_t* data = nullptr;
    const ssize_t n = nghttp2_session_mem_send(c->session, &data);
    if (n < 0) {
      close_conn(c, std::string("failed: ") + nghttp2_strerror(static_cast<int>(n)));
      return false;
    }
    if (n == 0) break;
    c->out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
  }
  while (c->tls && c->out_off < c->out.size()) {
    size_t n = 0;
    const TlsStatus st = c->tls->write(c->out.data() + c->out_off, c->out.size() - c->out_off, &n);
    c->write_wants_read = st == TlsStatus::kWantRead;
    if (st == TlsStatus::kOk) {
      c->out_off += n;
      bytes_sent_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
      continue;
    }
    if (st == TlsStatus::kWantWrite) {
      if (!c->want_out) watch(c, true);
      return true;
    }
    if (st == TlsStatus::kWantRead) return true;  // the socket's readiness to read, always watched
    close_conn(c, "lost while sending: " + c->tls->error());
    return false;
  }
  while (c->out_off < c->out.size()) {
    const ssize_t w = ::send(c->fd, c->out.data() + c->out_off, c->out.size() - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      c->out_off += static_cast<size_t>(w);
      bytes_sent_.fetch_add(w, std::memory_order_relaxed);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c->want_out) watch(c, true);
      return true;
    }
    close_conn(c, std::string("lost while sending: ") + errno_text(w < 0 ? errno : EPIPE));
    return false;
  }
  c->out.clear();
  c->out_off = 0;
  if (c->want_out && !c->read_wants_write) watch(c, false);
  return true;
}

ssize_t GrpcClient::receive(Conn* c, char* buf, size_t len, int64_t* kernel_t, int* err, std::string* why) noexcept {
  if (!c->tls) {
    const ssize_t r = netio::read_stamped(c->fd, buf, len, kernel_t);
    if (r < 0) *err = errno;
    return r;
  }
  size_t n = 0;
  const TlsStatus st = c->tls->read(buf, len, &n);
  *kernel_t = c->tls->take_kernel_ns();  // the stamp of the socket read that brought these bytes
  c->read_wants_write = st == TlsStatus::kWantWrite;
  switch (st) {
    case TlsStatus::kOk:
      return static_cast<ssize_t>(n);
    case TlsStatus::kWantWrite:
      if (!c->want_out) watch(c, true);
      *err = EAGAIN;
      return -1;
    case TlsStatus::kWantRead:
      *err = EAGAIN;
      return -1;
    case TlsStatus::kClosed:
      return 0;
    case TlsStatus::kError:
      break;
  }
  *err = c->tls->sys_errno() != 0 ? c->tls->sys_errno() : EPROTO;
  *why = c->tls->error();
  return -1;
}

void GrpcClient::count_handshake(Conn* c) noexcept {
  tls_handshakes_.fetch_add(1, std::memory_order_relaxed);
  if (c->tls->resumed()) tls_resumed_.fetch_add(1, std::memory_order_relaxed);
}

bool GrpcClient::step_handshake(Conn* c) noexcept {
  const TlsStatus st = c->tls->handshake();
  if (st == TlsStatus::kWantRead || st == TlsStatus::kWantWrite) {
    watch(c, st == TlsStatus::kWantWrite);
    return false;
  }
  if (st != TlsStatus::kOk) {
    const std::string why = "TLS handshake: " + c->tls->error();
    connect_failed(c, c->tls->sys_errno(), why);
    return false;
  }
  count_handshake(c);
  return true;
}

void GrpcClient::close_conn(Conn* c, const std::string& why) noexcept {
  if (c->fd >= 0) {
    epoll_ctl(c->io->epfd, EPOLL_CTL_DEL, c->fd, nullptr);
    c->tls.reset();
    ::close(c->fd);
    c->fd = -1;
  }
  c->tls.reset();
  c->read_wants_write = c->write_wants_read = false;
  c->want_out = false;
  c->state = Conn::kClosed;
  const std::string text = unavailable(why);
  for (Call* call : c->live) {
    Ended e;
    e.id = call->id;
    e.t = now_ns();
    if (call->expired) {
      e.what = Ended::kExpired;
    } else {
      e.code = kUnavailable;
      e.text = text;
    }
    if (c->ended != nullptr) c->ended->push_back(std::move(e));
    call->body.clear();
    call->grpc_message.clear();
    c->spare.emplace_back(call);
  }
  c->live.clear();
  if (c->session != nullptr) {
    nghttp2_session_del(c->session);  // its streams' user data are the calls just ended
    c->session = nullptr;
  }
  c->out.clear();
  c->out_off = 0;
}

void GrpcClient::start(CompletionSink& sink) {
  sink_ = &sink;
  std::vector<char> buf(kReadChunk);
  for (auto& cp : conns_) {
    Conn* c = cp.get();
    std::lock_guard<std::mutex> lock(c->mu);
    int err = 0;
    c->fd = netio::connect_nonblocking(s_.host, s_.port, &err);
    if (c->fd < 0) continue;
    bool ok = netio::finish_connect(c->fd, s_.connect_timeout_ns) == 0;
    if (ok && tls_) {
      try {
        c->tls = std::make_unique<TlsConn>(*tls_, c->fd, s_.server_name);
        ok = c->tls->handshake_blocking(s_.connect_timeout_ns) == TlsStatus::kOk;
        if (ok) count_handshake(c);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok || !begin_session(c)) {
      c->tls.reset();
      ::close(c->fd);
      c->fd = -1;
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = c;
    epoll_ctl(c->io->epfd, EPOLL_CTL_ADD, c->fd, &ev);
    std::vector<Ended> none;
    c->ended = &none;
    // The server's settings before the run, so that the first call goes out on a
    // connection in its final state.
    const int64_t deadline = now_ns() + s_.connect_timeout_ns;
    ok = flush(c);
    while (ok && !c->settings_seen && now_ns() < deadline) {
      pollfd p{c->fd, static_cast<short>(c->read_wants_write ? POLLOUT : POLLIN), 0};
      if (!(c->tls && c->tls->pending()) &&
          ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, (deadline - now_ns()) / 1'000'000))) <= 0) {
        break;
      }
      int64_t kernel_t = 0;
      int err = 0;
      std::string why;
      const ssize_t r = receive(c, buf.data(), buf.size(), &kernel_t, &err, &why);
      if (r < 0 && (err == EAGAIN || err == EINTR)) continue;
      if (r <= 0 || nghttp2_session_mem_recv(c->session, reinterpret_cast<const uint8_t*>(buf.data()),
                                             static_cast<size_t>(r)) < 0) {
        ok = false;
        break;
      }
      ok = flush(c);
    }
    // TLS 1.3 sends the session after the handshake: the first connection waits for it
    // (briefly), so that the others resume it.
    if (ok && c->tls && !tls_->has_session()) {
      c->tls->await_ticket(std::min<int64_t>(s_.connect_timeout_ns, kTicketWaitNs));
    }
    c->ended = nullptr;
    if (!ok || !c->settings_seen) {
      if (c->state.load() != Conn::kClosed) close_conn(c, "");
      continue;
    }
    connects_.fetch_add(1);
    warm_.fetch_add(1);
  }
  for (auto& io : ios_) {
    Io* p = io.get();
    io->thread = std::thread([this, p] { io_loop(p); });
  }
}

void GrpcClient::submit(int64_t id, int64_t sample, int64_t scheduled_ns) noexcept {
  const Pending p{id, sample, s_.timeout_ns > 0 ? scheduled_ns + s_.timeout_ns : 0};
  {
    std::lock_guard<std::mutex> pool(pool_mutex_);
    if (!pending_.empty() || in_flight_ >= s_.max_in_flight) {
      pending_.push_back(p);
      queued_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    ++in_flight_;
  }
  // The issue thread (an open loop's arrivals) never waits for a lock an I/O thread holds.
  if (send(p, tl_cork == nullptr)) return;
  {
    std::lock_guard<std::mutex> pool(pool_mutex_);
    --in_flight_;
    pending_.push_front(p);
  }
  reconnect();
}

bool GrpcClient::send(const Pending& p, bool hand_off) noexcept {
  const size_t n = conns_.size();
  const uint64_t first = next_conn_.fetch_add(1, std::memory_order_relaxed);
  Conn* held = nullptr;  // the first open connection whose lock was held
  for (size_t k = 0; k < n; ++k) {
    Conn* c = conns_[(first + k) % n].get();
    if (c->state.load(std::memory_order_relaxed) != Conn::kOpen) continue;
    bool busy = false;
    if (send_on(c, p, hand_off ? &busy : nullptr)) return true;
    if (busy && held == nullptr) held = c;
  }
  if (held == nullptr) return false;
  hand_over_call(held, p);
  return true;
}

void GrpcClient::hand_over_call(Conn* c, const Pending& p) noexcept {
  InboxNode* node = new (std::nothrow) InboxNode{p, nullptr};
  if (node == nullptr) {  // no memory for the node: wait for the lock after all
    if (!send_on(c, p) && !send(p)) {
      {
        std::lock_guard<std::mutex> pool(pool_mutex_);
        --in_flight_;
        pending_.push_front(p);
      }
      reconnect();
    }
    return;
  }
  node->next = c->inbox.load(std::memory_order_relaxed);
  while (!c->inbox.compare_exchange_weak(node->next, node, std::memory_order_release, std::memory_order_relaxed)) {
  }
  handed_over_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t one = 1;
  ssize_t ignored = ::write(c->io->wake, &one, sizeof one);  // the I/O thread takes it
  (void)ignored;
}

void GrpcClient::take_inbox(Conn* c) noexcept {
  InboxNode* list = c->inbox.exchange(nullptr, std::memory_order_acquire);
  InboxNode* fifo = nullptr;  // the stack reversed: the order they were handed over
  while (list != nullptr) {
    InboxNode* next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  std::vector<Ended> ended;
  std::vector<Pending> orphans;  // c closed meanwhile: another connection takes them
  {
    std::lock_guard<std::mutex> lock(c->mu);
    while (fifo != nullptr) {
      InboxNode* node = fifo;
      fifo = fifo->next;
      if (!start_call_locked(c, node->p, &ended)) orphans.push_back(node->p);
      delete node;
    }
  }
  if (!ended.empty()) deliver(ended);
  for (const Pending& p : orphans) {
    if (send(p)) continue;
    {
      std::lock_guard<std::mutex> pool(pool_mutex_);
      --in_flight_;
      pending_.push_front(p);
    }
    reconnect();
  }
}

bool GrpcClient::send_on(Conn* c, const Pending& p, bool* busy) noexcept {
  std::vector<Ended> ended;
  bool sent = false;
  {
    std::unique_lock<std::mutex> lock(c->mu, std::defer_lock);
    if (busy == nullptr) {
      lock.lock();
    } else if (!lock.try_lock()) {
      *busy = true;
      return false;
    }
    sent = start_call_locked(c, p, &ended);
  }
  if (!ended.empty()) deliver(ended);
  return sent;
}

bool GrpcClient::start_call_locked(Conn* c, const Pending& p, std::vector<Ended>* ended) noexcept {
  {
    if (c->state.load() != Conn::kOpen) return false;
    if (!nghttp2_session_check_request_allowed(c->session)) {
      c->state = Conn::kDraining;
      return false;
    }
    std::unique_ptr<Call> call;
    if (!c->spare.empty()) {
      call = std::move(c->spare.back());
      c->spare.pop_back();
    } else {
      call = std::make_unique<Call>();
    }
    call->id = p.id;
    call->deadline = p.deadline;
    call->req = &framed_[static_cast<size_t>(p.sample) % framed_.size()];
    call->offset = 0;
    call->http_status = 0;
    call->grpc_status = -1;
    call->too_large = false;
    call->expired = false;
    nghttp2_data_provider body;
    body.source.ptr = call.get();
    body.read_callback = &GrpcClient::read_body;
    const int32_t sid = nghttp2_submit_request(c->session, nullptr, nva_.data(), nva_.size(), &body, call.get());
    if (sid < 0) {  // out of stream ids, or the session is ending: a new connection takes the calls
      c->spare.push_back(std::move(call));
      c->state = Conn::kDraining;
      return false;
    }
    call->stream_id = sid;
    call->live_index = c->live.size();
    c->live.push_back(call.release());
    if (tl_cork != nullptr) {
      if (!c->corked) {
        c->corked = true;
        tl_cork->push_back(c);
      }
    } else {
      c->ended = ended;
      c->read_t = 0;
      flush(c);
      c->ended = nullptr;
    }
  }
  return true;
}

void GrpcClient::deliver(std::vector<Ended>& ended) noexcept {
  // The calls' places are free before their queries resolve: a thread that issues the
  // next query the moment one resolves (a closed loop) must find its place free, or it
  // would wait in the client for a call that has already ended.
  refill(static_cast<int64_t>(ended.size()));
  for (Ended& e : ended) {
    switch (e.what) {
      case Ended::kExpired:
        break;  // the engine counts the timeout
      case Ended::kNoMessage:
        sink_->fail_native(e.id, "invalid_response", "the call ended OK without a response message");
        break;
      case Ended::kJudge:
        judge(e.id, e.t, e.code, std::move(e.text));
        break;
    }
  }
  ended.clear();
}

void GrpcClient::refill(int64_t n) noexcept {
  std::vector<Pending> go;
  {
    std::lock_guard<std::mutex> pool(pool_mutex_);
    in_flight_ -= n;
    const int64_t now = now_ns();
    while (in_flight_ < s_.max_in_flight && !pending_.empty()) {
      const Pending p = pending_.front();
      pending_.pop_front();
      if (p.deadline != 0 && p.deadline <= now) continue;  // timed out waiting: not sent
      ++in_flight_;
      go.push_back(p);
    }
  }
  size_t i = 0;
  while (i < go.size() && send(go[i])) ++i;
  if (i == go.size()) return;
  {  // no connection open: they wait, in their order, for one
    std::lock_guard<std::mutex> pool(pool_mutex_);
    in_flight_ -= static_cast<int64_t>(go.size() - i);
    pending_.insert(pending_.begin(), go.begin() + static_cast<std::ptrdiff_t>(i), go.end());
  }
  reconnect();
}

void GrpcClient::reconnect() noexcept {
  if (closing_.load()) return;
  {
    std::lock_guard<std::mutex> pool(pool_mutex_);
    if (pending_.empty()) return;  // the next query that finds no connection open asks again
  }
  for (auto& cp : conns_) {
    const Conn::State st = cp->state.load();
    if (st == Conn::kOpen || st == Conn::kConnecting || st == Conn::kHandshaking) return;  // one is open, or opening
  }
  for (auto& cp : conns_) {
    Conn* c = cp.get();
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->state.load() == Conn::kDraining) {
      if (!c->live.empty()) continue;  // its calls end first
      close_conn(c, "");               // no call left to end
    }
    if (c->state.load() != Conn::kClosed) continue;
    int err = 0;
    c->fd = netio::connect_nonblocking(s_.host, s_.port, &err);
    if (c->fd < 0) {
      connect_failed(c, err);
      return;
    }
    c->state = Conn::kConnecting;
    c->connect_deadline = now_ns() + s_.connect_timeout_ns;
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLRDHUP;
    ev.data.ptr = c;
    epoll_ctl(c->io->epfd, EPOLL_CTL_ADD, c->fd, &ev);
    c->want_out = true;
    return;
  }
}

void GrpcClient::connect_failed(Conn* c, int err, const std::string& why) noexcept {
  if (c->fd >= 0) {
    epoll_ctl(c->io->epfd, EPOLL_CTL_DEL, c->fd, nullptr);
    c->tls.reset();
    ::close(c->fd);
    c->fd = -1;
  }
  c->tls.reset();
  c->state = Conn::kClosed;
  c->want_out = false;
  connect_failures_.fetch_add(1);
  // As grpcio fails calls on a channel that cannot connect: every waiting call, at once.
  std::deque<Pending> failed;
  {
    std::lock_guard<std::mutex> pool(pool_mutex_);
    failed.swap(pending_);
  }
  const std::string text =
      "failed to connect to " + s_.host + ":" + std::to_string(s_.port) + ": " + (why.empty() ? errno_text(err) : why);
  for (const Pending& p : failed) judge(p.id, now_ns(), kUnavailable, std::string(text));
}

void GrpcClient::expire(Io* io, int64_t now) noexcept {
  for (Conn* c : io->conns) {
    std::vector<Ended> ended;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->state.load() == Conn::kConnecting && now >= c->connect_deadline) {
        connect_failed(c, ETIMEDOUT);
        continue;
      }
      if (c->state.load() == Conn::kHandshaking && now >= c->connect_deadline) {
        connect_failed(c, ETIMEDOUT, "TLS handshake: timed out");
        continue;
      }
      if (c->session == nullptr || s_.timeout_ns <= 0) continue;
      bool any = false;
      for (Call* call : c->live) {
        if (call->expired || call->deadline == 0 || now < call->deadline) continue;
        call->expired = true;
        any = true;
        closed_by_timeout_.fetch_add(1, std::memory_order_relaxed);
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, call->stream_id, NGHTTP2_CANCEL);
      }
      if (any) {  // the resets go out now; each call ends as it is reset
        c->ended = &ended;
        flush(c);
        c->ended = nullptr;
      }
    }
    if (!ended.empty()) deliver(ended);
  }
}

void GrpcClient::on_event(Conn* c, uint32_t ev, std::vector<char>& buf, std::vector<Ended>& ended) noexcept {
  bool opened = false;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    c->ended = &ended;
    const Conn::State st = c->state.load();
    if (st == Conn::kConnecting) {
      const int err = netio::finish_connect(c->fd, 0);
      if (err != 0 || (ev & (EPOLLERR | EPOLLHUP))) {
        connect_failed(c, err != 0 ? err : ECONNREFUSED);
      } else if ((ev & EPOLLOUT) && tls_) {
        try {
          c->tls = std::make_unique<TlsConn>(*tls_, c->fd, s_.server_name);
          c->state = Conn::kHandshaking;
        } catch (const std::exception& e) {
          connect_failed(c, 0, std::string("TLS: ") + e.what());
        }
        opened = c->state.load() == Conn::kHandshaking && step_handshake(c) && open_session(c);
      } else if (ev & EPOLLOUT) {
        opened = open_session(c);
      }
    } else if (st == Conn::kHandshaking) {
      opened = step_handshake(c) && open_session(c);
    } else if (st != Conn::kClosed) {
      if (c->tls && c->write_wants_read && (ev & EPOLLIN) && c->out_off < c->out.size()) flush(c);
      if ((ev & EPOLLOUT) && c->out_off < c->out.size()) flush(c);
      if (c->fd >= 0 && ((ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) || (c->read_wants_write && (ev & EPOLLOUT)))) {
        // At most 16 reads (1 MiB) per event, as in the HTTP client: a server writing
        // faster than this thread reads must not keep it from the others and the timeouts.
        for (int reads = 0; c->fd >= 0 && reads < 16; ++reads) {
          int64_t kernel_t = 0;
          int err = 0;
          std::string why;
          const ssize_t r = receive(c, buf.data(), buf.size(), &kernel_t, &err, &why);
          if (r < 0 && err == EINTR) continue;
          if (r < 0 && (err == EAGAIN || err == EWOULDBLOCK)) break;
          if (r <= 0) {
            close_conn(c, r == 0 ? "closed by the server" : "lost: " + (why.empty() ? errno_text(err) : why));
            break;
          }
          c->read_t = now_ns();
          note_receive_wait(*c->io, c->read_t, kernel_t);
          const ssize_t used =
              nghttp2_session_mem_recv(c->session, reinterpret_cast<const uint8_t*>(buf.data()), static_cast<size_t>(r));
          if (used < 0) {
            close_conn(c, std::string("failed: HTTP/2 ") + nghttp2_strerror(static_cast<int>(used)));
            break;
          }
          if (!flush(c)) break;
          // Drained (epoll is level-triggered), unless OpenSSL holds bytes it has read.
          if (static_cast<size_t>(r) < buf.size() && !(c->tls && c->tls->pending())) break;
        }
        if (c->fd >= 0 && c->want_out && !c->read_wants_write && c->out_off >= c->out.size()) watch(c, false);
        c->read_t = 0;
        if (c->session != nullptr && !nghttp2_session_want_read(c->session) &&
            !nghttp2_session_want_write(c->session)) {
          close_conn(c, "ended by the server (GOAWAY)");
        }
      }
    }
    c->ended = nullptr;
  }
  if (opened) refill(0);
  if (!ended.empty()) deliver(ended);
  if (c->state.load() != Conn::kOpen) reconnect();
}

void GrpcClient::uncork(std::vector<Conn*>& cork, std::vector<Ended>& ended) noexcept {
  tl_cork = nullptr;
  for (Conn* c : cork) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->corked = false;
      c->ended = &ended;
      c->read_t = 0;
      flush(c);
      c->ended = nullptr;
    }
    if (!ended.empty()) deliver(ended);  // a connection that failed as it was written
  }
  cork.clear();
}

void GrpcClient::io_loop(Io* io) {
  enter_io_thread(kGrpcThreadName, s_.cpus, s_.sched_slice_ns);  // see HttpClient::io_loop
  std::vector<epoll_event> events(256);
  std::vector<char> buf(kReadChunk);
  std::vector<Ended> ended;
  std::vector<Conn*> cork;
  int64_t next_scan = 0;
  while (!closing_.load(std::memory_order_acquire)) {
    const int n = netio::wait_events(io->epfd, events.data(), static_cast<int>(events.size()), kIoWaitNs);
    for (int i = 0; i < n; ++i) {
      Conn* c = static_cast<Conn*>(events[static_cast<size_t>(i)].data.ptr);
      if (c == nullptr) {  // the wake-up eventfd
        drain_wake(*io);
        continue;
      }
      tl_cork = &cork;
      on_event(c, events[static_cast<size_t>(i)].events, buf, ended);
      sink_->issue_ready();  // closed loop: the next call goes out from here
      uncork(cork, ended);
    }
    if (n <= 0) {
      tl_cork = &cork;
      sink_->issue_ready();
      uncork(cork, ended);
    }
    for (Conn* c : io->conns) {
      if (c->inbox.load(std::memory_order_acquire) != nullptr) take_inbox(c);
    }
    const int64_t now = now_ns();
    if (now >= next_scan) {
      expire(io, now);
      next_scan = now + (s_.timeout_ns > 0 ? 1'000'000 : 50'000'000);
    }
  }
}

void GrpcClient::close() noexcept {
  if (closing_.exchange(true)) return;
  join_io_threads();
  for (auto& c : conns_) {
    std::lock_guard<std::mutex> lock(c->mu);
    std::vector<Ended> dropped;  // the engine has resolved their queries
    c->ended = &dropped;
    if (c->state.load() != Conn::kClosed || c->fd >= 0) close_conn(c.get(), "closed");
    c->ended = nullptr;
    c->spare.clear();
    for (InboxNode* node = c->inbox.exchange(nullptr); node != nullptr;) {  // their queries are resolved
      InboxNode* next = node->next;
      delete node;
      node = next;
    }
  }
  close_checks();
}

}  // namespace

std::unique_ptr<NetClient> make_grpc_client(const NetClientSettings& settings) {
  return std::make_unique<GrpcClient>(settings);
}

// ---- one unary call, waited for (prepare time)

namespace {

// The socket (and its TLS) of a unary call, each step waiting (poll) until `deadline_`.
class BlockingConn {
 public:
  explicit BlockingConn(int64_t deadline) : deadline_(deadline) {}
  ~BlockingConn() {
    tls_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  // "" once connected (TLS: handshake made), else why not.
  std::string open(const NetClientSettings& s, TlsContext* ctx) {
    int err = 0;
    fd_ = netio::connect_nonblocking(s.host, s.port, &err);
    if (fd_ >= 0) err = netio::finish_connect(fd_, left());
    if (err != 0) return "failed to connect to " + s.host + ":" + std::to_string(s.port) + ": " + errno_text(err);
    if (ctx == nullptr) return "";
    tls_ = std::make_unique<TlsConn>(*ctx, fd_, s.server_name.empty() ? s.host : s.server_name);
    if (tls_->handshake_blocking(left()) != TlsStatus::kOk) return "TLS handshake: " + tls_->error();
    return "";
  }
  // All of `data` sent: false (why_ says why) when it could not be.
  bool write_all(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      size_t n = 0;
      TlsStatus st = TlsStatus::kOk;
      if (tls_) {
        st = tls_->write(data.data() + off, data.size() - off, &n);
      } else {
        const ssize_t w = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w >= 0) n = static_cast<size_t>(w);
        st = w >= 0 ? TlsStatus::kOk : (errno == EAGAIN || errno == EINTR) ? TlsStatus::kWantWrite : TlsStatus::kError;
        if (w < 0 && st == TlsStatus::kError) why_ = "lost while sending: " + errno_text(errno);
      }
      if (st == TlsStatus::kOk) {
        off += n;
      } else if (st == TlsStatus::kError || st == TlsStatus::kClosed || !wait(st)) {
        if (tls_ && why_.empty()) why_ = "lost while sending: " + tls_->error();
        return false;
      }
    }
    return true;
  }
  // Some bytes read into buf (> 0), or 0 at the end of the stream, or -1 (why_ says why).
  ssize_t read_some(char* buf, size_t len) {
    for (;;) {
      size_t n = 0;
      TlsStatus st = TlsStatus::kOk;
      if (tls_) {
        st = tls_->read(buf, len, &n);
        if (st == TlsStatus::kError) why_ = "lost while reading: " + tls_->error();
      } else {
        const ssize_t r = ::recv(fd_, buf, len, MSG_DONTWAIT);
        if (r > 0) n = static_cast<size_t>(r);
        st = r > 0 ? TlsStatus::kOk : r == 0 ? TlsStatus::kClosed
             : (errno == EAGAIN || errno == EINTR) ? TlsStatus::kWantRead : TlsStatus::kError;
        if (st == TlsStatus::kError) why_ = "lost while reading: " + errno_text(errno);
      }
      if (st == TlsStatus::kOk) return static_cast<ssize_t>(n);
      if (st == TlsStatus::kClosed) return 0;
      if (st == TlsStatus::kError || !wait(st)) return -1;
    }
  }
  const std::string& why() const { return why_; }
  bool timed_out() const { return timed_out_; }

 private:
  int64_t left() const { return std::max<int64_t>(0, deadline_ - now_ns()); }
  // Waits for the readiness `st` asks for; false at the deadline.
  bool wait(TlsStatus st) {
    pollfd p{fd_, static_cast<short>(st == TlsStatus::kWantWrite ? POLLOUT : POLLIN), 0};
    for (;;) {
      const int64_t ns = left();
      if (ns <= 0) break;
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ns / 1'000'000 + 1, 1000)));
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) break;
    }
    timed_out_ = true;
    why_ = "no answer in time";
    return false;
  }
  int64_t deadline_;
  int fd_ = -1;
  std::unique_ptr<TlsConn> tls_;
  std::string why_;
  bool timed_out_ = false;
};

struct UnaryCall {
  Call call;
  std::string framed;
  int64_t max_bytes = 0;
  bool closed = false;
  uint32_t error_code = NGHTTP2_NO_ERROR;
};

int unary_header(nghttp2_session* session, const nghttp2_frame* frame, const uint8_t* name, size_t namelen,
                 const uint8_t* value, size_t valuelen, uint8_t, void* user_data) {
  if (frame->hd.type == NGHTTP2_HEADERS) {
    take_header(static_cast<UnaryCall*>(user_data)->call, name, namelen, value, valuelen);
  }
  (void)session;
  return 0;
}

int unary_data(nghttp2_session* session, uint8_t, int32_t stream_id, const uint8_t* data, size_t len, void* user_data) {
  auto* u = static_cast<UnaryCall*>(user_data);
  if (u->call.too_large) return 0;
  if (u->call.body.size() + len > static_cast<size_t>(u->max_bytes) + 5) {
    u->call.too_large = true;
    u->call.grpc_message = "a response over " + std::to_string(u->max_bytes) + " bytes";
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
    return 0;
  }
  u->call.body.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int unary_close(nghttp2_session*, int32_t, uint32_t error_code, void* user_data) {
  auto* u = static_cast<UnaryCall*>(user_data);
  u->closed = true;
  u->error_code = error_code;
  return 0;
}

ssize_t unary_body(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* data_flags,
                   nghttp2_data_source* source, void*) {
  auto* u = static_cast<UnaryCall*>(source->ptr);
  const size_t n = std::min(length, u->framed.size() - u->call.offset);
  std::memcpy(buf, u->framed.data() + u->call.offset, n);
  u->call.offset += n;
  if (u->call.offset == u->framed.size()) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

// The session's callbacks and the session, freed together.
struct UnarySession {
  nghttp2_session_callbacks* callbacks = nullptr;
  nghttp2_session* session = nullptr;
  ~UnarySession() {
    if (session != nullptr) nghttp2_session_del(session);
    if (callbacks != nullptr) nghttp2_session_callbacks_del(callbacks);
  }
};

}  // namespace

GrpcUnaryResult grpc_unary_call(const NetClientSettings& settings, const std::string& method,
                                const std::string& request, int64_t timeout_ns) {
  NetClientSettings s = settings;
  s.protocol = NetProtocol::kGrpc;
  s.grpc_method = method;
  s.requests = {request};
  validate(s);
  require(timeout_ns > 0, "timeout_ns must be > 0, got " + std::to_string(timeout_ns));
  require(request.size() < (uint64_t{1} << 32), "request: a gRPC message over 4 GiB");
  std::unique_ptr<TlsContext> ctx;
  if (s.tls) ctx = std::make_unique<TlsContext>(s.ca_file, s.insecure, "h2");  // throws: a CA file that does not load
  if (s.authority.empty()) {
    s.authority = (s.host.find(':') != std::string::npos ? "[" + s.host + "]" : s.host) + ":" + std::to_string(s.port);
  }
  BlockingConn conn(now_ns() + timeout_ns);
  std::string why = conn.open(s, ctx.get());
  if (!why.empty()) return {kUnavailable, why};

  UnaryCall u;
  u.max_bytes = s.max_response_bytes;
  const uint32_t n = static_cast<uint32_t>(request.size());
  u.framed = std::string{'\0', static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                         static_cast<char>(n)} + request;
  UnarySession us;
  nghttp2_session_callbacks_new(&us.callbacks);
  nghttp2_session_callbacks_set_on_header_callback(us.callbacks, &unary_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(us.callbacks, &unary_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(us.callbacks, &unary_close);
  if (nghttp2_session_client_new(&us.session, us.callbacks, &u) != 0) return {kInternal, "failed to start HTTP/2"};
  const nghttp2_settings_entry entries[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
  nghttp2_submit_settings(us.session, NGHTTP2_FLAG_NONE, entries, 1);
  std::vector<std::pair<std::string, std::string>> fields = {
      {":method", "POST"}, {":scheme", s.tls ? "https" : "http"}, {":path", s.grpc_method}, {":authority", s.authority},
      {"content-type", "application/grpc"}, {"te", "trailers"}, {"user-agent", "loadgen-native-grpc"}};
  fields.insert(fields.end(), s.metadata.begin(), s.metadata.end());
  std::vector<nghttp2_nv> nva;
  for (const auto& [name, value] : fields) nva.push_back(header(name, value));
  nghttp2_data_provider body;
  body.source.ptr = &u;
  body.read_callback = &unary_body;
  if (nghttp2_submit_request(us.session, nullptr, nva.data(), nva.size(), &body, nullptr) < 0) {
    return {kInternal, "failed to submit the call"};
  }
  std::vector<char> buf(kReadChunk);
  while (!u.closed) {
    std::string out;
    for (;;) {
      const uint8_t* data = nullptr;
      const ssize_t k = nghttp2_session_mem_send(us.session, &data);
      if (k < 0) return {kInternal, std::string("HTTP/2: ") + nghttp2_strerror(static_cast<int>(k))};
      if (k == 0) break;
      out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(k));
    }
    if (!conn.write_all(out)) return {conn.timed_out() ? kDeadlineExceeded : kUnavailable, conn.why()};
    if (u.closed) break;
    const ssize_t r = conn.read_some(buf.data(), buf.size());
    if (r < 0) return {conn.timed_out() ? kDeadlineExceeded : kUnavailable, conn.why()};
    if (r == 0) return {kUnavailable, "the server closed the connection before the call ended"};
    const ssize_t used = nghttp2_session_mem_recv(us.session, reinterpret_cast<const uint8_t*>(buf.data()),
                                                  static_cast<size_t>(r));
    if (used < 0) return {kInternal, std::string("HTTP/2: ") + nghttp2_strerror(static_cast<int>(used))};
  }
  Ended e;
  judge_end(u.call, u.error_code, &e);
  if (e.what == Ended::kNoMessage) return {kInternal, "no response message"};
  return {e.code, std::move(e.text)};
}

#endif  // LOADGEN_HAVE_NGHTTP2

}  // namespace loadgen
