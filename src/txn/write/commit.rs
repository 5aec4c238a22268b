//! Committing a write transaction: `prepare` encodes every dirty node, overflow run and map
//! page into sealed images and one journal record; [`PreparedCommit::finish`] publishes the new
//! state once the record is durable (`commit` does both).

use super::*;

impl WriteTransaction {
    /// Makes every change durable and visible: returns once the journal record is covered by a
    /// successful `fdatasync` (design.md invariant I1); new snapshots then see the changes. With
    /// [`Durability::Eventual`] ([`WriteTransaction::set_durability`]) it returns once the
    /// record is queued for the journal, visible but not yet durable; a later failure to write
    /// it poisons the storage and names it in the cause.
    ///
    /// Errors: an I/O error writing or syncing the journal (the storage is then poisoned: every
    /// later write fails with [`Error::Poisoned`] until reopened); `ENOSPC` growing the data file
    /// (nothing is lost and the storage stays usable); [`Error::Poisoned`] when an earlier
    /// failure poisoned it. After an error nothing of this transaction is visible.
    pub fn commit(self) -> Result<()> {
        // DEBUG, per commit: a disabled span is a static interest check (nothing formatted
        // or allocated); the journal batch event below nests in it.
        let _span = tracing::debug_span!("commit", txn = self.txn_id).entered();
        let Some(mut prepared) = self.prepare()? else {
            return Ok(());
        };
        let record = prepared.take_record();
        let r = prepared
            .journal()
            .commit_with(record, prepared.durability());
        prepared.finish(r)
    }

    /// Tree pages this transaction has copied or created so far (dirty leaves and branches, in
    /// page or node form; free-space bitmap pages not counted).
    pub(crate) fn dirty_pages(&self) -> usize {
        self.pages.len() + self.nodes.len()
    }

    /// The data file length, in pages, that this transaction's commit needs when the file is
    /// shorter than that now (`None` when it fits): [`WriteTransaction::prepare`] would grow the
    /// file with a blocking `fallocate`. The actor runtime grows it first on its journal I/O
    /// pool with [`crate::Storage::grow_data_file`], so that no executor waits for the disk.
    /// Cheap (one atomic load).
    pub(crate) fn data_file_growth(&self) -> Option<u64> {
        let need = self.next_page * PAGE_SIZE as u64;
        (need > self.inner.file_len.load(Ordering::Acquire)).then_some(self.next_page)
    }

    /// The first half of [`WriteTransaction::commit`]: encodes every dirty page into a sealed
    /// image, grows the data file, and builds the journal record, without writing it. Returns
    /// `None` when the transaction changed nothing. The actor runtime sends the record to its
    /// journal-writer actor and calls [`PreparedCommit::finish`] with the outcome.
    ///
    /// Errors: as `commit` before the journal write (`ENOSPC` growing the data file loses
    /// nothing and does not poison).
    pub(crate) fn prepare(self) -> Result<Option<PreparedCommit>> {
        // The commit's start, carried in its record for the journal's commit latency
        // histogram (recorded once per batch by the journal writer: `crate::metrics`).
        let started = std::time::Instant::now();
        let mut prepared = self.prepare_record()?;
        if let Some(r) = prepared.as_mut().and_then(|p| p.record.as_mut()) {
            r.started = Some(started);
        }
        Ok(prepared)
    }

