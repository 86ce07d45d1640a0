#include "tls.h"

#include <stdexcept>

#include "clock.h"
#include "net_client.h"

#ifdef LOADGEN_HAVE_OPENSSL
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#endif

namespace loadgen {

#ifndef LOADGEN_HAVE_OPENSSL

namespace {
constexpr const char* kNoTls =
    "this build of loadgen has no TLS in its native clients: OpenSSL's header (openssl/ssl.h) was missing when it "
    "was built (install libssl-dev, or your system's OpenSSL development package, and reinstall loadgen)";
}  // namespace

bool tls_available() noexcept { return false; }
const char* tls_library_version() noexcept { return ""; }

struct TlsContext::Impl {};
TlsContext::TlsContext(const std::string&, bool, const std::string&) { throw std::runtime_error(kNoTls); }
TlsContext::~TlsContext() = default;
bool TlsContext::has_session() const noexcept { return false; }

TlsConn::TlsConn(TlsContext& ctx, int, const std::string&) : ctx_(ctx) { throw std::runtime_error(kNoTls); }
TlsConn::~TlsConn() = default;
TlsStatus TlsConn::handshake() noexcept { return TlsStatus::kError; }
TlsStatus TlsConn::handshake_blocking(int64_t) noexcept { return TlsStatus::kError; }
TlsStatus TlsConn::read(char*, size_t, size_t*) noexcept { return TlsStatus::kError; }
TlsStatus TlsConn::write(const char*, size_t, size_t*) noexcept { return TlsStatus::kError; }
bool TlsConn::pending() const noexcept { return false; }
bool TlsConn::resumed() const noexcept { return false; }
void TlsConn::await_ticket(int64_t) noexcept {}
TlsStatus TlsConn::fail(int, const char*) noexcept { return TlsStatus::kError; }

std::string tls_check(const std::string&, int, const std::string&, const std::string&, bool, const std::string&,
                      int64_t) {
  return kNoTls;
}

#else

bool tls_available() noexcept { return true; }
const char* tls_library_version() noexcept { return OpenSSL_version(OPENSSL_VERSION); }

namespace {

bool is_ip_literal(const std::string& host) {
  unsigned char addr[16];
  return inet_pton(AF_INET, host.c_str(), addr) == 1 || inet_pton(AF_INET6, host.c_str(), addr) == 1;
}

// The reason of OpenSSL's last queued error ("sslv3 alert handshake failure"), or "".
std::string last_error_reason() {
  unsigned long e = 0, last = 0;
  while ((e = ERR_get_error()) != 0) last = e;
  if (last == 0) return "";
  const char* reason = ERR_reason_error_string(last);
  if (reason != nullptr) return reason;
  char buf[256];
  ERR_error_string_n(last, buf, sizeof buf);
  return buf;
}

}  // namespace

// OpenSSL reads and writes the socket through this BIO rather than its own socket BIO:
// reads keep the kernel's receive stamp (as the plain clients' reads do), and writes to a
// socket the server closed say EPIPE instead of raising SIGPIPE.
struct TlsSocketBio {
  static int read(BIO* bio, char* buf, int len) {
    auto* conn = static_cast<TlsConn*>(BIO_get_data(bio));
    BIO_clear_retry_flags(bio);
    int64_t kernel_ns = 0;
    const ssize_t n = netio::read_stamped(conn->fd_, buf, static_cast<size_t>(len), &kernel_ns);
    if (n > 0 && kernel_ns > 0) conn->kernel_ns_ = kernel_ns;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(bio);
    return static_cast<int>(n);
  }
  static int write(BIO* bio, const char* buf, int len) {
    auto* conn = static_cast<TlsConn*>(BIO_get_data(bio));
    BIO_clear_retry_flags(bio);
    const ssize_t n = ::send(conn->fd_, buf, static_cast<size_t>(len), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_write(bio);
    return static_cast<int>(n);
  }
  static long ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }
  static int create(BIO* bio) {
    BIO_set_init(bio, 1);
    return 1;
  }
  // The one method, made once; it lives as long as the process.
  static const BIO_METHOD* method() {
    static const BIO_METHOD* m = [] {
      BIO_METHOD* made = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "loadgen socket");
      if (made != nullptr) {
        BIO_meth_set_read(made, &TlsSocketBio::read);
        BIO_meth_set_write(made, &TlsSocketBio::write);
        BIO_meth_set_ctrl(made, &TlsSocketBio::ctrl);
        BIO_meth_set_create(made, &TlsSocketBio::create);
      }
      return made;
    }();
    return m;
  }
};

