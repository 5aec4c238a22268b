//! Storages with a write buffer (`Options::write_buffer_bytes`): random puts, deletes, range
//! deletes, commits, aborts and eventual commits, with snapshots held across applies, flushes
//! and reopenings (clean closes, drops that leave the buffer in the journal, and reopenings
//! without the option), every read call checked against a `BTreeMap` model.

use std::collections::BTreeMap;
use std::ops::Bound;

use omnibus::{Durability, FlushMode, Options, ReadTransaction, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn opts(buffer: u64) -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        write_buffer_bytes: buffer,
        ..Options::default()
    }
}

/// [`opts`] whose close leaves the buffer in the journal (as a crash does).
fn kept(buffer: u64) -> Options {
    Options {
        flush_on_close: false,
        ..opts(buffer)
    }
}

fn key(rng: &mut SmallRng, space: u32) -> Vec<u8> {
    format!("k{:06}", rng.random_range(0..space)).into_bytes()
}

fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = match rng.random_range(0..50) {
        0 => rng.random_range(3000..20_000),
        _ => rng.random_range(0..60),
    };
    let b: u8 = rng.random();
    (0..len).map(|i| b.wrapping_add(i as u8)).collect()
}

/// A random range over the key space, with its bounds.
fn bounds(rng: &mut SmallRng, space: u32) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let mut b = || match rng.random_range(0..3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(key(rng, space)),
        _ => Bound::Excluded(key(rng, space)),
    };
    (b(), b())
}

