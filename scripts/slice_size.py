#!/usr/bin/env python3
"""What the slice size costs: one big list cut at several `--max-members`.

For each size, on a real API server (crates/envtest's `ipsetmgr-envtest`),
the list of MEMBERS addresses is cut by `ipsetmgr slice` and applied with
client-side `kubectl apply`, as the README tells users to; then 10 members
change (5 out, 5 in), the list is cut again and applied again. Printed per
size, side by side:

- slices: how many objects the list is;
- stored: the objects' JSON as the API server serves them (custom
  resources are stored as that JSON in etcd, so this is the etcd size the
  list takes, before etcd's own overhead and history);
- list: the time to list them all in the agent's pages (32 objects a page,
  crates/agent/src/inputs.rs), as an agent does at start;
- change: the objects a 10-member change rewrites and their bytes: each
  goes whole, as a watch event, to every agent, so this is the bytes per
  node per change.

    scripts/slice_size.py --members 1000000 --sizes 500 1000 2000 5000

Needs `cargo build` (ipsetmgr, ipsetmgr-envtest; `--profile` picks the
binaries' directory), kubectl, and the envtest binaries
(scripts/envtest-assets.sh). Results: docs/scaling.md, "Slice size".
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GROUP = "ipsetmgr.io"
POLICY = "big"
PAGE = 32


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def kubectl(kc, *args, input=None):
    out = subprocess.run(["kubectl", "--kubeconfig", kc, *args], input=input,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args[:3])}: {out.stderr.strip()}")
    return out.stdout


def write_list(path, n, drop=0, extra=0):
    """n addresses from 10.0.0.0 (the first `drop` left out), then `extra`
    from 10.250.0.1: a 10-member change is drop=5, extra=5."""
    with open(path, "w") as f:
        for i in range(drop, n):
            v = (10 << 24) + i
            f.write(f"{v >> 24}.{(v >> 16) & 255}.{(v >> 8) & 255}.{v & 255}\n")
        for i in range(extra):
            f.write(f"10.250.0.{i + 1}\n")


def cut(binary, path, max_members):
    out = subprocess.run(
        [binary, "slice", "--policy", POLICY, "--type", "hash:ip", "--max-members",
         str(max_members), "--output-format", "json", "-f", path],
        capture_output=True, text=True, check=True)
    return {o["metadata"]["name"]: o for o in json.loads(out.stdout)["items"]}


def apply_client_side(kc, objects):
    """`kubectl apply -f` of the objects, in files of 50 (as a user's
    `ipsetmgr slice | kubectl apply -f -` would send them, one by one)."""
    items = list(objects)
    for i in range(0, len(items), 50):
        kubectl(kc, "apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": items[i:i + 50]}))


def served(kc, names):
    """The JSON bytes of each named slice as the API server serves it."""
    sizes = {}
    for i in range(0, len(names), 100):
        out = kubectl(kc, "get", "ipsetmemberslices", *names[i:i + 100], "-o", "json")
        for o in json.loads(out)["items"]:
            sizes[o["metadata"]["name"]] = len(json.dumps(o, separators=(",", ":")))
    return sizes


def list_time(kc):
    """Seconds to list every slice of the policy in pages of PAGE."""
    start = time.monotonic()
    cont = ""
    count = 0
    while True:
        url = (f"/apis/{GROUP}/v1alpha1/ipsetmemberslices?labelSelector={GROUP}%2Fpolicy%3D{POLICY}"
               f"&limit={PAGE}" + (f"&continue={cont}" if cont else ""))
        page = json.loads(kubectl(kc, "get", "--raw", url))
        count += len(page["items"])
        cont = page["metadata"].get("continue", "")
        if not cont:
            return time.monotonic() - start, count


def measure(kc, binary, work, members, size):
    before = cut(binary, work / "list.txt", size)
    after = cut(binary, work / "changed.txt", size)
    apply_client_side(kc, before.values())
    stored = served(kc, sorted(before))
    took, listed = list_time(kc)
    assert listed == len(before), (listed, len(before))
    changed = sorted(n for n in after if before.get(n, {}).get("spec") != after[n].get("spec"))
    gone = sorted(set(before) - set(after))
    apply_client_side(kc, (after[n] for n in changed))
    if gone:
        kubectl(kc, "delete", "ipsetmemberslices", *gone)
    change_bytes = sum(served(kc, changed).values()) if changed else 0
    kubectl(kc, "delete", "ipsetmemberslices", "-l", f"{GROUP}/policy={POLICY}", "--wait=false")
    return {
        "size": size,
        "slices": len(before),
        "stored_mb": sum(stored.values()) / 1e6,
        "list_s": took,
        "changed": len(changed) + len(gone),
        "change_kb": change_bytes / 1e3,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1_000_000)
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 2000, 5000])
    ap.add_argument("--profile", default="debug", help="target/<profile>/ holds the binaries")
    args = ap.parse_args()
    binary = str(REPO / "target" / args.profile / "ipsetmgr")
    envtest_bin = str(REPO / "target" / args.profile / "ipsetmgr-envtest")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        kc = str(work / "kubeconfig")
        write_list(work / "list.txt", args.members)
        write_list(work / "changed.txt", args.members, drop=5, extra=5)
        envtest = subprocess.Popen([envtest_bin, "--kubeconfig", kc], stdout=subprocess.PIPE,
                                   text=True, env={**os.environ})
        try:
            line = envtest.stdout.readline()
            if not re.search(r"kube-apiserver pid (\d+)", line):
                raise SystemExit(f"envtest did not start: {line}")
            crds = subprocess.run([binary, "crd"], capture_output=True, text=True, check=True).stdout
            kubectl(kc, "apply", "--server-side", "-f", "-", input=crds)
            kubectl(kc, "wait", "--for=condition=Established",
                    f"crd/ipsetmemberslices.{GROUP}", "--timeout=60s")
            rows = []
            for size in args.sizes:
                say(f"--max-members {size} ...")
                rows.append(measure(kc, binary, work, args.members, size))
                say(f"  {rows[-1]}")
        finally:
            envtest.terminate()
            envtest.wait()
    print(f"\n{args.members} members, a 10-member change (5 out, 5 in), client-side kubectl apply\n")
    print("| --max-members | slices | stored (MB) | list in pages of 32 (s) | slices changed | bytes per node per change (kB) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['size']} | {r['slices']} | {r['stored_mb']:.1f} | {r['list_s']:.2f} "
              f"| {r['changed']} | {r['change_kb']:.0f} |")


if __name__ == "__main__":
    main()
