"""The releases measure of bench.py (contract §20.2): publishing a change
to a whole site as a new release, beside what people script by hand for
the same, on the same data and file system, in one run.

For each root size F (files):

- The site: F files, 20 a folder, 50 folders a group, shaped like a
  website (`make_site`):
  nine in ten pages of 512 B to 12 KiB, stylesheets and scripts of 1 to
  32 KiB, one in a hundred an image of 64 KiB to 1 MiB. Version 2 is a
  copy of version 1 (`cp -a`) with 1% of the files (chosen at random)
  written anew; both are sealed bundles.
- Version 1 is published into a root with `releases: 5` (its first
  release, timed: `first`) and, untimed, into a plain root (`workflow:
  replacement` for both), and copied with `rsync -a` into the peer's
  first release, its link `current` pointing at it.
- Timed, in this order, each after `sync`:
  ours: `run` of version 2 into the release root (a new release, switched);
  rsync: `rsync -a --link-dest=CURRENT v2/ NEW/`, `sync -f NEW` (the
  release made durable, as ours is), `ln -s NEW tmp && mv -T tmp current`;
  rsync --checksum: the same comparing files by content, as ours does;
  cp -al: `cp -al CURRENT NEW && sync -f NEW`, the floor (links only);
  plain: `run` of version 2 into the plain root (no releases);
  rollback: `rollback`, then `rollback --to` the new release again, three
  times each (goal: 50 ms whatever the size);
  steady: `run` of version 1 again with `releases: 2`, so that retention
  deletes the first release in the timed run, beside the rsync script
  (linking from its second release) followed by `rm -rf` of its first.

Every result is checked: the link points at a new release holding a
changed file's new bytes, at the right release after each rollback, and
the first release is gone after the last step. Nothing is deleted before
that step (see bench_backlog in bench.py; deleting a release frees few
inodes: most are shared). A size's data (about 5 times the site, 6 GiB at
100,000 files) is removed before the next size is made. At most 3 runs a
size (`--runs`), one above 20,000 files (each run adds 3 copies of the
site). BENCH_RELEASES_FILES=20000 (a comma list) picks the sizes.
"""

import os
import random
import shutil
import subprocess
import sys
import time

from bench import BIN, median, runs_line, seal, sh, timed


def site_path(i, kind):
    ext = {"page": "html", "asset": "css" if i % 2 else "js", "image": "jpg"}[kind]
    folder = i // 20
    return os.path.join(f"d{folder // 50:03d}", f"s{folder % 50:02d}", f"f{i:06d}.{ext}")


def site_size(rng, kind):
    if kind == "page":
        return rng.randint(512, 12 * 1024)
    if kind == "asset":
        return rng.randint(1024, 32 * 1024)
    return rng.randint(64 * 1024, 1024 * 1024)


