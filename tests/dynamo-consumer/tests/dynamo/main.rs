//! Dynamo's decoder and indexer against radixkv's KV events, one binary: the page hashes
//! (`hash`), the wire encodings byte for byte and through both decoders (`wire`), and a real
//! cache's stream read over loopback ZMQ by Dynamo's indexer (`consumer`).

mod consumer;
mod hash;
mod wire;
