// A native OpenAI chat-completions streaming server whose record is the truth of
// bench/bench_llm_streams.py: one thread, epoll, non-blocking sockets, a timer heap.
//
//   truth_server --port 0 [--ttft-ms 50] [--itl-ms 10] [--tokens 32] [--tokens-per-chunk 1]
//                [--first-chunk-tokens K] [--no-usage] [--max-runtime-s 600] [--cpu N]
//                [--realtime-priority P]
//
// It binds 127.0.0.1, prints "PORT <n>" once listening, and serves until SIGTERM/SIGINT
// or --max-runtime-s. Endpoints (keep-alive HTTP/1.1, Content-Length bodies):
//   POST /v1/chat/completions  "stream": true: Server-Sent Events, chunked; else one
//                              chat.completion when its last token is due
//   GET  /v1/models            the model "scripted"
//   GET  /stats                the record, in tests/servers/scripted.py's shape, each
//                              stream with its writes' lateness too (write_late_ns)
//
// Timing as scripted.py's: token i of an answer is due at recv + ttft + i * itl on
// CLOCK_MONOTONIC (Python's time.monotonic_ns()), recv being when the kernel received the
// request's last bytes (SO_TIMESTAMPNS, moved from CLOCK_REALTIME to CLOCK_MONOTONIC). An
// event carries --tokens-per-chunk tokens (the first one --first-chunk-tokens) and is
// written when its last token is due. Each stream has one timer, its next event, in a
// min-heap; a timerfd armed at the heap's earliest due time (absolute, nanoseconds) wakes
// epoll_wait, with the timer slack set to 1 ns. The record holds the clock read right
// before each event's send() and that time less the event's due time.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kNsPerMs = 1000000;
constexpr size_t kMaxHeadBytes = 1 << 16;
constexpr size_t kMaxBodyBytes = 1 << 24;

int64_t clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t now_ns() { return clock_ns(CLOCK_MONOTONIC); }

struct Options {
  int port = 0;
  double ttft_ms = 50.0;
  double itl_ms = 10.0;
  int tokens = 32;
  int tokens_per_chunk = 1;
  int first_chunk_tokens = 0;  // 0: tokens_per_chunk
  bool usage = true;
  double max_runtime_s = 600.0;
  int cpu = -1;
  int realtime_priority = 0;  // SCHED_FIFO at this priority (1-99); 0: the normal scheduler
};

