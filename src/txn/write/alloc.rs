//! Page allocation in a write transaction: pages taken from the free-space map (or past
//! `next_page`), pages freed, and the map's directory and bitmap pages copied on first change.

use super::*;

impl WriteTransaction {
    pub(super) fn alloc(&mut self, n: u64) -> Result<u64> {
        let p = if let Some(p) = self.local_free.take(n) {
            self.set_bits(p, n, false)?;
            p
        } else if let Some(p) = self.writer.as_mut().and_then(|w| w.alloc.reusable.take(n)) {
            self.taken.push((p, n));
            self.set_bits(p, n, false)?;
            p
        } else {
            let p = self.next_page;
            self.next_page += n;
            p
        };
        self.allocated.insert(p, n);
        self.bases.remove(&p);
        self.forget_page(p);
        Ok(p)
    }

    pub(super) fn free(&mut self, p: u64, n: u64) -> Result<()> {
        self.set_bits(p, n, true)?;
        if self.allocated.remove(&p).is_some() {
            self.local_free.insert(p, n);
        } else {
            self.freed.push((p, n));
        }
        Ok(())
    }

    pub(super) fn set_bits(&mut self, p: u64, n: u64, free: bool) -> Result<()> {
        for q in p..p + n {
            let idx = (q / BITS_PER_BITMAP) as usize;
            self.bitmap(idx)?;
            if let Some((image, touched)) = self.bitmaps.get_mut(&idx) {
                if let Some(img) = image.get_mut() {
                    freespace::set_bit_in_body(&mut img[HEADER_LEN..], q, free);
                }
                let at = (HEADER_LEN + (q % BITS_PER_BITMAP) as usize / 8) as u16;
                if let Some(t) = touched {
                    if t.as_slice().last() != Some(&(at, at + 1)) {
                        if t.len >= MAX_TOUCHED {
                            *touched = None;
                        } else {
                            t.ranges[t.len] = (at, at + 1);
                            t.len += 1;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn load_fsm(&mut self) -> Result<()> {
        if self.fsm_loaded {
            return Ok(());
        }
        self.fsm_loaded = true;
        if self.base.freedir != 0 {
            let base = self.base.clone();
            let (img, h) = base.page(self.base.freedir)?;
            if h.kind != PageKind::FreeDir || h.count as usize > DIR_CAPACITY {
                return Err(self.corrupt(self.base.freedir, "bad free-space directory page"));
            }
            for i in 0..h.count as usize {
                let p = page::rd_u64(img, HEADER_LEN + 8 * i).ok_or_else(|| {
                    self.corrupt(self.base.freedir, "bad free-space directory page")
                })?;
                self.dir.push(p);
            }
        }
        Ok(())
    }

    /// Marks the directory page changed (a bitmap was added), allocating it the first time.
    pub(super) fn touch_dir(&mut self) -> Result<()> {
        if self.dir_dirty {
            return Ok(());
        }
        self.dir_dirty = true;
        if self.dir_page == 0 {
            self.dir_page = self.alloc(1)?;
        }
        Ok(())
    }

    /// Makes bitmap `idx` dirty in this transaction, creating bitmaps up to it.
    ///
    /// Free-space pages are updated in place (same page number), unlike tree pages: no
    /// snapshot reads them (only the writer, `check` and the flush, which see the current or
    /// the flushed state), and recovery rebuilds them from the journal's full images before
    /// reading them. So a commit journals one bitmap page, not a bitmap page plus a directory
    /// page plus the cascade of freeing and allocating their old copies.
    pub(super) fn bitmap(&mut self, idx: usize) -> Result<()> {
        self.load_fsm()?;
        if self.bitmaps.contains_key(&idx) {
            return Ok(());
        }
        if idx >= DIR_CAPACITY {
            return Err(Error::InvalidOptions(format!(
                "data file would exceed {} pages, the free-space map's reach",
                DIR_CAPACITY as u64 * BITS_PER_BITMAP
            )));
        }
        if idx < self.dir.len() {
            let base = self.base.clone();
            let p = self.dir[idx];
            let (img, h) = base.page(p)?;
            if h.kind != PageKind::FreeBitmap {
                return Err(self.corrupt(p, "expected a free-space bitmap page"));
            }
            if img.len() != PAGE_SIZE {
                return Err(self.corrupt(p, "free-space bitmap page of a bad length"));
            }
            self.bitmaps
                .insert(idx, (page::Image::copy_from(img), Some(Touches::default())));
        } else {
            // Bounded by DIR_CAPACITY: each turn adds one bitmap.
            while self.dir.len() <= idx {
                let i = self.dir.len();
                self.dir.push(0);
                self.bitmaps.insert(i, (page::zeroed_shared(1), None));
                self.touch_dir()?;
                let new = self.alloc(1)?;
                self.dir[i] = new;
            }
        }
        Ok(())
    }

    // ---- nodes ------------------------------------------------------------------------------
}
