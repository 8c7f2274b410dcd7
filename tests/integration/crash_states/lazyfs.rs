//! The second, independent check: the scenarios run on LazyFS (a FUSE
//! file system that keeps written data in a cache of its own until it is
//! fsynced, and drops what is unsynced on `lazyfs::clear-cache`). Each
//! command is stopped at every crash point it reaches (`<point>:<n>:stop`,
//! the `n`th hit up to [`HITS`]), the cache is cleared, the process killed,
//! and the restart is run and checked as for the explorer's states.
//! LazyFS applies creations, renames and deletions at once: only lost
//! data is tested here, never a lost rename (the explorer covers those).
//!
//! Runs only when `DISTRIBUTOR_LAZYFS` names a LazyFS binary (built from
//! its sources; this repository ships none) and `/dev/fuse` can be
//! mounted; otherwise it says why and checks nothing.

use super::model::{self, Image};
use super::{Listing, Scenario, command_in, listing_of, restart_and_check};
use crate::util::{DEADLINE, signal, stopped, wait_for};
use distributor::runtime::failpoint::POINTS;
use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The most hits of one crash point tried.
const HITS: u32 = 6;

/// A LazyFS mount, unmounted on drop.
struct Mount {
    _dir: tempfile::TempDir,
    mnt: PathBuf,
    faults: PathBuf,
    /// LazyFS's FIFO of completion messages, which it opens once, when it
    /// starts, and writes a line to after each command.
    done: std::sync::Mutex<std::io::BufReader<fs::File>>,
    child: Child,
}

impl Mount {
    fn start(bin: &Path) -> Result<Mount, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (under, mnt) = (dir.path().join("under"), dir.path().join("mnt"));
        let (faults, done) = (dir.path().join("faults.fifo"), dir.path().join("done.fifo"));
        fs::create_dir(&under).map_err(|e| e.to_string())?;
        fs::create_dir(&mnt).map_err(|e| e.to_string())?;
        let config = dir.path().join("lazyfs.toml");
        fs::write(
            &config,
            format!(
                "[faults]\nfifo_path=\"{}\"\nfifo_path_completed=\"{}\"\n[cache]\napply_eviction=false\n[cache.simple]\ncustom_size=\"512mb\"\nblocks_per_page=1\n[filesystem]\nlog_all_operations=false\nlogfile=\"{}\"\n",
                faults.display(),
                done.display(),
                dir.path().join("lazyfs.log").display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .arg(&mnt)
            .arg("--config-path")
            .arg(&config)
            .args(["-o", "modules=subdir", "-o"])
            .arg(format!("subdir={}", under.display()))
            .arg("-f")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        // LazyFS makes the FIFO, then opens it, which waits for a reader.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            wait_for(Duration::from_secs(20), || done.exists());
            let _ = tx.send(fs::File::open(done));
        });
        let mut child = child;
        let mounted = wait_for(Duration::from_secs(20), || {
            fs::read_to_string("/proc/self/mounts")
                .is_ok_and(|m| m.contains(&format!(" {} fuse", mnt.display())))
                || child.try_wait().ok().flatten().is_some()
        });
        let done = rx.recv_timeout(Duration::from_secs(20));
        let (true, None, Ok(Ok(done))) = (mounted, child.try_wait().ok().flatten(), done) else {
            let _ = Command::new("fusermount3").arg("-uz").arg(&mnt).status();
            let _ = child.kill();
            let _ = child.wait();
            return Err("LazyFS did not mount (is /dev/fuse usable here?)".into());
        };
        Ok(Mount {
            _dir: dir,
            mnt,
            faults,
            done: std::sync::Mutex::new(std::io::BufReader::new(done)),
            child,
        })
    }

    /// Sends `command` to LazyFS and waits for its completion message.
    fn fault(&self, command: &str) {
        fs::write(&self.faults, format!("{command}\n")).expect("write the faults FIFO");
        let mut answer = String::new();
        self.done
            .lock()
            .unwrap()
            .read_line(&mut answer)
            .expect("read LazyFS's answer");
        assert!(
            answer.starts_with("finished::"),
            "LazyFS answered {answer:?} to {command}"
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `image` into a new folder `name` of the mount, every file
/// fsynced (durable before the command starts).
fn copy_in(mount: &Mount, image: &Image, name: &str) -> PathBuf {
    let dir = mount.mnt.join(name);
    fs::create_dir(&dir).expect("a folder in the mount");
    image.write(&dir).expect("copy into the mount");
    for entry in every_path(&dir) {
        if fs::symlink_metadata(&entry).is_ok_and(|m| m.is_file()) {
            fs::File::open(&entry)
                .and_then(|f| f.sync_all())
                .expect("fsync a copied file");
        }
    }
    dir
}

fn every_path(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(every_path(&p));
        }
        out.push(p);
    }
    out
}

