//! Shared by the benchmarks (`#[path = "common/mod.rs"] mod common;`).

use std::time::Duration;

/// Process CPU time (user + system) so far, from `getrusage(RUSAGE_SELF)`.
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
