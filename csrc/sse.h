#pragma once
// The Server-Sent Events scanner of an OpenAI-compatible streamed completion
// (/v1/completions, /v1/chat/completions or /v1/responses with "stream": true), for the native HTTP
// client. It gives the answers of the asyncio client's TokenStream
// (loadgen/net/openai_stream.py) on the same bytes split the same way:
//
// - An event ends at the earlier of the first "\n\n" and the first "\r\n\r\n" held.
// - An event's data: the event less "data: " when it is one line starting "data: {",
//   else its "data:" lines (after "\r\n" -> "\n"), each less "data:" and its leading
//   ASCII whitespace, joined with "\n". Empty data is no event; "[DONE]" ends the stream.
// - Fast path: data "{...}" without "usage" or "error" in quotes is an answer token when
//   a non-empty "text" or "content" string is in it, else a reasoning token when a
//   non-empty "reasoning_content" or "reasoning" string is, else a finish when a
//   "finish_reason" string is (no JSON is read).
// - Else the data is read as JSON, as Python's json.loads reads it (NaN and Infinity
//   included, duplicate keys: the last wins). Not JSON, not an object, and an "error" key
//   are the stream's error (the first one is kept; later events still count). An int
//   usage.completion_tokens in 0..kMaxTokenCount is the stream's usage, one outside it the
//   stream's error (a bool is no count, as in Python); an int
//   usage.completion_tokens_details.reasoning_tokens in that range is the stream's
//   reasoning count (else none, and no error), and an int
//   usage.prompt_tokens_details.cached_tokens in that range the prompt's tokens the
//   server had cached (else none, and no error); each choice (an object in the "choices"
//   list) is an answer token when delta.content (delta an object), else text, is truthy
//   in Python's sense, else a reasoning token when delta.reasoning_content or
//   delta.reasoning is truthy, and a finish when its finish_reason is truthy.
// - A token of either kind is a token of the stream (first_ns(), gaps(), chunks()); the
//   reasoning ones are counted apart too. Each event that held tokens is kept (its time,
//   its tokens and its text weight: the raw bytes of every "text", "content",
//   "reasoning_content" and "reasoning" string in its data, as written, at least 1) for
//   the per-token inter-token latency (token_itl()).
//
// - Chat tool calls: a delta's "tool_calls" keeps an event off the fast path; each of its
//   elements (objects) with a truthy "id" starts a tool call (counted), and a choice with
//   no answer or reasoning token is an answer token when an element's function.arguments
//   is truthy. "arguments" strings add to the text weight.
//
// A /v1/responses stream (the scanner made with responses = true) has typed events, and
// every event's data is read as JSON (no fast path): not JSON and not an object are errors
// as above, and so are a truthy "error" and a "type" of "error" or "response.failed".
// "response.output_text.delta" and "response.function_call_arguments.delta" with a truthy
// "delta" are answer tokens, "response.reasoning_text.delta" and
// "response.reasoning_summary_text.delta" reasoning tokens; "response.output_item.added"
// whose item's "type" is "function_call" is a tool call; "response.completed" and
// "response.incomplete" end the stream (as [DONE] does; and a finish), their
// response.usage read as above with output_tokens, output_tokens_details.reasoning_tokens
// and input_tokens_details.cached_tokens. Other events count nothing. The text weight is
// the raw bytes of the data's "delta" strings.
//
// Where it differs from Python, on input no server sends: nesting deeper than
// kMaxJsonDepth is not JSON (Python's limit depends on its stack); a truthy "choices" that is a number or true (Python raises
// TypeError there) counts no choice.
//
// Not thread-safe: one scanner per connection. In the steady state it allocates nothing:
// the held bytes and the gaps keep their capacity from one stream to the next.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hdr_histogram.h"

namespace loadgen {

/// Why a stream fails (its first problem); the Python side words the message.
enum class SseProblem : uint8_t {
  kNone = 0,
  kNotJson = 1,     ///< an event is not JSON (problem_data(): its data)
  kNotObject = 2,   ///< an event is not a JSON object (problem_data(): its data)
  kErrorEvent = 3,  ///< an event has an "error" key (problem_data(): its data)
  // What the HTTP client adds when the stream ends (http_client.h):
  kHttpStatus = 4,  ///< the status was not 200 (the bytes held go with it)
  kNoTokens = 5,    ///< no token, no finish_reason and no usage of 0
  kNoDone = 6,      ///< no data: [DONE]
  kTooLarge = 7,    ///< an event over the limit (its length goes with it)
  kBadTokenCount = 8,  ///< usage.completion_tokens outside 0..kMaxTokenCount (problem_data(): its digits)
};

/// The most output tokens one answer may report (a request's record holds the count in
/// 32 bits): usage.completion_tokens past it, or below 0, fails the stream, and the engine
/// refuses a completion with more (so no sum of them can wrap).
inline constexpr int64_t kMaxTokenCount = 2147483647;

/// Nesting deeper than this is not JSON.
inline constexpr int kMaxJsonDepth = 900;

/// A usage object's counts as the scanner reads them (-1: none); `bad`: the digits of an
/// output token count out of range (nullptr: none).
struct UsageCounts {
  int64_t tokens = -1;
  int64_t reasoning = -1;
  int64_t cached = -1;
  const char* bad = nullptr;
  size_t bad_n = 0;
};

class SseScanner {
 public:
  /// `max_event_bytes` (>= 1): the most bytes held with no end of event. `responses`:
  /// the stream is a /v1/responses one (typed events; see the top of this file).
  explicit SseScanner(int64_t max_event_bytes = 64LL << 20, bool responses = false);

