"""The intake measure of bench.py (contract §22, issue 44 item 8): a
pipeline whose inbox is in a bucket of the benchmark's SeaweedFS, beside
a local inbox on the same machine and `rclone copy` of the same bundles
from the bucket to a local folder, in one run. Every pipeline publishes
into a local root.

- backlog: `count` nested 3-file bundles (bench.make_nested) uploaded
  into the intake's inbox (untimed, rclone), then, timed: `rclone copy` of
  that inbox to a local folder (the anchor), `agent --once` on the intake
  until every bundle has its result in done/, `agent --once` on a local
  inbox holding the same bundles, and a live agent given them one at a
  time (one_at_a_time: what §22.5, one bundle in work/, leaves an
  intake). `rclone move` of the inbox (uploaded again after it) is the
  floor of the requests an intake cannot do without: every object read
  and deleted. Goal: the intake's rate >= 0.5x the local inbox's.
- latency: a live agent on the intake; each 3-file bundle's files are put
  (untimed), then, after a random pause (so that the manifest lands
  anywhere in the listing interval), its manifest.json: timed from that
  PUT until its result object answers a HEAD (polled every 10 ms). The
  publication alone: the same bundles renamed into a live agent's local
  inbox, until each is in done/. Goal: p50 <= 2 x the listing interval +
  the publication's p50.
- large: one bundle of one `size` file through the intake (`agent --once`,
  peak RSS by /usr/bin/time), beside `rclone copy` of that object. Goal:
  peak RSS <= 64 MiB.
- idle: a holder and a standby on an empty intake, each behind a counting
  HTTP proxy (CountingProxy), for `window` seconds: the requests of each,
  by kind, per hour at the default lease of 30 s, and what they cost on
  AWS S3 prices.
- profile: a backlog of `profile` bundles through the proxy: requests per
  bundle by kind and object, and the server's milliseconds behind them.

Every agent here uses `lease: 3s` (LEASE): the holder lists the inbox
every 0.5 s and renews every 1 s; the idle counts are scaled to 30 s.
"""

import http.client
import http.server
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

from bench import (BIN, config_head, make_nested, median, random_file, runs_line, seal, sh, small_bundles, start_agent,
                   timed)

LEASE = 3.0
DEFAULT_LEASE = 30.0
PATH = "intake"
# AWS S3 standard, per 1,000 requests (DELETE is free).
PRICE = {"LIST": 0.005, "PUT": 0.005, "COPY": 0.005, "POST": 0.005, "GET": 0.0004,
         "HEAD": 0.0004, "DELETE": 0.0}
HOURS_A_MONTH = 730


def sizes(quick):
    if quick:
        return {"count": 20, "latency": 4, "large": 16 << 20, "window": 6, "profile": 20}
    return {"count": 1000, "latency": 40, "large": 1 << 30, "window": 60, "profile": 200}


def write_config(path, spool, root, endpoint=None, bucket=None, lease=LEASE):
    """A pipeline publishing into the local `root`, its inbox in `bucket`
    (or local when `bucket` is None)."""
    intake = "" if bucket is None else f"""    intake:
      backend: s3
      bucket: {bucket}
      path: {PATH}
      endpoint: {endpoint}
      region: us-east-1
      lease: {lease:g}s
"""
    with open(path, "w") as f:
        f.write(config_head(spool) + f"""{intake}    destinations:
      - id: root
        path: {root}
        workflow: additive
        publish:
          source: true
          html: false
""")


def upload(server, src, bucket, rel=f"{PATH}/inbox"):
    """Copies the bundles of `src` into `bucket` below `rel` (untimed).
    Nothing listens while it runs, so the order of the objects is free."""
    sh(["rclone", "copy", "--transfers", "8", src, f"s3:{bucket}/{rel}"], env=server.rclone_env())


def results(server, bucket, folder="done"):
    prefix = f"{PATH}/{folder}/"
    return sorted(k[len(prefix):].split("/")[0] for k in server.objects(bucket)
                  if k.startswith(prefix) and k.endswith("/.distributor-result.json"))


