//! The indexer service's tests, one binary: the service over loopback sockets (`service`),
//! 10,000 workers registered and unregistered (`many_workers`), a publisher written in
//! Python from vLLM's wire format (`python_publisher`), and the soak (`soak`: 100,000
//! batches from 8 publishers, about 3 s). `common` holds the shared pieces.

mod common;
mod many_workers;
mod python_publisher;
mod service;
mod soak;
