#include "schedule.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "require.h"

namespace loadgen {
namespace {

using detail::require;

void require_rate(double qps, const char* field) {
  require(std::isfinite(qps) && qps > 0.0,
          std::string(field) + " must be a finite rate > 0, got " + std::to_string(qps));
}

void require_burstiness(double b) {
  require(std::isfinite(b) && b >= ArrivalSchedule::kMinBurstiness && b <= ArrivalSchedule::kMaxBurstiness,
          "burstiness must be in [0.01, 1000], got " + std::to_string(b));
}

}  // namespace

ArrivalSchedule ArrivalSchedule::constant(double qps) {
  require_rate(qps, "target_qps");
  ArrivalSchedule s(ArrivalKind::kConstant, 0);
  s.period_ns_ = 1e9 / qps;
  return s;
}

ArrivalSchedule ArrivalSchedule::poisson(double qps, uint64_t seed, double burstiness) {
  require_rate(qps, "target_qps");
  require_burstiness(burstiness);
  ArrivalSchedule s(ArrivalKind::kPoisson, seed);
  s.mean_gap_ns_ = 1e9 / qps;
  s.burstiness_ = burstiness;
  return s;
}

ArrivalSchedule ArrivalSchedule::stages(std::vector<Stage> stages, bool poisson, uint64_t seed,
                                        double burstiness) {
  require(!stages.empty(), "stages must not be empty");
  require_burstiness(burstiness);
  bool any_rate = false;
  for (size_t i = 0; i < stages.size(); ++i) {
    const Stage& st = stages[i];
    const std::string where = "stages[" + std::to_string(i) + "]";
    require(st.duration_ns > 0, where + ".duration must be > 0");
    require(std::isfinite(st.start_qps) && st.start_qps >= 0 && std::isfinite(st.end_qps) &&
                st.end_qps >= 0,
            where + " rates must be finite and >= 0");
    any_rate = any_rate || st.start_qps > 0 || st.end_qps > 0;
  }
  require(any_rate, "stages: at least one stage needs a rate > 0");
  ArrivalSchedule s(ArrivalKind::kStages, seed);
  s.stages_ = std::move(stages);
  s.poisson_ = poisson;
  s.burstiness_ = burstiness;
  return s;
}

ArrivalSchedule ArrivalSchedule::trace(std::vector<int64_t> offsets_ns) {
  require(!offsets_ns.empty(), "trace must hold at least one offset");
  for (size_t i = 0; i < offsets_ns.size(); ++i) {
    require(offsets_ns[i] >= 0, "trace offsets must be >= 0 (offset " + std::to_string(i) + ")");
    require(i == 0 || offsets_ns[i] >= offsets_ns[i - 1],
            "trace offsets must be non-decreasing (offset " + std::to_string(i) + ")");
  }
  ArrivalSchedule s(ArrivalKind::kTrace, 0);
  s.trace_ = std::move(offsets_ns);
  return s;
}

ArrivalSchedule ArrivalSchedule::offline() { return ArrivalSchedule(ArrivalKind::kOffline, 0); }

bool ArrivalSchedule::next(int64_t* offset_ns) noexcept {
  switch (kind_) {
    case ArrivalKind::kConstant:
      // From k each time rather than accumulated, so rounding never drifts.
      *offset_ns = std::llround(static_cast<double>(k_++) * period_ns_);
      return true;
    case ArrivalKind::kPoisson:
      *offset_ns = std::llround(t_ns_);
      t_ns_ += unit_gap() * mean_gap_ns_;
      return true;
    case ArrivalKind::kStages:
      return next_stage_arrival(offset_ns);
    case ArrivalKind::kTrace:
      if (k_ >= trace_.size()) return false;
      *offset_ns = trace_[k_++];
      return true;
    case ArrivalKind::kOffline:
      *offset_ns = 0;
      return true;
  }
  return false;
}

// The rate within a stage is r(tau) = r0 + (r1 - r0) * tau / D (per ns). The next
// arrival is where the integrated rate has grown by `work` (1 for even spacing, an
// exponential or Gamma(B) / B draw for Poisson), carried across stage boundaries.
bool ArrivalSchedule::next_stage_arrival(int64_t* offset_ns) noexcept {
  const bool first = k_++ == 0;
  double work = poisson_ ? unit_gap() : 1.0;
  if (first && !poisson_) work = 0.0;  // even spacing starts with an arrival at t = 0
  while (stage_ < stages_.size()) {
    const Stage& st = stages_[stage_];
    const double d = static_cast<double>(st.duration_ns);
    const double r0 = st.start_qps * 1e-9;
    const double slope = (st.end_qps - st.start_qps) * 1e-9 / d;
    auto integral = [&](double tau) { return r0 * tau + 0.5 * slope * tau * tau; };
    const double target = integral(tau_ns_) + work;
    if (integral(d) >= target && (r0 > 0 || slope != 0)) {
      double tau;
      if (std::fabs(slope) < 1e-30) {
        tau = target / r0;
      } else {
        const double disc = r0 * r0 + 2.0 * slope * target;
        tau = (-r0 + std::sqrt(disc > 0 ? disc : 0.0)) / slope;
      }
      if (tau < tau_ns_) tau = tau_ns_;
      if (tau > d) tau = d;
      tau_ns_ = tau;
      *offset_ns = std::llround(stage_start_ns_ + tau);
      return true;
    }
    work = target - integral(d);
    stage_start_ns_ += d;
    tau_ns_ = 0.0;
    ++stage_;
  }
  return false;
}

}  // namespace loadgen
