//! MultiGet: many point lookups in one snapshot, walking the tree one level at a time for all
//! keys, so that the pages of a level missing from the page cache are read together
//! (`env::page_reads`, design.md section 15).

use crate::env::page_reads::{self, PageRead};
use crate::error::Result;
use crate::page::node::{BranchView, LeafView, ValRef};
use crate::page::{check_image, overflow_run_pages, PageHeader, PageKind, PAGE_SIZE};
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
    // The keys still descending: (index in `keys`, the page it is at).
    let mut live: Vec<(usize, u64)> = (0..keys.len()).map(|i| (i, state.root)).collect();
    let mut overflow: Vec<(usize, ValRef<'_>)> = Vec::new();
    let mut spans: Vec<(u64, usize)> = Vec::new();
    let hints = &state.mapping.read_hints;
    for _ in 0..MAX_DEPTH {
        if live.is_empty() {
            break;
        }
        let check = hints.pages_to_check();
        if check > 0 {
            spans.clear();
            spans.extend(live.iter().map(|&(_, p)| (p, 1)));
            prefetch(state, &mut spans, check)?;
        }
        let mut kept = 0;
        for n in 0..live.len() {
            let (i, p) = live[n];
            let key = keys[i].as_ref();
            let (img, h) = state.page(p)?;
            match h.kind {
                PageKind::Branch => {
                    let v = BranchView::new(img, &h);
                    let child = v
                        .child_index(key)
                        .and_then(|c| v.child(c))
                        .ok_or_else(|| corrupt(state, p, "malformed branch page"))?;
                    live[kept] = (i, child);
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
                                r @ (ValRef::Overflow { .. } | ValRef::Packed { .. }) => {
                                    overflow.push((i, r))
                                }
                            }
                        }
                    }
                }
                _ => return Err(corrupt(state, p, "expected a branch or leaf page")),
            }
        }
        live.truncate(kept);
    }
    if let Some(&(_, p)) = live.first() {
        return Err(corrupt(state, p, "tree deeper than 32 levels"));
    }
    let check = if overflow.is_empty() {
        0
    } else {
        hints.pages_to_check()
    };
    if check > 0 {
        spans.clear();
        spans.extend(
            overflow
                .iter()
                .map(|&(_, r)| match r {
                    // The pages up to the value's end (the run's length is in its header).
                    ValRef::Packed { page, off, len } => {
                        (page, (off as usize + len as usize).div_ceil(PAGE_SIZE))
                    }
                    ValRef::Overflow { page, len } => (page, overflow_run_pages(len as usize)),
                    ValRef::Inline(_) => (0, 0),
                })
                .filter(|&(_, pages)| pages <= MAX_READ_AHEAD_RUN),
        );
        prefetch(state, &mut spans, check)?;
    }
    for (i, r) in overflow {
        out[i] = Some(value(state, r)?);
    }
    Ok(out)
}

