#include "http_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>

#include "affinity.h"
#include "clock.h"
#include "http_parser.h"
#include "native_suts.h"
#include "require.h"
#include "sse.h"

namespace loadgen {

using detail::require;

using netio::connect_kind;
using netio::errno_text;

namespace {

constexpr size_t kReadChunk = 64 * 1024;
// Reads of one connection per readiness event (1 MiB): then the other connections and
// the timeout scan get their turn.
constexpr int kMaxReadsPerEvent = 16;
// write_some()'s error for a TLS failure (the TlsConn's error() says what): no errno.
constexpr int kTlsFailed = -1;

// `text` cut to 200 bytes, with CR, LF, tabs and other control bytes written as escapes.
std::string shown(const std::string& text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < text.size() && i < 200; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > 200) out += "...";
  return out;
}

// Throws unless `request` starts with a request line "METHOD SP target SP HTTP/1.x CRLF"
// whose method and target hold no space, CR, LF or other control byte: the bytes go to
// the server as they are, and a raw space or line break in the target would be read as
// the end of the line (a different request, or headers of the sender's making).
void require_request_line(const std::string& request, size_t index) {
  const size_t eol = request.find("\r\n");
  const std::string line = request.substr(0, eol == std::string::npos ? request.size() : eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = line.rfind(' ');
  const bool framed = eol != std::string::npos && sp1 != std::string::npos && sp1 > 0 && sp2 > sp1 + 1 &&
                      line.compare(sp2 + 1, std::string::npos, "HTTP/1.1") == 0;
  if (!framed) {  // a line break in the path ends the line early: what is left has no version
    // What the path's line break left of the line (not the headers after it: they may
    // hold credentials).
    std::string rest;
    if (eol != std::string::npos) {
      const size_t next = request.find("\r\n", eol + 2);
      rest = "\\r\\n" + shown(request.substr(eol + 2, std::min<size_t>(next - eol - 2, 60)));
    }
    throw std::invalid_argument("net.requests[" + std::to_string(index) + "]: the request line '" + shown(line) +
                                rest + "' is not a method, a space, a path, a space and HTTP/1.1: a raw CR or LF "
                                "in the path is not allowed; percent-encode it");
  }
  for (size_t i = 0; i < sp2; ++i) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    if (i != sp1 && (c <= 0x20 || c == 0x7f)) {
      throw std::invalid_argument("net.requests[" + std::to_string(index) + "]: the path '" +
                                  shown(line.substr(sp1 + 1, sp2 - sp1 - 1)) +
                                  "' holds a raw space, tab or control byte; percent-encode it (a space is %20)");
    }
  }
}

}  // namespace

void validate_http1(const NetClientSettings& s) {
  for (size_t i = 0; i < s.requests.size(); ++i) require_request_line(s.requests[i], i);
}

namespace {
constexpr int64_t kHighestFigure = 3'600'000'000'000;  // the Python client's histograms' bound
}  // namespace

SseFigures::SseFigures(int significant_figures)
    : itl_ns(1, kHighestFigure, significant_figures),
      tokens_per_s_milli(1, kHighestFigure, significant_figures),
      input_length_tokens(1, kHighestFigure, significant_figures),
      output_length_tokens(1, kHighestFigure, significant_figures),
      stream(significant_figures) {}

GroupFigures::GroupFigures(int significant_figures)
    : latency_ns(1, kHighestFigure, significant_figures), ttft_ns(1, kHighestFigure, significant_figures) {}

void GroupFigures::record(int64_t scheduled_ns, int64_t first_ns, int64_t t_ns, int64_t n) noexcept {
  ++answered;
  output_tokens += n;
  latency_ns.record(std::max<int64_t>(1, t_ns - scheduled_ns));
  if (first_ns != 0) ttft_ns.record(std::max<int64_t>(1, first_ns - scheduled_ns));
}

void GroupFigures::add(const GroupFigures& other) {
  sent += other.sent;
  answered += other.answered;
  output_tokens += other.output_tokens;
  latency_ns.add(other.latency_ns);
  ttft_ns.add(other.ttft_ns);
}

struct HttpClient::Conn {
  enum State { kClosed, kConnecting, kHandshaking, kIdle, kBusy };
  explicit Conn(const HttpParserLimits& limits) : parser(limits) {}
  std::mutex mu;
  int fd = -1;
  Io* io = nullptr;
  std::atomic<State> state{kClosed};  // written under mu; read without it to pick a closed one
  int64_t query = -1;
  int64_t deadline = 0;          // the query's timeout (0: none)
  int64_t connect_deadline = 0;  // kConnecting
  const std::string* req = nullptr;
  size_t written = 0;
  HttpResponseParser parser;
  // The query in progress: its sample index, scheduled time and input tokens (-1: not
  // known), and its one-off request (add_request()) when it has one.
  int64_t sample = 0;
  int64_t scheduled = 0;
  int64_t n_input = -1;
  int32_t group = -1;  // its request's group (request_groups; -1: none)
  std::string own_req;
  // sse: the stream of the query in progress; with check_each, its bytes (kept).
  std::unique_ptr<SseScanner> sse;
  std::string kept;
  int64_t read_t = 0;           // when the bytes being parsed arrived
  bool first_reported = false;  // its first token went to the sink
  bool sse_over = false;        // an event went over the limit: the rest is not read
  // TLS: the connection's session; what its last read and write wait for; the epoll
  // events asked for.
  std::unique_ptr<TlsConn> tls;
  bool read_wants_write = false;
  bool write_wants_read = false;
  uint32_t interest = 0;
};

