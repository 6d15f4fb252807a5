#!/usr/bin/env python3
"""Fits the time of each timed evict call to the tokens it freed.

Input: the stderr of a workload-4a child run with RADIXKV_COMPARE_EVICT_CALLS=1, e.g.

    RADIXKV_COMPARE_EVICT_CALLS=1 target/release/radixkv-compare --runs 3 \
        --measure w4a cache 2> calls.txt > /dev/null
    python3 benches/compare/scripts/evict_calls.py calls.txt

Prints the least-squares line time = a + b * freed, the p99 call time, and the p99 the same
calls would have if each freed only what it asked for (its time moved along the line by
b * (freed - asked)): what evicting exactly the shortfall (tail-page eviction) could gain.
"""
import sys


def percentile(xs, q):
    """Nearest-rank percentile, as the harness computes its own."""
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(q / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


def main(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("evict-call "):
                asked, freed, secs = map(float, line.split()[1:4])
                rows.append((asked, freed, secs * 1e6))
    if len(rows) < 2:
        sys.exit(f"{path}: fewer than two evict-call lines")
    n = len(rows)
    mf = sum(r[1] for r in rows) / n
    mt = sum(r[2] for r in rows) / n
    b = sum((r[1] - mf) * (r[2] - mt) for r in rows) / sum((r[1] - mf) ** 2 for r in rows)
    a = mt - b * mf
    times = [r[2] for r in rows]
    moved = [t - b * (f - k) for (k, f, t) in rows]
    print(f"calls {n}")
    print(f"time = {a:.2f} us + {b * 1000:.3f} us per 1000 tokens freed")
    print(f"p99 {percentile(times, 99):.2f} us; calls over 10 us: {sum(t > 10 for t in times)}")
    print(f"p99 if each call freed only what it asked: {percentile(moved, 99):.2f} us")
    print(f"p99 tokens asked {percentile([r[0] for r in rows], 99):.0f}, "
          f"freed {percentile([r[1] for r in rows], 99):.0f}")
    print("slowest calls (us, asked, freed):")
    for k, f, t in sorted(rows, key=lambda r: -r[2])[:8]:
        print(f"  {t:7.2f} {k:8.0f} {f:8.0f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/dev/stdin")
