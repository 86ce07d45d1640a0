#pragma once
// Tracking queries in flight: the slot table both the issue engine and the MLPerf issue
// loop keep their outstanding queries in (tagged words naming a slot's query, the
// first-token stamp that a reused slot cannot inherit), and the engine's table on it.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace loadgen {

/// Bits needed to hold every value in 0..n (0 for n = 0).
inline int bits_for(uint64_t n) noexcept {
  int b = 0;
  while (b < 64 && (n >> b) != 0) ++b;
  return b;
}

/// A 64-bit word packing a tag (a query's number) above a small field of `low_bits`
/// bits (a slot index, a state, a count, a sample's position). A slot's word that holds
/// its query's tag can never be mistaken for a later query's, since tags are not reused.
class TaggedWord {
 public:
  constexpr TaggedWord() noexcept = default;
  /// low_bits in 0..63.
  explicit constexpr TaggedWord(int low_bits) noexcept
      : bits_(low_bits), mask_((uint64_t{1} << low_bits) - 1) {}
  constexpr uint64_t pack(uint64_t tag, uint64_t low) const noexcept { return (tag << bits_) | low; }
  constexpr uint64_t tag(uint64_t word) const noexcept { return word >> bits_; }
  constexpr uint64_t low(uint64_t word) const noexcept { return word & mask_; }
  constexpr int bits() const noexcept { return bits_; }
  constexpr uint64_t low_mask() const noexcept { return mask_; }

 private:
  int bits_ = 0;
  uint64_t mask_ = 0;
};

/// How a first-token stamp went.
enum class FirstTokenStamp {
  kStamped,   ///< this call stamped the query's first token
  kAlready,   ///< the query already had its first token
  kGone,      ///< the query resolved (its slot perhaps reused) meanwhile; nothing stamped
};

/// Stamps `t_ns` (> 0) as a query's first token in `stamp` (0: none yet), once. The
/// caller has seen its slot hold the query; `still_mine()` looks again after the stamp:
/// if the query resolved meanwhile, the stamp (which would belong to the slot's next
/// query) is taken back. Any thread; lock-free.
template <class StillMine>
FirstTokenStamp stamp_first_token(std::atomic<int64_t>& stamp, int64_t t_ns, StillMine still_mine) noexcept {
  int64_t expect = 0;
  if (!stamp.compare_exchange_strong(expect, t_ns, std::memory_order_acq_rel)) return FirstTokenStamp::kAlready;
  if (!still_mine()) {
    int64_t mine = t_ns;
    stamp.compare_exchange_strong(mine, 0, std::memory_order_acq_rel);
    return FirstTokenStamp::kGone;
  }
  return FirstTokenStamp::kStamped;
}

/// The slot storage both tables of queries in flight are built on: `capacity` slots (a
/// power of 2), each holding an atomic `word` and an atomic `first_token_ns` (Slot adds
/// what its table needs). A slot's word is a TaggedWord of `words`: its tag names the
/// query holding the slot (never reused, so a stale tag never matches a later query) and
/// its low field is 0 exactly when the slot is free. Slots are named by any number taken
/// modulo the capacity, a slot index or a sequence number alike.
///
/// Which slot a new query takes is the owner's policy, the one thing the two tables do
/// differently: InFlightTable takes any free slot (find_free()), MlperfRun the slot of
/// its query's sequence number. What the low field counts, and so the transitions
/// between words, are the owner's too (a state; samples outstanding).
/// Thread-safety: word reads, publishes, exchanges and first-token stamps are lock-free
/// from any thread; find_free() belongs to the one thread that takes slots.
template <class Slot>
class SlotTable {
 public:
  /// `capacity`: a power of 2 >= 1.
  SlotTable(uint64_t capacity, TaggedWord words) : mask_(capacity - 1), words_(words), slots_(new Slot[capacity]) {}

