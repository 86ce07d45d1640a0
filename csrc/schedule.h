#pragma once
// Arrival schedules, generated lazily: each call yields the next arrival's offset from
// the start of the run, so memory does not depend on run length.

#include <cstdint>
#include <vector>

#include "rng.h"

namespace loadgen {

/// One stage of a piecewise schedule: `duration_ns` long, the rate going from
/// `start_qps` to `end_qps` (equal: a step; different: a linear ramp).
struct Stage {
  int64_t duration_ns = 0;
  double start_qps = 0.0;
  double end_qps = 0.0;
};

/// The open-loop arrival processes. (Closed loop is not a time schedule: the engine
/// issues the next query when one completes.)
enum class ArrivalKind { kConstant, kPoisson, kStages, kTrace, kOffline };

/// A lazily generated sequence of arrival offsets (ns from the run's start),
/// non-decreasing. Not thread-safe: owned by the issue thread.
class ArrivalSchedule {
 public:
  /// Evenly spaced arrivals: the k-th at round(k * 1e9 / qps). qps > 0.
  static ArrivalSchedule constant(double qps);
  /// Poisson arrivals: exponential gaps with mean 1e9 / qps ns, from `seed`. qps > 0.
  /// With `burstiness` B != 1 the gaps are Gamma(shape B, scale 1e9 / (qps * B)): the
  /// same mean, coefficient of variation 1 / sqrt(B) (B < 1 burstier, B > 1 smoother).
  /// B = 1 is exactly the exponential stream. B in [kMinBurstiness, kMaxBurstiness].
  static ArrivalSchedule poisson(double qps, uint64_t seed, double burstiness = 1.0);
  /// Piecewise rate (steps and linear ramps); Poisson arrivals when `poisson` (their
  /// unit-mean work between arrivals Gamma(B) / B when `burstiness` B != 1), else evenly
  /// spaced in the integrated rate. Exhausted after the last stage.
  static ArrivalSchedule stages(std::vector<Stage> stages, bool poisson, uint64_t seed,
                                double burstiness = 1.0);
  static constexpr double kMinBurstiness = 0.01;
  static constexpr double kMaxBurstiness = 1000.0;
  /// Replays recorded offsets (ns, non-decreasing, >= 0). Exhausted after the last.
  static ArrivalSchedule trace(std::vector<int64_t> offsets_ns);
  /// Everything at once: every arrival at offset 0 (Offline).
  static ArrivalSchedule offline();

  /// Writes the next arrival offset; false once the schedule is exhausted.
  bool next(int64_t* offset_ns) noexcept;
  ArrivalKind kind() const noexcept { return kind_; }

 private:
  ArrivalSchedule(ArrivalKind kind, uint64_t seed) : kind_(kind), rng_(seed) {}
  bool next_stage_arrival(int64_t* offset_ns) noexcept;
  /// The next gap in units of the mean gap: exponential, or Gamma(B) / B.
  double unit_gap() noexcept {
    return burstiness_ == 1.0 ? rng_.exponential() : rng_.gamma(burstiness_) / burstiness_;
  }

  ArrivalKind kind_;
  Rng rng_;
  double period_ns_ = 0.0;  // constant
  double mean_gap_ns_ = 0.0;  // poisson
  double burstiness_ = 1.0;  // poisson and Poisson stages: gamma shape (1: exponential)
  double t_ns_ = 0.0;       // poisson: running time
  uint64_t k_ = 0;          // constant: arrivals so far; trace: position
  std::vector<Stage> stages_;
  bool poisson_ = false;
  size_t stage_ = 0;
  double stage_start_ns_ = 0.0;
  double tau_ns_ = 0.0;  // position within the stage
  std::vector<int64_t> trace_;
};

}  // namespace loadgen