struct HttpClient::Io : IoThread {
  std::vector<Conn*> conns;
  // sse: the figures of the streams this thread completed; the lock is this thread's
  // but for a reader's copy (sse_figures()), so taking it costs no contention.
  mutable std::mutex fig_mu;
  std::unique_ptr<SseFigures> fig;
  std::map<int64_t, int64_t> output_lengths;
  // The token events of the stream that ended last (for its record), copied from its
  // connection's scanner, which the next request may reuse before the completion; their
  // capacity is kept from one stream to the next.
  std::vector<int64_t> end_event_ns;
  std::vector<int64_t> end_event_tokens;
};

HttpClient::HttpClient(NetClientSettings settings)
    : NetClient(settings.cache_entries, settings.cache_body_bytes, !settings.sse && !settings.check_each),
      s_(std::move(settings)) {
  require(s_.protocol == NetProtocol::kHttp1, "the HTTP/1.1 client needs net.protocol http1");
  validate(s_);
  if (s_.tls) {
    if (s_.server_name.empty()) s_.server_name = s_.host;
    tls_ = std::make_unique<TlsContext>(s_.ca_file, s_.insecure, "http/1.1");
  }
  group_sent_ = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(s_.group_count));
  for (int64_t g = 0; g < s_.group_count; ++g) group_sent_[static_cast<size_t>(g)] = 0;
  HttpParserLimits limits;
  limits.max_body_bytes = s_.max_response_bytes;
  const int64_t nio = std::min<int64_t>(s_.io_threads, s_.connections);
  for (int64_t i = 0; i < nio; ++i) {
    auto io = std::make_unique<Io>();
    open_io_thread(io.get(), "http client");
    if (s_.sse || s_.whole_answers) {
      io->fig = std::make_unique<SseFigures>(s_.significant_figures);
      io->fig->groups.assign(static_cast<size_t>(s_.group_count), GroupFigures(s_.significant_figures));
    }
    ios_.push_back(std::move(io));
  }
  for (int64_t i = 0; i < s_.connections; ++i) {
    auto c = std::make_unique<Conn>(limits);
    c->io = ios_[static_cast<size_t>(i) % ios_.size()].get();
    c->io->conns.push_back(c.get());
    if (s_.sse) {
      // Body pieces go to the scanner as they arrive, stamped with their read's time.
      c->sse = std::make_unique<SseScanner>(s_.max_response_bytes, s_.sse_responses);
      Conn* raw = c.get();
      const bool keep = s_.check_each;
      c->parser.set_body_callback([raw, keep](const char* data, size_t n) {
        if (raw->sse_over) return;
        if (keep) raw->kept.append(data, n);
        if (!raw->sse->feed(data, n, raw->read_t)) raw->sse_over = true;
      });
    }
    conns_.push_back(std::move(c));
  }
}

HttpClient::~HttpClient() {
  close();
  close_io_threads();
}

bool HttpClient::open(Conn* c, std::string* error, int* err) {
  const int fd = netio::connect_nonblocking(s_.host, s_.port, err);
  if (fd < 0) {
    *error = errno_text(*err);
    return false;
  }
  c->fd = fd;
  c->state = Conn::kConnecting;
  c->connect_deadline = now_ns() + s_.connect_timeout_ns;
  return true;
}

bool HttpClient::connect_blocking(Conn* c, int64_t timeout_ns) {
  std::string error;
  int err = 0;
  if (!open(c, &error, &err)) return false;
  if (netio::finish_connect(c->fd, timeout_ns) != 0 || (tls_ && !handshake_blocking(c))) {
    c->tls.reset();
    ::close(c->fd);
    c->fd = -1;
    c->state = Conn::kClosed;
    return false;
  }
  c->state = Conn::kIdle;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = c;
  c->interest = ev.events;
  epoll_ctl(c->io->epfd, EPOLL_CTL_ADD, c->fd, &ev);
  return true;
}

bool HttpClient::handshake_blocking(Conn* c) noexcept {
  try {
    c->tls = std::make_unique<TlsConn>(*tls_, c->fd, s_.server_name);
  } catch (const std::exception&) {
    return false;
  }
  if (c->tls->handshake_blocking(s_.connect_timeout_ns) != TlsStatus::kOk) return false;
  count_handshake(c);
  // TLS 1.3 sends the session after the handshake: the first connection waits for it
  // (briefly), so that the others resume it.
  if (!tls_->has_session()) c->tls->await_ticket(std::min<int64_t>(s_.connect_timeout_ns, kTicketWaitNs));
  return true;
}

void HttpClient::count_handshake(Conn* c) noexcept {
  tls_handshakes_.fetch_add(1, std::memory_order_relaxed);
  if (c->tls->resumed()) tls_resumed_.fetch_add(1, std::memory_order_relaxed);
}

void HttpClient::drop_socket(Conn* c) noexcept {
  if (c->fd < 0) return;
  epoll_ctl(c->io->epfd, EPOLL_CTL_DEL, c->fd, nullptr);
  c->tls.reset();
  ::close(c->fd);
  c->fd = -1;
  c->read_wants_write = c->write_wants_read = false;
  c->interest = 0;
}

