//! Power loss at every durable operation of group transactions over a root and 20 branches
//! (docs/design.md 4.3, invariant I14), under a `PowerLossEnv` whose durable observer snapshots
//! the simulated disk just before and right after each one (`common::points`): every crash mode,
//! with and without losing unsynced directory entries.
//!
//! The workload: 14 seeded groups, each over the root and a random subset of the branches (every
//! fourth over all 21 storages), each putting a key of its own and overwriting a key `last` in
//! every member with values of 40 to 700 bytes, so that group records span several 4 KiB
//! sectors and torn ones occur; small journal files, so that groups start new files with link
//! records into 20 branches; half way, the root and two branches are flushed while the others
//! keep their parts of the same group records in the journal.
//!
//! After each crash the database opens (read-write at every fourth distinct state: the relink
//! of lost names and the flush of what was replayed; read-only at the others) and, for every
//! group: either every member shows it or
//! none does (never a partial group); every acknowledged group is there, and none that was not
//! committed yet; `last` in each storage is the value of the newest group present that wrote
//! it. A branch opened alone (read-only) before that never shows a group the database does
//! not, and never part of one.
//!
//! Negative control, run by hand: with a group's parts written as records of their own in one
//! batch (`Journal::write_records`) instead of one group record, torn batches leave partial
//! groups (8 failed states: "group 4 is partial: in storages [0, 1, ..., 8] of [0, ..., 20]").

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use omnibus::env::StorageEnv;
use omnibus::{Database, Error, FlushMode, Options, Prezero, Storage};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::common::points::{self, verify_snaps, Recording, Snap, Tally};

const BRANCHES: usize = 20;
const GROUPS: usize = 14;
/// The branch also opened alone after each crash.
const ALONE: usize = 7;

/// What a crash at one moment must recover: groups `0..acked` acknowledged, `inflight` the one
/// whose commit had started and not returned.
#[derive(Debug, Clone, Copy, Default)]
struct Expect {
    acked: usize,
    inflight: Option<usize>,
}

fn name(b: usize) -> String {
    format!("b{b:02}")
}

/// The members of each group: storage 0 is the root, `1..=20` the branches.
fn plan(seed: u64) -> Vec<Vec<usize>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..GROUPS)
        .map(|i| {
            if i % 4 == 0 {
                (0..=BRANCHES).collect()
            } else {
                let mut m = vec![0];
                m.extend((1..=BRANCHES).filter(|_| rng.random_bool(0.4)));
                if m.len() == 1 {
                    m.push(1 + i % BRANCHES);
                }
                m
            }
        })
        .collect()
}

fn key(i: usize) -> String {
    format!("group/{i:03}")
}

fn value(i: usize, m: usize) -> Vec<u8> {
    let len = 40 + (i * 37 + m * 11) % 660;
    let mut v = format!("{i}:{m}:").into_bytes();
    v.resize(len, b'a' + (i % 26) as u8);
    v
}

fn workload_opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        journal_file_size: 64 << 10,
        journal_prezero: Prezero::WholeFile,
        journal_pool_files: 0,
        flush_on_close: false,
        // Page commits: the records' sizes give the journal rotations and crash states the
        // tally below asks for.
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

/// The storages of `db` in plan order (root, then the branches), creating the branches.
fn storages(db: &Database) -> Vec<Storage> {
    let mut v = vec![db.root()];
    for b in 0..BRANCHES {
        v.push(db.create_storage(&name(b)).unwrap());
    }
    v
}

/// Which groups `s` shows whole in its member slot `m`, and the groups it shows with a wrong
/// value (never expected).
fn present(s: &Storage, m: usize, groups: &[Vec<usize>]) -> Result<BTreeSet<usize>, String> {
    let r = s.begin_read().map_err(|e| e.to_string())?;
    let mut out = BTreeSet::new();
    for (i, members) in groups.iter().enumerate() {
        if !members.contains(&m) {
            continue;
        }
        match r.get(key(i)).map_err(|e| e.to_string())? {
            Some(v) if v == value(i, m) => {
                out.insert(i);
            }
            Some(_) => return Err(format!("storage {m}: group {i} with a wrong value")),
            None => {}
        }
    }
    let newest = out.iter().next_back().copied();
    let last = r
        .get("last")
        .map_err(|e| e.to_string())?
        .map(|v| v.to_vec());
    if last != newest.map(|i| value(i, m)) {
        return Err(format!(
            "storage {m}: `last` is not the value of its newest group {newest:?}"
        ));
    }
    Ok(out)
}

