#include "hdr_codec.h"

#include <zlib.h>

#include <cstring>
#include <sstream>

namespace loadgen {
namespace {

constexpr size_t kPayloadHeaderBytes = 40;
constexpr size_t kCompressedHeaderBytes = 8;
constexpr size_t kMaxVarintBytes = 9;
constexpr uint32_t kV2EncodingCookieBase = 0x1c849303u;
constexpr uint32_t kV2CompressedCookieBase = 0x1c849304u;

uint32_t cookie_base(uint32_t cookie) { return cookie & ~0xf0u; }

std::string hex(uint32_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

void put_be64(std::vector<uint8_t>& out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

uint32_t get_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

uint64_t get_be64(const uint8_t* p) {
  return (uint64_t{get_be32(p)} << 32) | get_be32(p + 4);
}

// ZigZag then LEB128, at most 9 bytes: the ninth byte carries the top 8 bits whole
// (HdrHistogram's variant of LEB128, which never needs a tenth byte).
void put_varint(std::vector<uint8_t>& out, int64_t signed_value) {
  uint64_t v = (static_cast<uint64_t>(signed_value) << 1) ^ static_cast<uint64_t>(signed_value >> 63);
  for (int i = 0; i < 8; ++i) {
    if ((v >> 7) == 0) {
      out.push_back(static_cast<uint8_t>(v));
      return;
    }
    out.push_back(static_cast<uint8_t>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

// Returns false when the input ends inside a varint.
bool get_varint(const uint8_t*& p, const uint8_t* end, int64_t& out) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    if (p == end) return false;
    const uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      out = static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1));
      return true;
    }
  }
  if (p == end) return false;
  v |= static_cast<uint64_t>(*p++) << 56;
  out = static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1));
  return true;
}

struct PayloadHeader {
  uint32_t payload_len;
  int significant_figures;
  int64_t lowest;
  int64_t highest;
};

PayloadHeader parse_payload_header(const uint8_t* p) {
  const uint32_t cookie = get_be32(p);
  if (cookie_base(cookie) != kV2EncodingCookieBase) {
    if (cookie_base(cookie) == kV2CompressedCookieBase) {
      throw HdrDecodeError("payload is a compressed histogram, not an uncompressed one (cookie " +
                           hex(cookie) + ")");
    }
    throw HdrDecodeError("not a V2 HdrHistogram payload: cookie " + hex(cookie) + ", expected " +
                         hex(kV2EncodingCookie) + " (V0/V1 encodings are not supported)");
  }
  PayloadHeader h{};
  h.payload_len = get_be32(p + 4);
  const uint32_t normalizing_offset = get_be32(p + 8);
  const uint32_t sig = get_be32(p + 12);
  const uint64_t lowest = get_be64(p + 16);
  const uint64_t highest = get_be64(p + 24);
  if (normalizing_offset != 0) {
    throw HdrDecodeError("normalizing index offset " + std::to_string(normalizing_offset) +
                         " is not supported (only 0)");
  }
  if (sig < 1 || sig > 5) {
    throw HdrDecodeError("header significant figures " + std::to_string(sig) + " outside 1..5");
  }
  if (lowest < 1 || lowest > static_cast<uint64_t>(INT64_MAX) ||
      highest > static_cast<uint64_t>(INT64_MAX)) {
    throw HdrDecodeError("header value range [" + std::to_string(lowest) + ", " +
                         std::to_string(highest) + "] is not valid");
  }
  h.significant_figures = static_cast<int>(sig);
  h.lowest = static_cast<int64_t>(lowest);
  h.highest = static_cast<int64_t>(highest);
  return h;
}

HdrHistogram make_histogram(const PayloadHeader& h) {
  try {
    return HdrHistogram(h.lowest, h.highest, h.significant_figures);
  } catch (const std::invalid_argument& e) {
    throw HdrDecodeError(std::string("header describes an invalid histogram: ") + e.what());
  }
}

size_t max_payload_len(const HdrHistogram& h) {
  return static_cast<size_t>(h.counts_len()) * kMaxVarintBytes;
}