def inbox_left(server, bucket):
    return [k for k in server.objects(bucket) if k.startswith(f"{PATH}/inbox/")]


def bench_backlog(work, server, count, runs):
    base = os.path.join(work, "intake-backlog")
    src = os.path.join(base, "src")
    os.makedirs(src)
    make_nested(src, count)
    names = sorted(os.listdir(src))
    env = dict(server.distributor_env(), RUST_LOG="warn")
    intake, local, single, rclone, moved, rss = [], [], [], [], [], []
    for run in range(runs):
        rbase = os.path.join(base, f"run{run}")
        bucket = server.bucket("intake-backlog")
        upload(server, src, bucket)
        dest = os.path.join(rbase, "rclone")
        sh("sync")
        t, _ = timed(["rclone", "copy", f"s3:{bucket}/{PATH}/inbox", dest], env=server.rclone_env())
        rclone.append(t)
        if sorted(os.listdir(dest)) != names:
            sys.exit("intake backlog: rclone did not copy every bundle")
        # The floor of what an intake must ask of the server: every object
        # read and deleted (`rclone move`), before the results it writes.
        dest = os.path.join(rbase, "rclone-move")
        sh("sync")
        t, _ = timed(["rclone", "move", f"s3:{bucket}/{PATH}/inbox", dest], env=server.rclone_env())
        moved.append(t)
        if sorted(os.listdir(dest)) != names or inbox_left(server, bucket):
            sys.exit("intake backlog: rclone did not move every bundle")
        upload(server, src, bucket)

        config = os.path.join(rbase, "intake.yaml")
        write_config(config, os.path.join(rbase, "ispool"), os.path.join(rbase, "iroot"),
                     server.endpoint, bucket)
        os.makedirs(os.path.join(rbase, "iroot"))
        sh("sync")
        t, m = timed([BIN, "--config", config, "agent", "--once"], env=env)
        intake.append(t)
        rss.append(m)
        done = results(server, bucket)
        if done != names or inbox_left(server, bucket):
            sys.exit(f"intake backlog: {len(done)} of {count} results in done/, "
                     f"{len(inbox_left(server, bucket))} objects left in the inbox")
        server.drop(bucket)

        config = os.path.join(rbase, "local.yaml")
        spool = os.path.join(rbase, "lspool")
        os.makedirs(os.path.join(spool, "bench"))
        os.makedirs(os.path.join(rbase, "lroot"))
        write_config(config, spool, os.path.join(rbase, "lroot"))
        sh(["cp", "-a", src, os.path.join(spool, "bench", "inbox")])
        sh("sync")
        t, _ = timed([BIN, "--config", config, "agent", "--once"], env=env)
        local.append(t)
        if len(os.listdir(os.path.join(spool, "bench", "done"))) != count:
            sys.exit("intake backlog: the local inbox did not finish every bundle")
        single.append(one_at_a_time(rbase, src, names))
    runs_line(f"intake backlog {count}", intake=intake, local=local, single=single,
              rclone=rclone, rclone_move=moved)
    return {"count": count, "intake": median(intake), "local": median(local),
            "single": median(single), "rclone": median(rclone), "moved": median(moved),
            "rss_kib": max(rss)}


def one_at_a_time(rbase, src, names):
    """The local inbox as §22.5 leaves an intake: a live agent given the
    bundles one at a time (each renamed into its inbox once the one before
    is in done/), so that each is a publication of its own. The time from
    the first rename until the last bundle is in done/."""
    config = os.path.join(rbase, "single.yaml")
    spool = os.path.join(rbase, "sspool")
    staging = os.path.join(rbase, "sstaging")
    os.makedirs(os.path.join(spool, "bench"))
    os.makedirs(os.path.join(rbase, "sroot"))
    write_config(config, spool, os.path.join(rbase, "sroot"))
    sh(["cp", "-a", src, staging])
    sh("sync")
    inbox = os.path.join(spool, "bench", "inbox")
    done = os.path.join(spool, "bench", "done")
    agent, watch = start_agent(config, done)
    try:
        began = time.perf_counter()
        for name in names:
            os.rename(os.path.join(staging, name), os.path.join(inbox, name))
            while not os.path.exists(os.path.join(done, name)):
                if agent.poll() is not None or time.perf_counter() - began > 600:
                    sys.exit(f"intake backlog: {name} not in the local done/")
                watch.wait(0.05)
        return time.perf_counter() - began
    finally:
        watch.close()
        stop(agent)


