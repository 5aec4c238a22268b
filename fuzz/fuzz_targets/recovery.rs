//! Recovery of a journal directory built from fuzz bytes: a valid storage (a template made
//! once per process: header pages, a small tree, flushed) gets a `Journals/` holding journal
//! files made from the input, raw bytes and records whose checksums hold (so the fuzzer gets
//! past them) carrying commit bodies of real or arbitrary pages, then is opened read-only or
//! read-write. The open must succeed or fail with a typed error, never panic, hang or allocate
//! without bound; an open storage must read, check and (read-write) commit and flush without
//! panicking.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use omnibus::fuzzing;
use omnibus::{FlushMode, Options, Prezero, Storage};

#[derive(Arbitrary, Debug)]
struct Input {
    read_only: bool,
    files: Vec<JFile>,
}

#[derive(Arbitrary, Debug)]
struct JFile {
    /// Journal file number (1..=4).
    no: u8,
    records: Vec<Rec>,
    /// Zero bytes after the records (pre-zeroed tail), in 4 KiB units.
    zero_tail: u8,
    /// One byte flipped: (offset, xor).
    flip: Option<(u16, u8)>,
}

#[derive(Arbitrary, Debug)]
enum Rec {
    /// Bytes as they are.
    Raw(Vec<u8>),
    /// A commit record with a body built from pages.
    Commit {
        other_storage: bool,
        /// Txn id relative to the template's flushed txn.
        txn: u8,
        /// Journal number written in the header: 0 = the file's own.
        wrong_no: u8,
        root: Sel,
        freedir: Sel,
        next_page: Sel,
        entries: u16,
        pages: Vec<PageSpec>,
    },
    /// A commit record (valid header) whose body is these bytes.
    CommitRawBody { txn: u8, body: Vec<u8> },
    /// A padding record of this many bytes.
    Padding(u16),
    /// A link record with this body.
    Link(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Sel {
    Zero,
    Small(u8),
    Raw(u64),
}

impl Sel {
    fn get(&self) -> u64 {
        match self {
            Sel::Zero => 0,
            Sel::Small(n) => *n as u64,
            Sel::Raw(n) => *n,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum PageSpec {
    /// A valid leaf page of these entries (when they fit and are ordered).
    Leaf {
        page: u8,
        entries: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// A page of arbitrary bytes with a chosen kind, sealed as a journaled image is.
    Raw { page: u8, kind: u8, bytes: Vec<u8> },
}

struct Template {
    _dir: tempfile::TempDir,
    data: PathBuf,
    storage_id: u64,
    flushed_txn: u64,
}

fn opts(read_only: bool) -> Options {
    Options {
        read_only,
        create: false,
        flush_mode: FlushMode::Manual,
        journal_file_size: 64 << 10,
        journal_prezero: Prezero::WholeFile,
        flush_on_close: true,
        punch_holes: false,
        write_mode: omnibus::WriteMode::FileIo,
        ..Options::default()
    }
}

fn scratch_root() -> &'static Path {
    // tmpfs when there is one: the target creates and deletes a directory per run.
    if Path::new("/dev/shm").is_dir() {
        Path::new("/dev/shm")
    } else {
        Path::new("/tmp")
    }
}

fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| {
        let dir = tempfile::tempdir_in(scratch_root()).expect("template dir");
        let path = dir.path().join("s");
        let s = Storage::open(
            &path,
            Options {
                create: true,
                ..opts(false)
            },
        )
        .expect("create the template");
        for t in 0..3u32 {
            let mut w = s.begin_write().expect("begin");
            for i in 0..40u32 {
                w.put(format!("k{:04}", i * 3 + t), vec![t as u8; 30])
                    .expect("put");
            }
            w.commit().expect("commit");
        }
        s.flush().expect("flush");
        let storage_id = s.storage_id();
        let flushed_txn = s.stats().last_flushed_txn;
        s.close().expect("close");
        Template {
            data: path.join("data.pages"),
            _dir: dir,
            storage_id,
            flushed_txn,
        }
    })
}

fn build_file(t: &Template, f: &JFile) -> (u64, Vec<u8>) {
    let no = 1 + (f.no % 4) as u64;
    let mut out = Vec::new();
    for r in f.records.iter().take(16) {
        match r {
            Rec::Raw(b) => out.extend_from_slice(b),
            Rec::Commit {
                other_storage,
                txn,
                wrong_no,
                root,
                freedir,
                next_page,
                entries,
                pages,
            } => {
                let mut images = Vec::new();
                for p in pages.iter().take(8) {
                    match p {
                        PageSpec::Leaf { page, entries } => {
                            let mut es = entries.clone();
                            es.sort();
                            es.dedup_by(|a, b| a.0 == b.0);
                            let pn = *page as u64 + 2;
                            if let Some(img) = fuzzing::leaf_page(pn, 1, &es) {
                                images.push((pn, img));
                            }
                        }
                        PageSpec::Raw { page, kind, bytes } => {
                            let pn = *page as u64 + 2;
                            let mut img = bytes.clone();
                            img.truncate(3 * 8192);
                            img.resize(img.len().max(32), 0);
                            img[4] = fuzzing::PAGE_KINDS[*kind as usize % fuzzing::PAGE_KINDS.len()];
                            images.push((pn, img));
                        }
                    }
                }
                let body = fuzzing::commit_body(
                    root.get(),
                    freedir.get(),
                    next_page.get(),
                    *entries as u64,
                    &images,
                );
                let sid = if *other_storage { 7 } else { t.storage_id };
                let jno = if *wrong_no == 0 { no } else { *wrong_no as u64 };
                out.extend(fuzzing::encode_record(
                    1,
                    jno,
                    sid,
                    t.flushed_txn + *txn as u64,
                    &body,
                ));
            }
            Rec::CommitRawBody { txn, body } => out.extend(fuzzing::encode_record(
                1,
                no,
                t.storage_id,
                t.flushed_txn + *txn as u64,
                body,
            )),
            Rec::Padding(n) => out.extend(fuzzing::encode_record(
                2,
                no,
                0,
                0,
                &vec![0; *n as usize % 9000 + 1],
            )),
            Rec::Link(b) => out.extend(fuzzing::encode_record(3, no, t.storage_id, 0, b)),
        }
    }
    out.resize(out.len() + f.zero_tail as usize * 4096, 0);
    if let Some((at, x)) = f.flip {
        if !out.is_empty() {
            let i = at as usize % out.len();
            out[i] ^= x;
        }
    }
    (no, out)
}

fuzz_target!(|input: Input| {
    let t = template();
    let dir = tempfile::tempdir_in(scratch_root()).expect("run dir");
    let path = dir.path().join("s");
    let journals = path.join("Journals");
    std::fs::create_dir_all(&journals).expect("mkdir");
    std::fs::copy(&t.data, path.join("data.pages")).expect("copy data file");
    for f in input.files.iter().take(3) {
        let (no, bytes) = build_file(t, f);
        std::fs::write(journals.join(fuzzing::journal_file_name(no)), bytes).expect("write");
    }
    let Ok(s) = Storage::open(&path, opts(input.read_only)) else {
        return;
    };
    if let Ok(r) = s.begin_read() {
        if let Ok(it) = r.iter() {
            // A damaged tree may be long or cyclic: a bounded walk.
            for kv in it.take(10_000) {
                if kv.is_err() {
                    break;
                }
            }
        }
        let _ = r.get(b"k0001");
    }
    let _ = s.check();
    if !input.read_only {
        if let Ok(mut w) = s.begin_write() {
            if w.put(b"k0001", b"after").is_ok() {
                let _ = w.commit();
            }
        }
        let _ = s.flush();
    }
    drop(s);
});
