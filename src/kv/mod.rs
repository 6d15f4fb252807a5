//! KV storage: the memory the slots index (host and CUDA backends).