fn in_model(model: &Model, b: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> Vec<(Vec<u8>, Vec<u8>)> {
    model
        .iter()
        .filter(|(k, _)| {
            let lo = match &b.0 {
                Bound::Included(s) => *k >= s,
                Bound::Excluded(s) => *k > s,
                Bound::Unbounded => true,
            };
            let hi = match &b.1 {
                Bound::Included(e) => *k <= e,
                Bound::Excluded(e) => *k < e,
                Bound::Unbounded => true,
            };
            lo && hi
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn as_ref(b: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (
        b.0.as_ref().map(Vec::as_slice),
        b.1.as_ref().map(Vec::as_slice),
    )
}

/// Every read call of a snapshot against the model: `len`, `get`, `multi_get`, `first`,
/// `last`, full iteration both ways, and a random range both ways.
fn assert_same(snap: &ReadTransaction, model: &Model, rng: &mut SmallRng, space: u32) {
    assert_eq!(snap.len(), model.len() as u64, "entry count");
    let expect: Vec<(Vec<u8>, Vec<u8>)> =
        model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert_range(|| snap.iter().unwrap(), &expect, "iteration");
    assert_eq!(
        snap.first().unwrap().map(|(k, v)| (k.to_vec(), v.to_vec())),
        model.first_key_value().map(|(k, v)| (k.clone(), v.clone()))
    );
    assert_eq!(
        snap.last().unwrap().map(|(k, v)| (k.to_vec(), v.to_vec())),
        model.last_key_value().map(|(k, v)| (k.clone(), v.clone()))
    );
    let keys: Vec<Vec<u8>> = (0..20).map(|_| key(rng, space)).collect();
    let got = snap.multi_get(&keys).unwrap();
    for (k, g) in keys.iter().zip(got) {
        assert_eq!(g, model.get(k).map(Vec::as_slice), "multi_get");
        assert_eq!(snap.get(k).unwrap(), model.get(k).map(Vec::as_slice), "get");
    }
    let b = bounds(rng, space);
    assert_range(
        || snap.range(as_ref(&b)).unwrap(),
        &in_model(model, &b),
        &format!("range {b:?}"),
    );
}

/// `range()` iterated forwards and backwards against `want`.
fn assert_range<'a>(
    range: impl Fn() -> omnibus::Range<'a>,
    want: &[(Vec<u8>, Vec<u8>)],
    what: &str,
) {
    let owned = |r: omnibus::Result<(&[u8], &[u8])>| {
        let (k, v) = r.unwrap();
        (k.to_vec(), v.to_vec())
    };
    let got: Vec<(Vec<u8>, Vec<u8>)> = range().map(owned).collect();
    assert!(got == want, "{what}");
    let mut back: Vec<(Vec<u8>, Vec<u8>)> = range().rev().map(owned).collect();
    back.reverse();
    assert!(back == want, "reverse {what}");
}

/// `step`: the apply step's pages set after every open (`Storage::set_apply_step_pages`; 0:
/// whole applies). Returns the apply steps counted over the opens.
fn run(seed: u64, rounds: usize, space: u32, buffer: u64, step: u64) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut s = Storage::open(&path, opts(buffer)).unwrap();
    s.set_apply_step_pages(step);
    let mut steps = 0u64;
    let mut model = Model::new();
    let mut held: Vec<(ReadTransaction, Model)> = Vec::new();
    let mut buffered_seen = 0u64;
    for round in 0..rounds {
        let mut w = s.begin_write().unwrap();
        let mut next = model.clone();
        for _ in 0..rng.random_range(1..60) {
            match rng.random_range(0..40) {
                0..=21 => {
                    let (k, v) = (key(&mut rng, space), value(&mut rng));
                    w.put(&k, &v).unwrap();
                    next.insert(k, v);
                }
                22..=31 => {
                    let k = key(&mut rng, space);
                    assert_eq!(w.delete(&k).unwrap(), next.remove(&k).is_some());
                }
                // Rare with steps, so that the tree grows past a few leaves.
                32 if step == 0 || rng.random_bool(0.02) => {
                    let b = bounds(&mut rng, space);
                    let gone = in_model(&next, &b);
                    assert_eq!(w.delete_range(as_ref(&b)).unwrap(), gone.len() as u64);
                    for (k, _) in gone {
                        next.remove(&k);
                    }
                }
                33..=36 => {
                    let k = key(&mut rng, space);
                    assert_eq!(w.get(&k).unwrap().as_ref(), next.get(&k), "txn get");
                }
                _ => {
                    // The transaction's own view: range both ways, and its count.
                    let b = bounds(&mut rng, space);
                    assert_range(
                        || w.range(as_ref(&b)).unwrap(),
                        &in_model(&next, &b),
                        &format!("txn range {b:?}"),
                    );
                    assert_eq!(w.len(), next.len() as u64, "txn len");
                }
            }
        }
        match rng.random_range(0..12) {
            0 => w.abort(),
            1 => {
                w.set_durability(Durability::Eventual);
                w.commit().unwrap();
                model = next;
            }
            _ => {
                w.commit().unwrap();
                model = next;
            }
        }
        buffered_seen = buffered_seen.max(s.stats().buffer_entries);
        if rng.random_bool(0.3) {
            held.push((s.begin_read().unwrap(), model.clone()));
        }
        if held.len() > 4 || (rng.random_bool(0.2) && !held.is_empty()) {
            let (snap, m) = held.remove(0);
            assert_same(&snap, &m, &mut rng, space);
        }
        if rng.random_bool(0.05) {
            s.flush().unwrap();
        }
        if round % 23 == 22 {
            for (snap, m) in held.drain(..) {
                assert_same(&snap, &m, &mut rng, space);
            }
            steps += s.stats().apply_steps;
            let again = match rng.random_range(0..4) {
                // Dropped without a close: the buffer is only in the journal, and comes back
                // from it at the open.
                0 | 1 => {
                    s.sync_journal().unwrap();
                    drop(s);
                    opts(buffer)
                }
                2 => {
                    s.close().unwrap();
                    opts(buffer)
                }
                // Reopened without a buffer: what the journal put back is applied by the
                // next commit.
                _ => {
                    s.sync_journal().unwrap();
                    drop(s);
                    opts(0)
                }
            };
            s = Storage::open(&path, again).unwrap();
            s.set_apply_step_pages(step);
            assert_same(&s.begin_read().unwrap(), &model, &mut rng, space);
            let report = s.check().unwrap();
            assert!(report.is_ok(), "round {round}: {:?}", report.problems);
        }
    }
    for (snap, m) in held.drain(..) {
        assert_same(&snap, &m, &mut rng, space);
    }
    assert_same(&s.begin_read().unwrap(), &model, &mut rng, space);
    assert!(buffered_seen > 0, "no commit was buffered");
    steps += s.stats().apply_steps;
    s.close().unwrap();
    let s = Storage::open(&path, opts(buffer)).unwrap();
    assert_eq!(
        s.stats().buffer_entries,
        0,
        "a clean close applies the buffer"
    );
    assert_same(&s.begin_read().unwrap(), &model, &mut rng, space);
    steps
}

#[test]
fn a_small_buffer_applied_often_matches_the_model() {
    assert_eq!(run(1, 200, 400, 16 << 10, 0), 0, "whole applies only");
}

#[test]
fn a_large_buffer_applied_at_flushes_and_closes_matches_the_model() {
    run(2, 200, 2_000, 64 << 20, 0);
}

/// Applies in steps of 2 pages over a tree of some 20 leaves: each full or aged buffer is
/// applied a key range at a time, sweeping, with the rest carried in the step's record, while
/// snapshots are held across steps and the storage is reopened from journals holding them.
#[test]
fn apply_steps_of_a_few_pages_match_the_model() {
    let steps = run(3, 300, 3_000, 16 << 10, 2);
    assert!(steps >= 20, "only {steps} apply steps");
}

/// Buffered commits journal no page: 500 one-key commits into an empty buffer leave the tree
/// and the data file as they were, and the keys are read from the buffer.
#[test]
fn buffered_commits_journal_operations_not_pages() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path().join("s"), opts(64 << 20)).unwrap();
    let before = s.stats();
    for i in 0..500u32 {
        let mut w = s.begin_write().unwrap();
        w.put(format!("key{i:05}"), [i as u8; 40]).unwrap();
        w.commit().unwrap();
    }
    let after = s.stats();
    assert_eq!(
        after.pages_journaled, before.pages_journaled,
        "pages journaled"
    );
    assert_eq!(after.buffer_entries, 500);
    assert_eq!(after.entries, 500);
    assert_eq!(
        s.begin_read().unwrap().get("key00042").unwrap(),
        Some(&[42u8; 40][..])
    );
    s.flush().unwrap();
    let flushed = s.stats();
    assert_eq!(
        flushed.buffer_entries, 0,
        "an explicit flush applies the buffer"
    );
    assert!(flushed.pages_journaled > 0);
    assert_eq!(flushed.entries, 500);
}

