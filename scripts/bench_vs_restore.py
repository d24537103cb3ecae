#!/usr/bin/env python3
"""Side-by-side benchmark: ipsetmgr against raw `ipset restore` / `ipset save`.

Everything is measured in one run on one machine, each measurement in a
fresh network namespace, the variants of a case alternating round by round
(so a slow moment of the machine hits them alike); each figure is the median
of --repeat rounds. Ratios below 1 mean ipsetmgr is faster.

  * new set: a new N-member set, `ipset restore` of the equivalent script
    against `ipsetmgr apply` of the same members as a YAML policy, a JSON
    policy, and a plain member list (one member per line, FireHOL style,
    given with `--members POLICY=FILE`): hash:ip IPv4 at 100k and 1M,
    hash:net IPv6 at 1M. End to end: reading and parsing the file,
    validation, the kernel listing, the writes.
  * change: 10 members of an existing set replaced, `ipsetmgr apply` of the
    changed file (wall time, reading the file included), and the in-process
    part (examples/delta.rs: the manager's diff and the kernel write once the
    new policy is compiled, as in `ipsetmgr run` and the agent), at 100k and
    1M.
  * resync: reading a 1M-member set back (IPv4 hash:ip and IPv6 hash:net)
    and diffing it with the desired members (examples/delta.rs) against
    `ipset save` of the same set, and
    the floor under both: the kernel's own dump of the set to a receiver
    that reads the datagrams and decodes nothing (--kernel-dump, run in the
    set's namespace by this script).
  * memory: peak and steady resident memory of `ipsetmgr run` holding a
    1M-member set from YAML and from a plain list (a `membersFrom` file).
  * nftables (--nft-backends nft,nft-cli; on by default): the same new sets
    with `ipsetmgr --backend nft apply` of the YAML policy against `nft -f`
    of the equivalent ruleset file (a table with one named set holding the
    elements); the 10-member change; and the resync of the biggest set
    (examples/delta.rs --backend nft) against `nft list set` of it.
Needs root, the ipset and the nft binaries.
"""
import argparse
import ipaddress
import json
import os
import socket
import struct
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/ipsetmgr")
DELTA = os.path.join(ROOT, "target/release/examples/delta")
CHANGES = 10


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)


def timed(cmd):
    start = time.perf_counter()
    run(cmd)
    return time.perf_counter() - start


class Namespaces:
    """Fresh network namespaces, one per measurement."""

    def __init__(self):
        self.n = 0

    def fresh(self):
        self.n += 1
        name = f"ipsetmgr-bench-{os.getpid()}-{self.n}"
        run(["ip", "netns", "add", name])
        return name

    @staticmethod
    def drop(name):
        subprocess.run(["ip", "netns", "del", name], check=False)


def in_ns(ns):
    return ["ip", "netns", "exec", ns]


def members_v4(n):
    base = int(ipaddress.IPv4Address("10.0.0.0"))
    return [str(ipaddress.IPv4Address(base + i)) for i in range(n)]


def members_v6_nets(n):
    base = int(ipaddress.IPv6Address("2001:db8::"))
    return [f"{ipaddress.IPv6Address(base + (i << 64))}/64" for i in range(n)]


def changed(members):
    """The same list with its first CHANGES members replaced."""
    if ":" in members[0]:
        fresh = [f"2001:db8:ffff:{i:x}::/64" for i in range(CHANGES)]
    else:
        fresh = [f"192.0.2.{i}" for i in range(CHANGES)]
    return fresh + members[CHANGES:]