void HttpClient::update_interest(Conn* c) noexcept {
  const bool writing = c->state == Conn::kBusy && c->req != nullptr && c->written < c->req->size();
  uint32_t want = EPOLLIN | EPOLLRDHUP;
  if ((writing && !c->write_wants_read) || c->read_wants_write) want |= EPOLLOUT;
  if (want == c->interest || c->fd < 0) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.ptr = c;
  epoll_ctl(c->io->epfd, EPOLL_CTL_MOD, c->fd, &ev);
  c->interest = want;
}

void HttpClient::step_handshake(Conn* c, EventOutcome* out) noexcept {
  const TlsStatus st = c->tls->handshake();
  if (st == TlsStatus::kWantRead || st == TlsStatus::kWantWrite) {
    const uint32_t want = EPOLLRDHUP | (st == TlsStatus::kWantRead ? EPOLLIN : EPOLLOUT);
    if (want != c->interest) {
      epoll_event ev{};
      ev.events = want;
      ev.data.ptr = c;
      epoll_ctl(c->io->epfd, EPOLL_CTL_MOD, c->fd, &ev);
      c->interest = want;
    }
    return;
  }
  if (st != TlsStatus::kOk) {
    const std::string why = c->tls->error();
    const int err = c->tls->sys_errno();
    if (err != 0) {
      connect_failed(c, err, why);
    } else {
      connect_failed(c, 0, why, "tls_error");
    }
    return;
  }
  count_handshake(c);
  connects_.fetch_add(1, std::memory_order_relaxed);
  c->state = Conn::kIdle;
  update_interest(c);
  out->reuse = true;
}

void HttpClient::start(CompletionSink& sink) {
  sink_ = &sink;
  const int64_t warm = std::min(s_.warm_connections, s_.connections);
  for (int64_t i = 0; i < warm; ++i) {
    Conn* c = conns_[static_cast<size_t>(i)].get();
    std::lock_guard<std::mutex> lock(c->mu);
    if (connect_blocking(c, s_.connect_timeout_ns)) {
      open_.fetch_add(1);
      warm_.fetch_add(1);
      connects_.fetch_add(1);
      std::lock_guard<std::mutex> pool(pool_mutex_);
      idle_.push_back(c);
    }
  }
  // The most recently used connection first: keep the warm ones in their order.
  std::reverse(idle_.begin(), idle_.end());
  for (auto& io : ios_) {
    Io* p = io.get();
    io->thread = std::thread([this, p] { io_loop(p); });
  }
}