// ---- a small JSON reader: enough for a request body (objects, arrays, strings, numbers)

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json* get(const char* key) const {
    if (kind != kObject) return nullptr;
    for (const auto& f : fields)
      if (f.first == key) return &f.second;
    return nullptr;
  }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : p_(text.data()), end_(text.data() + text.size()) {}

  bool parse(Json* out) {
    if (!value(out, 0)) return false;
    space();
    return p_ == end_;
  }

 private:
  const char* p_;
  const char* end_;

  void space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool literal(const char* word) {
    size_t n = strlen(word);
    if (size_t(end_ - p_) < n || memcmp(p_, word, n) != 0) return false;
    p_ += n;
    return true;
  }
  bool value(Json* out, int depth) {
    if (depth > 64) return false;
    space();
    if (p_ >= end_) return false;
    switch (*p_) {
      case '{': return object(out, depth);
      case '[': return array(out, depth);
      case '"': out->kind = Json::kString; return string(&out->str);
      case 't': out->kind = Json::kBool; out->b = true; return literal("true");
      case 'f': out->kind = Json::kBool; out->b = false; return literal("false");
      case 'n': out->kind = Json::kNull; return literal("null");
      default: return number(out);
    }
  }
  bool number(Json* out) {
    char* stop = nullptr;
    std::string text(p_, std::min<size_t>(end_ - p_, 64));
    out->num = strtod(text.c_str(), &stop);
    if (stop == text.c_str()) return false;
    p_ += stop - text.c_str();
    out->kind = Json::kNumber;
    return true;
  }
  static void utf8(uint32_t c, std::string* s) {
    if (c < 0x80) {
      s->push_back(char(c));
    } else if (c < 0x800) {
      s->push_back(char(0xC0 | (c >> 6)));
      s->push_back(char(0x80 | (c & 0x3F)));
    } else {
      s->push_back(char(0xE0 | (c >> 12)));
      s->push_back(char(0x80 | ((c >> 6) & 0x3F)));
      s->push_back(char(0x80 | (c & 0x3F)));
    }
  }
  bool string(std::string* s) {
    ++p_;  // the opening quote
    while (p_ < end_ && *p_ != '"') {
      if (*p_ != '\\') {
        s->push_back(*p_++);
        continue;
      }
      if (++p_ >= end_) return false;
      char e = *p_++;
      switch (e) {
        case 'n': s->push_back('\n'); break;
        case 't': s->push_back('\t'); break;
        case 'r': s->push_back('\r'); break;
        case 'b': s->push_back('\b'); break;
        case 'f': s->push_back('\f'); break;
        case 'u': {
          if (end_ - p_ < 4) return false;
          char hex[5] = {p_[0], p_[1], p_[2], p_[3], 0};
          char* stop = nullptr;
          uint32_t c = uint32_t(strtoul(hex, &stop, 16));
          if (stop != hex + 4) return false;
          p_ += 4;
          utf8(c, s);
          break;
        }
        default: s->push_back(e);
      }
    }
    if (p_ >= end_) return false;
    ++p_;
    return true;
  }
  bool array(Json* out, int depth) {
    out->kind = Json::kArray;
    ++p_;
    space();
    if (p_ < end_ && *p_ == ']') return ++p_, true;
    for (;;) {
      out->items.emplace_back();
      if (!value(&out->items.back(), depth + 1)) return false;
      space();
      if (p_ < end_ && *p_ == ',') { ++p_; continue; }
      if (p_ < end_ && *p_ == ']') return ++p_, true;
      return false;
    }
  }
  bool object(Json* out, int depth) {
    out->kind = Json::kObject;
    ++p_;
    space();
    if (p_ < end_ && *p_ == '}') return ++p_, true;
    for (;;) {
      space();
      if (p_ >= end_ || *p_ != '"') return false;
      out->fields.emplace_back();
      if (!string(&out->fields.back().first)) return false;
      space();
      if (p_ >= end_ || *p_ != ':') return false;
      ++p_;
      if (!value(&out->fields.back().second, depth + 1)) return false;
      space();
      if (p_ < end_ && *p_ == ',') { ++p_; continue; }
      if (p_ < end_ && *p_ == '}') return ++p_, true;
      return false;
    }
  }
};

std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(char(c));
    }
  }
  return out + "\"";
}

// Prompt size in tokens as scripted.py counts it: whitespace-separated words of the texts.
int64_t words(const Json& x) {
  if (x.kind == Json::kString) {
    int64_t n = 0;
    bool in_word = false;
    for (unsigned char c : x.str) {
      bool sp = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
      n += !sp && !in_word;
      in_word = !sp;
    }
    return n;
  }
  if (x.kind == Json::kArray) {
    int64_t n = 0;
    for (const auto& v : x.items) n += words(v);
    return n;
  }
  if (x.kind == Json::kObject) {
    const Json* t = x.get("text");
    return t ? words(*t) : 0;
  }
  return x.kind == Json::kNumber ? 1 : 0;
}

// ---- the record

struct StreamRecord {
  int64_t recv_ns = 0;
  int tokens = 0;
  int tokens_per_event = 0;
  int first_event_tokens = 0;
  std::vector<int64_t> write_ns;  // right before each event's send()
  std::vector<int64_t> late_ns;   // write_ns - the event's due time
  bool usage_sent = false;
};

std::string chunk(const std::string& data) {
  char head[24];
  snprintf(head, sizeof head, "%zx\r\n", data.size());
  return head + data + "\r\n";
}

// ---- connections

struct Step {
  int64_t due_ns;
  std::string data;
  bool last;
};

struct Connection {
  int fd = -1;
  uint64_t id = 0;
  std::string in;
  std::string out;  // what send() did not take yet
  bool want_out = false;
  bool busy = false;  // answering a request: the next one waits
  bool close_after = false;
  int64_t last_recv_ns = 0;
  // the answer being written: its events, the next one's index, its record (or none)
  std::vector<Step> plan;
  size_t next = 0;
  int64_t record = -1;
  bool usage = false;  // the answer ends with a usage chunk
};

struct Timer {
  int64_t due_ns;
  uint64_t conn_id;
  bool operator>(const Timer& o) const { return due_ns > o.due_ns; }
};

class Server {
 public:
  explicit Server(const Options& o) : opt_(o) {}

  int run();