def start(config, env, log):
    return subprocess.Popen([BIN, "--config", config, "agent"], stdout=log, stderr=log, env=env)


def wait_log(path, text, proc, timeout=30):
    deadline = time.time() + timeout
    while True:
        with open(path, errors="replace") as f:
            if text in f.read():
                return
        if proc.poll() is not None or time.time() > deadline:
            with open(path, errors="replace") as f:
                tail = f.read()[-2000:]
            sys.exit(f"intake: the agent did not log {text!r}:\n{tail}")
        time.sleep(0.05)


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench_latency(work, server, count):
    import s3
    base = os.path.join(work, "intake-latency")
    staging = os.path.join(base, "staging")
    small_bundles(staging, count, "l", "l", "l")
    local_staging = os.path.join(base, "local-staging")
    sh(["cp", "-a", staging, local_staging])
    bucket = server.bucket("intake-latency")
    raw = s3.RawS3(server.endpoint)
    config = os.path.join(base, "intake.yaml")
    os.makedirs(os.path.join(base, "iroot"))
    write_config(config, os.path.join(base, "ispool"), os.path.join(base, "iroot"),
                 server.endpoint, bucket)
    log_path = os.path.join(base, "agent.log")
    poll = LEASE / 6
    samples = []
    rng = random.Random(44)
    with open(log_path, "wb") as log:
        agent = start(config, dict(server.distributor_env(), RUST_LOG="info"), log)
        try:
            wait_log(log_path, "holds the intake lease", agent)
            for i in range(count):
                name = f"l{i:04d}"
                b = os.path.join(staging, name)
                files = []
                for d, _, fs in os.walk(b):
                    files += [os.path.relpath(os.path.join(d, f), b) for f in fs]
                for rel in sorted(files):
                    if rel != "manifest.json":
                        with open(os.path.join(b, rel), "rb") as f:
                            raw.put(bucket, f"{PATH}/inbox/{name}/{rel}", f.read())
                with open(os.path.join(b, "manifest.json"), "rb") as f:
                    manifest = f.read()
                time.sleep(rng.uniform(0, poll))
                start_at = time.perf_counter()
                status, _ = raw.put(bucket, f"{PATH}/inbox/{name}/manifest.json", manifest)
                if status != 200:
                    sys.exit(f"intake latency: PUT of {name}/manifest.json: HTTP {status}")
                key = f"{PATH}/done/{name}/.distributor-result.json"
                while raw.request("HEAD", bucket, key)[0] != 200:
                    if time.perf_counter() - start_at > 30:
                        sys.exit(f"intake latency: no result for {name} within 30 s")
                    time.sleep(0.01)
                samples.append(time.perf_counter() - start_at)
        finally:
            stop(agent)
    server.drop(bucket)

    # The publication alone: the same bundles through a live agent's local inbox.
    config = os.path.join(base, "local.yaml")
    spool = os.path.join(base, "lspool")
    os.makedirs(os.path.join(base, "lroot"))
    write_config(config, spool, os.path.join(base, "lroot"))
    inbox = os.path.join(spool, "bench", "inbox")
    done = os.path.join(spool, "bench", "done")
    sh("sync")
    agent, watch = start_agent(config, done)
    local = []
    try:
        for i in range(count):
            name = f"l{i:04d}"
            start_at = time.perf_counter()
            os.rename(os.path.join(local_staging, name), os.path.join(inbox, name))
            while not os.path.exists(os.path.join(done, name)):
                if time.perf_counter() - start_at > 30:
                    sys.exit(f"intake latency: {name} not in the local done/ within 30 s")
                watch.wait(0.05)
            local.append(time.perf_counter() - start_at)
            time.sleep(0.01)
    finally:
        watch.close()
        stop(agent)
    runs_line("intake latency", intake=samples, local=local)
    return {"count": count, "p50": median(samples), "max": max(samples), "poll": poll,
            "publication": median(local)}


