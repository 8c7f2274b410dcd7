//! Rendering one markdown file in a child process under a kernel-enforced
//! memory limit (docs/contract.md §12.3: rendering one markdown file uses
//! at most 32 × its size in memory).
//!
//! How much memory pulldown-cmark takes for a document depends on its
//! shape (a table of `|1|2|3|` cells or a paragraph of `*a* ` runs takes
//! about 50 times its size, prose a few times), and nothing short of
//! parsing tells. So the agent does not predict it: it runs its own binary
//! (`/proc/self/exe`, which stays the running binary even after a package
//! upgrade replaced the file) with the hidden command [`COMMAND`], once per
//! markdown file. The child reads a header line and the markdown from its
//! stdin, lowers its own address-space limit (`RLIMIT_AS`) to what it maps
//! at that moment plus [`TIMES`] × the markdown's size (at least
//! [`FLOOR`]), and only then reads the document and renders it with the in-process
//! renderer ([`crate::render::render_page`]), streaming the body to its
//! stdout. An allocation the limit refuses aborts the child; the parent
//! reports the file as too dense to render, and nothing of its page is
//! used.
//!
//! The child is single-threaded (no second malloc arena is reserved), and
//! it ignores SIGTERM, SIGINT and SIGHUP: stopping the agent drains the
//! bundle in hand, and a signal to the whole process group or service
//! must not fail the page half-way. It ends when its parent goes away (its
//! next write fails).
//!
//! Protocol, parent to child: one JSON line ([`Request`]), then exactly
//! `len` bytes of markdown. Child to parent: the body in frames (a 4-byte
//! little-endian length, then that many bytes), an empty frame, then the
//! page's parts as one JSON array (`null` for the body, a string for text).

use crate::render::{Part, RenderOptions, render_page};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::{self, BufRead, BufWriter, Read, Write};

/// The hidden command of the binary that renders one file (not in
/// `--help`).
pub const COMMAND: &str = "__render";

/// The memory one file may take, in multiples of its size
/// (docs/contract.md §12.3).
pub const TIMES: u64 = 32;

/// The address space any file may take, however small. What the child maps
/// for any document (the markdown's buffer aside: the output buffer, the
/// page's skeleton, the parser's first allocations, the heap's rounding
/// and the stack's growth) measures 0.2 MiB, so [`TIMES`] × the size
/// covers it from 128 KiB up (docs/performance.md#markdown-rendering-memory).
pub const FLOOR: u64 = 4 << 20;

/// Size of the body's frames.
const FRAME: usize = 64 << 10;

/// The most bytes of the header line (the template and the bundle's
/// markdown paths are in it).
const MAX_HEADER: u64 = 64 << 20;

/// What the parent sends before the markdown.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    allow_raw_html: bool,
    source_path: String,
    generated_markdown: BTreeSet<String>,
    template: Option<String>,
    /// Bytes of markdown that follow the header.
    len: u64,
}

/// Why a file's page could not be had from the child.
#[derive(Debug)]
pub enum ChildError {
    /// The child ended on its memory limit: the file is refused. The text
    /// is what the child said, if anything.
    OverLimit(String),
    /// The child failed on this document in another way (a panic):
    /// rendering it again would fail again. The text says how.
    Crashed(String),
    /// The child could not be started or talked to, or it was stopped from
    /// outside: rendering again later may work. The text says what failed.
    Failed(String),
    /// Writing the body to the caller's sink failed.
    Sink(io::Error),
}

/// A sink that keeps its first error (the child's failure that follows
/// it is only a consequence).
struct Noting<'s> {
    sink: &'s mut dyn Write,
    error: Option<io::Error>,
}

impl Write for Noting<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sink.write(buf).map_err(|e| self.note(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sink.flush().map_err(|e| self.note(e))
    }
}

impl Noting<'_> {
    fn note(&mut self, e: io::Error) -> io::Error {
        let again = io::Error::new(e.kind(), e.to_string());
        self.error.get_or_insert(e);
        again
    }
}

