#pragma once
// The histogram as Python holds it, shared by the binding units that return histograms.
#include <mutex>
#include <utility>

#include "hdr_histogram.h"

namespace loadgen_bindings {

/// The C++ histogram plus the mutex that Python-facing writers take (see
/// bind_histogram.cc for why writes from Python are serialised this way).
struct PyHistogram : loadgen::HdrHistogram {
  using loadgen::HdrHistogram::HdrHistogram;
  explicit PyHistogram(loadgen::HdrHistogram&& h) : loadgen::HdrHistogram(std::move(h)) {}
  PyHistogram(const PyHistogram& other) : loadgen::HdrHistogram(other) {}
  std::mutex writer;
};

}  // namespace loadgen_bindings