def bench_large(work, server, size):
    base = os.path.join(work, "intake-large")
    bundle = os.path.join(base, "src", "big")
    os.makedirs(bundle)
    random_file(os.path.join(bundle, "big.bin"), size)
    seal(bundle, "intake-large")
    bucket = server.bucket("intake-large")
    upload(server, os.path.join(base, "src"), bucket)
    sh("sync")
    rclone, rclone_rss = timed(["rclone", "copy", f"s3:{bucket}/{PATH}/inbox/big/big.bin",
                                os.path.join(base, "rclone")], env=server.rclone_env())
    config = os.path.join(base, "intake.yaml")
    root = os.path.join(base, "root")
    os.makedirs(root)
    write_config(config, os.path.join(base, "spool"), root, server.endpoint, bucket)
    sh("sync")
    t, m = timed([BIN, "--config", config, "agent", "--once"], env=server.distributor_env())
    if results(server, bucket) != ["big"] or os.path.getsize(os.path.join(root, "big.bin")) != size:
        sys.exit("intake large: the bundle was not published")
    server.drop(bucket)
    runs_line("intake large", intake=[t], rclone=[rclone])
    return {"size": size, "intake": t, "rss_kib": m, "rclone": rclone, "rclone_rss_kib": rclone_rss}


class CountingProxy:
    """An HTTP proxy in front of the S3 server that counts each request by
    kind (LIST, GET, HEAD, PUT, COPY, POST, DELETE) and by the object it
    names (bundle names shown as <name>), with the milliseconds the server
    took to answer it. Headers pass unchanged (the client signed its own
    Host), bodies are read whole: for small objects only."""

    def __init__(self, upstream):
        url = urllib.parse.urlsplit(upstream)
        self.upstream = (url.hostname, url.port)
        self.lock = threading.Lock()
        self.counts = {}
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Else Nagle's algorithm holds each reply's body 40 ms for an ACK.
            disable_nagle_algorithm = True

            def log_message(self, *args):
                pass

            def forward(self):
                if not hasattr(self, "conn"):
                    self.conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                    self.conn.connect()
                    self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        chunk = self.rfile.read(size)
                        self.rfile.readline()
                        if size == 0:
                            break
                        body += chunk
                    headers = [(k, v) for k, v in self.headers.items()
                               if k.lower() != "transfer-encoding"]
                    headers.append(("Content-Length", str(len(body))))
                else:
                    n = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(n) if n else None
                    headers = list(self.headers.items())
                began = time.perf_counter()
                self.conn.putrequest(self.command, self.path, skip_host=True,
                                     skip_accept_encoding=True)
                for k, v in headers:
                    self.conn.putheader(k, v)
                self.conn.endheaders(body)
                resp = self.conn.getresponse()
                data = resp.read()
                took = time.perf_counter() - began
                proxy.count(self.command, self.path, self.headers, took)
                self.send_response_only(resp.status, resp.reason)
                length = None
                for k, v in resp.getheaders():
                    if k.lower() in ("transfer-encoding", "connection"):
                        continue
                    if k.lower() == "content-length":
                        length = v
                        if self.command != "HEAD":
                            continue
                    self.send_header(k, v)
                if self.command != "HEAD" or length is None:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def count(self, method, target, headers, took):
        url = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        path = urllib.parse.unquote(url.path).split("/", 2)[-1] if url.path.count("/") > 1 else ""
        if method == "POST" and "delete" in query:
            kind, what = "DELETE", "(DeleteObjects)"
        elif method == "GET" and ("list-type" in query or "prefix" in query):
            kind = "LIST"
            what = query.get("prefix", [""])[0] + ("" if "delimiter" in query else "**")
            what = re.sub(r"^(\w+/)?(inbox|done|failed)/[^/]+/", r"\1\2/<name>/", what)
        elif method == "PUT" and "x-amz-copy-source" in {k.lower() for k in headers}:
            kind, what = "COPY", path
        else:
            kind, what = method, path
        what = what[len(PATH) + 1:] if what.startswith(PATH + "/") else what
        if kind != "LIST":
            what = re.sub(r"^(inbox|done|failed)/[^/]+", r"\1/<name>", what)
            what = re.sub(r"^(inbox|failed)/<name>/(?!manifest\.json$|\.distributor-result\.json$)"
                          r".+", r"\1/<name>/<file>", what)
        what = re.sub(r"/(probe|clock)-[0-9a-f]+$", r"/\1-*", what)
        with self.lock:
            entry = self.counts.setdefault((kind, what), [0, 0.0])
            entry[0] += 1
            entry[1] += took

    def take(self):
        """The counts since the last take, and a fresh start."""
        with self.lock:
            counts, self.counts = self.counts, {}
        return counts

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def by_kind(counts):
    kinds = {}
    for (kind, _), (n, _) in counts.items():
        kinds[kind] = kinds.get(kind, 0) + n
    return kinds