void HttpClient::submit(int64_t id, int64_t sample, int64_t scheduled_ns) noexcept {
  const Pending p{id, sample, s_.timeout_ns > 0 ? scheduled_ns + s_.timeout_ns : 0, scheduled_ns};
  bool one_off = false;
  int32_t group = -1;
  const int64_t n_input = input_tokens_of(sample, &one_off, &group);
  if (n_input > 0) input_tokens_sent_.fetch_add(n_input, std::memory_order_relaxed);
  if (group >= 0) group_sent_[static_cast<size_t>(group)].fetch_add(1, std::memory_order_relaxed);
  if (!one_off && !s_.image_bytes.empty()) {  // a one-off (a conversation's later turn) has none
    images_sent_.fetch_add(s_.images_per_request, std::memory_order_relaxed);
    image_bytes_sent_.fetch_add(s_.image_bytes[static_cast<size_t>(sample) % s_.image_bytes.size()],
                                std::memory_order_relaxed);
  }
  for (;;) {
    Conn* c = nullptr;
    {
      std::lock_guard<std::mutex> pool(pool_mutex_);
      if (pending_.empty() && !idle_.empty()) {
        c = idle_.back();
        idle_.pop_back();
      } else {
        pending_.push_back(p);
        queued_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (c == nullptr) {
      want_connection();
      return;
    }
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->state == Conn::kIdle) {
      send_locked(c, p);
      return;
    }
    // Closed by its I/O thread since it was taken from the idle list: take another.
  }
}

void HttpClient::send_locked(Conn* c, const Pending& p) noexcept {
  c->state = Conn::kBusy;
  c->query = p.id;
  c->deadline = p.deadline;
  c->sample = p.sample;
  c->scheduled = p.scheduled;
  if (!take_one_off(c, p.sample)) {
    c->req = &s_.requests[static_cast<size_t>(p.sample) % s_.requests.size()];
    c->n_input = s_.input_tokens.empty() ? -1
                                         : s_.input_tokens[static_cast<size_t>(p.sample) % s_.input_tokens.size()];
    c->group = group_of(p.sample);
  }
  c->written = 0;
  c->parser.start(s_.head_only);
  if (c->sse) {
    c->sse->start();
    c->kept.clear();
    c->first_reported = false;
    c->sse_over = false;
  }
  const size_t before = c->written;
  const int err = write_some(c);
  bytes_sent_.fetch_add(static_cast<int64_t>(c->written - before), std::memory_order_relaxed);
  if (c->tls && (err == 0 || err == EAGAIN)) {
    update_interest(c);
  } else if (err == EAGAIN) {  // the rest when the socket has room
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    ev.data.ptr = c;
    epoll_ctl(c->io->epfd, EPOLL_CTL_MOD, c->fd, &ev);
  } else if (err != 0) {
    fail_write(c, err);
  }
}

int HttpClient::write_some(Conn* c) noexcept {
  const std::string& r = *c->req;
  while (c->tls && c->written < r.size()) {
    size_t n = 0;
    const TlsStatus st = c->tls->write(r.data() + c->written, r.size() - c->written, &n);
    c->write_wants_read = st == TlsStatus::kWantRead;
    if (st == TlsStatus::kOk) {
      c->written += n;
      continue;
    }
    if (st == TlsStatus::kWantRead || st == TlsStatus::kWantWrite) return EAGAIN;
    return c->tls->sys_errno() != 0 ? c->tls->sys_errno() : kTlsFailed;
  }
  while (c->written < r.size()) {
    const ssize_t n = ::send(c->fd, r.data() + c->written, r.size() - c->written, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c->written += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return EAGAIN;
    return n < 0 ? errno : EPIPE;
  }
  return 0;
}

void HttpClient::fail_write(Conn* c, int err) noexcept {
  if (err == kTlsFailed) {
    const std::string why = c->tls->error();
    close_locked(c, "tls_error", "sending the request: " + why);
  } else if (err == EPIPE || err == ECONNRESET) {
    close_locked(c, "connection_reset", "connection closed by the server before any response");
  } else {
    close_locked(c, "connection_error", "sending the request: " + errno_text(err));
  }
}

void HttpClient::on_writable(Conn* c) noexcept {
  const size_t before = c->written;
  const int err = write_some(c);
  bytes_sent_.fetch_add(static_cast<int64_t>(c->written - before), std::memory_order_relaxed);
  if (c->tls && (err == 0 || err == EAGAIN)) {
    update_interest(c);
  } else if (err == 0) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = c;
    epoll_ctl(c->io->epfd, EPOLL_CTL_MOD, c->fd, &ev);
  } else if (err != EAGAIN) {
    fail_write(c, err);
  }
}

void HttpClient::close_locked(Conn* c, const char* kind, const std::string& message) noexcept {
  const Conn::State was = c->state.load();
  const int64_t query = c->query;
  drop_socket(c);
  c->state = Conn::kClosed;
  c->query = -1;
  if (was == Conn::kClosed) return;
  open_.fetch_sub(1);
  if (was == Conn::kIdle) {
    std::lock_guard<std::mutex> pool(pool_mutex_);
    idle_.erase(std::remove(idle_.begin(), idle_.end(), c), idle_.end());
  }
  if (was == Conn::kBusy && query >= 0 && kind != nullptr && kind[0] != '\0') {
    sink_->fail_native(query, kind, message);
  }
}

void HttpClient::want_connection() noexcept {
  // One connect per call while queries wait and the pool has room; a connect that fails
  // at once fails one waiting query and the next is tried.
  while (!closing_.load(std::memory_order_relaxed)) {
    Conn* pick = nullptr;
    {
      std::lock_guard<std::mutex> pool(pool_mutex_);
      if (pending_.empty() || open_.load() >= s_.connections) return;
      for (auto& c : conns_) {
        if (c->state.load(std::memory_order_acquire) == Conn::kClosed) {
          pick = c.get();
          break;
        }
      }
      if (pick == nullptr) return;
      open_.fetch_add(1);
    }
    std::lock_guard<std::mutex> lock(pick->mu);
    if (pick->state.load() != Conn::kClosed) {  // taken by another caller meanwhile
      open_.fetch_sub(1);
      continue;
    }
    std::string error;
    int err = 0;
    if (!open(pick, &error, &err)) {
      pick->state = Conn::kConnecting;  // connect_failed() counts it closed again
      connect_failed(pick, err, error);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLRDHUP;
    ev.data.ptr = pick;
    epoll_ctl(pick->io->epfd, EPOLL_CTL_ADD, pick->fd, &ev);
    return;
  }
}

void HttpClient::connect_failed(Conn* c, int err, const std::string& what, const char* kind) noexcept {
  // c->mu is held. One waiting query fails per failed connect, as in the asyncio client,
  // so that a dead server fails queries at the rate they arrive.
  drop_socket(c);
  if (c->state.load() != Conn::kClosed) open_.fetch_sub(1);
  c->state = Conn::kClosed;
  connect_failures_.fetch_add(1);
  std::optional<Pending> victim;
  {
    std::lock_guard<std::mutex> pool(pool_mutex_);
    if (!pending_.empty()) {
      victim = pending_.front();
      pending_.pop_front();
    }
  }
  if (victim) {
    sink_->fail_native(victim->id, kind != nullptr ? kind : connect_kind(err),
                       "connecting to " + s_.host + ":" + std::to_string(s_.port) + ": " + what);
  }
}

void HttpClient::release(Conn* c) noexcept {
  // Called by c's own I/O thread, with c idle and in no list: nobody else touches it.
  std::optional<Pending> next;
  {
    std::lock_guard<std::mutex> pool(pool_mutex_);
    const int64_t now = now_ns();
    while (!pending_.empty()) {
      const Pending p = pending_.front();
      pending_.pop_front();
      if (p.deadline == 0 || p.deadline > now) {  // one that timed out waiting is not sent
        next = p;
        break;
      }
      if (one_offs_.load(std::memory_order_acquire) > 0) {
        std::lock_guard<std::mutex> lock(one_off_mutex_);
        one_offs_.fetch_sub(static_cast<int64_t>(one_off_.erase(p.sample)), std::memory_order_release);
      }
    }
    if (!next) {
      idle_.push_back(c);
      return;
    }
  }
  std::lock_guard<std::mutex> lock(c->mu);
  send_locked(c, *next);
}



void HttpClient::end_stream(Conn* c, int64_t t, int status, StreamEnd* out) noexcept {
  SseScanner& s = *c->sse;
  out->id = c->query;
  out->t = t;
  out->status = status;
  out->n_input = c->n_input;
  out->sample = c->sample;
  out->scheduled = c->scheduled;
  if (status != 200) {  // as the asyncio client: the bytes held, not the whole body
    out->problem = static_cast<int>(SseProblem::kHttpStatus);
    out->body = s.held();
    return;
  }
  s.finish(t);
  if (s.first_ns() != 0 && !c->first_reported) {  // the last event held the first token
    c->first_reported = true;
    sink_->first_token_native(c->query, s.first_ns());
  }
  if (s.problem() != SseProblem::kNone) {
    out->problem = static_cast<int>(s.problem());
    out->body = s.problem_data();
    return;
  }
  Io& io = *c->io;
  if (s_.sse_check) {
    // A stream may end at once (the model's first token was its end): 0 tokens, when
    // the server said the choice finished or its usage says 0.
    if (s.chunks() == 0 && !(s.finished() || s.usage_tokens() == 0)) {
      out->problem = static_cast<int>(SseProblem::kNoTokens);
    } else if (!s.done()) {
      out->problem = static_cast<int>(SseProblem::kNoDone);
    }
    std::lock_guard<std::mutex> lock(io.fig_mu);
    ++io.fig->checked;
  }
  if (out->problem != 0) return;
  const bool usage = s.usage_tokens() >= 0;
  const int64_t n = usage ? s.usage_tokens() : s.chunks();
  out->n = n;
  std::lock_guard<std::mutex> lock(io.fig_mu);
  SseFigures& f = *io.fig;
  for (const int64_t gap : s.gaps()) f.itl_ns.record(std::max<int64_t>(gap, 1));
  f.stream.record(s, c->scheduled);
  record_answer(io, n, usage, t - c->scheduled, c->n_input);
  record_group(io, c->group, c->scheduled, s.first_ns(), t, n);
  if (s_.check_each) {  // recorded as any stream; completed by the Python side's check
    out->check = true;
    out->body = std::move(c->kept);
  } else if (sink_->wants_token_events()) {
    out->events = keep_token_events(io, s);
  }
}

bool HttpClient::keep_token_events(Io& io, const SseScanner& s) noexcept {
  try {
    io.end_event_ns.assign(s.event_ns().begin(), s.event_ns().end());
    io.end_event_tokens.resize(io.end_event_ns.size());
  } catch (...) {  // no memory: the record goes without its events
    return false;
  }
  s.event_token_counts(s.usage_tokens(), [&io](size_t j, int64_t k) { io.end_event_tokens[j] = k; });
  return true;
}

void HttpClient::record_answer(Io& io, int64_t n, bool usage, int64_t elapsed_ns, int64_t n_input) noexcept {
  SseFigures& f = *io.fig;
  ++(usage ? f.tokens_from_usage : f.tokens_from_chunks);
  f.output_tokens += n;
  try {
    ++io.output_lengths[n];
  } catch (...) {  // out of memory for a new length: the count is lost, the run goes on
  }
  if (elapsed_ns > 0 && n > 0) {
    // Python's round(n * 1e12 / elapsed): the same double, rounded half to even.
    const double milli = std::nearbyint(static_cast<double>(n) * 1e12 / static_cast<double>(elapsed_ns));
    f.tokens_per_s_milli.record(milli >= 9.2e18 ? INT64_MAX : std::max<int64_t>(1, static_cast<int64_t>(milli)));
  }
  if (n_input > 0) f.input_length_tokens.record(n_input);
  if (n > 0) f.output_length_tokens.record(n);
}

void HttpClient::record_group(Io& io, int32_t group, int64_t scheduled_ns, int64_t first_ns, int64_t t_ns,
                              int64_t n) noexcept {
  if (group >= 0) io.fig->groups[static_cast<size_t>(group)].record(scheduled_ns, first_ns, t_ns, n);
}

void HttpClient::check_whole(Io& io, EventOutcome& out) noexcept {
  WholeAnswer a;
  if (s_.whole_answers && out.done_status == 200 &&
      read_whole_answer(out.done_body.data(), out.done_body.size(), &a)) {
    {
      std::lock_guard<std::mutex> lock(io.fig_mu);
      SseFigures& f = *io.fig;
      if (s_.sse_check) ++f.checked;
      record_answer(io, a.tokens, true, out.done_t - out.done_scheduled, out.done_input);
      record_group(io, out.done_group, out.done_scheduled, 0, out.done_t, a.tokens);
      // The reasoning count is usage's, as the asyncio client records a whole answer's.
      if (a.reasoning_tokens >= 0) {
        ++f.stream.reasoning_from_usage;
        f.stream.reasoning_tokens += a.reasoning_tokens;
        if (a.reasoning_tokens > 0) f.stream.reasoning_length_tokens.record(a.reasoning_tokens);
      }
    }
    sink_->complete_tokens_native(out.done_id, out.done_t, a.tokens, out.done_input);
    return;
  }
  UncheckedResponse u{out.done_id, out.done_t, out.done_status, std::move(out.done_body), 0};
  u.sample = out.done_sample;
  u.scheduled_ns = out.done_scheduled;
  u.input_tokens = out.done_input;
  hand_over(std::move(u));
}

void HttpClient::finish_stream(Io& io, StreamEnd&& e) noexcept {
  if (e.problem == 0 && !e.check && e.events) {
    const TokenEvents events{io.end_event_ns.data(), io.end_event_tokens.data(), io.end_event_ns.size()};
    sink_->complete_stream_native(e.id, e.t, e.n, e.n_input, events);
    return;
  }
  if (e.problem == 0 && !e.check) {
    sink_->complete_tokens_native(e.id, e.t, e.n, e.n_input);
    return;
  }
  UncheckedResponse u{e.id, e.t, e.status, std::move(e.body), e.problem};
  u.sample = e.sample;
  u.scheduled_ns = e.scheduled;
  u.input_tokens = e.n_input;
  u.output_tokens = e.problem == 0 ? e.n : -1;
  hand_over(std::move(u));
}

bool HttpClient::add_request(int64_t sample, std::string request, int64_t input_tokens, int32_t group) {
  if (group < -1 || group >= s_.group_count) group = -1;  // not one of the run's groups: counted in none
  std::lock_guard<std::mutex> lock(one_off_mutex_);
  auto [it, added] = one_off_.insert_or_assign(sample, OneOff{std::move(request), input_tokens, group});
  (void)it;
  if (added) one_offs_.fetch_add(1, std::memory_order_release);
  return true;
}

bool HttpClient::take_one_off(Conn* c, int64_t sample) noexcept {
  if (one_offs_.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(one_off_mutex_);
  auto it = one_off_.find(sample);
  if (it == one_off_.end()) return false;
  c->own_req = std::move(it->second.request);
  c->n_input = it->second.input_tokens;
  c->group = it->second.group;
  c->req = &c->own_req;
  one_off_.erase(it);
  one_offs_.fetch_sub(1, std::memory_order_release);
  return true;
}

int64_t HttpClient::input_tokens_of(int64_t sample, bool* one_off, int32_t* group) noexcept {
  if (one_offs_.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lock(one_off_mutex_);
    auto it = one_off_.find(sample);
    *one_off = it != one_off_.end();
    if (*one_off) {
      *group = it->second.group;
      return it->second.input_tokens;
    }
  }
  *group = group_of(sample);
  return s_.input_tokens.empty() ? -1 : s_.input_tokens[static_cast<size_t>(sample) % s_.input_tokens.size()];
}

void HttpClient::expire(Io* io, int64_t now) noexcept {
  for (Conn* c : io->conns) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->state == Conn::kBusy && c->deadline != 0 && now >= c->deadline) {
      closed_by_timeout_.fetch_add(1, std::memory_order_relaxed);
      close_locked(c, nullptr, "");  // the engine counts the timeout
    } else if (c->state == Conn::kConnecting && now >= c->connect_deadline) {
      connect_failed(c, ETIMEDOUT, "timed out");
    } else if (c->state == Conn::kHandshaking && now >= c->connect_deadline) {
      connect_failed(c, ETIMEDOUT, "the TLS handshake timed out", "tls_error");
    }
  }
}

void HttpClient::io_loop(Io* io) {
  // I/O threads read; they send only in a closed loop (the next request, once a response
  // made room). An open loop's arrivals are sent by the engine's issue thread.
  enter_io_thread(kHttpThreadName, s_.cpus, s_.sched_slice_ns);
  std::vector<epoll_event> events(256);
  std::vector<char> buf(kReadChunk);
  int64_t next_scan = 0;
  while (!closing_.load(std::memory_order_acquire)) {
    const int n = netio::wait_events(io->epfd, events.data(), static_cast<int>(events.size()), kIoWaitNs);
    for (int i = 0; i < n; ++i) {
      Conn* c = static_cast<Conn*>(events[static_cast<size_t>(i)].data.ptr);
      if (c == nullptr) {  // the wake-up eventfd
        drain_wake(*io);
        continue;
      }
      on_event(c, events[static_cast<size_t>(i)].events, buf);
    }
    if (n <= 0) sink_->issue_ready();  // room made elsewhere (a timeout, the checker)
    const int64_t now = now_ns();
    if (now >= next_scan) {
      expire(io, now);
      // Every connection's lock is taken per scan: with thousands of long streams a scan
      // each millisecond cost more than their reads. Query timeouts want the millisecond;
      // connect timeouts (seconds) do with 50 ms.
      next_scan = now + (s_.timeout_ns > 0 ? 1'000'000 : 50'000'000);
    }
  }
}

void HttpClient::on_event(Conn* c, uint32_t ev, std::vector<char>& buf) noexcept {
  // A finished response's query is judged after the connection's lock is released and
  // the connection is back in the pool (so that the query it makes room for can use it
  // at once).
  EventOutcome out;
  {
    std::unique_lock<std::mutex> lock(c->mu);
    if (c->state == Conn::kConnecting) {
      on_connected(c, ev, &out);
    } else if (c->state == Conn::kHandshaking) {
      step_handshake(c, &out);
    } else if (c->tls) {
      // A TLS write may wait for the socket to be readable, a read for it to be writable.
      const bool writing = c->state == Conn::kBusy && c->req != nullptr && c->written < c->req->size();
      if (writing && ((ev & EPOLLOUT) || (c->write_wants_read && (ev & EPOLLIN)))) on_writable(c);
      if (c->fd >= 0 && ((ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) || (c->read_wants_write && (ev & EPOLLOUT)))) {
        read_tls(c, buf, &out);
      }
    } else {
      if ((ev & EPOLLOUT) && c->state == Conn::kBusy && c->req != nullptr && c->written < c->req->size()) {
        on_writable(c);
      }
      if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) read_responses(c, buf, &out);
    }
  }
  if (out.reuse) release(c);
  if (out.done_id >= 0 && s_.check_each) {
    check_whole(*c->io, out);
  } else if (out.done_id >= 0) {
    judge(out.done_id, out.done_t, out.done_status, std::move(out.done_body));
  }
  if (out.stream_end.id >= 0) finish_stream(*c->io, std::move(out.stream_end));
  if (c->state.load() == Conn::kClosed) want_connection();  // for queries waiting, if any
  sink_->issue_ready();  // closed loop: the next request goes out from here
}