def make_site(v1, v2, files, seed):
    """Writes version 1 of a site of `files` files into `v1`, and version
    2 (a copy, 1% of the files written anew) into `v2`.
    Returns the changed paths, the bytes of version 1 and of the change."""
    rng = random.Random(seed)
    kinds = []
    total = 0
    for i in range(files):
        r = rng.random()
        kind = "image" if r < 0.01 else "asset" if r < 0.10 else "page"
        kinds.append(kind)
        path = os.path.join(v1, site_path(i, kind))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        size = site_size(rng, kind)
        total += size
        with open(path, "wb") as f:
            f.write(os.urandom(size))
    # A copy keeps the times: rsync's quick check sees the unchanged files as such.
    sh(["cp", "-a", v1, v2])
    changed, changed_bytes = [], 0
    for i in sorted(rng.sample(range(files), max(1, files // 100))):
        rel = site_path(i, kinds[i])
        path = os.path.join(v2, rel)
        size = site_size(rng, kinds[i])
        changed_bytes += size
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        changed.append(rel)
    return changed, total, changed_bytes


def write_release_config(path, spool, root, releases):
    keep = f"        releases: {releases}\n" if releases else ""
    with open(path, "w") as f:
        f.write(
            f"""spool: {spool}
pipelines:
  - id: bench
    destinations:
      - id: root
        path: {root}
{keep}        workflow: replacement
        publish:
          source: true
"""
        )


def current_release(link):
    target = os.readlink(link)
    return os.path.basename(target.rstrip("/"))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def bench_releases(work, sizes, runs):
    results = []
    for files in sizes:
        base = os.path.join(work, "releases", str(files))
        v1 = os.path.join(base, "v1")
        v2 = os.path.join(base, "v2")
        start = time.perf_counter()
        changed, total, changed_bytes = make_site(v1, v2, files, files)
        seal(v1, "site")
        seal(v2, "site")
        print(f"releases {files} files: site of {total >> 20} MiB made and sealed in "
              f"{time.perf_counter() - start:.1f} s, {len(changed)} files "
              f"({changed_bytes >> 10} KiB) changed", flush=True)
        probe = changed[0]
        new_bytes = read(os.path.join(v2, probe))
        series = {k: [] for k in ("ours", "rsync", "rsync_checksum", "cp_al", "plain", "first",
                                  "rollback", "forward", "steady", "rsync_steady")}
        rss = {"ours": [], "plain": []}
        # Each run's roots hold three copies of the site: one run of the largest.
        for run in range(runs if files <= 20000 else 1):
            rbase = os.path.join(base, f"run{run}")
            os.makedirs(rbase)
            # Ours: the first release (from nothing), then the change.
            config = os.path.join(rbase, "config.yaml")
            link = os.path.join(rbase, "site")
            write_release_config(config, os.path.join(rbase, "spool"), link, 5)
            sh("sync")
            t, _ = timed([BIN, "--config", config, "run", "--pipeline", "bench", v1])
            series["first"].append(t)
            first = current_release(link)
            plain_config = os.path.join(rbase, "plain.yaml")
            plain = os.path.join(rbase, "plain")
            write_release_config(plain_config, os.path.join(rbase, "spool-plain"), plain, None)
            sh([BIN, "--config", plain_config, "run", "--pipeline", "bench", v1],
               stdout=subprocess.DEVNULL)
            # The peer's first release, a copy like ours.
            peer = os.path.join(rbase, "peer")
            os.makedirs(os.path.join(peer, "releases"))
            sh(["rsync", "-a", "--exclude=/manifest.json", v1 + "/",
                os.path.join(peer, "releases", "r1") + "/"])
            os.symlink("releases/r1", os.path.join(peer, "current"))
            current = os.path.join(peer, "current")

            sh("sync")
            t, m = timed([BIN, "--config", config, "run", "--pipeline", "bench", v2])
            series["ours"].append(t)
            rss["ours"].append(m)
            second = current_release(link)
            if second == first or read(os.path.join(link, probe)) != new_bytes:
                sys.exit(f"releases {files}: after the change, {link} points at {second} "
                         f"(first {first}) without the new bytes of {probe}")

            for key, flags, name in (("rsync", [], "r2"),
                                     ("rsync_checksum", ["--checksum"], "r3")):
                new = os.path.join(peer, "releases", name)
                sh("sync")
                start = time.perf_counter()
                sh(["rsync", "-a", *flags, "--exclude=/manifest.json", f"--link-dest={current}",
                    v2 + "/", new + "/"])
                sh(["sync", "-f", new])
                os.symlink(f"releases/{name}", os.path.join(peer, "tmp"))
                sh(["mv", "-T", os.path.join(peer, "tmp"), current])
                series[key].append(time.perf_counter() - start)
                if read(os.path.join(current, probe)) != new_bytes:
                    sys.exit(f"releases {files}: the rsync script did not publish {probe}")
                # The next script starts from the same first release.
                os.symlink("releases/r1", os.path.join(peer, "tmp"))
                os.rename(os.path.join(peer, "tmp"), current)

            floor = os.path.join(peer, "releases", "floor")
            sh("sync")
            start = time.perf_counter()
            sh(["cp", "-al", os.path.join(peer, "releases", "r1"), floor])
            sh(["sync", "-f", floor])
            series["cp_al"].append(time.perf_counter() - start)

            sh("sync")
            t, m = timed([BIN, "--config", plain_config, "run", "--pipeline", "bench", v2])
            series["plain"].append(t)
            rss["plain"].append(m)
            if read(os.path.join(plain, probe)) != new_bytes:
                sys.exit(f"releases {files}: the plain root did not get {probe}")

            for _ in range(3):
                for key, extra, want in (("rollback", [], first),
                                         ("forward", ["--to", second], second)):
                    t, _ = timed([BIN, "--config", config, "rollback", "--pipeline", "bench",
                                  "--destination", "root"] + extra,
                                 env=dict(os.environ, RUST_LOG="error"))
                    series[key].append(t)
                    if current_release(link) != want:
                        sys.exit(f"releases {files}: after rollback {' '.join(extra)}, {link} "
                                 f"points at {current_release(link)}, not {want}")
            # Steady state: a third release with `releases: 2`, so that
            # the first is deleted (inside the timed run, as retention
            # does), beside the script deleting its oldest release.
            write_release_config(config, os.path.join(rbase, "spool"), link, 2)
            old_bytes = read(os.path.join(v1, probe))
            sh("sync")
            t, _ = timed([BIN, "--config", config, "run", "--pipeline", "bench", v1])
            series["steady"].append(t)
            if (os.path.exists(os.path.join(link + ".releases", first))
                    or read(os.path.join(link, probe)) != old_bytes):
                sys.exit(f"releases {files}: with releases: 2, release {first} was not deleted "
                         f"or {link} does not hold the bytes published last")
            new = os.path.join(peer, "releases", "r4")
            sh("sync")
            start = time.perf_counter()
            sh(["rsync", "-a", "--exclude=/manifest.json",
                f"--link-dest={os.path.join(peer, 'releases', 'r2')}", v1 + "/", new + "/"])
            sh(["sync", "-f", new])
            os.symlink("releases/r4", os.path.join(peer, "tmp"))
            sh(["mv", "-T", os.path.join(peer, "tmp"), current])
            sh(["rm", "-rf", os.path.join(peer, "releases", "r1")])
            series["rsync_steady"].append(time.perf_counter() - start)
        runs_line(f"releases {files} files", **series)
        print(f"releases {files} files peak RSS per run (MiB): ours "
              + " ".join(f"{m / 1024:.1f}" for m in rss["ours"]) + "; plain "
              + " ".join(f"{m / 1024:.1f}" for m in rss["plain"]), flush=True)
        # About 5 times the site's size: not kept for the next size.
        shutil.rmtree(base)
        results.append({"files": files, "mib": total >> 20,
                        **{k: median(v) for k, v in series.items()},
                        "switch": median(series["rollback"] + series["forward"]),
                        "rollback_max": max(series["rollback"] + series["forward"]),
                        "rss_kib": max(rss["ours"]), "plain_rss_kib": max(rss["plain"])})
    return results


def rows(results):
    """The table's rows (bench.py's format)."""
    out = []
    for r in results:
        f = r["files"]
        out.append((f"releases {f} files ({r['mib']} MiB), 1% changed", r["ours"],
                    "rsync --link-dest + sync + ln/mv" + (" (goal <= 1.0x)" if f == 20000 else ""),
                    r["rsync"]))
        out.append(("", r["ours"], "the same, rsync --checksum", r["rsync_checksum"]))
        out.append(("", r["ours"], "cp -al + sync (floor)", r["cp_al"]))
        out.append(("  the same into a plain root", r["plain"], "rsync --link-dest script",
                    r["rsync"]))
        out.append(("  next, the oldest deleted (releases: 2)", r["steady"],
                    "the script + rm -rf its oldest", r["rsync_steady"]))
        out.append(("  the first release (from nothing)", r["first"], None, None))
        out.append((f"  rollback (max {r['rollback_max'] * 1000:.1f} ms; goal <= 50 ms)",
                    r["switch"], None, None))
        out.append((f"  peak RSS {r['rss_kib'] // 1024} MiB (plain root "
                    f"{r['plain_rss_kib'] // 1024} MiB)", None, None, None))
    return out


def sizes(quick):
    chosen = os.environ.get("BENCH_RELEASES_FILES")
    if chosen:
        return [int(n) for n in chosen.split(",")]
    return [1000] if quick else [1000, 20000, 100000]
