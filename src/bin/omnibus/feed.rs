//! Index storages kept from the change feed of the documents storage (as RavenDB's indexes):
//! once a document's put is acknowledged, its index updates go on a bounded channel per index;
//! each index task takes everything pending (up to a cap), commits it as one `WriteBatch`, and
//! measures how far behind the documents it was.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::actors::{StorageHandle, WriteBatch, WriteOp};
use serde_json::{Map, Value};
use tokio::sync::mpsc;

/// Separator between the field values of an index key, and before the document id.
pub const SEP: u8 = 0;

/// Updates an index commits in one batch at most.
pub const MAX_BATCH: usize = 4096;

/// Capacity of each index's feed channel (updates).
pub const FEED_CAPACITY: usize = 4096;

/// `--index SPEC`: a field name, or several joined by `,`; the storage is named SPEC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexSpec {
    pub name: String,
    pub fields: Vec<String>,
}

impl IndexSpec {
    pub fn parse(spec: &str) -> Result<IndexSpec, String> {
        let fields: Vec<String> = spec.split(',').map(str::to_string).collect();
        if fields.iter().any(|f| f.is_empty()) {
            return Err(format!(
                "--index {spec:?}: an empty field name (write `a` or `a,b`)"
            ));
        }
        omnibus::database::validate_storage_name(spec)
            .map_err(|e| format!("--index {spec:?}: {e}"))?;
        Ok(IndexSpec {
            name: spec.to_string(),
            fields,
        })
    }

    /// The index key of document `doc` with id `id`: the field values joined by [`SEP`], then
    /// [`SEP`], then the id. `None` when a field is missing or null, or when a value holds a
    /// NUL byte: its key would be ambiguous (a prefix scan for `x` + 0x00 would also list the
    /// value `x\0y`), so such a document is left out of that index.
    pub fn key(&self, doc: &Map<String, Value>, id: &[u8]) -> Option<Vec<u8>> {
        let mut k = Vec::new();
        for f in &self.fields {
            let v = field_bytes(doc, f)?;
            if v.contains(&SEP) {
                return None;
            }
            k.extend_from_slice(&v);
            k.push(SEP);
        }
        k.extend_from_slice(id);
        Some(k)
    }
}

fn lookup<'a>(doc: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    if let Some(v) = doc.get(field) {
        return Some(v);
    }
    if !field.contains('.') {
        return None;
    }
    let mut parts = field.split('.');
    let mut cur = doc.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_object()?.get(p)?;
    }
    Some(cur)
}

/// A field's value as index key bytes: a string as is, a number in serde_json's text form (`1e2`
/// is `100.0`), a boolean as `true`/`false`, an array or object as compact JSON; `None` when
/// missing or null.
pub fn field_bytes(doc: &Map<String, Value>, field: &str) -> Option<Vec<u8>> {
    match lookup(doc, field)? {
        Value::Null => None,
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Number(n) => Some(n.to_string().into_bytes()),
        Value::Bool(b) => Some(if *b {
            b"true".to_vec()
        } else {
            b"false".to_vec()
        }),
        v => Some(serde_json::to_vec(v).unwrap_or_default()),
    }
}

/// One change of one index, sent after the document's commit was acknowledged.
#[derive(Debug)]
pub struct Update {
    /// When the document's commit was acknowledged.
    pub acked: Instant,
    /// The old entry of a changed document.
    pub del: Option<Vec<u8>>,
    /// The new entry (key, value).
    pub put: Option<(Vec<u8>, Vec<u8>)>,
}

/// The sending side of one index's feed.
#[derive(Clone)]
pub struct FeedSender {
    pub tx: mpsc::Sender<Update>,
    /// Updates sent so far (to measure how far behind the index is).
    pub sent: Arc<AtomicU64>,
}

impl FeedSender {
    /// Sends `u`, waiting while the index is [`FEED_CAPACITY`] updates behind (back-pressure).
    pub async fn send(&self, u: Update) -> Result<(), ()> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        self.tx.send(u).await.map_err(|_| ())
    }
}

/// What one index task did.
#[derive(Debug)]
pub struct IndexReport {
    pub name: String,
    /// Updates received.
    pub updates: u64,
    /// Batches committed.
    pub commits: u64,
    /// Updates that changed nothing (already there) and were not written.
    pub unchanged: u64,
    /// Microseconds from a document's acknowledgement to its index entry's commit.
    pub lag_us: Histogram<u64>,
    /// Most updates sent and not yet committed, seen when a batch started.
    pub max_behind: u64,
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is valid")
}