void HttpClient::on_connected(Conn* c, uint32_t ev, EventOutcome* out) noexcept {
  int so_error = 0;
  socklen_t sl = sizeof(so_error);
  getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &so_error, &sl);
  if (so_error != 0 || (ev & (EPOLLERR | EPOLLHUP))) {
    const int err = so_error != 0 ? so_error : ECONNREFUSED;
    connect_failed(c, err, errno_text(err));
  } else if ((ev & EPOLLOUT) && tls_) {
    try {
      c->tls = std::make_unique<TlsConn>(*tls_, c->fd, s_.server_name);
    } catch (const std::exception& e) {
      connect_failed(c, 0, e.what(), "tls_error");
      return;
    }
    c->state = Conn::kHandshaking;
    c->interest = EPOLLOUT | EPOLLRDHUP;
    step_handshake(c, out);
  } else if (ev & EPOLLOUT) {
    connects_.fetch_add(1, std::memory_order_relaxed);
    c->state = Conn::kIdle;
    epoll_event mod{};
    mod.events = EPOLLIN | EPOLLRDHUP;
    mod.data.ptr = c;
    epoll_ctl(c->io->epfd, EPOLL_CTL_MOD, c->fd, &mod);
    out->reuse = true;
  }
}

void HttpClient::read_responses(Conn* c, std::vector<char>& buf, EventOutcome* out) noexcept {
  // Read until the socket is drained (or the connection ends), at most kMaxReadsPerEvent
  // reads: a server that writes faster than this thread reads (an endless stream of
  // blank lines) would otherwise hold it here for good, its timeout and the other
  // connections unseen (epoll reports the rest).
  for (int reads = 0; c->fd >= 0 && reads < kMaxReadsPerEvent; ++reads) {
    int64_t kernel_t = 0;
    const ssize_t r = netio::read_stamped(c->fd, buf.data(), buf.size(), &kernel_t);
    const int err = r < 0 ? errno : 0;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) break;
    const int64_t t = now_ns();
    note_receive_wait(*c->io, t, kernel_t);
    if (r > 0 && c->state == Conn::kBusy && c->deadline != 0 && t >= c->deadline) {
      // Bytes still coming past the query's timeout: the connection goes now, as
      // expire() would close it (the engine counts the timeout).
      closed_by_timeout_.fetch_add(1, std::memory_order_relaxed);
      close_locked(c, nullptr, "");
      break;
    }
    if (r < 0) {
      close_after_read_error(c, err);
      break;
    }
    if (r == 0) {  // the server closed the connection
      close_at_eof(c, t, out);
      break;
    }
    if (!parse_read(c, buf.data(), static_cast<size_t>(r), t, static_cast<size_t>(r) == buf.size(), out)) break;
  }
}

