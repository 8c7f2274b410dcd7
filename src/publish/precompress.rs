//! Precompressed siblings (docs/contract.md §21.4): which outputs of a
//! local root get `X.gz` and `X.br` beside them ([`siblings`], pure), and
//! the compression itself ([`compress`]): deterministic, so that the same
//! output always gets the same sibling bytes and an unchanged publication
//! is still `skip_same`.
//!
//! A sibling's bytes are held like a rendered page's ([`Content`]): in
//! memory while the bundle's budget lasts, else in its scratch file. The
//! original is streamed through the compressor from the bundle (hashed on
//! the way and checked against the manifest) or from the bytes the
//! publication holds; nothing here holds an output whole.

use super::content::{Content, SPILL_FROM, Scratch, Spill};
use super::error::Error;
use crate::bundle::{self, VerifiedBundle};
use crate::catalog::{OutputKind, Sha256};
use crate::config::Encoding;
use crate::fs::hashing::{Hashed, format_digest};
use crate::paths::RelPath;
use crate::plan::Desired;
use crate::runtime::workers::{Workers, map_on};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::sync::Arc;

/// Outputs smaller than this get no sibling: a few hundred bytes saved
/// do not pay for the extra file (nginx's `gzip_min_length` is 20 bytes,
/// but its docs and every CDN draw the line near 1 KiB).
pub(crate) const MIN_SIZE: u64 = 1024;

/// The extensions of the text types that get siblings: what compresses
/// well and what browsers ask for compressed.
const TEXT_TYPES: [&str; 11] = [
    "html", "css", "js", "mjs", "json", "svg", "xml", "txt", "md", "csv", "wasm",
];

/// gzip at its best (level 9).
const GZIP_LEVEL: u32 = 9;
/// brotli at its best.
const BROTLI_QUALITY: i32 = 11;
/// brotli's window (log2 of its bytes), fixed: left to the encoder, it
/// could follow the input's size or the library's default, and a sibling
/// of the same bytes would then change.
const BROTLI_WINDOW: i32 = 22;

/// Whether an output at `path` is of a text type (by its extension,
/// in any case).
pub(crate) fn is_text_type(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty() && TEXT_TYPES.iter().any(|t| t.eq_ignore_ascii_case(ext))
    })
}

/// One sibling to make: its original (an index into the outputs given to
/// [`siblings`]), its encoding and its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Planned {
    pub original: usize,
    pub encoding: Encoding,
    pub path: RelPath,
}

/// The siblings that the outputs `desired` get with `encodings`: one per
/// encoding for each output of a text type of at least [`MIN_SIZE`]
/// bytes. A name the bundle's own outputs already take (the bundle lists
/// both `a.css` and `a.css.gz`, or a folder `a.css.gz/`) stays theirs:
/// that output gets no sibling of that encoding. So does a name too long
/// for a path (§2): the original is served uncompressed.
pub(super) fn siblings(desired: &[Desired], encodings: &[Encoding]) -> Vec<Planned> {
    if encodings.is_empty() {
        return Vec::new();
    }
    let taken: BTreeSet<&str> = desired
        .iter()
        .flat_map(|d| d.path.ancestors().chain([d.path.as_str()]))
        .collect();
    let mut out = Vec::new();
    for (i, d) in desired.iter().enumerate() {
        if d.size < MIN_SIZE || !is_text_type(d.path.as_str()) {
            continue;
        }
        for &encoding in encodings {
            let name = format!("{}{}", d.path, encoding.suffix());
            if taken.contains(name.as_str()) {
                continue;
            }
            if let Ok(path) = RelPath::parse(&name) {
                out.push(Planned {
                    original: i,
                    encoding,
                    path,
                });
            }
        }
    }
    out
}