/// Makes the pages of `spans` (`(first page, pages)`, any order, duplicates allowed) that are
/// neither in the scratch table nor in the page cache resident, of the first `check` distinct
/// ones (the number the file's [`page_reads::ReadHints`] gave: all, unless its pages keep
/// being resident): reads them all at once
/// ([`page_reads::read_pages`]) and checks each image read, marking it verified. Pages out of
/// the map's range are left to [`State::page`], which reports them.
///
/// Errors: the reads' ([`page_reads::read_pages`]); [`crate::Error::Corruption`] naming the
/// page whose image fails its checks.
pub(crate) fn prefetch(state: &State, spans: &mut Vec<(u64, usize)>, check: usize) -> Result<()> {
    let m = &state.mapping;
    let hints = &m.read_hints;
    spans.sort_unstable();
    spans.dedup_by_key(|s| s.0);
    let mut misses: Vec<PageRead> = Vec::new();
    let mut resident = 0u32;
    for &(p, pages) in spans.iter().take(check) {
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
        if PageHeader::read(&r.buf)
            .is_some_and(|h| h.run_pages as usize * crate::page::PAGE_SIZE != r.buf.len())
        {
            continue;
        }
        check_image(&r.buf, r.page, m.path())?;
        m.mark_verified(r.page);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::env::page_reads;
    use crate::options::{FlushMode, Options};
    use crate::page::{PageHeader, PageKind, PAGE_SIZE};
    use crate::storage::Storage;
    use std::os::fd::AsRawFd;

    fn key(i: u32) -> Vec<u8> {
        format!("key{:07}", i.wrapping_mul(2_654_435_761) % 10_000_000).into_bytes()
    }

    fn val(i: u32) -> Vec<u8> {
        let len = if i.is_multiple_of(97) { 20_000 } else { 100 };
        (0..len).map(|j| (i as usize + j) as u8).collect()
    }

    /// A flushed storage of 4,000 keys (some values overflow runs), closed.
    fn build(dir: &std::path::Path) {
        let s = Storage::open(dir.join("s"), opts()).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..4000 {
            w.put(key(i), val(i)).unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
        s.close().unwrap();
    }

    fn opts() -> Options {
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        }
    }

    /// The storage of [`build`] opened with its data file dropped from the page cache (after
    /// the open, whose header reads bring the first pages in); `None` on a file system that
    /// keeps its pages anyway (tmpfs).
    fn cold_storage(dir: &std::path::Path) -> Option<Storage> {
        let path = dir.join("s");
        let s = Storage::open(&path, opts()).unwrap();
        let f = std::fs::File::open(path.join("data.pages")).unwrap();
        // SAFETY: posix_fadvise only advises the kernel about the descriptor's pages.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let probe = s.begin_read().unwrap();
        let state = probe.state_for_tests();
        state
            .mapping
            .span(state.root, 1)
            .filter(|sp| !page_reads::is_resident(sp))?;
        drop(probe);
        Some(s)
    }

    fn queries() -> Vec<Vec<u8>> {
        let mut q: Vec<Vec<u8>> = (0..4000).step_by(7).map(key).collect();
        q.push(b"absent".to_vec());
        q.push(Vec::new());
        q.push(key(14));
        q
    }

    fn check_cold(no_ring: bool) {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        let Some(s) = cold_storage(dir.path()) else {
            return;
        };
        if no_ring {
            page_reads::no_ring_on_this_thread();
        }
        let r = s.begin_read().unwrap();
        let q = queries();
        let before = page_reads::READS.with(|c| c.get());
        let got = r.multi_get(&q).unwrap();
        let after = page_reads::READS.with(|c| c.get());
        let (pages, calls) = (after.0 - before.0, after.1 - before.1);
        // A tree of two or three levels: one batch per level, and one of overflow runs.
        assert!(
            pages >= 20 && (2..=4).contains(&calls),
            "{pages} pages read in {calls} batches"
        );
        for (k, v) in q.iter().zip(&got) {
            assert_eq!(
                *v,
                r.get(k).unwrap(),
                "key {:?}",
                String::from_utf8_lossy(k)
            );
        }
        assert_eq!(got[0], Some(val(0).as_slice()));
        assert_eq!(got.len(), q.len());
    }

    #[test]
    fn cold_pages_are_read_through_the_ring() {
        check_cold(false);
    }

    #[test]
    fn cold_pages_are_read_with_pread_without_a_ring() {
        check_cold(true);
    }

    #[test]
    fn a_damaged_cold_page_is_corruption_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        // Flip a byte in the middle of the last leaf page of the file.
        let data = dir.path().join("s").join("data.pages");
        let mut bytes = std::fs::read(&data).unwrap();
        let leaf = (0..bytes.len() / PAGE_SIZE)
            .rev()
            .find(|&p| {
                PageHeader::read(&bytes[p * PAGE_SIZE..]).is_some_and(|h| h.kind == PageKind::Leaf)
            })
            .unwrap();
        bytes[leaf * PAGE_SIZE + 4000] ^= 0x55;
        std::fs::write(&data, &bytes).unwrap();
        let Some(s) = cold_storage(dir.path()) else {
            return;
        };
        let r = s.begin_read().unwrap();
        let q: Vec<Vec<u8>> = (0..4000).map(key).collect();
        let before = page_reads::READS.with(|c| c.get());
        match r.multi_get(&q) {
            Err(crate::Error::Corruption(c)) => {
                assert_eq!(c.page, Some(leaf as u64));
                assert!(c.what.contains("checksum"), "{}", c.what);
            }
            other => panic!("expected corruption, got {:?}", other.map(|v| v.len())),
        }
        assert!(
            page_reads::READS.with(|c| c.get()).0 > before.0,
            "found by the batched read"
        );
    }
}