class Inputs:
    """One policy's members written as YAML, JSON, a plain list and a
    restore script."""

    def __init__(self, d, name, set_type, family, members, suffix=""):
        self.name, self.set_type, self.family = name, set_type, family
        stem = os.path.join(d, name + suffix)
        self.max_elem = len(members) + 2 * CHANGES
        spec = {"type": set_type, "family": family, "maxElem": self.max_elem}
        head = (f"apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: {name}\n"
                f"spec:\n  type: {set_type}\n  family: {family}\n  maxElem: {self.max_elem}\n")
        self.yaml = stem + ".yaml"
        with open(self.yaml, "w") as f:
            f.write(head + "  members:\n")
            f.writelines(f"  - {m}\n" for m in members)
        self.json = stem + ".json"
        with open(self.json, "w") as f:
            json.dump({"apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy", "metadata": {"name": name},
                       "spec": {**spec, "members": members}}, f)
        # The plain list, and a policy without members for `--members`.
        self.text = stem + ".txt"
        with open(self.text, "w") as f:
            f.write(f"# {name}: {len(members)} members, one per line (FireHOL netset style)\n")
            f.writelines(f"{m}\n" for m in members)
        self.bare = stem + ".bare.yaml"
        with open(self.bare, "w") as f:
            f.write(head)
        self.restore = stem + ".restore"
        kfam = "inet" if family == "IPv4" else "inet6"
        with open(self.restore, "w") as f:
            f.write(f"create raw-{name} {set_type} family {kfam} maxelem {self.max_elem}\n")
            f.writelines(f"add raw-{name} {m}\n" for m in members)
        self.kernel_name = f"ipm{'4' if family == 'IPv4' else '6'}-{name}"
        # The same set as an nft ruleset file, for `nft -f`.
        self.nft = stem + ".nft"
        key = "ipv4_addr" if family == "IPv4" else "ipv6_addr"
        flags = "flags interval; " if set_type == "hash:net" else ""
        with open(self.nft, "w") as f:
            f.write(f"table inet bench {{\n  set raw-{name} {{\n    type {key}; {flags}size {self.max_elem};\n"
                    "    elements = {\n")
            f.writelines(f"      {m},\n" for m in members)
            f.write("    }\n  }\n}\n")

    def apply_cmd(self, ns, fmt, backend):
        base = [BIN, "--netns", ns, "--backend", backend, "apply"]
        if fmt == "text":
            return base + ["-f", self.bare, "--members", f"{self.name}={self.text}"]
        return base + ["-f", getattr(self, fmt)]


def median_rounds(repeat, variants):
    """variants: {label: fn() -> seconds}; alternated, rotated each round."""
    times = {k: [] for k in variants}
    labels = list(variants)
    for r in range(repeat):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            times[label].append(variants[label]())
    return {k: statistics.median(v) for k, v in times.items()}


def new_set_rows(nss, inp, formats, backends, repeat):
    def restore():
        ns = nss.fresh()
        try:
            return timed(in_ns(ns) + ["ipset", "restore", "-f", inp.restore])
        finally:
            nss.drop(ns)

    def ipsetmgr(fmt, backend):
        def go():
            ns = nss.fresh()
            try:
                return timed(inp.apply_cmd(ns, fmt, backend))
            finally:
                nss.drop(ns)
        return go

    variants = {"restore": restore}
    for b in backends:
        for fmt in formats:
            variants[f"{fmt} ({b})"] = ipsetmgr(fmt, b)
    med = median_rounds(repeat, variants)
    what = f"new {inp.set_type} {inp.family} {inp.max_elem - 2 * CHANGES:,}"
    rows = [(f"{what}: ipset restore", med.pop("restore"), None)]
    raw = rows[0][1]
    rows += [(f"{what}: ipsetmgr apply {k}", t, t / raw) for k, t in med.items()]
    return rows


def nft_new_set_rows(nss, inp, backends, repeat):
    """A new set: `nft -f` of the ruleset file against `ipsetmgr apply` of
    the YAML policy with each nft backend."""
    def nft_f():
        ns = nss.fresh()
        try:
            return timed(in_ns(ns) + ["nft", "-f", inp.nft])
        finally:
            nss.drop(ns)

    def ipsetmgr(backend):
        def go():
            ns = nss.fresh()
            try:
                return timed(inp.apply_cmd(ns, "yaml", backend))
            finally:
                nss.drop(ns)
        return go

    variants = {"nft -f": nft_f}
    for b in backends:
        variants[f"yaml ({b})"] = ipsetmgr(b)
    med = median_rounds(repeat, variants)
    what = f"new nft set from {inp.set_type} {inp.family} {inp.max_elem - 2 * CHANGES:,}"
    raw = med.pop("nft -f")
    return [(f"{what}: nft -f", raw, None)] + [
        (f"{what}: ipsetmgr apply {k}", t, t / raw) for k, t in med.items()]


def nft_list_time(nss, inp, repeat):
    """Median seconds of `nft list set` of the set `nft -f` made."""
    times = []
    for _ in range(repeat):
        ns = nss.fresh()
        try:
            run(in_ns(ns) + ["nft", "-f", inp.nft])
            times.append(timed(in_ns(ns) + ["nft", "list", "set", "inet", "bench", f"raw-{inp.name}"]))
        finally:
            nss.drop(ns)
    return statistics.median(times)


def change_rows(nss, base, after, formats, backend, repeat):
    def change(fmt):
        def go():
            ns = nss.fresh()
            try:
                run(base.apply_cmd(ns, fmt, backend))
                return timed(after.apply_cmd(ns, fmt, backend))
            finally:
                nss.drop(ns)
        return go

    med = median_rounds(repeat, {fmt: change(fmt) for fmt in formats})
    n = base.max_elem - 2 * CHANGES
    return [(f"{CHANGES}-member change of {n:,}: ipsetmgr apply {fmt} ({backend}), wall", t, None)
            for fmt, t in med.items()]