 private:
  Options opt_;
  int ep_ = -1, listener_ = -1, tfd_ = -1, sfd_ = -1;
  int64_t armed_ns_ = -1;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::vector<StreamRecord> streams_;
  std::map<std::string, int64_t> requests_;
  std::map<int, int64_t> responses_;
  std::vector<uint64_t> dead_;  // closed connections, freed at the end of the loop's turn

  bool setup();
  void accept_all();
  void on_readable(Connection* c);
  void on_writable(Connection* c);
  void next_request(Connection* c);
  bool parse_request(Connection* c, std::string* method, std::string* path, std::string* body, bool* keep);
  void dispatch(Connection* c, const std::string& method, const std::string& path, const std::string& body);
  void completions(Connection* c, const std::string& body);
  void send_response(Connection* c, int status, const std::string& type, const std::string& body);
  std::string stats_json();
  void run_due_timers();
  void write_step(Connection* c);
  void send_bytes(Connection* c, const char* data, size_t n);
  void close_conn(Connection* c);
  void arm_timer();
  void watch(Connection* c);
};

// Asks Linux for a 0.1 ms scheduler slice (sched_setattr; EEVDF, Linux 6.12 and later), as
// scripted.py does: a waking task whose slice is shorter than the running one's preempts
// it, so a busy process on the same core does not hold a due write back for its whole
// slice (some ms). Needs no privilege; without support nothing changes.
void request_short_slice(uint64_t slice_ns) {
  struct {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
    uint32_t util_min, util_max;
  } attr{};
  static_assert(sizeof attr == 56, "struct sched_attr");
  attr.size = sizeof attr;
  attr.policy = uint32_t(sched_getscheduler(0));
  attr.nice = getpriority(PRIO_PROCESS, 0);
  attr.runtime = slice_ns;
  syscall(SYS_sched_setattr, 0, &attr, 0);
}

bool Server::setup() {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // timers fire at their time, not up to 50 us after
  request_short_slice(100000);
  if (opt_.realtime_priority > 0) {
    // Ahead of every normal task on its core: a wake-up for a due write is not held back
    // by another process's slice. The server sleeps between writes, and the kernel's
    // real-time throttling keeps 5% of each second for the others.
    sched_param param{};
    param.sched_priority = opt_.realtime_priority;
    if (sched_setscheduler(0, SCHED_FIFO, &param) != 0) {
      fprintf(stderr, "truth_server: --realtime-priority %d: %s\n", opt_.realtime_priority, strerror(errno));
      return false;
    }
  }
  if (opt_.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(opt_.cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  sfd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  ep_ = epoll_create1(EPOLL_CLOEXEC);
  tfd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  listener_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sfd_ < 0 || ep_ < 0 || tfd_ < 0 || listener_ < 0) {
    perror("truth_server: setup");
    return false;
  }
  int one = 1;
  setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(opt_.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listener_, 4096) != 0) {
    fprintf(stderr, "truth_server: cannot listen on 127.0.0.1:%d: %s\n", opt_.port, strerror(errno));
    return false;
  }
  socklen_t len = sizeof addr;
  getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // ids 0 (listener), and below: the fixed descriptors; connections count from 1 << 32
  epoll_ctl(ep_, EPOLL_CTL_ADD, listener_, &ev);
  ev.data.u64 = 1;
  epoll_ctl(ep_, EPOLL_CTL_ADD, tfd_, &ev);
  ev.data.u64 = 2;
  epoll_ctl(ep_, EPOLL_CTL_ADD, sfd_, &ev);
  next_id_ = uint64_t(1) << 32;
  printf("PORT %d\n", ntohs(addr.sin_port));
  fflush(stdout);
  return true;
}

int Server::run() {
  if (!setup()) return 1;
  const int64_t stop_ns = now_ns() + int64_t(opt_.max_runtime_s * 1e9);
  std::vector<epoll_event> events(1024);
  for (;;) {
    run_due_timers();
    arm_timer();
    int64_t left_ms = (stop_ns - now_ns()) / kNsPerMs;
    if (left_ms <= 0) break;
    int n = epoll_wait(ep_, events.data(), int(events.size()), int(std::min<int64_t>(left_ms, 1000)));
    if (n < 0 && errno != EINTR) {
      perror("truth_server: epoll_wait");
      return 1;
    }
    run_due_timers();  // the writes due first: reading new requests can wait (their stamps are the kernel's)
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64;
      if (key == 0) {
        accept_all();
      } else if (key == 1) {
        uint64_t expirations;
        while (read(tfd_, &expirations, sizeof expirations) > 0) {
        }
        armed_ns_ = -1;
      } else if (key == 2) {
        return 0;  // SIGTERM or SIGINT
      } else {
        auto it = conns_.find(key);
        if (it == conns_.end()) continue;
        Connection* c = it->second.get();
        if (c->fd >= 0 && (events[i].events & EPOLLOUT)) on_writable(c);
        if (c->fd >= 0 && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(c);
      }
    }
    for (uint64_t id : dead_) conns_.erase(id);
    dead_.clear();
  }
  return 0;
}

