#!/usr/bin/env python3
"""`scripts/bench.sh alloc [SECONDS=5] [ROUNDS=4]`: what the server's allocator setting costs.

`cairn server` sets mimalloc's purge delay to 0 at start (freed pages go back to the system at
once; `shell/src/main.rs`, `alloc_settings`) unless MIMALLOC_PURGE_DELAY is set. This runs two
dev servers side by side, one with the server's own setting and one with
MIMALLOC_PURGE_DELAY=1000 (mimalloc's default), and alternates the same phases against them
(the order flips every round): 16 keep-alive writers (`bench-load kv-put`), then one client
interleaving writes and reads (`bench-load latency`). Per phase: the rate or p50s, failed
answers, the server's CPU (utime + stime from /proc/PID/stat) per request and its RSS. The
CPU of a kv-put phase includes its one-second warm-up, the same for both servers.

Environment: CAIRN_BIN (the cairn binary), BENCH_LOAD (the bench-load binary)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchlib import free_port_pair

CAIRN = os.environ["CAIRN_BIN"]
LOAD = os.environ["BENCH_LOAD"]
secs = sys.argv[1] if len(sys.argv) > 1 else "5"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_up(port):
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/sys/health").read()
            return
        except Exception:
            time.sleep(0.05)
    raise SystemExit(f"bench alloc: server on port {port} did not come up")


def main():
    homes, servers = [], []
    try:
        for name, purge in (("server's setting (0)", None), ("mimalloc default (1000)", "1000")):
            port = free_port_pair()
            env = dict(os.environ)
            env.pop("MIMALLOC_PURGE_DELAY", None)
            if purge:
                env["MIMALLOC_PURGE_DELAY"] = purge
            home = tempfile.mkdtemp(prefix="cairn-bench-alloc.")
            homes.append(home)
            env["HOME"] = home
            proc = subprocess.Popen(
                [CAIRN, "server", "--dev", f"--dev-listen-address=127.0.0.1:{port}",
                 "--dev-root-token-id=bench-alloc-root", "--log-level=warn"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            servers.append((name, port, proc))
        for _, port, _ in servers:
            wait_up(port)
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/sys/mounts/kv", method="POST",
                data=json.dumps({"type": "kv"}).encode(),
                headers={"X-Vault-Token": "bench-alloc-root"})
            urllib.request.urlopen(req).read()
        print("| round | server | phase | result | failed | CPU µs/request | RSS MiB | load |")
        print("|---:|---|---|---|---:|---:|---:|---:|")
        totals = {}
        for rnd in range(rounds):
            order = servers if rnd % 2 == 0 else list(reversed(servers))
            for name, port, proc in order:
                addr = f"127.0.0.1:{port}"
                for phase, args in (("16 writers", ["kv-put", addr, "bench-alloc-root", "16", secs]),
                                    ("1 client, writes+reads", ["latency", addr, addr, "bench-alloc-root", secs])):
                    c0 = cpu_seconds(proc.pid)
                    out = json.loads(subprocess.run([LOAD] + args, capture_output=True, check=True).stdout)
                    used = cpu_seconds(proc.pid) - c0
                    if phase == "16 writers":
                        n, failed = out["rate"] * float(secs), out["errors"]
                        result = f"{out['rate']:.0f} writes/s, p50 {out['p50']:.2f} ms"
                    else:
                        kinds = ("wa", "ws", "ra", "rs")
                        n = sum(out[k]["ops"] for k in kinds)
                        failed = sum(out[k]["errors"] for k in kinds)
                        result = f"read p50 {out['ra']['p50']:.3f} ms, write p50 {out['wa']['p50']:.3f} ms"
                    per = 1e6 * used / max(n, 1)
                    totals.setdefault((name, phase), []).append(per)
                    load = open("/proc/loadavg").read().split()[0]
                    print(f"| {rnd + 1} | {name} | {phase} | {result} | {failed} | {per:.0f} | {rss_mib(proc.pid):.0f} | {load} |", flush=True)
        print()
        for (name, phase), v in sorted(totals.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            print(f"{phase}, {name}: CPU µs/request mean {sum(v) / len(v):.0f} (min {min(v):.0f}, max {max(v):.0f})")
    finally:
        for _, _, proc in servers:
            proc.kill()
            proc.wait()
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