/// A backup, or a close, while the calling thread holds a write transaction of a storage with
/// buffered entries waited forever for the writer (applying the buffer needed it): a backup
/// now copies the buffered entries without the writer (not the open transaction's), and a
/// close leaves the entries in the journal, where the next open finds them.
#[test]
fn backup_and_close_with_an_open_write_transaction_do_not_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts(64 << 20)).unwrap();
    for i in 0..10u32 {
        let mut w = s.begin_write().unwrap();
        w.put(format!("k{i}"), "v").unwrap();
        w.commit().unwrap();
    }
    let mut open = s.begin_write().unwrap();
    open.put("uncommitted", "x").unwrap();
    let report = s.backup(dir.path().join("copy")).unwrap();
    assert_eq!(report.entries, 10);
    let copy = Storage::open(dir.path().join("copy"), opts(0)).unwrap();
    assert_eq!(copy.begin_read().unwrap().len(), 10);
    assert!(copy
        .begin_read()
        .unwrap()
        .get("uncommitted")
        .unwrap()
        .is_none());
    drop(copy);
    s.close().unwrap();
    drop(open);
    let s = Storage::open(&path, opts(64 << 20)).unwrap();
    assert_eq!(
        s.stats().buffer_entries,
        10,
        "the entries came back from the journal"
    );
    assert_eq!(s.begin_read().unwrap().len(), 10);
    assert!(s
        .begin_read()
        .unwrap()
        .get("uncommitted")
        .unwrap()
        .is_none());
}

/// Dropping the last handle of a buffered storage left its buffer in the journal: 400
/// open-commit-drop rounds kept 400 journal files (1.6 GB for 80,000 small keys). A drop now
/// applies the buffer as a close does.
#[test]
fn dropping_a_buffered_storage_applies_its_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    for round in 0..3u32 {
        let s = Storage::open(&path, opts(64 << 20)).unwrap();
        for i in 0..10u32 {
            let mut w = s.begin_write().unwrap();
            w.put(format!("k{round}-{i}"), "v").unwrap();
            w.commit().unwrap();
        }
        assert_eq!(s.stats().buffer_entries, 10);
        drop(s);
        let s = Storage::open(&path, opts(64 << 20)).unwrap();
        let st = s.stats();
        assert_eq!(
            st.buffer_entries, 0,
            "round {round}: the drop applied the buffer"
        );
        assert_eq!(st.entries, 10 * (round as u64 + 1));
        assert_eq!(st.last_flushed_txn, st.last_committed_txn, "round {round}");
    }
}

