//! The persistence model: a recorded command as a list of operations on
//! inodes and folder entries, which crash states it allows, and each
//! state built as a folder tree (docs/reliability.md, "Crash states").
//!
//! - An *entry operation* sets names in folders: a creation, `mkdir`,
//!   `symlink` or `link` gives a name an inode, an `unlink` or `rmdir`
//!   takes it away, a rename does both at once (atomic: kept whole or
//!   lost whole) and an exchange swaps two. It is durable once a folder it
//!   changes is fsynced, or after a `syncfs`.
//! - A *data operation* (a write, a truncation, a mode change) changes one
//!   inode; durable once that inode is fsynced (`fsync`, `fdatasync`), or
//!   after a `syncfs`.
//! - At a crash, durable operations are kept. Of the others, any subset of
//!   the entry operations may be kept, except that an operation that takes
//!   a name away (a rename's source, an unlink, an exchange) is kept only
//!   with the operation that put that inode at that name: no state shows a
//!   file under two names it never had at once. A durable operation
//!   brings those it builds on with it (a file system stays consistent).
//!   Each inode's pending data operations are kept in order up to some
//!   point: none, half of their bytes, all, or all with the bytes zeroed
//!   (the size reached the disk, the data did not).
//! - Inodes themselves always exist; a state shows what its entries reach.

use super::trace::{Call, Val};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub type Ino = usize;

/// The traced folder itself.
pub const ROOT: Ino = 0;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind {
    File,
    Dir,
    Symlink(Vec<u8>),
}

/// An inode: its kind, mode, and (for those the tree started with) the
/// modification time to give it back when a state is written out (the
/// agent orders bundles by their manifest's).
#[derive(Debug, Clone)]
pub struct Node {
    pub kind: Kind,
    pub mode: u32,
    pub mtime: Option<(i64, i64)>,
}

/// A folder entry: the folder's inode and a name in it.
pub type Entry = (Ino, Vec<u8>);

/// A tree: inodes, file contents, and folder entries.
#[derive(Debug, Clone, Default)]
pub struct Image {
    pub nodes: Vec<Node>,
    pub data: Vec<Arc<Vec<u8>>>,
    pub entries: BTreeMap<Entry, Ino>,
}

#[derive(Debug, Clone)]
pub enum Change {
    Write { off: u64, bytes: Arc<Vec<u8>> },
    Truncate(u64),
    Mode(u32),
}

#[derive(Debug, Clone)]
pub enum Op {
    /// Names set (`Some`) or taken away (`None`), all at once; `deps` are
    /// the operations that put the inodes at the names taken away.
    Entry {
        sets: Vec<(Entry, Option<Ino>)>,
        deps: Vec<usize>,
        what: String,
    },
    Data {
        ino: Ino,
        change: Change,
    },
    /// fsync or fdatasync of a file or folder.
    Sync(Ino),
    /// syncfs or sync.
    SyncAll,
}

impl Op {
    fn folders(&self) -> impl Iterator<Item = Ino> + '_ {
        let sets: &[(Entry, Option<Ino>)] = match self {
            Op::Entry { sets, .. } => sets,
            _ => &[],
        };
        sets.iter().map(|((dir, _), _)| *dir)
    }
}

/// A recorded command: the tree before it, what it did, and when each
/// operation became durable.
#[derive(Debug, Clone)]
pub struct Model {
    pub initial: Image,
    pub ops: Vec<Op>,
    /// Index of the sync that made each operation durable
    /// (`usize::MAX`: never).
    pub durable_at: Vec<usize>,
    /// Data operations of each inode, in order.
    pub by_ino: HashMap<Ino, Vec<usize>>,
}

/// How much of an inode's pending data a state keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    All,
    None,
    Half,
    Zeros,
}

/// One crash state: after `ops[..at]`, with the pending entry operations
/// of `kept` (before the dependency rule), and pending data cut by `cut`
/// except for the inodes of `cuts`.
#[derive(Debug, Clone)]
pub struct Crash {
    pub at: usize,
    pub kept: BTreeSet<usize>,
    pub cut: Cut,
    pub cuts: Vec<(Ino, Cut)>,
    pub label: String,
}

/// How many states the enumeration makes at each crash point.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Prefixes of the pending entry operations (in order), besides none
    /// and all.
    pub prefixes: usize,
    /// A folder's pending entry operations are tried in every subset when
    /// there are at most this many.
    pub subset_ops: usize,
    /// States each leaving out one pending entry operation.
    pub omissions: usize,
    /// Inodes whose pending data is cut alone (none, half, zeros).
    pub file_cuts: usize,
    /// Distinct states checked per scenario, spread over all found.
    pub max_states: usize,
}

impl Bounds {
    /// What CI checks: a few dozen states per scenario.
    pub const SAMPLE: Bounds = Bounds {
        prefixes: 3,
        subset_ops: 3,
        omissions: 4,
        file_cuts: 4,
        max_states: 40,
    };
    /// The full exploration (bench/crash-states).
    pub const FULL: Bounds = Bounds {
        prefixes: usize::MAX,
        subset_ops: 8,
        omissions: usize::MAX,
        file_cuts: usize::MAX,
        max_states: usize::MAX,
    };
}

