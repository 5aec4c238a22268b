//! Page diffs and zero runs: how the journal stores a page smaller than its 8 KiB image
//! (docs/design.md 3.2). A copied page is journaled as the byte ranges where it differs from
//! the page it was copied from ([`diff_ranges`], or the ranges its writer tracked,
//! [`written_ranges`]), recovery puts them back on the base ([`apply_ranges`]), and a page
//! stored whole drops its longest run of zeros (`longest_zero_run`). The record layout that
//! carries them is `record.rs`'s.

use crate::page::PAGE_SIZE;

/// Most ranges in one page diff.
pub(super) const MAX_DIFF_RANGES: usize = u16::MAX as usize;

/// The byte ranges `(start, end)` where `new` differs from `base` (two single pages), found a
/// word (8 bytes) at a time, so a range may include a few equal bytes at its edges.
pub fn diff_ranges(base: &[u8], new: &[u8]) -> Vec<(usize, usize)> {
    debug_assert!(base.len() == PAGE_SIZE && new.len() == PAGE_SIZE);
    // Three levels: 512-byte spans compared with one `memcmp` each (most of a page is
    // unchanged), then 64-byte blocks (the XOR of their words folded with OR, vector code), then
    // words. A range stays open across unequal spans and blocks and closes at the first equal
    // word, span or block, so the result is the word-level answer.
    const SPAN: usize = 512;
    const BLOCK: usize = 64;
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]));
    let mut out: Vec<(usize, usize)> = Vec::new();
    let mut open: Option<usize> = None;
    let len = base.len().min(new.len()) / SPAN * SPAN;
    for (s, (sa, sb)) in base[..len]
        .chunks_exact(SPAN)
        .zip(new[..len].chunks_exact(SPAN))
        .enumerate()
    {
        if sa == sb {
            if let Some(o) = open.take() {
                out.push((o, s * SPAN));
            }
            continue;
        }
        for (i, (a, b)) in sa
            .chunks_exact(BLOCK)
            .zip(sb.chunks_exact(BLOCK))
            .enumerate()
        {
            let at_block = s * SPAN + i * BLOCK;
            let differs = a
                .chunks_exact(8)
                .zip(b.chunks_exact(8))
                .fold(0u64, |acc, (x, y)| acc | (word(x) ^ word(y)));
            if differs == 0 {
                if let Some(o) = open.take() {
                    out.push((o, at_block));
                }
                continue;
            }
            for (j, (x, y)) in a.chunks_exact(8).zip(b.chunks_exact(8)).enumerate() {
                let at = at_block + j * 8;
                match (word(x) == word(y), open) {
                    (false, None) => open = Some(at),
                    (true, Some(o)) => {
                        out.push((o, at));
                        open = None;
                    }
                    _ => {}
                }
            }
        }
    }
    if let Some(o) = open {
        out.push((o, len));
    }
    out
}

/// Bytes a page diff with `ranges` takes in a record (after the 12-byte page prefix).
pub(super) fn diff_len(ranges: &[(usize, usize)]) -> usize {
    8 + 2 + ranges.iter().map(|(a, b)| 4 + b - a).sum::<usize>()
}
/// Zero runs shorter than this are kept (not worth 4 bytes of offsets).
pub(super) const MIN_TRIM: usize = 64;

