#pragma once
// TLS for the native network clients (OpenSSL), over their own non-blocking sockets:
// one TlsContext per client (its SSL_CTX: the CA store or --ca-file, verification on
// unless insecure, the ALPN protocol, the session the run's connections resume), one
// TlsConn per connection. A TlsConn's calls never block: each says what it needs next
// (kWantRead, kWantWrite) and the I/O loop waits for that readiness; a read may need the
// socket writable and a write readable (a key update, a renegotiation).
//
// In a build without OpenSSL (tls_available() false) the types exist and a TlsContext
// cannot be made: it throws std::runtime_error saying why.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace loadgen {

/// Whether this build has TLS in the native clients (OpenSSL was found at build time).
bool tls_available() noexcept;
/// The OpenSSL version the native clients' TLS runs on ("" without it).
const char* tls_library_version() noexcept;

/// How long the first connection before a run waits for a TLS 1.3 session ticket (the
/// server sends it right after the handshake; on a busy host it may come late): only
/// TLS 1.3 servers that send no ticket make a run wait this long, once.
constexpr int64_t kTicketWaitNs = 3'000'000'000;

/// What a TlsConn call needs next.
enum class TlsStatus {
  kOk,         ///< done (a handshake finished; a read or write moved bytes)
  kWantRead,   ///< call again once the socket is readable
  kWantWrite,  ///< call again once the socket is writable
  kClosed,     ///< the peer closed the connection (read: end of stream)
  kError,      ///< failed: TlsConn::error() says why, TlsConn::sys_errno() the socket's error if any
};

/// A client's TLS settings and state shared by its connections: the SSL_CTX and the
/// session new connections resume. Thread-safe.
class TlsContext {
 public:
  /// `ca_file`: PEM CA bundle that verifies the server (empty: the system store);
  /// `insecure`: no verification at all; `alpn`: the one protocol offered ("h2",
  /// "http/1.1"). Throws std::runtime_error (a CA file that does not load, no OpenSSL).
  TlsContext(const std::string& ca_file, bool insecure, const std::string& alpn);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  const std::string& alpn() const noexcept { return alpn_; }
  bool insecure() const noexcept { return insecure_; }
  /// Whether a session to resume is held (a handshake, or a TLS 1.3 ticket, gave one).
  bool has_session() const noexcept;

 private:
  friend class TlsConn;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string alpn_;
  bool insecure_ = false;
};

/// One connection's TLS over a connected non-blocking socket `fd` (not owned: the
/// caller closes it after the TlsConn is gone). Used under its connection's lock.
class TlsConn {
 public:
  /// `server_name`: the URL's host: sent as SNI (a DNS name; not an IP address) and
  /// checked against the certificate (unless the context is insecure). Resumes the
  /// context's session when it holds one. Throws std::runtime_error (out of memory).
  TlsConn(TlsContext& ctx, int fd, const std::string& server_name);
  ~TlsConn();
  TlsConn(const TlsConn&) = delete;
  TlsConn& operator=(const TlsConn&) = delete;

  /// One step of the handshake: kOk once it is done (and the ALPN protocol checked).
  TlsStatus handshake() noexcept;
  /// The whole handshake, waiting (poll) at most `timeout_ns` for the socket: for the
  /// connections opened before the run. kOk, or kError with error() saying why.
  TlsStatus handshake_blocking(int64_t timeout_ns) noexcept;
  /// Up to `len` decrypted bytes into `buf` (*n of them; kOk means *n > 0).
  TlsStatus read(char* buf, size_t len, size_t* n) noexcept;
  /// Up to `len` bytes of `buf` encrypted and sent (*n of them). After kWantRead or
  /// kWantWrite, call again with the same bytes (more may follow them).
  TlsStatus write(const char* buf, size_t len, size_t* n) noexcept;
  /// Bytes OpenSSL holds already read from the socket (epoll cannot say they wait).
  bool pending() const noexcept;
  /// When the kernel received the bytes of the last socket read that returned any (the
  /// now_ns() clock; netio::read_stamped()), then 0 until the next such read: after a
  /// read(), the receive stamp of the bytes it decrypted (0: none read from the socket).
  int64_t take_kernel_ns() noexcept {
    const int64_t t = kernel_ns_;
    kernel_ns_ = 0;
    return t;
  }
  /// The handshake resumed an earlier session.
  bool resumed() const noexcept;
  /// Waits (poll, at most `timeout_ns`) for a TLS 1.3 session ticket after the
  /// handshake, without taking application data: so that the next connections resume.
  /// For a warm-up before the run.
  void await_ticket(int64_t timeout_ns) noexcept;
  /// Why the last call failed: a certificate that did not verify says which check
  /// ("certificate verify failed: certificate has expired").
  const std::string& error() const noexcept { return error_; }
  /// The socket's errno of a failed call (0: a TLS failure, not the socket's).
  int sys_errno() const noexcept { return sys_errno_; }

 private:
  TlsStatus fail(int ret, const char* what) noexcept;
  // The socket BIO's reads and writes (recvmsg with the kernel's stamp, send with
  // MSG_NOSIGNAL); the BIO's data is the TlsConn.
  friend struct TlsSocketBio;
  TlsContext& ctx_;
  int64_t kernel_ns_ = 0;
  void* ssl_ = nullptr;  // SSL*
  int fd_ = -1;
  std::string server_name_;
  std::string error_;
  int sys_errno_ = 0;
};

/// One blocking handshake with host:port (`host` numeric), as a client's connections
/// make it: "" when it succeeds, else why not (a certificate that did not verify, the
/// server's refusal, no ALPN `alpn` chosen, a connect or timeout). For prepare time,
/// before a run: the same checks the run's connections make, said at once.
std::string tls_check(const std::string& host, int port, const std::string& server_name, const std::string& ca_file,
                      bool insecure, const std::string& alpn, int64_t timeout_ns);

}  // namespace loadgen
