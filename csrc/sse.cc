#include "sse.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace loadgen {

namespace {

constexpr int64_t kHighestFigure = 3'600'000'000'000;  // the Python client's histograms' bound

// Python's bytes.lstrip() and bytes.strip() whitespace (\n cannot be in a line).
bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

bool has(const char* p, size_t n, const char* needle, size_t m) {
  return m <= n && memmem(p, n, needle, m) != nullptr;
}

// A quoted key at p[0] ("..." of length m, quotes included) followed by \s* : \s* " and,
// for a token, a character that is not '"' (the regexes _TOKEN_FIELD and _FINISH_REASON).
bool field_at(const char* p, const char* end, const char* key, size_t m, bool nonempty) {
  if (static_cast<size_t>(end - p) < m || std::memcmp(p, key, m) != 0) return false;
  p += m;
  while (p < end && ascii_space(*p)) ++p;
  if (p == end || *p != ':') return false;
  ++p;
  while (p < end && ascii_space(*p)) ++p;
  if (p == end || *p != '"') return false;
  ++p;
  return !nonempty || p == end || *p != '"';
}

// The text keys: an answer's ("text", "content"), a reasoning one's ("reasoning_content",
// "reasoning"), a tool call's "arguments" (text weight only), and a responses event's
// "delta" (text weight only, in that mode).
enum class TextKey : uint8_t { kNone, kAnswer, kReasoning, kArguments, kDelta };

// Which text key, if any, is at the quote q (with \s* : \s* " after it), and its length,
// quotes included, in *m. One comparison a quote, chosen by the key's first letter; a
// responses event's only key is "delta".
TextKey text_key_at(const char* q, const char* end, bool responses, size_t* m) {
  *m = 0;
  if (end - q < 2) return TextKey::kNone;
  const auto is = [&](const char* key, size_t len, TextKey kind) {
    if (!field_at(q, end, key, len, false)) return TextKey::kNone;
    *m = len;
    return kind;
  };
  if (responses) return q[1] == 'd' ? is("\"delta\"", 7, TextKey::kDelta) : TextKey::kNone;
  switch (q[1]) {
    case 't':
      return is("\"text\"", 6, TextKey::kAnswer);
    case 'c':
      return is("\"content\"", 9, TextKey::kAnswer);
    case 'r': {
      const TextKey k = is("\"reasoning_content\"", 19, TextKey::kReasoning);
      return k != TextKey::kNone ? k : is("\"reasoning\"", 11, TextKey::kReasoning);
    }
    case 'a':
      return is("\"arguments\"", 11, TextKey::kArguments);
    default:
      return TextKey::kNone;
  }
}

// The value's first byte after a key of length m at q (field_at matched).
const char* value_at(const char* q, const char* end, size_t m) {
  return static_cast<const char*>(std::memchr(q + m, '"', static_cast<size_t>(end - q) - m)) + 1;
}

// Whether a non-empty string of an answer key ("text", "content"; reasoning: false) or
// a reasoning key ("reasoning_content", "reasoning"; reasoning: true) is in the data,
// looking at every quote (the regexes _TOKEN_FIELD and _REASONING_FIELD).
bool token_field(const char* p, size_t n, bool reasoning) {
  const char* end = p + n;
  for (const char* q = p; (q = static_cast<const char*>(std::memchr(q, '"', static_cast<size_t>(end - q))));
       ++q) {
    size_t m = 0;
    const TextKey k = text_key_at(q, end, false, &m);
    if (k != (reasoning ? TextKey::kReasoning : TextKey::kAnswer)) continue;
    const char* v = value_at(q, end, m);
    if (v == end || *v != '"') return true;
  }
  return false;
}

// The text weight of an event's data: the raw bytes of each "text", "content",
// "reasoning_content", "reasoning" and "arguments" string (of a responses event: each
// "delta" string) (a key, \s* : \s* and a quote, then up to the closing quote not
// escaped, or the data's end), as written; at least 1. The search goes on from each
// string's end (the regexes _TEXT_STRING's and _DELTA_STRING's findall).
int64_t text_weight(const char* p, size_t n, bool responses) {
  const char* end = p + n;
  int64_t sum = 0;
  const char* q = p;
  while ((q = static_cast<const char*>(std::memchr(q, '"', static_cast<size_t>(end - q))))) {
    size_t m = 0;
    text_key_at(q, end, responses, &m);
    if (m == 0) {
      ++q;
      continue;
    }
    q = value_at(q, end, m);
    const char* s = q;
    while (q < end && *q != '"') {
      if (*q == '\\') {
        if (end - q < 2) break;
        q += 2;
      } else {
        ++q;
      }
    }
    sum += q - s;
    if (q == end) break;
  }
  return std::max<int64_t>(sum, 1);
}

bool finish_field(const char* p, size_t n) {
  const char* end = p + n;
  for (const char* q = p; (q = static_cast<const char*>(std::memchr(q, '"', static_cast<size_t>(end - q))));
       ++q) {
    if (field_at(q, end, "\"finish_reason\"", 15, false)) return true;
  }
  return false;
}

// A JSON value read as Python's json.loads reads it: its kind, its bytes, and whether
// Python would take it as true.
struct JVal {
  enum Kind : uint8_t { kNone, kObject, kArray, kString, kInt, kFloat, kTrue, kFalse, kNull } kind = kNone;
  const char* b = nullptr;
  const char* e = nullptr;
  bool truthy = false;
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A validating reader over bytes (json.loads reads the text decoded with "replace": bad
// UTF-8 becomes U+FFFD, which is valid in a string and invalid elsewhere, as any byte
// >= 0x80 is here).
class JsonReader {
 public:
  JsonReader(const char* p, const char* end, std::string* scratch) : p_(p), end_(end), scratch_(scratch) {}

  // The whole text: whitespace, one value, whitespace.
  bool document(JVal* v) {
    ws();
    if (!value(v, 0)) return false;
    ws();
    return p_ == end_;
  }

  // After a validated object `obj`: calls f(key bytes (inside the quotes), value) per member.
  template <class F>
  static void members(const JVal& obj, std::string* scratch, F&& f) {
    JsonReader r(obj.b + 1, obj.e, scratch);
    r.ws();
    if (*r.p_ == '}') return;
    for (;;) {
      const char* kb = r.p_ + 1;
      r.string(nullptr);
      const char* ke = r.p_ - 1;
      r.ws();
      ++r.p_;  // ':'
      r.ws();
      JVal v;
      r.value(&v, 0);
      f(kb, ke, v);
      r.ws();
      if (*r.p_ == '}') return;
      ++r.p_;  // ','
      r.ws();
    }
  }

  template <class F>
  static void elements(const JVal& arr, std::string* scratch, F&& f) {
    JsonReader r(arr.b + 1, arr.e, scratch);
    r.ws();
    if (*r.p_ == ']') return;
    for (;;) {
      JVal v;
      r.value(&v, 0);
      f(v);
      r.ws();
      if (*r.p_ == ']') return;
      ++r.p_;
      r.ws();
    }
  }

  // Whether key bytes (escapes undone) equal the ASCII name.
  static bool key_is(const char* b, const char* e, const char* name) {
    const size_t m = std::strlen(name);
    size_t i = 0;
    for (const char* p = b; p < e; ++i) {
      char c = *p;
      if (c == '\\') {
        const char x = p[1];
        if (x == 'u') {
          int cp = 0;
          for (int k = 2; k < 6; ++k) cp = cp * 16 + hex_value(p[k]);
          if (cp >= 0x80) return false;
          c = static_cast<char>(cp);
          p += 6;
        } else {
          switch (x) {
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            default: c = x;  // " \ /
          }
          p += 2;
        }
      } else {
        ++p;
      }
      if (i >= m || c != name[i]) return false;
    }
    return i == m;
  }

  // An int value (not a bool: Python's count check refuses those) when it is within
  // 0..kMaxTokenCount; false with *out_of_range set when it is an int outside it.
  static bool token_count(const JVal& v, int64_t* out, bool* out_of_range) {
    *out_of_range = false;
    if (v.kind != JVal::kInt) return false;
    const char* p = v.b;
    const bool neg = *p == '-';
    if (neg) ++p;
    int64_t x = 0;
    for (; p < v.e; ++p) {
      x = x * 10 + (*p - '0');
      if (x > kMaxTokenCount) break;  // past the bound: no need to read on (nor to overflow)
    }
    if (x > kMaxTokenCount || (neg && x != 0)) {
      *out_of_range = true;
      return false;
    }
    *out = x;
    return true;
  }

 private:
  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  bool literal(const char* word, JVal::Kind kind, bool truthy, JVal* v) {
    const size_t m = std::strlen(word);
    if (static_cast<size_t>(end_ - p_) < m || std::memcmp(p_, word, m) != 0) return false;
    v->kind = kind;
    v->b = p_;
    p_ += m;
    v->e = p_;
    v->truthy = truthy;
    return true;
  }

  bool value(JVal* v, int depth) {
    if (p_ == end_) return false;
    switch (*p_) {
      case '{':
        return object(v, depth + 1);
      case '[':
        return array(v, depth + 1);
      case '"': {
        v->kind = JVal::kString;
        v->b = p_;
        if (!string(&v->truthy)) return false;
        v->e = p_;
        return true;
      }
      case 'n':
        return literal("null", JVal::kNull, false, v);
      case 't':
        return literal("true", JVal::kTrue, true, v);
      case 'f':
        return literal("false", JVal::kFalse, false, v);
      case 'N':
        return literal("NaN", JVal::kFloat, true, v);
      case 'I':
        return literal("Infinity", JVal::kFloat, true, v);
      case '-':
        if (literal("-Infinity", JVal::kFloat, true, v)) return true;
        return number(v);
      default:
        return number(v);
    }
  }

  bool object(JVal* v, int depth) {
    if (depth > kMaxJsonDepth) return false;
    v->kind = JVal::kObject;
    v->b = p_++;
    ws();
    v->truthy = false;
    if (p_ < end_ && *p_ == '}') {
      v->e = ++p_;
      return true;
    }
    for (;;) {
      if (p_ == end_ || *p_ != '"' || !string(nullptr)) return false;
      ws();
      if (p_ == end_ || *p_ != ':') return false;
      ++p_;
      ws();
      JVal item;
      if (!value(&item, depth)) return false;
      v->truthy = true;
      ws();
      if (p_ == end_) return false;
      if (*p_ == '}') {
        v->e = ++p_;
        return true;
      }
      if (*p_ != ',') return false;
      ++p_;
      ws();
    }
  }

  bool array(JVal* v, int depth) {
    if (depth > kMaxJsonDepth) return false;
    v->kind = JVal::kArray;
    v->b = p_++;
    ws();
    v->truthy = false;
    if (p_ < end_ && *p_ == ']') {
      v->e = ++p_;
      return true;
    }
    for (;;) {
      JVal item;
      if (!value(&item, depth)) return false;
      v->truthy = true;
      ws();
      if (p_ == end_) return false;
      if (*p_ == ']') {
        v->e = ++p_;
        return true;
      }
      if (*p_ != ',') return false;
      ++p_;
      ws();
    }
  }

  // p_ at the opening quote; leaves p_ past the closing one.
  bool string(bool* nonempty) {
    const char* start = ++p_;
    while (p_ < end_) {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        if (nonempty != nullptr) *nonempty = p_ != start;
        ++p_;
        return true;
      }
      if (c < 0x20) return false;  // json.loads is strict about control characters
      if (c == '\\') {
        if (end_ - p_ < 2) return false;
        const char x = p_[1];
        if (x == 'u') {
          if (end_ - p_ < 6) return false;
          for (int k = 2; k < 6; ++k) {
            if (hex_value(p_[k]) < 0) return false;
          }
          p_ += 6;
          continue;
        }
        if (std::strchr("\"\\/bfnrt", x) == nullptr || x == '\0') return false;
        p_ += 2;
        continue;
      }
      ++p_;
    }
    return false;
  }

  bool digit() const { return p_ < end_ && *p_ >= '0' && *p_ <= '9'; }

  bool number(JVal* v) {
    v->b = p_;
    if (*p_ == '-') ++p_;
    bool nonzero = false;
    if (p_ < end_ && *p_ == '0') {
      ++p_;
    } else if (p_ < end_ && *p_ >= '1' && *p_ <= '9') {
      while (digit()) nonzero |= *p_++ != '0';
    } else {
      return false;
    }
    bool is_float = false;
    if (p_ + 1 < end_ && *p_ == '.' && p_[1] >= '0' && p_[1] <= '9') {
      is_float = true;
      ++p_;
      while (digit()) nonzero |= *p_++ != '0';
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      const char* save = p_++;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (digit()) {
        is_float = true;
        while (digit()) ++p_;
      } else {
        p_ = save;  // not part of the number (what follows is then not JSON)
      }
    }
    v->e = p_;
    v->kind = is_float ? JVal::kFloat : JVal::kInt;
    v->truthy = nonzero;
    if (is_float && nonzero) {  // a float that underflows to 0.0 is false in Python
      scratch_->assign(v->b, v->e);
      v->truthy = std::strtod(scratch_->c_str(), nullptr) != 0.0;
    }
    return true;
  }

  const char* p_;
  const char* end_;
  std::string* scratch_;
};

}  // namespace

SseScanner::SseScanner(int64_t max_event_bytes, bool responses)
    : max_event_bytes_(max_event_bytes), responses_(responses) {
  if (max_event_bytes < 1) throw std::invalid_argument("max_event_bytes must be >= 1");
}

void SseScanner::start() noexcept {
  buf_.clear();
  gaps_.clear();
  event_ns_.clear();
  event_tokens_.clear();
  event_weights_.clear();
  problem_data_.clear();
  chunks_ = reasoning_chunks_ = tool_calls_ = 0;
  usage_tokens_ = usage_reasoning_tokens_ = usage_cached_tokens_ = -1;
  first_ns_ = last_ns_ = first_reasoning_ns_ = first_answer_ns_ = 0;
  held_over_ = 0;
  problem_ = SseProblem::kNone;
  done_ = finished_ = false;
}

bool SseScanner::feed(const char* data, size_t n, int64_t t) {
  const size_t held = buf_.size();
  buf_.append(data, n);
  const char* b = buf_.data();
  const size_t size = buf_.size();
  size_t pos = 0;
  // What was held has no event's end in it: search from its last 3 bytes on. An event
  // ends at the earlier of "\n\n" and "\r\n\r\n"; an end not found stays not found (the
  // buffer does not grow here), so each byte is searched once for each.
  const size_t from = held > 3 ? held - 3 : 0;
  constexpr size_t kNone = static_cast<size_t>(-1);
  const auto find = [&](const char* needle, size_t m, size_t at) {
    const char* hit = static_cast<const char*>(memmem(b + at, size - at, needle, m));
    return hit != nullptr ? static_cast<size_t>(hit - b) : kNone;
  };
  size_t lf = find("\n\n", 2, from);
  size_t crlf = find("\r\n\r\n", 4, from);
  while (lf != kNone || crlf != kNone) {
    const bool by_lf = crlf == kNone || (lf != kNone && lf < crlf);
    const size_t end = by_lf ? lf : crlf;
    event(b + pos, end - pos, t);
    pos = end + (by_lf ? 2 : 4);
    if (lf != kNone && lf < pos) lf = find("\n\n", 2, pos);
    if (crlf != kNone && crlf < pos) crlf = find("\r\n\r\n", 4, pos);
  }
  if (static_cast<int64_t>(size - pos) > max_event_bytes_) {  // bounded per event, not in total
    held_over_ = static_cast<int64_t>(size - pos);
    buf_.clear();
    return false;
  }
  buf_.erase(0, pos);
  return true;
}

void SseScanner::finish(int64_t t) {
  const bool blank = std::all_of(buf_.begin(), buf_.end(), ascii_space);
  if (!blank) {
    event(buf_.data(), buf_.size(), t);
  }
}

void SseScanner::event(const char* p, size_t n, int64_t t) {
  if (n >= 7 && std::memcmp(p, "data: {", 7) == 0 && std::memchr(p, '\n', n) == nullptr) {
    data(p + 6, n - 6, t);  // the usual one-line event
    return;
  }
  // Each "data:" line less the prefix and its leading whitespace, joined with "\n"
  // ("\r\n" ends a line as "\n" does).
  joined_.clear();
  bool any = false;
  const char* end = p + n;
  for (const char* line = p; line <= end;) {
    const char* nl = static_cast<const char*>(std::memchr(line, '\n', static_cast<size_t>(end - line)));
    const char* le = nl != nullptr ? nl : end;
    const char* content_end = (nl != nullptr && le > line && le[-1] == '\r') ? le - 1 : le;
    if (content_end - line >= 5 && std::memcmp(line, "data:", 5) == 0) {
      const char* q = line + 5;
      while (q < content_end && ascii_space(*q)) ++q;
      if (any) joined_.push_back('\n');
      joined_.append(q, content_end);
      any = true;
    }
    if (nl == nullptr) break;
    line = nl + 1;
  }
  data(joined_.data(), joined_.size(), t);
}

void SseScanner::data(const char* p, size_t n, int64_t t) {
  if (n == 0) return;
  if (n == 6 && std::memcmp(p, "[DONE]", 6) == 0) {
    done_ = true;
    return;
  }
  const int64_t before = chunks_;
  // A plain token chunk (no usage, no error, no tool call) is recognised without reading
  // its JSON; a responses event is always read.
  if (responses_) {
    response_json(p, n, t);
  } else if (p[0] == '{' && p[n - 1] == '}' && !has(p, n, "\"usage\"", 7) && !has(p, n, "\"error\"", 7) &&
             !has(p, n, "\"tool_calls\"", 12)) {
    if (token_field(p, n, false)) {
      token(t, false);
    } else if (token_field(p, n, true)) {
      token(t, true);
    } else if (!finished_ && finish_field(p, n)) {
      finished_ = true;
    }
  } else {
    json(p, n, t);
  }
  if (chunks_ != before) {
    event_ns_.push_back(t);
    event_tokens_.push_back(chunks_ - before);
    event_weights_.push_back(text_weight(p, n, responses_));
  }
}

namespace {
// The members of an answer object that count: whether it has an "error" key, and its
// "usage" and "choices" (the last of each key counts, as in a Python dict).
void answer_keys(const JVal& doc, std::string* scratch, bool* error, JVal* usage, JVal* choices) {
  JsonReader::members(doc, scratch, [&](const char* kb, const char* ke, const JVal& v) {
    if (JsonReader::key_is(kb, ke, "error")) *error = true;
    else if (JsonReader::key_is(kb, ke, "usage")) *usage = v;
    else if (JsonReader::key_is(kb, ke, "choices")) *choices = v;
  });
}
}  // namespace

namespace {
// An event's data read as JSON into *doc: kNone when it is an object, else why not.
SseProblem event_object(const char* p, size_t n, std::string* scratch, JVal* doc) {
  if (!JsonReader(p, p + n, scratch).document(doc)) return SseProblem::kNotJson;
  return doc->kind == JVal::kObject ? SseProblem::kNone : SseProblem::kNotObject;
}

// A usage object's counts: `tokens_key` (in range, else -1: none, or `bad` when an int
// out of range), `details_key`.reasoning_tokens and `prompt_key`.cached_tokens (in
// range, else -1, with no error).
UsageCounts read_usage(const JVal& usage, const char* tokens_key, const char* details_key, const char* prompt_key,
                       std::string* scratch) {
  UsageCounts out;
  if (usage.kind != JVal::kObject) return out;
  JVal tokens, details, prompt_details;
  JsonReader::members(usage, scratch, [&](const char* kb, const char* ke, const JVal& v) {
    if (JsonReader::key_is(kb, ke, tokens_key)) tokens = v;
    else if (JsonReader::key_is(kb, ke, details_key)) details = v;
    else if (JsonReader::key_is(kb, ke, prompt_key)) prompt_details = v;
  });
  auto detail_count = [&](const JVal& object, const char* key, int64_t* to) {
    if (object.kind != JVal::kObject) return;
    JVal found;
    JsonReader::members(object, scratch, [&](const char* kb, const char* ke, const JVal& v) {
      if (JsonReader::key_is(kb, ke, key)) found = v;
    });
    int64_t x = 0;
    bool out_of_range = false;
    if (JsonReader::token_count(found, &x, &out_of_range)) *to = x;
  };
  detail_count(prompt_details, "cached_tokens", &out.cached);
  detail_count(details, "reasoning_tokens", &out.reasoning);
  bool out_of_range = false;
  if (!JsonReader::token_count(tokens, &out.tokens, &out_of_range)) out.tokens = -1;
  if (out_of_range) {
    out.bad = tokens.b;
    out.bad_n = static_cast<size_t>(tokens.e - tokens.b);
  }
  return out;
}
}  // namespace

void SseScanner::take_usage(const UsageCounts& u) {
  if (u.cached >= 0) usage_cached_tokens_ = u.cached;
  if (u.reasoning >= 0) usage_reasoning_tokens_ = u.reasoning;
  if (u.tokens >= 0) {
    usage_tokens_ = u.tokens;
  } else if (u.bad != nullptr) {  // a protocol error; the stream's tokens still count, as in Python
    fail(SseProblem::kBadTokenCount, u.bad, u.bad_n);
  }
}

void SseScanner::json(const char* p, size_t n, int64_t t) {
  std::string scratch;  // only floats need it: a rare event's cost
  JVal doc;
  const SseProblem why = event_object(p, n, &scratch, &doc);
  if (why != SseProblem::kNone) {
    fail(why, p, n);
    return;
  }
  bool error = false;
  JVal usage, choices;
  answer_keys(doc, &scratch, &error, &usage, &choices);
  if (error) {
    fail(SseProblem::kErrorEvent, p, n);
    return;
  }
  take_usage(read_usage(usage, "completion_tokens", "completion_tokens_details", "prompt_tokens_details", &scratch));
  if (choices.kind != JVal::kArray) return;  // a dict or a string iterates to no choice
  JsonReader::elements(choices, &scratch, [&](const JVal& choice) {
    if (choice.kind != JVal::kObject) return;
    JVal delta, text, reason;
    JsonReader::members(choice, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
      if (JsonReader::key_is(kb, ke, "delta")) delta = v;
      else if (JsonReader::key_is(kb, ke, "text")) text = v;
      else if (JsonReader::key_is(kb, ke, "finish_reason")) reason = v;
    });
    JVal reasoning_content, reasoning, calls;
    if (delta.kind == JVal::kObject) {
      text = JVal{};
      JsonReader::members(delta, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
        if (JsonReader::key_is(kb, ke, "content")) text = v;
        else if (JsonReader::key_is(kb, ke, "reasoning_content")) reasoning_content = v;
        else if (JsonReader::key_is(kb, ke, "reasoning")) reasoning = v;
        else if (JsonReader::key_is(kb, ke, "tool_calls")) calls = v;
      });
    }
    // Each tool_calls element with a truthy "id" starts a call; one with truthy
    // function.arguments makes the choice an answer token when it has no other.
    bool arguments = false;
    if (calls.kind == JVal::kArray) {
      JsonReader::elements(calls, &scratch, [&](const JVal& call) {
        if (call.kind != JVal::kObject) return;
        JVal id, fn;
        JsonReader::members(call, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
          if (JsonReader::key_is(kb, ke, "id")) id = v;
          else if (JsonReader::key_is(kb, ke, "function")) fn = v;
        });
        if (id.truthy) ++tool_calls_;
        if (fn.kind != JVal::kObject) return;
        JVal args;
        JsonReader::members(fn, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
          if (JsonReader::key_is(kb, ke, "arguments")) args = v;
        });
        arguments |= args.truthy;
      });
    }
    if (text.truthy) {
      token(t, false);
    } else if (reasoning_content.truthy || reasoning.truthy) {
      token(t, true);
    } else if (arguments) {
      token(t, false);
    }
    if (reason.truthy) finished_ = true;
  });
}