/// Runs every point of `s`; returns (crashes tried, violations).
fn explore(mount: &Mount, s: &Scenario) -> (usize, Vec<String>) {
    let image = Image::read(&model::canonical(s.t.path())).expect("read the scenario");
    let initial: Listing = image.listing().expect("listing");
    let reference_dir = copy_in(mount, &image, &format!("{}-reference", s.name));
    let out = command_in(s, &reference_dir, &s.command)
        .env("DISTRIBUTOR_TEST_UNWRITTEN", u64::MAX.to_string())
        .output()
        .expect("run the command");
    assert_eq!(
        out.status.code(),
        Some(s.code),
        "{} on LazyFS:\n{}",
        s.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = listing_of(s, &reference_dir);
    let _ = fs::remove_dir_all(&reference_dir);
    let (mut tried, mut violations) = (0, Vec::new());
    for point in POINTS {
        for n in 1..=HITS {
            let dir = copy_in(mount, &image, &format!("{}-{point}-{n}", s.name));
            let mut child = command_in(s, &dir, &s.command)
                .env("DISTRIBUTOR_TEST_UNWRITTEN", u64::MAX.to_string())
                .env("DISTRIBUTOR_FAILPOINT", format!("{point}:{n}:stop"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn distributor");
            let pid = child.id();
            let settled = wait_for(DEADLINE, || {
                stopped(pid) || child.try_wait().ok().flatten().is_some()
            });
            assert!(
                settled,
                "{}: {point}:{n} neither stopped nor exited",
                s.name
            );
            let reached = child.try_wait().ok().flatten().is_none();
            if reached {
                tried += 1;
                // A power cut: the unsynced data goes, then the process.
                mount.fault("lazyfs::clear-cache");
                signal(pid, libc::SIGKILL);
                let _ = child.wait();
                let state = listing_of(s, &dir);
                let found = restart_and_check(s, &dir, &initial, &reference, &state);
                if !found.is_empty() {
                    eprintln!(
                        "{} on LazyFS, crash at {point}:{n}:\n    {}",
                        s.name,
                        found.join("\n    ")
                    );
                    violations.push(format!(
                        "{} on LazyFS, crash at {point}:{n}:\n    {}",
                        s.name,
                        found.join("\n    ")
                    ));
                }
            }
            let _ = fs::remove_dir_all(&dir);
            if !reached {
                break;
            }
        }
    }
    eprintln!(
        "lazyfs {}: {tried} crashes with the cache cleared, {} violations",
        s.name,
        violations.len()
    );
    (tried, violations)
}

#[test]
fn the_scenarios_survive_lazyfs_clearing_its_cache_at_every_crash_point() {
    let Some(bin) = std::env::var_os("DISTRIBUTOR_LAZYFS") else {
        eprintln!(
            "skipped: set DISTRIBUTOR_LAZYFS to a LazyFS binary to run the scenarios on it (docs/reliability.md, \"Crash states\")"
        );
        return;
    };
    let mount = Mount::start(Path::new(&bin)).unwrap_or_else(|e| panic!("{e}"));
    let (mut tried, mut violations) = (0, Vec::new());
    for s in super::scenarios::for_lazyfs() {
        let (t, v) = explore(&mount, &s);
        tried += t;
        violations.extend(v);
    }
    eprintln!(
        "lazyfs: {tried} crashes with the cache cleared, {} violations",
        violations.len()
    );
    assert!(tried > 0, "no crash point was reached");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
