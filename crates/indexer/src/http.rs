//! The HTTP API (see the crate docs).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::extract::{DefaultBodyLimit, State as AxState};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use radixkv_router::{Refusal, Score};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::metrics::{metric, refusal_label};
use crate::{Refused, Registration, State};

type St = AxState<Arc<State>>;

pub(crate) fn router(state: Arc<State>) -> Router {
    let limit = state.cfg.max_body;
    Router::new()
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/workers", get(workers))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/dump", get(dump))
        .route("/metrics", get(metrics))
        .route("/healthz", get(health))
        .route("/health", get(health))
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), deadline))
        .with_state(state)
}

/// Every request within `request_timeout`, its body's arrival included (the handlers read
/// their bodies inside `next`): past it, 408.
async fn deadline(AxState(state): St, req: Request, next: Next) -> Response {
    let limit = state.cfg.request_timeout;
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(r) => r,
        Err(_) => error(
            &state,
            408,
            format!(
                "the request took longer than {limit:?} (--request-timeout), its body included"
            ),
        ),
    }
}

fn json_response(status: u16, v: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

fn error(state: &State, status: u16, msg: impl Into<String>) -> Response {
    if (400..500).contains(&status) {
        state.metrics.client_errors.fetch_add(1, Ordering::Relaxed);
    }
    json_response(status, &json!({ "error": msg.into() }))
}

/// Parses a JSON body (400 with serde's message when it does not).
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("bad request body: {e}"))
}

fn default_tenant() -> String {
    "default".into()
}

#[derive(Deserialize)]
struct RegisterReq {
    instance_id: u64,
    endpoint: String,
    model_name: String,
    #[serde(default = "default_tenant")]
    tenant_id: String,
    block_size: u32,
    #[serde(default)]
    dp_rank: Option<u32>,
    #[serde(default)]
    lora_name: Option<String>,
    #[serde(default)]
    replay_endpoint: Option<String>,
}

async fn register(AxState(state): St, body: Bytes) -> Response {
    let req: RegisterReq = match parse(&body) {
        Ok(r) => r,
        Err(e) => return error(&state, 400, e),
    };
    let reg = Registration {
        instance_id: req.instance_id,
        endpoint: req.endpoint,
        model_name: req.model_name,
        tenant_id: req.tenant_id,
        block_size: req.block_size,
        dp_rank: req.dp_rank.unwrap_or(0),
        lora_name: req.lora_name,
        replay_endpoint: req.replay_endpoint,
    };
    match state.register(reg, None, None) {
        Ok(()) => json_response(201, &json!({"status": "ok"})),
        Err(Refused(code, msg)) => error(&state, code, msg),
    }
}

#[derive(Deserialize)]
struct UnregisterReq {
    instance_id: u64,
    model_name: String,
    #[serde(default)]
    tenant_id: Option<String>,
    #[serde(default)]
    dp_rank: Option<u32>,
}

async fn unregister(AxState(state): St, body: Bytes) -> Response {
    let req: UnregisterReq = match parse(&body) {
        Ok(r) => r,
        Err(e) => return error(&state, 400, e),
    };
    match state.unregister(req.instance_id, &req.model_name, req.tenant_id.as_deref(), req.dp_rank)
    {
        Ok(_) => json_response(200, &json!({"status": "ok"})),
        Err(Refused(code, msg)) => error(&state, code, msg),
    }
}

async fn workers(AxState(state): St) -> Response {
    // Dynamo's shape ({instance_id, endpoints: {dp_rank: endpoint}}), plus the models,
    // replay endpoints and cursors.
    let mut by_id: BTreeMap<u64, Value> = BTreeMap::new();
    for ((id, rank), s) in state.streams().iter() {
        let next = s.lock().next;
        let e = by_id.entry(*id).or_insert_with(|| {
            json!({"instance_id": id, "endpoints": {}, "replay_endpoints": {}, "next_seq": {},
                   "model_name": s.reg.model_name, "tenant_id": s.reg.tenant_id})
        });
        e["endpoints"][rank.to_string()] = json!(s.reg.endpoint);
        if let Some(r) = &s.reg.replay_endpoint {
            e["replay_endpoints"][rank.to_string()] = json!(r);
        }
        e["next_seq"][rank.to_string()] = json!(next);
    }
    json_response(200, &Value::Array(by_id.into_values().collect()))
}

