//! Reading lines with a length cap: a line longer than the cap is passed over without being held
//! in memory, so a 100 MiB line (or a file with no newline) costs the cap, not the line.

use std::io::{self, BufRead};

/// What [`read_line_capped`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// End of input.
    Eof,
    /// A line (in the buffer, without its `\n`).
    Read,
    /// A line longer than the cap, skipped up to and including its `\n`; its length in bytes.
    TooLong(u64),
}

/// Reads the next line into `buf` (cleared first; the `\n` is not kept). A line longer than
/// `cap` bytes is consumed to its end and reported as [`Line::TooLong`] with `buf` empty.
/// The last line may lack a newline.
pub fn read_line_capped(r: &mut impl BufRead, buf: &mut Vec<u8>, cap: usize) -> io::Result<Line> {
    buf.clear();
    let mut total: u64 = 0;
    let mut too_long = false;
    let mut any = false;
    loop {
        let avail = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            if !any {
                return Ok(Line::Eof);
            }
            break;
        }
        any = true;
        let (chunk, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (&avail[..i], Some(i + 1)),
            None => (avail, None),
        };
        total += chunk.len() as u64;
        if !too_long {
            if total > cap as u64 {
                too_long = true;
                buf.clear();
                buf.shrink_to(cap.min(1 << 16));
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = done.unwrap_or(avail.len());
        r.consume(used);
        if done.is_some() {
            break;
        }
    }
    Ok(if too_long {
        Line::TooLong(total)
    } else {
        Line::Read
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_and_splits() {
        let data = b"ab\nccccccccc\n\nlast";
        let mut r = io::BufReader::with_capacity(4, &data[..]);
        let mut b = Vec::new();
        assert_eq!(read_line_capped(&mut r, &mut b, 5).unwrap(), Line::Read);
        assert_eq!(b, b"ab");
        assert_eq!(
            read_line_capped(&mut r, &mut b, 5).unwrap(),
            Line::TooLong(9)
        );
        assert!(b.is_empty());
        assert_eq!(read_line_capped(&mut r, &mut b, 5).unwrap(), Line::Read);
        assert_eq!(b, b"");
        assert_eq!(read_line_capped(&mut r, &mut b, 5).unwrap(), Line::Read);
        assert_eq!(b, b"last");
        assert_eq!(read_line_capped(&mut r, &mut b, 5).unwrap(), Line::Eof);
    }
}
