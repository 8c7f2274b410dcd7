//! Rendering markdown in child processes under a kernel-enforced memory
//! limit (docs/contract.md §12.3: rendering one markdown file takes at
//! most 32 × `limits.max_markdown_bytes` in memory).
//!
//! How much memory pulldown-cmark takes for a document depends on its
//! shape (a table of `|1|2|3|` cells or a paragraph of `*a* ` runs takes
//! about 50 times its size, prose a few times, cmark-gfm's pathological
//! inputs up to 150 times), and nothing short of parsing tells. So the
//! agent does not predict it (contract §21.6): it runs its own binary
//! (`/proc/self/exe`, which stays the running binary even after a package
//! upgrade replaced the file) with the hidden command [`COMMAND`], and
//! sends it markdown files one after another over a pipe. Before each
//! document the child sets its own address-space limit (`RLIMIT_AS`) to
//! what it maps at that moment plus [`crate::bundle::markdown_memory`] of
//! the largest file it may be sent (`limits.max_markdown_bytes`, in the
//! request: 128 MiB for 4 MiB), whatever the document's own size, and
//! only then reads the document and renders it with the in-process
//! renderer ([`crate::render::render_page`]), streaming the body to its
//! stdout. An allocation the limit refuses aborts the child; the parent
//! refuses the file, naming the limit, and nothing of its page is used.
//!
//! setrlimit(2) lets an unprivileged process set its soft limit anywhere
//! up to its hard limit, and lower the hard limit for good. On its first
//! document the child lowers its hard limit to what it maps then plus
//! that room plus [`GROWTH`], so no document can ever take more. A child
//! whose mapping has grown so much since (or that was made for a smaller
//! `limits.max_markdown_bytes`) that a document's room would not fit under
//! the hard limit says so before rendering anything and ends; the parent
//! renders the document on a fresh child.
//!
//! Children are kept in a small pool ([`Pool`], one per process, in its
//! [`crate::runtime::process_state::ProcessState`]): a document
//! takes an idle child or starts one, and gives it back once its page has
//! been read whole. A child that failed in any way (its limit reached, a
//! crash, a pipe error, the caller's sink failing) is never given back, so
//! the next document gets a fresh one. At most one idle child per core is
//! kept. [`Pool::stop_idle`] ends the idle ones (`distributor run` and the
//! agent call it as they end).
//!
//! Before each document the child also sets its CPU time limit
//! (`RLIMIT_CPU`) to what it has used plus
//! [`crate::bundle::markdown_cpu_seconds`] of the document: a document
//! shaped to be slow ends the child with SIGXCPU, and the parent refuses
//! the file ([`ChildError::OverTime`]).
//!
//! The child is single-threaded (no second malloc arena is reserved), and
//! it ignores SIGTERM, SIGINT and SIGHUP: a signal to the whole process
//! group or service must not fail the page half-way. The agent ends its
//! children itself ([`kill_all`]) when it interrupts the bundle in hand,
//! 1 s after a stop. It ends at the end of its stdin, which
//! the kernel closes when the agent exits however it exits (its pipes are
//! close-on-exec, so no other process holds them), or when a write to its
//! stdout fails. `PR_SET_PDEATHSIG` is not used: it fires when the
//! *thread* that started the child ends, and children are started by
//! short-lived worker threads and shared between them.
//!
//! Protocol, parent to child, per document: one JSON line ([`Request`]),
//! then exactly `len` bytes of markdown. Child to parent: the body in
//! frames (a 4-byte little-endian length, then that many bytes), an empty
//! frame, then the page's parts as one JSON array (`null` for the body, a
//! string for text) in one more frame. Or, instead of all that, the
//! length [`NO_ROOM`] alone: the document does not fit under the child's
//! hard limit, and the child ends.
// The unit tests' binary is not distributor, so they render in process
// (`render_in_child`) and the pool is exercised by the integration tests.
#![cfg_attr(test, allow(dead_code))]

use crate::bundle::markdown_memory;
use crate::config::RawHtml;
use crate::render::{Part, RenderOptions, render_page};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::{self, BufRead, BufWriter, Read, Write};

/// The hidden command of the binary that renders markdown files (not in
/// `--help`).
pub const COMMAND: &str = "__render";

/// Size of the body's frames.
const FRAME: usize = 64 << 10;