struct TlsContext::Impl {
  SSL_CTX* ctx = nullptr;
  mutable std::mutex mu;
  SSL_SESSION* session = nullptr;  // the newest resumable session (under mu)

  // A new session (a handshake's, or a TLS 1.3 ticket's): kept for the next connections.
  static int on_new_session(SSL* ssl, SSL_SESSION* session) {
    auto* impl = static_cast<Impl*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
    if (impl == nullptr || !SSL_SESSION_is_resumable(session)) return 0;
    std::lock_guard<std::mutex> lock(impl->mu);
    if (impl->session != nullptr) SSL_SESSION_free(impl->session);
    impl->session = session;
    return 1;  // the reference is ours
  }
};

TlsContext::TlsContext(const std::string& ca_file, bool insecure, const std::string& alpn)
    : impl_(std::make_unique<Impl>()), alpn_(alpn), insecure_(insecure) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) throw std::runtime_error("TLS: cannot make a context: " + last_error_reason());
  impl_->ctx = ctx;
  SSL_CTX_set_app_data(ctx, impl_.get());
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // A response that ends at the connection's close often comes without close_notify:
  // the end of the stream, as over plain TCP.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  // A write that the socket takes part of says so (the rest goes when it has room), and
  // its retry may come from a buffer that moved (gRPC's output grows as calls start).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (insecure) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    // As Python's ssl.create_default_context(cafile=...): the file alone when given.
    const int ok = ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx)
                                   : SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr);
    if (ok != 1) {
      const std::string why = last_error_reason();
      SSL_CTX_free(ctx);
      impl_->ctx = nullptr;
      throw std::runtime_error(ca_file.empty() ? "TLS: cannot load the system's CA store: " + why
                                               : "--ca-file: cannot load " + ca_file + ": " + why);
    }
  }
  std::string wire(1, static_cast<char>(alpn.size()));
  wire += alpn;
  SSL_CTX_set_alpn_protos(ctx, reinterpret_cast<const unsigned char*>(wire.data()), static_cast<unsigned>(wire.size()));
  // Sessions are the client's to keep (OpenSSL's client cache stores none itself): the
  // newest goes to every new connection, which resumes it.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  SSL_CTX_sess_set_new_cb(ctx, &Impl::on_new_session);
}

TlsContext::~TlsContext() {
  if (impl_->session != nullptr) SSL_SESSION_free(impl_->session);
  if (impl_->ctx != nullptr) SSL_CTX_free(impl_->ctx);
}

bool TlsContext::has_session() const noexcept {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->session != nullptr;
}

