//! The generated workload: user documents (about 1 KB of JSON, the same for the same number)
//! and the indexes' names and map functions (one field, or a hash of two fields, read from the
//! stored JSON by one substring search).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

const COUNTRIES: [&str; 24] = [
    "US", "DE", "FR", "GB", "IL", "JP", "BR", "IN", "CN", "CA", "AU", "ES", "IT", "NL", "SE", "PL",
    "MX", "AR", "ZA", "KR", "NO", "PT", "IE", "NZ",
];
const CITIES: [&str; 16] = [
    "Springfield",
    "Riverton",
    "Lakeside",
    "Hadera",
    "Fairview",
    "Georgetown",
    "Madison",
    "Franklin",
    "Clinton",
    "Salem",
    "Bristol",
    "Ashland",
    "Dover",
    "Milton",
    "Newport",
    "Oxford",
];
const SYLLABLES: [&str; 24] = [
    "ka", "lo", "mi", "ra", "ten", "sa", "vo", "li", "an", "dre", "el", "ni", "jo", "ha", "ru",
    "be", "ta", "no", "is", "ca", "mel", "do", "fi", "gu",
];
const WORDS: [&str; 32] = [
    "order",
    "basket",
    "shipping",
    "coffee",
    "garden",
    "review",
    "premium",
    "member",
    "discount",
    "weekly",
    "newsletter",
    "wishlist",
    "gift",
    "returns",
    "tracking",
    "loyalty",
    "points",
    "books",
    "music",
    "kitchen",
    "outdoor",
    "sports",
    "toys",
    "fashion",
    "beauty",
    "health",
    "pets",
    "travel",
    "office",
    "tools",
    "games",
    "electronics",
];
/// Fields an index can extract.
const FIELDS: [&str; 6] = ["name", "email", "country", "age", "last_login", "city"];

#[derive(Serialize)]
pub(super) struct User {
    pub(super) id: String,
    name: String,
    email: String,
    country: &'static str,
    city: &'static str,
    age: u32,
    last_login: u64,
    newsletter: bool,
    about: String,
}

impl User {
    pub(super) fn generate(n: u64) -> User {
        let mut rng = SmallRng::seed_from_u64(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5eed);
        let word = |rng: &mut SmallRng, parts: usize| -> String {
            let mut s = String::new();
            for _ in 0..parts {
                s.push_str(SYLLABLES[rng.random_range(0..SYLLABLES.len())]);
            }
            s
        };
        let first = word(&mut rng, 2);
        let last = word(&mut rng, 3);
        let mut about = String::with_capacity(800);
        while about.len() < 760 {
            if !about.is_empty() {
                about.push(' ');
            }
            about.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        }
        let name = format!(
            "{}{} {}{}",
            first[..1].to_uppercase(),
            &first[1..],
            last[..1].to_uppercase(),
            &last[1..]
        );
        User {
            id: format!("users/{n:012}"),
            email: format!("{first}.{last}{}@example.com", n % 1000),
            name,
            country: COUNTRIES[rng.random_range(0..COUNTRIES.len())],
            city: CITIES[rng.random_range(0..CITIES.len())],
            age: rng.random_range(18..90),
            last_login: 1_700_000_000 + rng.random_range(0..30_000_000),
            newsletter: rng.random(),
            about,
        }
    }

    #[cfg(test)]
    fn field(&self, i: usize) -> String {
        match i {
            0 => self.name.clone(),
            1 => self.email.clone(),
            2 => self.country.to_string(),
            3 => self.age.to_string(),
            4 => self.last_login.to_string(),
            _ => self.city.to_string(),
        }
    }

    /// The entry key of index `i`: one field for the first six indexes, then a hash of two
    /// fields (seeded by `i`); then 0x00 and the id. (The reference for [`index_terms`].)
    #[cfg(test)]
    fn index_key(&self, i: usize) -> Vec<u8> {
        let mut k = if i < FIELDS.len() {
            self.field(i).into_bytes()
        } else {
            let mut h = crc32fast::Hasher::new_with_initial(i as u32);
            h.update(self.field(i % FIELDS.len()).as_bytes());
            h.update(self.field((i / FIELDS.len() + i) % FIELDS.len()).as_bytes());
            format!("{:08x}", h.finalize()).into_bytes()
        };
        k.push(crate::index_spec::SEP);
        k.extend_from_slice(self.id.as_bytes());
        k
    }
}