void Server::arm_timer() {
  int64_t due = timers_.empty() ? 0 : timers_.top().due_ns;
  if (due == armed_ns_ || (due == 0 && armed_ns_ < 0)) return;
  itimerspec spec{};
  if (due > 0) {
    spec.it_value.tv_sec = due / 1000000000;
    spec.it_value.tv_nsec = due % 1000000000;
  }
  timerfd_settime(tfd_, TFD_TIMER_ABSTIME, &spec, nullptr);  // a zero value disarms it
  armed_ns_ = due > 0 ? due : -1;
}

void Server::run_due_timers() {
  while (!timers_.empty()) {
    Timer t = timers_.top();
    if (t.due_ns > now_ns()) return;
    timers_.pop();
    auto it = conns_.find(t.conn_id);
    if (it != conns_.end()) write_step(it->second.get());
  }
  for (uint64_t id : dead_) conns_.erase(id);
  dead_.clear();
}

void Server::accept_all() {
  for (;;) {
    int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->id = next_id_++;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = c->id;
    epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
    conns_[c->id] = std::move(c);
  }
}

void Server::watch(Connection* c) {
  epoll_event ev{};
  ev.events = EPOLLIN | (c->want_out ? uint32_t(EPOLLOUT) : 0u);
  ev.data.u64 = c->id;
  epoll_ctl(ep_, EPOLL_CTL_MOD, c->fd, &ev);
}

void Server::on_readable(Connection* c) {
  char buf[1 << 16];
  alignas(cmsghdr) char control[256];
  for (;;) {
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = recvmsg(c->fd, &msg, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    if (n <= 0) {
      close_conn(c);
      return;
    }
    int64_t recv_ns = 0;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SO_TIMESTAMPNS) {
        timespec ts;
        memcpy(&ts, CMSG_DATA(cm), sizeof ts);
        // the kernel's stamp is on CLOCK_REALTIME: moved to CLOCK_MONOTONIC as scripted.py does
        int64_t offset = clock_ns(CLOCK_REALTIME) - now_ns();
        recv_ns = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec - offset;
      }
    }
    c->last_recv_ns = recv_ns ? recv_ns : now_ns();
    c->in.append(buf, size_t(n));
    if (size_t(n) < sizeof buf) break;
  }
  next_request(c);
}

void Server::next_request(Connection* c) {
  while (!c->busy && c->fd >= 0) {
    std::string method, path, body;
    bool keep = true;
    if (!parse_request(c, &method, &path, &body, &keep)) return;
    c->close_after = !keep;
    dispatch(c, method, path, body);
    if (!c->busy && c->close_after && c->out.empty()) {
      close_conn(c);
      return;
    }
  }
}

bool Server::parse_request(Connection* c, std::string* method, std::string* path, std::string* body, bool* keep) {
  size_t end = c->in.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (c->in.size() > kMaxHeadBytes) close_conn(c);
    return false;
  }
  size_t line_end = c->in.find("\r\n");
  std::string line = c->in.substr(0, line_end);
  size_t a = line.find(' '), b = line.rfind(' ');
  if (a == std::string::npos || b == a) {
    close_conn(c);
    return false;
  }
  *method = line.substr(0, a);
  *path = line.substr(a + 1, b - a - 1);
  std::string version = line.substr(b + 1);
  size_t q = path->find('?');
  if (q != std::string::npos) path->resize(q);
  size_t length = 0;
  std::string connection;
  for (size_t pos = line_end + 2; pos < end;) {
    size_t eol = c->in.find("\r\n", pos);
    std::string h = c->in.substr(pos, eol - pos);
    pos = eol + 2;
    size_t colon = h.find(':');
    if (colon == std::string::npos) continue;
    std::string name = h.substr(0, colon), value = h.substr(colon + 1);
    for (auto& ch : name) ch = char(tolower(ch));
    size_t s = value.find_first_not_of(" \t"), e = value.find_last_not_of(" \t");
    value = s == std::string::npos ? "" : value.substr(s, e - s + 1);
    if (name == "content-length") {
      char* stop = nullptr;
      length = size_t(strtoull(value.c_str(), &stop, 10));
      if (*stop != 0 || length > kMaxBodyBytes) {
        close_conn(c);
        return false;
      }
    } else if (name == "connection") {
      for (auto& ch : value) ch = char(tolower(ch));
      connection = value;
    }
  }
  if (c->in.size() < end + 4 + length) return false;
  *body = c->in.substr(end + 4, length);
  c->in.erase(0, end + 4 + length);
  *keep = version == "HTTP/1.1" ? connection != "close" : connection == "keep-alive";
  return true;
}