/// Up to `k` indices spread evenly over `0..n`, the first and last included.
pub fn spread(n: usize, k: usize) -> Vec<usize> {
    if n <= k {
        return (0..n).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    if k == 1 {
        return vec![n / 2];
    }
    let mut out: Vec<usize> = (0..k).map(|i| i * (n - 1) / (k - 1)).collect();
    out.dedup();
    out
}

impl Model {
    /// Computes when each operation became durable.
    pub fn new(initial: Image, ops: Vec<Op>) -> Model {
        let mut durable_at = vec![usize::MAX; ops.len()];
        let mut pending_in: HashMap<Ino, Vec<usize>> = HashMap::new();
        let mut all_pending: Vec<usize> = Vec::new();
        let mut by_ino: HashMap<Ino, Vec<usize>> = HashMap::new();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Entry { .. } => {
                    for dir in op.folders() {
                        pending_in.entry(dir).or_default().push(i);
                    }
                    all_pending.push(i);
                }
                Op::Data { ino, .. } => {
                    pending_in.entry(*ino).or_default().push(i);
                    by_ino.entry(*ino).or_default().push(i);
                    all_pending.push(i);
                }
                Op::Sync(ino) => {
                    for j in pending_in.remove(ino).unwrap_or_default() {
                        durable_at[j] = durable_at[j].min(i);
                    }
                }
                Op::SyncAll => {
                    for j in all_pending.drain(..) {
                        durable_at[j] = durable_at[j].min(i);
                    }
                    pending_in.clear();
                }
            }
        }
        Model {
            initial,
            ops,
            durable_at,
            by_ino,
        }
    }

    /// The crash points: before each sync, and at the end.
    pub fn points(&self) -> Vec<usize> {
        let mut points: Vec<usize> = self
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op, Op::Sync(_) | Op::SyncAll))
            .map(|(i, _)| i)
            .collect();
        points.push(self.ops.len());
        points.dedup();
        points
    }

    fn pending_entries(&self, at: usize) -> Vec<usize> {
        (0..at)
            .filter(|&i| matches!(self.ops[i], Op::Entry { .. }) && self.durable_at[i] >= at)
            .collect()
    }

    fn pending_data_inodes(&self, at: usize) -> Vec<Ino> {
        let mut inos: Vec<Ino> = self
            .by_ino
            .iter()
            .filter(|(_, ops)| ops.iter().any(|&i| i < at && self.durable_at[i] >= at))
            .map(|(ino, _)| *ino)
            .collect();
        inos.sort_unstable();
        inos
    }

    /// The crash states the bounds allow, in order of crash point (with
    /// repeats: [`Model::build`] and a set of seen trees remove them).
    pub fn crashes(&self, bounds: &Bounds) -> Vec<Crash> {
        let mut out = Vec::new();
        for at in self.points() {
            let pending = self.pending_entries(at);
            let all: BTreeSet<usize> = pending.iter().copied().collect();
            let mut add =
                |kept: BTreeSet<usize>, cut: Cut, cuts: Vec<(Ino, Cut)>, label: String| {
                    out.push(Crash {
                        at,
                        kept,
                        cut,
                        cuts,
                        label: format!("crash before op {at}: {label}"),
                    });
                };
            add(all.clone(), Cut::All, vec![], "everything kept".into());
            add(
                BTreeSet::new(),
                Cut::None,
                vec![],
                "only the durable".into(),
            );
            for cut in [Cut::None, Cut::Half, Cut::Zeros] {
                add(
                    all.clone(),
                    cut,
                    vec![],
                    format!("entries kept, data {cut:?}"),
                );
            }
            add(
                BTreeSet::new(),
                Cut::All,
                vec![],
                "entries lost, data kept".into(),
            );
            let n = pending.len();
            if n > 1 {
                for k in spread(n - 1, bounds.prefixes) {
                    let k = k + 1;
                    add(
                        pending[..k].iter().copied().collect(),
                        Cut::All,
                        vec![],
                        format!("the first {k} of {n} pending entry ops"),
                    );
                }
                for o in spread(n, bounds.omissions) {
                    let mut kept = all.clone();
                    kept.remove(&pending[o]);
                    let what = match &self.ops[pending[o]] {
                        Op::Entry { what, .. } => what.as_str(),
                        _ => "",
                    };
                    add(
                        kept,
                        Cut::All,
                        vec![],
                        format!("op {} ({what}) lost", pending[o]),
                    );
                }
            }
            // Per folder: every subset of its pending operations, the
            // others kept.
            let mut by_folder: BTreeMap<Ino, Vec<usize>> = BTreeMap::new();
            for &i in &pending {
                for dir in self.ops[i].folders().collect::<BTreeSet<_>>() {
                    by_folder.entry(dir).or_default().push(i);
                }
            }
            for (dir, ops) in by_folder {
                if ops.len() > bounds.subset_ops || ops.len() < 2 {
                    continue;
                }
                for mask in 0..(1u64 << ops.len()) {
                    let mut kept = all.clone();
                    for (b, i) in ops.iter().enumerate() {
                        if mask & (1 << b) == 0 {
                            kept.remove(i);
                        }
                    }
                    add(
                        kept,
                        Cut::All,
                        vec![],
                        format!("folder inode {dir}: subset {mask:b} of ops {ops:?}"),
                    );
                }
            }
            let inos = self.pending_data_inodes(at);
            for i in spread(inos.len(), bounds.file_cuts) {
                for cut in [Cut::None, Cut::Half, Cut::Zeros] {
                    add(
                        all.clone(),
                        Cut::All,
                        vec![(inos[i], cut)],
                        format!("inode {} data {cut:?}", inos[i]),
                    );
                }
            }
        }
        out
    }

    /// What a SIGKILL after each operation leaves: every operation before
    /// it, whole (no power cut, nothing lost).
    pub fn kills(&self) -> Vec<Crash> {
        (0..=self.ops.len())
            .map(|at| Crash {
                at,
                kept: (0..at).collect(),
                cut: Cut::All,
                cuts: vec![],
                label: format!("killed after op {at}"),
            })
            .collect()
    }

    /// The entry operations a crash keeps: the durable ones and what they
    /// build on, then the chosen pending ones whose dependencies are kept.
    pub fn kept_entries(&self, crash: &Crash) -> Vec<bool> {
        let at = crash.at;
        let mut kept = vec![false; at];
        let mut stack: Vec<usize> = (0..at)
            .filter(|&i| matches!(self.ops[i], Op::Entry { .. }) && self.durable_at[i] < at)
            .collect();
        while let Some(i) = stack.pop() {
            if kept[i] {
                continue;
            }
            kept[i] = true;
            if let Op::Entry { deps, .. } = &self.ops[i] {
                stack.extend(deps.iter().copied());
            }
        }
        for &i in crash.kept.range(..at) {
            if let Op::Entry { deps, .. } = &self.ops[i]
                && deps.iter().all(|&d| kept[d])
            {
                kept[i] = true;
            }
        }
        kept
    }

    /// The tree a crash leaves.
    pub fn build(&self, crash: &Crash) -> Image {
        let at = crash.at;
        let kept = self.kept_entries(crash);
        let mut image = self.initial.clone();
        for (i, op) in self.ops[..at].iter().enumerate() {
            if let Op::Entry { sets, .. } = op
                && kept[i]
            {
                for (entry, ino) in sets {
                    match ino {
                        Some(ino) => image.entries.insert(entry.clone(), *ino),
                        None => image.entries.remove(entry),
                    };
                }
            }
        }
        for (ino, ops) in &self.by_ino {
            let cut = crash
                .cuts
                .iter()
                .find(|(i, _)| i == ino)
                .map_or(crash.cut, |(_, c)| *c);
            let ops: Vec<usize> = ops.iter().copied().filter(|&i| i < at).collect();
            if ops.is_empty() {
                continue;
            }
            let mut data: Vec<u8> = image.data[*ino].as_ref().clone();
            let mut mode = image.nodes[*ino].mode;
            let pending_bytes: u64 = ops
                .iter()
                .filter(|&&i| self.durable_at[i] >= at)
                .map(|&i| match &self.ops[i] {
                    Op::Data {
                        change: Change::Write { bytes, .. },
                        ..
                    } => bytes.len() as u64,
                    _ => 0,
                })
                .sum();
            let mut budget = pending_bytes / 2;
            for i in ops {
                let Op::Data { change, .. } = &self.ops[i] else {
                    continue;
                };
                let durable = self.durable_at[i] < at;
                let (take, zero) = match (durable, cut) {
                    (true, _) | (false, Cut::All) => (u64::MAX, false),
                    (false, Cut::None) => break,
                    (false, Cut::Zeros) => (u64::MAX, true),
                    (false, Cut::Half) => {
                        if budget == 0 {
                            break;
                        }
                        (budget, false)
                    }
                };
                match change {
                    Change::Write { off, bytes } => {
                        let n = (bytes.len() as u64).min(take) as usize;
                        write_at(&mut data, *off, &bytes[..n], zero);
                        if !durable && cut == Cut::Half {
                            budget -= n as u64;
                        }
                    }
                    Change::Truncate(len) => data.resize(*len as usize, 0),
                    Change::Mode(m) => mode = *m,
                }
            }
            image.data[*ino] = Arc::new(data);
            image.nodes[*ino].mode = mode;
        }
        image
    }

    /// The tree after every operation: what the command left.
    pub fn last(&self) -> Image {
        self.build(&Crash {
            at: self.ops.len(),
            kept: (0..self.ops.len()).collect(),
            cut: Cut::All,
            cuts: vec![],
            label: "the end".into(),
        })
    }
}

