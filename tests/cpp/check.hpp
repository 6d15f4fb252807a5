// A tiny check harness shared by the C++ test translation units.
#ifndef RKV_TEST_CHECK_HPP
#define RKV_TEST_CHECK_HPP
#include <atomic>
#include <cstdio>
#include <cstring>

namespace rkv_test {
inline std::atomic<int> &passed() {
  static std::atomic<int> n{0};
  return n;
}
inline std::atomic<int> &failed() {
  static std::atomic<int> n{0};
  return n;
}
}  // namespace rkv_test

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (cond) {                                                                      \
      ++rkv_test::passed();                                                          \
    } else {                                                                         \
      ++rkv_test::failed();                                                          \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
    }                                                                                \
  } while (0)

// Checks that `expr` throws rkv::Error with status `want`.
#define CHECK_THROWS(expr, want)                                                     \
  do {                                                                               \
    bool threw_ = false;                                                             \
    try {                                                                            \
      (void)(expr);                                                                  \
    } catch (const rkv::Error &e_) {                                                 \
      threw_ = e_.status() == (want);                                                \
      if (!threw_) std::fprintf(stderr, "  got %s\n", e_.what());                    \
    }                                                                                \
    CHECK(threw_ && #expr " throws " #want);                                         \
  } while (0)

// Checks that `expr` throws rkv::Error with status `want` and a what() containing `needle`
// (the library's detailed message).
#define CHECK_WHAT(expr, want, needle)                                               \
  do {                                                                               \
    bool threw_ = false;                                                             \
    try {                                                                            \
      (void)(expr);                                                                  \
    } catch (const rkv::Error &e_) {                                                 \
      threw_ = e_.status() == (want) && std::strstr(e_.what(), (needle)) != nullptr; \
      if (!threw_) std::fprintf(stderr, "  got %d: %s\n", e_.status(), e_.what());  \
    }                                                                                \
    CHECK(threw_ && #expr " throws " #want " saying " needle);                       \
  } while (0)

void api_tests();       // test_api.cpp
void lifetime_tests();  // test_lifetime.cpp
void events_tests();    // test_events.cpp
void tier_tests();      // test_tier.cpp
void router_tests();    // test_router.cpp
void request_tests();   // test_request.cpp
void hybrid_tests();    // test_hybrid.cpp

#endif
