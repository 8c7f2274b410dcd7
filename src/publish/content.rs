//! Output bytes a publication holds itself rather than copies from the
//! bundle: rendered pages, precompressed siblings, and markdown files read
//! (and verified) for rendering. One [`Content`] is shared by every destination that publishes
//! it, and each reads it with its own [`Reader`].
//!
//! What a bundle holds in memory is bounded ([`Scratch`]): a page's body
//! stays in memory up to [`SPILL_FROM`] bytes while the bundle's budget
//! lasts; past that it goes to the bundle's scratch file, one unnamed
//! temporary file (`O_TMPFILE`: it has no name, so nobody else can open
//! it, and it is gone when closed, crash included) holding such bodies one
//! after another. A page can be many times its markdown (an empty heading
//! `#` becomes about 110 bytes), so holding it would break the bound docs/contract.md
//! §12.3 puts on rendering memory, and a bundle of many pages would hold
//! them all.

use crate::render::Part;
use rustix::fs::{Mode, OFlags};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A body up to this size stays in memory (while the bundle's budget lasts).
pub(crate) const SPILL_FROM: usize = 1 << 20;

/// Bytes of pages and markdown one bundle holds in memory at most; the
/// rest of its pages go to its scratch file and its markdown files are
/// read again from the bundle when they are copied.
pub(crate) const HOLD_AT_MOST: usize = 4 << 20;

/// One bundle's room for rendered pages: what it holds in memory, and its
/// scratch file for the rest.
pub(crate) struct Scratch {
    dir: PathBuf,
    file: Option<Arc<File>>,
    /// Where the next body starts in the file.
    end: u64,
    /// Bytes held in memory so far.
    held: usize,
    /// Why the file could not be made (then bodies stay in memory).
    refused: Option<String>,
    /// Whether a body has already reported `refused` (once per bundle).
    reported: bool,
}

impl Scratch {
    /// Room whose file, when one is needed, is made in `dir`.
    pub(crate) fn new(dir: &Path) -> Scratch {
        Scratch {
            dir: dir.to_owned(),
            file: None,
            end: 0,
            held: 0,
            refused: None,
            reported: false,
        }
    }

    /// Takes `bytes` of the budget for something to hold in memory; false
    /// (and nothing taken) when they do not fit.
    pub(crate) fn hold(&mut self, bytes: usize) -> bool {
        let fits = self.held + bytes <= HOLD_AT_MOST;
        if fits {
            self.held += bytes;
        }
        fits
    }

    /// The scratch file, made at the first need.
    fn file(&mut self) -> Option<Arc<File>> {
        if self.file.is_none() && self.refused.is_none() {
            match anonymous_file(&self.dir) {
                Ok(file) => self.file = Some(Arc::new(file)),
                Err(e) => {
                    self.refused = Some(format!(
                        "cannot create a temporary file in {}: {e}",
                        self.dir.display()
                    ));
                }
            }
        }
        self.file.clone()
    }
}

/// The bytes of one output: text parts around a body (the page's skeleton
/// or template), or just a body.
pub(crate) struct Content {
    parts: Vec<Part>,
    body: Body,
}

enum Body {
    Memory(Vec<u8>),
    /// `len` bytes of a scratch file from `start`.
    File {
        file: Arc<File>,
        start: u64,
        len: u64,
    },
}

impl Body {
    /// Reads from `offset` into `buf`; 0 at the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match self {
            Body::Memory(bytes) => Ok(read_slice(bytes, buf, offset)),
            Body::File { file, start, len } => {
                let left = len.saturating_sub(offset);
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                if want == 0 {
                    return Ok(0);
                }
                let n = file.read_at(&mut buf[..want], start + offset)?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the temporary file holding a rendered page got shorter",
                    ));
                }
                Ok(n)
            }
        }
    }
}

/// Copies what `bytes` holds from `offset` into `buf`.
fn read_slice(bytes: &[u8], buf: &mut [u8], offset: u64) -> usize {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let n = buf.len().min(bytes.len() - start);
    buf[..n].copy_from_slice(&bytes[start..start + n]);
    n
}

impl Content {
    /// Bytes already in memory.
    pub(crate) fn from_bytes(bytes: Vec<u8>) -> Content {
        Content {
            parts: vec![Part::Body],
            body: Body::Memory(bytes),
        }
    }

    /// A rendered page: its parts and the body they place.
    pub(crate) fn page(parts: Vec<Part>, body: Spilled) -> Content {
        Content {
            parts,
            body: body.0,
        }
    }