void SseScanner::response_json(const char* p, size_t n, int64_t t) {
  std::string scratch;  // only floats need it
  JVal doc;
  const SseProblem why = event_object(p, n, &scratch, &doc);
  if (why != SseProblem::kNone) {
    fail(why, p, n);
    return;
  }
  JVal type, error, delta, item, response;
  JsonReader::members(doc, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
    if (JsonReader::key_is(kb, ke, "type")) type = v;
    else if (JsonReader::key_is(kb, ke, "error")) error = v;
    else if (JsonReader::key_is(kb, ke, "delta")) delta = v;
    else if (JsonReader::key_is(kb, ke, "item")) item = v;
    else if (JsonReader::key_is(kb, ke, "response")) response = v;
  });
  const auto string_is = [](const JVal& v, const char* name) {
    return v.kind == JVal::kString && JsonReader::key_is(v.b + 1, v.e - 1, name);
  };
  const auto type_is = [&](const char* name) { return string_is(type, name); };
  if (error.truthy || type_is("error") || type_is("response.failed")) {
    fail(SseProblem::kErrorEvent, p, n);
    return;
  }
  if (type_is("response.output_text.delta") || type_is("response.function_call_arguments.delta")) {
    if (delta.truthy) token(t, false);
  } else if (type_is("response.reasoning_text.delta") || type_is("response.reasoning_summary_text.delta")) {
    if (delta.truthy) token(t, true);
  } else if (type_is("response.output_item.added")) {
    if (item.kind != JVal::kObject) return;
    JVal item_type;
    JsonReader::members(item, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
      if (JsonReader::key_is(kb, ke, "type")) item_type = v;
    });
    if (string_is(item_type, "function_call")) ++tool_calls_;
  } else if (type_is("response.completed") || type_is("response.incomplete")) {
    done_ = finished_ = true;
    JVal usage;
    if (response.kind == JVal::kObject) {
      JsonReader::members(response, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
        if (JsonReader::key_is(kb, ke, "usage")) usage = v;
      });
    }
    take_usage(read_usage(usage, "output_tokens", "output_tokens_details", "input_tokens_details", &scratch));
  }
}