/// The longest run of zero 8-byte words in `img[HEADER_LEN..]`, as a byte range `(start, end)`
/// (word-aligned: a few zero bytes at its edges may stay in; the first of equal runs wins).
/// One pass builds a bit mask of the zero words, 8 words at a time (a block of zeros is one
/// vector OR-fold), a second walks the mask's runs with `trailing_zeros`.
pub(super) fn longest_zero_run(img: &[u8]) -> (usize, usize) {
    const MAX_WORDS: usize = PAGE_SIZE / 8;
    let base = crate::page::HEADER_LEN;
    let words = (img.len().saturating_sub(base) / 8).min(MAX_WORDS);
    let body = &img[base..base + words * 8];
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().unwrap_or([1; 8]));
    let mut mask = [0u64; MAX_WORDS / 64];
    let mut blocks = body.chunks_exact(64);
    for (k, block) in blocks.by_ref().enumerate() {
        let bits: u64 = if block.chunks_exact(8).fold(0u64, |acc, c| acc | word(c)) == 0 {
            0xff
        } else {
            block
                .chunks_exact(8)
                .enumerate()
                .fold(0u64, |acc, (j, c)| acc | (((word(c) == 0) as u64) << j))
        };
        mask[k / 8] |= bits << ((k % 8) * 8);
    }
    let done = words / 8 * 8;
    for (j, c) in blocks.remainder().chunks_exact(8).enumerate() {
        let i = done + j;
        mask[i / 64] |= ((word(c) == 0) as u64) << (i % 64);
    }
    // The next word index at or after `i` whose mask bit equals `bit` (or `words`).
    let next = |i: usize, bit: bool| -> usize {
        let pick = |w: usize| match mask.get(w) {
            Some(&v) if bit => v,
            Some(&v) => !v,
            None => 0,
        };
        let mut w = i / 64;
        let mut m = pick(w) & (u64::MAX << (i % 64));
        // Bounded: `w` advances to the end of the mask.
        while w < mask.len() {
            if m != 0 {
                return (w * 64 + m.trailing_zeros() as usize).min(words);
            }
            w += 1;
            m = pick(w);
        }
        words
    };
    let mut best = (0usize, 0usize);
    let mut i = 0;
    // Bounded: `i` strictly advances each turn (a run ends after it starts).
    while i < words {
        let start = next(i, true);
        if start >= words {
            break;
        }
        let end = next(start, false);
        if end - start > best.1 - best.0 {
            best = (start, end);
        }
        i = end;
    }
    if best.1 == best.0 {
        return (0, 0);
    }
    (base + best.0 * 8, base + best.1 * 8)
}

/// Most ranges [`written_ranges`] returns (no allocation).
const MAX_WRITTEN: usize = 16;

/// Sorted, disjoint byte ranges `(start, end)` of a page held inline in 16-bit offsets (see
/// [`written_ranges`]): 66 bytes, so a page's diff base that carries them is cheap to move
/// (byte offsets as `usize` made it 264). [`WrittenRanges::expand`] gives them as a slice.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WrittenRanges {
    r: [(u16, u16); MAX_WRITTEN],
    n: u8,
}

impl WrittenRanges {
    /// The ranges as `(start, end)` byte offsets.
    pub(crate) fn expand(&self) -> Ranges {
        let mut out = Ranges {
            r: [(0, 0); MAX_WRITTEN],
            n: self.n as usize,
        };
        for (o, &(a, b)) in out.r.iter_mut().zip(&self.r[..self.n as usize]) {
            *o = (a as usize, b as usize);
        }
        out
    }
}

/// [`WrittenRanges`] as `(start, end)` byte offsets, held inline; dereferences to the slice.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ranges {
    r: [(usize, usize); MAX_WRITTEN],
    n: usize,
}

impl std::ops::Deref for Ranges {
    type Target = [(usize, usize)];
    fn deref(&self) -> &[(usize, usize)] {
        &self.r[..self.n]
    }
}

/// The diff ranges of a page whose edits were tracked: the header (rewritten at every commit)
/// and the written `(start, end)` ranges, sorted, clamped to the page, and merged where they
/// overlap or lie within 4 bytes (a range's own cost in the record). More ranges than fit
/// inline are covered by one span from the first written byte to the last.
pub(crate) fn written_ranges(written: &[(u16, u16)]) -> WrittenRanges {
    const END: u16 = PAGE_SIZE as u16;
    let mut rs = WrittenRanges {
        r: [(0, 0); MAX_WRITTEN],
        n: 1,
    };
    rs.r[0] = (0, crate::page::HEADER_LEN as u16);
    let clamped = written
        .iter()
        .map(|&(a, b)| (a.min(END), b.min(END)))
        .filter(|(a, b)| a < b);
    if written.len() < MAX_WRITTEN {
        for r in clamped {
            rs.r[rs.n as usize] = r;
            rs.n += 1;
        }
    } else if let Some(span) = clamped.reduce(|x, y| (x.0.min(y.0), x.1.max(y.1))) {
        rs.r[1] = span;
        rs.n = 2;
    }
    rs.r[..rs.n as usize].sort_unstable();
    // Merged in place: `n` ranges kept so far.
    let mut n = 0;
    for k in 0..rs.n as usize {
        let (a, b) = rs.r[k];
        if n > 0 && a <= rs.r[n - 1].1 + 4 {
            rs.r[n - 1].1 = rs.r[n - 1].1.max(b);
        } else {
            rs.r[n] = (a, b);
            n += 1;
        }
    }
    rs.n = n as u8;
    rs
}

