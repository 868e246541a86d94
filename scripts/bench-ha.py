#!/usr/bin/env python3
"""`scripts/bench.sh ha [SECONDS] [TRIALS] [CLIENTS]`: an HA cluster of three `cairn server`
processes (the release binary) on one PostgreSQL of scripts/dev-postgres.sh, measured in one run:

1. durable KV writes/s through the active (CLIENTS keep-alive clients, group commit) next to
   single-row `INSERT ... ON CONFLICT` commits/s from one pgbench connection (-c 1) to the same
   database, for SECONDS each;
2. failover over TRIALS trials: kill -9 of the active under write load (writers send each write
   to the next node in turn), time from the kill to the first acknowledged write sent after it;
   every acknowledged write is read back from the new active at the end of each trial (lost = 0
   expected); the killed node is restarted, unsealed and rejoins as a standby;
3. latency of one client's KV reads and writes through a standby vs to the active (interleaved,
   for SECONDS): p50/p99 and the ratio.

Every answer is checked (status, and the value for reads); failed answers are counted and
reported, never included in a rate or a latency. Called by scripts/bench.sh with WORK (a temp
dir it removes on exit, whose `pids` file it uses to kill anything left); this script also stops
everything it started itself. Phases 1 and 3 run the Rust load generator `bench-load`
(tests/src/bin/bench-load.rs, built next to CAIRN_BIN), so that the clients' CPU on the 2 shared
cores stays small; the failover trials' writers are Python threads (their rate is not measured).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from benchlib import free_port_pair

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("CAIRN_BIN") or os.path.join(ROOT, "target", "release", "cairn")
PGBIN = sorted(
    (d for d in (f"/usr/lib/postgresql/{v}/bin" for v in os.listdir("/usr/lib/postgresql"))
     if os.path.exists(os.path.join(d, "pgbench"))),
    key=lambda d: int(d.split("/")[4]) if d.split("/")[4].isdigit() else 0,
)[-1] if os.path.isdir("/usr/lib/postgresql") else ""
WORK = os.environ["CAIRN_BENCH_WORK"]
LOG_LEVEL = os.environ.get("CAIRN_BENCH_LOG_LEVEL", "info")


def log(msg):
    print(f"bench ha: {msg}", file=sys.stderr, flush=True)


class Conn:
    """One keep-alive HTTP/1.1 connection; `call` raises OSError on any transport failure
    (the connection is then dropped and the next call reconnects)."""

    def __init__(self, port, timeout=10.0):
        self.port, self.timeout, self.sock, self.buf = port, timeout, None, b""

    def close(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock, self.buf = None, b""

    def _read_until(self, sep):
        while True:
            i = self.buf.find(sep)
            if i >= 0:
                out, self.buf = self.buf[:i], self.buf[i + len(sep):]
                return out
            d = self.sock.recv(65536)
            if not d:
                raise OSError("connection closed by the server")
            self.buf += d

    def _read_n(self, n):
        while len(self.buf) < n:
            d = self.sock.recv(65536)
            if not d:
                raise OSError("connection closed by the server")
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def call(self, method, path, token, body=b""):
        req = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
               f"X-Vault-Token: {token}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        try:
            if self.sock is None:
                self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.sendall(req)
            head = self._read_until(b"\r\n\r\n").decode("latin-1").split("\r\n")
            status = int(head[0].split(" ")[1])
            hdrs = {}
            for h in head[1:]:
                k, _, v = h.partition(":")
                hdrs[k.strip().lower()] = v.strip()
            if hdrs.get("transfer-encoding", "").lower() == "chunked":
                data = b""
                while True:
                    n = int(self._read_until(b"\r\n").split(b";")[0], 16)
                    if n == 0:
                        self._read_until(b"\r\n")
                        break
                    data += self._read_n(n)
                    self._read_n(2)
            else:
                data = self._read_n(int(hdrs.get("content-length", "0")))
            if hdrs.get("connection", "").lower() == "close":
                self.close()
            return status, data
        except (OSError, ValueError, IndexError) as e:
            self.close()
            raise OSError(str(e) or type(e).__name__)


def call1(port, method, path, token="", body=None, timeout=10.0):
    c = Conn(port, timeout)
    try:
        st, data = c.call(method, path, token, json.dumps(body).encode() if body is not None else b"")
        try:
            return st, json.loads(data) if data else {}
        except ValueError:
            return st, {"raw": data[:200].decode("latin-1")}
    finally:
        c.close()


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[int(round((len(v) - 1) * p))]


class Node:
    def __init__(self, i, url, table):
        self.i, self.port, self.proc = i, free_port_pair(), None
        self.cfg = os.path.join(WORK, f"node{i}.hcl")
        self.logpath = os.path.join(WORK, f"node{i}.log")
        with open(self.cfg, "w") as f:
            f.write(f'storage "postgresql" {{\n  connection_url = "{url}"\n  ha_enabled = true\n'
                    f'  table = "{table}_kv"\n  ha_table = "{table}_lock"\n}}\n'
                    f'listener "tcp" {{\n  address = "127.0.0.1:{self.port}"\n'
                    f'  cluster_address = "127.0.0.1:{self.port + 1}"\n  tls_disable = true\n}}\n'
                    f'api_addr = "http://127.0.0.1:{self.port}"\n'
                    f'cluster_addr = "https://127.0.0.1:{self.port + 1}"\n')

    def start(self):
        logf = open(self.logpath, "a")
        self.proc = subprocess.Popen([BIN, "server", "--config", self.cfg, "--log-level", LOG_LEVEL],
                                     stdout=logf, stderr=logf, stdin=subprocess.DEVNULL)
        logf.close()
        with open(os.path.join(WORK, "pids"), "a") as f:
            f.write(f"{self.proc.pid}\n")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.i} exited ({self.proc.returncode}): {self.tail()}")
            try:
                st, _ = call1(self.port, "GET", "/v1/sys/health", timeout=2)
                if st in (200, 429, 472, 473, 501, 503):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"node {self.i} did not answer sys/health in 30 s: {self.tail()}")

    def kill9(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def unseal(self, key):
        st, b = call1(self.port, "PUT", "/v1/sys/unseal", body={"key": key})
        if st != 200 or b.get("sealed") is not False:
            raise RuntimeError(f"unseal node {self.i}: {st} {b}")

    def is_active(self, token):
        try:
            st, b = call1(self.port, "GET", "/v1/sys/leader", token, timeout=3)
            return st == 200 and b.get("is_self") is True
        except OSError:
            return False

    def tail(self, n=15):
        try:
            with open(self.logpath, "rb") as f:
                return "\n    " + "\n    ".join(l.decode("utf-8", "replace").rstrip()
                                                 for l in f.readlines()[-n:])
        except OSError:
            return "(no log)"


def wait_active(nodes, token, limit, exclude=None):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        act = [n for n in nodes if n is not exclude and n.proc and n.proc.poll() is None
               and n.is_active(token)]
        if len(act) > 1:
            raise RuntimeError(f"two nodes say they are active: {[n.i for n in act]}")
        if act:
            return act[0]
        time.sleep(0.05)
    return None


VALUE = "x" * 64


LOAD = os.environ.get("CAIRN_BENCH_LOAD") or os.path.join(os.path.dirname(BIN), "bench-load")


def bench_load(*args):
    """Runs the Rust load generator (tests/src/bin/bench-load.rs); its JSON answer."""
    r = subprocess.run([LOAD, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"bench-load {args[0]} failed ({r.returncode}): {r.stderr}")
    return json.loads(r.stdout)


def write_throughput(port, token, clients, secs):
    """`clients` keep-alive clients PUT unique keys to the active (Rust load generator)."""
    r = bench_load("kv-put", f"127.0.0.1:{port}", token, clients, secs)
    return r["rate"], r["p50"], r["p99"], r["errors"], r["first_error"]


def pg_baseline(env, secs):
    pgenv = dict(os.environ, PGPASSWORD=env["CAIRN_PG_PASSWORD"])
    conn = ["-h", env["CAIRN_PG_HOST"], "-p", env["CAIRN_PG_PORT"], "-U", env["CAIRN_PG_USER"]]
    subprocess.run([os.path.join(PGBIN, "psql"), *conn, "-q", "-v", "ON_ERROR_STOP=1", "-c",
                    "CREATE TABLE IF NOT EXISTS bench_baseline (k bigint PRIMARY KEY, v text NOT NULL)",
                    env["CAIRN_PG_DB"]], env=pgenv, check=True, stdout=subprocess.DEVNULL)
    script = os.path.join(WORK, "insert.sql")
    with open(script, "w") as f:
        f.write("\\set k random(1, 1000000000)\n"
                f"INSERT INTO bench_baseline (k, v) VALUES (:k, '{'x' * 120}') "
                "ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v;\n")
    r = subprocess.run([os.path.join(PGBIN, "pgbench"), *conn, "-n", "-c", "1", "-j", "1",
                        "-T", str(max(1, int(round(secs)))), "-f", script, env["CAIRN_PG_DB"]],
                       env=pgenv, capture_output=True, text=True)
    out = r.stdout + r.stderr
    tps = failed = processed = None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("tps =") and "without initial connection" in line:
            tps = float(line.split()[2])
        elif line.startswith("number of failed transactions:"):
            failed = int(line.split(":")[1].split()[0])
        elif line.startswith("number of transactions actually processed:"):
            processed = int(line.split(":")[1].split("/")[0].strip())
    if r.returncode != 0 or tps is None:
        raise RuntimeError(f"pgbench failed ({r.returncode}):\n{out}")
    return tps, processed, failed if failed is not None else 0


def latency(active, standby, token, secs):
    """One client per node, interleaved: PUT active, PUT standby, GET active, GET standby
    (Rust load generator). Per kind (wa, ws, ra, rs): ops, p50, p99, errors, first_error."""
    return bench_load("latency", f"127.0.0.1:{active.port}", f"127.0.0.1:{standby.port}", token, secs)


def failover_trial(nodes, token, key, writers, trial):
    active = wait_active(nodes, token, 30)
    if active is None:
        raise RuntimeError("no active node before the trial")
    acked = []  # (key, value, t_sent, t_acked, node)
    lock = threading.Lock()
    stop = threading.Event()
    kill_at = [None]
    refused = []  # (sent, answered: s after the kill, node, status, answer)

    def writer(w):
        conns = {n.i: Conn(n.port, timeout=10) for n in nodes}
        j, k = w, 0
        while not stop.is_set():
            n = nodes[j % len(nodes)]
            j += 1
            k += 1
            name = f"f{trial}/{w}/{k}"
            val = f"{trial}-{w}-{k}"
            t0 = time.monotonic()
            try:
                st, _ = conns[n.i].call("PUT", f"/v1/kv/{name}", token,
                                        json.dumps({"value": val}).encode())
            except OSError as e:
                st, _ = None, str(e).encode()
            t1 = time.monotonic()
            if st == 204:
                with lock:
                    acked.append((name, val, t0, t1, n.i))
            else:
                if kill_at[0] is not None and t0 >= kill_at[0]:
                    with lock:  # the refusals after the kill, for the report of a slow trial
                        refused.append((round(t0 - kill_at[0], 3), round(t1 - kill_at[0], 3), n.i, st,
                                        bytes(_)[:160].decode("utf-8", "replace")))
                time.sleep(0.01)
        for c in conns.values():
            c.close()

    ths = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(writers)]
    for t in ths:
        t.start()
    time.sleep(1.0)
    with lock:
        before = len(acked)
    kill_at[0] = time.monotonic()
    active.kill9()
    first = None
    deadline = kill_at[0] + 30
    while time.monotonic() < deadline:
        with lock:
            after = [a for a in acked if a[2] >= kill_at[0]]
        if after:
            first = min(after, key=lambda a: a[3])
            break
        time.sleep(0.005)
    if first is not None:
        time.sleep(1.0)  # more writes acknowledged by the new active, read back below
    stop.set()
    for t in ths:
        t.join()
    failover = first[3] - kill_at[0] if first else None
    new_active = wait_active(nodes, token, 30, exclude=active)
    lost, wrong, unread = [], [], []
    if new_active is not None:
        # Read every acknowledged write back from the new active (a few readers).
        chunks = [acked[i::4] for i in range(4)]

        def reader(chunk):
            c = Conn(new_active.port, timeout=10)
            for name, val, *_ in chunk:
                for attempt in range(5):
                    try:
                        st, d = c.call("GET", f"/v1/kv/{name}", token)
                    except OSError:
                        st, d = None, b""
                    if st in (200, 404):
                        break
                    time.sleep(0.2)
                if st == 404:
                    lost.append(name)
                elif st == 200:
                    try:
                        if json.loads(d)["data"]["value"] != val:
                            wrong.append(name)
                    except (ValueError, KeyError, TypeError):
                        wrong.append(name)
                else:
                    unread.append(name)
            c.close()

        rs = [threading.Thread(target=reader, args=(ch,), daemon=True) for ch in chunks]
        for t in rs:
            t.start()
        for t in rs:
            t.join()
    # The killed node comes back, is unsealed and rejoins as a standby.
    active.start()
    active.unseal(key)
    deadline = time.monotonic() + 30
    rejoined = False
    while time.monotonic() < deadline:
        try:
            st, _ = call1(active.port, "GET", "/v1/sys/health", timeout=3)
            if st == 429:
                rejoined = True
                break
        except OSError:
            pass
        time.sleep(0.05)
    return {
        "killed": active.i, "new": new_active.i if new_active else None, "failover": failover,
        "first_node": first[4] if first else None, "acked": len(acked), "before": before,
        "lost": lost, "wrong": wrong, "unread": unread, "rejoined": rejoined,
        "refused": refused,
    }


def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    clients = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    writers = min(clients, 8)
    t_start = time.monotonic()
    load_start = open("/proc/loadavg").read().split()[:3]
    problems = []
    nodes = []
    pgdir = os.path.join(WORK, "pg")
    try:
        out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "dev-postgres.sh"), "start", pgdir],
                             capture_output=True, text=True,
                             env=dict(os.environ, CAIRN_PG_WATCH_PID=str(os.getpid())))
        if out.returncode != 0:
            raise RuntimeError(f"dev-postgres.sh start failed:\n{out.stderr}")
        env = {}
        for line in out.stdout.splitlines():
            if line.startswith("export "):
                k, _, v = line[len("export "):].partition("=")
                env[k] = v.strip("'")
        log(f"postgres on 127.0.0.1:{env['CAIRN_PG_PORT']} (PostgreSQL {os.path.basename(os.path.dirname(PGBIN))})")
        nodes = [Node(i, env["CAIRN_PG_URL"], "bench_ha") for i in range(3)]
        for n in nodes:
            n.start()
        st, b = call1(nodes[0].port, "PUT", "/v1/sys/init", body={"secret_shares": 1, "secret_threshold": 1})
        if st != 200:
            raise RuntimeError(f"init: {st} {b}")
        token, key = b["root_token"], b["keys"][0]
        for n in nodes:
            n.unseal(key)
        active = wait_active(nodes, token, 30)
        if active is None:
            raise RuntimeError("no active node 30 s after unsealing")
        st, b = call1(active.port, "POST", "/v1/sys/mounts/kv", token, {"type": "kv"})
        if st != 204:
            raise RuntimeError(f"mount kv: {st} {b}")
        standby = next(n for n in nodes if n is not active)
        log(f"3 nodes up, node {active.i} active; baseline: pgbench -c 1 for {secs:.0f} s")

        # 1. Durable writes/s vs single-connection commits.
        tps, processed, failed = pg_baseline(env, secs)
        log(f"baseline {tps:.0f} commits/s ({processed} processed, {failed} failed); Cairn writes, {clients} clients")
        w = write_throughput(active.port, token, clients, secs)
        if w[3]:
            problems.append(f"{w[3]} failed writes in the throughput phase (first: {w[4]})")

        # 3. Latency through a standby vs the active.
        log(f"latency: one client, active node {active.i} vs standby node {standby.i}, {secs:.0f} s")
        lat = latency(active, standby, token, secs)
        for k, v in lat.items():
            if v["errors"]:
                problems.append(f"{v['errors']} failed answers in latency phase {k} (first: {v['first_error']})")

        # 2. Failover trials.
        results = []
        for t in range(trials):
            r = failover_trial(nodes, token, key, writers, t)
            results.append(r)
            fo = f"{r['failover']:.3f} s" if r["failover"] is not None else "NONE within 30 s"
            log(f"trial {t + 1}/{trials}: killed node {r['killed']}, node {r['new']} active, "
                f"first ack after the kill {fo} (via node {r['first_node']}), {r['acked']} acked "
                f"({r['before']} before the kill), lost {len(r['lost'])}, wrong {len(r['wrong'])}, "
                f"unreadable {len(r['unread'])}, rejoined as standby: {r['rejoined']}")
            if r["failover"] is None:
                problems.append(f"trial {t + 1}: no acknowledged write within 30 s of the kill")
            if r["new"] is None:
                problems.append(f"trial {t + 1}: no new active node within 30 s")
            if r["lost"] or r["wrong"] or r["unread"]:
                problems.append(f"trial {t + 1}: acknowledged writes lost {r['lost'][:10]}, "
                                f"wrong value {r['wrong'][:10]}, unreadable {r['unread'][:10]}")
            if not r["rejoined"]:
                problems.append(f"trial {t + 1}: the restarted node {r['killed']} did not rejoin as a standby")
            if r["failover"] is None or r["failover"] > 3 or r["new"] is None or r["lost"] or r["wrong"]:
                log(f"trial {t + 1}: {len(r['refused'])} writes refused after the kill "
                    "(sent s, answered s, node, status, answer): "
                    + "".join(f"\n    {x}" for x in r["refused"][:40]))
                for n in nodes:
                    log(f"node {n.i} log tail:{n.tail(30)}")
            for n in nodes:
                if n.proc.poll() is not None and n.i != r["killed"]:
                    problems.append(f"trial {t + 1}: node {n.i} exited by itself ({n.proc.returncode})")

        fos = [r["failover"] for r in results if r["failover"] is not None]
        lost = sum(len(r["lost"]) + len(r["wrong"]) for r in results)
        acked = sum(r["acked"] for r in results)

        print()
        print(f"`scripts/bench.sh ha {secs:g} {trials} {clients}`: 3 nodes, PostgreSQL {os.path.basename(os.path.dirname(PGBIN))} on loopback, "
              f"{secs:.0f} s per phase, took {time.monotonic() - t_start:.0f} s; load average "
              f"{' '.join(load_start)} at the start, {' '.join(open('/proc/loadavg').read().split()[:3])} at the end "
              "(the run's own load is ~2-3)")
        print()
        print("| measurement | value | target |")
        print("|---|---:|---|")
        print(f"| PostgreSQL single-row INSERT ... ON CONFLICT commits/s, pgbench -c 1 ({processed} commits, {failed} failed) | {tps:.0f} | |")
        print(f"| Cairn durable KV writes/s through the active, {clients} clients (p50 / p99 ms; errors) | {w[0]:.0f} ({w[1]:.2f} / {w[2]:.2f}; {w[3]}) | |")
        print(f"| writes / baseline | **{w[0] / tps:.2f}×** | ≥ 2× |")
        if fos:
            print(f"| failover, kill -9 of the active → first acknowledged write, {len(fos)}/{trials} trials: median / p90 / max (s) | **{pct(fos, 0.5):.2f} / {pct(fos, 0.9):.2f} / {max(fos):.2f}** (min {min(fos):.2f}) | median ≤ 3 s, max ≤ 10 s |")
        else:
            print(f"| failover | **no trial completed** | median ≤ 3 s, max ≤ 10 s |")
        print(f"| acknowledged writes lost during the failovers (read back each trial) | **{lost}** of {acked} | 0 |")
        for kind, name in (("w", "write"), ("r", "read")):
            a, s = lat[kind + "a"], lat[kind + "s"]
            print(f"| KV {name} latency p50 / p99 (ms): active / through a standby ({a['ops']} / {s['ops']} ops; errors {a['errors']} / {s['errors']}) | {a['p50']:.2f} / {a['p99']:.2f} — {s['p50']:.2f} / {s['p99']:.2f} | |")
            print(f"| KV {name}: standby / active p50 (p99) | **{s['p50'] / max(a['p50'], 1e-9):.2f}×** ({s['p99'] / max(a['p99'], 1e-9):.2f}×) | p50 ≤ 1.5× |")
        print()
        print("failover per trial (s): " + ", ".join(f"{f:.2f}" if f is not None else "none"
                                                    for f in (r["failover"] for r in results)))
        if problems:
            print()
            print("PROBLEMS:")
            for p in problems:
                print(f"- {p}")
            return 1
        return 0
    finally:
        for n in nodes:
            n.kill9()
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "dev-postgres.sh"), "stop", pgdir],
                       capture_output=True)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