bool read_whole_answer(const char* p, size_t n, WholeAnswer* out) {
  std::string scratch;  // only floats need it
  JVal doc;
  if (!JsonReader(p, p + n, &scratch).document(&doc) || doc.kind != JVal::kObject) return false;
  bool error = false;
  JVal usage, choices;
  answer_keys(doc, &scratch, &error, &usage, &choices);
  // A non-empty "choices" list (truthy: it has an element), as the asyncio check asks.
  if (error || usage.kind != JVal::kObject || choices.kind != JVal::kArray || !choices.truthy) return false;
  JVal tokens, details;
  JsonReader::members(usage, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
    if (JsonReader::key_is(kb, ke, "completion_tokens")) tokens = v;
    else if (JsonReader::key_is(kb, ke, "completion_tokens_details")) details = v;
  });
  int64_t x = 0;
  bool out_of_range = false;
  if (!JsonReader::token_count(tokens, &x, &out_of_range)) return false;
  out->tokens = x;
  out->reasoning_tokens = -1;
  if (details.kind == JVal::kObject) {
    JVal reasoning;
    JsonReader::members(details, &scratch, [&](const char* kb, const char* ke, const JVal& v) {
      if (JsonReader::key_is(kb, ke, "reasoning_tokens")) reasoning = v;
    });
    int64_t r = 0;
    if (JsonReader::token_count(reasoning, &r, &out_of_range)) out->reasoning_tokens = r;
  }
  return true;
}

