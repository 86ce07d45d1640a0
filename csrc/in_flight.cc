#include "in_flight.h"

#include "clock.h"

namespace loadgen {

InFlightTable::InFlightTable(uint64_t capacity, int64_t samples_per_query)
    : slots_(capacity, kStates),
      ids_(bits_for(capacity - 1)),
      spq_(static_cast<uint64_t>(samples_per_query)),
      samples_(capacity * spq_, 0) {}

int64_t InFlightTable::claim_outstanding(uint64_t slot_index) noexcept {
  for (;;) {
    const uint64_t w = slots_.load(slot_index);
    const uint64_t st = state_of(w);
    if (st == kFree) return 0;
    if (st == kIssuing || st == kClaimed) {  // a consumer or completer is mid-way
      cpu_relax();
      continue;
    }
    if (slots_.exchange(slot_index, w, word(id_of(w), kClaimed))) return id_of(w);
  }
}

void InFlightTable::remember(int64_t id, ResolvedBy by) noexcept {
  Slot& s = slot(id);
  int pick = 0;
  uint64_t oldest = UINT64_MAX;
  for (int k = 0; k < kHistory; ++k) {
    const uint64_t w = s.history[k].load(std::memory_order_relaxed);
    if (w == 0) {
      pick = k;
      break;
    }
    if (w < oldest) {  // ids grow in issue order, so the smallest word is the oldest
      oldest = w;
      pick = k;
    }
  }
  s.history[pick].store(kStates.pack(static_cast<uint64_t>(id), by), std::memory_order_relaxed);
}

InFlightTable::Stray InFlightTable::classify_stray(int64_t id) const noexcept {
  if (!valid_id(id)) return Stray::kNeverIssued;
  const Slot& s = slots_.at(static_cast<uint64_t>(id));
  uint64_t w = s.word.load(std::memory_order_acquire);
  // Another thread resolving this very id (a duplicate racing the first completion, or
  // the timeout reaper): its history entry comes before the slot is free.
  for (int spins = 0; id_of(w) == id && state_of(w) == kClaimed; ++spins) {
    if (spins > 1'000'000) return Stray::kLate;  // it takes too long to tell
    cpu_relax();
    w = s.word.load(std::memory_order_acquire);
  }
  const int64_t current = id_of(w);
  if (current < id) return Stray::kNeverIssued;  // the slot has not held it (ids grow per slot)
  if (current == id && state_of(w) != kFree) return Stray::kNeverIssued;  // queued, not handed out yet
  uint64_t oldest = UINT64_MAX;
  int filled = 0;
  for (int k = 0; k < kHistory; ++k) {
    const uint64_t h = s.history[k].load(std::memory_order_relaxed);
    if (h == 0) continue;
    ++filled;
    if (static_cast<int64_t>(kStates.tag(h)) == id) {
      return kStates.low(h) == kBySut ? Stray::kDuplicate : Stray::kLate;
    }
    oldest = h < oldest ? h : oldest;
  }
  // Not remembered: older than everything the slot remembers (perhaps issued), else
  // never held by it.
  if (filled == kHistory && static_cast<int64_t>(kStates.tag(oldest)) > id) return Stray::kLate;
  return Stray::kNeverIssued;
}

bool InFlightTable::stamp_first_token(int64_t id, int64_t t_ns, int64_t* scheduled_ns) noexcept {
  if (!valid_id(id)) return false;
  const uint64_t n = static_cast<uint64_t>(id);
  const uint64_t issued = word(id, kIssued);
  if (slots_.load(n) != issued) return false;
  const int64_t scheduled = slots_.at(n).scheduled_ns;
  const FirstTokenStamp r = slots_.stamp_first_token(n, t_ns, [issued](uint64_t w) { return w == issued; });
  if (r != FirstTokenStamp::kStamped) return false;
  *scheduled_ns = scheduled;
  return true;
}

}  // namespace loadgen
