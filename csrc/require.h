#pragma once
// Settings validation: one way to say that a field is wrong.

#include <stdexcept>
#include <string>

namespace loadgen {
namespace detail {

/// Throws std::invalid_argument(message) unless `ok`. For construction and settings
/// validation only (never on a hot path); the message names the field and its range.
inline void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

}  // namespace detail
}  // namespace loadgen
