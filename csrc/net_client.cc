#include "net_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "affinity.h"
#include "clock.h"
#include "grpc_client.h"
#include "http_client.h"
#include "native_suts.h"
#include "require.h"
#include "tls.h"

namespace loadgen {

using detail::require;

namespace netio {

std::string errno_text(int err) { return std::string(std::strerror(err)); }

const char* connect_kind(int err) noexcept {
  if (err == ECONNREFUSED) return "connect_refused";
  if (err == ETIMEDOUT) return "connect_timeout";
  return "connect_error";
}

bool parse_address(const std::string& host, int port, sockaddr_storage* addr, unsigned* len) noexcept {
  std::memset(addr, 0, sizeof(*addr));
  auto* v4 = reinterpret_cast<sockaddr_in*>(addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(addr);
  if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

int connect_nonblocking(const std::string& host, int port, int* err) noexcept {
  sockaddr_storage addr{};
  unsigned len = 0;
  if (!parse_address(host, port, &addr, &len)) {
    *err = EINVAL;
    return -1;
  }
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // The kernel stamps what it receives (software stamps; read back by read_stamped()).
  setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS) {
    *err = errno;
    ::close(fd);
    return -1;
  }
  return fd;
}

ssize_t read_stamped(int fd, char* buf, size_t len, int64_t* kernel_ns) noexcept {
  iovec iov{buf, len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(fd, &msg, 0);
  *kernel_ns = 0;
  if (n <= 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
    timespec stamp;
    std::memcpy(&stamp, CMSG_DATA(c), sizeof stamp);
    // The stamp is on the wall clock: moved to the monotonic one by their offset now.
    timespec wall, mono;
    clock_gettime(CLOCK_REALTIME, &wall);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    const int64_t offset = (static_cast<int64_t>(wall.tv_sec) - mono.tv_sec) * 1'000'000'000 + (wall.tv_nsec - mono.tv_nsec);
    *kernel_ns = static_cast<int64_t>(stamp.tv_sec) * 1'000'000'000 + stamp.tv_nsec - offset;
  }
  return n;
}

int finish_connect(int fd, int64_t timeout_ns) noexcept {
  pollfd p{fd, POLLOUT, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, timeout_ns / 1'000'000)));
  if (rc == 0) return ETIMEDOUT;
  if (rc < 0) return errno;
  int so_error = 0;
  socklen_t sl = sizeof(so_error);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &sl) != 0) return errno;
  return so_error;
}

int wait_events(int epfd, epoll_event* events, int max, int64_t wait_ns) noexcept {
  wait_ns = std::max<int64_t>(wait_ns, 0);
  timespec ts{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
  int n = epoll_pwait2(epfd, events, max, &ts, nullptr);
  if (n < 0 && errno == ENOSYS) n = epoll_wait(epfd, events, max, static_cast<int>((wait_ns + 999'999) / 1'000'000));
  return n;
}

}  // namespace netio

size_t NetClient::BodyHash::operator()(const std::string& s) const noexcept {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = n * kMul;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * kMul;
  return static_cast<size_t>(h ^ (h >> 32));
}

void NetClient::judge(int64_t id, int64_t t, int status, std::string&& body) noexcept {
  {
    std::shared_lock<std::shared_mutex> lock(cache_mutex_);
    for (auto& [st, map] : cache_) {
      if (st != status) continue;
      auto it = map.find(body);
      if (it == map.end()) break;
      cache_hits_.fetch_add(1, std::memory_order_relaxed);
      if (it->second.ok) {
        sink_->complete_native(id, t);
      } else {
        sink_->fail_native(id, it->second.kind, it->second.message);
      }
      return;
    }
  }
  hand_over(UncheckedResponse{id, t, status, std::move(body), 0});
}

void NetClient::hand_over(UncheckedResponse&& u) noexcept {
  checked_outside_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(unchecked_mutex_);
    unchecked_.push_back(std::move(u));
  }
  unchecked_cv_.notify_one();
}

void NetClient::close_checks() noexcept {
  { std::lock_guard<std::mutex> lock(unchecked_mutex_); }  // a waiter sees closing_ after its check
  unchecked_cv_.notify_all();
}

bool NetClient::take_unchecked(std::vector<UncheckedResponse>* out, size_t max, int64_t timeout_ns) {
  std::unique_lock<std::mutex> lock(unchecked_mutex_);
  unchecked_cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(timeout_ns, 0)),
                         [this] { return !unchecked_.empty() || closing_.load(); });
  while (!unchecked_.empty() && out->size() < max) {
    out->push_back(std::move(unchecked_.front()));
    unchecked_.pop_front();
  }
  return !(out->empty() && closing_.load());
}

