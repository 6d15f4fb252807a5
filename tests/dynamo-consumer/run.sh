#!/usr/bin/env bash
# The consumer proof: radixkv's KV events over a loopback ZMQ socket, decoded and indexed by
# Dynamo's own code (dynamo-kv-router 1.6.1). RADIXKV_CONSUMER_REQUESTS=N replays only the
# trace's first N requests (all 3,993 by default).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec cargo test --release -p radixkv-dynamo-consumer -- --nocapture "$@"
