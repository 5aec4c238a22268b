//! Text forms: escaping keys and values, sizes, the machine description.

use std::path::Path;

/// Writes `bytes` as text: valid UTF-8 as is, except `\` -> `\\`, tab -> `\t`, newline -> `\n`,
/// carriage return -> `\r`, any other control character and every byte that is not part of
/// valid UTF-8 -> `\xHH`. [`unescape`] reverses it.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    out.push_str(&format!("\\x{:02x}", c as u32))
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Reads the escapes [`escape`] writes (`\\ \t \n \r \xHH`) back into bytes.
pub fn unescape(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        match b.get(i + 1) {
            Some(b'\\') => out.push(b'\\'),
            Some(b't') => out.push(b'\t'),
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            Some(b'x') => {
                let hex = s
                    .get(i + 2..i + 4)
                    .ok_or_else(|| format!("{s:?}: `\\x` needs two hex digits"))?;
                let v = u8::from_str_radix(hex, 16)
                    .map_err(|_| format!("{s:?}: `\\x{hex}` is not a hex byte"))?;
                out.push(v);
                i += 4;
                continue;
            }
            Some(_) | None => {
                return Err(format!(
                    "{s:?}: unknown escape at byte {i} (use \\\\ \\t \\n \\r or \\xHH)"
                ))
            }
        }
        i += 2;
    }
    Ok(out)
}

/// An empty latency histogram (microseconds, 3 significant digits).
pub fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new(3).expect("3 significant digits is valid")
}

/// `1234567` -> `1.2 MiB`.
pub fn bytes(n: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < U.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[u])
    }
}

/// Bytes this process caused to be sent to storage so far: `write_bytes` less
/// `cancelled_write_bytes` of /proc/self/io (dirty page-cache bytes that never reached the disk
/// because their file range was truncated, punched or deleted first: pre-zeroed journal tails,
/// punched data-file runs), when the kernel provides them.
pub fn process_write_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/io").ok()?;
    let field = |name: &str| -> Option<u64> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let written = field("write_bytes:")?;
    Some(written.saturating_sub(field("cancelled_write_bytes:").unwrap_or(0)))
}

/// Bytes the block device holding `path` has written so far (sectors written, field 7 of
/// `/sys/dev/block/MAJOR:MINOR/stat`, times 512): what reached the device from every process,
/// where [`process_write_bytes`] counts what this process dirtied (a whole large folio of the
/// page cache for a write into part of it). `None` where the path's device has no such file
/// (a tmpfs, Btrfs's anonymous devices).
pub fn device_write_bytes(path: &Path) -> Option<u64> {
    let st = rustix::fs::stat(path).ok()?;
    let dev = st.st_dev;
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let s = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?;
    let sectors: u64 = s.split_whitespace().nth(6)?.parse().ok()?;
    Some(sectors * 512)
}

/// The file system type of `path` (statfs magic number, named when known).
pub fn fs_type(path: &Path) -> String {
    let Ok(st) = rustix::fs::statfs(path) else {
        return "unknown".into();
    };
    let magic = st.f_type as u64;
    let name = match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x2FC1_2FC1 => "zfs",
        0x794C_7630 => "overlayfs",
        0xF2F5_2010 => "f2fs",
        0x6969 => "nfs",
        0x0102_1997 => "v9fs",
        0x6573_5546 => "fuse",
        _ => "",
    };
    if name.is_empty() {
        format!("0x{magic:x}")
    } else {
        name.to_string()
    }
}

/// The machine in one line: CPU model and count, memory, kernel.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")
                    .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            })
        })
        .map(|kb| bytes(kb * 1024))
        .unwrap_or_else(|| "? memory".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    format!("{cpus} x {model}, {mem}, Linux {kernel}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_round_trips() {
        let cases: [&[u8]; 5] = [
            b"plain",
            b"a\tb\nc\\d\re",
            b"\x00\xff\xfe AD",
            "Sant Julià".as_bytes(),
            b"\x7f\x01",
        ];
        for c in cases {
            let e = escape(c);
            assert!(!e.contains('\t') && !e.contains('\n'));
            assert_eq!(unescape(&e).unwrap(), c);
        }
        assert_eq!(escape(b"AD\x00x"), "AD\\x00x");
        assert!(unescape("\\q").is_err());
        assert!(unescape("\\x4").is_err());
    }
}
