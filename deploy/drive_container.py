"""Run the CPU image and check it from the host with the SDK (step two of ``make image-test``;
``deploy/image_test.sh`` builds the image first).

Two containers, one after the other, each removed at the end whatever happens:

* ``plain``: the image as ``docker run`` gets it, a token from ``SPARSESERVE_TOKEN``.
* ``hardened``: what the Kubernetes manifests do: read-only root filesystem, a writable
  volume at ``NUMBA_CACHE_DIR`` seeded with the image's cache, ``/tmp`` a tmpfs, no
  capabilities, tokens from a mounted file, TLS from a mounted certificate and key.

For each: the Docker health check turns healthy; the server is ready (kernels loaded)
within READY_WITHIN_S of the container's start; it runs as the image's unprivileged user;
put/get/reorder/matmul/to_dense over gRPC and REST give numpy's answers, and the first
reorder and matmul are answered within FIRST_CALL_S (a numba compile takes many seconds);
nothing was added to numba's cache (nothing was compiled); a call without the token is
refused. The plain container must also stop cleanly on SIGTERM (``docker stop``).

Then ``distributed`` (compose's profile of that name): a Dask scheduler and two Dask workers
from the same image, and a replica started with ``SPARSESERVE_DASK_SCHEDULER``. A tensor put
with ``partitions=2`` lands one block on each worker; matmul, reduce_sum and get over gRPC give
numpy's answers; the workers compiled nothing (their kernels came from the image's cache).

Usage: python deploy/drive_container.py IMAGE [--network bridge|host]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import ssl
from pathlib import Path

import numpy as np

from sparseserve import Client, SparseTensor
from sparseserve.errors import UnauthenticatedError

READY_WITHIN_S = 60.0     # a warm start is ~3 s here; a cold one (compiling) ~3 min
FIRST_CALL_S = 1.0        # the first reorder/matmul; a compile would take seconds
HEALTHY_WITHIN_S = 120.0
CACHE_DIR = "/var/cache/sparseserve/numba"
EXPECTED_UID = 10001
# The cleanup in image_test.sh removes what carries its run's label, should this script be killed.
LABEL = f"sparseserve.image-test={os.environ.get('IMAGE_TEST_RUN_ID', 'manual')}"

ST = SparseTensor(indices=[[2, 1], [0, 3], [1, 0], [0, 0], [2, 3]],
                  values=[1.0, 2.0, 3.0, 4.0, 5.0], dense_shape=[3, 4])
DENSE = np.zeros((3, 4))
for (i, j), v in zip(ST.indices.tolist(), ST.values.tolist()):
    DENSE[i, j] += v
B = np.arange(8, dtype=np.float64).reshape(4, 2) - 3.0


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)
    print(f"  ok: {message}", flush=True)


def docker(*args: str, check_rc: bool = True, timeout: float = 120) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check_rc and proc.returncode != 0:
        raise CheckFailed(f"docker {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


def _ts(text: str) -> float:
    """Docker's RFC 3339 timestamps (nanoseconds, 'Z') as epoch seconds."""
    text = text.strip().replace("Z", "+00:00")
    main, _, rest = text.partition(".")
    if rest:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits):]
        text = f"{main}.{digits[:6]}{zone}"
    return datetime.datetime.fromisoformat(text).timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sparseserve image test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Container:
    def __init__(self, image: str, name: str, network: str, env: dict[str, str], extra: list[str]):
        self.image, self.name, self.network = image, name, network
        self.env, self.extra = env, extra
        self.grpc_port = self.http_port = 0

    def start(self) -> None:
        args = ["run", "-d", "--name", self.name, "--label", LABEL,
                # The image's HEALTHCHECK command, polled more often than its 10 s so the test waits less.
                "--health-interval", "2s", "--health-start-period", "30s"]
        if self.network == "host":
            self.grpc_port, self.http_port = free_port(), free_port()
            self.env = {**self.env, "SPARSESERVE_GRPC_PORT": str(self.grpc_port),
                        "SPARSESERVE_HTTP_PORT": str(self.http_port)}
            args += ["--network", "host"]
        else:
            args += ["-p", "127.0.0.1::50051", "-p", "127.0.0.1::8000"]
        for key, value in self.env.items():
            args += ["-e", f"{key}={value}"]
        docker(*args, *self.extra, self.image)
        if self.network != "host":
            self.grpc_port = int(docker("port", self.name, "50051/tcp").splitlines()[0].rsplit(":", 1)[1])
            self.http_port = int(docker("port", self.name, "8000/tcp").splitlines()[0].rsplit(":", 1)[1])
        self.started_at = _ts(docker("inspect", "-f", "{{.State.StartedAt}}", self.name))

    def state(self) -> dict:
        return json.loads(docker("inspect", "-f", "{{json .State}}", self.name))

    def logs(self) -> str:
        proc = subprocess.run(["docker", "logs", "-t", self.name], capture_output=True, text=True, timeout=60)
        return proc.stdout + proc.stderr

    def wait_healthy(self) -> float:
        deadline = time.monotonic() + HEALTHY_WITHIN_S
        while True:
            state = self.state()
            health = (state.get("Health") or {}).get("Status")
            if not state.get("Running"):
                raise CheckFailed(f"{self.name} exited ({state.get('ExitCode')}) before it was healthy")
            if health == "healthy":
                return time.time() - self.started_at
            if health == "unhealthy":
                raise CheckFailed(f"{self.name} is unhealthy: {state['Health']['Log'][-1:]}")
            if time.monotonic() > deadline:
                raise CheckFailed(f"{self.name} not healthy within {HEALTHY_WITHIN_S:.0f} s (health: {health})")
            time.sleep(0.5)

    def event_times(self) -> dict[str, float]:
        """The server's JSON event lines on stdout, by event, as Docker's timestamps."""
        events = {}
        for line in self.logs().splitlines():
            stamp, _, text = line.partition(" ")
            if text.startswith("{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(text).get("event")
                    if event:
                        events.setdefault(event, _ts(stamp))
        return events

    def remove(self) -> None:
        subprocess.run(["docker", "rm", "-f", "-v", self.name], capture_output=True, timeout=120)


def cache_listing(image_or_container: str, *, container: bool) -> dict[str, int]:
    """numba's cache files and their sizes: a compile adds .nbc files and grows .nbi indexes."""
    cmd = ["find", CACHE_DIR, "-type", "f", "-printf", r"%P %s\n"]
    out = (docker("exec", image_or_container, *cmd) if container
           else docker("run", "--rm", "--label", LABEL, "--entrypoint", cmd[0], image_or_container, *cmd[1:]))
    return {name: int(size) for name, _, size in (line.rpartition(" ") for line in out.splitlines())}


def http_get(url: str, ca: Path | None) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(base: str, ca: Path | None, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        with contextlib.suppress(OSError):
            status, _ = http_get(base + "/readyz", ca)
            if status == 200:
                return
        if time.monotonic() > deadline:
            raise CheckFailed(f"{base}/readyz not 200 within {deadline_s:.0f} s")
        time.sleep(0.2)


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def drive_sdk(target: str, token: str, ca: Path | None, timings: dict, label: str) -> None:
    kwargs = {"token": token, "timeout": 30}
    if ca:
        kwargs["ca_file"] = str(ca)
    with contextlib.closing(Client(target, **kwargs)) as c:
        c.list_ops()  # the catalogue, so that the timings below are of the ops alone
        check(c.device == "cpu", f"{label}: the server runs on device {c.device!r}")
        reordered, t = timed(c.reorder, ST)
        timings[f"{label} first reorder"] = t
        order = np.lexsort(ST.indices.T[::-1])
        check(np.array_equal(reordered.indices, ST.indices[order])
              and np.array_equal(reordered.values, ST.values[order])
              and list(reordered.dense_shape) == [3, 4], f"{label}: reorder sorts like numpy's lexsort")
        check(t < FIRST_CALL_S, f"{label}: the first reorder took {t * 1e3:.1f} ms (< {FIRST_CALL_S:g} s: no compile)")
        product, t = timed(c.matmul, ST, B)
        timings[f"{label} first matmul"] = t
        check(np.array_equal(product, DENSE @ B), f"{label}: matmul equals numpy's dense @")
        check(t < FIRST_CALL_S, f"{label}: the first matmul took {t * 1e3:.1f} ms (< {FIRST_CALL_S:g} s: no compile)")
        dense = c.to_dense(reordered)  # to_dense wants ordered indices, as TensorFlow's does
        check(np.array_equal(dense, DENSE), f"{label}: to_dense of the reordered tensor equals numpy's")
        handle = c.put(ST)
        back = c.get(handle)
        check(np.array_equal(back.indices, ST.indices) and np.array_equal(back.values, ST.values)
              and list(back.dense_shape) == [3, 4], f"{label}: put then get returns the tensor")
        check(np.array_equal(c.matmul(handle, B), DENSE @ B), f"{label}: matmul takes a handle")
        c.delete(handle)
    anonymous_kwargs = {"ca_file": str(ca)} if ca else {}
    with contextlib.closing(Client(target, timeout=30, **anonymous_kwargs)) as anonymous:
        try:
            anonymous.to_dense(ST)
        except UnauthenticatedError:
            check(True, f"{label}: a call without the token is UNAUTHENTICATED")
        else:
            raise CheckFailed(f"{label}: a call without the token was answered")


def scenario(image: str, label: str, name: str, network: str, env: dict, extra: list[str], token: str,
             ca: Path | None, image_cache: dict[str, int], timings: dict, stop_check: bool) -> None:
    box = Container(image, name, network, env, extra)
    try:
        box.start()
        scheme = "https" if ca else "http"
        base = f"{scheme}://127.0.0.1:{box.http_port}"
        healthy = box.wait_healthy()
        check(True, f"Docker health check healthy {healthy:.1f} s after start")
        wait_ready(base, ca, READY_WITHIN_S)
        events = box.event_times()
        check("listening" in events and "ready" in events, "the server announced listening and ready")
        ready = events["ready"] - box.started_at
        timings[f"{label}: start to ready"] = ready
        check(ready < READY_WITHIN_S, f"ready {ready:.1f} s after the container started "
                                      f"(< {READY_WITHIN_S:g} s: kernels came from the image's cache)")
        uid = docker("exec", box.name, "id", "-u")
        check(uid == str(EXPECTED_UID) and uid != "0", f"docker exec runs as uid {uid}, not root")
        status = docker("exec", box.name, "cat", "/proc/1/status")
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        check(all(u == str(EXPECTED_UID) for u in uids), f"the server process (pid 1) runs as uid {uids[0]}")
        status, body = http_get(base + "/readyz", ca)
        check(status == 200 and json.loads(body) == {"status": "ready", "device": "cpu"}, f"GET /readyz: {body!r}")
        status, body = http_get(base + "/healthz", ca)
        check(status == 200, "GET /healthz is 200")
        status, body = http_get(base + "/metrics", ca)
        check(status == 200 and b"# TYPE" in body, "GET /metrics is Prometheus text")
        grpc_target = f"{'grpcs://' if ca else ''}127.0.0.1:{box.grpc_port}"
        drive_sdk(grpc_target, token, ca, timings, f"{label}/gRPC")
        drive_sdk(base, token, ca, timings, f"{label}/REST")
        after = cache_listing(box.name, container=True)
        added = sorted(set(after) - set(image_cache))
        grown = sorted(n for n in set(after) & set(image_cache) if after[n] != image_cache[n])
        check(not added and not grown, f"numba's cache is as built ({len(after)} files; added {added[:3]}, "
                                       f"changed {grown[:3]}): nothing compiled in the container")
        if stop_check:
            start = time.monotonic()
            docker("stop", "-t", "30", box.name, timeout=60)
            took = time.monotonic() - start
            state = box.state()
            check(state["ExitCode"] == 0, f"docker stop (SIGTERM): exit code {state['ExitCode']} in {took:.1f} s")
            check("stopped" in box.event_times(), "the server announced stopped (graceful shutdown)")
    except BaseException:
        print(f"--- logs of {box.name} ---\n{box.logs()}\n--- end of logs ---", file=sys.stderr)
        with contextlib.suppress(Exception):
            print(f"state: {json.dumps(box.state(), indent=1)}", file=sys.stderr)
        raise
    finally:
        box.remove()


def dask_container(image: str, name: str, network: str, args: list[str], publish: list[str] = ()) -> str:
    """A Dask scheduler or worker from the sparseserve image (``dask`` is in its venv)."""
    net = ["--network", network] if network else []
    ports = [f for p in publish for f in ("-p", p)]
    docker("run", "-d", "--name", name, "--label", LABEL, *net, *ports,
           "--entrypoint", "dask", "--no-healthcheck", image, *args)
    return name


def distributed_scenario(image: str, network: str, suffix: str, image_cache: dict[str, int], timings: dict) -> None:
    """Scale-out: a Dask scheduler, two Dask workers and a replica on it, all from the image."""
    from distributed import Client as DaskClient

    boxes: list[str] = []
    net = "host" if network == "host" else f"sparseserve-it-net-{suffix}"
    replica = None
    try:
        if network == "host":
            port = free_port()
            inside = outside = f"tcp://127.0.0.1:{port}"
            scheduler_args = ["scheduler", "--port", str(port), "--no-dashboard"]
            publish = []
        else:
            docker("network", "create", "--label", LABEL, net)
            inside = f"tcp://sparseserve-it-dask-{suffix}:8786"
            scheduler_args, publish = ["scheduler", "--port", "8786", "--no-dashboard"], ["127.0.0.1::8786"]
        boxes.append(dask_container(image, f"sparseserve-it-dask-{suffix}", net, scheduler_args, publish))
        if network != "host":
            outside = "tcp://" + docker("port", boxes[0], "8786/tcp").splitlines()[0]
        for i in range(2):
            boxes.append(dask_container(image, f"sparseserve-it-dask-worker{i}-{suffix}", net,
                                        ["worker", inside, "--nthreads", "1", "--memory-limit", "1GiB",
                                         "--no-dashboard"]))
        with DaskClient(outside, timeout=60, set_as_default=False) as dask:
            dask.wait_for_workers(2, timeout=120)
            check(True, f"a Dask scheduler and 2 workers from the image ({outside})")
            replica = Container(image, f"sparseserve-it-replica-{suffix}", "host" if network == "host" else "bridge",
                                {"SPARSESERVE_DASK_SCHEDULER": inside,
                                 "SPARSESERVE_DISTRIBUTE_ABOVE_BYTES": "0"},
                                [] if network == "host" else ["--network", net])
            replica.start()
            base = f"http://127.0.0.1:{replica.http_port}"
            replica.wait_healthy()
            wait_ready(base, None, READY_WITHIN_S)
            check(True, "the replica on the Dask scheduler is ready")
            rng = np.random.default_rng(0)
            rows = np.repeat(np.arange(2000), 5)
            big = SparseTensor(indices=np.stack([rows, rng.integers(0, 300, rows.size)], axis=1),
                               values=rng.integers(-4, 5, rows.size).astype(np.float64), dense_shape=[2000, 300])
            dense = big.to_dense()
            x = np.arange(300.0)
            with contextlib.closing(Client(f"127.0.0.1:{replica.grpc_port}", timeout=120)) as c:
                handle, t = timed(c.put, big, partitions=2)
                timings["distributed put, 2 partitions"] = t
                held = [w for w, keys in dask.has_what().items() if keys]
                check(len(held) == 2, f"the two blocks are on {len(held)} different workers")
                product, t = timed(c.matmul, handle, x)
                timings["distributed first matmul"] = t
                check(np.array_equal(product, dense @ x), "matmul on the blocks equals numpy's")
                check(np.array_equal(c.reduce_sum(handle, axis=[0]), dense.sum(axis=0)),
                      "reduce_sum over the rows (a tree of partials) equals numpy's")
                back = c.get(handle)
                check(np.array_equal(back.to_dense(), dense), "get gathers the tensor")
                c.delete(handle)
        for box in boxes[1:]:
            after = cache_listing(box, container=True)
            grown = sorted(n for n in after if image_cache.get(n) != after[n])
            check(not grown, f"{box}: numba's cache is as built (changed {grown[:3]}): the worker compiled nothing")
    except BaseException:
        for box in boxes:
            proc = subprocess.run(["docker", "logs", box], capture_output=True, text=True, timeout=60)
            print(f"--- logs of {box} ---\n{(proc.stdout + proc.stderr)[-3000:]}", file=sys.stderr)
        if replica is not None:
            print(f"--- logs of {replica.name} ---\n{replica.logs()}", file=sys.stderr)
        raise
    finally:
        if replica is not None:
            replica.remove()
        for box in boxes:
            subprocess.run(["docker", "rm", "-f", "-v", box], capture_output=True, timeout=120)
        if network != "host":
            subprocess.run(["docker", "network", "rm", net], capture_output=True, timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("--network", choices=("bridge", "host"), default="bridge")
    args = parser.parse_args(argv)
    timings: dict[str, float] = {}
    suffix = f"{os.getpid()}-{secrets.token_hex(3)}"
    image_cache = cache_listing(args.image, container=False)
    try:
        check(len(image_cache) > 0 and any(n.endswith(".nbi") for n in image_cache),
              f"the image holds numba's cache: {len(image_cache)} files under {CACHE_DIR}")
        user = docker("image", "inspect", "-f", "{{.Config.User}}", args.image)
        check(user.split(":")[0] == str(EXPECTED_UID), f"the image's USER is {user}")

        print("== plain container (token from SPARSESERVE_TOKEN)", flush=True)
        token = secrets.token_urlsafe(16)
        scenario(args.image, "plain", f"sparseserve-it-plain-{suffix}", args.network, {"SPARSESERVE_TOKEN": token}, [],
                 token, None, image_cache, timings, stop_check=True)

        print("== hardened container (read-only root, token file, TLS)", flush=True)
        volume = f"sparseserve-it-cache-{suffix}"
        with tempfile.TemporaryDirectory(prefix="sparseserve-it-") as tmp:
            tmp = Path(tmp)
            (tmp / "tls").mkdir()
            cert, key = self_signed(tmp / "tls")
            token = secrets.token_urlsafe(16)
            (tmp / "tokens").write_text(f"# tenant token\nimage-test {token}\n")
            for path in (tmp / "tls", cert, key, tmp / "tokens"):
                path.chmod(0o755 if path.is_dir() else 0o644)  # the container's user reads them
            # A new named volume starts as a copy of the image's directory, as the manifests'
            # init container copies the cache into an emptyDir.
            docker("volume", "create", "--label", LABEL, volume)
            try:
                extra = ["--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev", "--cap-drop", "ALL",
                         "--security-opt", "no-new-privileges",
                         "-v", f"{volume}:{CACHE_DIR}",
                         "-v", f"{tmp / 'tokens'}:/etc/sparseserve/tokens/tokens:ro",
                         "-v", f"{tmp / 'tls'}:/etc/sparseserve/tls:ro"]
                env = {"SPARSESERVE_TOKEN_FILE": "/etc/sparseserve/tokens/tokens",
                       "SPARSESERVE_TLS_CERT": "/etc/sparseserve/tls/tls.crt",
                       "SPARSESERVE_TLS_KEY": "/etc/sparseserve/tls/tls.key"}
                scenario(args.image, "hardened", f"sparseserve-it-hardened-{suffix}", args.network, env, extra,
                         token, cert, image_cache, timings, stop_check=False)
            finally:
                subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True, timeout=60)

        print("== distributed (a Dask scheduler, two Dask workers and a replica, all from the image)", flush=True)
        distributed_scenario(args.image, args.network, suffix, image_cache, timings)
    except CheckFailed as exc:
        print(f"IMAGE TEST FAILED: {exc}", file=sys.stderr)
        return 1
    print("== timings")
    for what, seconds in timings.items():
        print(f"  {what}: {seconds * 1e3:.1f} ms" if seconds < 1 else f"  {what}: {seconds:.1f} s")
    print("image test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
