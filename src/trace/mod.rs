//! Request traces: the Mooncake and token formats, and the built-in synthetic workload.