fn write_at(data: &mut Vec<u8>, off: u64, bytes: &[u8], zero: bool) {
    let off = off as usize;
    if data.len() < off + bytes.len() {
        data.resize(off + bytes.len(), 0);
    }
    if zero {
        data[off..off + bytes.len()].fill(0);
    } else {
        data[off..off + bytes.len()].copy_from_slice(bytes);
    }
}

/// What a tree shows at one path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Shown {
    File {
        mode: u32,
        data: Arc<Vec<u8>>,
        /// The first path of the same inode, for a hard link.
        same_as: Option<String>,
    },
    Dir {
        mode: u32,
    },
    Symlink(Vec<u8>),
}

impl Image {
    /// Every path the root reaches; a hard link names the first path
    /// (in order) of its inode.
    pub fn listing(&self) -> Result<BTreeMap<String, Shown>, String> {
        let mut out = BTreeMap::new();
        let mut first: HashMap<Ino, String> = HashMap::new();
        let mut files: Vec<(String, Ino)> = Vec::new();
        let mut seen_dirs: BTreeSet<Ino> = BTreeSet::from([ROOT]);
        let mut stack = vec![(ROOT, String::new())];
        while let Some((dir, prefix)) = stack.pop() {
            for ((_, name), &ino) in self
                .entries
                .range((dir, Vec::new())..)
                .take_while(|((d, _), _)| *d == dir)
            {
                let path = format!("{prefix}{}", String::from_utf8_lossy(name));
                let node = &self.nodes[ino];
                let shown = match &node.kind {
                    Kind::File => {
                        let f = first.entry(ino).or_insert_with(|| path.clone());
                        if path < *f {
                            *f = path.clone();
                        }
                        files.push((path.clone(), ino));
                        Shown::File {
                            mode: node.mode,
                            data: self.data[ino].clone(),
                            same_as: None,
                        }
                    }
                    Kind::Dir => {
                        if !seen_dirs.insert(ino) {
                            return Err(format!("folder inode {ino} reached twice (at {path})"));
                        }
                        stack.push((ino, format!("{path}/")));
                        Shown::Dir { mode: node.mode }
                    }
                    Kind::Symlink(t) => Shown::Symlink(t.clone()),
                };
                out.insert(path, shown);
            }
        }
        for (path, ino) in files {
            let f = &first[&ino];
            if *f != path
                && let Some(Shown::File { same_as, .. }) = out.get_mut(&path)
            {
                *same_as = Some(f.clone());
            }
        }
        Ok(out)
    }