    /// [`WriteTransaction::prepare`] without the start stamp.
    fn prepare_record(mut self) -> Result<Option<PreparedCommit>> {
        self.guard()?;
        self.inner.check_writable()?;
        if !self.changed {
            return Ok(None);
        }
        if !self.apply_settled && self.must_apply() {
            self.apply_due()?;
        }
        if self.logical.is_some() {
            return self.prepare_logical().map(Some);
        }
        self.load_fsm()?;
        let txn = self.txn_id;
        let base_state = self.base.clone();
        // Dirty page -> its diff base, for the nodes copied from a committed page (with the
        // diff's ranges from the writes since, for a page edited only in place).
        let mut bases: HashMap<u64, DiffBase<'_>> = map();
        bases.reserve(self.bases.len() + self.bitmaps.len());
        let mut images: Vec<(u64, crate::page::SharedImage)> = Vec::with_capacity(
            self.nodes.len()
                + self.pages.len()
                + self.overflow.len()
                + self.values.len()
                + self.bitmaps.len()
                + 1,
        );
        for (&p, node) in &self.nodes {
            let image = match self.bases.get(&p) {
                Some(&b) => {
                    let (base_img, _) = base_state.page(b)?;
                    bases.insert(
                        p,
                        DiffBase {
                            page: b,
                            image: base_img,
                            written: None,
                        },
                    );
                    node.encode_on(base_img, p, txn)
                }
                None => node.encode(p, txn),
            };
            images.push((p, page::Image::from_boxed(image)));
        }
        // Drained, so that their tables stay with the writer (`TxnMaps`).
        let mut touched = std::mem::replace(&mut self.touched, map());
        let mut pages = std::mem::replace(&mut self.pages, map());
        for (p, mut image) in pages.drain() {
            // A page copied from a committed page is journaled as a diff against it; a new
            // page (a split's right half, a new root leaf) has no base.
            let mut seal_base = None;
            if let Some(&b) = self.bases.get(&p) {
                let (base_img, _) = base_state.page(b)?;
                // The diff's ranges, once: for the seal here and for the record.
                let written = touched
                    .get(&p)
                    .map(|t| crate::journal::diff::written_ranges(t.as_slice()));
                bases.insert(
                    p,
                    DiffBase {
                        page: b,
                        image: base_img,
                        written,
                    },
                );
                // Edited only in place: it differs from its (checked) base only in the
                // header and the written ranges, so its checksum follows from the base's.
                if let Some(w) = written {
                    seal_base = Some((base_img, w));
                }
            }
            let Some(img) = image.get_mut() else {
                return Err(self.corrupt(p, "internal: dirty page shared"));
            };
            let h = PageHeader::read(img).ok_or_else(|| self.corrupt(p, "bad dirty page"))?;
            PageHeader {
                page_number: p,
                txn_id: txn,
                run_pages: 1,
                aux: 0,
                ..h
            }
            .write(img);
            match seal_base {
                Some((b, ranges)) if page::seal_from_base(img, b, &ranges.expand()) => {}
                _ => page::seal(img),
            }
            images.push((p, image));
        }
        self.pages = pages;
        touched.clear();
        self.touched = touched;
        for (&p, value) in &self.overflow {
            images.push((p, page::Image::from_boxed(encode_overflow(value, p, txn))));
        }
        for (&p, body) in &self.values {
            images.push((p, page::Image::from_boxed(encode_values(body, p, txn))));
        }
        let mut bitmaps = std::mem::replace(&mut self.bitmaps, map());
        for (idx, (mut image, touched)) in bitmaps.drain() {
            let p = self.dir[idx];
            // A bitmap copied from the committed one: sealed from its checksum, and journaled
            // as a diff of that version of itself (the same page number): its bit flips.
            // Recovery takes the base from the images it replayed, else from the data file,
            // which a flush whose header never became durable may have torn; such a flush
            // wrote a map record first (`flush::flush`), whose image of the page replaces the
            // data file's (docs/design.md 3.2 and 3.5).
            let seal_base = match touched {
                Some(t) => {
                    let base_img = base_state.page(p)?.0;
                    let written = crate::journal::diff::written_ranges(t.as_slice());
                    bases.insert(
                        p,
                        DiffBase {
                            page: p,
                            image: base_img,
                            written: Some(written),
                        },
                    );
                    Some((base_img, written))
                }
                None => None,
            };
            let Some(img) = image.get_mut() else {
                return Err(self.corrupt(p, "internal: dirty bitmap page shared"));
            };
            PageHeader {
                kind: PageKind::FreeBitmap,
                count: 0,
                page_number: p,
                txn_id: txn,
                run_pages: 1,
                aux: idx as u32,
            }
            .write(img);
            match seal_base {
                Some((b, ranges)) if page::seal_from_base(img, b, &ranges.expand()) => {}
                _ => page::seal(img),
            }
            images.push((p, image));
        }
        self.bitmaps = bitmaps;
        if self.dir_dirty {
            let mut img = page::zeroed(1);
            PageHeader {
                kind: PageKind::FreeDir,
                count: self.dir.len() as u16,
                page_number: self.dir_page,
                txn_id: txn,
                run_pages: 1,
                aux: 0,
            }
            .write(&mut img);
            for (i, v) in self.dir.iter().enumerate() {
                page::wr_u64(&mut img, HEADER_LEN + 8 * i, *v);
            }
            page::seal(&mut img);
            images.push((self.dir_page, page::Image::from_boxed(img)));
        }
        images.sort_unstable_by_key(|(p, _)| *p);
        debug_assert!(images
            .iter()
            .all(|(p, img)| *p >= 2 && (*p + (img.len() / PAGE_SIZE) as u64) <= self.next_page));
        let meta = CommitMeta {
            root: self.root,
            freedir: self.dir_page,
            next_page: self.next_page,
            entries: self.entries,
        };
        // Grow the data file before anything is journaled: ENOSPC here loses nothing.
        self.inner.ensure_data_len(self.next_page)?;
        let mut record = commit_record(self.inner.storage_id, txn, meta, &images, |p| {
            bases.get(&p).copied()
        });
        drop(bases);
        let step = self.step.take();
        if let Some(c) = &step {
            // An apply step: its pages, and the entries it leaves buffered (design.md 3.10).
            record = crate::journal::record::step_record(record, c.carried.iter());
        }
        let journaled = (record.pages as u64, record.page_diffs as u64);
        tracing::trace!(
            storage = self.inner.storage_id,
            txn,
            pages = record.pages,
            page_diffs = record.page_diffs,
            record_bytes = record.total_len(),
            "commit prepared"
        );
        Ok(Some(PreparedCommit {
            journaled,
            txn: self,
            record: Some(record),
            meta,
            images,
            logical: None,
            step,
        }))
    }