TlsConn::TlsConn(TlsContext& ctx, int fd, const std::string& server_name)
    : ctx_(ctx), fd_(fd), server_name_(server_name) {
  ERR_clear_error();  // what others left on this thread's queue (read() relies on it being empty)
  SSL* ssl = SSL_new(ctx.impl_->ctx);
  if (ssl == nullptr) throw std::runtime_error("TLS: cannot make a connection: " + last_error_reason());
  ssl_ = ssl;
  const BIO_METHOD* method = TlsSocketBio::method();
  BIO* bio = method != nullptr ? BIO_new(method) : nullptr;
  if (bio == nullptr) {
    SSL_free(ssl);
    ssl_ = nullptr;
    throw std::runtime_error("TLS: cannot make a connection's BIO: " + last_error_reason());
  }
  BIO_set_data(bio, this);
  SSL_set_bio(ssl, bio, bio);  // one reference, for both directions
  SSL_set_connect_state(ssl);
  const bool ip = is_ip_literal(server_name);
  if (!ip && !server_name.empty()) SSL_set_tlsext_host_name(ssl, server_name.c_str());  // SNI names no address
  if (!ctx.insecure() && !server_name.empty()) {
    if (ip) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), server_name.c_str());
    } else {
      SSL_set1_host(ssl, server_name.c_str());
    }
  }
  std::lock_guard<std::mutex> lock(ctx.impl_->mu);
  if (ctx.impl_->session == nullptr) return;
  // A copy: OpenSSL marks a TLS 1.3 session it resumed as used up (one ticket, one
  // connection), and the context's session is to resume every connection of the run.
  SSL_SESSION* copy = SSL_SESSION_dup(ctx.impl_->session);
  if (copy == nullptr) return;  // out of memory: a full handshake
  SSL_set_session(ssl, copy);
  SSL_SESSION_free(copy);
}

TlsConn::~TlsConn() {
  if (ssl_ == nullptr) return;
  auto* ssl = static_cast<SSL*>(ssl_);
  // No close_notify (the socket closes next), and the session stays resumable.
  SSL_set_shutdown(ssl, SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
  SSL_free(ssl);
}

TlsStatus TlsConn::fail(int ret, const char* what) noexcept {
  auto* ssl = static_cast<SSL*>(ssl_);
  const int saved_errno = errno;
  const int e = SSL_get_error(ssl, ret);
  switch (e) {
    case SSL_ERROR_WANT_READ:
      return TlsStatus::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return TlsStatus::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      ERR_clear_error();
      return TlsStatus::kClosed;
    default:
      break;
  }
  sys_errno_ = 0;
  try {
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) {
      ERR_clear_error();
      error_ = std::string("certificate verify failed: ") + X509_verify_cert_error_string(verify);
      if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
        error_ += " (the certificate is not valid for '" + server_name_ + "')";
      }
      return TlsStatus::kError;
    }
    std::string reason = last_error_reason();
    if (e == SSL_ERROR_SYSCALL && reason.empty()) {
      if (saved_errno == 0) {
        if (SSL_is_init_finished(ssl)) return TlsStatus::kClosed;
        error_ = std::string("the server closed the connection during the TLS ") + what;
        return TlsStatus::kError;
      }
      sys_errno_ = saved_errno;
      error_ = std::string(what) + ": " + netio::errno_text(saved_errno);
      return TlsStatus::kError;
    }
    error_ = std::string("TLS ") + what + " failed: " + (reason.empty() ? "unknown error" : reason);
  } catch (...) {  // out of memory for the message
  }
  return TlsStatus::kError;
}

TlsStatus TlsConn::handshake() noexcept {
  auto* ssl = static_cast<SSL*>(ssl_);
  ERR_clear_error();
  errno = 0;
  const int r = SSL_connect(ssl);
  if (r != 1) {
    const TlsStatus st = fail(r, "handshake");
    if (st == TlsStatus::kClosed) {
      error_ = "the server closed the connection during the TLS handshake";
      return TlsStatus::kError;
    }
    return st;
  }
  const unsigned char* chosen = nullptr;
  unsigned chosen_len = 0;
  SSL_get0_alpn_selected(ssl, &chosen, &chosen_len);
  const std::string got(reinterpret_cast<const char*>(chosen), chosen_len);
  // HTTP/1.1 is the default of a server that does not answer ALPN; HTTP/2 is not.
  if (ctx_.alpn() == "h2" && got != "h2") {
    try {
      error_ = "the server did not choose HTTP/2 in the TLS handshake (ALPN h2; it chose " +
               (got.empty() ? std::string("none") : "'" + got + "'") + "): gRPC needs HTTP/2";
    } catch (...) {
    }
    return TlsStatus::kError;
  }
  return TlsStatus::kOk;
}

