//! The tokens a locking call is given ([`Key`]), and what the lock it returns keeps of them.
//!
//! A lock keeps the tokens it pinned, so that its release can walk the path again (see the
//! module docs of [`crate::tree`]). Given a borrowed slice, it keeps its own copy; given a
//! share of an immutable buffer (`Arc<[u32]>`), it keeps the share and a length, and copies
//! nothing. The second is for callers that already hold the request's tokens in such a
//! buffer (the Python SGLang backend converts a request's key once and locks its prefix
//! twice per request): a lock then costs no allocation or copy of its key.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// The tokens of a locking call ([`crate::RadixTree::match_and_lock`],
/// [`crate::RadixTree::insert_and_lock`] and their [`crate::Cache`] doors): any slice
/// (`&[u32]`, `&Vec<u32>`, `&[u32; N]`), or a shared buffer (`&Arc<[u32]>`), which the
/// returned lock then references instead of copying. The call reads the same tokens
/// either way; only what the lock keeps differs.
#[derive(Clone, Copy, Debug)]
pub enum Key<'a> {
    /// Tokens the call reads; a lock it returns keeps a copy of what it pinned.
    Borrowed(&'a [u32]),
    /// The first `len` tokens of a shared, immutable buffer (`len` at most its length); a
    /// lock it returns keeps a reference to the buffer.
    Shared(&'a Arc<[u32]>, usize),
}

impl<'a> Key<'a> {
    /// The tokens.
    #[inline]
    pub fn tokens(self) -> &'a [u32] {
        match self {
            Key::Borrowed(t) => t,
            Key::Shared(a, n) => &a[..n],
        }
    }

    /// What a lock on the first `n` tokens keeps (`n <= self.tokens().len()`).
    #[inline]
    pub(crate) fn lock_tokens(self, n: usize) -> LockTokens {
        match self {
            Key::Borrowed(t) => LockTokens::Owned(t[..n].into()),
            Key::Shared(a, len) if n > 0 => {
                debug_assert!(n <= len && len <= a.len());
                LockTokens::Shared(Arc::clone(a), n)
            }
            Key::Shared(..) => LockTokens::Owned(Box::default()),
        }
    }
}

impl<'a> From<&'a [u32]> for Key<'a> {
    #[inline]
    fn from(t: &'a [u32]) -> Self {
        Key::Borrowed(t)
    }
}

impl<'a> From<&'a Vec<u32>> for Key<'a> {
    #[inline]
    fn from(t: &'a Vec<u32>) -> Self {
        Key::Borrowed(t)
    }
}

impl<'a, const N: usize> From<&'a [u32; N]> for Key<'a> {
    #[inline]
    fn from(t: &'a [u32; N]) -> Self {
        Key::Borrowed(t)
    }
}

impl<'a> From<&'a Arc<[u32]>> for Key<'a> {
    #[inline]
    fn from(a: &'a Arc<[u32]>) -> Self {
        Key::Shared(a, a.len())
    }
}

/// The tokens a [`crate::PrefixLock`] keeps: its own copy, or a share of the caller's
/// buffer and how many of its tokens the lock pinned. Immutable either way.
pub(crate) enum LockTokens {
    Owned(Box<[u32]>),
    Shared(Arc<[u32]>, usize),
}

impl Deref for LockTokens {
    type Target = [u32];
    #[inline]
    fn deref(&self) -> &[u32] {
        match self {
            LockTokens::Owned(b) => b,
            LockTokens::Shared(a, n) => &a[..*n],
        }
    }
}

impl fmt::Debug for LockTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_key_is_kept_by_reference_and_a_borrowed_one_copied() {
        let buf: Arc<[u32]> = vec![1, 2, 3, 4].into();
        let shared = Key::from(&buf).lock_tokens(3);
        assert!(matches!(shared, LockTokens::Shared(_, 3)));
        assert_eq!(&*shared, &[1, 2, 3]);
        assert_eq!(Arc::strong_count(&buf), 2);
        drop(shared);
        assert_eq!(Arc::strong_count(&buf), 1);
        let v = vec![5, 6, 7];
        let owned = Key::from(&v).lock_tokens(2);
        assert!(matches!(owned, LockTokens::Owned(_)));
        assert_eq!(&*owned, &[5, 6]);
        // An empty lock keeps nothing, not even a share.
        assert!(Key::from(&buf).lock_tokens(0).is_empty());
        assert_eq!(Arc::strong_count(&buf), 1);
        assert_eq!(Key::from(&[8u32, 9]).tokens(), &[8, 9]);
        assert_eq!(Key::Shared(&buf, 2).tokens(), &[1, 2]);
    }
}
