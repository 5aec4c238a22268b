//! For tests that give omnibus someone else's files: a snapshot of a directory tree (to check
//! that a command or an open changed nothing) and reproducible junk bytes.

use std::collections::BTreeMap;
use std::path::Path;

/// Every file under `dir` (relative path) with its bytes; directories as entries ending in `/`
/// with no bytes.
#[allow(dead_code)] // not every user needs it
pub fn tree(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<String, Option<Vec<u8>>>) {
        for e in std::fs::read_dir(d).expect("read_dir") {
            let p = e.expect("dir entry").path();
            let rel = p
                .strip_prefix(root)
                .expect("under root")
                .display()
                .to_string();
            if p.is_dir() {
                out.insert(rel + "/", None);
                walk(root, &p, out);
            } else {
                out.insert(rel, Some(std::fs::read(&p).expect("read")));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// `len` reproducible pseudo-random bytes (xorshift64 from `seed`, non-zero): someone else's
/// file for the tests of foreign directories.
#[allow(dead_code)] // not every user needs it
pub fn junk(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
