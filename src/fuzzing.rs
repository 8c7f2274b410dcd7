//! What the fuzz harnesses share (docs/reliability.md, "Fuzzing"): the
//! mutator that turns fuzz bytes into edits of a valid seed document, the
//! iteration budget, and a count of the bytes allocated on a thread (the
//! work measure of the renderer's linear-time oracle). Tests only.
//!
//! Each harness is a `bolero::check!()` over raw bytes, so the same
//! function runs under `cargo test` (bolero's random engine, its corpus
//! and crash files replayed first) and under `cargo bolero test` (a
//! coverage-guided engine). A harness tests its parser twice per input:
//! on the bytes as they are (what a coverage-guided engine grows from the
//! corpus) and on a seed document edited as the bytes say ([`mutate`]), so
//! that random bytes, which are almost never a manifest, a catalog or a
//! config, still reach the checks past the syntax.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The variable that multiplies every harness's random inputs, for a
/// longer run than `cargo test`'s (docs/reliability.md):
/// `DISTRIBUTOR_FUZZ_SCALE=100 cargo test --lib fuzz_`.
pub(crate) const SCALE: &str = "DISTRIBUTOR_FUZZ_SCALE";

/// The random inputs a harness tries: `ci` (what `cargo test` affords it)
/// times [`SCALE`]. bolero's own `BOLERO_RANDOM_ITERATIONS`, when set,
/// wins over both.
pub(crate) fn iterations(ci: usize) -> usize {
    let scale = std::env::var(SCALE)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1);
    ci.saturating_mul(scale.max(1))
}

/// `seeds[bytes[0]]`, edited by the operations the rest of `bytes` spells
/// (at most `1 + bytes[0] / 32`, four bytes each: what, where (two bytes, a fraction of the
/// length), and an argument): insert a token of `dictionary`, delete a
/// few bytes, set a byte, duplicate a span, repeat a token, truncate, or
/// insert an awkward character. `None` when `bytes` is empty.
pub(crate) fn mutate(bytes: &[u8], seeds: &[&[u8]], dictionary: &[&[u8]]) -> Option<Vec<u8>> {
    let (&pick, ops) = bytes.split_first()?;
    let mut out = seeds[usize::from(pick) % seeds.len()].to_vec();
    // One to eight edits: a document edited a little gets further.
    for op in ops.chunks(4).take(1 + usize::from(pick >> 5)) {
        let [what, hi, lo, arg] = [0, 1, 2, 3].map(|i| op.get(i).copied().unwrap_or(0));
        let fraction = usize::from(u16::from_be_bytes([hi, lo]));
        let at = (fraction * (out.len() + 1)) >> 16;
        let token = |arg: u8| dictionary[usize::from(arg) % dictionary.len()];
        match what % 8 {
            0 => {
                out.splice(at..at, token(arg).iter().copied());
            }
            1 => {
                let end = (at + usize::from(arg % 16) + 1).min(out.len());
                out.drain(at..end);
            }
            2 => {
                if let Some(b) = out.get_mut(at) {
                    *b = arg;
                }
            }
            3 => {
                let end = (at + usize::from(arg % 64) + 1).min(out.len());
                let span = out[at..end].to_vec();
                out.splice(end..end, span);
            }
            4 => {
                let times = usize::from(arg % 32) + 2;
                let run = token(arg / 32).repeat(times);
                out.splice(at..at, run);
            }
            5 => out.truncate(at),
            6 => {
                const AWKWARD: [&str; 12] = [
                    "\0", "\t", "\r", "\n", "\u{7f}", "\u{85}", "\u{a0}", "\u{2028}", "\u{feff}",
                    "é", "😀", "\u{fffd}",
                ];
                let c = AWKWARD[usize::from(arg) % AWKWARD.len()];
                out.splice(at..at, c.bytes());
            }
            _ => {
                // Replace the word at `at` (up to the next quote, space or
                // line break) with a token.
                let end = out[at..]
                    .iter()
                    .position(|b| matches!(b, b'"' | b' ' | b'\n'))
                    .map_or(out.len(), |n| at + n.max(1));
                out.splice(at..end, token(arg).iter().copied());
            }
        }
    }
    Some(out)
}

/// How many documents a harness checked and how many of them its parser
/// accepted (a measure of how deep the inputs went), printed when the
/// harness ends (`cargo test -- --nocapture` shows it).
pub(crate) struct Tally {
    name: &'static str,
    /// What an accepted document is, in the line printed.
    accepted_means: &'static str,
    seen: AtomicU64,
    accepted: AtomicU64,
}

impl Tally {
    pub(crate) fn new(name: &'static str, accepted_means: &'static str) -> Tally {
        Tally {
            name,
            accepted_means,
            seen: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        }
    }

    /// Counts a document, `accepted` or not; returns `accepted`.
    pub(crate) fn saw(&self, accepted: bool) -> bool {
        self.seen.fetch_add(1, Ordering::Relaxed);
        if accepted {
            self.accepted.fetch_add(1, Ordering::Relaxed);
        }
        accepted
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        eprintln!(
            "fuzz {}: {} documents checked, {} {}",
            self.name,
            self.seen.load(Ordering::Relaxed),
            self.accepted.load(Ordering::Relaxed),
            self.accepted_means,
        );
    }
}

/// The global allocator of the crate's unit tests: the system's, counting
/// what each thread asks of it ([`allocated`]).
struct Counting;

thread_local! {
    /// Bytes asked for on this thread (a reallocation counts its new
    /// size: the copy it may make), and calls.
    static ASKED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

fn count(bytes: usize) {
    // `try_with`: a thread being torn down has no counter left.
    let _ = ASKED.try_with(|c| {
        let (b, n) = c.get();
        c.set((b + bytes as u64, n + 1));
    });
}

// SAFETY: every call is passed on to `System` unchanged; counting touches
// only a thread-local cell that needs no allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What the allocator saw a closure do on its thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Work {
    /// Bytes asked for (a reallocation counts its new size).
    pub(crate) bytes: u64,
    /// Calls: allocations and reallocations.
    pub(crate) calls: u64,
}

/// What `f` returns, and the work it did on this thread as the allocator
/// saw it.
pub(crate) fn allocated<R>(f: impl FnOnce() -> R) -> (R, Work) {
    let before = ASKED.with(Cell::get);
    let result = f();
    let after = ASKED.with(Cell::get);
    let work = Work {
        bytes: after.0 - before.0,
        calls: after.1 - before.1,
    };
    (result, work)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocation_count_sees_what_a_closure_asks_for() {
        let (v, work) = allocated(|| vec![0u8; 100_000]);
        assert_eq!(v.len(), 100_000);
        assert_eq!(
            work,
            Work {
                bytes: 100_000,
                calls: 1
            }
        );
        let ((), none) = allocated(|| ());
        assert_eq!(none, Work { bytes: 0, calls: 0 });
    }

    #[test]
    fn mutations_edit_the_chosen_seed() {
        let seeds: [&[u8]; 2] = [b"abc", b"xyz"];
        let dictionary: [&[u8]; 1] = [b"T"];
        assert_eq!(mutate(b"", &seeds, &dictionary), None);
        assert_eq!(mutate(&[1], &seeds, &dictionary).unwrap(), b"xyz");
        // Insert the token at the start, then truncate after 2 bytes.
        let edited = mutate(&[32, 0, 0, 0, 0, 5, 0x80, 0, 0], &seeds, &dictionary).unwrap();
        assert_eq!(edited, b"Ta");
    }
}