void HttpClient::read_tls(Conn* c, std::vector<char>& buf, EventOutcome* out) noexcept {
  // As read_responses(), over TLS (the kernel's receive stamps kept by the TLS layer's
  // socket reads); a read that fills no buffer ends the event only once OpenSSL holds
  // nothing more (what it holds, epoll cannot report).
  for (int reads = 0; c->fd >= 0 && reads < kMaxReadsPerEvent; ++reads) {
    size_t n = 0;
    const TlsStatus st = c->tls->read(buf.data(), buf.size(), &n);
    c->read_wants_write = st == TlsStatus::kWantWrite;
    if (st == TlsStatus::kWantRead || st == TlsStatus::kWantWrite) break;
    const int64_t t = now_ns();
    if (st == TlsStatus::kOk) note_receive_wait(*c->io, t, c->tls->take_kernel_ns());
    if (st == TlsStatus::kOk && c->state == Conn::kBusy && c->deadline != 0 && t >= c->deadline) {
      closed_by_timeout_.fetch_add(1, std::memory_order_relaxed);
      close_locked(c, nullptr, "");
      break;
    }
    if (st == TlsStatus::kError) {
      const int err = c->tls->sys_errno();
      if (err != 0) {
        close_after_read_error(c, err);
      } else {
        const std::string why = c->tls->error();
        close_locked(c, "tls_error", "reading the response: " + why);
      }
      break;
    }
    if (st == TlsStatus::kClosed) {
      close_at_eof(c, t, out);
      break;
    }
    if (!parse_read(c, buf.data(), n, t, n == buf.size() || c->tls->pending(), out)) break;
  }
  if (c->fd >= 0) update_interest(c);
}