void decode_counts(HdrHistogram& h, const uint8_t* p, const uint8_t* end) {
  std::vector<int64_t> counts(static_cast<size_t>(h.counts_len()), 0);
  size_t index = 0;
  while (p < end) {
    int64_t v = 0;
    if (!get_varint(p, end, v)) throw HdrDecodeError("payload is truncated inside a count");
    if (v < 0) {
      const uint64_t zeros = ~static_cast<uint64_t>(v) + 1;
      if (zeros > counts.size() - index) {
        throw HdrDecodeError("payload holds more counts than its value range allows (" +
                             std::to_string(h.counts_len()) + ")");
      }
      index += zeros;
    } else {
      if (index >= counts.size()) {
        throw HdrDecodeError("payload holds more counts than its value range allows (" +
                             std::to_string(h.counts_len()) + ")");
      }
      counts[index++] = v;
    }
  }
  try {
    h.load_counts(counts.data(), static_cast<int32_t>(index));
  } catch (const std::invalid_argument& e) {
    throw HdrDecodeError(std::string("payload counts are not valid: ") + e.what());
  }
}

// Inflates exactly `want` bytes into `out`; false when the stream ends early.
bool inflate_exact(z_stream& zs, uint8_t* out, size_t want) {
  zs.next_out = out;
  zs.avail_out = static_cast<uInt>(want);
  while (zs.avail_out > 0) {
    const int rc = inflate(&zs, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) return zs.avail_out == 0;
    if (rc == Z_BUF_ERROR) return false;  // no progress possible: the input ran out
    if (rc == Z_NEED_DICT) {
      throw HdrDecodeError("compressed payload is corrupt: it asks for a preset zlib dictionary, which the format never uses");
    }
    if (rc != Z_OK) {
      throw HdrDecodeError(std::string("compressed payload is corrupt (zlib: ") +
                           (zs.msg ? zs.msg : "error " + std::to_string(rc)) + ")");
    }
    if (zs.avail_in == 0 && zs.avail_out > 0) return false;
  }
  return true;
}

struct Inflater {
  z_stream zs{};
  Inflater(const uint8_t* data, size_t size) {
    if (inflateInit(&zs) != Z_OK) throw std::runtime_error("zlib inflateInit failed");
    zs.next_in = const_cast<Bytef*>(data);
    zs.avail_in = static_cast<uInt>(size);
  }
  ~Inflater() { inflateEnd(&zs); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
};

}  // namespace

std::vector<uint8_t> encode_uncompressed(const HdrHistogram& h) {
  std::vector<uint8_t> out;
  const int32_t relevant = h.used_counts_len();
  out.reserve(kPayloadHeaderBytes + static_cast<size_t>(relevant) + 16);
  put_be32(out, kV2EncodingCookie);
  put_be32(out, 0);  // payload length, filled in below
  put_be32(out, 0);  // normalizing index offset
  put_be32(out, static_cast<uint32_t>(h.significant_figures()));
  put_be64(out, static_cast<uint64_t>(h.lowest_discernible_value()));
  put_be64(out, static_cast<uint64_t>(h.highest_trackable_value()));
  uint64_t ratio_bits;
  const double ratio = 1.0;
  std::memcpy(&ratio_bits, &ratio, sizeof ratio_bits);
  put_be64(out, ratio_bits);
  for (int32_t i = 0; i < relevant;) {
    const int64_t count = h.count_at_index(i++);
    if (count == 0) {
      int64_t zeros = 1;
      while (i < relevant && h.count_at_index(i) == 0) {
        ++zeros;
        ++i;
      }
      put_varint(out, -zeros);  // as HdrHistogram_c: a lone zero is a run of one
    } else {
      put_varint(out, count);
    }
  }
  const auto payload_len = static_cast<uint32_t>(out.size() - kPayloadHeaderBytes);
  for (int k = 0; k < 4; ++k) out[4 + k] = static_cast<uint8_t>(payload_len >> (24 - 8 * k));
  return out;
}

std::vector<uint8_t> encode_compressed(const HdrHistogram& h, int level) {
  const std::vector<uint8_t> raw = encode_uncompressed(h);
  uLongf bound = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> out(kCompressedHeaderBytes + bound);
  const int rc = compress2(out.data() + kCompressedHeaderBytes, &bound, raw.data(),
                           static_cast<uLong>(raw.size()), level);
  if (rc != Z_OK) throw std::invalid_argument("zlib compress failed (level " + std::to_string(level) + ")");
  out.resize(kCompressedHeaderBytes + bound);
  std::vector<uint8_t> header;
  put_be32(header, kV2CompressedCookie);
  put_be32(header, static_cast<uint32_t>(bound));
  std::memcpy(out.data(), header.data(), kCompressedHeaderBytes);
  return out;
}

std::string encode_base64(const HdrHistogram& h, int level) {
  const std::vector<uint8_t> c = encode_compressed(h, level);
  return base64_encode(c.data(), c.size());
}

