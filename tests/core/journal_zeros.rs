//! A journal of N records followed by 4 MiB of pre-zeroed tail recovers exactly N records
//! (no run of zeros parses as a record, design.md invariant I8), and later commits come after them.

use omnibus::testing::journal::recovery;
use omnibus::testing::journal::RecordKind;
use omnibus::{FlushMode, Options, Prezero, Storage};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        journal_prezero: Prezero::Ahead(4 << 20),
        // Page commits: the records counted are one per commit.
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

fn journal_records(path: &std::path::Path) -> (usize, Vec<(u64, u64)>) {
    let env = omnibus::env::DefaultEnv::new();
    let mut commits = 0;
    let mut ends = Vec::new();
    for (no, p) in recovery::list(&env, &path.join("Journals")).unwrap() {
        let end = recovery::scan(&env, &p, no, &[], |h, _, _| {
            if h.kind == RecordKind::Commit {
                commits += 1;
            }
            Ok(())
        })
        .unwrap();
        let len = std::fs::metadata(&p).unwrap().len();
        let bytes = std::fs::read(&p).unwrap();
        assert!(
            bytes[end.offset as usize..].iter().all(|&b| b == 0),
            "tail of {} is not zeros",
            p.display()
        );
        ends.push((end.offset, len));
    }
    (commits, ends)
}

#[test]
fn n_records_then_zeros_recover_n() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    const N: u32 = 137;
    {
        let s = Storage::open(&path, opts()).unwrap();
        for i in 0..N {
            let mut w = s.begin_write().unwrap();
            w.put(format!("k{i:04}"), format!("v{i}")).unwrap();
            w.commit().unwrap();
        }
    }
    let (commits, ends) = journal_records(&path);
    assert_eq!(commits, N as usize);
    let (end, len) = *ends.last().unwrap();
    assert!(
        len - end >= 2 << 20,
        "the writer keeps at least half its 4 MiB window zeroed ({end} of {len})"
    );
    // Make it exactly the scenario: N records followed by 4 MiB of zeros.
    let last = recovery::list(&omnibus::env::DefaultEnv::new(), &path.join("Journals"))
        .unwrap()
        .pop()
        .unwrap()
        .1;
    let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    f.set_len(end + (4 << 20)).unwrap();
    drop(f);
    let (again, _) = journal_records(&path);
    assert_eq!(again, N as usize);
    {
        let s = Storage::open(&path, opts()).unwrap();
        let r = s.begin_read().unwrap();
        assert_eq!(r.txn_id(), N as u64);
        assert_eq!(r.len(), N as u64);
        drop(r);
        for i in N..N + 10 {
            let mut w = s.begin_write().unwrap();
            w.put(format!("k{i:04}"), format!("v{i}")).unwrap();
            w.commit().unwrap();
        }
        assert_eq!(s.stats().last_committed_txn, N as u64 + 10);
    }
    let s = Storage::open(&path, opts()).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), N as u64 + 10);
    for i in 0..N + 10 {
        assert_eq!(
            r.get(format!("k{i:04}")).unwrap(),
            Some(format!("v{i}").as_bytes())
        );
    }
    assert!(s.check().unwrap().is_ok());
}