void Server::send_response(Connection* c, int status, const std::string& type, const std::string& body) {
  responses_[status] += 1;
  const char* phrase = status == 200 ? "OK" : status == 400 ? "Bad Request" : "Not Found";
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + phrase + "\r\nContent-Type: " + type +
                     "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: " +
                     (c->close_after ? "close" : "keep-alive") + "\r\n\r\n";
  head += body;
  send_bytes(c, head.data(), head.size());
}

void Server::dispatch(Connection* c, const std::string& method, const std::string& path, const std::string& body) {
  if (method == "POST" && (path == "/v1/chat/completions" || path == "/v1/chat/completions/")) {
    completions(c, body);
  } else if (method == "GET" && path == "/v1/models") {
    requests_["models"] += 1;
    send_response(c, 200, "application/json",
                  "{\"object\":\"list\",\"data\":[{\"id\":\"scripted\",\"object\":\"model\"}]}");
  } else if (method == "GET" && path == "/stats") {
    requests_["stats"] += 1;
    send_response(c, 200, "application/json", stats_json());
  } else {
    requests_["not_found"] += 1;
    send_response(c, 404, "application/json", "{\"error\":" + json_quote("no route for " + method + " " + path) + "}");
  }
}

void Server::completions(Connection* c, const std::string& text) {
  requests_["chat_completions"] += 1;
  const int64_t recv_ns = c->last_recv_ns;
  Json body;
  if (!JsonReader(text).parse(&body) || body.kind != Json::kObject) {
    send_response(c, 400, "application/json", "{\"error\":\"bad completion request: the body is not a JSON object\"}");
    return;
  }
  const Json* limit = body.get("max_tokens");
  if (!limit || limit->kind != Json::kNumber) limit = body.get("max_completion_tokens");
  int n = opt_.tokens;
  if (limit && limit->kind == Json::kNumber && limit->num >= 1) n = std::min<int>(n, int(limit->num));
  int64_t prompt = 0;
  if (const Json* msgs = body.get("messages"); msgs && msgs->kind == Json::kArray)
    for (const auto& m : msgs->items)
      if (const Json* content = m.get("content")) prompt += words(*content);
  const Json* stream = body.get("stream");
  const bool streamed = stream && stream->kind == Json::kBool && stream->b;
  const Json* so = body.get("stream_options");
  const Json* iu = so ? so->get("include_usage") : nullptr;
  const bool include_usage = opt_.usage || (iu && iu->kind == Json::kBool && iu->b);
  const Json* model_field = body.get("model");
  std::string model = model_field && model_field->kind == Json::kString ? model_field->str : "scripted";
  const std::string usage = "{\"prompt_tokens\":" + std::to_string(prompt) + ",\"completion_tokens\":" +
                            std::to_string(n) + ",\"total_tokens\":" + std::to_string(prompt + n) + "}";
  const std::string id = "chatcmpl-" + std::to_string(recv_ns);
  const std::string base = "{\"id\":\"" + id + "\",\"object\":\"" +
                           (streamed ? "chat.completion.chunk" : "chat.completion") + "\",\"created\":" +
                           std::to_string(int64_t(time(nullptr))) + ",\"model\":" + json_quote(model);
  const int64_t ttft = int64_t(opt_.ttft_ms * kNsPerMs + 0.5), itl = int64_t(opt_.itl_ms * kNsPerMs + 0.5);
  auto tok = [](int count) {
    std::string s;
    s.reserve(size_t(count) * 4);
    for (int i = 0; i < count; ++i) s += " tok";
    return s;
  };
  c->plan.clear();
  c->next = 0;
  c->busy = true;
  if (!streamed) {
    std::string answer = base + ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"" +
                         tok(n) + "\"},\"finish_reason\":\"length\"}],\"usage\":" + usage + "}";
    responses_[200] += 1;
    std::string whole = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                        std::to_string(answer.size()) + "\r\nConnection: " +
                        (c->close_after ? "close" : "keep-alive") + "\r\n\r\n" + answer;
    c->plan.push_back({recv_ns + ttft + int64_t(n - 1) * itl, std::move(whole), true});
    c->record = -1;
    timers_.push({c->plan[0].due_ns, c->id});
    return;
  }
  const int k = opt_.tokens_per_chunk;
  const int first = std::min(n, opt_.first_chunk_tokens ? opt_.first_chunk_tokens : k);
  c->record = int64_t(streams_.size());
  StreamRecord rec;
  rec.recv_ns = recv_ns;
  rec.tokens = n;
  rec.tokens_per_event = k;
  rec.first_event_tokens = first;
  streams_.push_back(std::move(rec));
  responses_[200] += 1;
  std::string head = std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n") +
                     "Transfer-Encoding: chunked\r\nConnection: " + (c->close_after ? "close" : "keep-alive") +
                     "\r\n\r\n";
  send_bytes(c, head.data(), head.size());
  auto event = [&](int count, bool role, const char* finish) {
    std::string delta = role ? "\"role\":\"assistant\"" : "";
    if (count) delta += std::string(delta.empty() ? "" : ",") + "\"content\":\"" + tok(count) + "\"";
    return chunk("data: " + base + ",\"choices\":[{\"index\":0,\"delta\":{" + delta + "},\"finish_reason\":" +
                 finish + "}]}\n\n");
  };
  const std::string tail = event(0, false, "\"length\"") +
                           (include_usage ? chunk("data: " + base + ",\"choices\":[],\"usage\":" + usage + "}\n\n") : "") +
                           chunk("data: [DONE]\n\n") + "0\r\n\r\n";
  int start = 0;
  while (start < n) {
    int end = start == 0 ? first : std::min(n, start + k);
    bool last = end == n;
    std::string data = event(end - start, start == 0, "null");
    if (last) data += tail;
    c->plan.push_back({recv_ns + ttft + int64_t(end - 1) * itl, std::move(data), last});
    start = end;
  }
  c->usage = include_usage;
  timers_.push({c->plan[0].due_ns, c->id});
}

