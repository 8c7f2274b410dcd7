//! What one bundle may ask of the agent (docs/contract.md §12.3): how many files, how
//! many bytes, how much markdown to render. Checked against the manifest
//! before any listed byte is read, so a producer cannot make the agent hash
//! a terabyte of sparse file or render a gigabyte of tables.

use super::error::{BundleError, Problem};
use super::manifest::Manifest;

/// The memory rendering one markdown file may take, in multiples of
/// `limits.max_markdown_bytes` (docs/contract.md §12.3), whatever the
/// file's own size: the renderer's memory limit decides, not an estimate
/// from the size (contract §21.6).
pub const MARKDOWN_TIMES: u64 = 32;

/// The address space rendering any file may take, however small
/// `limits.max_markdown_bytes` is: what the renderer's child process
/// (`crate::render::child`) maps for any document (the output buffer, the
/// page's skeleton, the parser's first allocations, the heap's rounding
/// and the stack's growth) measures 0.2 MiB (docs/rendering.md).
pub const MARKDOWN_FLOOR: u64 = 4 << 20;

/// The memory rendering a markdown file may take when
/// `limits.max_markdown_bytes` is `cap`: [`MARKDOWN_TIMES`] × `cap`, at
/// least [`MARKDOWN_FLOOR`].
pub fn markdown_memory(cap: u64) -> u64 {
    cap.saturating_mul(MARKDOWN_TIMES).max(MARKDOWN_FLOOR)
}

/// The CPU time rendering one markdown file may take, in seconds:
/// [`MARKDOWN_CPU_FLOOR`] plus one second per [`MARKDOWN_CPU_BYTES`] of
/// its size (docs/rendering.md). Prose renders at about 17 MB/s on one
/// core, so a 4 MiB file needs a quarter of a second and gets 21; what
/// needs more is a document shaped to be slow (raw HTML nested thousands
/// deep, whose end tags the sanitizer's parser matches against every open
/// element), and its file is refused like one too big for memory.
pub fn markdown_cpu_seconds(size: u64) -> u64 {
    MARKDOWN_CPU_FLOOR + size.div_ceil(MARKDOWN_CPU_BYTES)
}

/// The CPU seconds any markdown file may take, however small.
pub const MARKDOWN_CPU_FLOOR: u64 = 5;

/// The bytes of markdown each further CPU second is for.
pub const MARKDOWN_CPU_BYTES: u64 = 256 << 10;

/// What one bundle may ask of the agent (docs/contract.md §12.3), checked against the
/// manifest before any listed byte is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// One listed file.
    pub max_file_bytes: u64,
    /// All listed files together.
    pub max_bundle_bytes: u64,
    /// Listed files.
    pub max_files: u64,
    /// A `.md` file that `publish.html` renders.
    pub max_markdown_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 16 << 30,
            max_bundle_bytes: 64 << 30,
            max_files: 200_000,
            max_markdown_bytes: 4 << 20,
        }
    }
}

impl Limits {
    /// The most bytes of `manifest.json` read for a bundle: room for
    /// `max_files` entries of ordinary length (256 bytes each), and never
    /// less than 1 MiB.
    pub fn max_manifest_bytes(&self) -> u64 {
        self.max_files.saturating_mul(256).max(1 << 20)
    }
}

/// Checks the manifest against the limits; every limit exceeded is one
/// problem naming the key.
pub fn check_limits(manifest: &Manifest, limits: &Limits) -> Result<(), BundleError> {
    let raise = "split the bundle, or raise the limit in the agent's config (top-level `limits:` or the pipeline's own)";
    let mut problems = Vec::new();
    let count = manifest.files.len() as u64;
    if count > limits.max_files {
        problems.push(Problem {
            path: None,
            message: format!(
                "the manifest lists {count} files, more than limits.max_files ({}); {raise}",
                limits.max_files
            ),
        });
    }
    let mut total: u64 = 0;
    let mut over = 0usize;
    for f in &manifest.files {
        total = total.saturating_add(f.size);
        if f.size > limits.max_file_bytes {
            over += 1;
            if over <= super::MAX_WARNINGS {
                problems.push(Problem::at(
                    f.path.as_str(),
                    format!(
                        "declared size {} bytes is more than limits.max_file_bytes ({} bytes); {raise}",
                        f.size, limits.max_file_bytes
                    ),
                ));
            }
        }
    }
    if over > super::MAX_WARNINGS {
        problems.push(Problem {
            path: None,
            message: format!(
                "{} more files are over limits.max_file_bytes",
                over - super::MAX_WARNINGS
            ),
        });
    }
    if total > limits.max_bundle_bytes {
        problems.push(Problem {
            path: None,
            message: format!(
                "the listed files add up to {total} bytes, more than limits.max_bundle_bytes ({} bytes); {raise}",
                limits.max_bundle_bytes
            ),
        });
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BundleError::Invalid { problems })
    }
}