/// A read-only open cannot apply buffered entries put back from the journal, and needs not:
/// its backup copies the tree and writes the buffered entries (a put, an overwrite of a tree
/// key, a delete of one) into the copy's journal as one record of the state's txn, so the
/// copy opens with the same contents and txn id, passes `check`, and applies them at its
/// first commit. (A read-only backup of buffered entries failed with `ReadOnly`.)
#[test]
fn a_read_only_backup_copies_buffered_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts(0)).unwrap();
    let mut w = s.begin_write().unwrap();
    for i in 0..500u32 {
        w.put(format!("t{i:04}"), format!("tree {i}")).unwrap();
    }
    w.commit().unwrap();
    drop(s);
    let s = Storage::open(&path, kept(64 << 20)).unwrap();
    for (k, v) in [("k", Some("v")), ("t0007", Some("new")), ("t0100", None)] {
        let mut w = s.begin_write().unwrap();
        match v {
            Some(v) => w.put(k, v).unwrap(),
            None => assert!(w.delete(k).unwrap()),
        }
        w.commit().unwrap();
    }
    let txn = s.stats().last_committed_txn;
    drop(s);
    let ro = Storage::open(
        &path,
        Options {
            read_only: true,
            ..opts(0)
        },
    )
    .unwrap();
    assert_eq!(ro.stats().buffer_entries, 3);
    let want = model_of(&ro.begin_read().unwrap());
    let report = ro.backup(dir.path().join("copy")).unwrap();
    assert_eq!(report.txn_id, txn);
    assert_eq!(report.entries, 500);
    let copy = Storage::open(dir.path().join("copy"), opts(0)).unwrap();
    let st = copy.stats();
    assert_eq!(st.last_committed_txn, txn, "{st:?}");
    assert_eq!(st.buffer_entries, 3, "{st:?}");
    assert_eq!(model_of(&copy.begin_read().unwrap()), want);
    assert!(copy.check().unwrap().is_ok());
    let mut w = copy.begin_write().unwrap();
    w.put("after", "a").unwrap();
    w.commit().unwrap();
    assert_eq!(
        copy.stats().buffer_entries,
        0,
        "applied by the first commit"
    );
    drop(copy);
    let copy = Storage::open(dir.path().join("copy"), opts(0)).unwrap();
    let mut want = want;
    want.insert(b"after".to_vec(), b"a".to_vec());
    assert_eq!(model_of(&copy.begin_read().unwrap()), want);
}

/// A buffer sized at run time: turned on for an open storage, its bytes counted by the process
/// count, and turned off again, after which the next commit applies what is buffered.
#[test]
fn a_buffer_resized_at_run_time_buffers_then_applies() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path().join("s"), opts(0)).unwrap();
    let put = |k: &str| {
        let mut w = s.begin_write().unwrap();
        w.put(k, "v").unwrap();
        w.commit().unwrap();
    };
    put("a");
    assert_eq!(s.stats().buffer_entries, 0, "no buffer at open");
    s.set_write_buffer_bytes(1 << 20);
    assert_eq!(s.write_buffer_bytes(), 1 << 20);
    put("b");
    put("c");
    let st = s.stats();
    assert_eq!(st.buffer_entries, 2, "buffered once turned on: {st:?}");
    assert!(
        omnibus::live_buffer_bytes() >= st.buffer_bytes && st.buffer_bytes > 0,
        "the process counts this storage's buffer"
    );
    s.set_write_buffer_bytes(0);
    put("d");
    assert_eq!(
        s.stats().buffer_entries,
        0,
        "turned off: the commit applied it"
    );
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), 4);
    for k in ["a", "b", "c", "d"] {
        assert_eq!(r.get(k).unwrap(), Some(&b"v"[..]), "{k}");
    }
}