// One event of the connection's answer, at its due time; the next one's timer.
void Server::write_step(Connection* c) {
  if (c->fd < 0) return;  // the client went away: its record keeps what was written
  Step& step = c->plan[c->next];
  const int64_t t = now_ns();
  if (c->record >= 0) {
    StreamRecord& rec = streams_[size_t(c->record)];
    rec.write_ns.push_back(t);
    rec.late_ns.push_back(t - step.due_ns);
    if (step.last) rec.usage_sent = c->usage;
  }
  send_bytes(c, step.data.data(), step.data.size());
  if (c->fd < 0) return;  // the client went away
  if (!step.last) {
    ++c->next;
    timers_.push({c->plan[c->next].due_ns, c->id});
    return;
  }
  c->plan.clear();
  c->record = -1;
  c->busy = false;
  if (c->close_after) {
    if (c->out.empty()) close_conn(c);
    return;
  }
  next_request(c);  // a request sent behind this one (pipelined)
}

void Server::send_bytes(Connection* c, const char* data, size_t n) {
  if (c->fd < 0) return;
  if (c->out.empty()) {
    ssize_t sent = send(c->fd, data, n, MSG_NOSIGNAL);
    if (sent < 0 && errno != EAGAIN && errno != EINTR) {
      close_conn(c);
      return;
    }
    size_t done = sent > 0 ? size_t(sent) : 0;
    if (done == n) return;
    data += done;
    n -= done;
  }
  c->out.append(data, n);
  if (!c->want_out) {
    c->want_out = true;
    watch(c);
  }
}

