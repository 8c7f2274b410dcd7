//! Output bytes a publication holds itself rather than copies from the
//! bundle: rendered pages, and markdown files read (and verified) for
//! rendering. One [`Content`] is shared by every destination that publishes
//! it, and each reads it with its own [`Reader`].
//!
//! A page's body stays in memory up to [`SPILL_FROM`] bytes; a bigger one
//! goes to an unnamed temporary file (`O_TMPFILE`: it has no name, so
//! nobody else can open it, and it is gone when closed, crash included).
//! A page can be many times its markdown (an empty heading `#` becomes
//! about 110 bytes), so holding it would break the bound SPEC §12.3 puts on
//! rendering memory.

use crate::render::{BodySink, Part};
use rustix::fs::{Mode, OFlags};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bodies up to this size stay in memory.
pub(super) const SPILL_FROM: usize = 1 << 20;

/// The bytes of one output: text parts around a body (the page's skeleton
/// or template), or just a body.
pub(super) struct Content {
    parts: Vec<Part>,
    body: Body,
}

enum Body {
    Memory(Vec<u8>),
    File { file: File, len: u64 },
}

impl Body {
    /// Reads from `offset` into `buf`; 0 at the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        match self {
            Body::Memory(bytes) => Ok(read_slice(bytes, buf, offset)),
            Body::File { file, len } => {
                let left = len.saturating_sub(offset);
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                if want == 0 {
                    return Ok(0);
                }
                let n = file.read_at(&mut buf[..want], offset)?;
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
    pub(super) fn from_bytes(bytes: Vec<u8>) -> Content {
        Content {
            parts: vec![Part::Body],
            body: Body::Memory(bytes),
        }
    }

    /// A rendered page: its parts and the body they place.
    pub(super) fn page(parts: Vec<Part>, body: Spilled) -> Content {
        Content {
            parts,
            body: body.0,
        }
    }

    /// The bytes when they are all in memory in one piece (a markdown file
    /// read for rendering).
    pub(super) fn as_slice(&self) -> Option<&[u8]> {
        match (&self.parts[..], &self.body) {
            ([Part::Body], Body::Memory(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// Whether the body is in a temporary file.
    #[cfg(test)]
    pub(super) fn is_spilled(&self) -> bool {
        matches!(self.body, Body::File { .. })
    }

    /// A reader from the first byte. Readers are independent: several
    /// destinations may read one content at once.
    pub(super) fn reader(&self) -> Reader<'_> {
        Reader {
            content: self,
            part: 0,
            offset: 0,
        }
    }
}

/// Reads a [`Content`] from its start.
pub(super) struct Reader<'a> {
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

/// A rendered body once written: in memory or in its temporary file.
pub(super) struct Spilled(Body);

/// Where a body is written while it is rendered: memory up to
/// [`SPILL_FROM`] bytes, then an unnamed file in `dir`. When that file
/// cannot be created, the body stays in memory and [`Spill::finish`] says
/// why, for the bundle's warnings.
pub(super) struct Spill {
    dir: PathBuf,
    memory: Vec<u8>,
    file: Option<BufWriter<File>>,
    len: u64,
    /// Why the body stayed in memory past [`SPILL_FROM`].
    refused: Option<String>,
}

impl Spill {
    /// A sink for a body expected to be about `estimate` bytes.
    pub(super) fn new(dir: &Path, estimate: usize) -> Spill {
        Spill {
            dir: dir.to_owned(),
            memory: Vec::with_capacity(estimate.min(SPILL_FROM)),
            file: None,
            len: 0,
            refused: None,
        }
    }

    /// The body written, and why it stayed in memory although big, if so.
    pub(super) fn finish(self) -> io::Result<(Spilled, Option<String>)> {
        let body = match self.file {
            Some(writer) => Body::File {
                file: writer
                    .into_inner()
                    .map_err(io::IntoInnerError::into_error)?,
                len: self.len,
            },
            None => Body::Memory(self.memory),
        };
        Ok((Spilled(body), self.refused))
    }

    /// Moves what memory holds into a new temporary file, or notes why not.
    fn spill(&mut self) -> io::Result<()> {
        match anonymous_file(&self.dir) {
            Ok(file) => {
                let mut writer = BufWriter::with_capacity(64 << 10, file);
                writer.write_all(&self.memory)?;
                self.memory = Vec::new();
                self.file = Some(writer);
            }
            Err(e) => {
                self.refused = Some(format!(
                    "cannot create a temporary file in {}: {e}",
                    self.dir.display()
                ));
            }
        }
        Ok(())
    }
}

impl Write for Spill {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.file.is_none()
            && self.refused.is_none()
            && self.memory.len() + buf.len() > SPILL_FROM
        {
            self.spill()?;
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

impl BodySink for Spill {
    fn restart(&mut self) -> io::Result<()> {
        // The next round is about as long: keep the file, from its start.
        if let Some(writer) = &mut self.file {
            writer.flush()?;
            writer.get_ref().set_len(0)?;
            io::Seek::rewind(writer.get_mut())?;
        }
        self.memory.clear();
        self.len = 0;
        Ok(())
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

    #[test]
    fn a_small_body_stays_in_memory_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::new(dir.path(), 10);
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
    fn a_big_body_goes_to_an_unnamed_file_and_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::new(dir.path(), 10);
        let line: Vec<u8> = (0..=255u8).collect();
        let mut expected_body = Vec::new();
        while expected_body.len() <= SPILL_FROM {
            spill.write_all(&line).unwrap();
            expected_body.extend_from_slice(&line);
        }
        let (body, refused) = spill.finish().unwrap();
        assert_eq!(refused, None);
        let content = Content::page(parts(), body);
        assert!(content.is_spilled());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the file has no name"
        );
        let mut expected = b"<head>".to_vec();
        expected.extend_from_slice(&expected_body);
        expected.extend_from_slice(b"<mid>");
        expected.extend_from_slice(&expected_body);
        expected.extend_from_slice(b"</end>");
        // Two readers at once do not disturb each other.
        let mut first = content.reader();
        let mut some = [0; 1000];
        first.read_exact(&mut some).unwrap();
        assert_eq!(read_all(&content, 65536), expected);
        let mut rest = some.to_vec();
        first.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, expected);
    }

    #[test]
    fn a_restart_forgets_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::new(dir.path(), 10);
        spill.write_all(&vec![b'x'; SPILL_FROM + 1]).unwrap();
        spill.restart().unwrap();
        spill.write_all(b"again").unwrap();
        let (body, _) = spill.finish().unwrap();
        let content = Content::page(vec![Part::Body], body);
        assert_eq!(read_all(&content, 7), b"again");
    }

    #[test]
    fn a_body_that_cannot_spill_stays_in_memory_and_says_why() {
        let missing = Path::new("/nonexistent-distributor-scratch");
        let mut spill = Spill::new(missing, 10);
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
    }
}
