// rkv::RouterIndex (the router index's C++ wrapper): typed events for two workers, finds
// (returned and into a reused vector without reallocating), a vLLM msgpack batch with its
// seq, a sliding-window group's batch skipped (stats_ex), gap policies, remove_worker /
// next_seq as values, dump -> restore, move-only ownership, and the refusals thrown as
// rkv::Error.
#include <algorithm>
#include <thread>
#include <vector>

#include "check.hpp"
#include "radixkv.hpp"

namespace {

constexpr std::uint32_t kBs = 4;

// The batch of tests/c/test_router.c (pinned to the encoder by a Rust unit test): one
// BlockStored of engine hashes 0xA0, 0xA1 with tokens 1..8 (block size 4), no parent, plain
// namespace, GPU; data_parallel_rank 0.
const std::vector<std::uint8_t> kBatch = {
    0x93, 0xcb, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x91, 0x9c, 0xab, 0x42, 0x6c,
    0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0xcc, 0xa0, 0xcc, 0xa1, 0xc0,
    0x98, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x04, 0xc0, 0xa3, 0x47, 0x50, 0x55,
    0xc0, 0xc0, 0x00, 0xae, 0x66, 0x75, 0x6c, 0x6c, 0x5f, 0x61, 0x74, 0x74, 0x65, 0x6e, 0x74,
    0x69, 0x6f, 0x6e, 0xc0, 0x00,
};
// The same store published by a sliding-window group (group 1, window 4; engine hashes
// 0xB0, 0xB1): the router skips it (tests/c/test_router.c's BATCH_SW, pinned the same way).
const std::vector<std::uint8_t> kBatchSw = {
    0x93, 0xcb, 0x3f, 0xf0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x91, 0x9c, 0xab, 0x42, 0x6c,
    0x6f, 0x63, 0x6b, 0x53, 0x74, 0x6f, 0x72, 0x65, 0x64, 0x92, 0xcc, 0xb0, 0xcc, 0xb1, 0xc0,
    0x98, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x04, 0xc0, 0xa3, 0x47, 0x50, 0x55,
    0xc0, 0xc0, 0x01, 0xae, 0x73, 0x6c, 0x69, 0x64, 0x69, 0x6e, 0x67, 0x5f, 0x77, 0x69, 0x6e,
    0x64, 0x6f, 0x77, 0x04, 0x00,
};

// Tokens of blocks first..first+n-1: block i is {10i, 10i+1, 10i+2, 10i+3}.
std::vector<std::uint32_t> toks(std::uint32_t first, std::uint32_t n) {
  std::vector<std::uint32_t> t;
  for (std::uint32_t b = first; b < first + n; ++b)
    for (std::uint32_t j = 0; j < kBs; ++j) t.push_back(b * 10 + j);
  return t;
}

std::vector<rkv::RouterScore> sorted(std::vector<rkv::RouterScore> v) {
  std::sort(v.begin(), v.end(), [](const rkv::RouterScore &a, const rkv::RouterScore &b) {
    return a.worker.worker_id < b.worker.worker_id;
  });
  return v;
}

bool is(const rkv::RouterScore &s, std::uint64_t id, std::uint32_t dev, std::uint32_t any) {
  return s.worker.worker_id == id && s.worker.dp_rank == 0 && s.device_blocks == dev &&
         s.any_blocks == any;
}

bool same(const std::vector<rkv::RouterScore> &a, const std::vector<rkv::RouterScore> &b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!is(b[i], a[i].worker.worker_id, a[i].device_blocks, a[i].any_blocks)) return false;
  return true;
}

rkv::RouterOptions opts(rkv::GapPolicy g = rkv::GapPolicy::clear) {
  rkv::RouterOptions o;
  o.block_size = kBs;
  o.gap_policy = g;
  return o;
}

