//! In-memory metrics an application can export: [`Metrics`] (from [`crate::Storage::metrics`]
//! and [`crate::Database::metrics`]), distributions summarized as [`HistogramSummary`].
//!
//! Where they are recorded: the journal writer (`journal/writer.rs`) records, once per batch
//! and under one lock per histogram, the batch's write-and-sync time, its record count and the
//! commit latency of each of its records (from the start of the commit, stamped by
//! `WriteTransaction::prepare` into the record, to the end of the batch's `fdatasync`); the
//! flush (`flush.rs`) records its time and pages once per flush. Nothing is recorded per
//! commit on the committing thread but the start stamp (one `Instant::now`). Histograms are
//! `hdrhistogram` ones with two significant digits, allocated on their first value (a storage
//! that never flushes holds none); values past their range (one hour in µs, 2^32 records or
//! pages) are recorded as the range's maximum. Everything counts since open, in memory only:
//! nothing is persisted and nothing resets but a new open.

use std::sync::{Mutex, MutexGuard};

use hdrhistogram::Histogram;

/// A distribution's count and percentiles, in the unit of the field that holds it (µs for a
/// `..._us` field, records or pages for the others). Percentiles are upper bounds of the
/// histogram bucket that holds them (two significant digits: within 1%); all 0 when `count`
/// is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistogramSummary {
    /// Values recorded.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest value recorded.
    pub max: u64,
}

impl HistogramSummary {
    fn of(h: Option<&Histogram<u64>>) -> HistogramSummary {
        match h {
            Some(h) if !h.is_empty() => HistogramSummary {
                count: h.len(),
                p50: h.value_at_quantile(0.5),
                p90: h.value_at_quantile(0.9),
                p99: h.value_at_quantile(0.99),
                p999: h.value_at_quantile(0.999),
                max: h.max(),
            },
            _ => HistogramSummary::default(),
        }
    }
}

/// A snapshot of a storage's or a database's metrics since open (in memory only; a new open
/// starts them at zero). Counters and histograms are cumulative since open; the gauge is the
/// value at the call.
///
/// [`crate::Storage::metrics`] reports the storage's own flushes and the journal it writes to:
/// a storage of a database with a shared journal reports the whole journal's commits and
/// batches. [`crate::Database::metrics`] reports its journal(s) (summed in
/// [`crate::JournalMode::Separate`]) and the flushes of every open storage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Metrics {
    /// Commit latency in µs: from the start of the commit (`WriteTransaction::commit`, or the
    /// actors' prepare of it) to the end of the `fdatasync` that made its record durable, one
    /// value per commit record written (an eventual commit's too: to its batch's sync, not to
    /// its acknowledgement). Publishing the new state after that is not included.
    pub commit_us: HistogramSummary,
    /// Journal batch latency in µs: the batch's write and `fdatasync` (one value per batch).
    pub journal_batch_us: HistogramSummary,
    /// Journal batch size in commit records (one value per batch; link and padding records
    /// not counted).
    pub journal_batch_records: HistogramSummary,
    /// Flush latency in µs: from the call (a wait for a flush in progress included) to the
    /// published state (pages written, data file synced, both header pages written and
    /// synced; punching holes after it not included), one value per flush that advanced the
    /// durable header.
    pub flush_us: HistogramSummary,
    /// Pages (8 KiB) written per flush, headers not counted (one value per flush as in
    /// `flush_us`).
    pub flush_pages: HistogramSummary,
    /// Commit records written to the journal(s) (as [`crate::JournalStats::commits`]).
    pub commits: u64,
    /// Journal batches written (one write and one `fdatasync` each).
    pub journal_batches: u64,
    /// `fdatasync` calls on journal files: batches, new files' zeros and background
    /// pre-zeroing (as [`crate::JournalStats::fdatasyncs`]).
    pub journal_fdatasyncs: u64,
    /// Bytes written to the journal(s) in batches: records, link records and padding.
    pub journal_bytes: u64,
    /// Flushes that advanced a durable header (as [`crate::StorageStats::flushes`]).
    pub flushes: u64,
    /// Bytes of pages written to data files by flushes (pages × 8 KiB), headers not counted.
    pub flushed_bytes: u64,
    /// Records queued for the journal now, waiting for the next batch (immediate commits whose
    /// committers wait, and eventual ones already acknowledged): a gauge.
    pub journal_queue_depth: u64,
}

/// One histogram, allocated on its first value, behind a mutex taken once per recording
/// call (a batch, a flush) and by a snapshot.
#[derive(Debug, Default)]
pub(crate) struct Hist(Mutex<Option<Histogram<u64>>>);

