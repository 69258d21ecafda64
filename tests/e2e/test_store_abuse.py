"""A store reachable by strangers must not give them its memory or its descriptors.

Reproductions of the hardening issue, each against a real `cohort store`:
- 30 connections that announce a 64 MiB frame and never send a token: the store closes
  each at once (a stranger may send at most a HELLO's 4 KiB) and its RSS stays small;
- connections that say nothing are closed after the handshake timeout (10 s);
- an authenticated client that never reads its responses is disconnected once its queue
  passes the bound, instead of growing the store without limit;
and through all of it a real job on the same store still runs.
"""
import re
import socket
import struct
import time
from pathlib import Path

import e2e_util as U

MB = 1 << 20


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def closed_by_peer(sock, timeout):
    """True when the server closed the connection within timeout (recv gives EOF/reset)."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def frame(body):
    return struct.pack("<I", len(body)) + body


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<I", len(b)) + b


def protocol_version():
    """kVersion in cohort/store/protocol.h: the version this build's server speaks."""
    header = (Path(__file__).resolve().parents[2] / "cohort/store/protocol.h").read_text()
    return int(re.search(r"kVersion = (\d+);", header).group(1))


def hello(token, rid=1, version=None):
    version = protocol_version() if version is None else version
    return frame(struct.pack("<BQ", 1, rid) + s("cohort-store") + struct.pack("<I", version)
                 + s(token))


def start_store(launcher, token):
    store = launcher.start([U.cohort_bin(), "store", "--host", "127.0.0.1", "--port", "0"],
                           env=U.clean_env(COHORT_TOKEN=token), name="store")
    m = U.wait_for(lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)", store.stdout), 30,
                   what="cohort store to listen")
    return store, int(m.group(1))


def job_runs(cohort, launcher, port, token, marker):
    p = launcher.run([cohort, "run", "--nnodes", "1", "--rdzv-endpoint", "127.0.0.1:%d" % port,
                      "--rdzv-id", marker, "--rdzv-conf", "is_host=false", "--no-python", "--",
                      "/bin/sh", "-c", "echo world=$WORLD_SIZE", marker], 60,
                     env=U.clean_env(COHORT_TOKEN=token), name="job")
    return p.p.returncode == 0 and "world=1" in p.stdout


def test_strangers_get_no_memory_and_no_descriptors(cohort, launcher, marker):
    token = "abuse-" + marker
    store, port = start_store(launcher, token)
    before = rss_mb(store.pid)
    # 1. Oversized frames before HELLO: closed at once, nothing allocated.
    big = []
    for _ in range(30):
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.sendall(struct.pack("<I", 64 * MB))
        big.append(c)
    assert all(closed_by_peer(c, 10) for c in big), "an oversized pre-HELLO frame was kept"
    after = rss_mb(store.pid)
    assert after < before + 50, "store RSS grew from %.0f to %.0f MB" % (before, after)
    # 2. Silent connections: closed by the handshake timeout.
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(10)]
    t0 = time.monotonic()
    assert all(closed_by_peer(c, 30) for c in silent), "a silent connection was kept open"
    waited = time.monotonic() - t0
    assert waited < 25, waited
    # 3. A job still runs on this store.
    assert job_runs(cohort, launcher, port, token, marker)
    for c in big + silent:
        c.close()
    assert store.poll() is None, store.describe()


def test_a_client_that_never_reads_is_disconnected(cohort, launcher, marker):
    token = "reader-" + marker
    store, port = start_store(launcher, token)
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.sendall(hello(token))
    value = b"x" * (4 * MB)
    c.sendall(frame(struct.pack("<BQ", 2, 2) + s("big") + s(value)))  # SET big
    get = frame(struct.pack("<BQ", 3, 3) + s("big") + struct.pack("<q", 1000))  # GET big
    peak = 0.0
    disconnected = False
    try:
        for _ in range(200):  # 800 MiB of responses asked for; the bound is 128 MiB
            c.sendall(get)
            peak = max(peak, rss_mb(store.pid))
    except (BrokenPipeError, ConnectionResetError):
        disconnected = True
    if not disconnected:
        # The requests fit in the socket buffers; the store must still drop the client.
        c.setblocking(True)
        c.settimeout(30)
        try:
            while c.recv(1 << 20):
                peak = max(peak, rss_mb(store.pid))
        except (ConnectionResetError, socket.timeout):
            pass
        disconnected = True
    c.close()
    peak = max(peak, rss_mb(store.pid))
    assert peak < 400, "the store grew to %.0f MB for one client that does not read" % peak
    assert "does not read its responses" in store.stderr, store.describe()
    assert job_runs(cohort, launcher, port, token, marker)


def test_a_client_of_another_protocol_version_is_told_which(cohort, launcher, marker):
    token = "version-" + marker
    store, port = start_store(launcher, token)
    ours = protocol_version()
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    c.sendall(hello(token, version=ours - 1))
    answer = b""
    while True:  # the refusal, then the close
        chunk = c.recv(4096)
        if not chunk:
            break
        answer += chunk
    c.close()
    (n,) = struct.unpack_from("<I", answer)
    rid, code, mlen = struct.unpack_from("<QBI", answer, 4)
    message = answer[17:17 + mlen].decode()
    assert len(answer) == 4 + n and rid == 1 and code != 0, answer
    assert ("protocol version %d not supported" % (ours - 1)) in message, message
    assert ("speaks version %d" % ours) in message, message
    # The store serves this build's clients as before.
    assert job_runs(cohort, launcher, port, token, marker)
    assert store.poll() is None, store.describe()
