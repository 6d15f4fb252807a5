//! `RKV_COPIER_CALLBACK`'s copier: the caller's four callbacks as a [`TierCopier`].

use super::*;

// ---------------------------------------------------------------------------------------
// The callback copier.

/// `RKV_COPIER_CALLBACK`'s copier: calls the caller's functions; a status other than
/// `RKV_OK` is `Error::Device`.
pub(super) struct CallbackCopier {
    pub(super) c: rkv_copier,
}

// SAFETY: `rkv_copier`'s contract (in the header) makes the callbacks and `user_data`
// usable from any thread, concurrently, for the tier's lifetime.
unsafe impl Send for CallbackCopier {}
// SAFETY: as above.
unsafe impl Sync for CallbackCopier {}

fn callback_status(what: &str, s: rkv_status_value) -> Result<()> {
    if s == rkv_status::RKV_OK as c_int {
        Ok(())
    } else {
        Err(Error::Device(format!("the copier's {what} callback returned status {s}")))
    }
}

fn same_len(a: &[u32], b: &[u32]) -> Result<()> {
    if a.len() != b.len() {
        return Err(radixkv_core::Error::InvalidArgument(format!(
            "copy: {} source slots but {} destinations",
            a.len(),
            b.len()
        )));
    }
    Ok(())
}

impl TierCopier for CallbackCopier {
    fn to_host(&self, dev: &[u32], host: &[u32]) -> Result<CopyTicket> {
        same_len(dev, host)?;
        let f = self.c.to_host.expect("checked by rkv_tier_new");
        let mut t = 0u64;
        // SAFETY: `f` is the caller's `to_host`, callable with its `user_data` by the
        // contract of `rkv_copier`; the arrays are live for `n` values during the call and
        // `t` is a writable u64.
        let s = unsafe { f(self.c.user_data, dev.as_ptr(), host.as_ptr(), dev.len(), &mut t) };
        callback_status("to_host", s).map(|()| t)
    }

    fn to_device(&self, host: &[u32], dev: &[u32]) -> Result<CopyTicket> {
        same_len(host, dev)?;
        let f = self.c.to_device.expect("checked by rkv_tier_new");
        let mut t = 0u64;
        // SAFETY: as in `to_host`.
        let s = unsafe { f(self.c.user_data, host.as_ptr(), dev.as_ptr(), host.len(), &mut t) };
        callback_status("to_device", s).map(|()| t)
    }

    fn poll(&self, t: CopyTicket) -> Result<bool> {
        let f = self.c.poll.expect("checked by rkv_tier_new");
        let mut done: c_int = 0;
        // SAFETY: the caller's `poll`, by `rkv_copier`'s contract; `done` is writable.
        let s = unsafe { f(self.c.user_data, t, &mut done) };
        callback_status("poll", s).map(|()| done != 0)
    }

    fn wait(&self, t: CopyTicket) -> Result<()> {
        let f = self.c.wait.expect("checked by rkv_tier_new");
        // SAFETY: the caller's `wait`, by `rkv_copier`'s contract.
        let s = unsafe { f(self.c.user_data, t) };
        callback_status("wait", s)
    }
}
