#pragma once
// Random draws that reproduce the MLPerf LoadGen's query generation bit for bit.
//
// The MLPerf LoadGen draws sample indices, shuffles and Poisson gaps with std::mt19937
// and the standard library's distributions. The engine (std::mt19937) is fully
// specified by the C++ standard, but the distributions are not: their algorithms are
// the library's choice. The published wheels are built against libstdc++ (GCC 11 or
// later), so the algorithms below are those, written out here so that the results do
// not depend on which compiler or standard library builds this package.

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace loadgen {
namespace mlperf {

using Mt19937 = std::mt19937;  // fully specified by the standard: same stream everywhere

/// Uniform integer in [0, range) for 1 <= range <= 2^32, from one or more 32-bit draws:
/// multiply-and-shift with rejection of the biased low products (the "nearly
/// divisionless" method, as libstdc++ does for 32-bit engines).
inline uint64_t uniform_below_2_32(Mt19937& g, uint64_t range) noexcept {
  uint64_t product = static_cast<uint64_t>(g()) * range;
  uint32_t low = static_cast<uint32_t>(product);
  if (low < range) {
    const uint32_t threshold = static_cast<uint32_t>(-static_cast<uint32_t>(range) % static_cast<uint32_t>(range));
    while (low < threshold) {
      product = static_cast<uint64_t>(g()) * range;
      low = static_cast<uint32_t>(product);
    }
  }
  return product >> 32;
}

/// Uniform integer in [a, b] (a <= b), as std::uniform_int_distribution draws it from a
/// 32-bit engine.
inline uint64_t uniform_int(Mt19937& g, uint64_t a, uint64_t b) noexcept {
  const uint64_t urange = b - a;
  constexpr uint64_t kEngineRange = 0xFFFFFFFFull;
  if (urange < kEngineRange) return a + uniform_below_2_32(g, urange + 1);
  if (urange == kEngineRange) return a + static_cast<uint64_t>(g());
  // Wider than one draw: compose a high part and a low draw, rejecting overflow.
  constexpr uint64_t kEngineSpan = kEngineRange + 1;
  uint64_t ret = 0;
  uint64_t high = 0;
  do {
    high = kEngineSpan * uniform_int(g, 0, urange / kEngineSpan);
    ret = high + static_cast<uint64_t>(g());
  } while (ret > urange || ret < high);
  return a + ret;
}

/// A double in [0, 1) from two 32-bit draws, as std::generate_canonical<double, 53>.
inline double canonical(Mt19937& g) noexcept {
  double sum = static_cast<double>(g());
  sum += static_cast<double>(g()) * 4294967296.0;
  double r = sum / 18446744073709551616.0;
  if (r >= 1.0) r = std::nextafter(1.0, 0.0);
  return r;
}

/// An exponential draw with rate `lambda`, as std::exponential_distribution<double>.
inline double exponential(Mt19937& g, double lambda) noexcept {
  return -std::log(1.0 - canonical(g)) / lambda;
}

/// A uniform double in [a, b), as std::uniform_real_distribution<double>.
inline double uniform_real(Mt19937& g, double a, double b) noexcept {
  return canonical(g) * (b - a) + a;
}

/// Seconds as a double to whole nanoseconds, truncating toward zero (chrono's
/// duration_cast from duration<double> to nanoseconds).
inline int64_t seconds_to_ns(double seconds) noexcept {
  return static_cast<int64_t>(seconds * 1e9);
}

/// The draws std::shuffle makes for a range of `n` elements, handed to `swap(i, j)`
/// (swap element i with element j, j <= i) in order. When two positions fit in one
/// 32-bit draw, libstdc++ draws them in pairs; the pairing changes the stream, so it is
/// reproduced exactly. `swap` may ignore its arguments (to advance `g` only).
template <class Swap>
inline void shuffle_draws(size_t n, Mt19937& g, Swap&& swap) {
  if (n < 2) return;
  const uint64_t urange = static_cast<uint64_t>(n - 1);  // positions 0..n-1
  constexpr uint64_t kEngineRange = 0xFFFFFFFFull;
  const uint64_t uerange = urange + 1;
  if (kEngineRange / uerange >= uerange) {
    size_t i = 1;
    if ((uerange % 2) == 0) {
      swap(i, static_cast<size_t>(uniform_int(g, 0, 1)));
      ++i;
    }
    while (i != n) {
      const uint64_t b0 = static_cast<uint64_t>(i) + 1;
      const uint64_t b1 = b0 + 1;
      const uint64_t x = uniform_int(g, 0, b0 * b1 - 1);
      swap(i, static_cast<size_t>(x / b1));
      ++i;
      swap(i, static_cast<size_t>(x % b1));
      ++i;
    }
    return;
  }
  for (size_t i = 1; i != n; ++i) swap(i, static_cast<size_t>(uniform_int(g, 0, i)));
}

/// std::shuffle of `v` with `g`, reproduced.
template <class T>
inline void shuffle(std::vector<T>& v, size_t first, size_t last, Mt19937& g) {
  T* base = v.data() + first;
  shuffle_draws(last - first, g, [base](size_t i, size_t j) { std::swap(base[i], base[j]); });
}

}  // namespace mlperf
}  // namespace loadgen