void typed_events_and_finds() {
  rkv::RouterIndex r(opts());
  const rkv::Worker a = rkv::make_worker(1), b = rkv::make_worker(2);
  const auto q = toks(0, 4);
  r.stored(a, std::nullopt, {100, 101, 102}, toks(0, 3));
  r.stored(b, std::nullopt, {7, 8}, toks(0, 2));
  r.stored(b, 7, {8}, toks(1, 1), rkv::Medium::cpu_pinned);
  r.removed(b, {8});  // the device copy; the host copy stays
  auto s = sorted(r.find(q));
  CHECK(s.size() == 2 && is(s[0], 1, 3, 3) && is(s[1], 2, 1, 2));

  // Into a reused vector: no reallocation when the scores fit its capacity.
  std::vector<rkv::RouterScore> out;
  out.reserve(16);
  const rkv::RouterScore *before = out.data();
  r.find(q, out);
  CHECK(out.size() == 2 && out.data() == before && out.capacity() == 16);
  r.find(toks(7, 1), out);
  CHECK(out.empty() && out.data() == before);
  // Too small a capacity grows it.
  std::vector<rkv::RouterScore> tiny;
  tiny.reserve(1);
  r.find(q, tiny);
  CHECK(tiny.size() == 2);
  CHECK(r.find_hashes({1, 2, 3}).empty());

  // Namespaces are separate.
  rkv::RouterNamespace ns;
  ns.lora_name = "adapter";
  r.stored(rkv::make_worker(3), std::nullopt, {1}, toks(0, 1), rkv::Medium::gpu, ns);
  CHECK(r.find(toks(0, 1), ns).size() == 1 && r.find(toks(0, 1), ns)[0].worker.worker_id == 3);
  CHECK(sorted(r.find(toks(0, 1))).size() == 2);

  rkv::RouterStats st = r.stats();
  CHECK(st.workers == 3 && st.blocks == 4 && st.refused == 0 && st.bytes > 0);

  r.removed(a, {101});  // a hole stops worker 1 there
  s = sorted(r.find(q));
  CHECK(s.size() == 2 && is(s[0], 1, 1, 1) && is(s[1], 2, 1, 2));
  r.cleared(b);
  s = r.find(q);
  CHECK(s.size() == 1 && is(s[0], 1, 1, 1));
  CHECK(r.remove_worker(a) && r.remove_worker(b) && r.remove_worker(rkv::make_worker(3)));
  CHECK(!r.remove_worker(a));  // unknown now: false, not a throw
  CHECK(r.find(q).empty() && r.stats().workers == 0 && r.stats().memberships == 0);
}

void refusals() {
  rkv::RouterIndex r(opts());
  const rkv::Worker w = rkv::make_worker(1);
  rkv::RouterOptions bad = opts();
  bad.block_size = 0;
  CHECK_WHAT(rkv::RouterIndex(bad), RKV_INVALID_ARGUMENT, "opts->block_size = 0");
  bad = opts();
  bad.max_workers = 0;
  CHECK_WHAT(rkv::RouterIndex(bad), RKV_INVALID_ARGUMENT, "max_workers = 0");
  CHECK_WHAT(r.stored(w, std::nullopt, {1, 2}, toks(0, 1)), RKV_INVALID_ARGUMENT,
             "4 tokens for 2 blocks");
  CHECK_WHAT(r.stored(w, std::nullopt, {}, {}), RKV_INVALID_ARGUMENT, "no blocks");
  CHECK_WHAT(r.stored(w, 42, {1}, toks(0, 1)), RKV_INVALID_ARGUMENT, "parent 0x2a");
  rkv::RouterNamespace nul;
  nul.cache_salt = std::string("a\0b", 3);
  CHECK_WHAT(r.stored(w, std::nullopt, {1}, toks(0, 1), rkv::Medium::gpu, nul),
             RKV_INVALID_ARGUMENT, "cache_salt contains a NUL");
  rkv::RouterNamespace bad_utf8;
  bad_utf8.lora_name = std::string("\xff");
  CHECK_WHAT(r.find(toks(0, 1), bad_utf8), RKV_INVALID_ARGUMENT, "lora_name is not valid UTF-8");
  CHECK_WHAT(r.removed(rkv::make_worker(5), {1}), RKV_INVALID_ARGUMENT, "not held");
  rkv::Worker reserved = w;
  reserved.reserved = 1;
  CHECK_WHAT(r.cleared(reserved), RKV_INVALID_ARGUMENT, "w.reserved = 1");
  CHECK(!r.next_seq(w).has_value() && !r.next_seq(rkv::make_worker(9)).has_value());
  // A malformed batch: refused whole, counted.
  const std::vector<std::uint8_t> garbage = {0xc1, 0x00};
  CHECK_WHAT(r.apply_batch(1, 0, garbage), RKV_INVALID_ARGUMENT, "malformed KV-event batch");
  CHECK_THROWS(r.apply_batch(1, 0, nullptr, 3), RKV_NULL_ARGUMENT);
  // Counted: the empty store, the unknown parent, the unknown removal, the malformed batch.
  CHECK(r.stats().refused == 4 && r.stats().blocks == 0 && !r.next_seq(w));
  CHECK_WHAT(rkv::RouterIndex::restore(opts(), garbage), RKV_INVALID_ARGUMENT,
             "not a router dump");
  // A moved-from index refuses calls.
  rkv::RouterIndex moved = std::move(r);
  CHECK(!r && moved);
  CHECK_THROWS(r.stats(), RKV_NULL_ARGUMENT);
  CHECK_THROWS(r.stats_ex(), RKV_NULL_ARGUMENT);
  CHECK(moved.stats().refused == 4);
}