    /// [`WriteTransaction::prepare`] of a logical transaction: its operations as one logical
    /// record; nothing is allocated, no page changes.
    fn prepare_logical(mut self) -> Result<PreparedCommit> {
        // The keys this commit adds to the count, only once the storage's count is wanted
        // and its base's is known (`State::len_wanted`): one lookup per key changed.
        let delta = if self.base.len_wanted.load(Ordering::Relaxed)
            && self.base.len_delta.get().is_some()
        {
            let d = self.logical_delta();
            Some(self.fail(d)?)
        } else {
            None
        };
        let ops = self.take_logical().unwrap_or_default();
        let record =
            crate::journal::record::logical_record(self.inner.storage_id, self.txn_id, ops.iter());
        let meta = CommitMeta {
            root: self.root,
            freedir: self.dir_page,
            next_page: self.next_page,
            entries: self.entries,
        };
        tracing::trace!(
            storage = self.inner.storage_id,
            txn = self.txn_id,
            ops = ops.len(),
            record_bytes = record.total_len(),
            "logical commit prepared"
        );
        Ok(PreparedCommit {
            journaled: (0, 0),
            txn: self,
            record: Some(record),
            meta,
            images: Vec::new(),
            logical: Some((ops, delta)),
            step: None,
        })
    }

    /// Discards every change (the same as dropping the transaction).
    pub fn abort(self) {}
}

/// A write transaction whose journal record is built and not yet durable. It still holds the
/// storage's writer: no other write transaction starts until [`PreparedCommit::finish`] (or
/// drop, which aborts).
pub(crate) struct PreparedCommit {
    txn: WriteTransaction,
    record: Option<OutRecord>,
    meta: CommitMeta,
    images: Vec<(u64, crate::page::SharedImage)>,
    /// Page images in the record, and how many are diffs.
    journaled: (u64, u64),
    /// A logical commit's operations (`write/logical.rs`) and, when it counted them, the keys
    /// they add to the count; `None` for a page commit.
    logical: Option<(super::logical::LogicalOps, Option<i64>)>,
    /// An apply step's carried entries (`write/logical.rs`): the commit publishes them as the
    /// buffer of txn id `txn + 1`.
    step: Option<super::logical::StepCarry>,
}

impl std::fmt::Debug for PreparedCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PreparedCommit(txn {})", self.txn.txn_id)
    }
}

impl PreparedCommit {
    /// The transaction id the commit publishes (an apply step's second one).
    pub fn txn_id(&self) -> u64 {
        self.txn.txn_id + self.step.is_some() as u64
    }

    /// The journal record to write (once; later calls return an empty padding-free record).
    pub fn take_record(&mut self) -> OutRecord {
        self.record.take().unwrap_or_else(|| {
            OutRecord::new(
                crate::journal::record::RecordKind::Padding,
                0,
                0,
                vec![crate::journal::record::Part::Zeros(1)],
            )
        })
    }

