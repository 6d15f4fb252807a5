//! An insert's device pages, read off its slots without listing them: with a host tier
//! each page's slots must be the consecutive slots of one pool page, so a page is its
//! first slot, and slots that come as runs ([`Slots::Runs`], as the pool hands them out)
//! give their pages in O(pages + runs) instead of one pass per token.

use crate::slot_run::Slots;

/// The first slot of each of the first `n / p` pages of `slots` (`n` a multiple of `p`,
/// at most the slot count) into `out`; `Err(i)` when page `i`'s slots are not the `p`
/// consecutive slots of one pool page (its first slot a multiple of `p`).
pub(super) fn page_bases(
    slots: Slots<'_>,
    n: usize,
    p: usize,
    out: &mut Vec<u32>,
) -> Result<(), usize> {
    out.clear();
    out.reserve(n / p);
    match slots {
        Slots::List(s) => {
            for (i, page) in s[..n].chunks_exact(p).enumerate() {
                let b = page[0];
                if !(b as usize).is_multiple_of(p)
                    || page.iter().enumerate().any(|(j, &x)| x != b.wrapping_add(j as u32))
                {
                    return Err(i);
                }
                out.push(b);
            }
        }
        Slots::Runs(runs) => {
            // The page being read: its first slot and how many of its slots were seen.
            let (mut base, mut seen) = (0u32, 0usize);
            let mut tok = 0;
            for r in runs {
                let (mut s, mut left) = (r.start, r.len as usize);
                while left > 0 && tok < n {
                    if seen == 0 {
                        base = s;
                        if !(s as usize).is_multiple_of(p) {
                            return Err(tok / p);
                        }
                    } else if s != base.wrapping_add(seen as u32) {
                        return Err(tok / p); // the run before ended inside this page
                    }
                    // Within a run the slots are consecutive: they go on from `s`.
                    let take = left.min(p - seen).min(n - tok);
                    seen += take;
                    s = s.wrapping_add(take as u32);
                    left -= take;
                    tok += take;
                    if seen == p {
                        out.push(base);
                        seen = 0;
                    }
                }
                if tok >= n {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Page `i`'s slots, listed (for an error message).
pub(super) fn page_slots(slots: Slots<'_>, i: usize, p: usize) -> Vec<u32> {
    let range = i * p..(i + 1) * p;
    match slots {
        Slots::List(s) => s[range].to_vec(),
        Slots::Runs(r) => r.iter().flat_map(|r| r.slots()).skip(range.start).take(p).collect(),
    }
}

/// How many slots `slots` holds.
pub(super) fn slot_count(slots: Slots<'_>) -> usize {
    match slots {
        Slots::List(s) => s.len(),
        Slots::Runs(r) => r.iter().map(|r| r.len as usize).sum(),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::slot_run::SlotRun;

    fn run(start: u32, len: u32) -> SlotRun {
        SlotRun { start, len }
    }

    /// Runs and lists give the same pages, also when runs are cut inside a page (the cut
    /// slots go on) and when a run ends past `n`; a page that is not one pool page is
    /// named.
    #[test]
    fn runs_and_lists_agree() {
        let p = 4;
        let cases: Vec<Vec<SlotRun>> = vec![
            vec![run(8, 8), run(40, 4)],
            vec![run(8, 2), run(10, 6), run(0, 4)],
            vec![run(12, 4), run(4, 9)],
            vec![run(8, 3), run(12, 5)],
            vec![run(9, 4)],
        ];
        for runs in cases {
            let list: Vec<u32> = runs.iter().flat_map(|r| r.slots()).collect();
            let n = list.len() / p * p;
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let ra = page_bases(Slots::Runs(&runs), n, p, &mut a);
            let rb = page_bases(Slots::List(&list), n, p, &mut b);
            assert_eq!(ra, rb, "{runs:?}");
            if ra.is_ok() {
                assert_eq!(a, b, "{runs:?}");
            }
            if let Err(i) = ra {
                assert_eq!(page_slots(Slots::Runs(&runs), i, p), list[i * p..(i + 1) * p]);
            }
            assert_eq!(slot_count(Slots::Runs(&runs)), list.len());
        }
        let mut out = Vec::new();
        assert_eq!(page_bases(Slots::Runs(&[run(8, 3), run(12, 5)]), 8, 4, &mut out), Err(0));
        assert_eq!(page_bases(Slots::Runs(&[run(8, 2), run(10, 6)]), 8, 4, &mut out), Ok(()));
        assert_eq!(out, [8, 12]);
    }
}
