//! Model test (proptest): ordered reads and range deletes against a `BTreeMap`.
//!
//! Each case bulk-loads a tree of up to ~1,500 keys (long keys, so the larger trees have three
//! levels; some values in overflow runs), then runs random puts, deletes, `delete_range`,
//! `clear`, commits and aborts. Queries (`range` walked from both ends in a random pattern of
//! `next`/`next_back`, `first`, `last`, `prefix`, `len`, `iter().rev()`) run against the write
//! transaction (its uncommitted writes included) and against a snapshot of the last commit,
//! each compared with its model. Every commit is followed by `check`, and the case ends with a
//! reopen.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

use omnibus::{Options, Range, Storage};
use proptest::prelude::*;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Keys in the key space: numeric keys of varied lengths (long ones keep branches narrow, so
/// small trees are deep), and a few starting with 0xFF bytes (prefix ends past 0xFF).
const KEYS: u16 = 1850;

fn key(i: u16) -> Vec<u8> {
    if i >= 1800 {
        return vec![0xFF, 0xFF, (i - 1800) as u8];
    }
    let pad = [0usize, 40, 300, 900][(i % 4) as usize];
    let mut k = format!("{i:04}-").into_bytes();
    k.extend(std::iter::repeat_n(b'p', pad));
    k
}

fn value(i: u16, kind: u8) -> Vec<u8> {
    let len = match kind % 10 {
        0 => 3000 + (i as usize * 7) % 9000, // an overflow run
        1..=3 => 0,
        _ => (i as usize * 13) % 120,
    };
    (0..len).map(|j| (j as u8).wrapping_add(kind)).collect()
}

#[derive(Debug, Clone)]
enum B {
    In(u16),
    Ex(u16),
    /// A bound between keys: a key's first `n` bytes.
    Cut(u16, u8),
    Un,
}

fn bound(b: &B) -> Bound<Vec<u8>> {
    match b {
        B::In(i) => Bound::Included(key(*i)),
        B::Ex(i) => Bound::Excluded(key(*i)),
        B::Cut(i, n) => {
            let k = key(*i);
            let n = (*n as usize).min(k.len());
            Bound::Included(k[..n].to_vec())
        }
        B::Un => Bound::Unbounded,
    }
}

fn refs(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    b.as_ref().map(|k| k.as_slice())
}

fn in_bounds(k: &[u8], s: Bound<&[u8]>, e: Bound<&[u8]>) -> bool {
    let lo = match s {
        Bound::Included(s) => k >= s,
        Bound::Excluded(s) => k > s,
        Bound::Unbounded => true,
    };
    let hi = match e {
        Bound::Included(e) => k <= e,
        Bound::Excluded(e) => k < e,
        Bound::Unbounded => true,
    };
    lo && hi
}

#[derive(Debug, Clone)]
enum Query {
    /// A range walked with `next` (true) or `next_back` (false) per step.
    Range(B, B, Vec<bool>),
    First,
    Last,
    /// The prefix: a key's first `n` bytes.
    Prefix(u16, u8, bool),
    Rev,
}

#[derive(Debug, Clone)]
enum Op {
    Put(u16, u8),
    Delete(u16),
    DeleteRange(B, B),
    Clear,
    Commit,
    Abort,
    /// Checked against the write transaction (true) or the last commit's snapshot (false).
    Query(Query, bool),
}

fn b_strategy() -> impl Strategy<Value = B> {
    prop_oneof![
        3 => (0..KEYS).prop_map(B::In),
        3 => (0..KEYS).prop_map(B::Ex),
        2 => (0..KEYS, 0u8..8).prop_map(|(i, n)| B::Cut(i, n)),
        1 => Just(B::Un),
    ]
}

fn query_strategy() -> impl Strategy<Value = Query> {
    prop_oneof![
        6 => (b_strategy(), b_strategy(), prop::collection::vec(any::<bool>(), 0..80))
            .prop_map(|(s, e, p)| Query::Range(s, e, p)),
        1 => Just(Query::First),
        1 => Just(Query::Last),
        2 => (0..KEYS, 0u8..6, any::<bool>()).prop_map(|(i, n, r)| Query::Prefix(i, n, r)),
        1 => Just(Query::Rev),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0..KEYS, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
        5 => (0..KEYS).prop_map(Op::Delete),
        4 => (b_strategy(), b_strategy()).prop_map(|(s, e)| Op::DeleteRange(s, e)),
        1 => Just(Op::Clear),
        2 => Just(Op::Commit),
        1 => Just(Op::Abort),
        10 => (query_strategy(), any::<bool>()).prop_map(|(q, w)| Op::Query(q, w)),
    ]
}

/// Walks `it` in `pattern` (then to the end from the front) and compares each item with the
/// model's entries in the same order.
fn walk(mut it: Range<'_>, expect: Vec<(&[u8], &[u8])>, pattern: &[bool]) {
    let mut exp: VecDeque<_> = expect.into();
    for (step, &front) in pattern.iter().enumerate() {
        let got = if front { it.next() } else { it.next_back() };
        let want = if front {
            exp.pop_front()
        } else {
            exp.pop_back()
        };
        let got = got.transpose().expect("range step");
        assert_eq!(
            got.map(|(k, v)| (k.to_vec(), v.len(), v)),
            want.map(|(k, v)| (k.to_vec(), v.len(), v)),
            "step {step} ({})",
            if front { "next" } else { "next_back" }
        );
    }
    for (k, v) in exp {
        let (gk, gv) = it.next().expect("range ended early").expect("range step");
        assert_eq!((gk, gv.len()), (k, v.len()));
        assert!(gv == v);
    }
    assert!(it.next().is_none(), "range has extra entries");
    assert!(it.next_back().is_none(), "range has extra entries (back)");
}

fn prefix_of(i: u16, n: u8) -> Vec<u8> {
    let k = key(i);
    k[..(n as usize).min(k.len())].to_vec()
}

/// Runs `q` through `read`'s accessors (the same calls exist on both transaction kinds).
macro_rules! run_query {
    ($t:expr, $model:expr, $q:expr) => {{
        let (t, model, q) = ($t, $model, $q);
        assert_eq!(t.len(), model.len() as u64, "len");
        match q {
            Query::Range(s, e, pattern) => {
                let (s, e) = (bound(s), bound(e));
                let expect: Vec<(&[u8], &[u8])> = model
                    .iter()
                    .filter(|(k, _)| in_bounds(k, refs(&s), refs(&e)))
                    .map(|(k, v)| (k.as_slice(), v.as_slice()))
                    .collect();
                walk(t.range((refs(&s), refs(&e))).unwrap(), expect, pattern);
            }
            Query::First => {
                let got = t.first().unwrap();
                let want = model.iter().next();
                assert_eq!(
                    got.as_ref().map(|(k, v)| (&k[..], &v[..])),
                    want.map(|(k, v)| (&k[..], &v[..])),
                    "first"
                );
            }
            Query::Last => {
                let got = t.last().unwrap();
                let want = model.iter().next_back();
                assert_eq!(
                    got.as_ref().map(|(k, v)| (&k[..], &v[..])),
                    want.map(|(k, v)| (&k[..], &v[..])),
                    "last"
                );
            }
            Query::Prefix(i, n, rev) => {
                let p = prefix_of(*i, *n);
                let mut expect: Vec<(&[u8], &[u8])> = model
                    .iter()
                    .filter(|(k, _)| k.starts_with(&p))
                    .map(|(k, v)| (k.as_slice(), v.as_slice()))
                    .collect();
                let it = t.prefix(&p).unwrap();
                let got: Vec<(&[u8], &[u8])> = if *rev {
                    expect.reverse();
                    it.rev().collect::<omnibus::Result<_>>().unwrap()
                } else {
                    it.collect::<omnibus::Result<_>>().unwrap()
                };
                assert_eq!(got.len(), expect.len(), "prefix {p:?} count");
                assert!(got == expect, "prefix {p:?}");
            }
            Query::Rev => {
                let got: Vec<(&[u8], &[u8])> = t
                    .iter()
                    .unwrap()
                    .rev()
                    .collect::<omnibus::Result<_>>()
                    .unwrap();
                let want: Vec<(&[u8], &[u8])> = model
                    .iter()
                    .rev()
                    .map(|(k, v)| (k.as_slice(), v.as_slice()))
                    .collect();
                assert_eq!(got.len(), want.len(), "rev count");
                assert!(got == want, "rev");
            }
        }
    }};
}

/// `buffer`: the storage's `write_buffer_bytes` (0: none).
fn opts(buffer: u64) -> Options {
    Options {
        flush_scratch_bytes: 4 << 20,
        write_buffer_bytes: buffer,
        ..Options::default()
    }
}

fn assert_checked(s: &Storage) {
    let report = s.check().unwrap();
    assert!(
        report.is_ok(),
        "{:?}",
        &report.problems[..report.problems.len().min(5)]
    );
}

/// Runs `ops` after `initial` against the model. With a write buffer of `buffer` bytes, each
/// commit is buffered, and applied whole or (`step` pages > 0) in steps once the buffer is full,
/// while the snapshot taken at the commit before is still read.
fn run(initial: Vec<(u16, u8)>, ops: Vec<Op>, buffer: u64, step: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts(buffer)).unwrap();
    s.set_apply_step_pages(step);
    let mut model = Model::new();
    let mut w = s.begin_write().unwrap();
    for (k, v) in initial {
        w.put(key(k), value(k, v)).unwrap();
        model.insert(key(k), value(k, v));
    }
    w.commit().unwrap();
    let mut next = model.clone();
    let mut snap = s.begin_read().unwrap();
    let mut w = s.begin_write().unwrap();
    for op in ops {
        match op {
            Op::Put(k, v) => {
                w.put(key(k), value(k, v)).unwrap();
                next.insert(key(k), value(k, v));
            }
            Op::Delete(k) => {
                assert_eq!(w.delete(key(k)).unwrap(), next.remove(&key(k)).is_some());
            }
            Op::DeleteRange(a, b) => {
                let (a, b) = (bound(&a), bound(&b));
                let gone: Vec<Vec<u8>> = next
                    .keys()
                    .filter(|k| in_bounds(k, refs(&a), refs(&b)))
                    .cloned()
                    .collect();
                for k in &gone {
                    next.remove(k);
                }
                let n = w.delete_range((refs(&a), refs(&b))).unwrap();
                assert_eq!(n, gone.len() as u64, "delete_range count");
            }
            Op::Clear => {
                assert_eq!(w.clear().unwrap(), next.len() as u64, "clear count");
                next.clear();
            }
            Op::Commit => {
                w.commit().unwrap();
                model = next.clone();
                assert_checked(&s);
                snap = s.begin_read().unwrap();
                w = s.begin_write().unwrap();
            }
            Op::Abort => {
                w.abort();
                next = model.clone();
                w = s.begin_write().unwrap();
            }
            Op::Query(q, true) => run_query!(&w, &next, &q),
            Op::Query(q, false) => run_query!(&snap, &model, &q),
        }
        // The write transaction's own view, whole, both ways (cheap: in memory).
        assert_eq!(w.len(), next.len() as u64);
    }
    // Everything the last transaction did, read back through its own cursor.
    run_query!(&w, &next, &Query::Rev);
    w.commit().unwrap();
    assert_checked(&s);
    drop(snap);
    drop(s);
    let s = Storage::open(&path, opts(buffer)).unwrap();
    let r = s.begin_read().unwrap();
    run_query!(&r, &next, &Query::Range(B::Un, B::Un, vec![]));
    assert_checked(&s);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn ordered_reads_and_range_deletes_match_a_btreemap(
        initial in prop::collection::vec((0..KEYS, any::<u8>()), 0..1500),
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        run(initial, ops, 0, 0);
    }

    /// The same over a write buffer of 16 KiB (a few dozen entries: most commits apply it),
    /// applied whole or in steps of 1 to 3 pages.
    #[test]
    fn ordered_reads_over_a_write_buffer_match_a_btreemap(
        initial in prop::collection::vec((0..KEYS, any::<u8>()), 0..1500),
        ops in prop::collection::vec(op_strategy(), 1..120),
        step in 0..4u64,
    ) {
        run(initial, ops, 16 << 10, step);
    }
}
