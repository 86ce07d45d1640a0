#pragma once
// The standard HdrHistogram V2 encodings: the uncompressed payload (40-byte big-endian
// header followed by ZigZag LEB128 counts, runs of zeros as negative numbers), the
// compressed form (8-byte header followed by the zlib-deflated payload) and its base64
// text form as found in histogram interval logs ("HISTF...").

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "hdr_histogram.h"

namespace loadgen {

/// Thrown when an encoded histogram is malformed: wrong cookie, truncated, corrupt
/// compression, counts that do not fit the declared range. The message says which.
class HdrDecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Cookies of the V2 format (the low nibble of the second byte may carry a word size).
inline constexpr uint32_t kV2EncodingCookie = 0x1c849303u | 0x10u;
inline constexpr uint32_t kV2CompressedCookie = 0x1c849304u | 0x10u;

/// V2 uncompressed payload of `h`. Thread-safe against concurrent recording.
std::vector<uint8_t> encode_uncompressed(const HdrHistogram& h);
/// V2 compressed form of `h` (zlib level 1..9, or -1 for zlib's default, which the
/// reference implementations use).
std::vector<uint8_t> encode_compressed(const HdrHistogram& h, int level = -1);
/// base64 text of the compressed form.
std::string encode_base64(const HdrHistogram& h, int level = -1);

/// Decodes a V2 uncompressed payload. Throws HdrDecodeError on malformed input.
HdrHistogram decode_uncompressed(const uint8_t* data, size_t size);
/// Decodes the V2 compressed form. Throws HdrDecodeError on malformed input; never
/// inflates more than the declared payload (a crafted stream cannot exhaust memory).
HdrHistogram decode_compressed(const uint8_t* data, size_t size);
/// Decodes the base64 text of the compressed form (ASCII white space is ignored).
HdrHistogram decode_base64(std::string_view text);

/// Standard base64 (RFC 4648, with padding).
std::string base64_encode(const uint8_t* data, size_t size);
/// Standard base64; padding optional, white space ignored. Throws HdrDecodeError.
std::vector<uint8_t> base64_decode(std::string_view text);

}  // namespace loadgen