/// Journal files holding logical records are kept until those records are applied and the
/// applied pages flushed: flushes while entries stay buffered (a write transaction is open, so
/// they flush pages only) release no file that a buffered entry still needs, and a reopen
/// after a drop without a closing flush finds every entry. (A flush that recorded its target's
/// txn instead of its last page commit let the files go, and the entries were lost.)
#[test]
fn journal_files_with_buffered_entries_outlive_flushes_until_applied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    // An hour of age: the 3,000 synced commits below take longer than the default 5 s on a
    // loaded machine, and a commit that finds the buffer aged applies it.
    let o = Options {
        journal_file_size: 64 << 10,
        flush_max_age: std::time::Duration::from_secs(3600),
        ..kept(64 << 20)
    };
    let s = Storage::open(&path, o.clone()).unwrap();
    // A page commit first (an empty buffer takes a direct transaction of DIRECT_OPS keys), so
    // the tree and its flushed header are not empty.
    let mut w = s.begin_write().unwrap();
    for i in 0..5000u32 {
        w.put(format!("base{i:05}"), "b").unwrap();
    }
    w.commit().unwrap();
    s.flush().unwrap();
    // Then buffered commits over several journal files, with flushes in between that leave
    // the buffer as it is.
    let mut model = BTreeMap::new();
    for i in 0..3000u32 {
        let mut w = s.begin_write().unwrap();
        let (k, v) = (
            format!("key{i:05}"),
            format!("value {i} {}", "x".repeat(40)),
        );
        w.put(&k, &v).unwrap();
        w.commit().unwrap();
        model.insert(k.into_bytes(), v.into_bytes());
        if i % 500 == 499 {
            let r = flush_pages_only(&s);
            assert!(r.flushed_txn < s.stats().last_committed_txn, "{r:?}");
        }
    }
    let st = s.stats();
    assert_eq!(st.buffer_entries, 3000, "{st:?}");
    assert!(st.journal_files >= 3, "the records span files: {st:?}");
    s.sync_journal().unwrap();
    drop(s);
    let s = Storage::open(&path, o).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), 8000);
    for (k, v) in &model {
        assert_eq!(
            r.get(k).unwrap(),
            Some(&v[..]),
            "{}",
            String::from_utf8_lossy(k)
        );
    }
    drop(r);
    assert_eq!(s.stats().buffer_entries, 3000, "back from the journal");
}

/// `Storage::flush` with a write transaction open: the buffer cannot be applied (that needs
/// the writer), so only the pages are flushed.
fn flush_pages_only(s: &Storage) -> omnibus::FlushReport {
    let open = s.begin_write().unwrap();
    let r = s.flush().unwrap();
    drop(open);
    r
}

/// Opens the storage at `path` with `o`, applying in steps of `step` pages, with 5,000 keys
/// `k000000`.. in its flushed tree (the same form as [`key`]'s); returns it and its model.
fn stepping(path: &std::path::Path, o: Options, step: u64) -> (Storage, Model) {
    let s = Storage::open(path, o).unwrap();
    s.set_apply_step_pages(step);
    let mut model = Model::new();
    let mut w = s.begin_write().unwrap();
    for i in 0..5000u32 {
        let k = format!("k{i:06}").into_bytes();
        w.put(&k, b"base").unwrap();
        model.insert(k, b"base".to_vec());
    }
    w.commit().unwrap();
    s.flush().unwrap();
    (s, model)
}

/// Commits one put of a random key among 10,000 and records it in `model`.
fn put_one(s: &Storage, model: &mut Model, rng: &mut SmallRng) {
    let (k, v) = (key(rng, 10_000), value(rng));
    let mut w = s.begin_write().unwrap();
    w.put(&k, &v).unwrap();
    w.commit().unwrap();
    model.insert(k, v);
}

/// An apply step's pages flushed without the entries it carried: the header records the step's
/// page txn, one below the state's, so the reopen reads the step's record again and puts back
/// exactly the entries it left buffered (and every later one), over a tree that holds the rest.
#[test]
fn a_flushed_apply_step_still_gives_back_the_entries_it_carried() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let o = kept(16 << 10);
    let (s, mut model) = stepping(&path, o.clone(), 2);
    // Scattered one-key commits until one of them is a step that leaves entries buffered.
    let mut rng = SmallRng::seed_from_u64(4);
    let mut stepped = false;
    for _ in 0..20_000 {
        let before = s.stats().apply_steps;
        put_one(&s, &mut model, &mut rng);
        let st = s.stats();
        if st.apply_steps > before && st.buffer_entries > 0 {
            stepped = true;
            break;
        }
    }
    assert!(stepped, "no apply step left entries buffered");
    let carried = s.stats().buffer_entries;
    // A flush while a writer is open flushes pages only: the step's pages, not its buffer.
    let r = flush_pages_only(&s);
    assert_eq!(r.flushed_txn + 1, s.stats().last_committed_txn, "{r:?}");
    s.sync_journal().unwrap();
    drop(s);
    let s = Storage::open(&path, o).unwrap();
    assert_eq!(
        s.stats().buffer_entries,
        carried,
        "the carried entries are back"
    );
    assert_same(&s.begin_read().unwrap(), &model, &mut rng, 10_000);
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// In a storage that applies in steps, a commit that finds its buffer aged but not full takes
/// a step of no pages: its record journals the buffer anew (so the buffer pins no older
/// journal file: a flush lets those go) and the entries keep gathering for their leaves.
#[test]
fn an_aged_buffer_in_steps_is_journaled_anew_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let o = Options {
        flush_max_age: std::time::Duration::from_millis(1),
        journal_file_size: 64 << 10,
        ..kept(16 << 20)
    };
    let (s, mut model) = stepping(&path, o.clone(), 64);
    let base = s.stats();
    let mut rng = SmallRng::seed_from_u64(5);
    for _ in 0..400 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        put_one(&s, &mut model, &mut rng);
    }
    let st = s.stats();
    assert!(st.apply_steps >= 100, "{st:?}");
    assert!(st.buffer_entries >= 350, "nothing applied: {st:?}");
    assert_eq!(
        st.pages_journaled, base.pages_journaled,
        "no page journaled: {st:?}"
    );
    // A flush while a writer is open flushes pages only, and lets every journal file before
    // the last step go.
    flush_pages_only(&s);
    assert!(s.stats().journal_files <= 3, "{:?}", s.stats());
    s.sync_journal().unwrap();
    drop(s);
    let s = Storage::open(&path, o).unwrap();
    assert_same(&s.begin_read().unwrap(), &model, &mut rng, 10_000);
    assert_eq!(s.stats().buffer_entries, st.buffer_entries);
}