TlsStatus TlsConn::handshake_blocking(int64_t timeout_ns) noexcept {
  const int64_t deadline = now_ns() + timeout_ns;
  for (;;) {
    const TlsStatus st = handshake();
    if (st != TlsStatus::kWantRead && st != TlsStatus::kWantWrite) return st;
    const int64_t left = deadline - now_ns();
    pollfd p{fd_, static_cast<short>(st == TlsStatus::kWantRead ? POLLIN : POLLOUT), 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left / 1'000'000))) <= 0) {
      error_ = "the TLS handshake timed out";
      return TlsStatus::kError;
    }
  }
}

TlsStatus TlsConn::read(char* buf, size_t len, size_t* n) noexcept {
  // The thread's error queue is empty here (fail() empties it; the constructor did
  // first): no ERR_clear_error() on every read and write (about 1% of a busy client's CPU).
  *n = 0;
  errno = 0;
  const int r = SSL_read(static_cast<SSL*>(ssl_), buf, static_cast<int>(std::min<size_t>(len, INT_MAX)));
  if (r > 0) {
    *n = static_cast<size_t>(r);
    return TlsStatus::kOk;
  }
  return fail(r, "read");
}

TlsStatus TlsConn::write(const char* buf, size_t len, size_t* n) noexcept {
  *n = 0;
  if (len == 0) return TlsStatus::kOk;
  errno = 0;  // the error queue is empty: see read()
  const int r = SSL_write(static_cast<SSL*>(ssl_), buf, static_cast<int>(std::min<size_t>(len, INT_MAX)));
  if (r > 0) {
    *n = static_cast<size_t>(r);
    return TlsStatus::kOk;
  }
  const TlsStatus st = fail(r, "write");
  if (st == TlsStatus::kClosed) {
    sys_errno_ = EPIPE;
    error_ = "write: " + netio::errno_text(EPIPE);
    return TlsStatus::kError;
  }
  return st;
}

bool TlsConn::pending() const noexcept {
  auto* ssl = static_cast<SSL*>(ssl_);
  return SSL_pending(ssl) > 0 || SSL_has_pending(ssl) == 1;
}

bool TlsConn::resumed() const noexcept { return SSL_session_reused(static_cast<SSL*>(ssl_)) == 1; }

void TlsConn::await_ticket(int64_t timeout_ns) noexcept {
  auto* ssl = static_cast<SSL*>(ssl_);
  if (SSL_version(ssl) != TLS1_3_VERSION) return;  // TLS 1.2's session came with the handshake
  const int64_t deadline = now_ns() + timeout_ns;
  while (!ctx_.has_session()) {
    const int64_t left = deadline - now_ns();
    if (left <= 0) return;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left / 1'000'000))) <= 0) return;
    char byte;
    ERR_clear_error();
    const int r = SSL_peek(ssl, &byte, 1);  // takes the ticket, leaves any data
    if (r > 0 || SSL_get_error(ssl, r) != SSL_ERROR_WANT_READ) return;
  }
}

std::string tls_check(const std::string& host, int port, const std::string& server_name, const std::string& ca_file,
                      bool insecure, const std::string& alpn, int64_t timeout_ns) {
  TlsContext ctx(ca_file, insecure, alpn);
  int err = 0;
  const int fd = netio::connect_nonblocking(host, port, &err);
  const std::string where = "connecting to " + host + ":" + std::to_string(port) + ": ";
  if (fd < 0) return where + netio::errno_text(err);
  err = netio::finish_connect(fd, timeout_ns);
  if (err != 0) {
    ::close(fd);
    return where + netio::errno_text(err);
  }
  std::string out;
  try {
    TlsConn conn(ctx, fd, server_name);
    if (conn.handshake_blocking(timeout_ns) != TlsStatus::kOk) out = conn.error();
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

#endif  // LOADGEN_HAVE_OPENSSL

}  // namespace loadgen
