#!/usr/bin/env python3
"""Side-by-side benchmark: ipsetmgr's BPF backend against `bpftool batch file`.

In one run on one machine, the variants alternating round by round (so a
slow moment of the machine hits them alike); each figure is the median of
--repeat rounds. A ratio below 1 means ipsetmgr is faster.

  * new set: a new set of N IPv4 addresses (hash:ip, default 1M).
    ours: `ipsetmgr --backend bpf --bpf-path DIR apply -f policy.yaml
    --netns X`, end to end (reading and parsing the YAML, validation, the
    listing of the pins, a fresh trie filled, the outer map, the pin).
    bpftool: `bpftool batch file F`, where F creates an equivalent pinned
    LPM trie (same key layout, value size, flags and max_entries;
    docs/bpf.md, "Map layout") and then holds one `map update` per member,
    the key written as the kernel wants it: the prefix length 32 in host
    byte order, then the address bytes.
  * change: 10 members of the existing 1M set replaced, in process
    (examples/delta.rs --backend bpf: the manager's diff and the kernel
    write once the new policy is compiled, as in `ipsetmgr run` and the
    agent), and the resync of the set (a dump of the trie, diffed).

Both write into a bpffs of the run's own, mounted in a temporary directory
(the host's /sys/fs/bpf is not touched). Needs root, bpftool and release
builds: `cargo build --release --bin ipsetmgr --example delta`.
"""
import argparse
import ipaddress
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/ipsetmgr")
DELTA = os.path.join(ROOT, "target/release/examples/delta")
CHANGES = 10
POLICY = "bpfbench"
TRIE = "bpftool-trie"
# include/uapi/linux/bpf.h: BPF_F_NO_PREALLOC, which an LPM trie requires.
NO_PREALLOC = 1


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)


def timed(cmd):
    start = time.perf_counter()
    run(cmd)
    return time.perf_counter() - start


def members(n):
    base = int(ipaddress.IPv4Address("10.0.0.0"))
    return [str(ipaddress.IPv4Address(base + i)) for i in range(n)]


def write_inputs(d, n):
    """The YAML policy and the bpftool batch file of the same n members."""
    ms = members(n)
    max_elem = n + 2 * CHANGES
    policy = os.path.join(d, "policy.yaml")
    with open(policy, "w") as f:
        f.write(f"apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: {POLICY}\n"
                f"spec:\n  type: hash:ip\n  family: IPv4\n  maxElem: {max_elem}\n  members:\n")
        f.writelines(f"  - {m}\n" for m in ms)
    batch = os.path.join(d, "bpftool.batch")
    prefix = " ".join(str(b) for b in (32).to_bytes(4, sys.byteorder))
    return policy, batch, max_elem, prefix, ms


def write_batch(batch, pin, max_elem, prefix, ms):
    with open(batch, "w") as f:
        f.write(f"map create {pin} type lpm_trie key 8 value 1 entries {max_elem} "
                f"name {TRIE.replace('-', '_')[:15]} flags {NO_PREALLOC}\n")
        f.writelines(f"map update pinned {pin} key {prefix} {' '.join(str(b) for b in socket.inet_aton(m))} value 1\n"
                     for m in ms)


class Namespaces:
    """Fresh network namespaces, one per measurement."""

    def __init__(self):
        self.n = 0

    def fresh(self):
        self.n += 1
        name = f"ipsetmgr-bpfbench-{os.getpid()}-{self.n}"
        run(["ip", "netns", "add", name])
        return name

    @staticmethod
    def drop(name):
        subprocess.run(["ip", "netns", "del", name], check=False)


def median_rounds(repeat, variants):
    """variants: {label: fn() -> seconds}; alternated, rotated each round."""
    times = {k: [] for k in variants}
    labels = list(variants)
    for r in range(repeat):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            times[label].append(variants[label]())
    return {k: statistics.median(v) for k, v in times.items()}, times