    /// A digest of the listing, to tell states apart.
    pub fn digest(&self) -> Result<u64, String> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.listing()?.hash(&mut h);
        Ok(h.finish())
    }

    /// Reads a real tree (hard links kept as one inode).
    pub fn read(root: &Path) -> io::Result<Image> {
        let mut image = Image::default();
        let meta = fs::symlink_metadata(root)?;
        image.push(node_of(&meta, root)?, Vec::new());
        let mut by_inode: HashMap<(u64, u64), Ino> = HashMap::new();
        let mut stack = vec![(ROOT, root.to_path_buf())];
        while let Some((dir, path)) = stack.pop() {
            let mut names: Vec<_> = fs::read_dir(&path)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<_>>()?;
            names.sort();
            for name in names {
                let p = path.join(&name);
                let meta = fs::symlink_metadata(&p)?;
                let key = (meta.dev(), meta.ino());
                let ino = match by_inode.get(&key) {
                    Some(&ino) if meta.is_file() => ino,
                    _ => {
                        let data = if meta.is_file() {
                            fs::read(&p)?
                        } else {
                            Vec::new()
                        };
                        let ino = image.push(node_of(&meta, &p)?, data);
                        by_inode.insert(key, ino);
                        if meta.is_dir() {
                            stack.push((ino, p.clone()));
                        }
                        ino
                    }
                };
                image.entries.insert((dir, name.as_bytes().to_vec()), ino);
            }
        }
        Ok(image)
    }

    pub fn push(&mut self, node: Node, data: Vec<u8>) -> Ino {
        self.nodes.push(node);
        self.data.push(Arc::new(data));
        self.nodes.len() - 1
    }

    /// Writes the tree into `root` (emptied first), giving back the
    /// modification times of the inodes the tree started with.
    pub fn write(&self, root: &Path) -> io::Result<()> {
        for entry in fs::read_dir(root)? {
            let p = entry?.path();
            if fs::symlink_metadata(&p)?.is_dir() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
        }
        let listing = self.listing().map_err(io::Error::other)?;
        let mut times = Vec::new();
        let mut inode_of: HashMap<String, Ino> = HashMap::new();
        self.paths_to_inodes(&mut inode_of);
        // Hard links last, once the first path of each inode is written.
        let links = listing.iter().filter(|(_, s)| {
            matches!(
                s,
                Shown::File {
                    same_as: Some(_),
                    ..
                }
            )
        });
        let others = listing.iter().filter(|(_, s)| {
            !matches!(
                s,
                Shown::File {
                    same_as: Some(_),
                    ..
                }
            )
        });
        for (path, shown) in others.chain(links) {
            let p = root.join(path);
            match shown {
                Shown::Dir { mode } => {
                    fs::create_dir(&p)?;
                    fs::set_permissions(&p, fs::Permissions::from_mode(*mode))?;
                }
                Shown::File {
                    same_as: Some(first),
                    ..
                } => {
                    fs::hard_link(root.join(first), &p)?;
                }
                Shown::File { mode, data, .. } => {
                    fs::write(&p, data.as_slice())?;
                    fs::set_permissions(&p, fs::Permissions::from_mode(*mode))?;
                }
                Shown::Symlink(t) => {
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(t), &p)?;
                }
            }
            if let Some(Some((s, ns))) = inode_of.get(path).map(|&i| self.nodes[i].mtime) {
                times.push((p, s, ns));
            }
        }
        // Deepest first, so that setting a folder's time comes after its
        // content was written.
        times.sort_by_key(|(p, _, _)| std::cmp::Reverse(p.components().count()));
        for (p, s, ns) in times {
            if fs::symlink_metadata(&p)?.file_type().is_symlink() {
                continue;
            }
            let when = std::time::UNIX_EPOCH + std::time::Duration::new(s as u64, ns as u32);
            fs::File::open(&p)?.set_modified(when)?;
        }
        let when = self.nodes[ROOT].mtime;
        if let Some((s, ns)) = when {
            let t = std::time::UNIX_EPOCH + std::time::Duration::new(s as u64, ns as u32);
            fs::File::open(root)?.set_modified(t)?;
        }
        Ok(())
    }

    fn paths_to_inodes(&self, out: &mut HashMap<String, Ino>) {
        let mut stack = vec![(ROOT, String::new(), 0usize)];
        while let Some((dir, prefix, depth)) = stack.pop() {
            if depth > 4096 {
                continue;
            }
            for ((_, name), &ino) in self
                .entries
                .range((dir, Vec::new())..)
                .take_while(|((d, _), _)| *d == dir)
            {
                let path = format!("{prefix}{}", String::from_utf8_lossy(name));
                if self.nodes[ino].kind == Kind::Dir {
                    stack.push((ino, format!("{path}/"), depth + 1));
                }
                out.insert(path, ino);
            }
        }
    }
}

fn node_of(meta: &fs::Metadata, path: &Path) -> io::Result<Node> {
    let kind = if meta.is_dir() {
        Kind::Dir
    } else if meta.file_type().is_symlink() {
        Kind::Symlink(fs::read_link(path)?.as_os_str().as_bytes().to_vec())
    } else if meta.is_file() {
        Kind::File
    } else {
        return Err(io::Error::other(format!(
            "{}: neither file, folder nor link",
            path.display()
        )));
    };
    Ok(Node {
        kind,
        mode: meta.mode() & 0o7777,
        mtime: Some((meta.mtime(), meta.mtime_nsec())),
    })
}

/// Turns recorded calls into operations on the tree `initial` found at
/// `root` (absolute, without links), following the tree as each call
/// changes it; calls outside `root` are left out.
pub fn from_calls(
    root: &Path,
    initial: Image,
    calls: &[Call],
    umask: u32,
) -> Result<Model, String> {
    let mut sim = Sim {
        root: root.as_os_str().as_bytes().to_vec(),
        base: initial.clone(),
        live: initial,
        ops: Vec::new(),
        assigned_by: HashMap::new(),
        cursors: HashMap::new(),
        cwd: Vec::new(),
        umask,
    };
    for call in calls {
        sim.call(call)
            .map_err(|e| format!("{e}\n  in: {}", call.line))?;
    }
    Ok(Model::new(sim.base, sim.ops))
}