/// The raw value of field `name` in a document serialized from a [`User`], found by one
/// SIMD substring search for `"name":` (no JSON parsing, no allocation): a string's bytes
/// between its quotes, or a number's (or boolean's) text up to the next `,` or `}`. `None` when
/// missing, or when its string value holds an escape. A generated user is a flat object of
/// plain ASCII without quotes or backslashes in its strings, so the first `"name":` is its key
/// (in JSON, a quote inside a string is escaped, so `"name":` cannot start inside one unless
/// a key ends with an escaped quote).
fn scan_field(doc: &[u8], field: usize) -> Option<&[u8]> {
    let at = FIELD_FINDERS[field].find(doc)?;
    let v = at + FIELD_FINDERS[field].needle().len();
    if *doc.get(v)? == b'"' {
        let e = v + 1 + memchr::memchr2(b'"', b'\\', &doc[v + 1..])?;
        (doc[e] == b'"').then(|| &doc[v + 1..e])
    } else {
        let e = v + memchr::memchr2(b',', b'}', &doc[v..])?;
        Some(&doc[v..e])
    }
}

/// One substring finder per field of [`FIELDS`] (`"field":`), built once.
static FIELD_FINDERS: std::sync::LazyLock<Vec<memchr::memmem::Finder<'static>>> =
    std::sync::LazyLock::new(|| {
        FIELDS
            .iter()
            .map(|f| memchr::memmem::Finder::new(format!("\"{f}\":").as_bytes()).into_owned())
            .collect()
    });

/// The map function of index `i`: the term of [`User::index_key`] (the field, or the hex crc32
/// of two fields seeded by `i`), read from the stored JSON by [`scan_field`].
pub(super) fn index_terms(i: usize, doc: &[u8]) -> Vec<Vec<u8>> {
    let f = FIELDS.len();
    if i < f {
        return scan_field(doc, i)
            .map(|v| vec![v.to_vec()])
            .unwrap_or_default();
    }
    let (Some(a), Some(b)) = (scan_field(doc, i % f), scan_field(doc, (i / f + i) % f)) else {
        return Vec::new();
    };
    let mut h = crc32fast::Hasher::new_with_initial(i as u32);
    h.update(a);
    h.update(b);
    let x = h.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    vec![(0..8)
        .rev()
        .map(|d| HEX[((x >> (d * 4)) & 0xf) as usize])
        .collect()]
}

pub(super) fn index_name(i: usize) -> String {
    if i < FIELDS.len() {
        format!("Users_By_{}", FIELDS[i])
    } else {
        format!("Users_ByHash_{i:03}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_about_1_kb_and_index_keys_end_with_the_id() {
        let u = User::generate(42);
        let n = serde_json::to_vec(&u).unwrap().len();
        assert!((900..1200).contains(&n), "{n}");
        for i in 0..100 {
            let k = u.index_key(i);
            assert!(k.ends_with(b"\x00users/000000000042"));
        }
        assert_eq!(User::generate(42).email, u.email);
    }

    #[test]
    fn index_terms_scan_the_same_keys_as_index_key() {
        for n in 0..300 {
            let u = User::generate(n);
            let doc = serde_json::to_vec(&u).unwrap();
            for i in 0..100 {
                let key = u.index_key(i);
                let term = &key[..key.len() - 1 - u.id.len()];
                assert_eq!(
                    index_terms(i, &doc),
                    vec![term.to_vec()],
                    "user {n} index {i}"
                );
            }
        }
        // FIELDS: 0 name, 1 email, 2 country, 3 age.
        assert_eq!(scan_field(br#"{"name":"x\"y","age":12}"#, 0), None);
        assert_eq!(
            scan_field(br#"{"name":"x\"y","age":12}"#, 3),
            Some(&b"12"[..])
        );
        assert_eq!(scan_field(br#"{"name":"x","age":12}"#, 3), Some(&b"12"[..]));
        assert_eq!(
            scan_field(br#"{"name":true,"email":"v"}"#, 1),
            Some(&b"v"[..])
        );
        assert_eq!(scan_field(br#"{"age":1}"#, 3), Some(&b"1"[..]));
        assert_eq!(scan_field(br#"{"age":1}"#, 2), None);
        assert_eq!(scan_field(br#"{"name":"unterminated"#, 0), None);
        assert_eq!(scan_field(br#"{"age":1"#, 3), None);
    }
}