void HttpClient::close_after_read_error(Conn* c, int err) noexcept {
  const bool any = c->parser.got_bytes();
  if (err == ECONNRESET) {
    close_locked(c, "connection_reset",
                 std::string("connection reset by peer ") +
                     (any ? "before the response was complete" : "before any response"));
  } else {
    close_locked(c, "connection_error", "reading the response: " + errno_text(err));
  }
}

void HttpClient::close_at_eof(Conn* c, int64_t t, EventOutcome* out) noexcept {
  if (c->state == Conn::kBusy && c->parser.eof_completes()) {
    take_response(c, t, out);
    c->query = -1;
    close_locked(c, nullptr, "");
    return;
  }
  const bool any = c->parser.got_bytes();
  close_locked(c, "connection_reset",
               std::string("connection closed by the server ") +
                   (any ? "before the response was complete" : "before any response"));
}

bool HttpClient::parse_read(Conn* c, const char* data, size_t n, int64_t t, bool filled,
                            EventOutcome* out) noexcept {
  if (c->state != Conn::kBusy) {  // bytes nobody asked for: the connection is unusable
    close_locked(c, nullptr, "");
    return false;
  }
  size_t used = 0;
  c->read_t = t;
  const auto res = c->parser.feed(data, n, &used);
  if (c->sse && sse_read(c, &out->stream_end)) return false;  // an event over the limit comes first
  // A short read drained the socket: epoll is level-triggered and says when more comes,
  // so the read that would only return EAGAIN is saved (a stream's events come one or
  // two to a read: that read was a third of the syscalls).
  if (res == HttpResponseParser::Result::kNeedMore) return filled;
  if (res == HttpResponseParser::Result::kError) {
    close_locked(c, c->parser.error_kind().c_str(), c->parser.error_message());
    return false;
  }
  // A whole response. Bytes past it put the connection out of step.
  take_response(c, t, out);
  const bool keep = c->parser.keep_alive() && used == n;
  c->query = -1;
  if (keep) {
    c->state = Conn::kIdle;
    out->reuse = true;
  } else {
    close_locked(c, nullptr, "");
  }
  return false;
}