def bench_idle(work, server, window):
    """A holder and a standby on one empty intake, each behind a proxy of
    its own; their requests over `window` seconds once both are settled."""
    base = os.path.join(work, "intake-idle")
    os.makedirs(base)
    bucket = server.bucket("intake-idle")
    env = dict(server.distributor_env(), RUST_LOG="info")
    agents, proxies = [], []
    try:
        for role in ("holder", "standby"):
            proxy = CountingProxy(server.endpoint)
            proxies.append(proxy)
            config = os.path.join(base, f"{role}.yaml")
            os.makedirs(os.path.join(base, f"{role}-root"))
            write_config(config, os.path.join(base, f"{role}-spool"),
                         os.path.join(base, f"{role}-root"), proxy.endpoint, bucket)
            log_path = os.path.join(base, f"{role}.log")
            log = open(log_path, "wb")
            agents.append((start(config, env, log), log))
            wait_log(log_path, "holds the intake lease" if role == "holder" else "standing by",
                     agents[-1][0])
        # What a holder does once when it takes the lease (the conformance
        # check, expiring done/) is behind us after a few looks.
        time.sleep(2 * LEASE)
        for p in proxies:
            p.take()
        time.sleep(window)
        counts = [p.take() for p in proxies]
    finally:
        for proc, log in agents:
            stop(proc)
            log.close()
        for p in proxies:
            p.close()
    server.drop(bucket)
    scale = 3600 / window * LEASE / DEFAULT_LEASE
    out = {"window": window}
    for role, c in zip(("holder", "standby"), counts):
        hourly = {k: n * scale for k, n in by_kind(c).items()}
        out[role] = {"counts": c, "hourly": hourly,
                     "monthly_usd": sum(PRICE[k] * n / 1000 for k, n in hourly.items())
                     * HOURS_A_MONTH}
        detail = ", ".join(f"{k} {w or '<root>'} {n}" for (k, w), (n, _) in sorted(c.items()))
        print(f"intake idle {role}, {window} s at lease {LEASE:g}s: {detail}", flush=True)
    return out