/// Compresses everything `input` reads into `output`, deterministically:
/// gzip with no name and no time, at the best level; brotli at quality 11
/// with a fixed window. `size` is the input's size (brotli tunes itself
/// by it; given, rather than guessed from the first read, the bytes do
/// not depend on how the reads fall).
pub(crate) fn compress(
    encoding: Encoding,
    input: &mut dyn Read,
    size: u64,
    output: &mut dyn Write,
) -> io::Result<()> {
    match encoding {
        Encoding::Gzip => {
            let mut gz = flate2::GzBuilder::new()
                .mtime(0)
                .operating_system(255)
                .write(output, flate2::Compression::new(GZIP_LEVEL));
            io::copy(input, &mut gz)?;
            gz.finish()?;
        }
        Encoding::Brotli => {
            let params = brotli::enc::BrotliEncoderParams {
                quality: BROTLI_QUALITY,
                lgwin: BROTLI_WINDOW,
                size_hint: usize::try_from(size.min(1 << 30)).unwrap_or(1 << 30),
                ..Default::default()
            };
            brotli::BrotliCompress(&mut &mut *input, &mut &mut *output, &params)?;
        }
    }
    Ok(())
}

/// The siblings made so far for one bundle, by the bytes of their
/// original and their encoding: the same bytes always compress to the
/// same sibling, so destinations (and identical files) share one.
pub(super) type Made = BTreeMap<(Sha256, Encoding), (Arc<Content>, Hashed)>;

/// Originals up to this size are compressed several at once, on the
/// bundle's worker threads, each into memory; a bigger one alone, straight
/// into its [`Spill`].
const AT_ONCE_UP_TO: u64 = SPILL_FROM as u64;

/// What the originals compressed at once add up to at most (the
/// siblings are held until the group is done): a bound on the memory
/// compressing takes beyond each thread's encoder.
const GROUP_BYTES: u64 = 8 << 20;

/// Makes the `planned` siblings of `desired` (one destination's outputs,
/// whose held bytes are in `in_memory`) that `made` lacks, small ones on
/// `workers`, and adds each planned one to `desired` and `in_memory`. An
/// original not held is read from the bundle and checked against the
/// manifest (and then is in `verified`). `url` gives an output path its
/// url.
#[allow(clippy::too_many_arguments)]
pub(super) fn make(
    planned: Vec<Planned>,
    desired: &mut Vec<Desired>,
    in_memory: &mut BTreeMap<RelPath, Arc<Content>>,
    url: &dyn Fn(&RelPath) -> Option<String>,
    bundle: &VerifiedBundle,
    made: &mut Made,
    room: &mut Scratch,
    verified: &mut BTreeSet<RelPath>,
    warnings: &mut Vec<String>,
    workers: &dyn Workers,
) -> Result<(), Error> {
    // Each sibling not made yet, once.
    let mut todo: Vec<Job<'_>> = Vec::new();
    let mut keys = BTreeSet::new();
    for p in &planned {
        let original = &desired[p.original];
        let key = (original.sha256, p.encoding);
        if !made.contains_key(&key) && keys.insert(key) {
            todo.push(Job {
                key,
                original,
                held: in_memory.get(&original.path).map(Arc::clone),
            });
        }
    }
    let mut rest = &todo[..];
    while !rest.is_empty() {
        let group = group_len(rest);
        let (now, later) = rest.split_at(group);
        rest = later;
        let results = if let [big] = now
            && big.original.size > AT_ONCE_UP_TO
        {
            vec![compress_spilled(big, bundle, room)]
        } else {
            let compressed = map_on(workers, now, |job| compress_held(job, bundle));
            let mut results = Vec::new();
            for c in compressed {
                results.push(c.and_then(|(bytes, hashed)| keep(bytes, hashed, room)));
            }
            results
        };
        for (job, result) in now.iter().zip(results) {
            let sibling = result?;
            if job.held.is_none() {
                verified.insert(job.original.bundle_path.clone());
            }
            if let Some(why) = sibling.refused {
                let warning = format!(
                    "{}: its precompressed siblings, and any later one of this bundle too big to hold, were kept in memory ({why}); the folder must be writable by the agent's user and on a file system with O_TMPFILE (ext4, xfs, btrfs, tmpfs)",
                    job.original.path
                );
                log::warn!("{warning}");
                warnings.push(warning);
            }
            made.insert(job.key, (Arc::new(sibling.content), sibling.hashed));
        }
    }
    for p in planned {
        let original = &desired[p.original];
        let (content, hashed) = &made[&(original.sha256, p.encoding)];
        let sibling = Desired {
            url: url(&p.path),
            path: p.path.clone(),
            kind: OutputKind::Generated,
            bundle_path: original.bundle_path.clone(),
            transform: Some(p.encoding.transform()),
            sha256: Sha256::parse(&hashed.sha256).expect("hashing gives sha256 digests"),
            size: hashed.size,
        };
        in_memory.insert(p.path, Arc::clone(content));
        desired.push(sibling);
    }
    Ok(())
}