/// The frame length that says "this document does not fit under my hard
/// limit" (no frame is that long).
const NO_ROOM: u32 = u32::MAX;

/// The most bytes of the header line (the template and the bundle's
/// markdown paths are in it).
const MAX_HEADER: u64 = 64 << 20;

/// The most bytes of the parts' frame (the template's text is in it).
const MAX_PARTS: u64 = 256 << 20;

/// How much a child's mapping may grow past what it mapped at its first
/// document before it is replaced: it grows by 0.2 MiB over 60 documents
/// (docs/rendering.md), and each document gets the same room over what
/// the child maps before it.
const GROWTH: u64 = 4 << 20;

/// What the parent sends before each document.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    raw_html: RawHtml,
    source_path: String,
    /// The bundle's markdown files and the template; `None`: the same as
    /// for the previous document (a bundle's documents share them, and the
    /// list of a bundle of thousands of pages is not sent thousands of
    /// times).
    context: Option<Context>,
    /// Bytes of markdown that follow the header.
    len: u64,
    /// The largest markdown file this child may be sent
    /// (`limits.max_markdown_bytes`): its hard limit is set from it.
    cap: u64,
}

/// What the documents of a bundle share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Context {
    generated_markdown: BTreeSet<String>,
    template: Option<String>,
}

impl Context {
    fn of(options: &RenderOptions<'_>) -> Context {
        Context {
            generated_markdown: options.generated_markdown.clone(),
            template: options.template.map(str::to_owned),
        }
    }

    fn is(&self, options: &RenderOptions<'_>) -> bool {
        self.template.as_deref() == options.template
            && &self.generated_markdown == options.generated_markdown
    }
}

/// Why a file's page could not be had from the child.
#[derive(Debug)]
pub enum ChildError {
    /// The child ended on its memory limit: the file is refused. The text
    /// names the limit, and what the child said, if anything.
    OverLimit(String),
    /// The child failed on this document in another way (a panic):
    /// rendering it again would fail again. The text says how.
    Crashed(String),
    /// The child ran out of the CPU time its document may take
    /// ([`crate::bundle::markdown_cpu_seconds`]): the file is refused.
    OverTime,
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
/// process that may take [`markdown_memory`] of `cap` more address space
/// than it maps before the document, taken from `pool` (the process's, in
/// its [`crate::runtime::process_state::ProcessState`]). `cap` is the
/// largest markdown file the caller renders (`limits.max_markdown_bytes`).
/// On error, what `sink` got is not a page and must be thrown away; a
/// [`ChildError::OverLimit`] says the limit reached.
pub fn render_in_child(
    pool: &Pool,
    markdown: &str,
    options: &RenderOptions<'_>,
    cap: u64,
    sink: &mut dyn Write,
) -> Result<Vec<Part>, ChildError> {
    #[cfg(not(test))]
    {
        pool.render(markdown, options, cap, sink)
    }
    // The unit tests' binary is not distributor: they render in process.
    // The integration tests run the real binary, children included.
    #[cfg(test)]
    {
        let _ = (pool, cap);
        render_page(markdown, options, sink).map_err(ChildError::Sink)
    }
}

/// Idle children, shared by the threads that render: a document takes
/// one (or starts one) and gives it back once its page is read whole; a
/// child that failed is never given back.
pub struct Pool {
    idle: std::sync::Mutex<Vec<Child>>,
    /// No more idle children than this are kept: one per core.
    most: std::sync::OnceLock<usize>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new()
    }
}

impl Pool {
    pub const fn new() -> Pool {
        Pool {
            idle: std::sync::Mutex::new(Vec::new()),
            most: std::sync::OnceLock::new(),
        }
    }

    /// [`render_in_child`] on a child of this pool.
    pub fn render(
        &self,
        markdown: &str,
        options: &RenderOptions<'_>,
        cap: u64,
        sink: &mut dyn Write,
    ) -> Result<Vec<Part>, ChildError> {
        let mut sink = Noting { sink, error: None };
        let mut child = match self.take() {
            Some(child) => child,
            None => Child::start()?,
        };
        loop {
            match child.render(markdown, options, cap, &mut sink) {
                Ok(Some(parts)) => {
                    self.give_back(child);
                    return Ok(parts);
                }
                // Grown too much since its first document: a fresh child
                // (never out of room on its first) takes the document.
                Ok(None) if child.served > 0 => {
                    log::debug!(
                        "renderer process {} has no room left for {} ({} bytes); starting another",
                        child.id(),
                        options.source_path,
                        markdown.len()
                    );
                    drop(child);
                    child = Child::start()?;
                }
                Ok(None) => {
                    let failed = io::Error::other("its first document did not fit its limit");
                    return Err(child.failed(Err(failed), sink.error));
                }
                Err(e) => {
                    return Err(match child.failed(Err(e), sink.error) {
                        ChildError::OverLimit(said) => {
                            let cap = cap.max(markdown.len() as u64);
                            ChildError::OverLimit(crate::bundle::markdown_memory_reached(
                                cap, &said,
                            ))
                        }
                        other => other,
                    });
                }
            }
        }
    }