    /// A body on its own (a precompressed sibling).
    pub(crate) fn whole(body: Spilled) -> Content {
        Content::page(vec![Part::Body], body)
    }

    /// The bytes when they are all in memory in one piece (a markdown file
    /// read for rendering).
    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> Option<&[u8]> {
        match (&self.parts[..], &self.body) {
            ([Part::Body], Body::Memory(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// Whether the body is in a scratch file.
    pub(crate) fn is_spilled(&self) -> bool {
        matches!(self.body, Body::File { .. })
    }

    /// A reader from the first byte. Readers are independent: several
    /// destinations may read one content at once.
    pub(crate) fn reader(&self) -> Reader<'_> {
        Reader {
            content: self,
            part: 0,
            offset: 0,
        }
    }
}

/// Reads a [`Content`] from its start.
pub(crate) struct Reader<'a> {
    content: &'a Content,
    part: usize,
    /// Position within the current part.
    offset: u64,
}

impl Read for Reader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        while let Some(part) = self.content.parts.get(self.part) {
            let n = match part {
                Part::Text(text) => read_slice(text.as_bytes(), buf, self.offset),
                Part::Body => self.content.body.read_at(buf, self.offset)?,
            };
            if n > 0 {
                self.offset += n as u64;
                return Ok(n);
            }
            self.part += 1;
            self.offset = 0;
        }
        Ok(0)
    }
}

/// A rendered body once written: in memory or in the scratch file.
pub(crate) struct Spilled(Body);

/// Writes at a position of a file (the scratch file is shared by the
/// bodies of a bundle, one after another).
struct WriteAt {
    file: Arc<File>,
    at: u64,
}

impl Write for WriteAt {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where one body is written while it is rendered: memory up to
/// [`SPILL_FROM`] bytes (and what is left of the bundle's budget), then
/// the bundle's scratch file. When that file cannot be made, the body
/// stays in memory and [`Spill::finish`] says why, for the bundle's
/// warnings.
pub(crate) struct Spill<'s> {
    scratch: &'s mut Scratch,
    memory: Vec<u8>,
    file: Option<BufWriter<WriteAt>>,
    /// Where this body starts in the scratch file.
    start: u64,
    len: u64,
    /// It outgrew memory but the scratch file could not be made.
    stayed: bool,
}

impl<'s> Spill<'s> {
    /// A sink for a body expected to be about `estimate` bytes.
    pub(crate) fn new(scratch: &'s mut Scratch, estimate: usize) -> Spill<'s> {
        let start = scratch.end;
        Spill {
            memory: Vec::with_capacity(
                estimate
                    .min(SPILL_FROM)
                    .min(HOLD_AT_MOST.saturating_sub(scratch.held)),
            ),
            scratch,
            file: None,
            start,
            len: 0,
            stayed: false,
        }
    }

    /// The body written, and why it stayed in memory although big, if so
    /// (said for the first such body of the bundle only).
    pub(crate) fn finish(self) -> io::Result<(Spilled, Option<String>)> {
        let Spill {
            scratch,
            memory,
            file,
            start,
            len,
            stayed,
        } = self;
        let body = match file {
            Some(writer) => {
                let writer = writer
                    .into_inner()
                    .map_err(io::IntoInnerError::into_error)?;
                scratch.end = start + len;
                Body::File {
                    file: writer.file,
                    start,
                    len,
                }
            }
            None => {
                scratch.held += memory.len();
                let refused = if stayed && !scratch.reported {
                    scratch.reported = true;
                    scratch.refused.clone()
                } else {
                    None
                };
                return Ok((Spilled(Body::Memory(memory)), refused));
            }
        };
        Ok((Spilled(body), None))
    }

    /// How much more this body may hold in memory.
    fn room(&self) -> usize {
        SPILL_FROM.min(HOLD_AT_MOST.saturating_sub(self.scratch.held))
    }
}

impl Write for Spill<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.file.is_none() && self.memory.len() + buf.len() > self.room() {
            if let Some(file) = self.scratch.file() {
                let mut writer = BufWriter::with_capacity(
                    64 << 10,
                    WriteAt {
                        file,
                        at: self.start,
                    },
                );
                writer.write_all(&self.memory)?;
                self.memory = Vec::new();
                self.file = Some(writer);
            } else {
                self.stayed = true;
            }
        }
        match &mut self.file {
            Some(file) => file.write_all(buf)?,
            None => self.memory.extend_from_slice(buf),
        }
        self.len += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.file {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }
}

