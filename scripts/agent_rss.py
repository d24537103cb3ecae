#!/usr/bin/env python3
"""One real agent's memory with a million members from 512 slices, against a
real API server (what benches/agent_memory.rs measures in process, here with
the client side included: watch decoding, buffers, the list of the slices).

Starts `ipsetmgr-envtest`, applies the CRDs, a Node and a policy, the slices
`ipsetmgr slice` cuts from MEMBERS addresses, and one `ipsetmgr agent` whose
kernel side is a fresh network namespace (netlink); waits until its node
state reports the policy synced with every member, lets it settle, and prints
VmRSS and VmHWM. Needs root, `cargo build --release`, kubectl and the envtest
binaries.

    sudo scripts/agent_rss.py [--members 1000000] [--slices-after-start]

By default the slices exist before the agent starts (its initial list reads
them all); with --slices-after-start they are applied while it runs (each
one a watch event).
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target/release/ipsetmgr"
ENVTEST = REPO / "target/release/ipsetmgr-envtest"


def kubectl(kc, *args, input=None):
    out = subprocess.run(["kubectl", "--kubeconfig", kc, *args], input=input,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {out.stderr}")
    return out.stdout


def status_mib(pid, field):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=1_000_000)
    ap.add_argument("--slices-after-start", action="store_true")
    args = ap.parse_args()
    n = args.members
    procs = []
    netns = "ipsetmgr-rss"
    with tempfile.TemporaryDirectory(prefix="ipsetmgr-rss-") as d:
        work = Path(d)
        kc = str(work / "kubeconfig")
        try:
            envtest = subprocess.Popen([ENVTEST, "--kubeconfig", kc], stdout=subprocess.PIPE, text=True)
            procs.append(envtest)
            if "ready" not in envtest.stdout.readline():
                raise SystemExit("envtest did not start")
            kubectl(kc, "apply", "--server-side", "-f", "-",
                    input=subprocess.run([BIN, "crd"], capture_output=True, text=True, check=True).stdout)
            for crd in ["ipsetpolicies", "ipsetmemberslices", "ipsetnodestates"]:
                kubectl(kc, "wait", "--for=condition=Established", f"crd/{crd}.ipsetmgr.io", "--timeout=60s")
            kubectl(kc, "apply", "--server-side", "-f", "-", input=json.dumps(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "rss-node"}}))
            members = work / "members.txt"
            with open(members, "w") as f:
                for i in range(n):
                    v = (10 << 24) + i
                    f.write(f"{v >> 24}.{(v >> 16) & 255}.{(v >> 8) & 255}.{v & 255}\n")
            kubectl(kc, "apply", "--server-side", "-f", "-", input=json.dumps({
                "apiVersion": "ipsetmgr.io/v1alpha1", "kind": "IPSetPolicy", "metadata": {"name": "big"},
                "spec": {"type": "hash:ip", "maxElem": 2 * n}}))
            sliced = subprocess.run([BIN, "slice", "--policy", "big", "--type", "hash:ip",
                                     "--output-format", "json", "-f", str(members)],
                                    capture_output=True, text=True, check=True).stdout
            count = len(json.loads(sliced)["items"])
            if not args.slices_after_start:
                kubectl(kc, "apply", "--server-side", "-f", "-", input=sliced)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
            log = open(work / "agent.log", "w")
            agent = subprocess.Popen([BIN, "--netns", netns, "agent", "--node-name", "rss-node",
                                      "--kubeconfig", kc, "--listen", "127.0.0.1:0",
                                      "--health-listen", "127.0.0.1:0"], stdout=log, stderr=log)
            procs.append(agent)
            start = time.time()
            if args.slices_after_start:
                time.sleep(2)
                kubectl(kc, "apply", "--server-side", "-f", "-", input=sliced)
            while True:
                out = subprocess.run(["kubectl", "--kubeconfig", kc, "get", "ipsns", "rss-node", "-o", "json"],
                                     capture_output=True, text=True)
                if out.returncode == 0:
                    st = json.loads(out.stdout).get("status", {})
                    e = [p for p in st.get("policies", []) if p["name"] == "big"]
                    if e and e[0]["synced"] and e[0]["members"] == n:
                        break
                if time.time() - start > 300:
                    raise SystemExit("the agent did not sync within 300 s")
                time.sleep(0.5)
            took = time.time() - start
            time.sleep(10)
            rss, hwm = status_mib(agent.pid, "VmRSS"), status_mib(agent.pid, "VmHWM")
            print(json.dumps({"members": n, "slices": count,
                              "slices_after_start": args.slices_after_start, "synced_s": round(took, 1),
                              "rss_mib": round(rss, 1), "peak_mib": round(hwm, 1)}))
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)


if __name__ == "__main__":
    main()
