//! Which leaf of a committed tree each key of a sorted list lands in: the grouping an apply
//! step ranks its work by (design.md section 16, "Apply steps").
//!
//! One walk, as a cursor's: a stack of the branches from the root to the current leaf, each
//! with the upper bound of its key range (the separator after it in its parent, inherited from
//! the parent for a last child). A key below the current leaf's bound lands in the same leaf (one
//! comparison); a key past it pops the levels whose range it left and descends from the first
//! that holds it. So keys that share leaves cost a comparison each, and each new leaf costs the
//! levels below its nearest common ancestor with the previous one.

use crate::error::{Error, Result};
use crate::page::node::BranchView;
use crate::page::PageKind;
use crate::state::State;

use super::MAX_DEPTH;

/// One level of the walk: a branch's page, and the exclusive upper bound of its key range
/// (`None`: unbounded, the tree's last node at its level).
struct Level<'a> {
    page: u64,
    upper: Option<&'a [u8]>,
}

/// The lengths of the runs of consecutive `keys` (strictly increasing) that land in one leaf of
/// `state`'s tree, in key order: they add up to the keys' count. An empty tree is one leaf (its
/// first commit's), so all keys are one run.
///
/// Errors: [`Error::Corruption`] for a damaged or malformed branch page on the way (the leaves
/// themselves are not read).
pub(crate) fn leaf_runs<'k>(
    state: &State,
    keys: impl IntoIterator<Item = &'k [u8]>,
) -> Result<Vec<u32>> {
    let mut runs: Vec<u32> = Vec::new();
    let mut stack: Vec<Level<'_>> = Vec::new();
    // The current leaf's upper bound; `None` before the first key.
    let mut leaf: Option<Option<&[u8]>> = None;
    for k in keys {
        if let (Some(upper), Some(n)) = (leaf, runs.last_mut()) {
            if upper.is_none_or(|u| k < u) {
                *n += 1;
                continue;
            }
        }
        // Leave the levels whose range ends at or before `k`; the root's never does.
        while stack
            .last()
            .is_some_and(|l| l.upper.is_some_and(|u| k >= u))
        {
            stack.pop();
        }
        leaf = Some(descend(state, &mut stack, k)?);
        runs.push(1);
    }
    Ok(runs)
}

/// Descends from the deepest level on `stack` (from the root when it is empty) to the leaf
/// holding `k`, pushing the branches passed (that level again among them); returns the
/// leaf's upper bound.
fn descend<'a>(state: &'a State, stack: &mut Vec<Level<'a>>, k: &[u8]) -> Result<Option<&'a [u8]>> {
    let corrupt = |p: u64, what: &str| Error::corruption(state.path(), Some(p), None, what);
    // The deepest level left holds `k`: descend again from it (from the root when none is).
    let (mut p, mut upper) = match stack.pop() {
        Some(l) => (l.page, l.upper),
        None if state.root == 0 => return Ok(None),
        None => (state.root, None),
    };
    // Bounded: a tree is at most MAX_DEPTH levels deep.
    for _ in 0..MAX_DEPTH {
        let (img, h) = state.page(p)?;
        match h.kind {
            PageKind::Leaf => return Ok(upper),
            PageKind::Branch => {
                let branch = BranchView::new(img, &h);
                let i = branch
                    .child_index(k)
                    .ok_or_else(|| corrupt(p, "malformed branch page"))?;
                let child = branch
                    .child(i)
                    .ok_or_else(|| corrupt(p, "malformed branch page"))?;
                let bound = if i < branch.keys() {
                    branch.key(i)
                } else {
                    upper
                };
                stack.push(Level { page: p, upper });
                p = child;
                upper = bound;
            }
            _ => return Err(corrupt(p, "expected a branch or leaf page")),
        }
    }
    Err(corrupt(p, "tree deeper than 32 levels"))
}

#[cfg(test)]
mod tests {
    use crate::page::node::{BranchView, LeafView};
    use crate::page::PageKind;
    use crate::state::State;
    use crate::{FlushMode, Options, Storage};

    /// Each leaf's lower bound (the separator that leads to it; empty for the first), in key
    /// order, from a walk of every branch.
    fn leaf_lower_bounds(st: &State, p: u64, lower: &[u8], out: &mut Vec<Vec<u8>>) {
        let (img, h) = st.page(p).unwrap();
        match h.kind {
            PageKind::Leaf => {
                assert!(LeafView::new(img, &h).len() > 0);
                out.push(lower.to_vec());
            }
            PageKind::Branch => {
                let b = BranchView::new(img, &h);
                for i in 0..=b.keys() {
                    let lo = if i == 0 { lower } else { b.key(i - 1).unwrap() };
                    leaf_lower_bounds(st, b.child(i).unwrap(), lo, out);
                }
            }
            k => panic!("{k:?}"),
        }
    }

    /// The runs match the tree's leaves: every key of a run lies in one leaf's key range, and
    /// consecutive runs lie in different leaves.
    #[test]
    fn runs_follow_the_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let o = Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        };
        let s = Storage::open(dir.path().join("s"), o).unwrap();
        {
            let r = s.begin_read().unwrap();
            let keys: Vec<Vec<u8>> = (0..50u32).map(|i| i.to_be_bytes().to_vec()).collect();
            let runs = super::leaf_runs(r.state_for_tests(), keys.iter().map(|k| &k[..])).unwrap();
            assert_eq!(runs, vec![50], "an empty tree is one leaf");
        }
        let mut w = s.begin_write().unwrap();
        for i in 0..20_000u32 {
            w.put(format!("k{:08}", i * 2), [b'v'; 60]).unwrap();
        }
        w.commit().unwrap();
        let r = s.begin_read().unwrap();
        let st = r.state_for_tests();
        let mut lowers = Vec::new();
        leaf_lower_bounds(st, st.root, b"", &mut lowers);
        assert!(lowers.len() > 100, "{} leaves", lowers.len());
        let leaf_of = |k: &[u8]| lowers.partition_point(|l| l.as_slice() <= k) - 1;
        // Keys between the stored ones, a few per leaf, and keys past both ends.
        let mut keys: Vec<Vec<u8>> = vec![b"a".to_vec()];
        keys.extend(
            (0..20_000u32)
                .step_by(7)
                .map(|i| format!("k{:08}", i * 2 + 1).into_bytes()),
        );
        keys.push(b"z".to_vec());
        let runs = super::leaf_runs(st, keys.iter().map(|k| &k[..])).unwrap();
        assert_eq!(runs.iter().map(|&n| n as usize).sum::<usize>(), keys.len());
        let mut at = 0;
        let mut last_leaf = None;
        for n in &runs {
            let l = leaf_of(&keys[at]);
            assert_ne!(Some(l), last_leaf, "two runs in one leaf at key {at}");
            for k in &keys[at..at + *n as usize] {
                assert_eq!(leaf_of(k), l, "key {k:?} in a run of leaf {l}");
            }
            last_leaf = Some(l);
            at += *n as usize;
        }
        assert!(runs.len() > 100, "{} runs", runs.len());
    }
}
