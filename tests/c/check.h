/* The C tests' shared checks: counters, CHECK(cond), CHECK_ST(call, want) (a status, with the
 * call's last error message when it is not the one wanted) and CHECK_LAST_ERROR(needle) (the
 * last error message contains `needle`). Each test prints "N passed, M failed" and exits
 * non-zero when M > 0. Include after "radixkv.h". */
#ifndef RADIXKV_TESTS_CHECK_H
#define RADIXKV_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int passed, failed;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (cond) {                                                                          \
      passed++;                                                                          \
    } else {                                                                             \
      failed++;                                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);           \
    }                                                                                    \
  } while (0)

#define CHECK_ST(call, want)                                                             \
  do {                                                                                   \
    rkv_status st_ = (call);                                                             \
    if (st_ == (want)) {                                                                 \
      passed++;                                                                          \
    } else {                                                                             \
      failed++;                                                                          \
      fprintf(stderr, "%s:%d: %s\n  returned %d (%s), want %s; %s\n", __FILE__, __LINE__, \
              #call, (int)st_, rkv_status_str(st_), #want, rkv_last_error_message());    \
    }                                                                                    \
  } while (0)

#define CHECK_LAST_ERROR(needle) CHECK(strstr(rkv_last_error_message(), (needle)) != NULL)

#endif