void Server::on_writable(Connection* c) {
  while (!c->out.empty()) {
    ssize_t sent = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
    if (sent < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (sent <= 0) {
      close_conn(c);
      return;
    }
    c->out.erase(0, size_t(sent));
  }
  c->want_out = false;
  watch(c);
  if (!c->busy && c->close_after) close_conn(c);
}

void Server::close_conn(Connection* c) {
  if (c->fd < 0) return;
  epoll_ctl(ep_, EPOLL_CTL_DEL, c->fd, nullptr);
  close(c->fd);
  c->fd = -1;
  dead_.push_back(c->id);  // freed after this turn of the loop: callers may still look at c
}

template <typename T>
void append_list(std::string* out, const std::vector<T>& xs) {
  out->push_back('[');
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) out->push_back(',');
    *out += std::to_string(xs[i]);
  }
  out->push_back(']');
}

// The record in scripted.py's /stats shape (streams, stream_requests, requests, ...),
// each stream with write_late_ns beside token_write_ns.
std::string Server::stats_json() {
  std::string out = "{\"server\":\"truth_server\",\"infer_requests\":0,\"infer_ok\":0,\"stream_requests\":" +
                    std::to_string(streams_.size()) + ",\"streams\":[";
  out.reserve(streams_.size() * 400);
  for (size_t i = 0; i < streams_.size(); ++i) {
    const StreamRecord& s = streams_[i];
    if (i) out.push_back(',');
    out += "{\"recv_ns\":" + std::to_string(s.recv_ns) + ",\"tokens\":" + std::to_string(s.tokens) +
           ",\"tokens_per_event\":" + std::to_string(s.tokens_per_event) + ",\"first_event_tokens\":" +
           std::to_string(s.first_event_tokens) + ",\"reasoning_tokens\":0,\"token_write_ns\":";
    append_list(&out, s.write_ns);
    out += ",\"write_late_ns\":";
    append_list(&out, s.late_ns);
    out += std::string(",\"usage_sent\":") + (s.usage_sent ? "true" : "false") + "}";
  }
  out += "],\"requests\":{";
  bool first = true;
  for (const auto& kv : requests_) {
    out += (first ? "" : ",") + json_quote(kv.first) + ":" + std::to_string(kv.second);
    first = false;
  }
  out += "},\"responses\":{";
  first = true;
  for (const auto& kv : responses_) {
    out += (first ? "\"" : ",\"") + std::to_string(kv.first) + "\":" + std::to_string(kv.second);
    first = false;
  }
  return out + "},\"completion_log\":[]}";
}

bool parse_number(const char* text, double lo, double* out) {
  char* stop = nullptr;
  double v = strtod(text, &stop);
  if (stop == text || *stop != 0 || !(v >= lo)) return false;
  *out = v;
  return true;
}

// Options as scripted.py spells them; a bad one: a one-line error and exit code 2.
bool parse_options(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name == "--no-usage") {
      o->usage = false;
      continue;
    }
    if (name == "--usage") {
      o->usage = true;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "truth_server: %s needs a value\n", name.c_str());
      return false;
    }
    const char* value = argv[++i];
    double v = 0;
    bool positive_int = name == "--tokens" || name == "--tokens-per-chunk" || name == "--first-chunk-tokens";
    double lo = positive_int ? 1 : name == "--cpu" ? -1 : 0;
    bool whole = positive_int || name == "--port" || name == "--cpu" || name == "--realtime-priority";
    if (!parse_number(value, lo, &v) || (whole && v != double(int64_t(v)))) {
      fprintf(stderr, "truth_server: %s %s: not a%s number\n", name.c_str(), value,
              positive_int ? " positive whole" : whole ? " whole" : " non-negative");
      return false;
    }
    if ((name == "--port" && v > 65535) || (name == "--realtime-priority" && v > 99)) {
      fprintf(stderr, "truth_server: %s %s: out of range (at most %d)\n", name.c_str(), value,
              name == "--port" ? 65535 : 99);
      return false;
    }
    if (name == "--port") o->port = int(v);
    else if (name == "--ttft-ms") o->ttft_ms = v;
    else if (name == "--itl-ms") o->itl_ms = v;
    else if (name == "--tokens") o->tokens = int(v);
    else if (name == "--tokens-per-chunk") o->tokens_per_chunk = int(v);
    else if (name == "--first-chunk-tokens") o->first_chunk_tokens = int(v);
    else if (name == "--max-runtime-s") o->max_runtime_s = v;
    else if (name == "--cpu") o->cpu = int(v);
    else if (name == "--realtime-priority") o->realtime_priority = int(v);
    else {
      fprintf(stderr, "truth_server: unknown option %s (see the head of truth_server.cc)\n", name.c_str());
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, &o)) return 2;
  return Server(o).run();
}
