#!/usr/bin/env python3
"""Benchmarks distributor against the tools an operator would otherwise use.

Run through bench/run, which builds the release binary first. Every figure is
a median over alternating runs of ours and the peer's, and each of ours is
also given as a ratio to its peer measured in the same run. Data lives in a
temporary folder that is removed at the end.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# DISTRIBUTOR_BIN runs another build (an older one, to compare).
BIN = os.environ.get("DISTRIBUTOR_BIN") or os.path.join(HERE, "..", "target", "release", "distributor")
COST = os.path.join(HERE, "..", "target", "release", "examples", "signature_cost")
CATALOG_COST = os.path.join(HERE, "..", "target", "release", "examples", "catalog_cost")


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=isinstance(cmd, str), check=True, **kw)


def timed(cmd, env=None, stdout=None):
    """Wall time of a command, and its peak RSS in KiB (via /usr/bin/time).
    With `stdout` a list, the command's output is appended to it."""
    start = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M"] + cmd,
        stdout=subprocess.DEVNULL if stdout is None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    elapsed = time.perf_counter() - start
    lines = proc.stderr.decode().strip().splitlines()
    if proc.returncode not in (0,):
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n" + "\n".join(lines[-20:]))
    if stdout is not None:
        stdout.append(proc.stdout.decode())
    return elapsed, int(lines[-1])


def runs_line(measure, **series):
    """Prints every run's figure in seconds, so the spread behind a median shows."""
    parts = [f"{name} {' '.join(f'{x:.3f}' for x in values)}" for name, values in series.items()]
    print(f"{measure} runs (s): " + "; ".join(parts), flush=True)


