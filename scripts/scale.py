#!/usr/bin/env python3
"""The control plane at N nodes, measured with hollow agents.

Starts a real API server (crates/envtest's `ipsetmgr-envtest`), the
controller, and `ipsetmgr hollow --nodes N` (N real agents in one process,
the in-memory kernel model as their kernel); applies a policy of MEMBERS
members in IPSetMemberSlices cut by `ipsetmgr slice`, waits until it is Ready
on every node, then makes a 10-member change (5 out, 5 in: only the changed
slices are applied) and prints, side by side:

- watch events and bytes by kind for the change (the API server's
  apiserver_watch_events_total / apiserver_watch_events_sizes), per node;
- writes by resource (apiserver_request_total, write verbs), per node;
- the time from the change to Ready=True at the new revision, and from the
  change's last write to each node's kernel holding it (p50, p99, max over
  the nodes, from their node states' lastSyncTime) and to Ready=True;
- resident memory of the controller, the API server, and the hollow agents
  (per node), and the controller's CPU time.

    scripts/scale.py --nodes 100 1000 --members 100000
    scripts/scale.py --nodes 100 --inline 50000   # a big inline policy instead
    scripts/scale.py --nodes 6 --trickle 30       # the change's slices one by one over 30 s

Needs `cargo build --release` (ipsetmgr, ipsetmgr-envtest), kubectl, and
the envtest binaries (scripts/envtest-assets.sh). Results: docs/scaling.md.
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / "target/release/ipsetmgr"
ENVTEST = REPO / "target/release/ipsetmgr-envtest"
GROUP = "ipsetmgr.io"
WRITES = {"APPLY", "PATCH", "UPDATE", "CREATE", "DELETE", "POST", "PUT"}


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def kubectl(kc, *args, input=None, check=True):
    # An API server saturated by thousands of watchers (at 2,000 hollow
    # nodes on 2 cores) answers a GET with a Timeout now and then: retried,
    # and counted, since that is part of what the run shows.
    for attempt in range(10):
        out = subprocess.run(
            ["kubectl", "--kubeconfig", kc, *args],
            input=input,
            capture_output=True,
            text=True,
        )
        if out.returncode == 0 or "(Timeout)" not in out.stderr:
            break
        print(f"API server timeout ({attempt + 1}): kubectl {args[0]}", file=sys.stderr)
    if check and out.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: {out.stderr}")
    return out.stdout


def rss_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


LINE = re.compile(r'^(\w+)\{([^}]*)\} ([0-9.eE+-]+)$')


def metrics(kc):
    """{(name, frozenset(labels)): value} for the metrics this script reads."""
    out = {}
    for line in kubectl(kc, "get", "--raw", "/metrics").splitlines():
        if not line.startswith(("apiserver_watch_events", "apiserver_request_total")):
            continue
        m = LINE.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        out[(m.group(1), frozenset(labels.items()))] = float(m.group(3))
    return out


def summarize(before, after):
    """Watch events and bytes by kind, writes by resource, for ipsetmgr.io."""
    events, sizes, writes = {}, {}, {}
    for (name, labels), value in after.items():
        delta = value - before.get((name, labels), 0.0)
        if delta == 0:
            continue
        lab = dict(labels)
        if lab.get("group") != GROUP:
            continue
        # `kind` on older servers, `resource` on newer ones.
        kind = lab.get("resource") or lab.get("kind", "?")
        if name == "apiserver_watch_events_total":
            events[kind] = events.get(kind, 0) + delta
        elif name == "apiserver_watch_events_sizes_sum":
            sizes[kind] = sizes.get(kind, 0) + delta
        elif name == "apiserver_request_total" and lab.get("verb") in WRITES:
            res = lab["resource"] + ("/" + lab["subresource"] if lab.get("subresource") else "")
            writes[res] = writes.get(res, 0) + delta
    return events, sizes, writes


def wait(what, check, timeout):
    start = time.time()
    while True:
        got = check()
        if got:
            return time.time() - start
        if time.time() - start > timeout:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def policy_ready_since(kc, name, since):
    p = json.loads(kubectl(kc, "get", "ipsp", name, "-o", "json"))
    for c in p.get("status", {}).get("conditions", []):
        if c["type"] == "Ready" and c["status"] == "True":
            t = time.mktime(time.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            return since is None or t >= int(since)
    return False


def kernel_latencies(kc, name, written):
    """p50, p99 and max over the nodes of the time from the change's last
    write to the node's kernel holding it: the policy's lastSyncTime in
    each node state (when the agent's last write of its sets completed, to
    the millisecond; the hollow agents resync every 10 minutes, so no
    resync moves it in the few seconds this takes)."""
    states = json.loads(kubectl(kc, "get", "ipsns", "-o", "json"))["items"]
    took = []
    for st in states:
        for p in st.get("status", {}).get("policies", []):
            t = p.get("lastSyncTime")
            at = t and datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
            if p["name"] == name and p.get("synced") and at and at >= written:
                took.append(at - written)
    if not took:
        return None
    took.sort()
    pick = lambda q: round(took[min(len(took) - 1, int(q * len(took)))], 3)
    return {"p50": pick(0.5), "p99": pick(0.99), "max": round(took[-1], 3), "nodes": len(took)}


def members_list(path, base, n, drop=0, extra=0):
    base = [int(x) for x in base.split(".")]
    start = (base[0] << 24) | (base[1] << 16)
    with open(path, "w") as f:
        for i in range(drop, n):
            v = start + i
            f.write(f"{v >> 24}.{(v >> 16) & 255}.{(v >> 8) & 255}.{v & 255}\n")
        for i in range(extra):
            f.write(f"10.250.0.{i + 1}\n")


def slices(path, policy):
    out = subprocess.run(
        [BIN, "slice", "--policy", policy, "--type", "hash:ip", "--output-format", "json", "-f", path],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout)["items"]


def apply_list(kc, items):
    kubectl(kc, "apply", "--server-side", "--force-conflicts", "--field-manager", "scale", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def run(n, members, inline, work, trickle=0.0):
    kc = str(work / "kubeconfig")
    procs = []
    try:
        envtest = subprocess.Popen([ENVTEST, "--kubeconfig", kc], stdout=subprocess.PIPE, text=True)
        procs.append(envtest)
        line = envtest.stdout.readline()
        m = re.search(r"kube-apiserver pid (\d+)", line)
        if not m:
            raise SystemExit(f"envtest did not start: {line}")
        apiserver_pid = int(m.group(1))
        kubectl(kc, "apply", "--server-side", "-f", "-", input=subprocess.run(
            [BIN, "crd"], capture_output=True, text=True, check=True).stdout)
        kubectl(kc, "create", "namespace", "ipsetmgr-system")
        for crd in ["ipsetpolicies", "ipsetmemberslices", "ipsetnodestates"]:
            kubectl(kc, "wait", "--for=condition=Established", f"crd/{crd}.{GROUP}", "--timeout=60s")
        logs = open(work / "controller.log", "w")
        controller = subprocess.Popen(
            [BIN, "controller", "--kubeconfig", kc, "--listen", "127.0.0.1:0",
             "--health-listen", "127.0.0.1:0", "--namespace", "ipsetmgr-system", "--identity", "scale"],
            stdout=logs, stderr=logs)
        procs.append(controller)
        hollow_log = open(work / "hollow.log", "w")
        t = time.time()
        # Heartbeats are not caused by a change: far apart here, so that
        # the change's own writes are what is counted (their steady cost is
        # N / interval writes per second, docs/scaling.md).
        hollow = subprocess.Popen([BIN, "hollow", "--nodes", str(n), "--kubeconfig", kc,
                                   "--heartbeat-interval", "30m"],
                                  stdout=hollow_log, stderr=hollow_log)
        procs.append(hollow)

        def states():
            out = kubectl(kc, "get", "ipsns", "-o", "name", check=False)
            return len(out.split()) >= n
        took = wait(f"{n} node states", states, 600 + n)
        say(f"N={n}: {n} hollow agents reported in {took:.1f}s")

        name = "scale"
        list_path = work / "members.txt"
        spec = {"type": "hash:ip", "maxElem": max(2 * members, 65536)}
        if inline:
            members_list(list_path, "10.1", inline)
            spec["members"] = Path(list_path).read_text().split()
        policy = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "IPSetPolicy",
                  "metadata": {"name": name}, "spec": spec}
        apply_list(kc, [policy])
        first = []
        if not inline:
            members_list(list_path, "10.1", members)
            first = slices(list_path, name)
            apply_list(kc, first)
        took = wait("Ready on every node", lambda: policy_ready_since(kc, name, None), 900 + n)
        say(f"N={n}: Ready in {took:.1f}s after the policy")
        time.sleep(15)  # let paced writes and heartbeats of the first apply pass
        before = metrics(kc)
        cpu_before = cpu_seconds(controller.pid)
        # The 10-member change: 5 out, 5 in.
        t0 = time.time()
        if inline:
            members_list(list_path, "10.1", inline, drop=5, extra=5)
            policy["spec"]["members"] = Path(list_path).read_text().split()
            apply_list(kc, [policy])
            changed = 0
        else:
            members_list(list_path, "10.1", members, drop=5, extra=5)
            second = slices(list_path, name)
            old = {s["metadata"]["name"]: s["spec"] for s in first}
            changed_items = [s for s in second if old.get(s["metadata"]["name"]) != s["spec"]]
            changed = len(changed_items)
            if trickle and changed > 1:
                # One object at a time, spread over `trickle` seconds, as a
                # client-side `kubectl apply` of many slices sends them.
                for i, item in enumerate(changed_items):
                    if i:
                        time.sleep(trickle / (changed - 1))
                    written = time.time()
                    apply_list(kc, [item])
            else:
                written = time.time()
                apply_list(kc, changed_items)
        if inline:
            written = t0
        # `written`: when the last changed object's write was sent. Ready
        # may turn True at an earlier revision while a change trickles in:
        # the change is held when every node's kernel holds the last write.
        wait("every node holding the last write",
             lambda: (kernel_latencies(kc, name, written) or {}).get("nodes") == n, 900 + n)
        wait("Ready at the new revision", lambda: policy_ready_since(kc, name, t0), 900 + n)
        # From the change (t0, before its slices were cut) and from its
        # last write; the waits above start later than either.
        ready = time.time() - t0
        ready_after_write = time.time() - written
        kernel = kernel_latencies(kc, name, written)
        time.sleep(15)  # count the paced writes of the change too
        after = metrics(kc)
        events, sizes, writes = summarize(before, after)
        row = {
            "nodes": n,
            "members": inline or members,
            "slices_changed": changed,
            "ready_s": round(ready, 1),
            "ready_after_write_s": round(ready_after_write, 2),
            "kernel_s": kernel,
            "events": events,
            "bytes": sizes,
            "writes": writes,
            "controller_rss_mib": round(rss_mib(controller.pid), 1),
            "controller_cpu_s": round(cpu_seconds(controller.pid) - cpu_before, 2),
            "apiserver_rss_mib": round(rss_mib(apiserver_pid), 1),
            "hollow_rss_mib": round(rss_mib(hollow.pid), 1),
            "hollow_rss_per_node_mib": round(rss_mib(hollow.pid) / n, 2),
        }
        return row
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def latency(k):
    return "-" if not k else f"{k['p50']} / {k['p99']} / {k['max']} s"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[100])
    ap.add_argument("--members", type=int, default=100_000, help="members in slices")
    ap.add_argument("--inline", type=int, default=0, help="members inline in spec.members instead")
    ap.add_argument("--trickle", type=float, default=0.0,
                    help="apply the changed slices one by one over this many seconds")
    ap.add_argument("--profile", default="release", help="target/<profile>/ holds the binaries")
    args = ap.parse_args()
    global BIN, ENVTEST
    BIN = REPO / "target" / args.profile / "ipsetmgr"
    ENVTEST = REPO / "target" / args.profile / "ipsetmgr-envtest"
    for exe in (BIN, ENVTEST):
        if not exe.exists():
            raise SystemExit(f"{exe} missing: cargo build --release -p ipsetmgr -p ipsetmgr-envtest")
    # Thousands of watches: one connection (file descriptor) each, on both sides.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    rows = []
    for n in args.nodes:
        with tempfile.TemporaryDirectory(prefix="ipsetmgr-scale-") as d:
            row = run(n, args.members, args.inline, Path(d), args.trickle)
        rows.append(row)
        print(json.dumps(row), flush=True)
    kinds = sorted({k for r in rows for k in r["events"]})
    print("\n| nodes | " + " | ".join(f"{k} events (per node)" for k in kinds)
          + " | bytes (per node) | writes by resource (per node) | change to Ready | last write to kernel p50 / p99 / max | last write to Ready | controller RSS / CPU | API server RSS | hollow RSS per node |")
    print("|" + "---|" * (len(kinds) + 9))
    for r in rows:
        n = r["nodes"]
        ev = " | ".join(f"{int(r['events'].get(k, 0))} ({r['events'].get(k, 0) / n:.2f})" for k in kinds)
        total_bytes = sum(r["bytes"].values())
        writes = ", ".join(f"{k} {int(v)} ({v / n:.2f})" for k, v in sorted(r["writes"].items()))
        print(f"| {n} | {ev} | {total_bytes / 1e6:.2f} MB ({total_bytes / n / 1e3:.1f} kB) | {writes} | "
              f"{r['ready_s']} s | {latency(r['kernel_s'])} | {r['ready_after_write_s']} s | "
              f"{r['controller_rss_mib']} MiB / {r['controller_cpu_s']} s | "
              f"{r['apiserver_rss_mib']} MiB | {r['hollow_rss_per_node_mib']} MiB |")


if __name__ == "__main__":
    main()
