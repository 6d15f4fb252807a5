//! The checked-in C header `include/radixkv.h` must equal a fresh cbindgen generation from
//! `crates/ffi/src/` with `crates/ffi/cbindgen.toml`. Regenerate it with:
//!
//! ```sh
//! RADIXKV_BLESS=1 cargo test -p radixkv-ffi --test header
//! ```

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("read cbindgen.toml");
    // Parse only the FFI module (and its submodules): the header is the C ABI, nothing else,
    // and this needs no `cargo metadata`.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/lib.rs"))
        .generate()
        .expect("cbindgen failed to generate the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).expect("header is UTF-8");

    // The names engines are written against (C_ABI.md) come out exactly (compared with
    // runs of whitespace collapsed: cbindgen breaks long declarations over lines).
    let flat = fresh.split_whitespace().collect::<Vec<_>>().join(" ");
    for name in [
        "typedef struct rkv_cache rkv_cache;",
        "typedef uint64_t rkv_lock;",
        "typedef enum rkv_status {",
        "} rkv_status;",
        "RKV_OK = 0,",
        "RKV_INTERNAL_ERROR = 9,",
        "typedef enum rkv_eviction_policy {",
        "RKV_EVICT_LRU = 0,",
        "typedef struct rkv_options {",
        "typedef struct rkv_stats {",
        "typedef void (*rkv_free_fn)(void *ctx, const uint32_t *slots, size_t n_slots);",
        "const char *rkv_status_str(rkv_status status);",
        "const char *rkv_last_error_message(void);",
        // The KV-event additions (version 1 kept).
        "RKV_IO_ERROR = 10,",
        "#define RKV_EVENTS_NO_SEQ",
        "typedef struct rkv_publisher rkv_publisher;",
        "typedef struct rkv_event {",
        "typedef struct rkv_events_options {",
        "typedef struct rkv_publisher_options {",
        // The eviction policies and per-insert options (version 1 kept).
        "RKV_EVICT_FIFO = 1,",
        "RKV_EVICT_LFU = 2,",
        "RKV_EVICT_MRU = 3,",
        "RKV_EVICT_FILO = 4,",
        "RKV_EVICT_PRIORITY = 5,",
        "RKV_EVICT_SLRU = 6,",
        "#define RKV_DEFAULT_SLRU_THRESHOLD 2",
        "typedef struct rkv_policy_options {",
        "uint32_t slru_threshold;",
        "typedef struct rkv_insert_options {",
        // The match with options and a result, the host tier on a plain cache (version 1).
        "#define RKV_MATCH_LOCK 1",
        "typedef struct rkv_match_options {",
        "typedef struct rkv_match_result {",
        "struct rkv_match_options rkv_match_options_default(void);",
        "enum rkv_status rkv_match_ex(const struct rkv_cache *cache,",
        "enum rkv_status rkv_cache_load_back(const struct rkv_cache *cache,",
        "enum rkv_status rkv_cache_load_poll(const struct rkv_cache *cache,",
        "enum rkv_status rkv_cache_load_wait(const struct rkv_cache *cache,",
        "enum rkv_status rkv_cache_evict_host(const struct rkv_cache *cache,",
        "int64_t priority;",
        "uint64_t inserted_len;",
        "struct rkv_policy_options rkv_policy_options_default(void);",
        "struct rkv_insert_options rkv_insert_options_default(void);",
        "const char *rkv_eviction_policy_name(uint32_t policy);",
        "enum rkv_status rkv_eviction_policy_from_name(const char *name, uint32_t *out_policy);",
        "enum rkv_status rkv_cache_new_with(const struct rkv_options *opts, const struct \
         rkv_policy_options *policy, struct rkv_cache **out_cache);",
        "enum rkv_status rkv_cache_eviction_policy(const struct rkv_cache *cache, uint32_t \
         *out_policy, uint32_t *out_slru_threshold);",
        "enum rkv_status rkv_insert_ex(const struct rkv_cache *cache, uint64_t ns, const \
         uint32_t *tokens, const uint32_t *slots, size_t n_tokens, const struct \
         rkv_insert_options *opts, size_t *out_existing);",
        "enum rkv_status rkv_insert_lock_ex(const struct rkv_cache *cache, uint64_t ns, const \
         uint32_t *tokens, const uint32_t *slots, size_t n_tokens, const struct \
         rkv_insert_options *opts, size_t *out_existing, rkv_lock *out_lock);",
        "enum rkv_status rkv_insert_runs_ex(const struct rkv_cache *cache, uint64_t ns, const \
         uint32_t *tokens, size_t n_tokens, const struct rkv_slot_run *runs, size_t n_runs, \
         const struct rkv_insert_options *opts, size_t *out_existing);",
        "enum rkv_status rkv_insert_lock_runs_ex(const struct rkv_cache *cache, uint64_t ns, \
         const uint32_t *tokens, size_t n_tokens, const struct rkv_slot_run *runs, size_t \
         n_runs, const struct rkv_insert_options *opts, size_t *out_existing, rkv_lock \
         *out_lock);",
        // The router index (ROUTER.md, "Interfaces"; version 1 kept).
        "RKV_SEQUENCE_GAP = 11,",
        "RKV_NOT_FOUND = 12,",
        "typedef struct rkv_router rkv_router;",
        "RKV_GAP_CLEAR = 0,",
        "RKV_GAP_REFUSE = 1,",
        "typedef struct rkv_router_options {",
        "typedef struct rkv_worker {",
        "typedef struct rkv_router_score {",
        "typedef struct rkv_router_stats {",
        "struct rkv_worker worker;",
        "uint64_t restarts;",
        "uint64_t refused;",
        "struct rkv_router_options rkv_router_options_default(void);",
        "enum rkv_status rkv_router_new(const struct rkv_router_options *opts, struct \
         rkv_router **out);",
        "void rkv_router_free(struct rkv_router *r);",
        "enum rkv_status rkv_router_apply_batch(const struct rkv_router *r, uint64_t \
         worker_id, uint64_t seq, const uint8_t *payload, size_t len);",
        "enum rkv_status rkv_router_stored(const struct rkv_router *r, struct rkv_worker w, \
         const char *lora_name, const char *cache_salt, const uint64_t *parent, const \
         uint64_t *block_hashes, size_t n, const uint32_t *token_ids, uint32_t medium);",
        "enum rkv_status rkv_router_removed(const struct rkv_router *r, struct rkv_worker w, \
         const uint64_t *block_hashes, size_t n, uint32_t medium);",
        "enum rkv_status rkv_router_cleared(const struct rkv_router *r, struct rkv_worker w);",
        "enum rkv_status rkv_router_remove_worker(const struct rkv_router *r, struct \
         rkv_worker w);",
        "enum rkv_status rkv_router_find(const struct rkv_router *r, const uint32_t *tokens, \
         size_t n_tokens, const char *lora_name, const char *cache_salt, struct \
         rkv_router_score *out, size_t cap, size_t *out_len);",
        "enum rkv_status rkv_router_find_hashes(const struct rkv_router *r, const uint64_t \
         *content_hashes, size_t n, struct rkv_router_score *out, size_t cap, size_t \
         *out_len);",
        "enum rkv_status rkv_router_stats_get(const struct rkv_router *r, struct \
         rkv_router_stats *out);",
        // The size-versioned stats (version 1 kept): other_groups.
        "typedef struct rkv_router_stats_ex {",
        "uint64_t other_groups; } rkv_router_stats_ex;",
        "enum rkv_status rkv_router_stats_get_ex(const struct rkv_router *r, struct \
         rkv_router_stats_ex *out);",
        "enum rkv_status rkv_router_next_seq(const struct rkv_router *r, struct rkv_worker w, \
         uint64_t *out_next);",
        "enum rkv_status rkv_router_dump(const struct rkv_router *r, uint8_t *out, size_t \
         cap, size_t *out_len);",
        "enum rkv_status rkv_router_restore(const struct rkv_router_options *opts, const \
         uint8_t *bytes, size_t len, struct rkv_router **out);",
        // The request cycle (version 1 kept).
        "typedef struct rkv_request rkv_request;",
        "typedef struct rkv_request_info {",
        "enum rkv_status rkv_request_admit(const struct rkv_cache *cache, uint64_t ns, const \
         uint32_t *tokens, size_t n_tokens, int64_t priority, struct rkv_request **out_req);",
        "enum rkv_status rkv_request_extend(struct rkv_request *req, const uint32_t *tokens, \
         size_t n_tokens);",
        "enum rkv_status rkv_request_checkpoint(struct rkv_request *req, size_t \
         *out_cached_len);",
        "enum rkv_status rkv_request_finish(struct rkv_request *req, size_t *out_cached_len);",
        "void rkv_request_abort(struct rkv_request *req);",
        "enum rkv_status rkv_request_slots(const struct rkv_request *req, uint32_t *out_slots, \
         size_t out_cap, size_t *out_len);",
        "enum rkv_status rkv_request_info_get(const struct rkv_request *req, struct \
         rkv_request_info *out_info);",
        // The hybrid tree (version 1 kept).
        "typedef struct rkv_hybrid rkv_hybrid;",
        "typedef uint64_t rkv_hybrid_node;",
        "typedef struct rkv_hybrid_options {",
        "typedef struct rkv_hybrid_match_result {",
        "typedef struct rkv_hybrid_receipt {",
        "typedef struct rkv_hybrid_sizes {",
        "typedef struct rkv_hybrid_action {",
        "typedef struct rkv_hybrid_insert_result {",
        "typedef enum rkv_hybrid_component {",
        "RKV_HYBRID_FULL = 0,",
        "RKV_HYBRID_SWA = 1,",
        "RKV_HYBRID_MAMBA = 2,",
        "typedef enum rkv_hybrid_action_kind {",
        "RKV_HYBRID_RECOVER_SWA_WITH_LOCKED_FULL = 3,",
        "typedef void (*rkv_hybrid_free_fn)(void *ctx, uint32_t component, const int64_t \
         *indices, size_t len);",
        "typedef void (*rkv_hybrid_action_fn)(void *ctx, const struct rkv_hybrid_action \
         *action);",
        "struct rkv_hybrid_options rkv_hybrid_options_default(void);",
        "enum rkv_status rkv_hybrid_new(const struct rkv_hybrid_options *opts, struct \
         rkv_hybrid **out_tree);",
        "void rkv_hybrid_free(struct rkv_hybrid *tree);",
        "enum rkv_status rkv_hybrid_root(const struct rkv_hybrid *tree, rkv_hybrid_node \
         *out_node);",
        "enum rkv_status rkv_hybrid_match(const struct rkv_hybrid *tree, uint32_t ns, \
         const int64_t *key, size_t len, struct rkv_hybrid_match_result *out);",
        "enum rkv_status rkv_hybrid_match_lock(const struct rkv_hybrid *tree, uint32_t \
         ns, const int64_t *key, size_t len, struct rkv_hybrid_match_result *out, struct \
         rkv_hybrid_receipt *out_lock);",
        "enum rkv_status rkv_hybrid_collect(const struct rkv_hybrid *tree, \
         rkv_hybrid_node from, rkv_hybrid_node until, int64_t *out, size_t cap, size_t \
         *out_len);",
        "enum rkv_status rkv_hybrid_lock(const struct rkv_hybrid *tree, rkv_hybrid_node \
         node, struct rkv_hybrid_receipt *out);",
        "enum rkv_status rkv_hybrid_unlock(const struct rkv_hybrid *tree, const struct \
         rkv_hybrid_receipt *receipt);",
        "enum rkv_status rkv_hybrid_sizes_get(const struct rkv_hybrid *tree, struct \
         rkv_hybrid_sizes *out);",
        "enum rkv_status rkv_hybrid_check(const struct rkv_hybrid *tree);",
        "enum rkv_status rkv_hybrid_reset(const struct rkv_hybrid *tree, \
         rkv_hybrid_free_fn on_free, void *ctx);",
        "enum rkv_status rkv_hybrid_insert(const struct rkv_hybrid *tree, uint32_t ns, \
         const int64_t *key, size_t key_len, const int64_t *values, size_t values_len, \
         size_t prev_prefix_len, size_t swa_evicted_len, const int64_t *mamba_state, \
         size_t mamba_len, rkv_hybrid_action_fn on_action, void *ctx, struct \
         rkv_hybrid_insert_result *out, struct rkv_hybrid_receipt *out_lock);",
        "enum rkv_status rkv_hybrid_swa_set_value(const struct rkv_hybrid *tree, \
         rkv_hybrid_node node, const int64_t *values, size_t len);",
        "enum rkv_status rkv_hybrid_swa_refresh(const struct rkv_hybrid *tree, \
         rkv_hybrid_node node);",
        "enum rkv_status rkv_hybrid_release_window(const struct rkv_hybrid *tree, const \
         struct rkv_hybrid_receipt *receipt, rkv_hybrid_free_fn on_free, void *ctx);",
        "enum rkv_status rkv_hybrid_evict(const struct rkv_hybrid *tree, uint32_t \
         component, uint64_t request, rkv_hybrid_free_fn on_free, void *ctx, uint64_t \
         *out_evicted);",
        "enum rkv_status rkv_hybrid_mamba_evict_excess(const struct rkv_hybrid *tree, \
         rkv_hybrid_node node, size_t cap, rkv_hybrid_free_fn on_free, void *ctx, size_t \
         *out_freed);",
    ] {
        assert!(flat.contains(name), "the header lacks `{name}`");
    }

    let path = root.join("../../include/radixkv.h");
    if std::env::var_os("RADIXKV_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &fresh).expect("write include/radixkv.h");
        eprintln!("wrote {}", path.display());
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != fresh {
        let diff = first_difference(&checked_in, &fresh);
        panic!(
            "include/radixkv.h is out of date with crates/ffi/src/ ({diff}).\n\
             Regenerate it with:  RADIXKV_BLESS=1 cargo test --test header\n\
             then review `git diff include/radixkv.h` and commit it."
        );
    }
}

/// "line N: checked-in `...` vs generated `...`" for the first line that differs.
fn first_difference(old: &str, new: &str) -> String {
    let (mut o, mut n) = (old.lines(), new.lines());
    for line in 1.. {
        match (o.next(), n.next()) {
            (None, None) => return "they differ only in line endings".into(),
            (a, b) if a == b => continue,
            (a, b) => {
                return format!(
                    "first difference at line {line}: checked-in {:?} vs generated {:?}",
                    a.unwrap_or("<end of file>"),
                    b.unwrap_or("<end of file>")
                );
            }
        }
    }
    unreachable!()
}
