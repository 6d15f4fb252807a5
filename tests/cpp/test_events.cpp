// The KV-event members of the C++ wrapper: enable_events, set_namespace_meta,
// flush_events, drain_events (typed rkv::Events), events_stats, and publish() returning an
// RAII rkv::Publisher; a fourth translation unit including radixkv.hpp.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "check.hpp"
#include "radixkv.hpp"

namespace {

// The spec's vectors (KV_EVENTS.md): tokens 1..16 as one page, seed 1337, and the sequence
// hash of the next page 17..32.
constexpr std::uint64_t kPage1 = 16863443419780771464ull;
constexpr std::uint64_t kPage2 = 12466389667045779788ull;

std::vector<std::uint32_t> range(std::uint32_t from, std::uint32_t to) {
  std::vector<std::uint32_t> v;
  for (std::uint32_t t = from; t <= to; ++t) v.push_back(t);
  return v;
}

void insert(const rkv::Cache &c, std::uint64_t ns, const std::vector<std::uint32_t> &toks) {
  c.insert(ns, toks, c.alloc(toks.size()));
}

rkv::PublisherOptions quick() {
  rkv::PublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.linger = std::chrono::milliseconds(0);
  o.auto_flush = std::chrono::milliseconds(0);  // only flush_events closes batches
  return o;
}

void enabling_and_draining() {
  rkv::Cache plain(rkv::Options{16, rkv::Policy::lru, 256});
  CHECK_WHAT(plain.flush_events(), RKV_INVALID_ARGUMENT, "events are not enabled");
  CHECK_WHAT(plain.drain_events(), RKV_INVALID_ARGUMENT, "events are not enabled");
  CHECK_WHAT(plain.events_stats(), RKV_INVALID_ARGUMENT, "events are not enabled");
  CHECK_WHAT(plain.publish(quick()), RKV_INVALID_ARGUMENT, "events are not enabled");
  insert(plain, 0, range(1, 16));
  CHECK_WHAT(plain.enable_events(), RKV_INVALID_ARGUMENT, "the cache is not empty");

  rkv::Cache c(rkv::Options{16, rkv::Policy::lru, 1024});
  rkv::EventOptions bad;
  bad.hash_mode = static_cast<rkv::HashMode>(7);
  CHECK_WHAT(c.enable_events(bad), RKV_INVALID_ARGUMENT, "opts->hash_mode = 7");
  c.enable_events();
  CHECK_WHAT(c.enable_events(), RKV_INVALID_ARGUMENT, "enabled on this cache already");
  CHECK(!c.flush_events().has_value());
  CHECK(c.drain_events().empty());

  c.set_namespace_meta(1, std::string("adapter-a"), std::string("tenant"));
  c.set_namespace_meta(2, std::nullopt, std::string("salt-2"));
  CHECK_WHAT(c.set_namespace_meta(3, std::string("")), RKV_INVALID_ARGUMENT, "may not be empty");
  insert(c, 0, range(1, 16));
  CHECK(c.flush_events() == std::optional<std::uint64_t>(0));
  insert(c, 0, range(1, 32));
  insert(c, 1, range(1, 16));
  insert(c, 2, range(1, 16));
  CHECK_WHAT(c.set_namespace_meta(1, std::nullopt), RKV_INVALID_ARGUMENT, "already has hashed pages");
  CHECK(c.flush_events() == std::optional<std::uint64_t>(1));
  std::vector<rkv::Event> ev = c.drain_events();
  CHECK(ev.size() == 4);
  if (ev.size() == 4) {
    CHECK(ev[0].seq == 0 && ev[0].kind == rkv::EventKind::block_stored);
    CHECK(ev[0].block_hashes == std::vector<std::uint64_t>{kPage1});
    CHECK(!ev[0].parent_block_hash && ev[0].token_ids == range(1, 16) && ev[0].block_size == 16);
    CHECK(!ev[0].lora_name && !ev[0].cache_salt && ev[0].medium == rkv::Medium::gpu);
    CHECK(ev[0].ts > 1.6e9);
    CHECK(ev[1].seq == 1 && ev[1].block_hashes == std::vector<std::uint64_t>{kPage2});
    CHECK(ev[1].parent_block_hash == std::optional<std::uint64_t>(kPage1));
    CHECK(ev[1].token_ids == range(17, 32));
    CHECK(ev[2].lora_name == std::optional<std::string>("adapter-a"));
    CHECK(ev[2].cache_salt == std::optional<std::string>("tenant"));
    CHECK(!ev[3].lora_name && ev[3].cache_salt == std::optional<std::string>("salt-2"));
    CHECK(ev[2].block_hashes[0] != kPage1 && ev[3].block_hashes[0] != kPage1);
    CHECK(ev[2].block_hashes[0] != ev[3].block_hashes[0]);
  }
  CHECK(c.drain_events().empty());

  // Evict everything: one removal of the base namespace's two pages and the others'.
  CHECK(c.evict(SIZE_MAX) == 64);
  CHECK(c.flush_events() == std::optional<std::uint64_t>(2));
  ev = c.drain_events();
  std::vector<std::uint64_t> removed;
  for (const rkv::Event &e : ev) {
    CHECK(e.kind == rkv::EventKind::block_removed && e.seq == 2 && e.token_ids.empty());
    removed.insert(removed.end(), e.block_hashes.begin(), e.block_hashes.end());
  }
  CHECK(removed.size() == 4);
  CHECK(std::count(removed.begin(), removed.end(), kPage1) == 1);
  CHECK(std::count(removed.begin(), removed.end(), kPage2) == 1);
  rkv::EventStats s = c.events_stats();
  CHECK(s.batches == 3 && s.dropped == 0);

  // Many batches, drained in one call of the wrapper (sized by the library's answer).
  for (std::uint32_t i = 0; i < 40; ++i) {
    insert(c, 100 + i, range(1, 16));
    CHECK(c.flush_events().has_value());
  }
  ev = c.drain_events();
  CHECK(ev.size() == 40);
  CHECK(!ev.empty() && ev.front().seq == 3 && ev.back().seq == 42);
  CHECK(!ev.empty() && ev.back().cache_salt == std::optional<std::string>("139"));
}

void publishing() {
  rkv::Cache c(rkv::Options{16, rkv::Policy::lru, 256});
  c.enable_events(rkv::EventOptions{rkv::HashMode::sglang_sha256, rkv::Medium::cpu_pinned, 16});
  rkv::PublisherOptions o = quick();
  o.endpoint = "nonsense";
  CHECK_THROWS(c.publish(o), RKV_INVALID_ARGUMENT);
  o = quick();
  o.max_queue = 0;
  CHECK_WHAT(c.publish(o), RKV_INVALID_ARGUMENT, "opts->max_queue = 0");
  o = quick();
  o.encoding = static_cast<rkv::Encoding>(3);
  CHECK_WHAT(c.publish(o), RKV_INVALID_ARGUMENT, "opts->encoding = 3");
  {
    // An address in use: RKV_IO_ERROR. Take a port with a first publisher's replay socket.
    rkv::PublisherOptions first = quick();
    first.replay_endpoint = "tcp://127.0.0.1:*";
    rkv::Cache other(rkv::Options{16, rkv::Policy::lru, 0});
    other.enable_events();
    rkv::Publisher holder = other.publish(first);
    std::string taken = holder.replay_endpoint().value_or("");
    std::string port = taken.substr(taken.rfind(':') + 1);
    o = quick();
    o.endpoint = "tcp://*:" + port;
    CHECK_WHAT(c.publish(o), RKV_IO_ERROR, "in use");
    o = quick();
    o.replay_endpoint = taken;
    CHECK_WHAT(c.publish(o), RKV_IO_ERROR, "in use");
  }

  insert(c, 0, range(1, 16));
  rkv::Publisher p;
  CHECK(!p);
  CHECK_THROWS(p.stats(), RKV_NULL_ARGUMENT);
  o = quick();
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv@127.0.0.1:0@m";
  o.encoding = rkv::Encoding::vllm_map;
  p = c.publish(o);
  CHECK(p && p.endpoint().rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(p.endpoint().find('*') == std::string::npos);
  CHECK(p.replay_endpoint().has_value() && *p.replay_endpoint() != p.endpoint());
  CHECK_WHAT(c.publish(quick()), RKV_INVALID_ARGUMENT, "a publisher is attached");
  CHECK(c.flush_events() == std::optional<std::uint64_t>(0));
  CHECK(c.drain_events().empty());  // batches go to the publisher
  // Stats from another thread while this one stops it.
  std::thread reader([&p] {
    for (int i = 0; i < 100; ++i) (void)p.stats();
  });
  p.stop();
  reader.join();
  p.stop();  // a second stop does nothing
  rkv::PublisherStats ps = p.stats();
  CHECK(ps.published + ps.dropped == 1);
  rkv::Publisher moved = std::move(p);
  CHECK(!p && moved);  // NOLINT(bugprone-use-after-move)

  // Stopped: the cache drains again (SGLang hashes, the medium given).
  insert(c, 0, range(1, 32));
  std::vector<rkv::Event> ev = c.drain_events();
  CHECK(ev.empty());  // not flushed yet
  CHECK(c.flush_events() == std::optional<std::uint64_t>(1));
  ev = c.drain_events();
  CHECK(ev.size() == 1 && ev[0].medium == rkv::Medium::cpu_pinned && ev[0].parent_block_hash);
  CHECK(ev.size() == 1 && ev[0].block_hashes.size() == 1 && ev[0].block_hashes[0] != kPage2);
}

void publisher_outlives_its_cache() {
  rkv::Publisher p;
  {
    rkv::Cache c(rkv::Options{16, rkv::Policy::lru, 256});
    c.enable_events();
    insert(c, 0, range(1, 16));
    c.flush_events();
    p = c.publish(quick());
  }  // the cache is freed first
  p.stop();
  CHECK(p.stats().published + p.stats().dropped == 1);
}  // and the publisher after

void auto_flush_closes_batches() {
  rkv::Cache c(rkv::Options{16, rkv::Policy::lru, 256});
  c.enable_events();
  rkv::PublisherOptions o = quick();
  o.auto_flush = std::chrono::milliseconds(5);
  rkv::Publisher p = c.publish(o);
  insert(c, 0, range(1, 16));  // never flushed by this thread
  for (int i = 0; i < 1000 && p.stats().published == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(p.stats().published == 1);
  CHECK(!c.flush_events().has_value());  // the publisher's thread closed it already
}

// Cache::clear (rkv_cache_clear): one all_blocks_cleared and an empty cache when nothing
// is pinned; the removals when a lock keeps a page; a moved-from Cache is refused.
void clearing() {
  rkv::Cache c(rkv::Options{16, rkv::Policy::lru, 256});
  c.enable_events();
  c.clear();  // empty: nothing to publish
  CHECK(!c.flush_events().has_value());
  insert(c, 0, range(1, 32));
  insert(c, 7, range(1, 16));
  c.flush_events();
  CHECK(c.drain_events().size() == 2);
  c.clear();
  CHECK(c.stats().cached_tokens == 0 && c.stats().nodes == 0 && c.stats().free_slots == 256);
  CHECK(c.match(0, range(1, 16)).empty());
  CHECK(c.flush_events().has_value());
  std::vector<rkv::Event> ev = c.drain_events();
  CHECK(ev.size() == 1 && ev[0].kind == rkv::EventKind::all_blocks_cleared);

  insert(c, 0, range(1, 32));
  c.flush_events();
  c.drain_events();
  {
    rkv::Lock l = c.match_lock(0, range(1, 16));
    CHECK(l.length() == 16);
    c.clear();
    CHECK(c.stats().cached_tokens == 16 && c.stats().protected_tokens == 16);
    c.flush_events();
    ev = c.drain_events();
    CHECK(ev.size() == 1 && ev[0].kind == rkv::EventKind::block_removed);
    CHECK(!ev.empty() && ev[0].block_hashes == std::vector<std::uint64_t>{kPage2});
  }
  c.clear();
  c.flush_events();
  ev = c.drain_events();
  CHECK(ev.size() == 1 && ev[0].kind == rkv::EventKind::all_blocks_cleared);

  // Caller-managed: clear(on_free) hands every slot back once; clear() drops them unreported.
  rkv::Cache plain;
  std::vector<std::uint32_t> toks = range(100, 107), slots = range(40, 47);
  plain.insert(0, toks, slots);
  std::vector<std::uint32_t> freed;
  plain.clear([&](const std::uint32_t *s, std::size_t n) { freed.insert(freed.end(), s, s + n); });
  std::sort(freed.begin(), freed.end());
  CHECK(freed == slots);
  CHECK(plain.stats().cached_tokens == 0);

  rkv::Cache moved(std::move(plain));
  CHECK_WHAT(plain.clear(), RKV_NULL_ARGUMENT, "rkv_cache_clear: cache is NULL");
  moved.insert(0, toks, slots);
  moved.clear();
  CHECK(moved.stats().cached_tokens == 0);
}

// The publisher's KV group (rkv_events_publish_ex): a bad one refused with nothing
// attached, good ones started.
void kv_groups() {
  rkv::Cache c(rkv::Options{16, rkv::Policy::lru, 256});
  c.enable_events();
  rkv::PublisherOptions o = quick();
  o.kv_cache_spec_kind = rkv::KvCacheSpecKind::sliding_window;
  CHECK_WHAT(c.publish(o), RKV_INVALID_ARGUMENT, "spec kind sliding_window needs its window");
  o.sliding_window = 0;
  CHECK_WHAT(c.publish(o), RKV_INVALID_ARGUMENT, "sliding_window = 0");
  o = quick();
  o.sliding_window = 128;
  CHECK_WHAT(c.publish(o), RKV_INVALID_ARGUMENT, "a sliding window (128) only goes with");
  o.kv_cache_spec_kind = static_cast<rkv::KvCacheSpecKind>(10);
  CHECK_WHAT(c.publish(o), RKV_INVALID_ARGUMENT, "group->spec_kind = 10");
  insert(c, 0, range(1, 16));
  CHECK(c.flush_events() == std::optional<std::uint64_t>(0));
  CHECK(c.drain_events().size() == 1);  // nothing was attached
  o = quick();
  o.group_idx = 3;
  o.kv_cache_spec_kind = rkv::KvCacheSpecKind::sliding_window_mla;
  o.sliding_window = 4096;
  {
    rkv::Publisher p = c.publish(o);
    CHECK(p);
    p.stop();
  }
  o.kv_cache_spec_kind = rkv::KvCacheSpecKind::mamba;
  o.sliding_window.reset();
  rkv::Publisher p = c.publish(o);
  CHECK(p);
}

}  // namespace

void events_tests() {
  kv_groups();
  enabling_and_draining();
  clearing();
  publishing();
  publisher_outlives_its_cache();
  auto_flush_closes_batches();
}