void SseScanner::token(int64_t t, bool reasoning) {
  if (reasoning) {
    if (first_reasoning_ns_ == 0) first_reasoning_ns_ = t;
    ++reasoning_chunks_;
  } else if (first_answer_ns_ == 0) {
    first_answer_ns_ = t;
  }
  if (first_ns_ == 0) {
    first_ns_ = t;
  } else {
    gaps_.push_back(t - last_ns_);
  }
  last_ns_ = t;
  ++chunks_;
}

void SseScanner::fail(SseProblem why, const char* p, size_t n) {
  if (problem_ != SseProblem::kNone) return;  // the first problem is the stream's
  problem_ = why;
  problem_data_.assign(p, n);
}

SseStreamFigures::SseStreamFigures(int significant_figures)
    : ttfrt_ns(1, kHighestFigure, significant_figures),
      ttfat_ns(1, kHighestFigure, significant_figures),
      itl_per_token_ns(1, kHighestFigure, significant_figures),
      reasoning_length_tokens(1, kHighestFigure, significant_figures) {}

void SseStreamFigures::record(const SseScanner& s, int64_t scheduled_ns) noexcept {
  if (s.first_reasoning_ns() != 0) ttfrt_ns.record(std::max<int64_t>(1, s.first_reasoning_ns() - scheduled_ns));
  if (s.first_answer_ns() != 0) ttfat_ns.record(std::max<int64_t>(1, s.first_answer_ns() - scheduled_ns));
  const bool usage = s.usage_reasoning_tokens() >= 0;
  const int64_t r = usage ? s.usage_reasoning_tokens() : s.reasoning_chunks();
  if (usage || r > 0) {
    ++(usage ? reasoning_from_usage : reasoning_from_chunks);
    reasoning_tokens += r;
    if (r > 0) reasoning_length_tokens.record(r);
  }
  if (s.usage_cached_tokens() >= 0) {
    ++cached_from_usage;
    cached_tokens += s.usage_cached_tokens();
  }
  if (s.tool_calls() > 0) {
    tool_calls += s.tool_calls();
    ++tool_call_requests;
  }
  ++(s.usage_tokens() >= 0 ? split_by_text : split_by_chunks);
  s.token_itl(s.usage_tokens(), [this](int64_t value, int64_t k) { itl_per_token_ns.record_n(value, k); });
}