#[derive(Deserialize)]
struct QueryReq {
    token_ids: Vec<u32>,
    model_name: String,
    #[serde(default = "default_tenant")]
    tenant_id: String,
    #[serde(default)]
    lora_name: Option<String>,
    /// The request's cache salt (tenant isolation inside one index): mixed into the block
    /// hashes as the engines' events mix it (`KV_EVENTS.md`), as Dynamo's `/query` does.
    #[serde(default)]
    cache_salt: Option<String>,
}

#[derive(Deserialize)]
struct QueryByHashReq {
    block_hashes: Vec<i64>,
    model_name: String,
    #[serde(default = "default_tenant")]
    tenant_id: String,
    /// Refused when given (400), as Dynamo refuses it: the hashes have their namespace
    /// mixed in already.
    #[serde(default)]
    cache_salt: Option<String>,
}

/// `{scores, frequencies, tree_sizes}` from the index's scores: matched tokens are the
/// leading blocks held on the device times the block size (Dynamo's tree holds device
/// blocks only); a worker with none is left out.
fn score_response(scores: &[Score], block_size: u32) -> Value {
    let mut by_worker: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut depth = 0;
    for s in scores.iter().filter(|s| s.device_blocks > 0) {
        by_worker.entry(s.worker.worker_id.to_string()).or_default().insert(
            s.worker.dp_rank.to_string(),
            u64::from(s.device_blocks) * u64::from(block_size),
        );
        depth = depth.max(s.device_blocks);
    }
    let frequencies: Vec<usize> =
        (0..depth).map(|i| scores.iter().filter(|s| s.device_blocks > i).count()).collect();
    json!({"scores": by_worker, "frequencies": frequencies, "tree_sizes": {}})
}

fn unknown_index(state: &State, model: &str, tenant: &str) -> Response {
    error(state, 404, format!("no indexer for model={model} tenant={tenant}"))
}

async fn query(AxState(state): St, body: Bytes) -> Response {
    let t0 = Instant::now();
    let req: QueryReq = match parse(&body) {
        Ok(r) => r,
        Err(e) => return error(&state, 400, e),
    };
    let Some(ix) = state.index(&req.model_name, &req.tenant_id) else {
        return unknown_index(&state, &req.model_name, &req.tenant_id);
    };
    let mut out = Vec::new();
    ix.index.find(&req.token_ids, req.lora_name.as_deref(), req.cache_salt.as_deref(), &mut out);
    let v = score_response(&out, ix.block_size);
    answered(&state, t0);
    json_response(200, &v)
}

async fn query_by_hash(AxState(state): St, body: Bytes) -> Response {
    let t0 = Instant::now();
    let req: QueryByHashReq = match parse(&body) {
        Ok(r) => r,
        Err(e) => return error(&state, 400, e),
    };
    let Some(ix) = state.index(&req.model_name, &req.tenant_id) else {
        return unknown_index(&state, &req.model_name, &req.tenant_id);
    };
    if req.cache_salt.is_some() {
        return error(
            &state,
            400,
            "cache_salt is not taken by /query_by_hash: the block hashes carry their namespace \
             already (use /query with cache_salt and token_ids)",
        );
    }
    let hashes: Vec<u64> = req.block_hashes.iter().map(|&h| h as u64).collect();
    let mut out = Vec::new();
    ix.index.find_hashes(&hashes, &mut out);
    let v = score_response(&out, ix.block_size);
    answered(&state, t0);
    json_response(200, &v)
}