  uint64_t capacity() const noexcept { return mask_ + 1; }
  /// The index of the slot that number `n` names.
  uint64_t index(uint64_t n) const noexcept { return n & mask_; }
  const TaggedWord& words() const noexcept { return words_; }
  Slot& at(uint64_t n) noexcept { return slots_[n & mask_]; }
  const Slot& at(uint64_t n) const noexcept { return slots_[n & mask_]; }
  /// Slot n's word (an acquire load).
  uint64_t load(uint64_t n) const noexcept { return at(n).word.load(std::memory_order_acquire); }
  bool is_free(uint64_t n) const noexcept { return words_.low(load(n)) == 0; }
  /// Publishes (tag, low) as slot n's word: a release store by the slot's owner, after
  /// which the slot's other fields are visible with it.
  void publish(uint64_t n, uint64_t tag, uint64_t low) noexcept {
    at(n).word.store(words_.pack(tag, low), std::memory_order_release);
  }
  /// Replaces slot n's word `expect` with `desired`; true when this caller did.
  bool exchange(uint64_t n, uint64_t expect, uint64_t desired) noexcept {
    return at(n).word.compare_exchange_strong(expect, desired, std::memory_order_acq_rel);
  }
  /// Stamps `t_ns` (> 0) as the first token of the query in slot n, once, while
  /// `holds(word)` says the slot's word still names it (see loadgen::stamp_first_token).
  template <class Holds>
  FirstTokenStamp stamp_first_token(uint64_t n, int64_t t_ns, Holds holds) noexcept {
    Slot& s = at(n);
    return loadgen::stamp_first_token(s.first_token_ns, t_ns,
                                      [&] { return holds(s.word.load(std::memory_order_acquire)); });
  }
  /// The any-free-slot policy: a free slot's index, scanning round-robin from `*cursor`
  /// (the one past the last taken, updated); -1 when none is free.
  int64_t find_free(uint64_t* cursor) const noexcept {
    for (uint64_t k = 0; k <= mask_; ++k) {
      const uint64_t i = (*cursor + k) & mask_;
      if (is_free(i)) {
        *cursor = i + 1;
        return static_cast<int64_t>(i);
      }
    }
    return -1;
  }

 private:
  uint64_t mask_;
  TaggedWord words_;
  std::unique_ptr<Slot[]> slots_;
};

/// The issue engine's in-flight table: a SlotTable with one slot per outstanding query,
/// any free slot taking the next query (a slow query does not hold up the ones after it).
///
/// A query id is (sequence number << slot bits) | slot index: ids grow in issue order,
/// name their slot, and fit in 61 bits. A slot's state word is (id << 3) | state, so a
/// stale id never matches a reused slot. Transitions:
///   free -> queued -> issuing -> issued (queue SUT) or free -> issued (native SUTs);
///   queued/issued -> claimed -> free (completed, failed, timed out or cancelled).
/// Thread-safety: find_free_slot() and fill() belong to the one issuing thread; the
/// state transitions and first-token stamps are lock-free from any thread.
class InFlightTable {
 public:
  enum State : uint64_t { kFree = 0, kQueued = 1, kIssuing = 2, kIssued = 3, kClaimed = 4 };
  /// Who resolved a query (kept in its slot's history).
  enum ResolvedBy : uint64_t { kBySut = 1, kByEngine = 2 };
  /// What a completion (or failure) of an id that was not in flight was.
  enum class Stray {
    kNeverIssued,  ///< no query with this id was handed out
    kDuplicate,    ///< its query had been resolved by the SUT already (completed or failed)
    kLate,         ///< its query had timed out or been cancelled, or is too far back to tell
  };
  /// The queries a slot remembers after they were resolved.
  static constexpr int kHistory = 4;
  struct alignas(64) Slot {
    std::atomic<uint64_t> word{kFree};  ///< (id << 3) | State
    int64_t scheduled_ns = 0;
    int64_t issued_ns = 0;
    std::atomic<int64_t> first_token_ns{0};
    /// The slot's last kHistory resolved queries, (id << 3) | ResolvedBy (0: none), written
    /// by the resolver before it frees the slot: the rest of the slot's cache line.
    std::atomic<uint64_t> history[kHistory] = {};
  };

  /// `capacity` slots (a power of 2, >= 1), each with room for `samples_per_query`
  /// (>= 1) sample indices.
  InFlightTable(uint64_t capacity, int64_t samples_per_query);

