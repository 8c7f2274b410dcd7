//! The progress log of long work (docs/contract.md §14.4): a thread per
//! worker that logs, every [`PROGRESS_EVERY`], how far the bundles in hand
//! have got (files and bytes done of what their manifests list).

use super::PROGRESS_EVERY;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The bundles a worker is busy with, for its [`Ticker`].
struct Ticking {
    bundles: Vec<(PathBuf, String)>,
    progress: Arc<crate::runtime::progress::Progress>,
}

/// A worker's thread that logs, every [`PROGRESS_EVERY`], how far the
/// bundles in hand have got. It lives as long as the worker: starting a
/// thread for each bundle cost more than a small bundle's publication
/// spends on anything but the disk.
pub(super) struct Ticker {
    tx: crossbeam_channel::Sender<Option<Ticking>>,
}

impl Ticker {
    pub(super) fn start(pipeline: String) -> Ticker {
        let (tx, rx) = crossbeam_channel::unbounded::<Option<Ticking>>();
        let id = pipeline.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("progress-{pipeline}"))
            .spawn(move || {
                let pipeline = id;
                // `Some` begins a bundle's ticking, `None` ends it.
                let mut next = rx.recv().map_err(drop);
                while let Ok(message) = next {
                    let Some(ticking) = message else {
                        next = rx.recv().map_err(drop);
                        continue;
                    };
                    let started = Instant::now();
                    let mut totals: Option<(u64, u64)> = None;
                    next = loop {
                        match rx.recv_timeout(PROGRESS_EVERY) {
                            Ok(message) => break Ok(message),
                            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                                tick(&pipeline, &ticking, started, &mut totals);
                            }
                            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break Err(()),
                        }
                    };
                }
            });
        if let Err(e) = spawned {
            log::warn!(
                "pipeline={pipeline}: cannot start the progress thread ({e}); long bundles will not log their progress"
            );
        }
        Ticker { tx }
    }

    /// Ticks for `bundles` (counted in `progress`) until the returned
    /// guard is dropped.
    pub(super) fn begin(
        &self,
        bundles: &[(&Path, &str)],
        progress: Arc<crate::runtime::progress::Progress>,
    ) -> impl Drop + '_ {
        let ticking = Ticking {
            bundles: bundles
                .iter()
                .map(|(path, name)| (path.to_path_buf(), (*name).to_owned()))
                .collect(),
            progress,
        };
        struct Ends<'t>(&'t Ticker);
        impl Drop for Ends<'_> {
            fn drop(&mut self) {
                let _ = self.0.tx.send(None);
            }
        }
        let _ = self.tx.send(Some(ticking));
        Ends(self)
    }
}

/// Logs how far `ticking` has got.
fn tick(pipeline: &str, ticking: &Ticking, started: Instant, totals: &mut Option<(u64, u64)>) {
    let (files_total, bytes_total) = *totals.get_or_insert_with(|| {
        let bundles: Vec<(&Path, &str)> = ticking
            .bundles
            .iter()
            .map(|(p, n)| (p.as_path(), n.as_str()))
            .collect();
        listed_totals(&bundles)
    });
    let (files, bytes) = ticking.progress.done();
    let names: Vec<_> = ticking
        .bundles
        .iter()
        .map(|(_, n)| crate::text::escape::inert(n))
        .collect();
    let which = match names.as_slice() {
        [one] => format!("bundle={one}"),
        many => format!("batch of {} bundles ({}, ...)", many.len(), names[0]),
    };
    log::info!(
        "pipeline={pipeline} {which} still working after {}s: {files} of {files_total} files and {} of {} read",
        started.elapsed().as_secs(),
        human_bytes(bytes),
        human_bytes(bytes_total)
    );
}

/// Files and bytes listed in the bundles' manifests (what "done" counts
/// towards); a manifest that cannot be read counts nothing.
fn listed_totals(bundles: &[(&Path, &str)]) -> (u64, u64) {
    bundles
        .iter()
        .filter_map(|(path, _)| crate::bundle::read_manifest(path).ok())
        .fold((0, 0), |(files, bytes), m| {
            (
                files + m.files.len() as u64,
                bytes + m.files.iter().map(|f| f.size).sum::<u64>(),
            )
        })
}

/// `1.5 GiB`, `12 MiB`, `300 bytes`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_counts_read_like_a_person_writes_them() {
        for (n, want) in [
            (0, "0 bytes"),
            (1023, "1023 bytes"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (20 << 20, "20 MiB"),
            ((3 << 30) + (1 << 29), "3.5 GiB"),
            (5 << 40, "5.0 TiB"),
        ] {
            assert_eq!(super::human_bytes(n), want, "{n}");
        }
    }
}