/// The problem of a markdown file whose rendering needed more memory than
/// the renderer may take ([`markdown_memory`]); `limit` says that limit
/// and what the renderer said as it ended.
pub fn markdown_too_dense(path: &str, size: u64, limit: &str) -> Problem {
    Problem::at(
        path,
        format!(
            "needs more memory to render to HTML than a rendering may take ({size} bytes; {limit}); split it into smaller pages, raise limits.max_markdown_bytes, or publish it as a copy (publish.html off for this destination)"
        ),
    )
}

/// What [`markdown_too_dense`] says of the limit reached when
/// `limits.max_markdown_bytes` is `cap`, and the renderer said `said` (may
/// be empty).
pub fn markdown_memory_reached(cap: u64, said: &str) -> String {
    let said = if said.is_empty() {
        String::new()
    } else {
        format!("; {said}")
    };
    format!(
        "the limit is {}, {MARKDOWN_TIMES} times limits.max_markdown_bytes ({}){said}",
        size_text(markdown_memory(cap)),
        size_text(cap)
    )
}

/// `bytes` the way a limit is written in the config: `4MiB`, `300KiB`.
fn size_text(bytes: u64) -> String {
    let units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    for (shift, unit) in units {
        if bytes >= 1 << shift && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

/// The problem of a markdown file whose rendering took more CPU time than
/// [`markdown_cpu_seconds`] allows.
pub fn markdown_too_slow(path: &str, size: u64) -> Problem {
    Problem::at(
        path,
        format!(
            "took more than {} s of CPU time to render to HTML (the limit for {size} bytes: {MARKDOWN_CPU_FLOOR} s and 1 s per {} KiB); raw HTML nested thousands of elements deep is the usual cause: simplify it, or publish the file as a copy (publish.html off for this destination)",
            markdown_cpu_seconds(size),
            MARKDOWN_CPU_BYTES >> 10
        ),
    )
}

/// The problem of a markdown file too big to render (`limits.max_markdown_bytes`).
pub fn markdown_too_big(path: &str, size: u64, limits: &Limits) -> Option<Problem> {
    (size > limits.max_markdown_bytes).then(|| {
        Problem::at(
            path,
            format!(
                "is {size} bytes, more than limits.max_markdown_bytes ({} bytes) for rendering to HTML; split the page, turn publish.html off for this destination, or raise limits.max_markdown_bytes",
                limits.max_markdown_bytes
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendering_may_take_32_times_the_largest_markdown_file() {
        assert_eq!(markdown_memory(4 << 20), 128 << 20);
        assert_eq!(markdown_memory(1 << 20), 32 << 20);
        assert_eq!(markdown_memory(10), MARKDOWN_FLOOR);
        assert_eq!(markdown_memory(u64::MAX), u64::MAX);
        let problem = markdown_too_dense(
            "a/page.md",
            910_001,
            &markdown_memory_reached(4 << 20, "memory allocation of 8 bytes failed"),
        );
        assert_eq!(problem.path.as_deref(), Some("a/page.md"));
        assert_eq!(
            problem.message,
            "needs more memory to render to HTML than a rendering may take (910001 bytes; the limit is 128MiB, 32 times limits.max_markdown_bytes (4MiB); memory allocation of 8 bytes failed); split it into smaller pages, raise limits.max_markdown_bytes, or publish it as a copy (publish.html off for this destination)"
        );
        assert_eq!(
            markdown_memory_reached(300 << 10, ""),
            "the limit is 9600KiB, 32 times limits.max_markdown_bytes (300KiB)"
        );
        assert_eq!(
            markdown_memory_reached(10, ""),
            "the limit is 4MiB, 32 times limits.max_markdown_bytes (10B)"
        );
    }

    #[test]
    fn a_markdown_file_may_take_5_s_of_cpu_and_1_s_per_256_kib() {
        const KIB: u64 = 1 << 10;
        // (size, seconds)
        let cases = [
            (0, 5),
            (1, 6),
            (256 * KIB, 6),
            (256 * KIB + 1, 7),
            (600_002, 8),
            (4 << 20, 21),
            (u64::MAX, 5 + u64::MAX.div_ceil(256 * KIB)),
        ];
        for (size, seconds) in cases {
            assert_eq!(markdown_cpu_seconds(size), seconds, "{size}");
        }
    }
}