/// Starts the feed of an index: the sender, and the receiver to give to [`run_index`].
pub fn channel() -> (FeedSender, mpsc::Receiver<Update>) {
    let (tx, rx) = mpsc::channel(FEED_CAPACITY);
    (
        FeedSender {
            tx,
            sent: Arc::new(AtomicU64::new(0)),
        },
        rx,
    )
}

/// The index task: commits pending updates in batches until every sender is gone.
///
/// A batch starts at least `min_interval` after the previous one (updates accumulate meanwhile).
/// With `skip_unchanged`, updates that would not change the storage (an entry already there
/// with the same value, a delete of an absent key) are left out, judged in order against a
/// snapshot and the batch's own earlier updates, so re-running an ingest rewrites nothing.
pub async fn run_index(
    name: String,
    handle: StorageHandle,
    mut rx: mpsc::Receiver<Update>,
    sent: Arc<AtomicU64>,
    skip_unchanged: bool,
    min_interval: Duration,
) -> Result<IndexReport, omnibus::Error> {
    let mut rep = IndexReport {
        name,
        updates: 0,
        commits: 0,
        unchanged: 0,
        lag_us: histogram(),
        max_behind: 0,
    };
    let mut buf = Vec::with_capacity(MAX_BATCH);
    let mut last: Option<Instant> = None;
    loop {
        buf.clear();
        if let Some(t) = last {
            let wait = min_interval.saturating_sub(t.elapsed());
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
        last = Some(Instant::now());
        if rx.recv_many(&mut buf, MAX_BATCH).await == 0 {
            return Ok(rep);
        }
        let behind = sent.load(Ordering::Relaxed).saturating_sub(rep.updates);
        rep.max_behind = rep.max_behind.max(behind);
        rep.updates += buf.len() as u64;
        let mut batch = WriteBatch::new();
        for u in &mut buf {
            if let Some(k) = u.del.take() {
                batch.delete(k);
            }
            if let Some((k, v)) = u.put.take() {
                batch.put(k, v);
            }
        }
        if skip_unchanged {
            let (b, skipped) = without_noops(&handle, batch)?;
            batch = b;
            rep.unchanged += skipped;
        }
        if !batch.is_empty() {
            handle.write(batch).await?;
            rep.commits += 1;
        }
        let now = Instant::now();
        for u in &buf {
            let _ = rep
                .lag_us
                .record(now.saturating_duration_since(u.acked).as_micros() as u64);
        }
    }
}

/// `batch` without the operations that change nothing, judged in order.
fn without_noops(
    handle: &StorageHandle,
    batch: WriteBatch,
) -> Result<(WriteBatch, u64), omnibus::Error> {
    let snap = handle.snapshot()?;
    let mut overlay: HashMap<&[u8], Option<&[u8]>> = HashMap::new();
    let mut out = WriteBatch::new();
    let mut skipped = 0;
    for op in batch.ops() {
        let (k, new): (&[u8], Option<&[u8]>) = match op {
            WriteOp::Put(k, v) => (k, Some(v)),
            WriteOp::Delete(k) => (k, None),
        };
        let cur = match overlay.get(k) {
            Some(c) => *c,
            None => snap.get(k)?,
        };
        if cur == new {
            skipped += 1;
            continue;
        }
        overlay.insert(k, new);
        match new {
            Some(v) => out.put(k, v),
            None => out.delete(k),
        };
    }
    Ok((out, skipped))
}

/// Joins index reports into one lag histogram and the largest "behind".
pub fn merge_lag(reports: &[IndexReport]) -> (Histogram<u64>, u64) {
    let mut h = histogram();
    let mut behind = 0;
    for r in reports {
        let _ = h.add(&r.lag_us);
        behind = behind.max(r.max_behind);
    }
    (h, behind)
}

#[cfg(test)]
mod nul_tests {
    use super::*;

    // Regression: a fresh user found that a value holding a NUL byte ("x\u0000y") was listed by
    // the documented prefix scan for the value "x" ("x" + 0x00). Such values now stay out of the
    // index instead of giving a wrong scan result.
    #[test]
    fn values_with_nul_are_left_out() {
        let spec = IndexSpec::parse("a").unwrap();
        let doc: Map<String, Value> = serde_json::from_str(r#"{"a":"x\u0000y"}"#).unwrap();
        assert_eq!(spec.key(&doc, b"1"), None);
        let ok: Map<String, Value> = serde_json::from_str(r#"{"a":"x"}"#).unwrap();
        assert_eq!(spec.key(&ok, b"1"), Some(vec![b'x', 0, b'1']));
    }
}