def delta_stats(nss, n, backend, repeat, ipv6=False):
    """Median diff, update and resync milliseconds from examples/delta.rs."""
    samples = []
    for _ in range(repeat):
        ns = nss.fresh()
        try:
            cmd = [DELTA, "--netns", ns, "--backend", backend, "--members", str(n), "--changes", str(CHANGES)]
            out = subprocess.run(cmd + (["--ipv6"] if ipv6 else []),
                                 check=True, capture_output=True, text=True).stdout
        finally:
            nss.drop(ns)
        samples.append(dict(kv.split("=", 1) for kv in out.split()))
    return {k: statistics.median(float(s[k]) for s in samples) for k in ("diff_ms", "update_ms", "resync_ms")}


def kernel_dump(set_name):
    """Seconds the kernel takes to dump `set_name` (ipset LIST over
    netlink) to a receiver that decodes nothing: what any reader of the set
    pays. Prints them; runs inside the set's namespace."""
    def attr(kind, data):
        size = 4 + len(data)
        return struct.pack("HH", size, kind) + data + b"\0" * (-size % 4)
    # nfgenmsg (AF_UNSPEC, version 0, res_id 0), IPSET_ATTR_PROTOCOL 7,
    # IPSET_ATTR_SETNAME.
    body = struct.pack("BBH", 0, 0, 0) + attr(1, bytes([7])) + attr(2, set_name.encode() + b"\0")
    ipset_list = (6 << 8) | 7  # NFNL_SUBSYS_IPSET, IPSET_CMD_LIST
    request = struct.pack("IHHII", 16 + len(body), ipset_list, 0x301, 1, 0) + body  # REQUEST|DUMP
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
    sock.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE, as the netlink backend
    sock.bind((0, 0))
    buf = bytearray(256 << 10)
    start = time.perf_counter()
    sock.send(request)
    done = False
    while not done:
        n = sock.recv_into(buf)
        off = 0
        while off < n:
            size, kind = struct.unpack_from("IH", buf, off)
            if kind == 2 and struct.unpack_from("i", buf, off + 16)[0] != 0:  # NLMSG_ERROR
                sys.exit(f"dump of {set_name} failed: errno {-struct.unpack_from('i', buf, off + 16)[0]}")
            done = done or kind in (2, 3)  # NLMSG_ERROR (ack) or NLMSG_DONE
            off += (size + 3) & ~3
    print(f"{time.perf_counter() - start:.6f}")


def save_times(nss, inp, repeat):
    """Median seconds of `ipset save` and of the bare kernel dump of one set,
    alternating in the same namespace."""
    saves, dumps = [], []
    for r in range(repeat):
        ns = nss.fresh()
        try:
            run(in_ns(ns) + ["ipset", "restore", "-f", inp.restore])
            name = f"raw-{inp.name}"
            dump = in_ns(ns) + [sys.executable, os.path.abspath(__file__), "--kernel-dump", name]
            for which in (["save", "dump"] if r % 2 == 0 else ["dump", "save"]):
                if which == "save":
                    saves.append(timed(in_ns(ns) + ["ipset", "save", name]))
                else:
                    out = subprocess.run(dump, check=True, capture_output=True, text=True).stdout
                    dumps.append(float(out))
        finally:
            nss.drop(ns)
    return statistics.median(saves), statistics.median(dumps)