struct Sim {
    root: Vec<u8>,
    /// The tree before the calls, with every inode they make (empty).
    base: Image,
    /// The tree as the calls so far left it.
    live: Image,
    ops: Vec<Op>,
    /// The operation that last set each entry.
    assigned_by: HashMap<Entry, usize>,
    /// Each (descriptor, inode)'s offset and whether it appends.
    cursors: HashMap<(i64, Ino), (u64, bool)>,
    cwd: Vec<u8>,
    umask: u32,
}

const O_CREAT: i64 = 0o100;
const O_TRUNC: i64 = 0o1000;
const O_APPEND: i64 = 0o2000;
const O_TMPFILE: i64 = 0o20000000 | 0o200000;
const AT_REMOVEDIR: i64 = 0x200;
const AT_EMPTY_PATH: i64 = 0x1000;
const AT_SYMLINK_FOLLOW: i64 = 0x400;
const RENAME_EXCHANGE: i64 = 2;
const RENAME_WHITEOUT: i64 = 4;
const FALLOC_FL_KEEP_SIZE: i64 = 1;
const F_DUPFD: i64 = 0;
const F_DUPFD_CLOEXEC: i64 = 1030;

fn arg(call: &Call, i: usize) -> Result<&Val, String> {
    call.args.get(i).ok_or_else(|| format!("no argument {i}"))
}

fn int(call: &Call, i: usize) -> Result<i64, String> {
    arg(call, i)?
        .int()
        .ok_or_else(|| format!("argument {i} is not a number"))
}

fn bytes(call: &Call, i: usize) -> Result<Vec<u8>, String> {
    match arg(call, i)? {
        Val::Str { bytes, cut: false } => Ok(bytes.clone()),
        Val::Str { cut: true, .. } => Err(format!(
            "argument {i} was cut short by strace (a buffer over its -s)"
        )),
        v => Err(format!("argument {i} is not a string: {v:?}")),
    }
}

/// A descriptor's `-y` path.
fn fd_path(call: &Call, i: usize) -> Result<Vec<u8>, String> {
    match arg(call, i)? {
        Val::Fd { path, .. } => Ok(path.clone()),
        v => Err(format!("argument {i} is no annotated descriptor: {v:?}")),
    }
}

fn join(base: &[u8], name: &[u8]) -> Vec<u8> {
    if name.starts_with(b"/") {
        return name.to_vec();
    }
    let mut p = base.to_vec();
    if !name.is_empty() {
        p.push(b'/');
        p.extend_from_slice(name);
    }
    p
}

impl Sim {
    fn ret(call: &Call) -> Option<&Val> {
        call.ret.as_ref().ok()
    }

    /// `(dirfd, name)` at `i`, `i + 1` as one path.
    fn at_path(&mut self, call: &Call, i: usize) -> Result<Vec<u8>, String> {
        let base = fd_path(call, i)?;
        if int(call, i)? == -100 {
            self.cwd = base.clone();
        }
        Ok(join(&base, &bytes(call, i + 1)?))
    }

    fn plain_path(&self, call: &Call, i: usize) -> Result<Vec<u8>, String> {
        let p = bytes(call, i)?;
        if !p.starts_with(b"/") && self.cwd.is_empty() {
            return Err("a relative path before the working folder is known".into());
        }
        Ok(join(&self.cwd, &p))
    }

    /// The components of `path` below the root, `None` outside it.
    fn inside(&self, path: &[u8]) -> Option<Vec<Vec<u8>>> {
        let rest = path.strip_prefix(self.root.as_slice())?;
        if !(rest.is_empty() || rest.starts_with(b"/")) {
            return None;
        }
        let mut parts: Vec<Vec<u8>> = Vec::new();
        for part in rest.split(|&c| c == b'/') {
            match part {
                b"" | b"." => {}
                b".." => {
                    parts.pop()?;
                }
                p => parts.push(p.to_vec()),
            }
        }
        Some(parts)
    }

    /// The folder holding `path` and its last name (links above followed).
    fn parent_of(&self, path: &[u8]) -> Result<Option<Entry>, String> {
        let Some(mut parts) = self.inside(path) else {
            return Ok(None);
        };
        let Some(name) = parts.pop() else {
            return Err("the traced folder itself is changed".into());
        };
        let dir = self.folder_at(&parts, 0)?;
        Ok(Some((dir, name)))
    }

    fn folder_at(&self, parts: &[Vec<u8>], depth: usize) -> Result<Ino, String> {
        if depth > 40 {
            return Err("too many links".into());
        }
        let mut dir = ROOT;
        let mut walked: Vec<Vec<u8>> = Vec::new();
        for part in parts {
            let ino =
                *self.live.entries.get(&(dir, part.clone())).ok_or_else(|| {
                    format!("{} is not in the tree", String::from_utf8_lossy(part))
                })?;
            match &self.live.nodes[ino].kind {
                Kind::Dir => dir = ino,
                Kind::Symlink(t) => {
                    let mut base = self.root.clone();
                    for w in &walked {
                        base.push(b'/');
                        base.extend_from_slice(w);
                    }
                    let target = join(&base, t);
                    let parts = self
                        .inside(&target)
                        .ok_or("a link out of the traced folder")?;
                    dir = self.folder_at(&parts, depth + 1)?;
                }
                Kind::File => return Err("a file where a folder should be".into()),
            }
            walked.push(part.clone());
        }
        Ok(dir)
    }

    /// The inode at `path` (the last link not followed), `None` outside.
    fn lookup(&self, path: &[u8]) -> Result<Option<Ino>, String> {
        if self.inside(path).is_some_and(|p| p.is_empty()) {
            return Ok(Some(ROOT));
        }
        let Some(entry) = self.parent_of(path)? else {
            return Ok(None);
        };
        self.live
            .entries
            .get(&entry)
            .copied()
            .map(Some)
            .ok_or_else(|| format!("{} is not in the tree", String::from_utf8_lossy(path)))
    }