void SseStreamFigures::add(const SseStreamFigures& o) {
  ttfrt_ns.add(o.ttfrt_ns);
  ttfat_ns.add(o.ttfat_ns);
  itl_per_token_ns.add(o.itl_per_token_ns);
  reasoning_length_tokens.add(o.reasoning_length_tokens);
  reasoning_tokens += o.reasoning_tokens;
  reasoning_from_usage += o.reasoning_from_usage;
  reasoning_from_chunks += o.reasoning_from_chunks;
  split_by_chunks += o.split_by_chunks;
  split_by_text += o.split_by_text;
  cached_tokens += o.cached_tokens;
  cached_from_usage += o.cached_from_usage;
  tool_calls += o.tool_calls;
  tool_call_requests += o.tool_call_requests;
}

double time_sse_scan_ns(const char* stream, size_t n, int pieces, int64_t iterations) {
  if (pieces < 1 || iterations < 1) throw std::invalid_argument("pieces and iterations must be >= 1");
  SseScanner s(static_cast<int64_t>(n) + 1);
  const size_t step = (n + static_cast<size_t>(pieces) - 1) / static_cast<size_t>(pieces);
  auto pass = [&](int64_t t) {
    s.start();
    for (size_t off = 0; off < n; off += step) s.feed(stream + off, std::min(step, n - off), t);
    s.finish(t);
  };
  pass(1);
  const int64_t events = s.chunks() + (s.done() ? 1 : 0) + (s.usage_tokens() >= 0 ? 1 : 0);
  if (events == 0) throw std::invalid_argument("the stream has no token, usage or [DONE] event");
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) pass(i + 1);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iterations * events);
}

}  // namespace loadgen
