#!/usr/bin/env python3
"""Side-by-side benchmark: `ipsetmgr apply` vs raw `ipset restore`.

In one run on one machine, inside a throwaway network namespace, it times:
  * a new N-member hash:ip set (N = 100k and 1M by default): raw `ipset restore`
    of the equivalent script vs `ipsetmgr apply -f policy.yaml` (and the same
    policy as JSON, which parses ~20x faster) per backend, end to end
    (parsing, validation, kernel listing, writing);
  * a new 1M-member IPv6 hash:net set, the same way;
  * listing a 1M-member set: `ipset save` vs `ipsetmgr sets` (which reads it);
  * a 10-member change to the 1M-member set through a running manager
    (examples/delta.rs), which is what `ipsetmgr run` and the agent do.
Each figure is the best of --repeat runs. Ratios > 1 mean ipsetmgr is slower.
Needs root and the ipset binary.
"""
import argparse
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target/release/ipsetmgr")
DELTA = os.path.join(ROOT, "target/release/examples/delta")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)


def timed(cmd, stdin=None):
    start = time.perf_counter()
    run(cmd, stdin=stdin)
    return time.perf_counter() - start


def best(n, fn, cleanup):
    times = []
    for _ in range(n):
        times.append(fn())
        cleanup()
    return min(times)


def members_v4(n):
    base = int(ipaddress.IPv4Address("10.0.0.0"))
    return [str(ipaddress.IPv4Address(base + i)) for i in range(n)]


def members_v6_nets(n):
    base = int(ipaddress.IPv6Address("2001:db8::"))
    return [f"{ipaddress.IPv6Address(base + (i << 64))}/64" for i in range(n)]


def write_inputs(d, name, set_type, family, members):
    policy = os.path.join(d, f"{name}.yaml")
    script = os.path.join(d, f"{name}.restore")
    with open(policy, "w") as f:
        f.write(f"apiVersion: ipsetmgr.io/v1alpha1\nkind: IPSetPolicy\nmetadata:\n  name: {name}\n"
                f"spec:\n  type: {set_type}\n  family: {family}\n  maxElem: {len(members) + 10}\n  members:\n")
        f.writelines(f"  - {m}\n" for m in members)
    with open(os.path.join(d, f"{name}.json"), "w") as f:
        json.dump({"apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy", "metadata": {"name": name},
                   "spec": {"type": set_type, "family": family, "maxElem": len(members) + 10, "members": members}}, f)
    kfam = "inet" if family == "IPv4" else "inet6"
    letter = "4" if family == "IPv4" else "6"
    with open(script, "w") as f:
        f.write(f"create raw-{name} {set_type} family {kfam} maxelem {len(members) + 10}\n")
        f.writelines(f"add raw-{name} {m}\n" for m in members)
    return policy, script, f"ipm{letter}-{name}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--backends", default="cli,netlink")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (ipsets live in the kernel); run with sudo")
    run(["cargo", "build", "--release", "--quiet", "--bin", "ipsetmgr", "--example", "delta"], cwd=ROOT)
    backends = [b for b in args.backends.split(",") if b]
    ns = f"ipsetmgr-bench-{os.getpid()}"
    run(["ip", "netns", "add", ns])
    nsx = ["ip", "netns", "exec", ns]
    rows = []
    try:
        with tempfile.TemporaryDirectory() as d:
            cases = [(f"v4-{n}", "hash:ip", "IPv4", members_v4(int(n))) for n in args.sizes.split(",")]
            cases.append(("v6net-1000000", "hash:net", "IPv6", members_v6_nets(1_000_000)))
            for name, set_type, family, members in cases:
                policy, script, kname = write_inputs(d, name, set_type, family, members)
                raw = best(args.repeat, lambda: timed(nsx + ["ipset", "restore", "-f", script]),
                           lambda: run(nsx + ["ipset", "destroy", f"raw-{name}"]))
                rows.append((f"new {set_type} {family} {len(members)}: ipset restore", raw, None))
                for b in backends:
                    for fmt in ["yaml", "json"]:
                        path = policy[: -len("yaml")] + fmt
                        t = best(args.repeat,
                                 lambda: timed([BIN, "--netns", ns, "--backend", b, "apply", "-f", path]),
                                 lambda: run(nsx + ["ipset", "destroy", kname]))
                        rows.append((f"new {set_type} {family} {len(members)}: ipsetmgr apply {fmt} ({b})", t, t / raw))
            # Listing a 1M-member set.
            policy, script, kname = write_inputs(d, "list", "hash:ip", "IPv4", members_v4(1_000_000))
            run(nsx + ["ipset", "restore", "-f", script])
            run(nsx + ["ipset", "rename", "raw-list", kname])
            save = best(args.repeat, lambda: timed(nsx + ["ipset", "save", kname]), lambda: None)
            rows.append(("list 1M hash:ip: ipset save", save, None))
            for b in backends:
                t = best(args.repeat, lambda: timed([BIN, "--netns", ns, "--backend", b, "sets"]), lambda: None)
                rows.append((f"list 1M hash:ip: ipsetmgr sets ({b})", t, t / save))
            run(nsx + ["ipset", "destroy", kname])
            # A 10-member change to a 1M-member set, manager already running.
            for b in backends:
                out = subprocess.run([DELTA, "--netns", ns, "--backend", b, "--members", "1000000", "--changes", "10"],
                                     check=True, capture_output=True, text=True).stdout
                print(out.strip())
    finally:
        subprocess.run(["ip", "netns", "del", ns])
    print(f"{'case':<62} {'seconds':>9} {'ratio':>7}")
    for label, t, ratio in rows:
        print(f"{label:<62} {t:>9.3f} {'' if ratio is None else f'{ratio:.2f}x':>7}")


if __name__ == "__main__":
    main()