/// The largest value a histogram distinguishes: an hour in µs (2^32 records or pages);
/// larger values are recorded as it.
const HIST_MAX: u64 = 1 << 32;

impl Hist {
    fn lock(&self) -> MutexGuard<'_, Option<Histogram<u64>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records every value of `values` under one lock.
    pub fn record_all(&self, values: impl IntoIterator<Item = u64>) {
        let mut g = self.lock();
        if g.is_none() {
            // Constant, valid bounds: creation cannot fail; if it did, nothing is recorded.
            *g = Histogram::new_with_bounds(1, HIST_MAX, 2).ok();
        }
        if let Some(h) = g.as_mut() {
            for v in values {
                h.saturating_record(v);
            }
        }
    }

    /// Records `value`.
    pub fn record(&self, value: u64) {
        self.record_all(std::iter::once(value));
    }

    /// Adds this histogram's values into `into`.
    fn add_to(&self, into: &mut Option<Histogram<u64>>) {
        let g = self.lock();
        let Some(h) = g.as_ref() else {
            return;
        };
        match into {
            // Same bounds on both sides: the addition cannot run out of range.
            Some(i) => {
                let _ = i.add(h);
            }
            None => *into = Some(h.clone()),
        }
    }
}

/// The journal's recorders (in `Journal`).
#[derive(Debug, Default)]
pub(crate) struct JournalRecorders {
    pub commit_us: Hist,
    pub batch_us: Hist,
    pub batch_records: Hist,
}

/// A storage's flush recorders (in `storage::Inner`).
#[derive(Debug, Default)]
pub(crate) struct FlushRecorders {
    pub flush_us: Hist,
    pub flush_pages: Hist,
}

/// Builds a [`Metrics`] from journals and storages: histograms merged, counters summed.
#[derive(Default)]
pub(crate) struct Gather {
    commit_us: Option<Histogram<u64>>,
    batch_us: Option<Histogram<u64>>,
    batch_records: Option<Histogram<u64>>,
    flush_us: Option<Histogram<u64>>,
    flush_pages: Option<Histogram<u64>>,
    out: Metrics,
}

impl Gather {
    /// Adds one journal: its recorders, and its counters `(commits, batches, fdatasyncs,
    /// bytes, queued)`.
    pub fn journal(&mut self, r: &JournalRecorders, counters: (u64, u64, u64, u64, u64)) {
        r.commit_us.add_to(&mut self.commit_us);
        r.batch_us.add_to(&mut self.batch_us);
        r.batch_records.add_to(&mut self.batch_records);
        let (commits, batches, fdatasyncs, bytes, queued) = counters;
        self.out.commits += commits;
        self.out.journal_batches += batches;
        self.out.journal_fdatasyncs += fdatasyncs;
        self.out.journal_bytes += bytes;
        self.out.journal_queue_depth += queued;
    }

    /// Adds one storage's flushes: its recorders, flushes and pages flushed.
    pub fn flushes(&mut self, r: &FlushRecorders, flushes: u64, pages: u64) {
        r.flush_us.add_to(&mut self.flush_us);
        r.flush_pages.add_to(&mut self.flush_pages);
        self.out.flushes += flushes;
        self.out.flushed_bytes += pages * crate::PAGE_SIZE as u64;
    }

    /// The snapshot.
    pub fn finish(self) -> Metrics {
        Metrics {
            commit_us: HistogramSummary::of(self.commit_us.as_ref()),
            journal_batch_us: HistogramSummary::of(self.batch_us.as_ref()),
            journal_batch_records: HistogramSummary::of(self.batch_records.as_ref()),
            flush_us: HistogramSummary::of(self.flush_us.as_ref()),
            flush_pages: HistogramSummary::of(self.flush_pages.as_ref()),
            ..self.out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_of_recorded_values_and_merges() {
        let a = Hist::default();
        let b = Hist::default();
        a.record_all(1..=100);
        b.record(1_000);
        b.record(u64::MAX);
        let mut h = None;
        a.add_to(&mut h);
        b.add_to(&mut h);
        let s = HistogramSummary::of(h.as_ref());
        assert_eq!(s.count, 102);
        assert!((49..=51).contains(&s.p50), "{s:?}");
        assert!(s.p50 <= s.p90 && s.p90 <= s.p99 && s.p99 <= s.p999 && s.p999 <= s.max);
        // A value past the range is recorded as the range's largest.
        assert!(
            s.max >= HIST_MAX && s.max <= HIST_MAX + HIST_MAX / 100,
            "{s:?}"
        );
        assert_eq!(HistogramSummary::of(None), HistogramSummary::default());
        let empty = Hist::default();
        let mut none = None;
        empty.add_to(&mut none);
        assert!(none.is_none(), "an empty recorder allocates nothing");
    }
}
