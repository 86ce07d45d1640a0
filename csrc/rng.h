#pragma once
// A small, fast, portable random generator (xoshiro256**, seeded by splitmix64), so that
// the same seed gives the same schedule and sample order on every platform.

#include <cmath>
#include <cstdint>

namespace loadgen {

/// Deterministic 64-bit generator. Not thread-safe: one per stream.
class Rng {
 public:
  explicit Rng(uint64_t seed) noexcept {
    for (uint64_t& word : s_) {
      seed += 0x9e3779b97f4a7c15ULL;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      word = z ^ (z >> 31);
    }
  }
  uint64_t next() noexcept {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform in [0, 1), 53 bits.
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Exponential with mean 1.
  double exponential() noexcept { return -std::log1p(-uniform()); }
  /// Standard normal (Marsaglia's polar method; the second value is discarded, so that
  /// the stream's use of the generator does not depend on earlier calls).
  double normal() noexcept {
    for (;;) {
      const double u = 2.0 * uniform() - 1.0;
      const double v = 2.0 * uniform() - 1.0;
      const double s = u * u + v * v;
      if (s > 0.0 && s < 1.0) return u * std::sqrt(-2.0 * std::log(s) / s);
    }
  }
  /// Gamma with shape k > 0 and scale 1 (mean k), by Marsaglia and Tsang's method; for
  /// k < 1, Gamma(k + 1) * U^(1/k).
  double gamma(double k) noexcept {
    const double boost = k < 1.0 ? std::pow(1.0 - uniform(), 1.0 / k) : 1.0;
    const double d = (k < 1.0 ? k + 1.0 : k) - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x;
      double v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = 1.0 - uniform();  // (0, 1]
      const double x2 = x * x;
      if (u < 1.0 - 0.0331 * x2 * x2) return d * v * boost;
      if (std::log(u) < 0.5 * x2 + d * (1.0 - v + std::log(v))) return d * v * boost;
    }
  }
  /// Uniform integer in [0, n), n > 0 (Lemire's multiply-shift, bias < 2^-64 * n).
  uint64_t below(uint64_t n) noexcept {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace loadgen