  /// Before each stream: forgets the previous one (keeping capacity).
  void start() noexcept;
  /// A piece of body that arrived at `t_ns`. False when what is held with no end of
  /// event is over max_event_bytes (held_over() bytes; nothing is held then).
  bool feed(const char* data, size_t n, int64_t t_ns);
  /// The stream's body ended at `t_ns`: what is held is an event when it is not all
  /// ASCII whitespace.
  void finish(int64_t t_ns);

  int64_t chunks() const noexcept { return chunks_; }              ///< tokens seen
  int64_t usage_tokens() const noexcept { return usage_tokens_; }  ///< -1: no usage
  bool done() const noexcept { return done_; }                     ///< data: [DONE] came
  bool finished() const noexcept { return finished_; }             ///< a finish_reason came
  int64_t first_ns() const noexcept { return first_ns_; }          ///< 0: no token yet
  int64_t last_ns() const noexcept { return last_ns_; }
  /// The gaps between consecutive tokens (ns), in order: the gaps between the chunks
  /// that carried them (0 between two choices of one event).
  const std::vector<int64_t>& gaps() const noexcept { return gaps_; }
  int64_t reasoning_chunks() const noexcept { return reasoning_chunks_; }  ///< reasoning tokens seen
  /// Tool calls the answer made (chat: tool_calls elements with a truthy id; responses:
  /// function_call items added).
  int64_t tool_calls() const noexcept { return tool_calls_; }
  bool responses() const noexcept { return responses_; }  ///< a /v1/responses stream
  /// usage.completion_tokens_details.reasoning_tokens (-1: the server gave none).
  int64_t usage_reasoning_tokens() const noexcept { return usage_reasoning_tokens_; }
  /// usage.prompt_tokens_details.cached_tokens: the prompt's tokens the server's prefix
  /// cache held (-1: the server gave none).
  int64_t usage_cached_tokens() const noexcept { return usage_cached_tokens_; }
  int64_t first_reasoning_ns() const noexcept { return first_reasoning_ns_; }  ///< 0: none yet
  int64_t first_answer_ns() const noexcept { return first_answer_ns_; }        ///< 0: none yet
  /// The events that held tokens, in order: when each came, its tokens and its text weight.
  const std::vector<int64_t>& event_ns() const noexcept { return event_ns_; }
  const std::vector<int64_t>& event_tokens() const noexcept { return event_tokens_; }
  const std::vector<int64_t>& event_weights() const noexcept { return event_weights_; }
  /// The per-token inter-token latency of the stream, given its `total_tokens` (usage's
  /// count; < 0: none, then each event counts its own tokens). Each event's tokens k: its
  /// own count when there is no total, else the total spread over the events by their
  /// text weight (cumulative rounding, so that the k sum to the total; a k may be 0).
  /// Of the events with k > 0, each after the first contributes (its time - the previous
  /// one's) / k (rounded, at least 1 ns), k times: f(value_ns, k). Allocates nothing.
  template <class F>
  void token_itl(int64_t total_tokens, F&& f) const {
    int64_t prev_t = -1;
    event_token_counts(total_tokens, [&](size_t j, int64_t k) {
      if (k <= 0) return;
      if (prev_t >= 0) {
        const int64_t gap = event_ns_[j] - prev_t;
        f(std::max<int64_t>(1, (gap + k / 2) / k), k);
      }
      prev_t = event_ns_[j];
    });
  }
  /// Each event's tokens k as token_itl() counts them, given `total_tokens`: f(j, k) for
  /// event j in order. Allocates nothing.
  template <class F>
  void event_token_counts(int64_t total_tokens, F&& f) const {
    const size_t m = event_ns_.size();
    unsigned __int128 weight = 0;
    for (const int64_t w : event_weights_) weight += static_cast<uint64_t>(w);
    unsigned __int128 cum = 0;
    int64_t given = 0;  // the tokens handed out so far
    for (size_t j = 0; j < m; ++j) {
      int64_t k = event_tokens_[j];
      if (total_tokens >= 0) {
        cum += static_cast<uint64_t>(event_weights_[j]);
        // round(total * cum / weight), halves up: the k sum to the total exactly.
        const unsigned __int128 x = static_cast<unsigned __int128>(total_tokens) * cum * 2 + weight;
        const int64_t upto = static_cast<int64_t>(x / (weight * 2));
        k = upto - given;
        given = upto;
      }
      f(j, k);
    }
  }
  SseProblem problem() const noexcept { return problem_; }
  const std::string& problem_data() const noexcept { return problem_data_; }
  /// The bytes held with no end of event (a non-200 answer's excerpt comes from them).
  const std::string& held() const noexcept { return buf_; }
  /// After feed() returned false: how many bytes were held.
  int64_t held_over() const noexcept { return held_over_; }
  int64_t max_event_bytes() const noexcept { return max_event_bytes_; }

