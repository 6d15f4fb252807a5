//! The snapshot (and `GET /dump`): every index's dump and every registration, as JSON.

use std::io::Write;
use std::path::Path;

use radixkv_router::{DumpBlock, DumpGroup, Worker, WorkerDump};
use serde::{Deserialize, Serialize};

/// The snapshot format's version (`Snapshot::version`).
pub const SNAPSHOT_VERSION: u32 = 1;

/// One registered stream: what `POST /register` was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The worker (instance) id.
    pub instance_id: u64,
    /// The worker's ZMQ PUB endpoint (the indexer's SUB socket connects to it).
    pub endpoint: String,
    /// The model.
    pub model_name: String,
    /// The tenant (`"default"` when the request had none, as Dynamo's).
    pub tenant_id: String,
    /// Tokens per block.
    pub block_size: u32,
    /// The data-parallel rank this endpoint publishes (0 when the request had none).
    pub dp_rank: u32,
    /// The LoRA adapter the worker serves, if any (recorded and listed; queries name
    /// theirs).
    #[serde(default)]
    pub lora_name: Option<String>,
    /// The worker's ZMQ ROUTER replay endpoint, if any.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
}

/// One worker of an index, as [`radixkv_router::WorkerDump`] with serde.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotWorker {
    /// The worker id.
    pub worker_id: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// The next batch `seq` expected (`None`: no batch yet).
    pub next_seq: Option<u64>,
    /// Held blocks: `[engine_hash, chain_key, media]` (media bit 0 device, bit 1 host).
    pub blocks: Vec<(u64, u64, u8)>,
    /// The KV cache groups whose kinds the worker's stores taught: `[group_idx,
    /// main_attention]` ([`radixkv_router::DumpGroup`]). Left out when empty (none learned),
    /// and read as empty from a snapshot without it (one written before groups were saved).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<(u32, bool)>,
}

/// One (model, tenant) index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotIndex {
    /// The model.
    pub model_name: String,
    /// The tenant.
    pub tenant_id: String,
    /// Its block size.
    pub block_size: u32,
    /// Its workers.
    pub workers: Vec<SnapshotWorker>,
}

/// A stream's place: what it resumes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCursor {
    /// The registration's instance.
    pub instance_id: u64,
    /// The registration's dp rank.
    pub dp_rank: u32,
    /// The next batch `seq` expected.
    pub next_seq: Option<u64>,
    /// The last batch applied (`next_seq - 1`).
    pub last_seq: Option<u64>,
    /// Its payload's XXH3-64: a replay that answers other bytes for it comes from a new
    /// stream (the worker restarted).
    pub last_hash: Option<u64>,
}

/// The whole service state a restart or a replica needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`SNAPSHOT_VERSION`].
    pub version: u32,
    /// Every index.
    pub indexes: Vec<SnapshotIndex>,
    /// Every registration.
    pub registrations: Vec<Registration>,
    /// Every registration's stream cursor.
    #[serde(default)]
    pub streams: Vec<StreamCursor>,
}

impl SnapshotWorker {
    pub(crate) fn from_dump(d: &WorkerDump) -> SnapshotWorker {
        SnapshotWorker {
            worker_id: d.worker.worker_id,
            dp_rank: d.worker.dp_rank,
            next_seq: d.next_seq,
            blocks: d.blocks.iter().map(|b| (b.engine_hash, b.chain_key, b.media)).collect(),
            groups: d.groups.iter().map(|g| (g.group_idx, g.main_attention)).collect(),
        }
    }

    pub(crate) fn to_dump(&self) -> WorkerDump {
        WorkerDump {
            worker: Worker::new(self.worker_id, self.dp_rank),
            next_seq: self.next_seq,
            blocks: self
                .blocks
                .iter()
                .map(|&(engine_hash, chain_key, media)| DumpBlock { engine_hash, chain_key, media })
                .collect(),
            groups: self
                .groups
                .iter()
                .map(|&(group_idx, main_attention)| DumpGroup { group_idx, main_attention })
                .collect(),
        }
    }
}

/// Writes `snap` to `path` atomically: a temporary file beside it, synced, then renamed.
pub(crate) fn write_atomic(path: &Path, snap: &Snapshot) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        serde_json::to_writer(&mut f, snap).map_err(std::io::Error::other)?;
        f.flush()?;
        f.get_ref().sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// Reads a snapshot (`Ok(None)`: no file there).
pub(crate) fn read(path: &Path) -> Result<Option<Snapshot>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read snapshot {}: {e}", path.display())),
    };
    parse(&bytes).map(Some).map_err(|e| format!("snapshot {}: {e}", path.display()))
}

/// Parses a snapshot (a file's or a peer's `/dump`).
pub(crate) fn parse(bytes: &[u8]) -> Result<Snapshot, String> {
    let s: Snapshot = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if s.version != SNAPSHOT_VERSION {
        return Err(format!(
            "snapshot version {} (this build reads {SNAPSHOT_VERSION})",
            s.version
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker's learned group kinds go through the snapshot; a snapshot written before
    /// they were saved (no `groups`) reads as none learned, and a worker with none writes
    /// no `groups` (the bytes of before).
    #[test]
    fn group_kinds_round_trip_and_old_workers_read_as_none_learned() {
        let d = WorkerDump {
            worker: Worker::new(7, 1),
            next_seq: Some(3),
            blocks: vec![DumpBlock { engine_hash: 1, chain_key: 2, media: 1 }],
            groups: vec![
                DumpGroup { group_idx: 0, main_attention: false },
                DumpGroup { group_idx: 3, main_attention: true },
            ],
        };
        let sw = SnapshotWorker::from_dump(&d);
        let json = serde_json::to_string(&sw).unwrap();
        assert!(json.contains(r#""groups":[[0,false],[3,true]]"#), "{json}");
        let back: SnapshotWorker = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_dump(), d);

        let old = r#"{"worker_id":7,"dp_rank":1,"next_seq":3,"blocks":[[1,2,1]]}"#;
        let w: SnapshotWorker = serde_json::from_str(old).unwrap();
        assert_eq!(w.to_dump(), WorkerDump { groups: vec![], ..d });
        assert_eq!(serde_json::to_string(&w).unwrap(), old);
    }
}