    /// Makes this prepared page commit (a background apply's, prepared as the txn after its
    /// base) commit as txn `txn` instead, with `step`'s entries carried when commits came
    /// since its base (`write/background.rs`). The record's body names no txn id, so only its
    /// header's changes; its page images keep the txn id they were sealed with, the one the
    /// apply began as (a page's txn id is informational: replay and checks go by the record's).
    /// The record is kept out of the journal's commit latency histogram: no caller waits on it.
    pub(super) fn restamp(&mut self, txn: u64, step: Option<super::logical::StepCarry>) {
        self.txn.txn_id = txn;
        if let Some(mut r) = self.record.take() {
            r.txn_id = txn;
            r.started = None;
            if let Some(c) = &step {
                r = crate::journal::record::step_record(r, c.carried.iter());
            }
            self.record = Some(r);
        }
        self.step = step;
    }

    /// The transaction's durability ([`WriteTransaction::set_durability`]): how the record is
    /// to be handed to the journal ([`crate::journal::Journal::commit_with`]).
    pub fn durability(&self) -> Durability {
        self.txn.durability
    }

    /// The journal the record belongs in.
    fn journal(&self) -> Arc<crate::journal::Journal> {
        self.txn.inner.journal.clone()
    }

    /// Completes the commit with the journal's answer: on `Ok` (the record is durable) the
    /// new state is published and the writer released; on `Err` the storage is poisoned and
    /// the error returned (nothing of the transaction becomes visible).
    pub fn finish(mut self, written: Result<u64>) -> Result<()> {
        if let Err(e) = written {
            self.txn.inner.poison(&e);
            return Err(e);
        }
        let t = &mut self.txn;
        if let Some((ops, delta)) = self.logical.take() {
            // Nothing was allocated or freed: the operations join the buffer.
            t.inner.publish_logical(t.txn_id, ops, delta);
            t.taken.clear();
            match t.writer.take() {
                Some(mut writer) => {
                    t.keep_maps(&mut writer);
                    t.inner.return_writer(writer);
                }
                None if std::mem::take(&mut t.logical_only) => t.inner.return_logical(),
                None => return Err(Error::Closed),
            }
            t.inner.after_commit();
            return Ok(());
        }
        let mut writer = t.writer.take().ok_or(Error::Closed)?;
        t.inner
            .pages_journaled
            .fetch_add(self.journaled.0, Ordering::Relaxed);
        t.inner
            .pages_journaled_as_diffs
            .fetch_add(self.journaled.1, Ordering::Relaxed);
        if t.background {
            t.inner.background_applies.fetch_add(1, Ordering::Relaxed);
        } else if self.step.is_some() {
            t.inner.apply_steps.fetch_add(1, Ordering::Relaxed);
        }
        for (s, l) in t.local_free.iter() {
            writer.alloc.reusable.insert(s, l);
        }
        let allocated: u64 = t.allocated.values().sum();
        t.inner
            .allocated_unflushed
            .fetch_add(allocated, Ordering::Relaxed);
        let freed = std::mem::take(&mut t.freed);
        let freed_pages: u64 = freed.iter().map(|(_, l)| l).sum();
        // Single pages whose freed version exists only in the scratch table (written by a txn
        // above every flush target started so far) wait only for snapshots (`release_early`).
        let started = t.inner.flush_started.load(Ordering::Acquire);
        let (mut early, mut normal) = (writer.alloc.run_list(), writer.alloc.run_list());
        let mut oldest_writer = u64::MAX;
        for &(s, l) in &freed {
            match t.base.scratch.get(&s) {
                Some(sp) if l == 1 && sp.txn > started => {
                    oldest_writer = oldest_writer.min(sp.txn);
                    early.push((s, l));
                }
                _ => normal.push((s, l)),
            }
        }
        writer.alloc.pending_pages += freed_pages;
        t.inner
            .freed_unflushed
            .fetch_add(freed_pages, Ordering::Relaxed);
        t.inner.publish_commit(
            t.txn_id,
            self.meta,
            std::mem::take(&mut self.images),
            &freed,
            self.step.take(),
        );
        if normal.is_empty() {
            writer.alloc.recycle(normal);
        } else {
            writer.alloc.pending.push_back((t.txn_id, normal));
        }
        if early.is_empty() {
            writer.alloc.recycle(early);
        } else {
            writer
                .alloc
                .early
                .push_back((t.txn_id, oldest_writer, early));
        }
        writer.alloc.recycle(freed);
        t.taken.clear();
        t.keep_maps(&mut writer);
        t.inner.return_writer(writer);
        t.inner.after_commit();
        Ok(())
    }
}