 private:
  void event(const char* p, size_t n, int64_t t);
  void data(const char* p, size_t n, int64_t t);
  void json(const char* p, size_t n, int64_t t);
  void response_json(const char* p, size_t n, int64_t t);
  void take_usage(const UsageCounts& u);
  void token(int64_t t, bool reasoning);
  void fail(SseProblem why, const char* p, size_t n);

  int64_t max_event_bytes_;
  std::string buf_;
  std::string joined_;  // a multi-line event's data
  std::vector<int64_t> gaps_;
  std::vector<int64_t> event_ns_;
  std::vector<int64_t> event_tokens_;
  std::vector<int64_t> event_weights_;
  std::string problem_data_;
  int64_t chunks_ = 0;
  int64_t reasoning_chunks_ = 0;
  int64_t tool_calls_ = 0;
  int64_t usage_tokens_ = -1;
  int64_t usage_reasoning_tokens_ = -1;
  int64_t usage_cached_tokens_ = -1;
  int64_t first_reasoning_ns_ = 0;
  int64_t first_answer_ns_ = 0;
  int64_t first_ns_ = 0;
  int64_t last_ns_ = 0;
  int64_t held_over_ = 0;
  SseProblem problem_ = SseProblem::kNone;
  bool done_ = false;
  bool finished_ = false;
  bool responses_ = false;
};

/// The figures of completed streams that reasoning models and chunks of several tokens
/// need (what the asyncio client's OpenAISUT keeps beside its inter-token gaps, with the
/// same meaning). Histogram values are in [1, 3.6e12]. Not thread-safe.
struct SseStreamFigures {
  explicit SseStreamFigures(int significant_figures);
  HdrHistogram ttfrt_ns;                 ///< first reasoning token - scheduled (streams with one)
  HdrHistogram ttfat_ns;                 ///< first answer token - scheduled (streams with one)
  HdrHistogram itl_per_token_ns;         ///< the per-token inter-token latency (SseScanner::token_itl)
  HdrHistogram reasoning_length_tokens;  ///< reasoning tokens of each request that had some
  int64_t reasoning_tokens = 0;          ///< over all requests
  int64_t reasoning_from_usage = 0;      ///< requests whose reasoning count is usage's
  int64_t reasoning_from_chunks = 0;     ///< requests whose reasoning count is their chunks' (> 0)
  int64_t split_by_chunks = 0;           ///< requests whose tokens per event are counted (no usage)
  int64_t split_by_text = 0;             ///< requests whose usage count is spread by text weight
  int64_t cached_tokens = 0;             ///< usage.prompt_tokens_details.cached_tokens, over all requests
  int64_t cached_from_usage = 0;         ///< requests whose usage gave cached_tokens
  int64_t tool_calls = 0;                ///< tool calls made, over all requests
  int64_t tool_call_requests = 0;        ///< requests whose answer made at least one tool call

  /// Records a good stream `s` (its counts read from it), scheduled at `scheduled_ns`.
  void record(const SseScanner& s, int64_t scheduled_ns) noexcept;
  void add(const SseStreamFigures& other);
};

/// A non-streamed OpenAI answer's counts (read_whole_answer()).
struct WholeAnswer {
  int64_t tokens = -1;            ///< usage.completion_tokens
  int64_t reasoning_tokens = -1;  ///< usage.completion_tokens_details.reasoning_tokens (-1: none)
};

/// Reads a non-streamed completions or chat answer (one whole JSON body, `n` bytes at
/// `p`) with the rules of the asyncio client's WholeResponse where its verdict is
/// certain: true, with the counts in *out, when the body is a JSON object with no "error"
/// key, a non-empty "choices" list and an int usage.completion_tokens in
/// 0..kMaxTokenCount (an answer that completes with that count; the reasoning count as
/// the scanner reads a usage event's). False for anything else (not JSON, an error, no
/// choices, no usage or a count out of range), which the Python side judges and words.
/// Allocates only for a float in the body.
bool read_whole_answer(const char* p, size_t n, WholeAnswer* out);

/// Scans `stream` (one whole body) `iterations` times on one scanner, fed in `pieces`
/// (>= 1) nearly equal pieces each time, and returns nanoseconds per event (events are
/// counted on the first pass). Throws std::invalid_argument when it has no event.
double time_sse_scan_ns(const char* stream, size_t n, int pieces, int64_t iterations);

}  // namespace loadgen