/// How many of `jobs` (at least one) to compress now: one big original
/// alone, or small ones up to [`GROUP_BYTES`] together.
fn group_len(jobs: &[Job<'_>]) -> usize {
    if jobs[0].original.size > AT_ONCE_UP_TO {
        return 1;
    }
    let mut total = 0;
    let fit = jobs.iter().take_while(|j| {
        total += j.original.size;
        j.original.size <= AT_ONCE_UP_TO && total <= GROUP_BYTES
    });
    fit.count().max(1)
}

/// One sibling to make: of the bytes `original` names, `held` by the
/// publication or else in the bundle.
struct Job<'d> {
    key: (Sha256, Encoding),
    original: &'d Desired,
    held: Option<Arc<Content>>,
}

/// A sibling made: its bytes, their hash, and why they stayed in memory
/// although big, if so.
struct Sibling {
    content: Content,
    hashed: Hashed,
    refused: Option<String>,
}

/// Compresses `job`'s original into `output`, hashing what it reads and
/// checking it against what the original says.
fn compress_into(
    job: &Job<'_>,
    bundle: &VerifiedBundle,
    output: &mut dyn Write,
) -> Result<(), Error> {
    let original = job.original;
    let file;
    let mut reader: Box<dyn Read + '_> = match &job.held {
        Some(content) => Box::new(content.reader()),
        None => {
            file =
                bundle::open_listed(&bundle.dir, &original.bundle_path).map_err(Error::Bundle)?;
            Box::new((&file).take(original.size + 1))
        }
    };
    let mut input = Hashing::new(&mut *reader);
    compress(job.key.1, &mut input, original.size, output).map_err(Error::Prepare)?;
    let read = input.into_parts().1;
    if read.sha256 == original.sha256 && read.size == original.size {
        return Ok(());
    }
    Err(match job.held {
        Some(_) => Error::Prepare(io::Error::other(format!(
            "{}: the bytes compressed ({} bytes, sha256 {}) are not those of the output ({} bytes, sha256 {}): the temporary file holding a rendered page changed; check the disk of the spool's work folder",
            original.path, read.size, read.sha256, original.size, original.sha256
        ))),
        None => {
            let listed = (bundle.manifest.files.iter())
                .find(|f| f.path == original.bundle_path)
                .expect("copied outputs come from listed files");
            Error::Bundle(bundle::BundleError::Invalid {
                problems: vec![bundle::mismatch_problem(listed, &read)],
            })
        }
    })
}

/// A small original's sibling, in memory, and its hash.
fn compress_held(job: &Job<'_>, bundle: &VerifiedBundle) -> Result<(Vec<u8>, Hashed), Error> {
    // Text compresses to a fraction of its size.
    let mut output = Hashing::new(Vec::with_capacity(
        usize::try_from(job.original.size / 3).unwrap_or(0),
    ));
    compress_into(job, bundle, &mut output)?;
    Ok(output.into_parts())
}

/// A sibling made in memory, kept there while the bundle's budget lasts,
/// else in its scratch file.
fn keep(bytes: Vec<u8>, hashed: Hashed, room: &mut Scratch) -> Result<Sibling, Error> {
    if room.hold(bytes.len()) {
        return Ok(Sibling {
            content: Content::from_bytes(bytes),
            hashed,
            refused: None,
        });
    }
    let mut spill = Spill::new(room, 0);
    spill.write_all(&bytes).map_err(Error::Prepare)?;
    let (body, refused) = spill.finish().map_err(Error::Prepare)?;
    Ok(Sibling {
        content: Content::whole(body),
        hashed,
        refused,
    })
}