HdrHistogram decode_uncompressed(const uint8_t* data, size_t size) {
  if (size < kPayloadHeaderBytes) {
    throw HdrDecodeError("payload is " + std::to_string(size) + " bytes, shorter than the " +
                         std::to_string(kPayloadHeaderBytes) + "-byte header");
  }
  const PayloadHeader ph = parse_payload_header(data);
  if (ph.payload_len != size - kPayloadHeaderBytes) {
    throw HdrDecodeError("header says " + std::to_string(ph.payload_len) +
                         " bytes of counts, but " + std::to_string(size - kPayloadHeaderBytes) +
                         " follow");
  }
  HdrHistogram h = make_histogram(ph);
  decode_counts(h, data + kPayloadHeaderBytes, data + size);
  return h;
}

HdrHistogram decode_compressed(const uint8_t* data, size_t size) {
  if (size < kCompressedHeaderBytes) {
    throw HdrDecodeError("compressed histogram is " + std::to_string(size) +
                         " bytes, shorter than its 8-byte header");
  }
  const uint32_t cookie = get_be32(data);
  if (cookie_base(cookie) != kV2CompressedCookieBase) {
    if (cookie_base(cookie) == kV2EncodingCookieBase) {
      throw HdrDecodeError("this is an uncompressed V2 payload (cookie " + hex(cookie) +
                           "), not the compressed form");
    }
    throw HdrDecodeError("not a compressed V2 HdrHistogram: cookie " + hex(cookie) +
                         ", expected " + hex(kV2CompressedCookie) +
                         " (V0/V1 encodings are not supported)");
  }
  const uint32_t length = get_be32(data + 4);
  if (length != size - kCompressedHeaderBytes) {
    throw HdrDecodeError("header says " + std::to_string(length) + " compressed bytes, but " +
                         std::to_string(size - kCompressedHeaderBytes) + " follow");
  }
  Inflater inf(data + kCompressedHeaderBytes, length);
  uint8_t header[kPayloadHeaderBytes];
  if (!inflate_exact(inf.zs, header, kPayloadHeaderBytes)) {
    throw HdrDecodeError("compressed payload ends before the 40-byte payload header");
  }
  const PayloadHeader ph = parse_payload_header(header);
  HdrHistogram h = make_histogram(ph);
  if (ph.payload_len > max_payload_len(h)) {
    throw HdrDecodeError("header declares " + std::to_string(ph.payload_len) +
                         " bytes of counts, more than its value range can need");
  }
  std::vector<uint8_t> body(ph.payload_len);
  if (!inflate_exact(inf.zs, body.data(), body.size())) {
    throw HdrDecodeError("compressed payload is truncated: fewer than the " +
                         std::to_string(ph.payload_len) + " bytes of counts its header declares");
  }
  uint8_t extra = 0;
  inf.zs.next_out = &extra;
  inf.zs.avail_out = 1;
  const int rc = inflate(&inf.zs, Z_FINISH);
  if (rc != Z_STREAM_END || inf.zs.avail_out == 0) {
    throw HdrDecodeError(rc == Z_STREAM_END || inf.zs.avail_out == 0
                             ? "compressed payload is longer than its header declares"
                             : "compressed payload is truncated or corrupt (no end of stream)");
  }
  decode_counts(h, body.data(), body.data() + body.size());
  return h;
}

HdrHistogram decode_base64(std::string_view text) {
  const std::vector<uint8_t> bytes = base64_decode(text);
  return decode_compressed(bytes.data(), bytes.size());
}

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

std::string base64_encode(const uint8_t* data, size_t size) {
  std::string out;
  out.reserve((size + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= size; i += 3) {
    const uint32_t v = (uint32_t{data[i]} << 16) | (uint32_t{data[i + 1]} << 8) | data[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < size) {
    uint32_t v = uint32_t{data[i]} << 16;
    if (i + 1 < size) v |= uint32_t{data[i + 1]} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < size ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::vector<uint8_t> base64_decode(std::string_view text) {
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t padding = 0;
  size_t position = 0;
  for (const char c : text) {
    ++position;
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      ++padding;
      continue;
    }
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else {
      throw HdrDecodeError("invalid base64 character at position " + std::to_string(position));
    }
    if (padding) throw HdrDecodeError("base64 data continues after '=' padding");
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  if (bits >= 6 || padding > 2) throw HdrDecodeError("base64 data has an invalid length");
  return out;
}

}  // namespace loadgen