void HttpClient::take_response(Conn* c, int64_t t, EventOutcome* out) noexcept {
  if (c->sse) {
    end_stream(c, t, c->parser.status(), &out->stream_end);
  } else {
    out->done_id = c->query;
    out->done_t = t;
    out->done_status = c->parser.status();
    out->done_body = c->parser.take_body();
    out->done_sample = c->sample;
    out->done_scheduled = c->scheduled;
    out->done_input = c->n_input;
    out->done_group = c->group;
  }
  responses_.fetch_add(1, std::memory_order_relaxed);
}

void HttpClient::close() noexcept {
  if (closing_.exchange(true)) return;
  join_io_threads();
  for (auto& c : conns_) {
    std::lock_guard<std::mutex> lock(c->mu);
    drop_socket(c.get());
    c->state = Conn::kClosed;
  }
  close_checks();
}

bool HttpClient::sse_read(Conn* c, StreamEnd* out) noexcept {
  SseScanner& s = *c->sse;
  if (s.first_ns() != 0 && !c->first_reported) {  // before an event over the limit, as in Python
    c->first_reported = true;
    sink_->first_token_native(c->query, s.first_ns());
  }
  if (c->sse_over) {  // the rest of the stream cannot be skipped reliably: the connection goes
    out->id = c->query;
    out->t = c->read_t;
    out->status = c->parser.status();
    out->problem = static_cast<int>(SseProblem::kTooLarge);
    out->body = std::to_string(s.held_over());
    out->sample = c->sample;
    out->scheduled = c->scheduled;
    c->query = -1;
    close_locked(c, nullptr, "");
    return true;
  }
  return false;
}

SseFigures HttpClient::sse_figures() const {
  SseFigures out(s_.significant_figures);
  out.groups.assign(static_cast<size_t>(s_.group_count), GroupFigures(s_.significant_figures));
  std::map<int64_t, int64_t> lengths;
  for (const auto& io : ios_) {
    if (!io->fig) continue;
    std::lock_guard<std::mutex> lock(io->fig_mu);
    const SseFigures& f = *io->fig;
    out.itl_ns.add(f.itl_ns);
    out.tokens_per_s_milli.add(f.tokens_per_s_milli);
    out.input_length_tokens.add(f.input_length_tokens);
    out.output_length_tokens.add(f.output_length_tokens);
    out.tokens_from_usage += f.tokens_from_usage;
    out.tokens_from_chunks += f.tokens_from_chunks;
    out.output_tokens += f.output_tokens;
    out.checked += f.checked;
    out.stream.add(f.stream);
    for (const auto& [n, count] : io->output_lengths) lengths[n] += count;
    for (size_t g = 0; g < f.groups.size(); ++g) out.groups[g].add(f.groups[g]);
  }
  for (size_t g = 0; g < out.groups.size(); ++g) out.groups[g].sent = group_sent_[g].load(std::memory_order_relaxed);
  out.output_lengths.assign(lengths.begin(), lengths.end());
  out.input_tokens_sent = input_tokens_sent_.load();
  out.images_sent = images_sent_.load();
  out.image_bytes_sent = image_bytes_sent_.load();
  return out;
}

}  // namespace loadgen
