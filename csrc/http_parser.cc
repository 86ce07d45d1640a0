#include "http_parser.h"

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

namespace loadgen {
namespace {

constexpr size_t kNpos = static_cast<size_t>(-1);
// A size past this is never reached by real bytes; it stands for anything larger.
constexpr int64_t kHuge = int64_t{1} << 62;
// Python's default bound on the digits of an int converted from or to decimal text
// (sys.get_int_max_str_digits()); the asyncio parser's messages depend on it.
constexpr size_t kMaxStrDigits = 4300;

// The bytes Python's bytes.strip() and int() take as whitespace.
inline bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
inline bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
inline int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
inline unsigned char lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// First "\r\n" in p[from..n), or kNpos.
size_t find_crlf(const char* p, size_t n, size_t from) {
  while (from + 1 < n) {
    const void* hit = std::memchr(p + from, '\r', n - from - 1);
    if (hit == nullptr) return kNpos;
    const size_t i = static_cast<size_t>(static_cast<const char*>(hit) - p);
    if (p[i + 1] == '\n') return i;
    from = i + 1;
  }
  return kNpos;
}

// First "\r\n\r\n" in p[from..n), or kNpos.
size_t find_crlfcrlf(const char* p, size_t n, size_t from) {
  // memchr for each CR (vectorised) beats memmem's set-up for a needle this short.
  while (from + 3 < n) {
    const void* hit = std::memchr(p + from, '\r', n - from - 3);
    if (hit == nullptr) return kNpos;
    const size_t i = static_cast<size_t>(static_cast<const char*>(hit) - p);
    if (p[i + 1] == '\n' && p[i + 2] == '\r' && p[i + 3] == '\n') return i;
    from = i + 1;
  }
  return kNpos;
}

// Where to resume a search for a delimiter of `width` bytes after n bytes had none.
inline size_t resume_at(size_t n, size_t width) { return n >= width - 1 ? n - (width - 1) : 0; }

// Whether p[0..n) starts with the lowercase ASCII `pattern`, ignoring ASCII case.
bool starts_with_nocase(const char* p, size_t n, const char* pattern, size_t m) {
  if (n < m) return false;
  for (size_t i = 0; i < m; ++i) {
    if (lower(static_cast<unsigned char>(p[i])) != static_cast<unsigned char>(pattern[i])) return false;
  }
  return true;
}

// Whether p[0..n) contains the lowercase ASCII `pattern`, ignoring ASCII case.
bool contains_nocase(const char* p, size_t n, const char* pattern, size_t m) {
  for (size_t i = 0; i + m <= n; ++i) {
    if (starts_with_nocase(p + i, n - i, pattern, m)) return true;
  }
  return false;
}

// Python's repr() of a bytes object, as the asyncio parser puts it in its messages.
std::string bytes_repr(const char* p, size_t n, bool lowered = false) {
  bool has_single = false, has_double = false;
  for (size_t i = 0; i < n; ++i) {
    has_single |= p[i] == '\'';
    has_double |= p[i] == '"';
  }
  const char quote = (has_single && !has_double) ? '"' : '\'';
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(n + 3);
  out += 'b';
  out += quote;
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(p[i]);
    if (lowered) c = lower(c);
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < ' ' || c >= 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

// The decimal text of the hexadecimal digits p[0..n) (no leading zeros), or "" when it
// would be longer than Python converts (kMaxStrDigits).
std::string hex_to_decimal(const char* p, size_t n) {
  // 16^3571 < 10^4300 < 16^3572: only 3572 significant digits need the full conversion.
  if (n > 3572) return {};
  std::vector<uint32_t> limbs;  // base 1e9, least significant first
  for (size_t i = 0; i < n; ++i) {
    uint64_t carry = static_cast<uint64_t>(hex_value(static_cast<unsigned char>(p[i])));
    for (uint32_t& limb : limbs) {
      const uint64_t v = uint64_t{limb} * 16 + carry;
      limb = static_cast<uint32_t>(v % 1000000000u);
      carry = v / 1000000000u;
    }
    while (carry) {
      limbs.push_back(static_cast<uint32_t>(carry % 1000000000u));
      carry /= 1000000000u;
    }
  }
  if (limbs.empty()) return "0";
  std::string out = std::to_string(limbs.back());
  for (size_t i = limbs.size() - 1; i-- > 0;) {
    const std::string part = std::to_string(limbs[i]);
    out.append(9 - part.size(), '0');
    out += part;
  }
  if (out.size() > kMaxStrDigits) return {};
  return out;
}

const char kStrDigitsError[] =
    "Exceeds the limit (4300 digits) for integer string conversion; "
    "use sys.set_int_max_str_digits() to increase the limit";

}  // namespace

HttpResponseParser::HttpResponseParser(HttpParserLimits limits) : limits_(limits) {
  if (limits_.max_head_bytes < 1) {
    throw std::invalid_argument("max_head_bytes must be >= 1, got " + std::to_string(limits_.max_head_bytes));
  }
  if (limits_.max_body_bytes < 1) {
    throw std::invalid_argument("max_body_bytes must be >= 1, got " + std::to_string(limits_.max_body_bytes));
  }
}

void HttpResponseParser::start(bool head_only) {
  state_ = State::kHead;
  head_only_ = head_only;
  stream_ = static_cast<bool>(on_body_);
  keep_alive_ = true;
  got_bytes_ = false;
  status_ = 0;
  remaining_ = 0;
  body_bytes_ = 0;
  scan_ = 0;
  line_end_ = 0;
  in_trailers_ = false;
  buf_.clear();
  body_.clear();
  error_kind_.clear();
  error_message_.clear();
}

void HttpResponseParser::set_body_callback(std::function<void(const char*, size_t)> cb) {
  on_body_ = std::move(cb);
}

std::string HttpResponseParser::take_body() {
  std::string out = std::move(body_);
  body_.clear();
  return out;
}

std::string HttpResponseParser::limit_text() const {
  const int64_t n = limits_.max_head_bytes;
  return n % 1024 == 0 ? std::to_string(n / 1024) + " KiB" : std::to_string(n) + " bytes";
}

HttpResponseParser::Result HttpResponseParser::invalid(const std::string& what) {
  state_ = State::kError;
  error_kind_ = "invalid_response";
  error_message_ = "malformed HTTP response: " + what;
  return Result::kError;
}

HttpResponseParser::Result HttpResponseParser::too_large(const std::string& what) {
  state_ = State::kError;
  error_kind_ = "response_too_large";
  error_message_ = "HTTP " + std::to_string(status_) + " response over --max-response-bytes (" +
                   std::to_string(limits_.max_body_bytes) + " bytes): " + what + "; the connection was closed";
  return Result::kError;
}

bool HttpResponseParser::piece(const char* data, size_t n) {
  if (stream_) {
    on_body_(data, n);
    return true;
  }
  body_bytes_ += static_cast<int64_t>(n);
  if (body_bytes_ > limits_.max_body_bytes) {
    too_large(std::to_string(body_bytes_) + " bytes of body so far");
    return false;
  }
  body_.append(data, n);
  return true;
}

HttpResponseParser::Result HttpResponseParser::feed(const char* data, size_t n, size_t* consumed) {
  if (state_ == State::kDone || state_ == State::kError) {
    throw std::logic_error("HttpResponseParser::feed after the response ended; call start() first");
  }
  if (n > 0) got_bytes_ = true;
  const char* p = data;
  size_t len = n;
  size_t carried = 0;  // bytes of the view that came from earlier calls
  if (!buf_.empty()) {
    carried = buf_.size();
    buf_.append(data, n);
    p = buf_.data();
    len = buf_.size();
  }
  size_t pos = 0;
  Result r;
  try {
    r = run(p, len, &pos);
  } catch (...) {  // from the body callback: what was carried is of no use now
    state_ = State::kError;
    buf_.clear();
    throw;
  }
  if (r == Result::kNeedMore) {
    // [pos, len) is an incomplete element: keep it for the next call.
    if (carried) {
      buf_.erase(0, pos);
    } else {
      buf_.assign(p + pos, len - pos);
    }
    *consumed = n;
    return r;
  }
  buf_.clear();
  *consumed = pos >= carried ? pos - carried : 0;
  return r;
}

HttpResponseParser::Result HttpResponseParser::run(const char* p, size_t len, size_t* at) {
  size_t pos = *at;
  for (;;) {
    const size_t avail = len - pos;
    switch (state_) {
      case State::kHead: {
        const size_t end = find_crlfcrlf(p + pos, avail, scan_);
        if (end == kNpos) {
          *at = pos;
          if (static_cast<int64_t>(avail) > limits_.max_head_bytes) {
            return invalid("response headers longer than " + limit_text());
          }
          scan_ = resume_at(avail, 4);
          return Result::kNeedMore;
        }
        const char* head = p + pos;
        pos += end + 4;
        scan_ = 0;
        *at = pos;
        const Result r = on_head(head, end);
        if (r != Result::kNeedMore) return r;
        break;  // 1xx skipped, or a body follows
      }
      case State::kBodyLength: {
        const size_t take = remaining_ < static_cast<int64_t>(avail) ? static_cast<size_t>(remaining_) : avail;
        if (take) {
          if (!piece(p + pos, take)) {
            *at = pos;
            return Result::kError;
          }
          pos += take;
          remaining_ -= static_cast<int64_t>(take);
        }
        *at = pos;
        if (remaining_) return Result::kNeedMore;
        state_ = State::kDone;
        return Result::kComplete;
      }
      case State::kChunkLine: {
        size_t used = 0;
        const Result r = on_chunk_line(p + pos, avail, &used);
        pos += used;
        *at = pos;
        if (r != Result::kNeedMore || state_ == State::kChunkLine) return r;
        break;  // on to the chunk's data
      }
      case State::kChunkData: {
        if (remaining_ > 2) {
          const int64_t want = remaining_ - 2;
          const size_t take = want < static_cast<int64_t>(avail) ? static_cast<size_t>(want) : avail;
          if (take) {
            if (!piece(p + pos, take)) {
              *at = pos;
              return Result::kError;
            }
            pos += take;
            remaining_ -= static_cast<int64_t>(take);
          }
        }
        *at = pos;
        if (remaining_ > 2) return Result::kNeedMore;
        // remaining_ is 2 now (the data never takes the CRLF's share): both bytes are
        // needed before either is judged.
        if (len - pos < 2) return Result::kNeedMore;
        if (p[pos] != '\r' || p[pos + 1] != '\n') return invalid("chunk not followed by CRLF");
        pos += 2;
        remaining_ = 0;
        state_ = State::kChunkLine;
        scan_ = 0;
        *at = pos;
        break;
      }
      case State::kBodyEof: {
        if (avail && !piece(p + pos, avail)) {
          *at = pos;
          return Result::kError;
        }
        *at = len;
        return Result::kNeedMore;
      }
      case State::kDone:
      case State::kError:
        *at = pos;
        return state_ == State::kDone ? Result::kComplete : Result::kError;
    }
  }
}

HttpResponseParser::Result HttpResponseParser::on_head(const char* head, size_t n) {
  // The status line: "HTTP/1.x", a space, a code of exactly three digits (the first not
  // 0), then nothing or a space or tab and a reason without CR; one CR may end it. A code
  // of more or fewer digits would be misread as one of three.
  const void* lf = std::memchr(head, '\n', n);
  const size_t line = lf != nullptr ? static_cast<size_t>(static_cast<const char*>(lf) - head) : n;
  bool ok = line >= 12 && std::memcmp(head, "HTTP/1.", 7) == 0 && is_digit(static_cast<unsigned char>(head[7])) &&
            head[8] == ' ' && head[9] >= '1' && head[9] <= '9' && is_digit(static_cast<unsigned char>(head[10])) &&
            is_digit(static_cast<unsigned char>(head[11]));
  if (ok) {
    size_t end = line;
    if (end > 12 && head[end - 1] == '\r') --end;  // the one CR that may end the line
    if (end > 12) {
      ok = head[12] == ' ' || head[12] == '\t';
      for (size_t i = 13; ok && i < end; ++i) ok = head[i] != '\r';
    }
  }
  if (!ok) return invalid("status line " + bytes_repr(head, line < 40 ? line : 40));
  const int status = (head[9] - '0') * 100 + (head[10] - '0') * 10 + (head[11] - '0');
  if (status >= 100 && status < 200) return Result::kNeedMore;  // informational: the real head follows
  status_ = status;

  // Each header line follows a CRLF; the first of each name counts (Connection: close
  // anywhere). Names compare ignoring ASCII case.
  bool close = false;
  size_t te = kNpos, cl = kNpos;  // where the value of the first such header starts
  for (size_t i = find_crlf(head, n, 0); i != kNpos; i = find_crlf(head, n, i + 2)) {
    const char* line = head + i + 2;
    const size_t rest = n - i - 2;
    if (rest == 0) break;
    const unsigned char c = lower(static_cast<unsigned char>(line[0]));
    if (c == 'c') {
      if (!close && starts_with_nocase(line, rest, "connection: close", 17)) close = true;
      if (cl == kNpos && starts_with_nocase(line, rest, "content-length:", 15)) cl = i + 2 + 15;
    } else if (c == 't') {
      if (te == kNpos && starts_with_nocase(line, rest, "transfer-encoding:", 18)) te = i + 2 + 18;
    }
  }
  keep_alive_ = !(close || (n >= 8 && std::memcmp(head, "HTTP/1.0", 8) == 0));
  if (head_only_ || status == 204 || status == 304) {
    state_ = State::kDone;
    return Result::kComplete;
  }
  if (te != kNpos) {
    size_t end = find_crlf(head, n, te);
    if (end == kNpos) end = n;
    if (contains_nocase(head + te, end - te, "chunked", 7)) {
      state_ = State::kChunkLine;
      remaining_ = 0;
      scan_ = 0;
      in_trailers_ = false;
      return Result::kNeedMore;
    }
  }
  if (cl != kNpos) {
    size_t end = find_crlf(head, n, cl);
    if (end == kNpos) end = n;
    size_t b = cl;
    while (b < end && is_space(static_cast<unsigned char>(head[b]))) ++b;
    while (end > b && is_space(static_cast<unsigned char>(head[end - 1]))) --end;
    const char* value = head + b;
    const size_t vn = end - b;
    bool digits = vn > 0;
    for (size_t i = 0; digits && i < vn; ++i) digits = is_digit(static_cast<unsigned char>(value[i]));
    if (!digits) {
      return invalid("Content-Length " + bytes_repr(value, vn < 20 ? vn : 20, true) +
                     " is not a non-negative integer");
    }
    if (vn > kMaxStrDigits) {
      return invalid("Exceeds the limit (4300 digits) for integer string conversion: value has " +
                     std::to_string(vn) + " digits; use sys.set_int_max_str_digits() to increase the limit");
    }
    size_t z = 0;
    while (z + 1 < vn && value[z] == '0') ++z;  // leading zeros
    const size_t sig = vn - z;
    int64_t length = kHuge;
    if (sig <= 18) {
      length = 0;
      for (size_t i = z; i < vn; ++i) length = length * 10 + (value[i] - '0');
    }
    if (!stream_ && length > limits_.max_body_bytes) {
      return too_large("Content-Length " + std::string(value + z, sig));
    }
    remaining_ = length;
    state_ = State::kBodyLength;
    // One allocation for the body, not a doubling per piece (within the limit, checked above).
    if (!stream_ && length > 0 && length <= (int64_t{1} << 20)) body_.reserve(static_cast<size_t>(length));
    if (remaining_ == 0) {
      state_ = State::kDone;
      return Result::kComplete;
    }
    return Result::kNeedMore;
  }
  state_ = State::kBodyEof;
  keep_alive_ = false;
  return Result::kNeedMore;
}

// At a chunk-size line (p = its start). *used: bytes taken (0 while it waits for more).
// Returns kNeedMore with state_ still kChunkLine to wait, or with state_ kChunkData to go on.
HttpResponseParser::Result HttpResponseParser::on_chunk_line(const char* p, size_t avail, size_t* used) {
  *used = 0;
  size_t end = line_end_;
  if (!in_trailers_) {
    end = find_crlf(p, avail, scan_);
    if (end == kNpos) {
      if (static_cast<int64_t>(avail) > limits_.max_head_bytes) {
        return invalid("chunk-size line longer than " + limit_text());
      }
      scan_ = resume_at(avail, 2);
      return Result::kNeedMore;
    }
    size_t e = end;
    const void* semi = std::memchr(p, ';', end);
    if (semi != nullptr) e = static_cast<size_t>(static_cast<const char*>(semi) - p);
    size_t b = 0;
    while (b < e && is_space(static_cast<unsigned char>(p[b]))) ++b;
    while (e > b && is_space(static_cast<unsigned char>(p[e - 1]))) --e;
    bool hex = e > b;
    for (size_t i = b; hex && i < e; ++i) hex = hex_value(static_cast<unsigned char>(p[i])) >= 0;
    if (!hex) {
      const size_t shown = e - b < 20 ? e - b : 20;
      return invalid("bad chunk size " + bytes_repr(p + b, shown));
    }
    while (b + 1 < e && p[b] == '0') ++b;  // leading zeros
    const size_t sig = e - b;
    if (sig == 1 && p[b] == '0') {  // the last chunk: trailers follow, up to a blank line
      in_trailers_ = true;
      line_end_ = end;
      scan_ = end;
    } else {
      int64_t size = kHuge;
      if (sig <= 15) {
        size = 0;
        for (size_t i = b; i < e; ++i) size = size * 16 + hex_value(static_cast<unsigned char>(p[i]));
      }
      if (!stream_ && size > limits_.max_body_bytes - body_bytes_) {
        const std::string decimal = sig <= 15 ? std::to_string(size) : hex_to_decimal(p + b, sig);
        if (decimal.empty()) return invalid(kStrDigitsError);
        return too_large("a chunk of " + decimal + " bytes after " + std::to_string(body_bytes_) +
                         " bytes of body");
      }
      *used = end + 2;
      remaining_ = size + 2;  // the data and its CRLF
      state_ = State::kChunkData;
      scan_ = 0;
      return Result::kNeedMore;
    }
  }
  const size_t tail = find_crlfcrlf(p, avail, scan_);
  if (tail == kNpos) {
    if (static_cast<int64_t>(avail) > limits_.max_head_bytes) {
      return invalid("chunked trailers longer than " + limit_text());
    }
    const size_t resume = resume_at(avail, 4);
    scan_ = resume > end ? resume : end;
    return Result::kNeedMore;
  }
  *used = tail + 4;
  state_ = State::kDone;
  return Result::kComplete;
}

double time_http_parse_ns(const char* response, size_t n, int pieces, int64_t iterations) {
  if (pieces < 1) throw std::invalid_argument("pieces must be >= 1");
  if (iterations < 1) throw std::invalid_argument("iterations must be >= 1");
  if (n == 0) throw std::invalid_argument("response must not be empty");
  HttpResponseParser parser;
  const size_t step = (n + static_cast<size_t>(pieces) - 1) / static_cast<size_t>(pieces);
  size_t body_total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iterations; ++it) {
    parser.start();
    HttpResponseParser::Result r = HttpResponseParser::Result::kNeedMore;
    size_t off = 0;
    while (off < n && r == HttpResponseParser::Result::kNeedMore) {
      const size_t k = n - off < step ? n - off : step;
      size_t used = 0;
      r = parser.feed(response + off, k, &used);
      off += used;
    }
    if (r != HttpResponseParser::Result::kComplete || off != n) {
      throw std::invalid_argument("the response does not parse as exactly one complete response" +
                                  (parser.error_message().empty() ? "" : ": " + parser.error_message()));
    }
    body_total += parser.body().size();
  }
  const auto t1 = std::chrono::steady_clock::now();
  asm volatile("" : : "r"(body_total) : "memory");  // keeps the loop's work observable
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iterations);
}

}  // namespace loadgen
