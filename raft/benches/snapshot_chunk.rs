//! One `InstallSnapshot` chunk of openraft's default size (3 MiB) on the wire: serde's default
//! encoding of `InstallSnapshotRequest` (its bytes a JSON array of numbers, what the
//! transport sent before) vs [`omnibus_raft::network::SnapshotChunk`] (one base64 string),
//! side by side in one run: bytes of the JSON line (deterministic) and the time to encode
//! and decode it (best of the rounds), for two kinds of snapshot bytes: ASCII text like the
//! keys and values of the example's state machine, and pseudo-random bytes.
//!
//! ```text
//! cargo bench -p omnibus-raft --bench snapshot_chunk -- [--rounds 5]
//! ```

use std::time::{Duration, Instant};

use omnibus_raft::network::{Message, SnapshotChunk};
use omnibus_raft::TypeConfig;
use openraft::raft::InstallSnapshotRequest;
use openraft::{CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership, Vote};

const CHUNK: usize = 3 << 20;

fn request(data: Vec<u8>) -> InstallSnapshotRequest<TypeConfig> {
    let log_id = LogId::new(CommittedLeaderId::new(3, 1), 399);
    InstallSnapshotRequest {
        vote: Vote::new_committed(3, 1),
        meta: SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: StoredMembership::new(
                Some(log_id),
                Membership::new(vec![[1, 2, 3].into()], None),
            ),
            snapshot_id: "3-1-399-7".into(),
        },
        offset: 0,
        data,
        done: false,
    }
}

/// Encodes and decodes `rounds` times; the line's length and the fastest round.
fn measure(rounds: u32, mut round: impl FnMut() -> usize) -> (usize, Duration) {
    let mut best = Duration::MAX;
    let mut len = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        len = round();
        best = best.min(t.elapsed());
    }
    (len, best)
}

fn main() {
    let mut rounds = 5u32;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = it.next().and_then(|v| v.parse().ok()).expect("--rounds N");
            }
            "--bench" => {}
            other => panic!("unknown argument {other:?}"),
        }
    }
    let text: Vec<u8> = b"key-0001234 value-1234-xxxxxxxxxxxxxxxxxxxx "
        .iter()
        .copied()
        .cycle()
        .take(CHUNK)
        .collect();
    let random: Vec<u8> = (0..CHUNK as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    println!("3 MiB snapshot chunk, encode + decode as one JSON line, best of {rounds} rounds");
    println!("| bytes | array: line | array: time | base64: line | base64: time | bytes | time |");
    println!("|---|---|---|---|---|---|---|");
    for (what, data) in [("ASCII text", text), ("pseudo-random", random)] {
        let req = request(data);
        let (array_len, array_t) = measure(rounds, || {
            let line = serde_json::to_vec(&req).expect("encode");
            let back: InstallSnapshotRequest<TypeConfig> =
                serde_json::from_slice(&line).expect("decode");
            assert_eq!(back.data.len(), CHUNK);
            line.len()
        });
        let (b64_len, b64_t) = measure(rounds, || {
            let msg = Message::InstallSnapshot {
                group: 0,
                rpc: SnapshotChunk::from(req.clone()),
            };
            let line = serde_json::to_vec(&msg).expect("encode");
            let back: Message = serde_json::from_slice(&line).expect("decode");
            assert!(
                matches!(back, Message::InstallSnapshot { rpc, .. } if rpc.data.len() == CHUNK)
            );
            line.len()
        });
        println!(
            "| {what} | {array_len} | {:.1} ms | {b64_len} | {:.1} ms | {:.2}x fewer | {:.1}x faster |",
            array_t.as_secs_f64() * 1e3,
            b64_t.as_secs_f64() * 1e3,
            array_len as f64 / b64_len as f64,
            array_t.as_secs_f64() / b64_t.as_secs_f64(),
        );
    }
}