def entries_in(dump_cmd):
    out = subprocess.run(dump_cmd, check=True, capture_output=True, text=True).stdout
    return len(json.loads(out))


def check(who, got, want):
    if got != want:
        sys.exit(f"{who} wrote {got} entries, not {want}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for b in (BIN, DELTA):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} missing: cargo build --release --bin ipsetmgr --example delta")
    nss = Namespaces()
    with tempfile.TemporaryDirectory(prefix="ipsetmgr-bpfbench-") as d:
        fs = os.path.join(d, "bpffs")
        os.mkdir(fs)
        run(["mount", "-t", "bpf", "bpf", fs])
        try:
            policy, batch, max_elem, prefix, ms = write_inputs(d, args.members)
            trie_pin = os.path.join(fs, TRIE)
            write_batch(batch, trie_pin, max_elem, prefix, ms)
            ours_pin = os.path.join(fs, "ipsetmgr", f"ipm4-{POLICY}")

            def ours():
                ns = nss.fresh()
                try:
                    return timed([BIN, "--netns", ns, "--backend", "bpf", "--bpf-path", fs,
                                  "apply", "-f", policy])
                finally:
                    nss.drop(ns)

            def bpftool():
                return timed(["bpftool", "batch", "file", batch])

            # A first, untimed round of each, checked: both wrote every member.
            ours()
            slot = json.loads(subprocess.run(["bpftool", "-j", "map", "lookup", "pinned", ours_pin,
                                              "key", "0", "0", "0", "0"], check=True,
                                             capture_output=True, text=True).stdout)
            inner = int.from_bytes(bytes(int(b, 16) for b in slot["value"]), sys.byteorder)
            check("ipsetmgr", entries_in(["bpftool", "-j", "map", "dump", "id", str(inner)]), len(ms))
            os.unlink(ours_pin)
            bpftool()
            check("bpftool", entries_in(["bpftool", "-j", "map", "dump", "pinned", trie_pin]), len(ms))
            os.unlink(trie_pin)

            def ours_round():
                t = ours()
                os.unlink(ours_pin)
                return t

            def bpftool_round():
                t = bpftool()
                os.unlink(trie_pin)
                return t

            med, all_times = median_rounds(args.repeat, {"ours": ours_round, "bpftool": bpftool_round})
            n = f"{args.members:,}"
            print(f"new hash:ip IPv4 set of {n} members, median of {args.repeat} rounds:")
            print(f"  bpftool batch file (create + {n} map update)  {med['bpftool']:8.3f} s  "
                  f"rounds {', '.join(f'{t:.3f}' for t in all_times['bpftool'])}")
            print(f"  ipsetmgr --backend bpf apply -f policy.yaml     {med['ours']:8.3f} s  "
                  f"rounds {', '.join(f'{t:.3f}' for t in all_times['ours'])}")
            print(f"  ratio ours/bpftool                              {med['ours'] / med['bpftool']:8.2f}")

            # The in-process change and resync.
            rows = []
            for _ in range(args.repeat):
                ns = nss.fresh()
                try:
                    out = subprocess.run([DELTA, "--backend", "bpf", "--bpf-path", fs, "--netns", ns,
                                          "--members", str(args.members), "--changes", str(CHANGES)],
                                         check=True, capture_output=True, text=True).stdout
                finally:
                    nss.drop(ns)
                rows.append(dict(kv.split("=", 1) for kv in out.split()))
            med_of = lambda k: statistics.median(float(r[k]) for r in rows)
            print(f"change of {CHANGES} members in the {n}-member set (examples/delta.rs, in process), "
                  f"median of {args.repeat}:")
            print(f"  diff {med_of('diff_ms'):.3f} ms, kernel write {med_of('update_ms'):.3f} ms, "
                  f"resync {med_of('resync_ms'):.1f} ms, peak RSS {med_of('peak_rss_mb'):.0f} MB")
        finally:
            subprocess.run(["umount", fs], check=False)


if __name__ == "__main__":
    main()