    /// The inode a descriptor's `-y` path names; `None` outside the root
    /// or for a file deleted since it was opened.
    fn fd_ino(&self, call: &Call, i: usize) -> Result<Option<Ino>, String> {
        let path = fd_path(call, i)?;
        if path.ends_with(b" (deleted)") {
            return Ok(None);
        }
        self.lookup(&path)
    }

    fn push(&mut self, op: Op) {
        let i = self.ops.len();
        match &op {
            Op::Entry { sets, .. } => {
                for (entry, ino) in sets {
                    match ino {
                        Some(ino) => self.live.entries.insert(entry.clone(), *ino),
                        None => self.live.entries.remove(entry),
                    };
                    self.assigned_by.insert(entry.clone(), i);
                }
            }
            Op::Data { ino, change } => {
                let ino = *ino;
                let mut data = self.live.data[ino].as_ref().clone();
                match change {
                    Change::Write { off, bytes } => write_at(&mut data, *off, bytes, false),
                    Change::Truncate(len) => data.resize(*len as usize, 0),
                    Change::Mode(m) => self.live.nodes[ino].mode = *m,
                }
                self.live.data[ino] = Arc::new(data);
            }
            _ => {}
        }
        self.ops.push(op);
    }

    fn deps(&self, entries: &[&Entry]) -> Vec<usize> {
        entries
            .iter()
            .filter_map(|e| self.assigned_by.get(*e).copied())
            .collect()
    }

    fn create(
        &mut self,
        path: &[u8],
        kind: Kind,
        mode: u32,
        what: &str,
    ) -> Result<Option<Ino>, String> {
        let Some(entry) = self.parent_of(path)? else {
            return Ok(None);
        };
        let node = Node {
            kind,
            mode: mode & !self.umask & 0o7777,
            mtime: None,
        };
        self.base.push(node.clone(), Vec::new());
        let ino = self.live.push(node, Vec::new());
        let what = format!("{what} {}", String::from_utf8_lossy(path));
        self.push(Op::Entry {
            sets: vec![(entry, Some(ino))],
            deps: vec![],
            what,
        });
        Ok(Some(ino))
    }

    fn data(&mut self, ino: Ino, change: Change) {
        self.push(Op::Data { ino, change });
    }

    fn write(&mut self, call: &Call, off: Option<u64>, data: Vec<u8>) -> Result<(), String> {
        let Some(ino) = self.fd_ino(call, 0)? else {
            return Ok(());
        };
        let fd = int(call, 0)?;
        let n = match Self::ret(call).and_then(Val::int) {
            Some(n) if n >= 0 => n as usize,
            _ => return Ok(()),
        };
        let data = data[..n.min(data.len())].to_vec();
        let off = match off {
            Some(off) => off,
            None => {
                let size = self.live.data[ino].len() as u64;
                let c = self.cursors.entry((fd, ino)).or_insert((0, false));
                if c.1 {
                    c.0 = size;
                }
                let at = c.0;
                c.0 += data.len() as u64;
                at
            }
        };
        self.data(
            ino,
            Change::Write {
                off,
                bytes: Arc::new(data),
            },
        );
        Ok(())
    }

