// radixkv from C++17: two requests sharing a prompt prefix reuse its KV slots.
//
// Build against an installed radixkv (scripts/install --prefix DIR; see docs/install.md):
//   cmake -S examples/cpp -B build -DCMAKE_PREFIX_PATH=DIR && cmake --build build
//   c++ -std=c++17 main.cpp $(pkg-config --cflags --libs radixkv)
//       -Wl,-rpath,$(pkg-config --variable=libdir radixkv)       (one line)
//   c++ -std=c++17 main.cpp $(pkg-config --cflags --libs radixkv-static)
// Every failed call throws rkv::Error (it carries the rkv_status); exits 1 on any failure or
// unexpected result.
#include <radixkv.hpp>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void expect(bool cond, const char *what) {
  if (!cond) throw std::logic_error(std::string("unexpected: ") + what);
}

// Serve one request: pin the cached prefix, allocate slots for the rest, "prefill", insert
// the whole prompt. The lock unpins when it goes out of scope. Returns the cached length.
std::size_t serve(const rkv::Cache &cache, std::uint64_t ns,
                  const std::vector<std::uint32_t> &tokens) {
  rkv::Lock hit = cache.match_lock(ns, tokens);
  std::vector<std::uint32_t> slots = hit.slots();
  std::vector<std::uint32_t> fresh = cache.alloc(tokens.size() - hit.length());
  slots.insert(slots.end(), fresh.begin(), fresh.end());
  // ... run the model over the uncached suffix, writing KV into `fresh` ...
  std::size_t existing = cache.insert(ns, tokens, slots);
  expect(existing == hit.length(), "existing == hit.length()");
  return hit.length();
}

}  // namespace

int main() {
  try {
    std::printf("radixkv %s, ABI %u\n", rkv::version().c_str(), rkv::abi_version());
    expect(rkv::abi_version() == RKV_ABI_VERSION, "library ABI == header ABI");

    const std::uint64_t pool = 64;
    rkv::Cache cache(rkv::Options{/*page_size=*/1, rkv::Policy::lru, /*pool_slots=*/pool});
    const std::uint64_t ns = 0;  // e.g. one namespace per model or LoRA adapter
    const std::vector<std::uint32_t> first{101, 7, 42, 42, 9, 1000, 3, 5};
    const std::vector<std::uint32_t> second{101, 7, 42, 42, 9, 2000, 4, 6};  // 5 shared
    std::size_t hit1 = serve(cache, ns, first);
    std::size_t hit2 = serve(cache, ns, second);
    std::printf("request 1: %zu of %zu tokens cached\n", hit1, first.size());
    std::printf("request 2: %zu of %zu tokens cached\n", hit2, second.size());
    expect(hit1 == 0 && hit2 == 5, "hits 0 then 5");

    rkv::Stats st = cache.stats();
    std::printf("cached %llu tokens in %llu nodes, %llu of %llu slots free\n",
                static_cast<unsigned long long>(st.cached_tokens),
                static_cast<unsigned long long>(st.nodes),
                static_cast<unsigned long long>(st.free_slots),
                static_cast<unsigned long long>(st.pool_slots));
    expect(st.cached_tokens == 11 && st.free_slots == pool - 11 && st.protected_tokens == 0,
           "11 tokens cached, none pinned");

    // A pinned prefix survives eviction; the rest goes back to the pool.
    {
      rkv::Lock pinned = cache.match_lock(ns, second);
      std::size_t freed = 0;
      std::size_t evicted = cache.evict(SIZE_MAX, [&](const std::uint32_t *, std::size_t n) {
        freed += n;
      });
      std::printf("with request 2 pinned: evicted %zu tokens, %zu still cached\n", evicted,
                  cache.match_len(ns, second));
      expect(evicted == 3 && freed == 3 && cache.match_len(ns, second) == 8,
             "only request 1's own 3 tokens evicted");
    }  // unpinned here
    std::size_t evicted = cache.evict(SIZE_MAX);
    st = cache.stats();
    std::printf("evicted %zu more, %llu slots free\n", evicted,
                static_cast<unsigned long long>(st.free_slots));
    expect(evicted == 8 && st.cached_tokens == 0 && st.free_slots == pool, "all slots free");

    // Errors are exceptions carrying the status.
    try {
      cache.release(12345);
      expect(false, "releasing an unknown lock throws");
    } catch (const rkv::Error &e) {
      expect(e.status() == RKV_INVALID_LOCK, "RKV_INVALID_LOCK");
      std::printf("as expected: %s\n", e.what());
    }
    std::printf("ok\n");
    return 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
