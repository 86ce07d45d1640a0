// libFuzzer target for the native HTTP/1.1 response parser (csrc/http_parser.cc). Built by
// scripts/fuzz.sh with clang -fsanitize=fuzzer,address,undefined.
//
// Byte 0: bit 0 a HEAD request, the rest seeds how the input is split into pieces (some
// empty). Byte 1 picks small limits, so that every bound is reached. The rest is what the
// server sends. Each input is parsed three times: collected and split, streamed and split,
// collected and whole. Each run must end in exactly one verdict with sane results; a
// response complete when collected must be the same response streamed and whole (the
// limits only ever turn a response into an error). Anything else is a crash. Over TLS
// (csrc/tls.cc) the parser is fed what OpenSSL decrypted, in the pieces it returns: the
// same input space, so this target covers that path too.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "http_parser.h"

namespace {

using loadgen::HttpParserLimits;
using loadgen::HttpResponseParser;

#define CHECK(cond)            \
  do {                         \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct Run {
  enum { kComplete, kEof, kError, kNone } end = kNone;
  int status = 0;
  bool keep_alive = false;
  size_t offset = 0;  // input bytes taken by the response
  std::string body;
  std::string kind;
};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

Run parse(const uint8_t* data, size_t size, const std::vector<size_t>& cuts, bool head_only, bool stream,
          const HttpParserLimits& limits) {
  HttpResponseParser p(limits);
  Run run;
  std::string streamed;
  if (stream) p.set_body_callback([&](const char* d, size_t n) { streamed.append(d, n); });
  p.start(head_only);
  CHECK(!p.got_bytes());
  size_t off = 0;
  bool any = false;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t end = i < cuts.size() ? cuts[i] : size;
    const size_t n = end - off;
    size_t consumed = 12345;
    const auto r = p.feed(reinterpret_cast<const char*>(data) + off, n, &consumed);
    any |= n > 0;
    CHECK(p.got_bytes() == any);
    if (r == HttpResponseParser::Result::kError) {
      run.end = Run::kError;
      run.kind = p.error_kind();
      if (run.kind == "invalid_response") {
        CHECK(starts_with(p.error_message(), "malformed HTTP response: "));
      } else {
        CHECK(run.kind == "response_too_large");
        CHECK(!stream);
        CHECK(starts_with(p.error_message(), "HTTP "));
        CHECK(p.error_message().find("response over --max-response-bytes (") != std::string::npos);
      }
      CHECK(!p.eof_completes());
      return run;
    }
    CHECK(p.error_kind().empty() && p.error_message().empty());
    if (r == HttpResponseParser::Result::kComplete) {
      CHECK(consumed <= n);
      run.end = Run::kComplete;
      run.offset = off + consumed;
      break;
    }
    CHECK(r == HttpResponseParser::Result::kNeedMore && consumed == n);
    off = end;
  }
  if (run.end == Run::kNone) {
    if (!p.eof_completes()) return run;
    run.end = Run::kEof;
    run.offset = size;
    CHECK(!p.keep_alive());
  }
  run.status = p.status();
  CHECK(!(run.status >= 100 && run.status < 200));
  run.keep_alive = p.keep_alive();
  if (stream) {
    CHECK(p.body().empty());
    run.body = streamed;
  } else {
    CHECK(static_cast<int64_t>(p.body().size()) <= limits.max_body_bytes);
    run.body = p.take_body();
    CHECK(p.body().empty());
  }
  if (head_only || run.status == 204 || run.status == 304) CHECK(run.body.empty());
  return run;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool head_only = data[0] & 1;
  unsigned seed = data[0] >> 1;
  static const int64_t kHeads[] = {8, 64, 300, 64 * 1024};
  static const int64_t kBodies[] = {1, 16, 1000, 64LL << 20};
  HttpParserLimits limits;
  limits.max_head_bytes = kHeads[data[1] & 3];
  limits.max_body_bytes = kBodies[(data[1] >> 2) & 3];
  data += 2;
  size -= 2;

  std::vector<size_t> cuts;  // where pieces end; a repeated cut is an empty piece
  for (size_t at = 0; seed != 0 && at < size;) {
    at += seed % 17;
    cuts.push_back(at < size ? at : size);
    seed = seed * 1103515245u + 12345u;
    seed = (seed >> 16) & 0x7f;
    if (seed == 0) seed = 1;
    if (cuts.size() > 4096) break;
  }

  const Run split = parse(data, size, cuts, head_only, false, limits);
  const Run streamed = parse(data, size, cuts, head_only, true, limits);
  const Run whole = parse(data, size, {}, head_only, false, limits);
  if (split.end == Run::kComplete || split.end == Run::kEof) {
    for (const Run* other : {&streamed, &whole}) {
      CHECK(other->end == split.end);
      CHECK(other->status == split.status && other->keep_alive == split.keep_alive);
      CHECK(other->offset == split.offset && other->body == split.body);
    }
  }
  if (streamed.end == Run::kError) CHECK(split.end == Run::kError);
  return 0;
}