void NetClient::resolve(std::vector<ResponseVerdict>& verdicts) {
  for (ResponseVerdict& v : verdicts) {
    if (v.ok && (v.output_tokens >= 0 || v.input_tokens >= 0)) {
      sink_->complete_tokens_native(v.id, v.t_ns, v.output_tokens, v.input_tokens);
    } else if (v.ok) {
      sink_->complete_native(v.id, v.t_ns);
    } else {
      sink_->fail_native(v.id, v.kind, v.message);
    }
  }
  sink_->issue_ready();
  if (!cacheable_) return;
  std::unique_lock<std::shared_mutex> lock(cache_mutex_);
  for (ResponseVerdict& v : verdicts) {
    if (cache_size_ >= static_cast<size_t>(cache_entries_) || v.body.size() > static_cast<size_t>(cache_body_bytes_)) {
      continue;
    }
    VerdictMap* map = nullptr;
    for (auto& [st, m] : cache_) {
      if (st == v.status) map = &m;
    }
    if (map == nullptr) {
      cache_.emplace_back(v.status, VerdictMap{});
      map = &cache_.back().second;
    }
    if (map->emplace(std::move(v.body), Verdict{v.ok, v.kind, v.message}).second) ++cache_size_;
  }
}

void NetClient::open_io_thread(IoThread* io, const char* who) {
  io->receive_wait = std::make_unique<HdrHistogram>(1, 60'000'000'000LL, 3);
  io->epfd = epoll_create1(EPOLL_CLOEXEC);
  io->wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int err = errno;
  io_threads_.push_back(io);  // closed by close_io_threads(), whatever happens next
  if (io->epfd < 0 || io->wake < 0) throw std::runtime_error(std::string(who) + ": epoll/eventfd: " +
                                                             netio::errno_text(err));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(io->epfd, EPOLL_CTL_ADD, io->wake, &ev);
}

HdrHistogram NetClient::receive_wait() const {
  HdrHistogram out(1, 60'000'000'000LL, 3);
  for (IoThread* io : io_threads_) {
    std::lock_guard<std::mutex> lock(io->wait_mu);
    if (io->receive_wait) out.add(*io->receive_wait);
  }
  return out;
}

void NetClient::close_io_threads() noexcept {
  for (IoThread* io : io_threads_) {
    if (io->epfd >= 0) ::close(io->epfd);
    if (io->wake >= 0) ::close(io->wake);
    io->epfd = io->wake = -1;
  }
  io_threads_.clear();
}

void NetClient::join_io_threads() noexcept {
  for (auto& io : io_threads_) {
    const uint64_t one = 1;
    if (io->wake >= 0) (void)!::write(io->wake, &one, sizeof(one));
  }
  for (auto& io : io_threads_) {
    if (io->thread.joinable()) io->thread.join();
  }
}

void NetClient::enter_io_thread(const char* name, const std::vector<int>& cpus, int64_t slice_ns) noexcept {
  set_current_thread_name(name);
  if (!cpus.empty()) {
    try {
      pin_current_thread(cpus);
    } catch (const std::exception&) {
      // A cpuset that shrank since the settings were checked: run unpinned.
    }
  }
  request_sched_slice(slice_ns);
}

void NetClient::drain_wake(const IoThread& io) noexcept {
  uint64_t v;
  while (::read(io.wake, &v, sizeof(v)) > 0) {
  }
}

NetClientStats NetClient::stats() const {
  NetClientStats st;
  st.connects = connects_.load();
  st.connect_failures = connect_failures_.load();
  st.connections_opened_before_run = warm_.load();
  st.bytes_sent = bytes_sent_.load();
  st.responses = responses_.load();
  st.cache_hits = cache_hits_.load();
  st.checked_outside = checked_outside_.load();
  st.closed_by_timeout = closed_by_timeout_.load();
  st.queued = queued_.load();
  st.handed_over = handed_over_.load();
  st.tls_handshakes = tls_handshakes_.load();
  st.tls_resumed = tls_resumed_.load();
  return st;
}

void validate(const NetClientSettings& s) {
  require(s.protocol == NetProtocol::kHttp1 || s.protocol == NetProtocol::kGrpc, "net.protocol must be http1 or grpc");
  sockaddr_storage addr{};
  unsigned len = 0;
  require(netio::parse_address(s.host, s.port, &addr, &len), "net.host must be a numeric IPv4 or IPv6 address, got '" +
                                                           s.host + "'");
  require(s.port >= 1 && s.port <= 65535, "net.port must be in 1..65535, got " + std::to_string(s.port));
  require(s.connections >= 1 && s.connections <= (1 << 16),
          "net.connections must be in 1..65536, got " + std::to_string(s.connections));
  require(s.io_threads >= 1 && s.io_threads <= 256,
          "net.io_threads must be in 1..256, got " + std::to_string(s.io_threads));
  require(!s.requests.empty(), "net.requests must hold at least one prepared request");
  require(s.max_response_bytes >= 1, "net.max_response_bytes must be >= 1");
  require(s.connect_timeout_ns >= 1, "net.connect_timeout_ns must be >= 1");
  require(s.timeout_ns >= 0, "net.timeout_ns must be >= 0");
  require(s.cache_entries >= 0 && s.cache_body_bytes >= 0, "net.cache_entries and cache_body_bytes must be >= 0");
  require(s.input_tokens.empty() || s.input_tokens.size() == s.requests.size(),
          "net.input_tokens must be empty or hold one count per request");
  require(s.image_bytes.empty() || s.image_bytes.size() == s.requests.size(),
          "net.image_bytes must be empty or hold one count per request");
  require(s.images_per_request >= 0, "net.images_per_request must be >= 0");
  require(s.significant_figures >= 1 && s.significant_figures <= 5, "net.significant_figures must be in 1..5");
  require(s.group_count >= 0 && s.group_count <= 4096, "net.group_count must be in 0..4096");
  require(s.request_groups.empty() || s.request_groups.size() == s.requests.size(),
          "net.request_groups must be empty or hold one group per request");
  for (const int32_t g : s.request_groups) {
    require(g >= 0 && g < s.group_count, "net.request_groups: group " + std::to_string(g) + " is outside 0.." +
                                             std::to_string(s.group_count - 1) + " (net.group_count)");
  }
  require(!s.tls || tls_available(),
          "net.tls: this build of loadgen has no TLS in its native clients (OpenSSL's header was missing when it "
          "was built: install libssl-dev and reinstall)");
  require(!s.whole_answers || (s.check_each && !s.sse), "net.whole_answers needs net.check_each and not net.sse");
  if (s.protocol == NetProtocol::kHttp1) {
    validate_http1(s);
  } else {
    validate_grpc(s);
  }
}

std::unique_ptr<NetClient> make_net_client(const NetClientSettings& settings) {
  if (settings.protocol == NetProtocol::kGrpc) return make_grpc_client(settings);
  return std::make_unique<HttpClient>(settings);
}

}  // namespace loadgen