/// A big original's sibling, compressed straight into the bundle's room
/// (its scratch file, mostly), never whole in memory.
fn compress_spilled(
    job: &Job<'_>,
    bundle: &VerifiedBundle,
    room: &mut Scratch,
) -> Result<Sibling, Error> {
    let estimate = usize::try_from(job.original.size / 3).unwrap_or(usize::MAX);
    let mut output = Hashing::new(Spill::new(room, estimate));
    compress_into(job, bundle, &mut output)?;
    let (spill, hashed) = output.into_parts();
    let (body, refused) = spill.finish().map_err(Error::Prepare)?;
    Ok(Sibling {
        content: Content::whole(body),
        hashed,
        refused,
    })
}

/// Hashes and counts what goes through it, read or written. Reading, it
/// stops when the agent is asked to stop (a big original takes a while to
/// compress).
struct Hashing<T> {
    inner: T,
    hasher: sha2::Sha256,
    size: u64,
}

impl<T> Hashing<T> {
    fn new(inner: T) -> Hashing<T> {
        use sha2::Digest as _;
        Hashing {
            inner,
            hasher: sha2::Sha256::new(),
            size: 0,
        }
    }

    fn add(&mut self, bytes: &[u8]) {
        use sha2::Digest as _;
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
    }

    fn into_parts(self) -> (T, Hashed) {
        let hashed = Hashed {
            sha256: format_digest(self.hasher),
            size: self.size,
        };
        (self.inner, hashed)
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        crate::runtime::interrupt::check_entered()?;
        let n = self.inner.read(buf)?;
        self.add(&buf[..n]);
        crate::runtime::progress::add_bytes(n as u64);
        Ok(n)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.add(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(path: &str, size: u64) -> Desired {
        let p = RelPath::parse(path).unwrap();
        Desired {
            path: p.clone(),
            kind: OutputKind::Source,
            bundle_path: p,
            transform: None,
            url: None,
            sha256: Sha256([0; 32]),
            size,
        }
    }

    #[test]
    fn text_types_are_told_by_their_extension_in_any_case() {
        // (path, text type)
        let cases = [
            ("index.html", true),
            ("a/b/site.CSS", true),
            ("app.js", true),
            ("mod.mjs", true),
            ("data.json", true),
            ("logo.svg", true),
            ("feed.xml", true),
            ("notes.txt", true),
            ("README.md", true),
            ("table.csv", true),
            ("app.wasm", true),
            ("index.htm", false),
            ("photo.png", false),
            ("archive.tar.gz", false),
            ("index.html.gz", false),
            ("index.html.br", false),
            ("html", false),
            ("dir.css/file", false),
            (".css", false),
            ("a/.json", false),
        ];
        for (path, text) in cases {
            assert_eq!(is_text_type(path), text, "{path}");
        }
    }

    #[test]
    fn text_outputs_of_at_least_1_kib_get_a_sibling_per_encoding() {
        use Encoding::{Brotli, Gzip};
        let desired = [
            output("a.css", MIN_SIZE),         // 0: exactly 1 KiB
            output("small.css", MIN_SIZE - 1), // 1: too small
            output("p.png", 1 << 20),          // 2: not text
            output("own.js", 4096),            // 3: its .gz is the bundle's own
            output("own.js.gz", 10),           // 4
            output("dir.json", 4096),          // 5: its .br is a folder of the bundle
            output("dir.json.br/x.txt", 10),   // 6
            output("docs/index.html", 9000),   // 7
        ];
        let got = |encodings: &[Encoding]| -> Vec<(usize, Encoding, String)> {
            siblings(&desired, encodings)
                .into_iter()
                .map(|p| (p.original, p.encoding, p.path.as_str().to_owned()))
                .collect()
        };
        assert_eq!(got(&[]), []);
        assert_eq!(
            got(&[Gzip, Brotli]),
            [
                (0, Gzip, "a.css.gz".to_owned()),
                (0, Brotli, "a.css.br".to_owned()),
                (3, Brotli, "own.js.br".to_owned()),
                (5, Gzip, "dir.json.gz".to_owned()),
                (7, Gzip, "docs/index.html.gz".to_owned()),
                (7, Brotli, "docs/index.html.br".to_owned()),
            ]
        );
        assert_eq!(
            got(&[Brotli]),
            [
                (0, Brotli, "a.css.br".to_owned()),
                (3, Brotli, "own.js.br".to_owned()),
                (7, Brotli, "docs/index.html.br".to_owned()),
            ]
        );
        // A name one byte short of the segment limit has no room for ".gz".
        let long = format!("{}.txt", "n".repeat(crate::paths::MAX_SEGMENT_BYTES - 6));
        assert_eq!(siblings(&[output(&long, 4096)], &[Gzip]), []);
    }

    #[test]
    fn small_originals_are_compressed_together_up_to_a_bound_big_ones_alone() {
        let big = AT_ONCE_UP_TO + 1;
        let most = AT_ONCE_UP_TO;
        // (sizes of the originals left, how many are compressed now)
        let cases: &[(&[u64], usize)] = &[
            (&[10], 1),
            (&[10, 20, 30], 3),
            (&[10, 20, big, 30], 2),
            (&[big, 10], 1),
            (&[most; 8], 8),
            (&[most; 9], 8),
            (&[most, most, big], 2),
        ];
        for (sizes, want) in cases {
            let outputs: Vec<Desired> = sizes.iter().map(|s| output("a.css", *s)).collect();
            let jobs: Vec<Job<'_>> = (outputs.iter())
                .map(|original| Job {
                    key: (original.sha256, Encoding::Gzip),
                    original,
                    held: None,
                })
                .collect();
            assert_eq!(group_len(&jobs), *want, "{sizes:?}");
        }
    }

    /// Some text that compresses, `len` bytes.
    fn text(len: usize) -> Vec<u8> {
        let words = ["alpha ", "beta ", "gamma\n", "<p>delta</p>", "{\"e\": 1}"];
        let mut out = Vec::new();
        let mut i = 0usize;
        while out.len() < len {
            out.extend_from_slice(words[(i * 7 + i / 3) % words.len()].as_bytes());
            i += 1;
        }
        out.truncate(len);
        out
    }

    /// Compresses `bytes`, feeding them in reads of at most `chunk` bytes.
    fn compressed(encoding: Encoding, bytes: &[u8], chunk: usize) -> Vec<u8> {
        struct Trickle<'a>(&'a [u8], usize);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(self.1).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut out = Vec::new();
        compress(
            encoding,
            &mut Trickle(bytes, chunk),
            bytes.len() as u64,
            &mut out,
        )
        .unwrap();
        out
    }

    fn decompressed(encoding: Encoding, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match encoding {
            Encoding::Gzip => {
                flate2::read::GzDecoder::new(bytes)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Encoding::Brotli => {
                brotli::Decompressor::new(bytes, 4096)
                    .read_to_end(&mut out)
                    .unwrap();
            }
        };
        out
    }

    #[test]
    fn the_same_bytes_always_compress_to_the_same_sibling() {
        for encoding in [Encoding::Gzip, Encoding::Brotli] {
            for len in [1024, 70_000] {
                let input = text(len);
                let once = compressed(encoding, &input, usize::MAX);
                assert!(
                    once.len() < input.len() / 4,
                    "{encoding:?} {len}: {}",
                    once.len()
                );
                assert_eq!(decompressed(encoding, &once), input, "{encoding:?} {len}");
                // However the reads fall.
                for chunk in [1, 1000, 4096] {
                    assert_eq!(
                        compressed(encoding, &input, chunk),
                        once,
                        "{encoding:?} {len} in reads of {chunk}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_gzip_sibling_has_no_name_no_time_and_says_best_compression() {
        let gz = compressed(Encoding::Gzip, &text(4096), usize::MAX);
        // ID1 ID2 CM=deflate FLG=none, MTIME 0, XFL=2 (best), OS=255 (unknown).
        assert_eq!(gz[..10], [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 255]);
        let decoder = flate2::read::GzDecoder::new(&gz[..]);
        let header = decoder.header().expect("a gzip header");
        assert_eq!(header.filename(), None);
        assert_eq!(header.mtime(), 0);
        assert_eq!(header.comment(), None);
    }

    #[test]
    fn a_brotli_sibling_is_smaller_than_the_gzip_one() {
        // Quality 11 shows: on text it beats gzip -9.
        let input = text(100_000);
        let gz = compressed(Encoding::Gzip, &input, usize::MAX);
        let br = compressed(Encoding::Brotli, &input, usize::MAX);
        assert!(br.len() < gz.len(), "br {} gz {}", br.len(), gz.len());
    }
}
