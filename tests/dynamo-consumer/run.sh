#!/usr/bin/env bash
# The consumer proof: radixkv's KV events over a loopback ZMQ socket, decoded and indexed by
# Dynamo's own code (dynamo-kv-router 1.6.1), fed by a real radixkv Cache replaying the
# Mooncake trace (1 and 2 threads, unlimited and a 2,000,000-token pool, both encodings).
# RADIXKV_CONSUMER_REQUESTS=N replays only the trace's first N requests (all 3,993 by default).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec cargo test --release -p radixkv-dynamo-consumer -- --nocapture "$@"
