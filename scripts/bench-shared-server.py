#!/usr/bin/env python3
"""Figures for the shared-server limits, on a real `reckon serve`.

    scripts/bench-shared-server.py --reckon target/release/reckon memory --size-mb 64 1024
    scripts/bench-shared-server.py --reckon target/release/reckon connections --nofile 1024 \
        --held 0 500 1100

memory: a provider that answers its first request with a small error and every later one
with SIZE MB (chunked, a 500 error body); reckon's provider test is run twice and the
server's peak RSS (VmHWM) is printed before and after the large answer.

connections: reckon serve under `ulimit -n NOFILE`; HELD idle connections are opened, then
the time /healthz takes to answer on a fresh connection is printed (or that it did not
answer within 30 s).

Only the standard library; prints one line per measurement.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def env():
    e = dict(os.environ)
    for k in ("RECKON_DATABASE_URL", "RECKON_MASTER_KEY", "RECKON_MAX_CONNECTIONS",
              "RECKON_MAX_PROVIDER_ANSWER_BYTES"):
        e.pop(k, None)
    e["RECKON_LOG"] = "warn"
    e["RECKON_EGRESS_ALLOW"] = '["127.0.0.1/32"]'
    return e


def cli(reckon, data, *args):
    out = subprocess.run([reckon, "--data-dir", data, *args], env=env(),
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{args}: {out.stderr}")
    return out.stdout.strip()


def request(port, method, path, token=None, timeout=30.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.settimeout(timeout)
    auth = f"authorization: Bearer {token}\r\n" if token else ""
    s.sendall(f"{method} {path} HTTP/1.1\r\nhost: reckon\r\n{auth}content-length: 0\r\n"
              f"connection: close\r\n\r\n".encode())
    chunks = []
    while True:
        b = s.recv(65536)
        if not b:
            break
        chunks.append(b)
    s.close()
    return b"".join(chunks).decode(errors="replace")


def serve(reckon, data, nofile, extra_env=None):
    port = free_port()
    e = env()
    e.update(extra_env or {})
    p = subprocess.Popen(
        ["sh", "-c", f'ulimit -n {nofile} && exec "$0" "$@"', reckon, "--data-dir", data,
         "serve", "--listen", f"127.0.0.1:{port}"],
        env=e, stdout=subprocess.DEVNULL)
    for _ in range(300):
        try:
            if request(port, "GET", "/healthz", timeout=2).startswith("HTTP/1.1 200"):
                return p, port
        except OSError:
            pass
        time.sleep(0.1)
    p.kill()
    sys.exit("reckon serve did not come up")


def vmhwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def hostile(size):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    count = {"n": 0}

    def one(c, n):
        try:
            c.recv(8192)
            c.sendall(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                      b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n")
            left = 1024 if n == 1 else size
            piece = b" " * (1 << 20)
            while left > 0:
                k = min(left, len(piece))
                c.sendall(b"%x\r\n" % k + piece[:k] + b"\r\n")
                left -= k
            c.sendall(b"0\r\n\r\n")
        except OSError:
            pass
        finally:
            c.close()

    def loop():
        while True:
            c, _ = srv.accept()
            count["n"] += 1
            threading.Thread(target=one, args=(c, count["n"]), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}/"


def memory(reckon, sizes_mb):
    for size_mb in sizes_mb:
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "data")
            base = hostile(size_mb << 20)
            cli(reckon, data, "tenant", "create", "acme")
            token = cli(reckon, data, "token", "create", "--tenant", "acme", "--role", "admin")
            cli(reckon, data, "provider", "add", "--tenant", "acme", "--name", "hostile",
                "--kind", "http", "--settings", json.dumps({"base_url": base, "rate_per_sec": 0}))
            p, port = serve(reckon, data, 4096)
            try:
                request(port, "POST", "/api/v1/providers/hostile/test", token, timeout=120)
                before = vmhwm(p.pid)
                t = time.monotonic()
                r = request(port, "POST", "/api/v1/providers/hostile/test", token, timeout=300)
                took = time.monotonic() - t
                after = vmhwm(p.pid)
                msg = json.loads(r.split("\r\n\r\n", 1)[1]).get("message", "")[:90]
                print(f"answer {size_mb} MB: peak RSS {before >> 20} MiB -> {after >> 20} MiB "
                      f"(+{(after - before) >> 20} MiB) in {took:.2f} s; test said: {msg}")
            finally:
                p.kill()
                p.wait()


def connections(reckon, nofile, helds):
    for held_n in helds:
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "data")
            cli(reckon, data, "tenant", "create", "acme")
            p, port = serve(reckon, data, nofile, {"RECKON_HEADER_READ_TIMEOUT_SECS": "300"})
            held = []
            try:
                for _ in range(held_n):
                    try:
                        held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                    except OSError:
                        break
                time.sleep(1)
                t = time.monotonic()
                try:
                    r = request(port, "GET", "/healthz", timeout=30)
                    status = r.split("\r\n", 1)[0]
                    took = f"{(time.monotonic() - t) * 1000:.1f} ms ({status})"
                except OSError as e:
                    took = f"no answer ({e.__class__.__name__} after {time.monotonic() - t:.1f} s)"
                print(f"nofile {nofile}, {len(held)} idle connections held: /healthz {took}")
            finally:
                for s in held:
                    s.close()
                p.kill()
                p.wait()


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--reckon", required=True)
    sub = a.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("memory")
    m.add_argument("--size-mb", type=int, nargs="+", default=[64, 1024])
    c = sub.add_parser("connections")
    c.add_argument("--nofile", type=int, default=1024)
    c.add_argument("--held", type=int, nargs="+", default=[0, 500, 1100])
    args = a.parse_args()
    if args.cmd == "memory":
        memory(args.reckon, args.size_mb)
    else:
        connections(args.reckon, args.nofile, args.held)


if __name__ == "__main__":
    main()
