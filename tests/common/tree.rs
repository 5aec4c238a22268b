//! A snapshot of a directory tree, for tests that check a command or an open changed nothing.

use std::collections::BTreeMap;
use std::path::Path;

/// Every file under `dir` (relative path) with its bytes; directories as entries ending in `/`
/// with no bytes.
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
