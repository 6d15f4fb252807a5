//! KV-cache events: what cluster routers see of a cache (`KV_EVENTS.md`).
//!
//! So far: the page hashes ([`hash`]) the events name pages by.

pub mod hash;