/// Replaces the `(offset, bytes)` ranges of a page diff in `img`, in order; `None` when one
/// does not fit the image (nothing past it is written).
pub fn apply_ranges<B: AsRef<[u8]>>(img: &mut [u8], ranges: &[(usize, B)]) -> Option<()> {
    for (at, bytes) in ranges {
        let bytes = bytes.as_ref();
        img.get_mut(*at..at.checked_add(bytes.len())?)?
            .copy_from_slice(bytes);
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_ranges_add_the_header_and_merge_close_ranges() {
        // Out of order, overlapping, 4 bytes apart (merged), 5 apart (kept apart), empty, and
        // past the page end (clamped).
        let w = [
            (100, 110),
            (40, 50),
            (45, 60),
            (64, 70),
            (75, 80),
            (200, 200),
            (8180, 9000),
        ];
        assert_eq!(
            &*written_ranges(&w).expand(),
            &[(0, 32), (40, 70), (75, 80), (100, 110), (8180, PAGE_SIZE)]
        );
        assert_eq!(&*written_ranges(&[]).expand(), &[(0, 32)]);
        assert_eq!(&*written_ranges(&[(20, 40), (36, 38)]).expand(), &[(0, 40)]);
        let many: Vec<(u16, u16)> = (0..20).map(|i| (100 + 10 * i, 101 + 10 * i)).collect();
        assert_eq!(&*written_ranges(&many).expand(), &[(0, 32), (100, 291)]);
    }

    #[test]
    fn diff_ranges_cover_exactly_the_changed_words() {
        // Deterministic edits at word edges, block edges and the page ends.
        let base: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 % 251) as u8).collect();
        for edits in [
            vec![],
            vec![0],
            vec![PAGE_SIZE - 1],
            vec![63, 64],
            vec![7, 8, 100, 4095, 4096, 8000],
            (0..PAGE_SIZE).step_by(9).collect(),
            // Across 512-byte span edges, and a range over whole spans.
            vec![504, 511, 512, 1023, 1024, 1535],
            (500..1700).collect(),
        ] {
            let mut new = base.clone();
            for &at in &edits {
                new[at] ^= 0x5a;
            }
            let ranges = diff_ranges(&base, &new);
            let mut rebuilt = base.clone();
            for &(s, e) in &ranges {
                assert!(s < e && e <= PAGE_SIZE && s % 8 == 0 && e % 8 == 0);
                rebuilt[s..e].copy_from_slice(&new[s..e]);
            }
            assert_eq!(rebuilt, new, "edits {edits:?}");
            // Each range starts and ends on a changed word: no equal word at either edge.
            for &(s, e) in &ranges {
                assert_ne!(base[s..s + 8], new[s..s + 8]);
                assert_ne!(base[e - 8..e], new[e - 8..e]);
            }
            assert_eq!(ranges.is_empty(), edits.is_empty());
            // Ranges are in order and maximal: an equal word separates two of them.
            for w in ranges.windows(2) {
                assert!(w[0].1 < w[1].0, "{ranges:?}");
            }
        }
    }

    #[test]
    fn longest_zero_run_matches_a_word_by_word_reference() {
        let reference = |img: &[u8]| {
            let (mut best, mut cur) = ((0usize, 0usize), None::<usize>);
            let base = crate::page::HEADER_LEN;
            let end = base + (img.len() - base) / 8 * 8;
            for i in (base..end).step_by(8) {
                let zero = img[i..i + 8].iter().all(|&b| b == 0);
                match (zero, cur) {
                    (true, None) => cur = Some(i),
                    (false, Some(s)) => {
                        if i - s > best.1 - best.0 {
                            best = (s, i);
                        }
                        cur = None;
                    }
                    _ => {}
                }
            }
            if let Some(s) = cur {
                if end - s > best.1 - best.0 {
                    best = (s, end);
                }
            }
            best
        };
        for marks in [
            vec![],
            vec![40],
            vec![100, 5000],
            vec![63, 64, 65, 200, 8191],
            (0..PAGE_SIZE).step_by(700).collect(),
            (32..PAGE_SIZE).step_by(8).collect(),
            (100..PAGE_SIZE).step_by(977).chain(3000..3100).collect(),
            vec![PAGE_SIZE - 8, PAGE_SIZE - 1],
            (0..64).map(|i| 48 + i * 129).collect(),
        ] {
            let mut img = vec![0u8; PAGE_SIZE];
            img[..32].fill(0xff);
            for &m in &marks {
                img[m] = 1;
            }
            assert_eq!(longest_zero_run(&img), reference(&img), "marks {marks:?}");
        }
    }
}
