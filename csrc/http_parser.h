#pragma once
// An incremental HTTP/1.1 response parser for the native client, with the semantics of
// the asyncio client's parser (loadgen/net/http1.py): the same verdicts, error kinds and
// messages on the same bytes split the same way.
//
// Rules: the status line is "HTTP/1.x", a space, a code of exactly three digits (100 to
// 999), then nothing or a space or tab and a reason (any other line is malformed); 1xx
// heads are skipped (the real head follows); keep_alive is false on a "connection: close" header or HTTP/1.0; a HEAD request and 204/304 have no body;
// "transfer-encoding: ...chunked..." means chunked (hex-digit sizes, extensions after ';'
// ignored, trailers up to a blank line, each chunk followed by CRLF exactly); else a
// Content-Length (ASCII digits only); else the body runs until the server closes. The
// head, each chunk-size line and the trailers may take at most max_head_bytes each while
// they are incomplete; a collected body over max_body_bytes fails as response_too_large.
//
// Not thread-safe: one parser per connection, used by one thread at a time. In the steady
// state (a collected body taken with body(), or streamed) parsing allocates nothing: the
// carry-over buffer and the body keep their capacity from one response to the next.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace loadgen {

struct HttpParserLimits {
  int64_t max_head_bytes = 64 * 1024;   // the head, each chunk-size line, the trailers
  int64_t max_body_bytes = 64LL << 20;  // a collected body (--max-response-bytes)
};

class HttpResponseParser {
 public:
  enum class Result { kNeedMore, kComplete, kError };

  /// Throws std::invalid_argument unless both limits are >= 1.
  explicit HttpResponseParser(HttpParserLimits limits = {});

  /// Before each response on a connection: forgets everything of the previous one.
  void start(bool head_only = false);

  /// Parses data[0..n). kNeedMore: all consumed, more bytes are needed. kComplete: one
  /// whole response; *consumed = the bytes of data it took (the rest is past the
  /// response). kError: see error_kind() and error_message(); the connection cannot be
  /// reused. Bytes of an incomplete head, chunk-size line, trailers or chunk CRLF are
  /// kept across calls. After kComplete or kError, start() must come before the next
  /// feed (std::logic_error otherwise). An exception from the body callback propagates
  /// and leaves the parser needing start() as well.
  Result feed(const char* data, size_t n, size_t* consumed);

  /// The connection was closed by the server: true when that completes the response (a
  /// close-delimited body); the caller then treats it as kComplete.
  bool eof_completes() const noexcept { return state_ == State::kBodyEof; }

  int status() const noexcept { return status_; }
  bool keep_alive() const noexcept { return keep_alive_; }
  bool got_bytes() const noexcept { return got_bytes_; }     // any byte of this response seen
  const std::string& body() const noexcept { return body_; }  // empty when streaming
  std::string take_body();                                    // moves it out
  const std::string& error_kind() const noexcept { return error_kind_; }  // "invalid_response" | "response_too_large"
  const std::string& error_message() const noexcept { return error_message_; }

  /// Streaming: body pieces go to the callback as they arrive instead of being collected
  /// (no body limit then). Set before start(); nullptr to collect again.
  void set_body_callback(std::function<void(const char* data, size_t n)> cb);

  const HttpParserLimits& limits() const noexcept { return limits_; }

 private:
  enum class State : uint8_t { kHead, kBodyLength, kChunkLine, kChunkData, kBodyEof, kDone, kError };

  Result run(const char* p, size_t len, size_t* pos);
  Result on_head(const char* head, size_t n);
  Result on_chunk_line(const char* p, size_t avail, size_t* used);
  bool piece(const char* data, size_t n);
  Result invalid(const std::string& what);
  Result too_large(const std::string& what);
  std::string limit_text() const;

  HttpParserLimits limits_;
  std::function<void(const char*, size_t)> on_body_;
  std::string buf_;   // an incomplete element (head, chunk line, ...) carried to the next feed
  std::string body_;  // the collected body
  std::string error_kind_;
  std::string error_message_;
  State state_ = State::kDone;
  bool head_only_ = false;
  bool stream_ = false;
  bool keep_alive_ = true;
  bool got_bytes_ = false;
  int status_ = 0;
  int64_t remaining_ = 0;   // body bytes left (Content-Length), or chunk data + its CRLF
  int64_t body_bytes_ = 0;  // collected so far
  size_t scan_ = 0;         // where the search for the current delimiter resumes
  size_t line_end_ = 0;     // a last chunk's size line, while its trailers are incomplete
  bool in_trailers_ = false;
};

/// Parses `response` (one whole response) `iterations` times on one parser, fed in
/// `pieces` (>= 1) nearly equal pieces each time, and returns nanoseconds per response.
/// Throws std::invalid_argument when a pass does not end in exactly one complete response.
double time_http_parse_ns(const char* response, size_t n, int pieces, int64_t iterations);

}  // namespace loadgen