    /// An idle child that is still alive.
    fn take(&self) -> Option<Child> {
        loop {
            let mut child = self.lock().pop()?;
            // One that died while idle (killed from outside) is dropped.
            if child.running() {
                return Some(child);
            }
        }
    }

    /// Keeps `child` for the next document, unless enough are idle.
    fn give_back(&self, child: Child) {
        let most = *self.most.get_or_init(|| {
            std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
        });
        let mut idle = self.lock();
        if idle.len() < most {
            idle.push(child);
            return;
        }
        drop(idle);
        // Enough are idle: this one ends.
        drop(child);
    }

    /// Ends the idle children.
    pub fn stop_idle(&self) {
        let idle = std::mem::take(&mut *self.lock());
        drop(idle);
    }

    /// The idle children, whatever a panicking thread left them as.
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Child>> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The process ids of this process's children that are not reaped yet,
/// so that a stop can end them ([`kill_all`]). Process-wide on purpose,
/// like the stop request it serves (docs/architecture.md, "What a process
/// keeps"). A child is taken out under this lock before it is waited for,
/// so an id here is never one the system gave to another process since.
static LIVE: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<u32>> {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Ends every renderer child of this process at once (SIGKILL: they
/// ignore the stop signals). The agent calls it when it interrupts the
/// work in hand, 1 s after it was told to stop (docs/contract.md §12.4):
/// a document that takes long to render then fails like any interrupted
/// work, and its bundle stays in `work/` for the next start.
pub fn kill_all() {
    let live = live();
    for &pid in live.iter() {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A running child and the parent's ends of its pipes.
struct Child {
    process: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stdout: Option<io::BufReader<std::process::ChildStdout>>,
    stderr: Option<std::process::ChildStderr>,
    /// What it was last sent: the next document that shares it does not
    /// send it again.
    context: Option<Context>,
    /// Documents it rendered.
    served: u64,
}

impl Child {
    /// Starts a child.
    fn start() -> Result<Child, ChildError> {
        use std::process::{Command, Stdio};
        let mut process = Command::new("/proc/self/exe")
            .arg(COMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A panic's message stays short (the parent reads stderr only
            // when the child has ended), and the child logs nothing.
            .env_remove("RUST_BACKTRACE")
            .env_remove("RUST_LIB_BACKTRACE")
            .env("RUST_LOG", "off")
            .spawn()
            .map_err(|e| {
                ChildError::Failed(format!(
                    "could not start the renderer process (/proc/self/exe {COMMAND}): {e}"
                ))
            })?;
        log::debug!("renderer process {} started", process.id());
        live().push(process.id());
        // Started after a stop's kill_all: it would render unchecked.
        if crate::runtime::interrupt::entered_abandoned() {
            let _ = process.kill();
        }
        Ok(Child {
            stdin: process.stdin.take(),
            stdout: process
                .stdout
                .take()
                .map(|out| io::BufReader::with_capacity(FRAME, out)),
            stderr: process.stderr.take(),
            process,
            context: None,
            served: 0,
        })
    }

    fn id(&self) -> u32 {
        self.process.id()
    }

    /// Waits for it to end, once it is out of [`LIVE`].
    fn reap(&mut self) -> io::Result<std::process::ExitStatus> {
        let id = self.id();
        live().retain(|&pid| pid != id);
        self.process.wait()
    }

    /// Whether it is still running (reaped, and out of [`LIVE`], if not).
    fn running(&mut self) -> bool {
        let mut live = live();
        let running = matches!(self.process.try_wait(), Ok(None));
        if !running {
            let id = self.id();
            live.retain(|&pid| pid != id);
        }
        running
    }

    /// Sends one document and reads its page into `sink`: the page's
    /// parts, or `None` when the child had no room for it (and ended).
    fn render(
        &mut self,
        markdown: &str,
        options: &RenderOptions<'_>,
        cap: u64,
        sink: &mut dyn Write,
    ) -> io::Result<Option<Vec<Part>>> {
        let (Some(stdin), Some(stdout)) = (&mut self.stdin, &mut self.stdout) else {
            return Err(io::ErrorKind::BrokenPipe.into());
        };
        let same = self.context.as_ref().is_some_and(|c| c.is(options));
        let request = Request {
            raw_html: options.raw_html,
            source_path: options.source_path.to_owned(),
            context: (!same).then(|| Context::of(options)),
            len: markdown.len() as u64,
            cap: cap.max(markdown.len() as u64),
        };
        // The child reads the whole document before it writes anything.
        send(stdin, &request, markdown)?;
        if let Some(context) = request.context {
            self.context = Some(context);
        }
        let reply = receive(stdout, sink)?;
        if reply.is_some() {
            self.served += 1;
        }
        Ok(reply)
    }

    /// What became of a child that failed with `outcome` (`sink_error`:
    /// the caller's sink failed first). Ends it.
    fn failed(
        mut self,
        outcome: io::Result<Option<Vec<Part>>>,
        sink_error: Option<io::Error>,
    ) -> ChildError {
        // Its stdin at an end and its stdout gone, it exits at its next
        // read or write; when the caller's sink failed it may be far from
        // either, and it is ended (not reaped yet, so its id is still its).
        self.stdin = None;
        self.stdout = None;
        if sink_error.is_some() {
            let _ = self.process.kill();
        }
        let mut said = Vec::new();
        if let Some(mut stderr) = self.stderr.take() {
            let _ = (&mut stderr).take(64 << 10).read_to_end(&mut said);
        }
        let status = self.reap();
        log::debug!(
            "renderer process {} ended: {}",
            self.id(),
            status
                .as_ref()
                .map_or_else(ToString::to_string, ToString::to_string)
        );
        if let Some(e) = sink_error {
            return ChildError::Sink(e);
        }
        let status = match status {
            Ok(status) => status,
            Err(e) => {
                return ChildError::Failed(format!(
                    "could not wait for the renderer process (/proc/self/exe {COMMAND}): {e}"
                ));
            }
        };
        let said = String::from_utf8_lossy(&said).trim().to_owned();
        match (status.success(), outcome) {
            (true, Err(e)) => ChildError::Failed(format!(
                "could not read from the renderer process (/proc/self/exe {COMMAND}): {e}"
            )),
            (true, Ok(_)) => ChildError::Failed(format!(
                "the renderer process (/proc/self/exe {COMMAND}) ended without a page"
            )),
            (false, _) => ended(status, &said),
        }
    }
}

impl Drop for Child {
    /// Closes its stdin (it exits at the end of its input) and waits for it.
    fn drop(&mut self) {
        self.stdin = None;
        self.stdout = None;
        self.stderr = None;
        let _ = self.reap();
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

/// Reads the body into `sink` and then the parts; `None`: the child had
/// no room for the document.
fn receive(from: &mut impl BufRead, sink: &mut dyn Write) -> io::Result<Option<Vec<Part>>> {
    let mut first = true;
    loop {
        let len = read_len(from)?;
        if len == NO_ROOM && first {
            return Ok(None);
        }
        first = false;
        if len == 0 {
            break;
        }
        if len as usize > FRAME {
            return Err(io::Error::other(format!("a frame of {len} bytes")));
        }
        let copied = io::copy(&mut from.take(u64::from(len)), sink)?;
        if copied != u64::from(len) {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    sink.flush()?;
    let len = u64::from(read_len(from)?);
    if len > MAX_PARTS {
        return Err(io::Error::other(format!("parts of {len} bytes")));
    }
    let mut tail = Vec::new();
    from.take(len).read_to_end(&mut tail)?;
    if tail.len() as u64 != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let parts: Vec<Option<String>> = serde_json::from_slice(&tail).map_err(io::Error::other)?;
    Ok(Some(
        parts
            .into_iter()
            .map(|p| p.map_or(Part::Body, Part::Text))
            .collect(),
    ))
}

/// A frame's length.
fn read_len(from: &mut impl Read) -> io::Result<u32> {
    let mut len = [0; 4];
    from.read_exact(&mut len)?;
    Ok(u32::from_le_bytes(len))
}

/// Why a child that did not exit 0 failed.
fn ended(status: std::process::ExitStatus, said: &str) -> ChildError {
    use std::os::unix::process::ExitStatusExt;
    // Rust's hint about backtraces is no news to an operator.
    let said: Vec<&str> = said
        .lines()
        .filter(|line| !line.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let said = crate::text::escape::inert(&said.join("\n")).into_owned();
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
        // Its CPU time limit (RLIMIT_CPU) reached: it exits with
        // EXIT_OVER_TIME from its handler, or dies of the signal.
        (Some(libc::SIGXCPU), _) | (None, Some(EXIT_OVER_TIME)) => ChildError::OverTime,
        (Some(signal), _) => ChildError::Failed(format!(
            "the renderer process (/proc/self/exe {COMMAND}) was killed by signal {signal}{said}"
        )),
        // Its stdin or stdout failed: the parent's side of the pipes.
        (None, Some(code)) if code == i32::from(EXIT_IO) => ChildError::Failed(format!(
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

/// The child's exit code when it reached its CPU time limit (SIGXCPU's
/// handler exits with it: no core file, whatever the system's core
/// handler).
const EXIT_OVER_TIME: i32 = 124;

/// The child's exit code when its stdin or stdout failed: the runtime
/// failure of the table (`crate::runtime::exit`), which the parent tells apart
/// from a crash.
const EXIT_IO: u8 = crate::runtime::exit::EXIT_FAILURE;

/// The child: renders the documents on stdin to stdout, each under its
/// memory limit, until the end of stdin. Returns the exit code.
pub fn serve() -> u8 {
    ignore_stop_signals();
    steady_heap();
    exit_on_cpu_limit();
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let stdout = io::stdout();
    let mut output = stdout.lock();
    let mut limit = MemoryLimit::default();
    // Memory first: a document the child has no room for is not rendered,
    // and needs no CPU time limit.
    let limits = |len, cap| {
        let room = limit.set(len, cap)?;
        if room {
            limit_cpu(len)?;
        }
        Ok(room)
    };
    match serve_on(&mut input, &mut output, limits) {
        Ok(()) => crate::runtime::exit::EXIT_OK,
        Err(e) => {
            eprintln!("{e}");
            EXIT_IO
        }
    }
}

/// Serves requests from `input` until its end: for each, calls `limit`
/// with the markdown's size and the request's cap before reading the
/// markdown, then renders and writes the frames and parts to `output`. A
/// `limit` that says there is no room (false) ends it after the document
/// is read past and [`NO_ROOM`] written.
fn serve_on(
    input: &mut impl BufRead,
    output: &mut impl Write,
    mut limit: impl FnMut(u64, u64) -> io::Result<bool>,
) -> io::Result<()> {
    let mut context: Option<Context> = None;
    loop {
        let mut header = Vec::new();
        (&mut *input)
            .take(MAX_HEADER)
            .read_until(b'\n', &mut header)?;
        if header.is_empty() {
            // The end of the input: the parent is done with this child.
            return Ok(());
        }
        let request: Request = serde_json::from_slice(&header)
            .map_err(|e| io::Error::other(format!("reading the request: {e}")))?;
        drop(header);
        if let Some(new) = request.context {
            context = Some(new);
        }
        let Some(context) = &context else {
            return Err(io::Error::other("a request without the bundle's context"));
        };
        let len = usize::try_from(request.len).map_err(io::Error::other)?;
        if !limit(request.len, request.cap)? {
            let skipped = io::copy(&mut (&mut *input).take(request.len), &mut io::sink())?;
            if skipped != request.len {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            output.write_all(&NO_ROOM.to_le_bytes())?;
            return output.flush();
        }
        let mut markdown = vec![0; len];
        input.read_exact(&mut markdown)?;
        let markdown = String::from_utf8(markdown).map_err(io::Error::other)?;
        let options = RenderOptions {
            raw_html: request.raw_html,
            source_path: &request.source_path,
            generated_markdown: &context.generated_markdown,
            template: context.template.as_deref(),
        };
        let mut body = BufWriter::with_capacity(FRAME, Frames(&mut *output));
        let parts = render_page(&markdown, &options, &mut body)?;
        body.flush()?;
        drop(body);
        drop(markdown);
        output.write_all(&0u32.to_le_bytes())?;
        let parts: Vec<Option<&str>> = parts
            .iter()
            .map(|p| match p {
                Part::Text(text) => Some(text.as_str()),
                Part::Body => None,
            })
            .collect();
        let parts = serde_json::to_vec(&parts).map_err(io::Error::other)?;
        let parts_len = u32::try_from(parts.len())
            .ok()
            .filter(|&n| u64::from(n) <= MAX_PARTS)
            .ok_or_else(|| io::Error::other("the page's parts are too long"))?;
        output.write_all(&parts_len.to_le_bytes())?;
        output.write_all(&parts)?;
        output.flush()?;
    }
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

/// The child's address-space limits.
#[derive(Default)]
struct MemoryLimit {
    /// The hard limit, once set (on the first document).
    hard: Option<u64>,
}

impl MemoryLimit {
    /// Sets this process's soft address-space limit to what it maps now
    /// plus [`markdown_memory`] of `cap` (the largest file it may be sent,
    /// at least `len`). On the first document, first lowers the hard limit
    /// to that plus [`GROWTH`] (never above a hard limit already set).
    /// False, with no limit changed, when a later document's room does not
    /// fit under the hard limit.
    fn set(&mut self, len: u64, cap: u64) -> io::Result<bool> {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let ceiling = match self.hard {
            Some(_) => None,
            None => getrlimit(Resource::As).maximum,
        };
        release_free_memory();
        let now = mapped_now()?;
        let Some((soft, hard)) = plan_limits(now, len, cap, self.hard, ceiling) else {
            return Ok(false);
        };
        // prlimit64(2): in systemd's @default set of system calls, so the
        // packaged unit's filter allows it (setrlimit(2), in @resources, is
        // not). Raising the soft limit up to the hard one needs no
        // privilege; lowering the hard one cannot be undone.
        setrlimit(
            Resource::As,
            Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            },
        )
        .map_err(|e| {
            io::Error::other(format!(
                "could not set its address-space limit (RLIMIT_AS) to {soft} bytes (at most {hard}): {e}"
            ))
        })?;
        self.hard = Some(hard);
        Ok(true)
    }
}

/// The soft and hard address-space limits for a document of `len` bytes
/// when the process maps `now` bytes and may be sent files of up to `cap`
/// bytes: `now` plus [`markdown_memory`] of `cap` (or `len`, if larger)
/// under the hard limit. The hard limit is `hard` once set; for the first
/// document it is that plus [`GROWTH`], never above `ceiling` (a hard
/// limit set from outside). `None` when a later document does not fit
/// under `hard`.
fn plan_limits(
    now: u64,
    len: u64,
    cap: u64,
    hard: Option<u64>,
    ceiling: Option<u64>,
) -> Option<(u64, u64)> {
    let room = now.saturating_add(markdown_memory(cap.max(len)));
    let hard = match hard {
        Some(hard) if room > hard => return None,
        Some(hard) => hard,
        None => {
            let hard = room.saturating_add(GROWTH);
            ceiling.map_or(hard, |max| hard.min(max))
        }
    };
    Some((room.min(hard), hard))
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

/// Makes the heap's use of address space the same for every document:
/// glibc's malloc raises the size from which it maps a block of its own
/// (`M_MMAP_THRESHOLD`, 128 KiB at start) each time such a block is freed,
/// up to 32 MiB, after which big blocks come from the heap, where growing
/// one copies it and keeps both for a moment and freeing it may not return
/// the address space. Fixing the threshold (which also fixes the trim
/// threshold) keeps every big block mapped on its own: growing it remaps
/// it, freeing it unmaps it, and a document rendered after others takes no
/// more address space than on a fresh child.
fn steady_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets malloc's parameters; no other thread
    // exists yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 10);
    }
}

/// Gives the free memory at the top of the heap back to the system, so
/// that what the child maps before a document is what it holds.
fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Sets this process's CPU time limit (`RLIMIT_CPU`, soft) to what it has
/// used so far plus [`crate::bundle::markdown_cpu_seconds`] of a document
/// of `len` bytes (and up to a second more: the limit counts whole
/// seconds). Reaching it sends SIGXCPU, which ends the child
/// ([`exit_on_cpu_limit`]); the parent
/// refuses the file ([`ChildError::OverTime`]).
fn limit_cpu(len: u64) -> io::Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let used = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    let used = u64::try_from(used.tv_sec).unwrap_or(0);
    let hard = getrlimit(Resource::Cpu).maximum;
    let soft = used + 1 + crate::bundle::markdown_cpu_seconds(len);
    setrlimit(
        Resource::Cpu,
        Rlimit {
            current: Some(hard.map_or(soft, |hard| soft.min(hard))),
            maximum: hard,
        },
    )
    .map_err(|e| {
        io::Error::other(format!(
            "could not set its CPU time limit (RLIMIT_CPU) to {soft} s: {e}"
        ))
    })
}

/// A child that reaches its CPU time limit exits at once with
/// [`EXIT_OVER_TIME`] rather than dumping core (SIGXCPU's default).
fn exit_on_cpu_limit() {
    extern "C" fn over_time(_: libc::c_int) {
        // SAFETY: _exit(2) is async-signal-safe and ends the process.
        unsafe { libc::_exit(EXIT_OVER_TIME) }
    }
    // SAFETY: called before any other thread exists; the handler calls
    // only _exit.
    unsafe {
        libc::signal(
            libc::SIGXCPU,
            over_time as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
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
            raw_html: RawHtml::Escape,
            source_path: "doc/page.md",
            generated_markdown: generated,
            template,
        }
    }

    /// The requests of `documents`, as a parent sends them to one child
    /// (the context only when it changes).
    fn requests(documents: &[(&str, RenderOptions<'_>)], cap: u64) -> Vec<u8> {
        let mut input = Vec::new();
        let mut last: Option<Context> = None;
        for (markdown, options) in documents {
            let same = last.as_ref().is_some_and(|c| c.is(options));
            let request = Request {
                raw_html: options.raw_html,
                source_path: options.source_path.to_owned(),
                context: (!same).then(|| Context::of(options)),
                len: markdown.len() as u64,
                cap,
            };
            if let Some(context) = &request.context {
                last = Some(context.clone());
            }
            send(&mut input, &request, markdown).unwrap();
        }
        input
    }

    /// The page of a reply read from `output`.
    fn page(output: &mut &[u8]) -> Option<String> {
        let mut body = Vec::new();
        let parts = receive(output, &mut body).unwrap()?;
        let body = String::from_utf8(body).unwrap();
        Some(
            parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => t.as_str(),
                    Part::Body => body.as_str(),
                })
                .collect(),
        )
    }

    /// Requests and replies as bytes, without a process: one child serves
    /// documents one after another, each page comes out the same as
    /// rendering in process, a context sent once serves the documents that
    /// follow, and the limit is asked for with each markdown's size (and
    /// the cap) before the markdown is read.
    #[test]
    fn the_protocol_carries_pages_unchanged_one_after_another() {
        let generated = BTreeSet::from(["doc/page.md".to_owned(), "doc/other.md".to_owned()]);
        let other = BTreeSet::from(["doc/page.md".to_owned()]);
        let big = "| a | *b* |\n|---|---|\n".to_owned() + &"| 1 | [x](other.md) |\n".repeat(20_000);
        let template = Some("<main>{{content}}</main>{{title}}{{content}}");
        let documents = [
            ("", options(&generated, None)),
            (
                "# Title\n\ntext <b>x</b> [o](other.md)\n",
                options(&generated, None),
            ),
            (big.as_str(), options(&generated, None)),
            ("# Title\n\n[o](other.md)\n", options(&generated, template)),
            (big.as_str(), options(&generated, template)),
            ("# Title\n\n[o](other.md)\n", options(&other, template)),
            ("", options(&other, None)),
        ];
        let input = requests(&documents, 9 << 20);
        let mut output = Vec::new();
        let mut asked = Vec::new();
        serve_on(&mut &input[..], &mut output, |len, cap| {
            asked.push((len, cap));
            Ok(true)
        })
        .unwrap();
        let expected: Vec<(u64, u64)> = documents
            .iter()
            .map(|(m, _)| (m.len() as u64, 9 << 20))
            .collect();
        assert_eq!(asked, expected);
        let mut output = &output[..];
        for (markdown, options) in &documents {
            assert_eq!(
                page(&mut output).expect("a page"),
                crate::render::markdown_to_html(markdown, options),
                "{:?}",
                &markdown[..markdown.len().min(40)]
            );
        }
        assert!(output.is_empty(), "nothing after the last page");
    }

    /// A child without room for a document reads past it, says so before
    /// anything of its page, and ends: the next document is not served.
    #[test]
    fn a_child_without_room_says_so_and_ends() {
        let generated = BTreeSet::from(["doc/page.md".to_owned()]);
        let documents = [
            ("# One\n", options(&generated, None)),
            ("# Two, too big\n", options(&generated, None)),
            ("# Three\n", options(&generated, None)),
        ];
        let input = requests(&documents, 100);
        let mut output = Vec::new();
        let mut n = 0;
        serve_on(&mut &input[..], &mut output, |_, _| {
            n += 1;
            Ok(n != 2)
        })
        .unwrap();
        assert_eq!(n, 2);
        let mut output = &output[..];
        assert_eq!(
            page(&mut output).unwrap(),
            crate::render::markdown_to_html("# One\n", &documents[0].1)
        );
        assert_eq!(page(&mut output), None);
        assert!(output.is_empty());
    }

    #[test]
    fn a_request_without_a_context_is_an_error() {
        let mut input = Vec::new();
        let request = Request {
            raw_html: RawHtml::Escape,
            source_path: "page.md".to_owned(),
            context: None,
            len: 3,
            cap: 3,
        };
        send(&mut input, &request, "# A").unwrap();
        let mut output = Vec::new();
        assert!(serve_on(&mut &input[..], &mut output, |_, _| Ok(true)).is_err());
        assert!(output.is_empty());
    }

    #[test]
    fn a_reply_cut_short_is_an_error() {
        let generated = BTreeSet::new();
        let markdown = "# T\n\n".to_owned() + &"text ".repeat(50_000);
        let input = requests(
            &[(
                markdown.as_str(),
                RenderOptions {
                    raw_html: RawHtml::Escape,
                    source_path: "page.md",
                    generated_markdown: &generated,
                    template: None,
                },
            )],
            1 << 20,
        );
        let mut output = Vec::new();
        serve_on(&mut &input[..], &mut output, |_, _| Ok(true)).unwrap();
        for cut in [0, 3, 100, FRAME + 2, output.len() - 5, output.len() - 1] {
            let mut body = Vec::new();
            assert!(receive(&mut &output[..cut], &mut body).is_err(), "{cut}");
        }
    }

    /// Each document gets what the process maps plus 32 times the largest
    /// file it may be sent (at least 4 MiB), whatever its own size, under
    /// a hard limit set once, 4 MiB higher: a child that has grown by more
    /// than that, or that was made for smaller files, renders no more.
    #[test]
    fn every_document_gets_the_same_room_under_one_hard_limit() {
        let mib = 1 << 20;
        let cap = 4 * mib;
        // First document, 3 MiB: room for 4 MiB, and 4 MiB to grow.
        let (soft, hard) = plan_limits(10 * mib, 3 * mib, cap, None, None).unwrap();
        assert_eq!((soft, hard), (138 * mib, 142 * mib));
        // A tiny document next, the process having grown by 2 MiB: the
        // same room over what it maps.
        assert_eq!(
            plan_limits(12 * mib, 10, cap, Some(hard), None),
            Some((140 * mib, hard))
        );
        // Grown by more than 4 MiB: another child renders it.
        assert_eq!(plan_limits(15 * mib, 10, cap, Some(hard), None), None);
        // A file of a pipeline with a bigger limit does not fit either.
        assert_eq!(plan_limits(10 * mib, 10, 5 * mib, Some(hard), None), None);
        // One with a smaller limit gets its own, smaller room.
        assert_eq!(
            plan_limits(10 * mib, 10, mib, Some(hard), None),
            Some((42 * mib, hard))
        );
        // A tiny limit: the floor.
        assert_eq!(
            plan_limits(10 * mib, 10, 100, None, None),
            Some((14 * mib, 18 * mib))
        );
        // A hard limit set from outside is never raised, and the first
        // document is not refused for it.
        assert_eq!(
            plan_limits(10 * mib, 3 * mib, cap, None, Some(50 * mib)),
            Some((50 * mib, 50 * mib))
        );
        // A document larger than the cap gets room for itself.
        assert_eq!(
            plan_limits(10 * mib, 5 * mib, cap, None, None),
            Some((170 * mib, 174 * mib))
        );
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
