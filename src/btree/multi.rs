//! MultiGet: many point lookups in one snapshot, walking the tree one level at a time for all
//! keys, so that the pages of a level missing from the page cache are read together
//! (`env::page_reads`, design.md section 15).

use crate::env::page_reads::{self, PageRead};
use crate::error::Result;
use crate::page::node::{BranchView, LeafView, ValRef};
use crate::page::{check_image, overflow_run_pages, PageHeader, PageKind};
use crate::state::State;

use super::{corrupt, value, MAX_DEPTH};

/// Overflow runs longer than this are not read ahead: their map pages fault in as a `get`'s
/// do (a value of up to 128 MiB is not copied into a buffer only to be read again).
pub const MAX_READ_AHEAD_RUN: usize = 128; // pages: 1 MiB

/// Looks up every key of `keys` in the tree of `state`: the values in the caller's order,
/// duplicates answered each, equal to [`super::get`] for every key.
///
/// Level by level: the distinct pages the keys reach at one depth are made resident at once
/// ([`prefetch`]), then each key steps through its page as `get` does. Overflow runs are the
/// last level.
///
/// Errors: [`crate::Error::Corruption`] when a page on some key's path fails its checks (as
/// `get` for that key); [`crate::Error::Io`] when reading a page failed.
pub(crate) fn multi_get<'a, K: AsRef<[u8]>>(
    state: &'a State,
    keys: &[K],
) -> Result<Vec<Option<&'a [u8]>>> {
    let mut out: Vec<Option<&'a [u8]>> = vec![None; keys.len()];
    if state.root == 0 || keys.is_empty() {
        return Ok(out);
    }
    // `at[i]`: the page key `i` is at; `live`: the keys still descending.
    let mut at = vec![state.root; keys.len()];
    let mut live: Vec<usize> = (0..keys.len()).collect();
    let mut overflow: Vec<(usize, u64, u64)> = Vec::new();
    let mut spans: Vec<(u64, usize)> = Vec::with_capacity(keys.len());
    for _ in 0..MAX_DEPTH {
        if live.is_empty() {
            break;
        }
        spans.clear();
        spans.extend(live.iter().map(|&i| (at[i], 1)));
        prefetch(state, &mut spans)?;
        let mut kept = 0;
        for n in 0..live.len() {
            let i = live[n];
            let p = at[i];
            let key = keys[i].as_ref();
            let (img, h) = state.page(p)?;
            match h.kind {
                PageKind::Branch => {
                    let v = BranchView::new(img, &h);
                    at[i] = v
                        .child_index(key)
                        .and_then(|c| v.child(c))
                        .ok_or_else(|| corrupt(state, p, "malformed branch page"))?;
                    live[kept] = i;
                    kept += 1;
                }
                PageKind::Leaf => {
                    let v = LeafView::new(img, &h);
                    match v.search(key) {
                        None => return Err(corrupt(state, p, "malformed leaf page")),
                        Some(Err(_)) => {}
                        Some(Ok(c)) => {
                            let (_, val) = v
                                .cell(c)
                                .ok_or_else(|| corrupt(state, p, "malformed leaf cell"))?;
                            match val {
                                ValRef::Inline(b) => out[i] = Some(b),
                                ValRef::Overflow { page, len } => overflow.push((i, page, len)),
                            }
                        }
                    }
                }
                _ => return Err(corrupt(state, p, "expected a branch or leaf page")),
            }
        }
        live.truncate(kept);
    }
    if let Some(&i) = live.first() {
        return Err(corrupt(state, at[i], "tree deeper than 32 levels"));
    }
    if !overflow.is_empty() {
        spans.clear();
        spans.extend(
            overflow
                .iter()
                .map(|&(_, page, len)| (page, overflow_run_pages(len as usize)))
                .filter(|&(_, pages)| pages <= MAX_READ_AHEAD_RUN),
        );
        prefetch(state, &mut spans)?;
        for (i, page, len) in overflow {
            out[i] = Some(value(state, ValRef::Overflow { page, len })?);
        }
    }
    Ok(out)
}

/// Makes the pages of `spans` (`(first page, pages)`, any order, duplicates allowed) that are
/// neither in the scratch table nor in the page cache resident: reads them all at once
/// ([`page_reads::read_pages`]) and checks each image read, marking it verified. Pages out of
/// the map's range are left to [`State::page`], which reports them.
///
/// Errors: the reads' ([`page_reads::read_pages`]); [`crate::Error::Corruption`] naming the
/// page whose image fails its checks.
pub(crate) fn prefetch(state: &State, spans: &mut Vec<(u64, usize)>) -> Result<()> {
    let m = &state.mapping;
    let hints = &m.read_hints;
    if !hints.should_check() {
        return Ok(());
    }
    spans.sort_unstable();
    spans.dedup_by_key(|s| s.0);
    let mut misses: Vec<PageRead> = Vec::new();
    let mut resident = 0u32;
    for &(p, pages) in spans.iter() {
        if state.scratch.contains_key(&p) {
            continue;
        }
        let Some(span) = m.span(p, pages as u64) else {
            continue;
        };
        if page_reads::is_resident(span) {
            resident = resident.saturating_add(1);
        } else {
            misses.push(PageRead::new(p, pages));
        }
    }
    hints.record(resident, !misses.is_empty());
    if misses.is_empty() {
        return Ok(());
    }
    page_reads::read_pages(m.file().raw_fd(), m.path(), hints, &mut misses)?;
    for r in &misses {
        // An overflow run whose header claims another length is left to the map's read
        // (`value` reports what is wrong with it, as `get` does).
        if PageHeader::read(&r.buf).is_some_and(|h| h.run_pages as usize * crate::page::PAGE_SIZE != r.buf.len()) {
            continue;
        }
        check_image(&r.buf, r.page, m.path())?;
        m.mark_verified(r.page);
    }
    Ok(())
}
