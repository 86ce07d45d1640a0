#include "in_flight.h"

#include "clock.h"

namespace loadgen {

InFlightTable::InFlightTable(uint64_t capacity, int64_t samples_per_query)
    : mask_(capacity - 1),
      ids_(bits_for(capacity - 1)),
      spq_(static_cast<uint64_t>(samples_per_query)),
      slots_(new Slot[capacity]),
      samples_(capacity * spq_, 0) {}

int64_t InFlightTable::find_free_slot() noexcept {
  for (uint64_t k = 0; k <= mask_; ++k) {
    const uint64_t i = (free_cursor_ + k) & mask_;
    if (state_of(slots_[i].state.load(std::memory_order_acquire)) == kFree) {
      free_cursor_ = i + 1;
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

int64_t InFlightTable::claim_outstanding(uint64_t slot_index) noexcept {
  Slot& s = slots_[slot_index];
  for (;;) {
    uint64_t w = s.state.load(std::memory_order_acquire);
    const uint64_t st = state_of(w);
    if (st == kFree) return 0;
    if (st == kIssuing || st == kClaimed) {  // a consumer or completer is mid-way
      cpu_relax();
      continue;
    }
    if (s.state.compare_exchange_strong(w, word(id_of(w), kClaimed), std::memory_order_acq_rel)) {
      return id_of(w);
    }
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
  const Slot& s = slots_[index(id)];
  uint64_t w = s.state.load(std::memory_order_acquire);
  // Another thread resolving this very id (a duplicate racing the first completion, or
  // the timeout reaper): its history entry comes before the slot is free.
  for (int spins = 0; id_of(w) == id && state_of(w) == kClaimed; ++spins) {
    if (spins > 1'000'000) return Stray::kLate;  // it takes too long to tell
    cpu_relax();
    w = s.state.load(std::memory_order_acquire);
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
  Slot& s = slot(id);
  const uint64_t issued = word(id, kIssued);
  if (s.state.load(std::memory_order_acquire) != issued) return false;
  const int64_t scheduled = s.scheduled_ns;
  const FirstTokenStamp r = loadgen::stamp_first_token(
      s.first_token_ns, t_ns, [&] { return s.state.load(std::memory_order_acquire) == issued; });
  if (r != FirstTokenStamp::kStamped) return false;
  *scheduled_ns = scheduled;
  return true;
}

}  // namespace loadgen