def rss_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def run_memory(nss, d, inp, fmt, backend, settle):
    """Peak and steady RSS (MiB) of `ipsetmgr run` holding the set."""
    pdir = tempfile.mkdtemp(dir=d)
    if fmt == "yaml":
        os.symlink(inp.yaml, os.path.join(pdir, "policy.yaml"))
    else:
        with open(inp.bare) as f:
            policy = f.read()
        with open(os.path.join(pdir, "policy.yaml"), "w") as f:
            f.write(policy + f"  membersFrom:\n  - file:\n      path: {inp.text}\n")
    ns = nss.fresh()
    proc = subprocess.Popen([BIN, "--netns", ns, "--backend", backend, "run", "--policy-dir", pdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        want = inp.max_elem - 2 * CHANGES
        deadline = time.time() + 120
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"ipsetmgr run exited: {proc.stderr.read()[-2000:]}")
            out = subprocess.run(in_ns(ns) + ["ipset", "list", "-t", inp.kernel_name],
                                 capture_output=True, text=True).stdout
            if f"Number of entries: {want}" in out:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("the set never reached its size")
        time.sleep(settle)
        return rss_kb(proc.pid, "VmHWM") / 1024, rss_kb(proc.pid, "VmRSS") / 1024
    finally:
        proc.terminate()
        proc.wait()
        nss.drop(ns)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000", help="hash:ip IPv4 sizes")
    ap.add_argument("--v6", type=int, default=1_000_000, help="hash:net IPv6 size (0: skip)")
    ap.add_argument("--formats", default="yaml,json,text")
    ap.add_argument("--backends", default="netlink", help="netlink and/or cli")
    ap.add_argument("--nft-backends", default="nft", help="nft and/or nft-cli (empty: skip nftables)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds before reading steady RSS")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--kernel-dump", metavar="SET", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.kernel_dump:
        return kernel_dump(args.kernel_dump)
    if os.geteuid() != 0:
        sys.exit("needs root (ipsets live in the kernel); run with sudo")
    run(["cargo", "build", "--release", "--quiet", "--bin", "ipsetmgr", "--example", "delta"], cwd=ROOT)
    formats = [f for f in args.formats.split(",") if f]
    backends = [b for b in args.backends.split(",") if b]
    nft_backends = [b for b in args.nft_backends.split(",") if b]
    nss = Namespaces()
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as d:
        sizes = [int(n) for n in args.sizes.split(",") if n]
        cases = [(f"v4-{n}", "hash:ip", "IPv4", members_v4(n)) for n in sizes]
        if args.v6:
            cases.append((f"v6net-{args.v6}", "hash:net", "IPv6", members_v6_nets(args.v6)))
        for name, set_type, family, members in cases:
            inp = Inputs(d, name, set_type, family, members)
            rows += new_set_rows(nss, inp, formats, backends, args.repeat)
            what = f"{len(members):,} {set_type}{' IPv6' if family == 'IPv6' else ''}"
            ipv6 = family == "IPv6"
            if set_type == "hash:ip":
                after = Inputs(d, name, set_type, family, changed(members), suffix=".changed")
                rows += change_rows(nss, inp, after, formats, backends[0], args.repeat)
            stats = delta_stats(nss, len(members), backends[0], args.repeat, ipv6)
            notes.append(f"{what}: diff {stats['diff_ms']:.2f} ms, kernel write "
                         f"{stats['update_ms']:.3f} ms, resync {stats['resync_ms']:.0f} ms")
            biggest_v4 = set_type == "hash:ip" and len(members) == max(sizes, default=0)
            if biggest_v4 or ipv6:
                save, dump = save_times(nss, inp, args.repeat)
                rows.append((f"read back {what}: ipset save", save, None))
                rows.append((f"read back {what}: the kernel's dump alone (decoding nothing)",
                             dump, dump / save))
                rows.append((f"resync {what}: read back + diff (in process)",
                             stats["resync_ms"] / 1e3, stats["resync_ms"] / 1e3 / save))
            if nft_backends:
                rows += nft_new_set_rows(nss, inp, nft_backends, args.repeat)
                if set_type == "hash:ip":
                    rows += change_rows(nss, inp, after, ["yaml"], nft_backends[0], args.repeat)
                if biggest_v4 or ipv6:
                    nstats = delta_stats(nss, len(members), nft_backends[0], args.repeat, ipv6)
                    notes.append(f"{what} as an nft set ({nft_backends[0]}): diff {nstats['diff_ms']:.2f} ms, "
                                 f"kernel write {nstats['update_ms']:.3f} ms, resync {nstats['resync_ms']:.0f} ms")
                    listed = nft_list_time(nss, inp, args.repeat)
                    rows.append((f"read back {what}: nft list set", listed, None))
                    rows.append((f"resync {what} as an nft set: read back + diff (in process)",
                                 nstats["resync_ms"] / 1e3, nstats["resync_ms"] / 1e3 / listed))
            if biggest_v4 and not args.skip_memory:
                for fmt in [f for f in ("yaml", "text") if f in formats]:
                    peak, steady = run_memory(nss, d, inp, fmt, backends[0], args.settle)
                    notes.append(f"ipsetmgr run, {len(members):,} members from {fmt}: "
                                 f"peak RSS {peak:.1f} MiB, steady {steady:.1f} MiB")
    print(f"{'case':<78} {'seconds':>9} {'ratio':>7}")
    for label, t, ratio in rows:
        print(f"{label:<78} {t:>9.3f} {'' if ratio is None else f'{ratio:.2f}':>7}")
    print(f"(median of {args.repeat}; ratio = ipsetmgr / ipset, or / nft for the nft rows)")
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