/// Steps of one page over commits that each add more entries than such a step applies: the
/// buffer stays within its size plus one commit's operations (steps of `n` pages went on
/// carrying the rest, and the buffer, and every step record journaling it, grew without bound).
#[test]
fn small_steps_keep_the_buffer_within_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (s, mut model) = stepping(&path, opts(16 << 10), 1);
    let mut rng = SmallRng::seed_from_u64(6);
    let mut most = 0u64;
    for _ in 0..300 {
        let mut w = s.begin_write().unwrap();
        for _ in 0..20 {
            let (k, v) = (key(&mut rng, 100_000), vec![7u8; 100]);
            w.put(&k, &v).unwrap();
            model.insert(k, v);
        }
        w.commit().unwrap();
        most = most.max(s.stats().buffer_bytes);
    }
    let st = s.stats();
    assert!(st.apply_steps > 50, "{st:?}");
    assert!(
        most <= (16 << 10) + 20 * 200,
        "the buffer reached {most} bytes: {st:?}"
    );
    assert_same(&s.begin_read().unwrap(), &model, &mut rng, 100_000);
}

/// A damaged leaf met while a range merges buffered entries over the tree ends the range with
/// one error, from either end, and never yields entries past it as if the leaf were empty.
#[test]
fn a_damaged_leaf_under_buffered_entries_ends_a_range_with_one_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let k = |i: u32| format!("key{i:06}");
    {
        let s = Storage::open(&path, opts(1 << 20)).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..5_000 {
            w.put(k(i), [7u8; 100]).unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
        s.flush().unwrap();
    }
    // Damage the leaf in the middle of the data file's leaves.
    let data = path.join("data.pages");
    let mut bytes = std::fs::read(&data).unwrap();
    let leaves: Vec<usize> = (2..bytes.len() / 8192)
        .filter(|p| bytes[p * 8192 + 4] == 3)
        .collect();
    assert!(leaves.len() > 10, "{} leaves", leaves.len());
    let p = leaves[leaves.len() / 2];
    bytes[p * 8192 + 4000] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();

    let s = Storage::open(&path, opts(1 << 20)).unwrap();
    let mut w = s.begin_write().unwrap();
    for i in (1..5_000).step_by(7) {
        w.put(format!("key{i:06}x"), "buffered").unwrap();
    }
    w.commit().unwrap();
    assert!(s.stats().buffer_entries > 0);
    let r = s.begin_read().unwrap();
    for back in [false, true] {
        let mut it = r.iter().unwrap();
        let mut seen = 0usize;
        let mut errors = 0usize;
        // Bounded: 5,714 entries at most, then the end.
        loop {
            let item = if back { it.next_back() } else { it.next() };
            match item {
                Some(Ok(_)) => seen += 1,
                Some(Err(omnibus::Error::Corruption(_))) => errors += 1,
                Some(Err(e)) => panic!("{e:?}"),
                None => break,
            }
            assert!(seen + errors <= 5_714 + 1);
        }
        assert_eq!(errors, 1, "back {back}");
        assert!(
            seen < 5_714,
            "back {back}: {seen} entries, the damaged leaf's among them"
        );
        assert!(it.next().is_none() && it.next_back().is_none());
    }
}

/// Every entry a snapshot reads, in key order.
fn model_of(r: &ReadTransaction) -> Model {
    r.iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}