fn answered(state: &State, t0: Instant) {
    state.metrics.queries.fetch_add(1, Ordering::Relaxed);
    state.metrics.query_latency.observe(t0.elapsed().as_micros() as u64);
}

async fn dump(AxState(state): St) -> Response {
    let st = state.clone();
    match tokio::task::spawn_blocking(move || serde_json::to_string(&st.snapshot())).await {
        Ok(Ok(s)) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], s).into_response()
        }
        Ok(Err(e)) => error(&state, 500, e.to_string()),
        Err(e) => error(&state, 500, e.to_string()),
    }
}

async fn metrics(AxState(state): St) -> Response {
    let mut out = String::new();
    state.metrics.render(&mut out);
    let indexes: Vec<_> = {
        let m = state.indexes.read().unwrap_or_else(|p| p.into_inner());
        m.values().cloned().collect()
    };
    let mut tot = radixkv_router::RouterStats::default();
    let mut empty = 0u64;
    for ix in &indexes {
        ix.index.reclaim();
        let s = ix.index.stats();
        tot.workers += s.workers;
        tot.blocks += s.blocks;
        tot.memberships += s.memberships;
        tot.bytes += s.bytes;
        tot.gaps += s.gaps;
        tot.restarts += s.restarts;
        tot.other_groups += s.other_groups;
        for (a, b) in tot.refused_by.iter_mut().zip(s.refused_by) {
            *a += b;
        }
        empty += ix.index.empty_bytes() as u64;
    }
    let registered = state.streams().len() as u64;
    metric(
        &mut out,
        "radixkv_indexer_max_bytes",
        "gauge",
        "--max-bytes (0: no cap).",
        state.cfg.max_bytes.unwrap_or(0),
    );
    metric(
        &mut out,
        "radixkv_indexer_registered_workers",
        "gauge",
        "Registered streams ((instance, dp_rank) pairs).",
        registered,
    );
    metric(
        &mut out,
        "radixkv_indexer_index_workers",
        "gauge",
        "Workers the indexes hold.",
        tot.workers,
    );
    metric(
        &mut out,
        "radixkv_indexer_indexes",
        "gauge",
        "(model, tenant) indexes.",
        indexes.len() as u64,
    );
    metric(
        &mut out,
        "radixkv_indexer_blocks",
        "gauge",
        "Distinct blocks held by any worker.",
        tot.blocks,
    );
    metric(
        &mut out,
        "radixkv_indexer_memberships",
        "gauge",
        "(block, worker, medium) holdings.",
        tot.memberships,
    );
    metric(&mut out, "radixkv_indexer_index_bytes", "gauge", "The indexes' heap bytes.", tot.bytes);
    metric(
        &mut out,
        "radixkv_indexer_index_empty_bytes",
        "gauge",
        "The indexes' heap bytes when empty.",
        empty,
    );
    metric(
        &mut out,
        "radixkv_indexer_index_gaps_total",
        "counter",
        "Gaps the indexes saw (each cleared the worker).",
        tot.gaps,
    );
    metric(
        &mut out,
        "radixkv_indexer_index_restarts_total",
        "counter",
        "Restarts the indexes saw.",
        tot.restarts,
    );
    metric(
        &mut out,
        "radixkv_indexer_other_group_events_total",
        "counter",
        "Events of a KV cache group other than full attention (sliding window, Mamba), skipped.",
        tot.other_groups,
    );
    out.push_str(
        "# HELP radixkv_indexer_refused_total Events and batches the indexes refused, by reason.\n",
    );
    out.push_str("# TYPE radixkv_indexer_refused_total counter\n");
    for r in Refusal::ALL {
        out.push_str(&format!(
            "radixkv_indexer_refused_total{{reason=\"{}\"}} {}\n",
            refusal_label(r),
            tot.refused(r)
        ));
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

async fn health() -> &'static str {
    "ok"
}
