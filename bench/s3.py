"""The s3 measures of bench.py: publishing into a bucket of a
real S3-compatible server (SeaweedFS, as the tests use), side by side with
`rclone copy --checksum` to the same server.

- The server is started once for all s3 measures, on free ports of
  127.0.0.1, with its data in the benchmark's temporary folder, and stopped
  at the end (SIGTERM, then SIGKILL after 2 s). It is killed with the
  benchmark if that dies first (PR_SET_PDEATHSIG).
- Every run of either tool writes into a bucket of its own, made before the
  timed command (creating a bucket is not what is measured), and emptied
  afterwards (untimed) so the server's volumes do not fill up.
"""

import ctypes
import datetime
import hashlib
import hmac
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "..", "scripts", "seaweedfs-version")) as _f:
    SEAWEEDFS_VERSION = _f.read().strip()
ACCESS_KEY = "distributor-bench"
SECRET_KEY = "distributor-bench-secret"


def weed_binary():
    """`$DISTRIBUTOR_TEST_WEED`, else the venv the tests and bench/run install."""
    if os.environ.get("DISTRIBUTOR_TEST_WEED"):
        return os.environ["DISTRIBUTOR_TEST_WEED"]
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(HERE, "..", "target")
    weed = os.path.join(target, "seaweedfs-venv", "bin", "weed")
    if not os.path.exists(weed):
        sys.exit(f"{weed} is missing: run the benchmark through bench/run, which installs "
                 f"SeaweedFS {SEAWEEDFS_VERSION} there")
    return weed


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    # PR_SET_PDEATHSIG = 1: the server gets SIGKILL when the benchmark dies.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class Seaweed:
    """One SeaweedFS server with S3 on a free port (as tests/integration/seaweed.rs)."""

    def __init__(self, work):
        self.dir = os.path.join(work, "seaweedfs")
        self.proc = None
        self.buckets = 0

    def __enter__(self):
        os.makedirs(os.path.join(self.dir, "data"))
        open(os.path.join(self.dir, "rclone.conf"), "w").close()
        config = os.path.join(self.dir, "s3.json")
        with open(config, "w") as f:
            f.write('{"identities":[{"name":"admin","credentials":[{"accessKey":"%s","secretKey":"%s"}],'
                    '"actions":["Admin","Read","Write","List","Tagging"]}]}' % (ACCESS_KEY, SECRET_KEY))
        # One volume per new collection (each bucket is one) instead of 7.
        with open(os.path.join(self.dir, "master.toml"), "w") as f:
            f.write("[master.volume_growth]\ncopy_1 = 1\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n")
        s3_port = free_port()
        args = [weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-dir={os.path.join(self.dir, 'data')}", "-master.volumeSizeLimitMB=64",
                "-volume.max=100", "-s3", f"-s3.port={s3_port}", f"-s3.config={config}",
                "-s3.port.iceberg=0", "-s3.port.lance=0"]
        for flag in ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
                     "filer.port", "filer.port.grpc", "s3.port.grpc"):
            args.append(f"-{flag}={free_port()}")
        self.endpoint = f"http://127.0.0.1:{s3_port}"
        self.log = open(os.path.join(self.dir, "weed.log"), "wb")
        started = time.perf_counter()
        self.proc = subprocess.Popen(args, cwd=self.dir, stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=self.log,
                                     preexec_fn=_die_with_parent)
        # Ready when a write succeeds (S3 answers before the volume server
        # has registered).
        deadline = time.time() + 90
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"SeaweedFS exited ({self.proc.returncode}); the end of its log:\n"
                         + self.log_tail())
            ok = subprocess.run(["rclone", "mkdir", "s3:ready"], env=self.rclone_env(True),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
            if ok:
                probe = subprocess.run(["rclone", "rcat", "s3:ready/probe"], input=b"ready",
                                       env=self.rclone_env(), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
                if probe.returncode == 0:
                    break
            if time.time() > deadline:
                self.__exit__(None, None, None)
                sys.exit("SeaweedFS did not accept a write within 90 s; the end of its log:\n"
                         + self.log_tail())
            time.sleep(0.2)
        print(f"SeaweedFS {SEAWEEDFS_VERSION} ready at {self.endpoint} after "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        return self

    def log_tail(self):
        """The last lines of the server's log (its folder is removed at the end)."""
        self.log.flush()
        with open(os.path.join(self.dir, "weed.log"), errors="replace") as f:
            return "".join(f.readlines()[-20:])

    def __exit__(self, *exc):
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        self.log.close()

    def rclone_env(self, make_buckets=False):
        """rclone's remote `s3:` on this server, configured by environment
        (an empty config file, so that it does not look for one)."""
        env = dict(os.environ, RCLONE_CONFIG=os.path.join(self.dir, "rclone.conf"))
        # rclone's AWS SDK fails to set up any client, even for plain http,
        # when AWS_CA_BUNDLE names a bundle ("unsupported transport").
        env.pop("AWS_CA_BUNDLE", None)
        return dict(env,
                    RCLONE_CONFIG_S3_TYPE="s3",
                    RCLONE_CONFIG_S3_PROVIDER="SeaweedFS",
                    RCLONE_CONFIG_S3_ENDPOINT=self.endpoint,
                    RCLONE_CONFIG_S3_ACCESS_KEY_ID=ACCESS_KEY,
                    RCLONE_CONFIG_S3_SECRET_ACCESS_KEY=SECRET_KEY,
                    RCLONE_CONFIG_S3_REGION="us-east-1",
                    RCLONE_CONFIG_S3_FORCE_PATH_STYLE="true",
                    # the bucket is made before the timed copy
                    RCLONE_CONFIG_S3_NO_CHECK_BUCKET="false" if make_buckets else "true")

    def distributor_env(self):
        return dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                    RUST_LOG="warn")

    def bucket(self, name):
        """A new, empty bucket."""
        self.buckets += 1
        bucket = f"{name}-{self.buckets}"
        subprocess.run(["rclone", "mkdir", f"s3:{bucket}"], env=self.rclone_env(True), check=True)
        return bucket

    def objects(self, bucket):
        """Keys and sizes in `bucket` (for checking what a run stored)."""
        out = subprocess.run(["rclone", "lsl", f"s3:{bucket}"], env=self.rclone_env(),
                             check=True, stdout=subprocess.PIPE).stdout.decode()
        found = {}
        for line in out.splitlines():
            parts = line.split(None, 3)
            if len(parts) == 4:
                found[parts[3]] = int(parts[0])
        return found

    def drop(self, bucket):
        """Deletes `bucket` and what is in it (untimed), freeing its volumes."""
        subprocess.run(["rclone", "purge", f"s3:{bucket}"], env=self.rclone_env(), check=True,
                       stderr=subprocess.DEVNULL)


def write_s3_config(path, spool, endpoint, bucket):
    from bench import config_head
    with open(path, "w") as f:
        f.write(
            config_head(spool) + f"""    destinations:
      - id: bucket
        backend: s3
        bucket: {bucket}
        path: site
        endpoint: {endpoint}
        region: us-east-1
        publish:
          source: true
          html: false
"""
        )


class RawS3:
    """A minimal S3 client for the catalog measure's floor: one GET and one
    conditional PUT of the catalog object, as fast as the server allows.

    Why this and not rclone or curl: the floor must be exactly one GET and
    one PUT carrying `If-Match` (rclone sends no conditions and adds HEADs
    around its transfers; `curl --aws-sigv4` would cost a process per
    request and hash nothing less). A keep-alive `http.client` connection
    with a SigV4 signer of a few lines sends just those two requests; the
    body is sent as `UNSIGNED-PAYLOAD` (allowed by SigV4, accepted by
    SeaweedFS and AWS), so the floor pays no hashing of the catalog's
    bytes, and python's own start is outside the timed part.
    """

    def __init__(self, endpoint, region="us-east-1"):
        url = urllib.parse.urlsplit(endpoint)
        self.host = url.netloc
        self.region = region
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)

    def _sign(self, method, path, headers):
        now = datetime.datetime.now(datetime.timezone.utc)
        stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = dict(headers, host=self.host, **{"x-amz-date": stamp,
                                                    "x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
        names = sorted(k.lower() for k in headers)
        lower = {k.lower(): str(v).strip() for k, v in headers.items()}
        canonical = "\n".join([method, urllib.parse.quote(path, safe="/-_.~"), "",
                               "".join(f"{n}:{lower[n]}\n" for n in names), ";".join(names),
                               "UNSIGNED-PAYLOAD"])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + SECRET_KEY).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, "
                                    f"SignedHeaders={';'.join(names)}, Signature={signature}")
        return headers

    def request(self, method, bucket, key, body=None, headers=None):
        """(status, ETag, body) of one request on the kept connection."""
        path = f"/{bucket}/{key}"
        headers = self._sign(method, path, dict(headers or {}))
        if body is not None:
            headers["Content-Length"] = str(len(body))
        self.conn.request(method, urllib.parse.quote(path, safe="/-_.~"), body=body,
                          headers=headers)
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, resp.getheader("ETag"), data

    def put(self, bucket, key, body, **conditions):
        """PUT `body`; `if_match` / `if_none_match` as conditions. The status and ETag."""
        headers = {}
        if "if_match" in conditions:
            headers["If-Match"] = conditions["if_match"]
        if "if_none_match" in conditions:
            headers["If-None-Match"] = conditions["if_none_match"]
        status, etag, _ = self.request("PUT", bucket, key, body, headers)
        return status, etag

    def get(self, bucket, key):
        status, etag, data = self.request("GET", bucket, key)
        if status != 200:
            sys.exit(f"GET {bucket}/{key}: HTTP {status}")
        return etag, data

    def floor(self, bucket, key):
        """The floor of one small publication into an s3 root: GET the
        catalog, then PUT the same bytes back with If-Match on its ETag
        (the compare-and-swap every publication makes). Seconds."""
        start = time.perf_counter()
        etag, data = self.get(bucket, key)
        status, _ = self.put(bucket, key, data, if_match=etag)
        elapsed = time.perf_counter() - start
        if status != 200:
            sys.exit(f"conditional PUT of {bucket}/{key} (If-Match {etag}): HTTP {status}")
        return elapsed

    def check_conditional(self, bucket, key):
        """Makes sure the floor's PUT is really conditional on this server:
        a PUT with an If-Match that is not the object's ETag must be refused."""
        status, _ = self.put(bucket, key, b"x", if_match='"0123456789abcdef0123456789abcdef"')
        if status != 412:
            sys.exit(f"the server accepted a PUT with a wrong If-Match (HTTP {status}); "
                     "the floor would not be a compare-and-swap")
