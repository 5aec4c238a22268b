//! Shared by the benchmarks (`#[path = "common/mod.rs"] mod common;`).

use std::time::Duration;

/// Process CPU time (user + system) so far, from `getrusage(RUSAGE_SELF)`.
#[allow(dead_code)] // Not every bench times CPU.
pub fn cpu_now() -> Duration {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// SplitMix64 (Steele, Lea, Flood 2014): a well-mixed 64-bit value for `x`, used to make
/// random-looking keys reproducibly.
#[allow(dead_code)] // Not every bench makes keys.
pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Key `i` of the core benchmarks: 8 pseudo-random bytes then `i`, both big-endian: unique, in
/// random order.
#[allow(dead_code)] // Not every bench makes keys.
pub fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&splitmix(i).to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// Value `i` of the core benchmarks: 100 bytes derived from `i`.
#[allow(dead_code)] // Not every bench makes values.
pub fn value(i: u64) -> [u8; 100] {
    let mut v = [0u8; 100];
    for (c, chunk) in v.chunks_mut(8).enumerate() {
        let w = splitmix(i ^ ((c as u64) << 56)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    v
}

/// Key `i` of the random 1,000-key batches (as redb's benchmark): 24 pseudo-random bytes.
#[allow(dead_code)] // Not every bench makes batch keys.
pub fn batch_key(i: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&splitmix(i).to_be_bytes());
    k[8..16].copy_from_slice(&splitmix(i ^ 0x5555).to_be_bytes());
    k[16..].copy_from_slice(&i.to_be_bytes());
    k
}