def bench_profile(work, server, count):
    """A backlog of `count` bundles through the proxy: what each bundle costs."""
    base = os.path.join(work, "intake-profile")
    src = os.path.join(base, "src")
    os.makedirs(src)
    make_nested(src, count)
    bucket = server.bucket("intake-profile")
    upload(server, src, bucket)
    proxy = CountingProxy(server.endpoint)
    config = os.path.join(base, "intake.yaml")
    os.makedirs(os.path.join(base, "root"))
    write_config(config, os.path.join(base, "spool"), os.path.join(base, "root"),
                 proxy.endpoint, bucket)
    try:
        sh("sync")
        t, _ = timed([BIN, "--config", config, "agent", "--once"],
                     env=dict(server.distributor_env(), RUST_LOG="warn"))
        counts = proxy.take()
    finally:
        proxy.close()
    if len(results(server, bucket)) != count:
        sys.exit("intake profile: not every bundle has its result")
    server.drop(bucket)
    total = sum(n for n, _ in counts.values())
    server_s = sum(s for _, s in counts.values())
    print(f"intake profile, {count} bundles through the proxy in {t:.2f} s: {total / count:.1f} "
          f"requests and {server_s * 1000 / count:.1f} ms of the server's a bundle", flush=True)
    for (kind, what), (n, s) in sorted(counts.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:6} {what or '<root>':40} {n / count:7.2f} a bundle, "
              f"{s * 1000 / count:7.2f} ms a bundle ({s * 1000 / n:.2f} ms each)", flush=True)
    return {"count": count, "elapsed": t, "requests": total / count,
            "server_ms": server_s * 1000 / count, "kinds": {k: n / count for k, n in
                                                            by_kind(counts).items()}}


def bench_intake(work, server, sz, runs):
    r = {"load": os.getloadavg()}
    r["backlog"] = bench_backlog(work, server, sz["count"], runs)
    r["profile"] = bench_profile(work, server, sz["profile"])
    r["latency"] = bench_latency(work, server, sz["latency"])
    r["large"] = bench_large(work, server, sz["large"])
    r["idle"] = bench_idle(work, server, sz["window"])
    r["load_after"] = os.getloadavg()
    return r


def rows(r):
    out = []
    b = r["backlog"]
    rate = b["local"] / b["intake"]
    out.append((f"intake backlog {b['count']} bundles: agent --once", b["intake"],
                "local inbox, agent --once", b["local"]))
    out.append(("", b["intake"], "local inbox, one bundle at a time", b["single"]))
    out.append(("", b["intake"], "rclone copy of the inbox", b["rclone"]))
    out.append(("", b["intake"], "rclone move of the inbox (read, delete)", b["moved"]))
    out.append((f"  rate {rate:.2f}x the local inbox's (goal >= 0.5: "
                f"{'met' if rate >= 0.5 else 'not met'}), {b['single'] / b['intake']:.2f}x "
                f"its rate one bundle at a time (the most §22.5 allows: "
                f"{b['local'] / b['single']:.2f}x); {b['count'] / b['intake']:.0f} "
                f"bundles/s", None, None, None))
    p = r["profile"]
    kinds = ", ".join(f"{k} {n:.1f}" for k, n in sorted(p["kinds"].items()))
    out.append((f"  a bundle: {p['requests']:.1f} requests ({kinds}), "
                f"{p['server_ms']:.1f} ms of the server's", None, None, None))
    lat = r["latency"]
    goal = 2 * lat["poll"] + lat["publication"]
    out.append((f"intake latency p50, {lat['count']} bundles, lists every {lat['poll']:g} s",
                lat["p50"], "local inbox (the publication)", lat["publication"]))
    out.append((f"  goal <= 2 x {lat['poll']:g} s + publication = {goal * 1000:.0f} ms: "
                f"{'met' if lat['p50'] <= goal else 'not met'}; max {lat['max'] * 1000:.0f} ms",
                None, None, None))
    g = r["large"]
    out.append((f"intake large file {g['size'] >> 20} MiB: agent --once", g["intake"],
                "rclone copy", g["rclone"]))
    out.append((f"  peak RSS {g['rss_kib'] / 1024:.1f} MiB (goal <= 64 MiB: "
                f"{'met' if g['rss_kib'] <= 64 * 1024 else 'not met'}); rclone "
                f"{g['rclone_rss_kib'] // 1024} MiB", None, None, None))
    idle = r["idle"]
    for role in ("holder", "standby"):
        h = idle[role]
        kinds = ", ".join(f"{k} {n:.0f}" for k, n in sorted(h["hourly"].items()))
        out.append((f"intake idle {role}, per hour at lease 30s: {kinds} "
                    f"(${h['monthly_usd']:.2f} a month on AWS)", None, None, None))
    out.append((f"  load average {r['load'][0]:.1f} before, {r['load_after'][0]:.1f} after",
                None, None, None))
    return out