/// Renders `markdown`'s page into `sink`, like [`render_page`], in a child
/// process limited to [`TIMES`] × `markdown.len()` (at least [`FLOOR`])
/// of address space. On error, what `sink` got is not a page and must be
/// thrown away.
pub fn render_in_child(
    markdown: &str,
    options: &RenderOptions<'_>,
    sink: &mut dyn Write,
) -> Result<Vec<Part>, ChildError> {
    #[cfg(not(test))]
    {
        spawn_and_render(markdown, options, sink)
    }
    // The unit tests' binary is not distributor: they render in process.
    // The integration tests run the real binary, child included.
    #[cfg(test)]
    {
        render_page(markdown, options, sink).map_err(ChildError::Sink)
    }
}

#[cfg_attr(test, allow(dead_code))]
fn spawn_and_render(
    markdown: &str,
    options: &RenderOptions<'_>,
    sink: &mut dyn Write,
) -> Result<Vec<Part>, ChildError> {
    use std::process::{Command, Stdio};
    let failed = |what: &str, e: io::Error| {
        ChildError::Failed(format!(
            "{what} the renderer process (/proc/self/exe {COMMAND}): {e}"
        ))
    };
    let mut child = Command::new("/proc/self/exe")
        .arg(COMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A panic's message stays short (the parent reads stderr last).
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .spawn()
        .map_err(|e| failed("could not start", e))?;
    let request = Request {
        allow_raw_html: options.allow_raw_html,
        source_path: options.source_path.to_owned(),
        generated_markdown: options.generated_markdown.clone(),
        template: options.template.map(str::to_owned),
        len: markdown.len() as u64,
    };
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let mut stdout = io::BufReader::with_capacity(FRAME, child.stdout.take().expect("piped"));
    let mut stderr = child.stderr.take().expect("stderr is piped");
    // The child reads all of its input before it writes anything.
    let sent = send(&mut stdin, &request, markdown);
    drop(stdin);
    let mut sink = Noting { sink, error: None };
    let received = sent.and_then(|()| receive(&mut stdout, &mut sink));
    drop(stdout);
    let mut said = Vec::new();
    let _ = (&mut stderr).take(64 << 10).read_to_end(&mut said);
    let status = child.wait().map_err(|e| failed("could not wait for", e))?;
    let said = String::from_utf8_lossy(&said).trim().to_owned();
    if let Some(e) = sink.error {
        return Err(ChildError::Sink(e));
    }
    match (status.success(), received) {
        (true, Ok(parts)) => Ok(parts),
        (true, Err(e)) => Err(failed("could not read from", e)),
        (false, _) => Err(ended(status, &said)),
    }
}

/// Writes the header line and the markdown.
fn send(to: &mut impl Write, request: &Request, markdown: &str) -> io::Result<()> {
    let mut header = serde_json::to_vec(request).map_err(io::Error::other)?;
    header.push(b'\n');
    to.write_all(&header)?;
    to.write_all(markdown.as_bytes())?;
    to.flush()
}

/// Reads the body into `sink` and then the parts.
fn receive(from: &mut impl BufRead, sink: &mut dyn Write) -> io::Result<Vec<Part>> {
    loop {
        let mut len = [0; 4];
        from.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as u64;
        if len == 0 {
            break;
        }
        let copied = io::copy(&mut from.take(len), sink)?;
        if copied != len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    sink.flush()?;
    let mut tail = Vec::new();
    from.read_to_end(&mut tail)?;
    let parts: Vec<Option<String>> = serde_json::from_slice(&tail).map_err(io::Error::other)?;
    Ok(parts
        .into_iter()
        .map(|p| p.map_or(Part::Body, Part::Text))
        .collect())
}

/// Why a child that did not exit 0 failed.
#[cfg_attr(test, allow(dead_code))]
fn ended(status: std::process::ExitStatus, said: &str) -> ChildError {
    use std::os::unix::process::ExitStatusExt;
    // Rust's hint about backtraces is no news to an operator.
    let said: Vec<&str> = said
        .lines()
        .filter(|line| !line.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let said = crate::inert::inert(&said.join("\n")).into_owned();
    let bare = said.clone();
    let said = if said.is_empty() {
        String::new()
    } else {
        format!(" ({said})")
    };
    match (status.signal(), status.code()) {
        // An allocation the limit refused aborts (the message says
        // "memory allocation of N bytes failed"); a stack the limit did not
        // let grow faults.
        (Some(libc::SIGABRT | libc::SIGSEGV | libc::SIGBUS), _) => ChildError::OverLimit(bare),
        (Some(signal), _) => ChildError::Failed(format!(
            "the renderer process (/proc/self/exe {COMMAND}) was killed by signal {signal}{said}"
        )),
        // Its stdin or stdout failed: the parent's side of the pipes.
        (None, Some(EXIT_IO)) => ChildError::Failed(format!(
            "the renderer process (/proc/self/exe {COMMAND}) failed{said}"
        )),
        // A panic (101) or anything else: rendering this text again fails
        // again.
        (None, code) => ChildError::Crashed(format!(
            "the renderer process failed on it (exit {}){said}",
            code.unwrap_or(-1)
        )),
    }
}

/// The child's exit code when its stdin or stdout failed.
const EXIT_IO: i32 = 1;

/// The child: renders the file on stdin to stdout under its memory limit.
/// Returns the exit code.
pub fn serve() -> u8 {
    ignore_stop_signals();
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let stdout = io::stdout();
    let mut output = stdout.lock();
    match serve_on(&mut input, &mut output, limit_memory) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            EXIT_IO as u8
        }
    }
}

/// Reads a request from `input`, calls `limit` with the markdown's size
/// before reading it, renders and writes the frames and parts to `output`.
fn serve_on(
    input: &mut impl BufRead,
    output: &mut impl Write,
    limit: impl FnOnce(u64) -> io::Result<()>,
) -> io::Result<()> {
    let mut header = Vec::new();
    input.take(MAX_HEADER).read_until(b'\n', &mut header)?;
    let request: Request = serde_json::from_slice(&header)
        .map_err(|e| io::Error::other(format!("reading the request: {e}")))?;
    let len = usize::try_from(request.len).map_err(io::Error::other)?;
    limit(request.len)?;
    let mut markdown = vec![0; len];
    input.read_exact(&mut markdown)?;
    let markdown = String::from_utf8(markdown).map_err(io::Error::other)?;
    let options = RenderOptions {
        allow_raw_html: request.allow_raw_html,
        source_path: &request.source_path,
        generated_markdown: &request.generated_markdown,
        template: request.template.as_deref(),
    };
    let mut body = BufWriter::with_capacity(FRAME, Frames(&mut *output));
    let parts = render_page(&markdown, &options, &mut body)?;
    body.flush()?;
    drop(body);
    output.write_all(&0u32.to_le_bytes())?;
    let parts: Vec<Option<&str>> = parts
        .iter()
        .map(|p| match p {
            Part::Text(text) => Some(text.as_str()),
            Part::Body => None,
        })
        .collect();
    serde_json::to_writer(&mut *output, &parts).map_err(io::Error::other)?;
    output.flush()
}

/// Writes each buffer it gets as one frame.
struct Frames<W: Write>(W);

impl<W: Write> Write for Frames<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let buf = &buf[..buf.len().min(FRAME)];
        if buf.is_empty() {
            return Ok(0);
        }
        self.0.write_all(&(buf.len() as u32).to_le_bytes())?;
        self.0.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Lowers this process's address-space limit to what it maps now plus
/// [`TIMES`] × `len`, at least [`FLOOR`] (never above a limit already set).
fn limit_memory(len: u64) -> io::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = mapped_now()?;
    let mut limit = now.saturating_add(len.saturating_mul(TIMES).max(FLOOR));
    let current = getrlimit(Resource::As);
    if let Some(max) = current.maximum {
        limit = limit.min(max);
    }
    // prlimit64(2): in systemd's @default set of system calls, so the
    // packaged unit's filter allows it (setrlimit(2), in @resources, is not).
    setrlimit(
        Resource::As,
        Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        },
    )
    .map_err(|e| {
        io::Error::other(format!(
            "could not lower its address-space limit (RLIMIT_AS) to {limit} bytes: {e}"
        ))
    })
}