void batches_gaps_dump() {
  rkv::RouterIndex r(opts(rkv::GapPolicy::refuse));
  const rkv::Worker w = rkv::make_worker(9);
  const std::vector<std::uint32_t> bt = {1, 2, 3, 4, 5, 6, 7, 8};
  r.apply_batch(9, 0, kBatch);
  CHECK(r.next_seq(w) == std::optional<std::uint64_t>(1));
  auto s = r.find(bt);
  CHECK(s.size() == 1 && is(s[0], 9, 2, 2));
  r.cleared(w);
  CHECK_WHAT(r.apply_batch(9, 4, kBatch), RKV_SEQUENCE_GAP, "expected seq 1, got 4");
  CHECK(r.find(bt).empty() && r.next_seq(w) == std::optional<std::uint64_t>(1));
  for (std::uint64_t seq = 1; seq <= 4; ++seq) r.apply_batch(9, seq, kBatch);
  CHECK(r.find(bt).size() == 1 && r.next_seq(w) == std::optional<std::uint64_t>(5));
  // A sliding-window group's store: skipped, counted in stats_ex().other_groups.
  CHECK(r.stats_ex().other_groups == 0);
  r.apply_batch(9, 5, kBatchSw);
  rkv::RouterStatsEx ex = r.stats_ex();
  CHECK(ex.size == sizeof(rkv::RouterStatsEx) && ex.other_groups == 1 &&
        ex.events == r.stats().events && ex.blocks == r.stats().blocks);
  CHECK(r.find(bt).size() == 1 && r.next_seq(w) == std::optional<std::uint64_t>(6));

  // Dump -> restore: equal finds, cursors and counts.
  r.stored(rkv::make_worker(2), std::nullopt, {50, 51}, toks(0, 2));
  std::vector<std::uint8_t> bytes = r.dump();
  rkv::RouterIndex back = rkv::RouterIndex::restore(r.options(), bytes);
  CHECK(same(sorted(back.find(bt)), sorted(r.find(bt))));
  CHECK(same(sorted(back.find(toks(0, 3))), sorted(r.find(toks(0, 3)))));
  CHECK(back.next_seq(w) == std::optional<std::uint64_t>(6));
  CHECK(back.stats().blocks == r.stats().blocks && back.stats().workers == 2);
  CHECK(back.dump() == bytes);
  rkv::RouterOptions other = r.options();
  other.block_size = 8;
  CHECK_WHAT(rkv::RouterIndex::restore(other, bytes), RKV_INVALID_ARGUMENT,
             "opts->block_size = 8");

  // Under GapPolicy::clear a gap clears the worker and applies.
  rkv::RouterIndex c(opts(rkv::GapPolicy::clear));
  c.apply_batch(9, 0, kBatch);
  c.apply_batch(9, 7, kBatch);
  CHECK(c.find(bt).size() == 1 && c.stats().gaps == 1 && c.next_seq(w) == std::optional<std::uint64_t>(8));
}

void threads() {
  const rkv::RouterIndex r(opts());
  const auto q = toks(0, 4);
  std::vector<std::thread> ts;
  for (std::uint64_t id = 1; id <= 4; ++id) {
    ts.emplace_back([&r, id] {
      for (std::uint64_t round = 0; round < 50; ++round) {
        r.stored(rkv::make_worker(id), std::nullopt, {1, 2, 3, 4}, toks(0, 4));
        r.removed(rkv::make_worker(id), {3, 4});
      }
    });
  }
  long bad = 0;
  ts.emplace_back([&r, &q, &bad] {
    std::vector<rkv::RouterScore> out;
    for (int i = 0; i < 200; ++i) {
      r.find(q, out);
      for (const auto &s : out)
        if (s.any_blocks < 1 || s.any_blocks > 4 || s.device_blocks > s.any_blocks) ++bad;
    }
  });
  for (auto &t : ts) t.join();
  CHECK(bad == 0);
  auto s = sorted(r.find(q));
  CHECK(s.size() == 4);
  for (const auto &x : s) CHECK(x.device_blocks == 2 && x.any_blocks == 2);
}

}  // namespace

void router_tests() {
  typed_events_and_finds();
  refusals();
  batches_gaps_dump();
  threads();
}