/// A new file in `dir` without a name, readable and writable by this
/// process alone.
fn anonymous_file(dir: &Path) -> io::Result<File> {
    let fd = rustix::fs::open(
        dir,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?;
    Ok(File::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(content: &Content, chunk: usize) -> Vec<u8> {
        let mut reader = content.reader();
        let mut out = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            let n = reader.read(&mut buf).unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    fn parts() -> Vec<Part> {
        vec![
            Part::Text("<head>".into()),
            Part::Body,
            Part::Text(String::new()),
            Part::Text("<mid>".into()),
            Part::Body,
            Part::Text("</end>".into()),
        ]
    }

    /// Writes `len` bytes (a repeating pattern) as one body; returns the
    /// content made of `parts` around it and the bytes written.
    fn body(scratch: &mut Scratch, parts: Vec<Part>, len: usize) -> (Content, Vec<u8>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut spill = Spill::new(scratch, 10);
        for chunk in bytes.chunks(1000) {
            spill.write_all(chunk).unwrap();
        }
        let (body, refused) = spill.finish().unwrap();
        assert_eq!(refused, None);
        (Content::page(parts, body), bytes)
    }

    #[test]
    fn a_small_body_stays_in_memory_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Scratch::new(dir.path());
        let mut spill = Spill::new(&mut scratch, 10);
        spill.write_all(b"body").unwrap();
        let (body, refused) = spill.finish().unwrap();
        assert_eq!(refused, None);
        let content = Content::page(parts(), body);
        assert!(!content.is_spilled());
        for chunk in [1, 3, 4096] {
            assert_eq!(read_all(&content, chunk), b"<head>body<mid>body</end>");
        }
    }

    #[test]
    fn big_bodies_share_one_unnamed_file_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Scratch::new(dir.path());
        let (first, first_bytes) = body(&mut scratch, parts(), SPILL_FROM + 7);
        let (second, second_bytes) = body(&mut scratch, vec![Part::Body], SPILL_FROM * 2);
        assert!(first.is_spilled() && second.is_spilled());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the file has no name"
        );
        let mut expected = b"<head>".to_vec();
        expected.extend_from_slice(&first_bytes);
        expected.extend_from_slice(b"<mid>");
        expected.extend_from_slice(&first_bytes);
        expected.extend_from_slice(b"</end>");
        // Two readers at once do not disturb each other.
        let mut reader = first.reader();
        let mut some = [0; 1000];
        reader.read_exact(&mut some).unwrap();
        assert_eq!(read_all(&first, 65536), expected);
        let mut rest = some.to_vec();
        reader.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, expected);
        assert_eq!(read_all(&second, 4096), second_bytes);
    }

    #[test]
    fn a_bundle_holds_at_most_its_budget_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let mut scratch = Scratch::new(dir.path());
        assert!(scratch.hold(HOLD_AT_MOST - SPILL_FROM / 2));
        assert!(!scratch.hold(SPILL_FROM), "past the budget");
        // Half a body's room is left: a body of that size stays, the next
        // one, however small, goes to the file.
        let (held, _) = body(&mut scratch, vec![Part::Body], SPILL_FROM / 2);
        assert!(!held.is_spilled());
        let (spilled, bytes) = body(&mut scratch, vec![Part::Body], 10);
        assert!(spilled.is_spilled());
        assert_eq!(read_all(&spilled, 3), bytes);
    }

    #[test]
    fn a_body_that_cannot_spill_stays_in_memory_and_says_why() {
        let missing = Path::new("/nonexistent-distributor-scratch");
        let mut scratch = Scratch::new(missing);
        let mut spill = Spill::new(&mut scratch, 10);
        spill.write_all(&vec![b'y'; SPILL_FROM + 5]).unwrap();
        let (body, refused) = spill.finish().unwrap();
        let refused = refused.expect("the reason is kept");
        assert!(
            refused.contains("nonexistent-distributor-scratch"),
            "{refused}"
        );
        let content = Content::page(vec![Part::Body], body);
        assert!(!content.is_spilled());
        assert_eq!(read_all(&content, 1 << 16).len(), SPILL_FROM + 5);
        // Bodies that cannot spill take the bundle past its budget; the
        // next ones still work (in memory).
        for _ in 0..5 {
            let mut spill = Spill::new(&mut scratch, 10);
            spill.write_all(&vec![b'z'; SPILL_FROM]).unwrap();
            let (body, _) = spill.finish().unwrap();
            let content = Content::page(vec![Part::Body], body);
            assert_eq!(read_all(&content, 4096).len(), SPILL_FROM);
        }
    }
}