/// Checks one crash state against every expectation that leaves it; true when a group in
/// flight was recovered.
fn verify(
    path: &Path,
    groups: &[Vec<usize>],
    expects: &[&Expect],
    read_only: bool,
) -> Result<bool, String> {
    // A branch alone first (read-only: it writes nothing the database's open would see).
    let alone_dir = path.join("Indexes").join(name(ALONE - 1));
    let alone = if alone_dir.join("data.pages").exists() {
        let s = Storage::open(
            &alone_dir,
            Options {
                read_only: true,
                ..Options::default()
            },
        )
        .map_err(|e| format!("the branch opened alone: {e}"))?;
        Some(present(&s, ALONE, groups)?)
    } else {
        None
    };
    let db = Database::open(
        path,
        Options {
            flush_mode: FlushMode::Manual,
            // No zeros and no pool: each of the many recoveries writes little.
            journal_file_size: 256 << 10,
            journal_prezero: Prezero::Off,
            journal_pool_files: 0,
            read_only,
            ..Options::default()
        },
    )
    .map_err(|e| format!("open: {e}"))?;
    let mut shown: Vec<Option<BTreeSet<usize>>> = Vec::with_capacity(BRANCHES + 1);
    shown.push(Some(present(&db.root(), 0, groups)?));
    for b in 0..BRANCHES {
        match db.storage(&name(b)) {
            Ok(s) => shown.push(Some(present(&s, b + 1, groups)?)),
            Err(Error::StorageNotFound { .. }) => shown.push(None),
            Err(e) => return Err(format!("branch {b}: {e}")),
        }
    }
    let mut inflight = false;
    for (i, members) in groups.iter().enumerate() {
        let with: Vec<usize> = members
            .iter()
            .copied()
            .filter(|&m| shown[m].as_ref().is_some_and(|s| s.contains(&i)))
            .collect();
        if !with.is_empty() && with.len() != members.len() {
            return Err(format!(
                "group {i} is partial: in storages {with:?} of {members:?}"
            ));
        }
        let there = !with.is_empty();
        for e in expects {
            if i < e.acked && !there {
                return Err(format!("acknowledged group {i} is lost ({e:?})"));
            }
            if i >= e.acked && there && e.inflight != Some(i) {
                return Err(format!(
                    "group {i} is there but was never committed ({e:?})"
                ));
            }
        }
        inflight |= there && expects.iter().any(|e| e.inflight == Some(i));
    }
    if let (Some(alone), Some(db_view)) = (alone, &shown[ALONE]) {
        if !alone.is_subset(db_view) {
            return Err(format!(
                "the branch opened alone shows groups {:?} the database does not",
                alone.difference(db_view).collect::<Vec<_>>()
            ));
        }
    }
    Ok(inflight)
}

fn run_once(base: &Path, seed: u64, groups: &[Vec<usize>]) -> Vec<Snap<Expect>> {
    let dir = tempfile::tempdir_in(base).unwrap();
    let path = dir.path().join("db");
    let rec = Recording::new(dir.path());
    let db = Database::open(&path, workload_opts(rec.env.clone())).unwrap();
    let ss = storages(&db);
    // The creations are done and durable: crash points from here on.
    let expect: Arc<Mutex<Expect>> = Arc::default();
    let ex = expect.clone();
    let snaps = rec.record(move || *ex.lock().unwrap());
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x9e37);
    for (i, members) in groups.iter().enumerate() {
        // Given in a random order: the group locks them in its own.
        let mut order = members.clone();
        order.shuffle(&mut rng);
        let refs: Vec<&Storage> = order.iter().map(|&m| &ss[m]).collect();
        let mut g = db.begin_group(&refs).unwrap();
        for &m in &order {
            g.put(&ss[m], key(i), value(i, m)).unwrap();
            g.put(&ss[m], "last", value(i, m)).unwrap();
        }
        *expect.lock().unwrap() = Expect {
            acked: i,
            inflight: Some(i),
        };
        g.commit().unwrap();
        *expect.lock().unwrap() = Expect {
            acked: i + 1,
            inflight: None,
        };
        if i == GROUPS / 2 {
            // Some members flushed, the others keep their parts in the journal.
            for s in [&ss[0], &ss[1], &ss[2]] {
                s.flush().unwrap();
            }
        }
    }
    rec.stop();
    verify_clean(&path, &db, &ss, groups);
    drop(ss);
    drop(db);
    let out = std::mem::take(&mut *snaps.lock().unwrap());
    out
}

fn verify_clean(path: &Path, db: &Database, ss: &[Storage], groups: &[Vec<usize>]) {
    for (m, s) in ss.iter().enumerate() {
        let want: BTreeSet<usize> = (0..groups.len())
            .filter(|i| groups[*i].contains(&m))
            .collect();
        assert_eq!(present(s, m, groups).unwrap(), want, "{}", path.display());
    }
    assert!(db.stats().journal_fdatasyncs > 0);
}

#[test]
fn no_crash_shows_part_of_a_group_or_loses_an_acknowledged_one() {
    let start = Instant::now();
    let base = points::scratch_base("omnibus-groupcrash");
    let seed = 0x6709_0001;
    let groups = plan(seed);
    let snaps = run_once(base.path(), seed, &groups);
    let ops = snaps.iter().map(|s| s.n).max().unwrap_or(0);
    // Every fourth state is opened read-write (the relink of lost names, the flush of what
    // was replayed); the others read-only (replayed into memory, nothing written).
    let tally: Tally = verify_snaps(base.path(), seed, &snaps, 1, |dir, expects, i| {
        verify(&dir.join("db"), &groups, expects, i % 4 != 0)
    });
    println!(
        "{ops} durable operations; crash points: {} leaving {} distinct states ({} with the group \
         in flight recovered), in {:.1?}; per kind and mode: {:?}",
        tally.points,
        tally.states,
        tally.inflight,
        start.elapsed(),
        tally.by_kind
    );
    tally.assert_clean(150, &["journal batch"]);
}