/// Bytes of address space this process maps (`VmSize` of
/// `/proc/self/status`).
fn mapped_now() -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map(|kib| kib << 10)
        .ok_or_else(|| io::Error::other("no VmSize in /proc/self/status"))
}

/// SIGTERM, SIGINT and SIGHUP are ignored: the agent decides when a
/// rendering stops (it stops when the agent goes away).
fn ignore_stop_signals() {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: called before any other thread exists; ignoring a signal
        // touches no memory of ours.
        unsafe {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options<'a>(
        generated: &'a BTreeSet<String>,
        template: Option<&'a str>,
    ) -> RenderOptions<'a> {
        RenderOptions {
            allow_raw_html: false,
            source_path: "doc/page.md",
            generated_markdown: generated,
            template,
        }
    }

    /// The request and the reply as bytes, without a process: the page
    /// comes out the same as rendering in process, and the limit is asked
    /// for with the markdown's size before the markdown is read.
    #[test]
    fn the_protocol_carries_the_page_unchanged() {
        let generated = BTreeSet::from(["doc/page.md".to_owned(), "doc/other.md".to_owned()]);
        let big = "| a | *b* |\n|---|---|\n".to_owned() + &"| 1 | [x](other.md) |\n".repeat(20_000);
        for markdown in ["", "# Title\n\ntext <b>x</b>\n", big.as_str()] {
            for template in [None, Some("<main>{{content}}</main>{{title}}{{content}}")] {
                let options = options(&generated, template);
                let request = Request {
                    allow_raw_html: options.allow_raw_html,
                    source_path: options.source_path.to_owned(),
                    generated_markdown: generated.clone(),
                    template: template.map(str::to_owned),
                    len: markdown.len() as u64,
                };
                let mut input = Vec::new();
                send(&mut input, &request, markdown).unwrap();
                let mut output = Vec::new();
                let mut asked = None;
                serve_on(&mut &input[..], &mut output, |len| {
                    asked = Some(len);
                    Ok(())
                })
                .unwrap();
                assert_eq!(asked, Some(markdown.len() as u64));
                let mut body = Vec::new();
                let parts = receive(&mut &output[..], &mut body).unwrap();
                let body = String::from_utf8(body).unwrap();
                let page: String = parts
                    .iter()
                    .map(|p| match p {
                        Part::Text(t) => t.as_str(),
                        Part::Body => body.as_str(),
                    })
                    .collect();
                assert_eq!(page, crate::render::markdown_to_html(markdown, &options));
            }
        }
    }

    #[test]
    fn a_reply_cut_short_is_an_error() {
        let generated = BTreeSet::new();
        let markdown = "# T\n\n".to_owned() + &"text ".repeat(50_000);
        let request = Request {
            allow_raw_html: false,
            source_path: "page.md".to_owned(),
            generated_markdown: generated,
            template: None,
            len: markdown.len() as u64,
        };
        let mut input = Vec::new();
        send(&mut input, &request, &markdown).unwrap();
        let mut output = Vec::new();
        serve_on(&mut &input[..], &mut output, |_| Ok(())).unwrap();
        for cut in [0, 3, 100, FRAME + 2, output.len() - 1] {
            let mut body = Vec::new();
            assert!(receive(&mut &output[..cut], &mut body).is_err(), "{cut}");
        }
    }

    #[test]
    fn the_command_is_hidden_from_help() {
        use clap::{CommandFactory, Parser};
        let cli = crate::cli::Cli::try_parse_from(["distributor", COMMAND]).unwrap();
        assert!(matches!(cli.command, crate::cli::Command::Render));
        let help = crate::cli::Cli::command().render_help().to_string();
        assert!(!help.contains(COMMAND), "{help}");
    }

    #[test]
    fn the_limit_is_taken_from_what_the_process_maps() {
        let now = mapped_now().unwrap();
        assert!(now > 1 << 20, "{now}");
    }
}