  uint64_t capacity() const noexcept { return slots_.capacity(); }
  /// Whether `id` can name a query at all (positive, within 61 bits).
  static bool valid_id(int64_t id) noexcept { return id > 0 && (static_cast<uint64_t>(id) >> 61) == 0; }
  int64_t make_id(int64_t seq, uint64_t slot_index) const noexcept {
    return static_cast<int64_t>(ids_.pack(static_cast<uint64_t>(seq), slot_index));
  }
  uint64_t index(int64_t id) const noexcept { return slots_.index(static_cast<uint64_t>(id)); }
  /// The sequence number make_id() packed into `id`.
  int64_t seq_of(int64_t id) const noexcept { return static_cast<int64_t>(ids_.tag(static_cast<uint64_t>(id))); }
  Slot& slot(int64_t id) noexcept { return slots_.at(static_cast<uint64_t>(id)); }
  Slot& at(uint64_t slot_index) noexcept { return slots_.at(slot_index); }
  /// The sample indices of query `id` (samples_per_query of them).
  int64_t* samples(int64_t id) noexcept { return &samples_[index(id) * spq_]; }

  static uint64_t word(int64_t id, uint64_t state) noexcept {
    return kStates.pack(static_cast<uint64_t>(id), state);
  }
  static int64_t id_of(uint64_t word) noexcept { return static_cast<int64_t>(kStates.tag(word)); }
  static uint64_t state_of(uint64_t word) noexcept { return kStates.low(word); }

  /// A free slot's index, scanning round-robin from the last one taken; -1 when none
  /// is free. Issuing thread only.
  int64_t find_free_slot() noexcept { return slots_.find_free(&free_cursor_); }
  /// Readies the free slot of new query `id` (not yet visible to other threads).
  /// Issuing thread only.
  Slot& fill(int64_t id, int64_t scheduled_ns, int64_t issued_ns) noexcept {
    Slot& s = slot(id);
    // Atomic (relaxed) as the timeout reaper may read a slot being reused: it reads
    // scheduled_ns after checking the slot's word, and its claim fails if the word changed.
    __atomic_store_n(&s.scheduled_ns, scheduled_ns, __ATOMIC_RELAXED);
    s.issued_ns = issued_ns;
    s.first_token_ns.store(0, std::memory_order_relaxed);
    return s;
  }
  /// Publishes query `id` in `state` (a release store by its owner).
  void set(int64_t id, uint64_t state) noexcept { slots_.publish(static_cast<uint64_t>(id), static_cast<uint64_t>(id), state); }
  /// Moves `id` from `from` to `to`; true when this caller made the move.
  bool transition(int64_t id, uint64_t from, uint64_t to) noexcept {
    return slots_.exchange(static_cast<uint64_t>(id), word(id, from), word(id, to));
  }
  /// Claims issued query `id` for its caller to resolve; false when `id` is not in
  /// flight (late, duplicate, bogus).
  bool claim_issued(int64_t id) noexcept { return valid_id(id) && transition(id, kIssued, kClaimed); }
  /// Frees a claimed slot, remembering who resolved its query.
  void free(int64_t id, ResolvedBy by) noexcept {
    remember(id, by);
    set(id, kFree);
  }
  /// What an id that claim_issued() refused was: never handed out, a query already
  /// resolved by the SUT, or one the engine resolved (timed out, cancelled) or too far
  /// back to tell (its slot has resolved kHistory later queries since). Waits out a
  /// resolution of that very id in progress. Any thread; lock-free.
  Stray classify_stray(int64_t id) const noexcept;
  /// Claims whatever query slot `slot_index` holds once it is queued or issued (waiting
  /// out a consumer or completer mid-way). Returns its id, or 0 when the slot is free.
  int64_t claim_outstanding(uint64_t slot_index) noexcept;
  /// Stamps the first token of issued query `id` at `t_ns` (> 0), once; on success
  /// writes its scheduled time. False when not issued or already stamped.
  bool stamp_first_token(int64_t id, int64_t t_ns, int64_t* scheduled_ns) noexcept;

 private:
  // Replaces the oldest entry of id's slot's history (the slot is claimed: one writer).
  void remember(int64_t id, ResolvedBy by) noexcept;

  static constexpr TaggedWord kStates{3};
  SlotTable<Slot> slots_;
  TaggedWord ids_;
  uint64_t spq_;
  uint64_t free_cursor_ = 0;  // issuing thread only
  std::vector<int64_t> samples_;  // capacity * samples_per_query
};

}  // namespace loadgen