    fn call(&mut self, call: &Call) -> Result<(), String> {
        let ok = call.ret.is_ok();
        match call.name.as_str() {
            "open" | "openat" | "openat2" | "creat" => {
                let Some(Val::Fd { fd, path }) = Self::ret(call) else {
                    return Ok(());
                };
                let (flags, mode) = match call.name.as_str() {
                    "openat2" => {
                        let how = arg(call, 2)?;
                        (
                            how.field("flags").and_then(Val::int).unwrap_or(0),
                            how.field("mode").and_then(Val::int).unwrap_or(0),
                        )
                    }
                    "openat" => {
                        self.at_path(call, 0)?;
                        (
                            int(call, 2)?,
                            call.args.get(3).and_then(Val::int).unwrap_or(0),
                        )
                    }
                    "open" => (
                        int(call, 1)?,
                        call.args.get(2).and_then(Val::int).unwrap_or(0),
                    ),
                    _ => (O_CREAT | O_TRUNC | 1, int(call, 1)?),
                };
                if self.inside(path).is_none() {
                    return Ok(());
                }
                if flags & O_TMPFILE == O_TMPFILE {
                    return Err("O_TMPFILE is not modelled".into());
                }
                let (fd, path) = (*fd, path.clone());
                let exists = self.inside(&path).is_some_and(|p| p.is_empty())
                    || self
                        .parent_of(&path)?
                        .is_some_and(|e| self.live.entries.contains_key(&e));
                let ino = if exists {
                    let ino = self.lookup(&path)?.ok_or("vanished")?;
                    if flags & O_TRUNC != 0 && self.live.nodes[ino].kind == Kind::File {
                        self.data(ino, Change::Truncate(0));
                    }
                    ino
                } else {
                    if flags & O_CREAT == 0 {
                        return Err("opened a file the model does not have".into());
                    }
                    self.create(&path, Kind::File, mode as u32, "create")?
                        .ok_or("outside")?
                };
                self.cursors.insert((fd, ino), (0, flags & O_APPEND != 0));
            }
            "mkdir" | "mkdirat" if ok => {
                let (path, mode) = if call.name == "mkdir" {
                    (self.plain_path(call, 0)?, int(call, 1)?)
                } else {
                    (self.at_path(call, 0)?, int(call, 2)?)
                };
                self.create(&path, Kind::Dir, mode as u32, "mkdir")?;
            }
            "symlink" | "symlinkat" if ok => {
                let target = bytes(call, 0)?;
                let path = if call.name == "symlink" {
                    self.plain_path(call, 1)?
                } else {
                    self.at_path(call, 1)?
                };
                self.create(&path, Kind::Symlink(target), 0o777, "symlink")?;
            }
            "link" | "linkat" if ok => {
                let (from, to, flags) = if call.name == "link" {
                    (self.plain_path(call, 0)?, self.plain_path(call, 1)?, 0)
                } else {
                    (
                        self.at_path(call, 0)?,
                        self.at_path(call, 2)?,
                        int(call, 4)?,
                    )
                };
                if flags & (AT_EMPTY_PATH | AT_SYMLINK_FOLLOW) != 0 {
                    return Err("linkat flags are not modelled".into());
                }
                let (Some(ino), Some(entry)) = (self.lookup(&from)?, self.parent_of(&to)?) else {
                    if self.inside(&to).is_some() {
                        return Err("a link into the traced folder from outside".into());
                    }
                    return Ok(());
                };
                let what = format!("link {}", String::from_utf8_lossy(&to));
                self.push(Op::Entry {
                    sets: vec![(entry, Some(ino))],
                    deps: vec![],
                    what,
                });
            }
            "rename" | "renameat" | "renameat2" if ok => {
                let (from, to, flags) = match call.name.as_str() {
                    "rename" => (self.plain_path(call, 0)?, self.plain_path(call, 1)?, 0),
                    "renameat" => (self.at_path(call, 0)?, self.at_path(call, 2)?, 0),
                    _ => (
                        self.at_path(call, 0)?,
                        self.at_path(call, 2)?,
                        int(call, 4)?,
                    ),
                };
                if flags & RENAME_WHITEOUT != 0 {
                    return Err("RENAME_WHITEOUT is not modelled".into());
                }
                let (a, b) = (self.parent_of(&from)?, self.parent_of(&to)?);
                let (a, b) = match (a, b) {
                    (None, None) => return Ok(()),
                    (Some(a), Some(b)) => (a, b),
                    _ => return Err("a rename across the traced folder's edge".into()),
                };
                let ia = *self
                    .live
                    .entries
                    .get(&a)
                    .ok_or("rename of a missing name")?;
                let what = format!(
                    "rename {} -> {}",
                    String::from_utf8_lossy(&from),
                    String::from_utf8_lossy(&to)
                );
                if flags & RENAME_EXCHANGE != 0 {
                    let ib = *self
                        .live
                        .entries
                        .get(&b)
                        .ok_or("exchange with a missing name")?;
                    let deps = self.deps(&[&a, &b]);
                    self.push(Op::Entry {
                        sets: vec![(a, Some(ib)), (b, Some(ia))],
                        deps,
                        what: format!("exchange {what}"),
                    });
                } else if self.live.entries.get(&b) != Some(&ia) {
                    let deps = self.deps(&[&a]);
                    self.push(Op::Entry {
                        sets: vec![(a, None), (b, Some(ia))],
                        deps,
                        what,
                    });
                }
            }
            "unlink" | "unlinkat" | "rmdir" if ok => {
                let path = match call.name.as_str() {
                    "unlinkat" => {
                        let _ = int(call, 2)? & AT_REMOVEDIR;
                        self.at_path(call, 0)?
                    }
                    _ => self.plain_path(call, 0)?,
                };
                let Some(entry) = self.parent_of(&path)? else {
                    return Ok(());
                };
                let deps = self.deps(&[&entry]);
                self.push(Op::Entry {
                    sets: vec![(entry, None)],
                    deps,
                    what: format!("unlink {}", String::from_utf8_lossy(&path)),
                });
            }
            "write" => {
                let data = bytes(call, 1)?;
                self.write(call, None, data)?;
            }
            "pwrite64" => {
                let data = bytes(call, 1)?;
                let off = int(call, 3)? as u64;
                self.write(call, Some(off), data)?;
            }
            "writev" | "pwritev" | "pwritev2" => {
                let Val::List(iov) = arg(call, 1)? else {
                    return Err("no iovec list".into());
                };
                let mut data = Vec::new();
                for v in iov {
                    match v.field("iov_base") {
                        Some(Val::Str { bytes, cut: false }) => data.extend_from_slice(bytes),
                        _ => return Err("an iovec strace did not print whole".into()),
                    }
                }
                let off = (call.name != "writev")
                    .then(|| int(call, 3).map(|o| o as u64))
                    .transpose()?;
                self.write(call, off, data)?;
            }
            "ftruncate" | "truncate" if ok => {
                let ino = if call.name == "ftruncate" {
                    self.fd_ino(call, 0)?
                } else {
                    let p = self.plain_path(call, 0)?;
                    self.lookup(&p)?
                };
                if let Some(ino) = ino {
                    self.data(ino, Change::Truncate(int(call, 1)? as u64));
                }
            }
            "fallocate" if ok => {
                if let Some(ino) = self.fd_ino(call, 0)? {
                    let (mode, off, len) = (int(call, 1)?, int(call, 2)?, int(call, 3)?);
                    if mode & !FALLOC_FL_KEEP_SIZE != 0 {
                        return Err("fallocate mode not modelled".into());
                    }
                    let end = (off + len) as u64;
                    if mode == 0 && end > self.live.data[ino].len() as u64 {
                        self.data(ino, Change::Truncate(end));
                    }
                }
            }
            "fsync" | "fdatasync" if ok => {
                if let Some(ino) = self.fd_ino(call, 0)? {
                    self.push(Op::Sync(ino));
                }
            }
            "syncfs" if ok && self.fd_ino(call, 0)?.is_some() => self.push(Op::SyncAll),
            "sync" => self.push(Op::SyncAll),
            "chmod" | "fchmod" | "fchmodat" if ok => {
                let (ino, mode) = match call.name.as_str() {
                    "fchmod" => (self.fd_ino(call, 0)?, int(call, 1)?),
                    "chmod" => {
                        let p = self.plain_path(call, 0)?;
                        (self.lookup(&p)?, int(call, 1)?)
                    }
                    _ => {
                        let p = self.at_path(call, 0)?;
                        (self.lookup(&p)?, int(call, 2)?)
                    }
                };
                if let Some(ino) = ino {
                    self.data(ino, Change::Mode(mode as u32 & 0o7777));
                }
            }
            "lseek" => {
                if let (Some(ino), Some(pos)) =
                    (self.fd_ino(call, 0)?, Self::ret(call).and_then(Val::int))
                {
                    let fd = int(call, 0)?;
                    self.cursors.entry((fd, ino)).or_insert((0, false)).0 = pos as u64;
                }
            }
            "dup" | "dup2" | "dup3" | "fcntl" => {
                if call.name == "fcntl" && !matches!(int(call, 1), Ok(F_DUPFD | F_DUPFD_CLOEXEC)) {
                    return Ok(());
                }
                if let (Some(ino), Some(new)) =
                    (self.fd_ino(call, 0)?, Self::ret(call).and_then(Val::int))
                {
                    let fd = int(call, 0)?;
                    if let Some(c) = self.cursors.get(&(fd, ino)).copied() {
                        self.cursors.insert((new, ino), c);
                    }
                }
            }
            "copy_file_range" | "sendfile" | "splice" | "mknod" | "mknodat" => {
                for i in 0..call.args.len() {
                    if let Val::Fd { path, .. } = &call.args[i]
                        && self.inside(path).is_some()
                    {
                        return Err(format!("{} on a traced file is not modelled", call.name));
                    }
                    if let Val::Str { bytes, .. } = &call.args[i]
                        && self.inside(&join(&self.cwd, bytes)).is_some()
                    {
                        return Err(format!("{} on a traced file is not modelled", call.name));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The process's umask (read, not set: setting it races other threads).
pub fn umask() -> u32 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|m| u32::from_str_radix(m.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// Where `path` is, canonical (the trace names real paths).
pub fn canonical(path: &Path) -> PathBuf {
    fs::canonicalize(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A one-line difference between two listings, `None` when equal.
pub fn differ(a: &BTreeMap<String, Shown>, b: &BTreeMap<String, Shown>) -> Option<String> {
    for (p, x) in a {
        match b.get(p) {
            None => return Some(format!("{p}: only in the first")),
            Some(y) if y != x => return Some(format!("{p}: {} vs {}", brief(x), brief(y))),
            _ => {}
        }
    }
    b.keys()
        .find(|p| !a.contains_key(*p))
        .map(|p| format!("{p}: only in the second"))
}

pub fn brief(s: &Shown) -> String {
    match s {
        Shown::File {
            mode,
            data,
            same_as,
        } => format!(
            "file {mode:o} {} bytes {:?}{}",
            data.len(),
            String::from_utf8_lossy(&data[..data.len().min(60)]),
            same_as
                .as_ref()
                .map(|p| format!(" (link of {p})"))
                .unwrap_or_default()
        ),
        Shown::Dir { mode } => format!("folder {mode:o}"),
        Shown::Symlink(t) => format!("link to {}", String::from_utf8_lossy(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crash_states::trace;

    /// A hand-written record of a small command in `/r`: create `a`,
    /// write "xy", fsync it, rename it to `b`, make `d`, fsync the folder.
    const TINY: &str = r#"1 openat(-100<\x2f\x72>, "\x61", 0xc1, 0644) = 3<\x2f\x72\x2f\x61>
1 write(3<\x2f\x72\x2f\x61>, "\x78\x79", 2) = 2
1 fsync(3<\x2f\x72\x2f\x61>) = 0
1 renameat(-100<\x2f\x72>, "\x61", -100<\x2f\x72>, "\x62") = 0
1 mkdirat(-100<\x2f\x72>, "\x64", 0755) = 0
1 fsync(4<\x2f\x72>) = 0
"#;

    fn tiny() -> Model {
        let calls = trace::parse(TINY).unwrap();
        let mut initial = Image::default();
        initial.push(
            Node {
                kind: Kind::Dir,
                mode: 0o755,
                mtime: None,
            },
            Vec::new(),
        );
        from_calls(Path::new("/r"), initial, &calls, 0o022).unwrap()
    }

    /// Each distinct tree, as `name=content` (a folder as `name/`).
    fn trees(m: &Model, bounds: &Bounds) -> BTreeSet<String> {
        m.crashes(bounds)
            .iter()
            .map(|c| {
                m.build(c)
                    .listing()
                    .unwrap()
                    .iter()
                    .map(|(p, s)| match s {
                        Shown::File { data, .. } => {
                            format!("{p}={}", String::from_utf8_lossy(data).replace('\0', "0"))
                        }
                        _ => format!("{p}/"),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[test]
    fn a_tiny_record_has_exactly_the_crash_states_of_the_model() {
        let m = tiny();
        assert_eq!(m.ops.len(), 6);
        assert_eq!(m.points(), [2, 5, 6]);
        let got = trees(&m, &Bounds::FULL);
        // Before the fsync of `a`: its entry kept or not, its data none,
        // half, zeroed or all. Before the fsync of the folder: the data is
        // durable, the three entry operations kept in any subset but the
        // rename without the creation it moves. At the end: only `b` and
        // `d`.
        let want: BTreeSet<String> = [
            "", "a=", "a=x", "a=00", "a=xy", // before fsync(a)
            "d/", "a=xy d/", "b=xy", "b=xy d/", // before fsync(/r)
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        assert_eq!(got, want);
        // The sample reaches the same states here: they are few.
        assert_eq!(trees(&m, &Bounds::SAMPLE), want);
        // Without the fsync of the folder nothing of the rename is durable.
        let end = m.build(&Crash {
            at: 5,
            kept: BTreeSet::new(),
            cut: Cut::None,
            cuts: vec![],
            label: String::new(),
        });
        assert_eq!(end.listing().unwrap().len(), 0);
    }

    #[test]
    fn a_rename_is_never_kept_without_what_it_moves() {
        let m = tiny();
        let crash = Crash {
            at: 5,
            kept: BTreeSet::from([3]),
            cut: Cut::All,
            cuts: vec![],
            label: String::new(),
        };
        assert!(m.build(&crash).listing().unwrap().is_empty());
        assert_eq!(m.durable_at[1], 2, "the write is durable at the fsync of a");
        assert_eq!(
            m.durable_at[0], 5,
            "the creation at the fsync of the folder"
        );
    }
}
