#!/usr/bin/env python3
"""What an idle node costs: the CPU of `ipsetmgr run` holding one policy of
MEMBERS addresses (hash:ip, IPv4) that nobody changes, per kernel backend,
resyncing every RESYNC (issue 34, "Quiet hours"; docs/scaling.md).

Per backend, in a fresh network namespace of its own: writes the policy
file, starts `ipsetmgr --netns NS --backend B run --policy-dir DIR
--resync-interval RESYNC`, waits until the set is written (its "written"
log line), lets it settle (--settle, 60 s), then reads the
process's utime+stime (/proc/PID/stat) at the start and the end of a
window of WINDOW seconds and prints CPU-seconds per hour and % of one core,
the backends side by side. Backends run at the same time (each in its own
netns) unless --one-at-a-time. Also counts, during the window, the resyncs
that read nothing (the debug line the nft backend logs when the ruleset
generation has not moved) and the writes (there should be none).

Needs root, `nft`, `ip`, and `cargo build --release --bin ipsetmgr`.

    sudo scripts/idle_cpu.py [--members 1000000] [--window 600] \\
        [--resync-interval 60s] [--backends netlink,nft] [--bin PATH]
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target/release/ipsetmgr"
TICK = os.sysconf("SC_CLK_TCK")
SKIP_LINE = "full resync read nothing"


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name may hold spaces: fields count from after its ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def write_policy(d, members):
    base = 10 << 24
    addrs = [f"{(base + i) >> 24}.{((base + i) >> 16) & 255}.{((base + i) >> 8) & 255}.{(base + i) & 255}"
             for i in range(members)]
    doc = {"apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy", "metadata": {"name": "idle"},
           "spec": {"type": "hash:ip", "family": "IPv4", "maxElem": members + 1024, "members": addrs}}
    (Path(d) / "idle.json").write_text(json.dumps(doc))


class Agent:
    """One `ipsetmgr run` in a netns of its own, its log read as it comes."""

    def __init__(self, args, backend, policy_dir):
        self.backend = backend
        self.ns = f"ipsetmgr-idle-{os.getpid()}-{backend}"
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        env = dict(os.environ, RUST_LOG="info,ipsetmgr_filemode=debug")
        self.proc = subprocess.Popen(
            [str(args.bin), "--netns", self.ns, "--backend", backend, "run",
             "--policy-dir", policy_dir, "--resync-interval", args.resync_interval],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.lock = threading.Lock()
        self.written = 0
        self.skipped = 0
        self.errors = []
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self):
        for line in self.proc.stderr:
            with self.lock:
                if re.search(r"\bwritten\b", line):
                    self.written += 1
                if SKIP_LINE in line:
                    self.skipped += 1
                if " ERROR " in line or " WARN " in line:
                    self.errors.append(line.strip())

    def counts(self):
        with self.lock:
            return self.written, self.skipped

    def wait_written(self, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.backend}: ipsetmgr exited with {self.proc.returncode}: {self.errors}")
            if self.counts()[0] > 0:
                return
            time.sleep(0.5)
        raise SystemExit(f"{self.backend}: the set was not written within {timeout} s: {self.errors}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        subprocess.run(["ip", "netns", "del", self.ns], check=False)


def seconds(text):
    m = re.fullmatch(r"(\d+)(s|m)?", text)
    if not m:
        raise SystemExit(f"--resync-interval {text}: use 10s or 1m")
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def measure(args, backends, policy_dir):
    agents = []
    try:
        for b in backends:
            agents.append(Agent(args, b, policy_dir))
        for a in agents:
            a.wait_written(args.apply_timeout)
        # Let the apply's aftermath (freed memory, the first resync) pass.
        time.sleep(args.settle)
        start = {a.backend: (cpu_seconds(a.proc.pid), a.counts()) for a in agents}
        t0 = time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - t0
        rows = []
        for a in agents:
            if a.proc.poll() is not None:
                raise SystemExit(f"{a.backend}: ipsetmgr exited during the window: {a.errors}")
            cpu0, (w0, s0) = start[a.backend]
            cpu = cpu_seconds(a.proc.pid) - cpu0
            w1, s1 = a.counts()
            rows.append((a.backend, elapsed, cpu, w1 - w0, s1 - s0))
        return rows
    finally:
        for a in agents:
            a.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1_000_000)
    ap.add_argument("--window", type=float, default=600, help="seconds sampled (default 600)")
    ap.add_argument("--resync-interval", default="60s", help="the agent's default: 60s")
    ap.add_argument("--settle", type=float, default=60, help="seconds between the write and the window")
    ap.add_argument("--backends", default="netlink,nft")
    ap.add_argument("--bin", type=Path, default=BIN)
    ap.add_argument("--apply-timeout", type=float, default=900)
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="measure the backends one after the other (default: at once, each in its own netns)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    if not args.bin.exists():
        raise SystemExit(f"{args.bin}: build it with `cargo build --release --bin ipsetmgr`")
    backends = [b for b in args.backends.split(",") if b]
    with tempfile.TemporaryDirectory(prefix="ipsetmgr-idle-") as d:
        write_policy(d, args.members)
        rows = []
        if args.one_at_a_time:
            for b in backends:
                rows += measure(args, [b], d)
        else:
            rows = measure(args, backends, d)
    interval = seconds(args.resync_interval)
    print(f"idle `ipsetmgr run`, {args.members:,} members, resync every {args.resync_interval}, "
          f"binary {args.bin}")
    print(f"{'backend':<10} {'window s':>9} {'resyncs':>8} {'skipped':>8} {'writes':>7} "
          f"{'CPU-s':>8} {'CPU-s/hour':>11} {'% core':>7}")
    for backend, elapsed, cpu, writes, skipped in rows:
        per_hour = cpu * 3600 / elapsed
        print(f"{backend:<10} {elapsed:>9.0f} {elapsed / interval:>8.0f} {skipped:>8} {writes:>7} "
              f"{cpu:>8.2f} {per_hour:>11.1f} {100 * cpu / elapsed:>7.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