def timed_shell(script):
    start = time.perf_counter()
    sh(["bash", "-c", script], stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def config_head(spool, settle="0s", metrics=None):
    """The start of every benchmark config, up to the one pipeline's id
    (`bench`): an agent that rescans rarely and never prunes."""
    metrics_line = f"  metrics_file: {metrics}\n" if metrics else ""
    return f"""spool: {spool}
agent:
  settle: {settle}
  rescan_interval: 60s
  prune_interval: 0s
{metrics_line}pipelines:
  - id: bench
"""


def write_config(path, spool, root, workflow="additive", html=False, settle="250ms",
                 metrics=None):
    with open(path, "w") as f:
        f.write(
            config_head(spool, settle, metrics) + f"""    destinations:
      - id: root
        path: {root}
        workflow: {workflow}
        publish:
          source: true
          html: {"true" if html else "false"}
"""
        )


def small_bundles(staging, count, tag, folder_tag, id_tag):
    """`count` bundles `<tag>NNNN` in `staging`, shaped like real ones: 3
    files in a new subfolder `<folder_tag>NNNN`, sealed as
    `<id_tag>-NNNN`."""
    for i in range(count):
        b = os.path.join(staging, f"{tag}{i:04d}")
        folder = os.path.join(b, f"{folder_tag}{i:04d}")
        os.makedirs(folder)
        with open(os.path.join(folder, "report.md"), "w") as f:
            f.write(f"# Report {i}\n")
        with open(os.path.join(folder, "page.html"), "w") as f:
            f.write(f"<p>{i}</p>\n")
        with open(os.path.join(folder, "data.bin"), "wb") as f:
            f.write(os.urandom(4096))
        seal(b, f"{id_tag}-{i:04d}")


def seal(bundle, bundle_id):
    sh([BIN, "bundle", "seal", bundle, "--id", bundle_id, "--created", "2026-06-04T00:00:00Z"],
       stdout=subprocess.DEVNULL)


def random_file(path, size):
    chunk = 1 << 20
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(chunk, left)
            f.write(os.urandom(n))
            left -= n


def median(xs):
    return statistics.median(xs)


def bench_large(work, size, runs):
    bundle = os.path.join(work, "large", "bundle")
    os.makedirs(bundle)
    random_file(os.path.join(bundle, "big.bin"), size)
    seal(bundle, "large")
    config = os.path.join(work, "large", "config.yaml")
    root = os.path.join(work, "large", "root")
    peer_dest = os.path.join(work, "large", "peer")
    write_config(config, os.path.join(work, "large", "spool"), root)
    ours, peer, rss = [], [], []
    for _ in range(runs):
        # The root exists (empty), as a deployed destination does; publishing
        # into a root that must first be created hashes the bundle up front.
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        sh("sync")
        t, m = timed([BIN, "--config", config, "run", "--pipeline", "bench", bundle])
        ours.append(t)
        rss.append(m)
        shutil.rmtree(peer_dest, ignore_errors=True)
        os.makedirs(peer_dest)
        sh("sync")
        f = os.path.join(bundle, "big.bin")
        peer.append(timed_shell(f"openssl dgst -sha256 '{f}' >/dev/null && cp '{f}' '{peer_dest}/' && sync"))
    runs_line("large", ours=ours, peer=peer)
    return {"ours": median(ours), "peer": median(peer), "rss_kib": max(rss)}


def make_backlog(src, count):
    md = ("# Report\n\n" + "lorem ipsum dolor sit amet " * 160)[:4096]
    html = ("<p>" + "x" * 20480)[:20480]
    for i in range(count):
        b = os.path.join(src, f"b{i:05d}")
        os.makedirs(b)
        with open(os.path.join(b, f"r{i:05d}.md"), "w") as f:
            f.write(md)
        with open(os.path.join(b, f"p{i:05d}.html"), "w") as f:
            f.write(html)
        with open(os.path.join(b, f"d{i:05d}.bin"), "wb") as f:
            f.write(os.urandom(100 * 1024))
    # seal all (one process per bundle is slow; it is not timed), and give
    # the shell-loop peer its checksum files in a separate tree
    sums = src + "-sums"
    os.makedirs(sums)
    for i in range(count):
        seal(os.path.join(src, f"b{i:05d}"), f"bundle-{i:05d}")
        b = os.path.join(src, f"b{i:05d}")
        with open(os.path.join(sums, f"b{i:05d}"), "w") as f:
            for name in sorted(os.listdir(b)):
                if name.endswith((".md", ".html", ".bin")):
                    sh(["sha256sum", name], cwd=b, stdout=f)


def bench_backlog(work, count, runs):
    base = os.path.join(work, "backlog")
    src = os.path.join(base, "src")
    os.makedirs(src)
    make_backlog(src, count)
    ours, rsync, loop = [], [], []
    # Every run writes into fresh folders and nothing is deleted until the
    # end: on ext4 without a journal, creating a file in a block group with
    # thousands of inodes freed in the last minutes scans past each of them
    # (fs/ext4/ialloc.c, recently_deleted), which made every tool's figure
    # depend on how much the previous run had just cleaned up.
    for run in range(runs):
        rbase = os.path.join(base, f"run{run}")
        config = os.path.join(rbase, "config.yaml")
        spool = os.path.join(rbase, "spool")
        os.makedirs(os.path.join(spool, "bench"))
        write_config(config, spool, os.path.join(rbase, "root"))
        sh(["cp", "-a", src, os.path.join(spool, "bench", "inbox")])
        sh("sync")
        t, _ = timed([BIN, "--config", config, "agent", "--once"],
                     env=dict(os.environ, RUST_LOG="warn"))
        ours.append(t)

        dest = os.path.join(rbase, "rsync-dest")
        sh("sync")
        start = time.perf_counter()
        sh(["rsync", "-a", "--checksum", "--fsync", src + "/", dest + "/"])
        rsync.append(time.perf_counter() - start)

        lsrc = os.path.join(rbase, "loop-inbox")
        ldest = os.path.join(rbase, "loop-dest")
        ldone = os.path.join(rbase, "loop-done")
        sh(["cp", "-a", src, lsrc])
        os.makedirs(ldest)
        os.makedirs(ldone)
        sh("sync")
        loop.append(timed_shell(
            f"""set -e
cd '{lsrc}'
for b in *; do
  (cd "$b" && sha256sum -c --quiet '{src}-sums/'"$b")
  cp "$b"/*.md "$b"/*.html "$b"/*.bin '{ldest}/'
  sync
  mv "$b" '{ldone}/'
done"""))
    runs_line("backlog", ours=ours, rsync=rsync, loop=loop)
    return {"ours": median(ours), "rsync": median(rsync), "loop": median(loop), "count": count}


def bench_signed(work, count, runs):
    """The cost of checking signatures: `agent --once` over a backlog of
    small bundles signed with an ed25519 key, into a pipeline with
    `signatures`, against the same backlog unsigned into one without, in
    alternating runs; the difference per bundle is what checking costs.
    The peer is `ssh-keygen -Y verify`, one process per bundle, as a shell
    loop would check them."""
    base = os.path.join(work, "signed")
    plain = os.path.join(base, "plain")
    signed = os.path.join(base, "signed")
    os.makedirs(plain)
    key = os.path.join(base, "key")
    sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f", key])
    with open(key + ".pub") as f:
        public = f.read().strip()
    signers = os.path.join(base, "signers")
    with open(signers, "w") as f:
        f.write(f"ci@bench {public}\n")
    for i in range(count):
        b = os.path.join(plain, f"b{i:05d}")
        os.makedirs(b)
        with open(os.path.join(b, f"p{i:05d}.html"), "w") as f:
            f.write(f"<p>page {i}</p>\n")
        seal(b, f"bundle-{i:05d}")
    shutil.copytree(plain, signed)
    for i in range(count):
        sh([BIN, "bundle", "seal", os.path.join(signed, f"b{i:05d}"), "--id", f"bundle-{i:05d}",
            "--created", "2026-06-04T00:00:00Z", "--sign", key], stdout=subprocess.DEVNULL)
    ours_plain, ours_signed, peer = [], [], []
    for run in range(runs):
        for kind, src, out in (("plain", plain, ours_plain), ("signed", signed, ours_signed)):
            rbase = os.path.join(base, f"run{run}-{kind}")
            config = os.path.join(rbase, "config.yaml")
            spool = os.path.join(rbase, "spool")
            os.makedirs(os.path.join(spool, "bench"))
            write_config(config, spool, os.path.join(rbase, "root"))
            if kind == "signed":
                with open(config) as f:
                    text = f.read()
                text = text.replace("  - id: bench\n", f"  - id: bench\n    signatures:\n      allowed_signers: {signers}\n")
                with open(config, "w") as f:
                    f.write(text)
            sh(["cp", "-a", src, os.path.join(spool, "bench", "inbox")])
            sh("sync")
            t, _ = timed([BIN, "--config", config, "agent", "--once"], env=dict(os.environ, RUST_LOG="warn"))
            out.append(t)
            if kind == "signed":
                done = os.listdir(os.path.join(spool, "bench", "done"))
                if len(done) != count:
                    sys.exit(f"signed backlog: {len(done)} of {count} bundles in done/")
        peer.append(timed_shell(
            f"""set -e
cd '{signed}'
for b in *; do
  ssh-keygen -Y verify -f '{signers}' -I ci@bench -n distributor -s "$b/manifest.json.sig" < "$b/manifest.json" >/dev/null
done"""))
    runs_line("signed", plain=ours_plain, signed=ours_signed, ssh_keygen=peer)
    # The check alone, in one process (examples/signature_cost.rs).
    alone = subprocess.run(
        [COST, signers] + [os.path.join(signed, f"b{i:05d}") for i in range(count)],
        check=True, stdout=subprocess.PIPE).stdout.decode().strip()
    return {"plain": median(ours_plain), "signed": median(ours_signed), "peer": median(peer),
            "count": count, "check_us": float(alone)}


def make_nested(src, count):
    """Bundles shaped like real ones: 3 files in a new subfolder each."""
    md = ("# Report\n\n" + "lorem ipsum dolor sit amet " * 160)[:4096]
    html = ("<p>" + "x" * 20480)[:20480]
    for i in range(count):
        b = os.path.join(src, f"b{i:05d}")
        folder = os.path.join(b, f"r{i:05d}")
        os.makedirs(folder)
        with open(os.path.join(folder, "report.md"), "w") as f:
            f.write(md)
        with open(os.path.join(folder, "page.html"), "w") as f:
            f.write(html)
        with open(os.path.join(folder, "data.bin"), "wb") as f:
            f.write(os.urandom(100 * 1024))
        seal(b, f"bundle-{i:05d}")


def write_prefixed_config(path, spool, root):
    with open(path, "w") as f:
        f.write(
            config_head(spool) + f"""    destinations:
      - id: root
        path: {root}
        prefix: "{{source_id}}/"
"""
        )


def bench_nested(work, count, runs):
    """A backlog of nested bundles through agent --once, without and with a
    `{source_id}/` prefix, against rsync of the same tree; fresh folders
    every run (see bench_backlog)."""
    base = os.path.join(work, "nested")
    src = os.path.join(base, "src")
    os.makedirs(src)
    make_nested(src, count)
    flat, prefixed, rsync = [], [], []
    env = dict(os.environ, RUST_LOG="warn")
    for run in range(runs):
        rbase = os.path.join(base, f"run{run}")
        for kind, series in (("flat", flat), ("prefixed", prefixed)):
            config = os.path.join(rbase, kind, "config.yaml")
            spool = os.path.join(rbase, kind, "spool")
            root = os.path.join(rbase, kind, "root")
            os.makedirs(os.path.join(spool, "bench"))
            if kind == "flat":
                write_config(config, spool, root, settle="0s")
            else:
                write_prefixed_config(config, spool, root)
            sh(["cp", "-a", src, os.path.join(spool, "bench", "inbox")])
            sh("sync")
            start = time.perf_counter()
            proc = subprocess.run([BIN, "--config", config, "agent", "--once"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            series.append(time.perf_counter() - start)
            if proc.returncode != 0:
                sys.exit(f"nested backlog ({kind}) failed:\n{proc.stderr.decode()[-2000:]}")
            if b"stepped aside" in proc.stderr:
                print(f"nested backlog ({kind}): a batch stepped aside (published one by one)",
                      flush=True)
        dest = os.path.join(rbase, "rsync-dest")
        sh("sync")
        start = time.perf_counter()
        sh(["rsync", "-a", "--checksum", "--fsync", src + "/", dest + "/"])
        rsync.append(time.perf_counter() - start)
    runs_line("nested", flat=flat, prefixed=prefixed, rsync=rsync)
    return {"flat": median(flat), "prefixed": median(prefixed), "rsync": median(rsync),
            "count": count}


def make_tree(dir, files, seed):
    """`files` files of 512 B to 12 KiB in nested folders (about 6 KiB
    each on average, like a generated documentation site)."""
    import random
    rng = random.Random(seed)
    for i in range(files):
        folder = os.path.join(dir, f"d{i % 50:02d}", f"s{(i // 50) % 20:02d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"page{i:06d}.html"), "wb") as f:
            f.write(os.urandom(rng.randint(512, 12 * 1024)))


def change_third(dir, files):
    """Rewrites every third file of a tree made by make_tree (same size)."""
    for i in range(0, files, 3):
        path = os.path.join(dir, f"d{i % 50:02d}", f"s{(i // 50) % 20:02d}", f"page{i:06d}.html")
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(os.urandom(size))


def bench_tree(work, files, runs):
    """One bundle holding a whole nested tree: into an empty root (against
    cp -a && sync), then its next version with a third of the files changed
    under workflow: replacement (against rsync --checksum --delete --fsync),
    then that version again, which changes nothing (skip_same, against the
    same rsync over the copy it just made)."""
    base = os.path.join(work, "tree")
    v1 = os.path.join(base, "v1")
    v2 = os.path.join(base, "v2")
    make_tree(v1, files, 1)
    sh(["cp", "-a", v1, v2])
    change_third(v2, files)
    seal(v1, "tree")
    seal(v2, "tree")
    fresh, update, cp, rsync, rss = [], [], [], [], []
    same, rsync_same, rss_same = [], [], []
    for run in range(runs):
        rbase = os.path.join(base, f"run{run}")
        config = os.path.join(rbase, "config.yaml")
        root = os.path.join(rbase, "root")
        os.makedirs(root)
        write_config(config, os.path.join(rbase, "spool"), root, workflow="replacement")
        sh("sync")
        t, m = timed([BIN, "--config", config, "run", "--pipeline", "bench", v1])
        fresh.append(t)
        rss.append(m)
        dest = os.path.join(rbase, "peer")

        def rsync_v2():
            start = time.perf_counter()
            sh(["rsync", "-a", "--checksum", "--delete", "--fsync", v2 + "/", dest + "/"])
            return time.perf_counter() - start

        sh("sync")
        cp.append(timed_shell(f"cp -a '{v1}' '{dest}' && sync"))
        sh("sync")
        t, m = timed([BIN, "--config", config, "run", "--pipeline", "bench", v2])
        update.append(t)
        rss.append(m)
        sh("sync")
        rsync.append(rsync_v2())
        sh("sync")
        out = []
        t, m = timed([BIN, "--config", config, "run", "--json", "--pipeline", "bench", v2],
                     stdout=out)
        action = json.loads(out[0])["destinations"][0]["action"]
        if action != "skip_same":
            sys.exit(f"tree: publishing the same version again was {action}, not skip_same")
        same.append(t)
        rss_same.append(m)
        sh("sync")
        rsync_same.append(rsync_v2())
    catalog_kib = os.path.getsize(os.path.join(base, "run0", "root", ".distributor.json")) // 1024
    runs_line("tree", fresh=fresh, cp=cp, update=update, rsync=rsync, same=same,
              rsync_same=rsync_same)
    print("tree peak RSS per run (MiB): fresh " + " ".join(f"{m / 1024:.1f}" for m in rss[0::2])
          + "; update " + " ".join(f"{m / 1024:.1f}" for m in rss[1::2])
          + "; same " + " ".join(f"{m / 1024:.1f}" for m in rss_same), flush=True)
    return {"fresh": median(fresh), "cp": median(cp), "update": median(update),
            "rsync": median(rsync), "same": median(same), "rsync_same": median(rsync_same),
            "files": files, "rss_kib": max(rss + rss_same), "catalog_kib": catalog_kib}


class CatalogWatch:
    """Wakes when a catalog is renamed into `root` (inotify, through libc),
    so that the latency benchmark's observer sleeps instead of spinning on
    stat(): on a 2-core machine a spinning observer takes a whole core from
    the agent it measures. BENCH_LATENCY_POLL=1 spins as before (to compare)."""

    IN_MOVED_TO = 0x80
    IN_CLOSE_WRITE = 0x08
    IN_DELETE = 0x200

    def __init__(self, root):
        import ctypes
        import select
        self.spin = os.environ.get("BENCH_LATENCY_POLL") == "1"
        self.select = select
        if self.spin:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(
                self.fd, root.encode(),
                self.IN_MOVED_TO | self.IN_CLOSE_WRITE | self.IN_DELETE) < 0:
            sys.exit(f"inotify on {root}: {os.strerror(ctypes.get_errno())}")

    def wait(self, timeout):
        """Returns after the next change in the root (or at once when spinning)."""
        if self.spin:
            return
        ready, _, _ = self.select.select([self.fd], [], [], timeout)
        if ready:
            os.read(self.fd, 65536)

    def close(self):
        if not self.spin:
            os.close(self.fd)


def bench_latency(work, count):
    base = os.path.join(work, "latency")
    staging = os.path.join(base, "staging")
    os.makedirs(staging)
    config = os.path.join(base, "config.yaml")
    spool = os.path.join(base, "spool")
    root = os.path.join(base, "root")
    metrics = os.path.join(base, "metrics.prom")
    write_config(config, spool, root, settle="0s", metrics=metrics)
    small_bundles(staging, count, "l", "r", "latency")
    inbox = os.path.join(spool, "bench", "inbox")
    # Like every timed run: start with nothing left to write back (the tree
    # measure before this one leaves about a GiB of it).
    sh("sync")
    # The root exists (empty), as a deployed destination does.
    os.makedirs(root)
    watch = CatalogWatch(root)
    agent = subprocess.Popen([BIN, "--config", config, "agent"], stderr=subprocess.DEVNULL,
                             env=dict(os.environ, RUST_LOG="warn"))
    catalog = os.path.join(root, ".distributor.json")
    # The journal is removed once the second barrier has made the renames
    # and the catalog durable: the end of the publication.
    journal = os.path.join(root, ".distributor-journal.json")
    durable = []
    try:
        deadline = time.time() + 10
        while not os.path.isdir(inbox):
            if time.time() > deadline:
                sys.exit("agent did not create its inbox")
            time.sleep(0.01)
        time.sleep(0.2)
        samples = []
        for i in range(count):
            name = f"r{i:04d}/report.md"
            start = time.perf_counter()
            os.rename(os.path.join(staging, f"l{i:04d}"), os.path.join(inbox, f"l{i:04d}"))
            last = None
            while True:
                try:
                    st = os.stat(catalog).st_mtime_ns
                except FileNotFoundError:
                    watch.wait(0.05)
                    continue
                if st != last:
                    last = st
                    try:
                        with open(catalog) as f:
                            if f'"{name}"' in f.read():
                                break
                    except FileNotFoundError:
                        pass
                if time.perf_counter() - start > 10:
                    sys.exit(f"bundle {i} was not published within 10 s")
                watch.wait(0.05)
            samples.append(time.perf_counter() - start)
            while os.path.exists(journal):
                if time.perf_counter() - start > 10:
                    sys.exit(f"bundle {i}: the journal was not removed within 10 s")
                watch.wait(0.05)
            durable.append(time.perf_counter() - start)
            time.sleep(0.01)
    finally:
        agent.terminate()
        agent.wait()
        watch.close()
    def p99(xs):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]
    # Publications made durable file by file because much else was waiting
    # to be written back on the machine (the agent writes its metrics as it
    # stops): a figure that depends on the machine's state, shown with it.
    file_by_file = None
    with open(metrics) as f:
        for line in f:
            if line.startswith("distributor_file_by_file_syncs_total{"):
                file_by_file = int(line.split()[-1])
    return {"p50": median(samples), "p99": p99(samples), "durable_p50": median(durable),
            "durable_p99": p99(durable), "count": count, "file_by_file": file_by_file}


def catalog_with(records):
    outputs = []
    for i in range(records):
        outputs.append({
            "path": f"old/{i // 1000:04d}/file-{i:07d}.html",
            "pipeline_id": "other",
            "destination_id": "site",
            "source": {"id": f"src-{i // 10:06d}", "digest": "sha256:" + "ab" * 32,
                       "created": "2026-01-01T00:00:00Z"},
            "kind": "source",
            "url": f"https://example.com/old/{i // 1000:04d}/file-{i:07d}.html",
            "sha256": "sha256:" + "cd" * 32,
            "size": 1234,
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
        })
    doc = {"schema_version": 4, "distributor_version": "bench", "created_at": "2026-01-01T00:00:00Z",
           "updated_at": "2026-01-01T00:00:00Z", "state": {"mode": "catalog"}, "outputs": outputs}
    return json.dumps(doc, indent=2) + "\n"


def write_floor(folder, data):
    """The catalog format's floor: writing the catalog's bytes into a new
    file once and fsyncing it (the yardstick of the catalog measures). Timed alone, the file
    removed afterwards."""
    path = os.path.join(folder, "floor.json")
    sh("sync")
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    os.unlink(path)
    return elapsed


def bench_catalog(work, sizes, runs):
    """`run` of a one-file bundle into a root whose catalog holds N records,
    beside python3 loading and dumping that catalog and beside the floor
    (writing and fsyncing the catalog's bytes once), all in the same runs."""
    base = os.path.join(work, "catalog")
    bundle = os.path.join(base, "bundle")
    os.makedirs(bundle)
    with open(os.path.join(bundle, "new.html"), "w") as f:
        f.write("<p>new</p>\n")
    seal(bundle, "catalog-bench")
    results = []
    for n in sizes:
        text = catalog_with(n)
        pristine = os.path.join(base, f"catalog-{n}.json")
        with open(pristine, "w") as f:
            f.write(text)
        config = os.path.join(base, f"config-{n}.yaml")
        root = os.path.join(base, f"root-{n}")
        write_config(config, os.path.join(base, "spool"), root)
        data = text.encode()
        ours, peer, rss, floor = [], [], [], []
        for _ in range(runs):
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root)
            shutil.copy(pristine, os.path.join(root, ".distributor.json"))
            sh("sync")
            t, m = timed([BIN, "--config", config, "run", "--pipeline", "bench", bundle])
            ours.append(t)
            rss.append(m)
            floor.append(write_floor(base, data))
            dumped = os.path.join(base, "python-dump.json")
            t, _ = timed([sys.executable, "-c",
                          "import json,sys; d=json.load(open(sys.argv[1])); "
                          "open(sys.argv[2],'w').write(json.dumps(d, indent=2)+'\\n')",
                          pristine, dumped])
            peer.append(t)
        runs_line(f"catalog {n} records", run=ours, floor=floor, python=peer)
        # Its steps alone, in one process (examples/catalog_cost.rs).
        steps = {}
        if n:
            out = subprocess.run([CATALOG_COST, pristine], check=True, capture_output=True).stdout
            steps = {k: float(v) for k, v in (line.split() for line in out.decode().splitlines())
                     if k.endswith("_ms")}
        results.append({"records": n, "ours": median(ours), "peer": median(peer),
                        "floor": median(floor), "rss_kib": max(rss), "file_kib": len(text) // 1024,
                        "steps": steps})
    return results


class Renames:
    """Counts the renames of one name into a folder (inotify IN_MOVED_TO,
    through libc), read once the command that made them has ended: how
    many times a catalog was written."""

    IN_MOVED_TO = 0x80

    def __init__(self, folder, name):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        self.name = name.encode()
        self.fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, folder.encode(), self.IN_MOVED_TO) < 0:
            sys.exit(f"inotify on {folder}: {os.strerror(ctypes.get_errno())}")

    def count(self):
        import struct
        found = 0
        while True:
            try:
                data = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                break
            at = 0
            while at < len(data):
                _, _, _, size = struct.unpack_from("iIII", data, at)
                name = data[at + 16:at + 16 + size].rstrip(b"\0")
                found += name == self.name
                at += 16 + size
        os.close(self.fd)
        return found


def bench_big_root_backlog(work, count, records, runs):
    """A backlog of `count` small bundles into an empty root and into a
    root whose catalog holds `records` records, the catalog's renames into
    place counted (one per batch is the goal), in two shapes each run:
    through `agent --once` (a fresh process, which reads the catalog
    first), and into a live agent that has already published into the
    root (it remembers the catalog), the bundles renamed into its inbox
    one after another. The floor (write + fsync of the catalog's bytes)
    and the catalog's read alone (examples/catalog_cost.rs) are measured
    in the same runs."""
    base = os.path.join(work, "bigbacklog")
    src = os.path.join(base, "src")
    os.makedirs(src)
    make_backlog(src, count)
    warm = os.path.join(base, "warm")
    os.makedirs(warm)
    with open(os.path.join(warm, "warm.html"), "w") as f:
        f.write("<p>warm</p>\n")
    seal(warm, "big-backlog-warm")
    text = catalog_with(records)
    pristine = os.path.join(base, "catalog.json")
    with open(pristine, "w") as f:
        f.write(text)
    data = text.encode()
    del text
    shapes = ("once", "live")
    times = {(shape, n): [] for shape in shapes for n in (0, records)}
    writes = {(shape, n): [] for shape in shapes for n in (0, records)}
    floors = []
    for run in range(runs):
        for shape in shapes:
            for n in (0, records):
                rbase = os.path.join(base, f"{shape}{run}-{n}")
                config = os.path.join(rbase, "config.yaml")
                spool = os.path.join(rbase, "spool")
                root = os.path.join(rbase, "root")
                os.makedirs(root)
                if n:
                    shutil.copy(pristine, os.path.join(root, ".distributor.json"))
                if shape == "once":
                    write_config(config, spool, root)
                    os.makedirs(os.path.join(spool, "bench"))
                    sh(["cp", "-a", src, os.path.join(spool, "bench", "inbox")])
                    sh("sync")
                    renames = Renames(root, ".distributor.json")
                    t, _ = timed([BIN, "--config", config, "agent", "--once"],
                                 env=dict(os.environ, RUST_LOG="warn"))
                    writes[shape, n].append(renames.count())
                    done = len(os.listdir(os.path.join(spool, "bench", "done")))
                else:
                    write_config(config, spool, root, settle="0s")
                    t, done, writes_live = live_backlog(rbase, config, spool, root, src, warm, count)
                    writes[shape, n].append(writes_live)
                if done != count:
                    sys.exit(f"big-root backlog ({shape}): {done} of {count} bundles in done/")
                times[shape, n].append(t)
        floors.append(write_floor(base, data))
    for shape in shapes:
        runs_line(f"backlog {count} bundles ({shape}) into 0 / {records} records",
                  empty=times[shape, 0], big=times[shape, records])
    runs_line("  floor", floor=floors)
    out = subprocess.run([CATALOG_COST, pristine], check=True, capture_output=True).stdout
    steps = {k: float(v) for k, v in (line.split() for line in out.decode().splitlines())
             if k.endswith("_ms")}
    return {"count": count, "records": records, "floor": median(floors), "read_ms": steps["read_ms"],
            **{f"{shape}_{key}": value for shape in shapes for key, value in (
                ("empty", median(times[shape, 0])), ("big", median(times[shape, records])),
                ("writes_empty", writes[shape, 0]), ("writes_big", writes[shape, records]))}}


def start_agent(config, done):
    """Starts the agent on `config` and waits until it made its `done`
    folder; returns it and a watch on that folder (CatalogWatch)."""
    agent = subprocess.Popen([BIN, "--config", config, "agent"], stderr=subprocess.DEVNULL,
                             env=dict(os.environ, RUST_LOG="warn"))
    deadline = time.time() + 10
    while not os.path.isdir(done):
        if agent.poll() is not None or time.time() > deadline:
            agent.terminate()
            sys.exit("agent did not create its done folder")
        time.sleep(0.01)
    return agent, CatalogWatch(done)


def live_backlog(rbase, config, spool, root, src, warm, count):
    """Starts the agent, publishes the one-file bundle `warm` so that it
    remembers the root's catalog, then renames the `count` bundles of `src`
    into its inbox one after another. Returns the time from the first
    rename until the last bundle is in done/, the bundles there, and how
    many times the catalog was renamed into place meanwhile."""
    staging = os.path.join(rbase, "staging")
    sh(["cp", "-a", src, staging])
    sh(["cp", "-a", warm, os.path.join(rbase, "warm")])
    sh("sync")
    inbox = os.path.join(spool, "bench", "inbox")
    done = os.path.join(spool, "bench", "done")
    agent, watch = start_agent(config, done)
    try:
        def wait_for(total, since):
            while len(os.listdir(done)) < total:
                if agent.poll() is not None or time.perf_counter() - since > 120:
                    sys.exit(f"live backlog: {len(os.listdir(done))} of {total} bundles in done/"
                             f"{' (the agent exited)' if agent.poll() is not None else ''}")
                watch.wait(0.05)

        os.rename(os.path.join(rbase, "warm"), os.path.join(inbox, "warm"))
        wait_for(1, time.perf_counter())
        renames = Renames(root, ".distributor.json")
        names = sorted(os.listdir(staging))
        start = time.perf_counter()
        for name in names:
            os.rename(os.path.join(staging, name), os.path.join(inbox, name))
        wait_for(count + 1, start)
        elapsed = time.perf_counter() - start
        return elapsed, len(os.listdir(done)) - 1, renames.count()
    finally:
        watch.close()
        agent.terminate()
        agent.wait()


def bench_big_root_latency(work, count, records):
    """The live agent's latency into a root whose catalog holds `records`
    records: from the rename of a 3-file bundle into the inbox until it is
    in done/, beside the same into an empty root, and the floor (write +
    fsync of that catalog's bytes) measured between the bundles."""
    base = os.path.join(work, "biglatency")
    text = catalog_with(records)
    data = text.encode()
    result = {"records": records, "file_kib": len(data) // 1024}
    floors = []
    for n in (0, records):
        rbase = os.path.join(base, str(n))
        staging = os.path.join(rbase, "staging")
        os.makedirs(staging)
        config = os.path.join(rbase, "config.yaml")
        spool = os.path.join(rbase, "spool")
        root = os.path.join(rbase, "root")
        write_config(config, spool, root, settle="0s")
        for i in range(count):
            b = os.path.join(staging, f"l{i:04d}")
            folder = os.path.join(b, f"r{i:04d}")
            os.makedirs(folder)
            for name, body in (("report.md", f"# Report {i}\n"), ("page.html", f"<p>{i}</p>\n")):
                with open(os.path.join(folder, name), "w") as f:
                    f.write(body)
            with open(os.path.join(folder, "data.bin"), "wb") as f:
                f.write(os.urandom(4096))
            seal(b, f"biglatency-{i:04d}")
        os.makedirs(root)
        if n:
            with open(os.path.join(root, ".distributor.json"), "w") as f:
                f.write(text)
        sh("sync")
        inbox = os.path.join(spool, "bench", "inbox")
        done = os.path.join(spool, "bench", "done")
        agent, watch = start_agent(config, done)
        samples, rss = [], 0
        try:
            for i in range(count):
                name = f"l{i:04d}"
                start = time.perf_counter()
                os.rename(os.path.join(staging, name), os.path.join(inbox, name))
                while len(os.listdir(done)) <= i:
                    if time.perf_counter() - start > 30:
                        sys.exit(f"bundle {i} was not in done/ within 30 s")
                    watch.wait(0.05)
                samples.append(time.perf_counter() - start)
                if n:
                    floors.append(write_floor(base, data))
            watch.close()
            with open(f"/proc/{agent.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        rss = int(line.split()[1])
        finally:
            agent.terminate()
            agent.wait()
        runs_line(f"agent latency into {n} records", latency=samples)
        result[n] = median(samples)
        if n:
            result["rss_kib"] = rss
    result["floor"] = median(floors)
    return result


def bench_million(work, records):
    """A root of `records` managed files (empty files, so that a million
    take inodes and no data) and their catalog, owned by the bench's own
    pipeline, through every command that reads the whole catalog: `run` of
    a one-file bundle, `verify`, `prune --apply` (a tenth of the sources are
    past retention), `reconcile-state` after files were deleted behind the
    tool's back, and `verify` again. Each step's result is checked, and its
    time and peak RSS are reported against the catalog's size."""
    base = os.path.join(work, "million")
    root = os.path.join(base, "root")
    os.makedirs(root)
    empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    sources = max(records // 1000, 10)
    outputs = []
    for i in range(records):
        src = i * sources // records
        folder = f"old/{src:05d}"
        if i == 0 or (i - 1) * sources // records != src:
            os.makedirs(os.path.join(root, folder))
        path = f"{folder}/file-{i:07d}.html"
        with open(os.path.join(root, path), "wb"):
            pass
        created = f"2026-01-01T{src // 60 % 24:02d}:{src % 60:02d}:00Z"
        outputs.append({
            "path": path, "pipeline_id": "bench", "destination_id": "root",
            "source": {"id": f"src-{src:05d}", "digest": "sha256:" + "ab" * 32,
                       "created": f"2026-01-{1 + src // 1440:02d}T{src // 60 % 24:02d}:{src % 60:02d}:00Z"},
            "kind": "source", "sha256": empty, "size": 0,
            "created_at": created, "updated_at": created,
        })
    doc = {"schema_version": 4, "distributor_version": "bench", "created_at": "2026-01-01T00:00:00Z",
           "updated_at": "2026-01-01T00:00:00Z", "state": {"mode": "catalog"}, "outputs": outputs}
    text = json.dumps(doc, indent=2) + "\n"
    del doc, outputs
    catalog = os.path.join(root, ".distributor.json")
    with open(catalog, "w") as f:
        f.write(text)
    catalog_kib = len(text) // 1024
    del text
    config = os.path.join(base, "config.yaml")
    # The newest sources are kept, the bundle published first among them.
    keep = sources - sources // 10 + 1
    with open(config, "w") as f:
        f.write(f"""spool: {os.path.join(base, "spool")}
pipelines:
  - id: bench
    destinations:
      - id: root
        path: {root}
        workflow: additive
        publish:
          source: true
        retention:
          prune:
            max_age: 1d
            keep_latest: {keep}
""")
    bundle = os.path.join(base, "bundle")
    os.makedirs(bundle)
    with open(os.path.join(bundle, "new.html"), "w") as f:
        f.write("<p>new</p>\n")
    seal(bundle, "million-bench")
    gone = [f"old/{sources - 1:05d}/file-{records - 1 - k:07d}.html" for k in range(10)]

    def count():
        with open(catalog) as f:
            return f.read().count('\n      "path": ')

    steps = []

    def step(name, cmd, expect):
        sh("sync")
        out = []
        t, rss = timed([BIN, "--config", config] + cmd, stdout=out)
        n = count()
        if n != expect:
            sys.exit(f"million: after {name} the catalog holds {n} records, not {expect}")
        steps.append((name, t, rss))
        print(f"million {name}: {t:.2f} s, peak RSS {rss // 1024} MiB, {n} records", flush=True)

    step("run", ["run", "--pipeline", "bench", bundle], records + 1)
    step("verify", ["verify", "--pipeline", "bench", "--destination", "root"], records + 1)
    pruned = (sources // 10) * (records // sources)
    step("prune --apply", ["prune", "--pipeline", "bench", "--destination", "root", "--apply"],
         records + 1 - pruned)
    for path in gone:
        os.unlink(os.path.join(root, path))
    step("reconcile-state", ["reconcile-state", "--pipeline", "bench", "--destination", "root"],
         records + 1 - pruned - len(gone))
    step("verify again", ["verify", "--pipeline", "bench", "--destination", "root"],
         records + 1 - pruned - len(gone))
    return {"records": records, "catalog_kib": catalog_kib, "steps": steps}


def bench_s3_backlog(work, server, count, runs):
    """A backlog of nested bundles through agent --once into a bucket,
    against rclone copy --checksum of the same objects (a folder tree of
    the published files) to the same server; a new bucket for every run."""
    import s3
    base = os.path.join(work, "s3backlog")
    src = os.path.join(base, "src")
    os.makedirs(src)
    make_nested(src, count)
    # The peer's tree: the bundles' files where they are published (hard links).
    peer = os.path.join(base, "peer")
    os.makedirs(peer)
    for b in sorted(os.listdir(src)):
        for entry in os.listdir(os.path.join(src, b)):
            if entry != "manifest.json":
                shutil.copytree(os.path.join(src, b, entry), os.path.join(peer, entry),
                                copy_function=os.link)
    expected = 3 * count
    ours, rclone = [], []
    for run in range(runs):
        rbase = os.path.join(base, f"run{run}")
        config = os.path.join(rbase, "config.yaml")
        spool = os.path.join(rbase, "spool")
        os.makedirs(os.path.join(spool, "bench"))
        bucket = server.bucket("backlog-ours")
        s3.write_s3_config(config, spool, server.endpoint, bucket)
        sh(["cp", "-a", src, os.path.join(spool, "bench", "inbox")])
        sh("sync")
        t, _ = timed([BIN, "--config", config, "agent", "--once"], env=server.distributor_env())
        ours.append(t)
        stored = server.objects(bucket)
        if len(stored) != expected + 1 or "site/.distributor.json" not in stored:
            sys.exit(f"s3 backlog: the bucket holds {len(stored)} objects after agent --once, "
                     f"expected {expected} outputs and the catalog")
        server.drop(bucket)

        bucket = server.bucket("backlog-rclone")
        sh("sync")
        t, _ = timed(["rclone", "copy", "--checksum", peer, f"s3:{bucket}/site"],
                     env=server.rclone_env())
        rclone.append(t)
        if len(server.objects(bucket)) != expected:
            sys.exit(f"s3 backlog: rclone stored {len(server.objects(bucket))} objects, expected {expected}")
        server.drop(bucket)
    runs_line("s3 backlog", ours=ours, rclone=rclone)
    return {"ours": median(ours), "rclone": median(rclone), "count": count}


def bench_s3_large(work, server, size, runs):
    """One large file into a bucket: run against rclone copy --checksum."""
    import s3
    base = os.path.join(work, "s3large")
    bundle = os.path.join(base, "bundle")
    os.makedirs(bundle)
    big = os.path.join(bundle, "big.bin")
    random_file(big, size)
    seal(bundle, "large")
    ours, rclone, rss, peer_rss = [], [], [], []
    for run in range(runs):
        config = os.path.join(base, f"config{run}.yaml")
        bucket = server.bucket("large-ours")
        s3.write_s3_config(config, os.path.join(base, f"spool{run}"), server.endpoint, bucket)
        sh("sync")
        t, m = timed([BIN, "--config", config, "run", "--pipeline", "bench", bundle],
                     env=server.distributor_env())
        ours.append(t)
        rss.append(m)
        if server.objects(bucket).get("site/big.bin") != size:
            sys.exit("s3 large: site/big.bin is not in the bucket after run")
        server.drop(bucket)

        bucket = server.bucket("large-rclone")
        sh("sync")
        t, m = timed(["rclone", "copy", "--checksum", big, f"s3:{bucket}/site"],
                     env=server.rclone_env())
        rclone.append(t)
        peer_rss.append(m)
        if server.objects(bucket).get("site/big.bin") != size:
            sys.exit("s3 large: rclone did not store site/big.bin")
        server.drop(bucket)
    runs_line("s3 large", ours=ours, rclone=rclone)
    return {"ours": median(ours), "rclone": median(rclone), "rss_kib": max(rss),
            "peer_rss_kib": max(peer_rss)}


def s3_catalog_records(raw, bucket, key):
    """How many records the catalog object holds (untimed)."""
    _, data = raw.get(bucket, key)
    return len(json.loads(data)["outputs"])


def bench_s3_catalog(work, server, sizes, runs):
    """`run` of a one-file bundle into an s3 root whose catalog object holds
    N records (someone else's: another pipeline's), beside the floor measured
    in the same runs: one GET of the catalog object and one conditional PUT
    (If-Match on its ETag) of the same bytes, by a raw client
    (s3.RawS3). Every run uses a new bucket whose catalog is put untimed."""
    import s3
    base = os.path.join(work, "s3catalog")
    bundle = os.path.join(base, "bundle")
    os.makedirs(bundle)
    with open(os.path.join(bundle, "new.html"), "w") as f:
        f.write("<p>new</p>\n")
    seal(bundle, "s3-catalog-bench")
    raw = s3.RawS3(server.endpoint)
    key = "site/.distributor.json"
    texts = {n: catalog_with(n).encode() for n in sizes}
    series = {n: {"run": [], "floor": [], "rss": []} for n in sizes}
    for run in range(runs):
        for n in sizes:
            bucket = server.bucket(f"catalog{n}")
            status, _ = raw.put(bucket, key, texts[n], if_none_match="*")
            if status != 200:
                sys.exit(f"s3 catalog: putting the {n}-record catalog: HTTP {status}")
            if run == 0 and n == sizes[0]:
                raw.check_conditional(bucket, key)
            config = os.path.join(base, f"config-{n}-{run}.yaml")
            s3.write_s3_config(config, os.path.join(base, f"spool-{n}-{run}"), server.endpoint,
                               bucket)
            # Floor and run in turn, each after a sync (the server's writes
            # of the step before are not paid by the next), the floor first
            # in even runs and second in odd ones.
            for step in ("floor", "run") if run % 2 == 0 else ("run", "floor"):
                sh("sync")
                if step == "floor":
                    series[n]["floor"].append(raw.floor(bucket, key))
                    continue
                t, m = timed([BIN, "--config", config, "run", "--pipeline", "bench", bundle],
                             env=server.distributor_env())
                series[n]["run"].append(t)
                series[n]["rss"].append(m)
            if run == 0 and s3_catalog_records(raw, bucket, key) != n + 1:
                sys.exit(f"s3 catalog: the catalog does not hold {n} + 1 records after run")
            server.drop(bucket)
    results = []
    for n in sizes:
        runs_line(f"s3 catalog {n} records", run=series[n]["run"], floor=series[n]["floor"])
        results.append({"records": n, "ours": median(series[n]["run"]),
                        "floor": median(series[n]["floor"]), "rss_kib": max(series[n]["rss"]),
                        "file_kib": len(texts[n]) // 1024})
    return results


def metric_values(path, name):
    """`{labels: value}` of one metric family in a Prometheus text file."""
    values = {}
    if not os.path.exists(path):
        return values
    with open(path) as f:
        for line in f:
            if line.startswith(name + "{") or line.startswith(name + " "):
                series, value = line.rsplit(None, 1)
                values[series[len(name):]] = float(value)
    return values


def bench_s3_hosts(work, server, records, hosts, per_host):
    """Several hosts into one s3 root of `records` records: `hosts` live
    agents (a spool and a metrics file each, the same pipeline and bucket
    root) each publish `per_host` one-file bundles, the next one renamed
    into its inbox as soon as the one before is in done/, all hosts at once.
    Afterwards the catalog must hold every record (none lost); each agent's
    metrics say how often its compare-and-swap lost and was re-applied or
    gave up (retried later)."""
    import s3
    import threading
    base = os.path.join(work, "s3hosts")
    raw = s3.RawS3(server.endpoint)
    bucket = server.bucket("hosts")
    key = "site/.distributor.json"
    status, _ = raw.put(bucket, key, catalog_with(records).encode(), if_none_match="*")
    if status != 200:
        sys.exit(f"s3 hosts: putting the catalog: HTTP {status}")
    agents, feeders, failures = [], [], []
    env = dict(server.distributor_env(), RUST_LOG="info")
    for h in range(hosts):
        hdir = os.path.join(base, f"host{h}")
        src = os.path.join(hdir, "src")
        for j in range(per_host):
            b = os.path.join(src, f"b{j:03d}")
            os.makedirs(os.path.join(b, f"h{h}"))
            with open(os.path.join(b, f"h{h}", f"page{j:03d}.html"), "w") as f:
                f.write(f"<p>host {h} page {j}</p>\n")
            seal(b, f"host{h}-{j:03d}")
        spool = os.path.join(hdir, "spool")
        config = os.path.join(hdir, "config.yaml")
        s3.write_s3_config(config, spool, server.endpoint, bucket)
        with open(config) as f:
            text = f.read()
        text = text.replace("  prune_interval: 0s\n",
                            f"  prune_interval: 0s\n  retry_max_interval: 1s\n"
                            f"  metrics_file: {hdir}/metrics.prom\n")
        with open(config, "w") as f:
            f.write(text)
        os.makedirs(os.path.join(spool, "bench", "inbox"))
        log = open(os.path.join(hdir, "agent.log"), "wb")
        agents.append((subprocess.Popen([BIN, "--config", config, "agent"], stdout=log,
                                        stderr=log, env=env), log, hdir))

    def feed(h):
        hdir = os.path.join(base, f"host{h}")
        inbox = os.path.join(hdir, "spool", "bench", "inbox")
        done = os.path.join(hdir, "spool", "bench", "done")
        failed = os.path.join(hdir, "spool", "bench", "failed")
        for j in range(per_host):
            os.rename(os.path.join(hdir, "src", f"b{j:03d}"), os.path.join(inbox, f"b{j:03d}"))
            deadline = time.time() + 300
            while not os.path.exists(os.path.join(done, f"b{j:03d}")):
                if os.path.exists(os.path.join(failed, f"b{j:03d}")) or time.time() > deadline:
                    failures.append(f"host {h} bundle {j} failed or took over 5 minutes")
                    return
                time.sleep(0.02)

    start = time.perf_counter()
    for h in range(hosts):
        feeders.append(threading.Thread(target=feed, args=(h,)))
        feeders[-1].start()
    for t in feeders:
        t.join()
    elapsed = time.perf_counter() - start
    per_agent = []
    for proc, log, hdir in agents:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        log.close()
        metrics = os.path.join(hdir, "metrics.prom")
        total = lambda name: int(sum(metric_values(metrics, name).values()))
        per_agent.append((total("distributor_bundles_done_total"),
                          total("distributor_catalog_rebases_total"),
                          total("distributor_catalog_conflicts_total")))
    if failures:
        sys.exit("s3 hosts: " + "; ".join(failures))
    found = s3_catalog_records(raw, bucket, key)
    server.drop(bucket)
    expected = records + hosts * per_host
    print(f"s3 hosts: {hosts} agents x {per_host} bundles into {records} records in "
          f"{elapsed:.1f} s; records expected {expected}, found {found}; per agent "
          f"(done, rebases, conflicts): {per_agent}", flush=True)
    if found != expected:
        sys.exit(f"s3 hosts: {expected - found} records lost")
    return {"hosts": hosts, "per_host": per_host, "expected": expected, "found": found,
            "elapsed": elapsed, "per_agent": per_agent}


def s3_catalog_rows(results):
    """The s3 catalog measure's rows: run(N) - run(empty) against 2 x the
    floor (one GET + one conditional PUT of the catalog object)."""
    rows = []
    empty = results[0]
    for r in results:
        rows.append((f"s3 run into {r['records']} records ({r['file_kib']} KiB)", r["ours"],
                     "GET + conditional PUT (floor)", r["floor"]))
        if r is not empty:
            extra = (r["ours"] - empty["ours"]) * 1000
            bound = 2 * r["floor"] * 1000
            rows.append((f"  run({r['records']}) - run(empty) = {extra:.1f} ms against "
                         f"2 x floor = {bound:.1f} ms ({'met' if extra <= bound else 'not met'})",
                         None, None, None))
        rows.append((f"  peak RSS {r['rss_kib'] // 1024} MiB", None, None, None))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one run (smoke test)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", choices=["large", "backlog", "signed", "nested", "tree", "latency", "catalog",
                                       "big-root", "million", "releases",
                                       "s3", "s3-backlog", "s3-large", "s3-catalog", "intake"])
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    large = (8 << 20) if args.quick else (1 << 30)
    backlog = 20 if args.quick else 1000
    nested = 30 if args.quick else 300
    tree = 1500 if args.quick else 50000
    tree_runs = 1 if args.quick else min(runs, 3)
    latency = 10 if args.quick else 200
    sizes = [0, 1000] if args.quick else [0, 1000, 10000, 100000]
    big_root = 2000 if args.quick else 100000
    big_backlog = 20 if args.quick else 300
    big_latency = 5 if args.quick else 30
    s3_backlog = 20 if args.quick else 1000
    s3_large = (16 << 20) if args.quick else (1 << 30)
    s3_sizes = [0, 1000] if args.quick else [0, 100000]
    s3_per_host = 2 if args.quick else 5

    work = tempfile.mkdtemp(prefix="distributor-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
              f"{platform.platform()}; data in {work}")
        rows = []
        if args.only in (None, "large"):
            r = bench_large(work, large, runs)
            rows.append((f"large file {large >> 20} MiB: run", r["ours"], "openssl dgst + cp + sync", r["peer"]))
            rows.append((f"  peak RSS {r['rss_kib'] // 1024} MiB", None, None, None))
        if args.only in (None, "backlog"):
            r = bench_backlog(work, backlog, runs)
            rows.append((f"backlog {r['count']} bundles: agent --once", r["ours"], "rsync -a --checksum --fsync", r["rsync"]))
            rows.append(("", r["ours"], "sha256sum -c + cp + sync + mv loop", r["loop"]))
        if args.only in (None, "signed"):
            r = bench_signed(work, backlog, runs)
            n = r["count"]
            rows.append((f"signed backlog {n} bundles: agent --once", r["signed"], "same backlog unsigned", r["plain"]))
            rows.append((f"  checking, per bundle: {(r['signed'] - r['plain']) * 1000 / n:.3f} ms",
                         None, None, None))
            rows.append((f"  ssh-keygen -Y verify, per bundle: {r['peer'] * 1000 / n:.3f} ms", None, None, None))
            rows.append((f"  the check alone (ed25519): {r['check_us']:.1f} us", None, None, None))
        if args.only in (None, "nested"):
            r = bench_nested(work, nested, runs)
            rows.append((f"nested backlog {r['count']} bundles: agent --once", r["flat"], "rsync -a --checksum --fsync", r["rsync"]))
            rows.append(("  with prefix {source_id}/", r["prefixed"], "rsync -a --checksum --fsync", r["rsync"]))
        if args.only in (None, "tree"):
            r = bench_tree(work, tree, tree_runs)
            rows.append((f"tree {r['files']} files into an empty root", r["fresh"], "cp -a && sync", r["cp"]))
            rows.append(("  next version, a third changed", r["update"], "rsync -a --checksum --delete --fsync", r["rsync"]))
            rows.append(("  that version again (skip_same)", r["same"], "rsync -a --checksum --delete --fsync", r["rsync_same"]))
            rows.append((f"  peak RSS {r['rss_kib'] // 1024} MiB "
                         f"({r['rss_kib'] / max(r['catalog_kib'], 1):.1f}x the catalog)", None, None, None))
        if args.only in (None, "latency"):
            r = bench_latency(work, latency)
            rows.append((f"latency p50 over {r['count']} renames", r["p50"], None, None))
            rows.append((f"latency p99 over {r['count']} renames", r["p99"], None, None))
            rows.append(("  p50 until durable (journal gone)", r["durable_p50"], None, None))
            rows.append(("  p99 until durable (journal gone)", r["durable_p99"], None, None))
            rows.append((f"  fsynced file by file (much else unwritten): {r['file_by_file']} "
                         f"of {r['count']}", None, None, None))
        if args.only in (None, "catalog"):
            results = bench_catalog(work, sizes, runs)
            empty = results[0]
            for r in results:
                rows.append((f"run into {r['records']} records ({r['file_kib']} KiB)", r["ours"],
                             "python3 json load + dump", r["peer"]))
                rows.append((f"  floor: write + fsync of the catalog {r['floor'] * 1000:.1f} ms",
                             None, None, None))
                if r is not empty:
                    extra = (r["ours"] - empty["ours"]) * 1000
                    bound = 4 * r["floor"] * 1000
                    rows.append((f"  run({r['records']}) - run(empty) = {extra:.1f} ms "
                                 f"against 4 x floor = {bound:.1f} ms"
                                 f" ({'met' if extra <= bound else 'not met'})", None, None, None))
                ratio = (f" ({r['rss_kib'] / r['file_kib']:.1f}x the catalog)"
                         if r["file_kib"] >= 1024 else "")
                rows.append((f"  peak RSS {r['rss_kib'] // 1024} MiB{ratio}", None, None, None))
                if r["steps"]:
                    st = r["steps"]
                    rows.append((f"  alone: read {st['read_ms']:.1f} ms, write formatting every "
                                 f"record {st['write_formatting_ms']:.1f} ms, reusing the texts "
                                 f"{st['write_reusing_ms']:.1f} ms", None, None, None))
        if args.only in (None, "big-root"):
            r = bench_big_root_latency(work, big_latency, big_root)
            floor = r["floor"] * 1000
            rows.append(("agent latency p50, empty root", r[0], None, None))
            rows.append((f"agent latency p50, {big_root} records ({r['file_kib']} KiB)",
                         r[big_root], None, None))
            extra = (r[big_root] - r[0]) * 1000
            rows.append((f"  p50({big_root}) - p50(empty) = {extra:.1f} ms against 2 x floor = "
                         f"{2 * floor:.1f} ms ({'met' if extra <= 2 * floor else 'not met'})",
                         None, None, None))
            rows.append((f"  agent peak RSS {r['rss_kib'] // 1024} MiB "
                         f"({r['rss_kib'] / max(r['file_kib'], 1):.1f}x the catalog)", None, None, None))
            r = bench_big_root_backlog(work, big_backlog, big_root, runs)
            for shape, name in (("once", "agent --once"), ("live", "live agent")):
                big, empty = r[f"{shape}_big"], r[f"{shape}_empty"]
                rows.append((f"backlog {r['count']} bundles into {big_root} records: {name}", big,
                             "same into an empty root", empty))
                writes = ", ".join(map(str, r[f"{shape}_writes_big"]))
                writes_empty = ", ".join(map(str, r[f"{shape}_writes_empty"]))
                rows.append((f"  catalog written {writes} times by run ({writes_empty} into the "
                             f"empty root); rate "
                             f"{empty / big:.2f}x the empty root's (goal >= 0.5)", None, None, None))
            rows.append((f"  floor: write + fsync of the catalog {r['floor'] * 1000:.1f} ms; "
                         f"reading it alone (a fresh process must) {r['read_ms']:.1f} ms",
                         None, None, None))
        if args.only in (None, "releases"):
            import releases
            rows.extend(releases.rows(releases.bench_releases(
                work, releases.sizes(args.quick), 1 if args.quick else min(runs, 3))))
        if args.only == "million":
            # Opt-in: a million files take minutes to make and 1M inodes.
            r = bench_million(work, 20000 if args.quick else 1000000)
            for name, t, rss in r["steps"]:
                rows.append((f"{r['records']} records: {name}", t, None, None))
                rows.append((f"  peak RSS {rss // 1024} MiB "
                             f"({rss / max(r['catalog_kib'], 1):.1f}x the catalog, "
                             f"{r['catalog_kib'] // 1024} MiB; goal <= 3x)", None, None, None))
        if args.only in (None, "s3", "s3-backlog", "s3-large", "s3-catalog", "intake"):
            import s3
            with s3.Seaweed(work) as server:
                if args.only in (None, "s3", "intake"):
                    import intake
                    rows.extend(intake.rows(intake.bench_intake(
                        work, server, intake.sizes(args.quick), 1 if args.quick else min(runs, 3))))
                if args.only in (None, "s3", "s3-backlog"):
                    r = bench_s3_backlog(work, server, s3_backlog, runs)
                    rows.append((f"s3 backlog {r['count']} bundles: agent --once", r["ours"],
                                 "rclone copy --checksum (goal <= 0.67x)", r["rclone"]))
                if args.only in (None, "s3", "s3-large"):
                    r = bench_s3_large(work, server, s3_large, runs)
                    rows.append((f"s3 large file {s3_large >> 20} MiB: run", r["ours"],
                                 "rclone copy --checksum (goal <= 1.10x)", r["rclone"]))
                    rows.append((f"  peak RSS {r['rss_kib'] // 1024} MiB (rclone "
                                 f"{r['peer_rss_kib'] // 1024} MiB)", None, None, None))
                if args.only in (None, "s3", "s3-catalog"):
                    rows.extend(s3_catalog_rows(bench_s3_catalog(work, server, s3_sizes, runs)))
                    r = bench_s3_hosts(work, server, s3_sizes[-1], 4, s3_per_host)
                    rows.append((f"s3 {r['hosts']} hosts x {r['per_host']} bundles into "
                                 f"{s3_sizes[-1]} records", r["elapsed"], None, None))
                    rows.append((f"  records expected {r['expected']}, found {r['found']}",
                                 None, None, None))
                    for h, (done, rebases, conflicts) in enumerate(r["per_agent"]):
                        rows.append((f"  host {h}: {done} done, {rebases} rebased, "
                                     f"{conflicts} conflicts", None, None, None))
        print()
        print(f"{'measure':<44} {'ours':>10} {'peer':>10} {'ratio':>7}  peer")
        for name, ours, peer_name, peer in rows:
            o = f"{ours * 1000:9.1f}ms" if ours is not None else ""
            p = f"{peer * 1000:9.1f}ms" if peer is not None else ""
            ratio = f"{ours / peer:6.2f}x" if ours is not None and peer else ""
            print(f"{name:<44} {o:>10} {p:>10} {ratio:>7}  {peer_name or ''}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
