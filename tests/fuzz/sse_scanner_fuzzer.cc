// libFuzzer target for the native SSE scanner of OpenAI streams (csrc/sse.cc). Built by
// scripts/fuzz.sh with clang -fsanitize=fuzzer,address,undefined. A stream read over TLS
// (csrc/tls.cc) reaches the scanner decrypted, in the pieces OpenSSL returns: the same input.
//
// Byte 0 seeds how the input is split into pieces (some empty), byte 1 picks the event
// bound (its bits 0-1) and whether the stream is a /v1/responses one (bit 2). The rest is a stream's body. Each piece is stamped one tick later. Every run
// must give sane results: a gap per token after the first, gaps >= 0, a problem's data
// kept exactly when there is a problem. Without '\r' in the input, events end at "\n\n"
// only, so that how the input is split cannot change the outcome (with a bound no event
// reaches): split and whole runs must agree then. The same bytes as a whole non-streamed
// answer: read_whole_answer() gives counts in range, and takes only an answer that the
// scanner reads, as one event's data, as a good usage event with the same counts.
// Anything else is a crash.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sse.h"

namespace {

using loadgen::SseProblem;
using loadgen::SseScanner;

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct Run {
  bool over = false;
  int64_t chunks = 0, usage = -1;
  bool done = false, finished = false;
  SseProblem problem = SseProblem::kNone;
  std::string data;
};

Run scan(const uint8_t* data, size_t size, const std::vector<size_t>& cuts, int64_t limit, bool responses) {
  SseScanner s(limit, responses);
  s.start();
  Run run;
  size_t off = 0;
  int64_t t = 1;
  for (size_t i = 0; i <= cuts.size(); ++i, ++t) {
    const size_t end = i < cuts.size() ? cuts[i] : size;
    if (!s.feed(reinterpret_cast<const char*>(data) + off, end - off, t)) {
      CHECK(s.held_over() > limit && s.held().empty());
      run.over = true;
      break;
    }
    CHECK(static_cast<int64_t>(s.held().size()) <= limit);
    off = end;
  }
  if (!run.over) s.finish(t);
  CHECK(s.chunks() >= 0 && s.tool_calls() >= 0);
  CHECK(s.gaps().size() == static_cast<size_t>(s.chunks() > 0 ? s.chunks() - 1 : 0));
  for (const int64_t g : s.gaps()) CHECK(g >= 0);
  CHECK((s.chunks() > 0) == (s.first_ns() > 0) && s.last_ns() >= s.first_ns());
  CHECK((s.problem() == SseProblem::kNone) == s.problem_data().empty());
  // Reasoning tokens are tokens of the stream; each event that held tokens is kept once.
  CHECK(s.reasoning_chunks() >= 0 && s.reasoning_chunks() <= s.chunks());
  CHECK((s.reasoning_chunks() > 0) == (s.first_reasoning_ns() > 0));
  CHECK((s.chunks() > s.reasoning_chunks()) == (s.first_answer_ns() > 0));
  CHECK(s.first_reasoning_ns() == 0 || s.first_reasoning_ns() >= s.first_ns());
  CHECK(s.first_answer_ns() == 0 || s.first_answer_ns() >= s.first_ns());
  int64_t event_tokens = 0;
  for (size_t j = 0; j < s.event_ns().size(); ++j) {
    CHECK(s.event_tokens()[j] >= 1 && s.event_weights()[j] >= 1);
    event_tokens += s.event_tokens()[j];
  }
  CHECK(event_tokens == s.chunks());
  // The per-token ITL: values >= 1 ns, counts that never exceed the tokens spread.
  for (const int64_t total : {s.usage_tokens(), int64_t{-1}}) {
    int64_t counted = 0;
    s.token_itl(total, [&](int64_t value, int64_t k) {
      CHECK(value >= 1 && k >= 1);
      counted += k;
    });
    CHECK(counted <= (total >= 0 ? total : s.chunks()));
  }
  run.chunks = s.chunks();
  run.usage = s.usage_tokens();
  run.done = s.done();
  run.finished = s.finished();
  run.problem = s.problem();
  run.data = s.problem_data();
  return run;
}

void check_whole(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  loadgen::WholeAnswer a;
  if (!loadgen::read_whole_answer(p, size, &a)) return;
  CHECK(a.tokens >= 0 && a.tokens <= loadgen::kMaxTokenCount);
  CHECK(a.reasoning_tokens >= -1 && a.reasoning_tokens <= loadgen::kMaxTokenCount);
  // One line of data, whose "usage" key is written plainly (the scanner's fast path looks
  // for those bytes; an escaped key is a key the scanner's JSON reader reads alike).
  const std::string body(p, size);
  if (body.find_first_of("\r\n") != std::string::npos || body.find("\"usage\"") == std::string::npos) return;
  const std::string event = "data: " + body + "\n\n";
  SseScanner s(1 << 20);
  s.start();
  CHECK(s.feed(event.data(), event.size(), 1));
  s.finish(2);
  CHECK(s.problem() == SseProblem::kNone && s.usage_tokens() == a.tokens);
  CHECK(s.usage_reasoning_tokens() == a.reasoning_tokens);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  check_whole(data + 2, size - 2);
  unsigned seed = data[0];
  static const int64_t kLimits[] = {1, 16, 300, 1 << 20};
  const int64_t limit = kLimits[data[1] & 3];
  const bool responses = (data[1] & 4) != 0;
  data += 2;
  size -= 2;
  std::vector<size_t> cuts;
  for (size_t at = 0; seed != 0 && at < size;) {
    at += seed % 17;
    cuts.push_back(at < size ? at : size);
    seed = ((seed * 1103515245u + 12345u) >> 16) & 0x7f;
    if (seed == 0) seed = 1;
    if (cuts.size() > 4096) break;
  }
  const Run split = scan(data, size, cuts, limit, responses);
  if (limit == (1 << 20) && std::memchr(data, '\r', size) == nullptr) {
    const Run whole = scan(data, size, {}, limit, responses);
    CHECK(split.chunks == whole.chunks && split.usage == whole.usage && split.done == whole.done);
    CHECK(split.finished == whole.finished && split.problem == whole.problem && split.data == whole.data);
  }
  return 0;
}
