// libFuzzer target for the C++ HDR decoders (csrc/hdr_codec.cc), which atheris cannot
// see into. Built by scripts/fuzz.sh with clang -fsanitize=fuzzer,address,undefined.
//
// The first byte picks the decoder (uncompressed payload, compressed form, base64 text);
// the rest is its input. A malformed input must end in HdrDecodeError; whatever decodes
// must encode and decode again to the same counts. Anything else -- another exception,
// a sanitizer report, a changed count -- is a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hdr_codec.h"
#include "hdr_histogram.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 3;
  data++;
  size--;
  try {
    loadgen::HdrHistogram h =
        which == 0   ? loadgen::decode_uncompressed(data, size)
        : which == 1 ? loadgen::decode_compressed(data, size)
                     : loadgen::decode_base64(std::string_view(reinterpret_cast<const char*>(data), size));
    const int64_t n = h.total_count();
    (void)h.value_at_percentile(99.9);
    (void)h.max();
    const std::string text = loadgen::encode_base64(h);
    loadgen::HdrHistogram back = loadgen::decode_base64(text);
    if (back.total_count() != n) __builtin_trap();
  } catch (const loadgen::HdrDecodeError&) {
  }
  return 0;
}
