//! The keys of index entries: a term, escaped so that it holds no 0x00 byte, then 0x00, then
//! the document key (docs/design.md, "Index storages").
//!
//! ```text
//! entry key = escape(term) ++ 0x00 ++ document key
//! escape:     0x00 -> 0x01 0x01,  0x01 -> 0x01 0x02,  any other byte as it is
//! ```
//!
//! The escaped term never holds 0x00, so the first 0x00 of an entry key ends its term: a prefix
//! scan for `escape(t) ++ 0x00` lists exactly the documents with term `t`, whatever bytes the
//! terms hold (without the escape, the term `a` would also list a document whose term is
//! `a\0b`). The escape keeps the order of terms (0x00 < 0x01 < 0x02 become `01 01` < `01 02` <
//! `02`, and a shorter term's 0x00 terminator sorts before any longer term's next byte), so a
//! range of terms is a range of keys, and it keeps prefixes (`escape(a ++ b) = escape(a) ++
//! escape(b)`), so a prefix of a compound term is a prefix of its keys. A term without 0x00 and
//! 0x01 bytes is stored as it is (as in FoundationDB's tuple encoding of byte strings, with the
//! escape byte moved to 0x01 so the terminator stays a single 0x00).

use crate::actor_interface::MAX_KEY_LEN;

/// The byte that starts an escape pair in an escaped term.
const ESCAPE: u8 = 0x01;

/// The length of `escape(term)` in bytes.
pub(crate) fn escaped_len(term: &[u8]) -> usize {
    term.len() + term.iter().filter(|&&b| b <= ESCAPE).count()
}

/// Appends `escape(term)` to `out`.
fn push_escaped(out: &mut Vec<u8>, term: &[u8]) {
    for &b in term {
        if b <= ESCAPE {
            out.extend_from_slice(&[ESCAPE, b + 1]);
        } else {
            out.push(b);
        }
    }
}

/// The length of the entry key of term `term` for document key `doc`, or `None` when it would
/// pass [`MAX_KEY_LEN`] (1,024) bytes (such a term is skipped and counted by the engine).
pub(crate) fn entry_len(term: &[u8], doc: &[u8]) -> Option<usize> {
    let n = escaped_len(term) + 1 + doc.len();
    (n <= MAX_KEY_LEN).then_some(n)
}

/// Appends the entry key of term `term` for document key `doc` to `out`.
pub(crate) fn push_entry_key(out: &mut Vec<u8>, term: &[u8], doc: &[u8]) {
    push_escaped(out, term);
    out.push(0);
    out.extend_from_slice(doc);
}

/// The key of the index entry of term `term` for document key `doc`: `escape(term) ++ 0x00 ++
/// doc` (see the module docs). It may pass [`MAX_KEY_LEN`]: the engine skips such terms.
pub fn index_entry_key(term: &[u8], doc: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(escaped_len(term) + 1 + doc.len());
    push_entry_key(&mut k, term, doc);
    k
}

/// The prefix of the keys of every entry with term `term`: `escape(term) ++ 0x00`. A prefix
/// scan of an index storage for it lists exactly the documents whose terms include `term`
/// (their keys are what follows it).
pub fn index_term_prefix(term: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(escaped_len(term) + 1);
    push_escaped(&mut k, term);
    k.push(0);
    k
}

/// The prefix of the keys of every entry whose term starts with `prefix` (for compound terms:
/// the entries whose first fields are `prefix`): `escape(prefix)`, without the terminator.
pub fn index_terms_starting_with(prefix: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(escaped_len(prefix));
    push_escaped(&mut k, prefix);
    k
}

/// Splits an index entry key into its term (unescaped) and its document key. `None` when `key`
/// is no entry key: no 0x00 byte, an empty document key, or an escape pair that is not `01 01`
/// or `01 02` (such as the index's applied record, the single byte 0x00, or an entry written
/// before terms were escaped).
pub fn decode_index_entry(key: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let end = key.iter().position(|&b| b == 0)?;
    let doc = &key[end + 1..];
    if doc.is_empty() {
        return None;
    }
    let mut term = Vec::with_capacity(end);
    let mut i = 0;
    while i < end {
        let b = key[i];
        if b == ESCAPE {
            match key.get(i + 1) {
                Some(&e) if i + 1 < end && (e == 1 || e == 2) => term.push(e - 1),
                _ => return None,
            }
            i += 2;
        } else {
            term.push(b);
            i += 1;
        }
    }
    Some((term, doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_round_trip_and_plain_terms_stay_as_they_are() {
        for term in [
            &b"red"[..],
            b"",
            b"a\0b",
            b"\0",
            b"\x01",
            b"\x01\x01\0\x02\xff",
            b"x\0\x01y",
        ] {
            let k = index_entry_key(term, b"doc-1");
            assert_eq!(k.len(), escaped_len(term) + 1 + 5);
            assert_eq!(decode_index_entry(&k), Some((term.to_vec(), &b"doc-1"[..])));
            assert!(k.starts_with(&index_term_prefix(term)));
            assert_eq!(k.iter().position(|&b| b == 0), Some(escaped_len(term)));
        }
        assert_eq!(index_entry_key(b"red", b"d"), b"red\0d".to_vec());
    }

    // Regression: a term `a\0b` was stored as is, so the prefix scan for the term `a` (`a`
    // 0x00) also listed that document.
    #[test]
    fn no_term_prefix_matches_another_terms_entries() {
        let terms: [&[u8]; 6] = [b"a", b"a\0b", b"a\0", b"a\x01", b"ab", b"\0"];
        for t in terms {
            for u in terms {
                let k = index_entry_key(u, b"doc");
                assert_eq!(
                    k.starts_with(&index_term_prefix(t)),
                    t == u,
                    "term {t:?} against the entry of {u:?}"
                );
            }
        }
    }

    #[test]
    fn the_escape_keeps_the_order_of_terms() {
        let mut terms: Vec<Vec<u8>> = Vec::new();
        for a in [0u8, 1, 2, 0x7f, 0xff] {
            terms.push(vec![a]);
            for b in [0u8, 1, 2, 0xff] {
                terms.push(vec![a, b]);
            }
        }
        terms.push(Vec::new());
        let mut by_term = terms.clone();
        by_term.sort();
        let mut by_key = terms.clone();
        by_key.sort_by_key(|t| index_entry_key(t, b"d"));
        assert_eq!(by_key, by_term);
    }

    #[test]
    fn prefixes_of_compound_terms_are_prefixes_of_keys() {
        let k = index_entry_key(b"AD\x0007", b"doc");
        assert!(k.starts_with(&index_terms_starting_with(b"AD\0")));
        assert!(!k.starts_with(&index_term_prefix(b"AD")));
    }

    #[test]
    fn keys_that_are_no_entries_do_not_decode() {
        assert_eq!(decode_index_entry(&[0]), None);
        assert_eq!(decode_index_entry(b"term\0"), None);
        assert_eq!(decode_index_entry(b"no-separator"), None);
        assert_eq!(decode_index_entry(b"a\x01\x03\0d"), None);
        assert_eq!(decode_index_entry(b"a\x01\0d"), None);
    }

    #[test]
    fn entry_len_counts_the_escapes_against_the_key_limit() {
        let t = vec![0u8; 511];
        assert_eq!(entry_len(&t, b"d"), Some(1024));
        assert_eq!(entry_len(&[0u8; 512], b"d"), None);
    }
}
