#!/usr/bin/env bash
# End-to-end run of ipsetmgr as its users run it, on a real one-node cluster
# on this machine (the kube-node kit: a kubelet, containerd and runc, the
# host's own kernel). No Docker, kind or registry. As root:
#
#   e2e/real-node.sh
#
# 1. brings the kit's cluster up (up.sh; state under target/kube-node);
# 2. builds the kit's base images the runtime stage needs, once per machine
#    (images.sh --keep-existing slim distroless);
# 3. builds the image of the Dockerfile's runtime stage around the binary
#    already built (target/debug/ipsetmgr; e2e/runtime-image.sh) and loads it
#    into the node (load-image.sh);
# 4. `helm install` of charts/ipsetmgr with its defaults, only the image's
#    repository, tag and pullPolicy=Never set, and waits until the agent
#    DaemonSet and the controller Deployment are Ready; checks, from the host,
#    that the agent runs as uid 0 with only CAP_NET_ADMIN and the controller
#    as uid 65532 with no capability;
# 5. applies config/samples/ and waits until every policy whose set type this
#    kernel supports is READY True, and each of the others is not Ready
#    (NodesNotSynced, naming the node) with "not supported" in the node's
#    IPSetNodeState;
# 6. checks that the synced policies' sets are in the HOST's kernel, and
#    that the API server refused none of the pods' requests (their logs);
# 7. deletes the samples while the agent runs and waits until their sets are
#    gone from the kernel (docs/install.md, Uninstall: the agent does not
#    remove sets on `helm uninstall`), then `helm uninstall` and the CRDs;
# 8. always (trap): down.sh, then checks that the host is clean: none of the
#    cluster's processes or pod processes left, no knbr0, no ipset that was
#    not there before the run.
# It prints the time of each phase and the total. Exit 0 only if all of it
# held; any step that cannot run (no root, no kit, a node that does not
# start) fails: nothing is skipped. e2e/README.md ("real-node mode") says
# how to run it; .ci/run runs it under CI=true.
#
# Settings (environment):
#   IPSETMGR_BIN       the binary to put in the image (target/debug/ipsetmgr)
#   KUBE_NODE_KIT      the kit (../shared/kube-node beside the checkout)
#   KUBE_NODE_STATE    the kit's state directory (target/kube-node)
#   REAL_NODE_TIMEOUT  seconds each wait may take (180)
#   CONTAINERS_STORAGE_CONF, TMPDIR: podman's own settings, passed through
#                      (to keep its store off a full disk, for example)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
KIT=${KUBE_NODE_KIT:-$ROOT/../shared/kube-node}
export KUBE_NODE_STATE=${KUBE_NODE_STATE:-$ROOT/target/kube-node}
BIN=${IPSETMGR_BIN:-$ROOT/target/debug/ipsetmgr}
TIMEOUT=${REAL_NODE_TIMEOUT:-180}
REPO=localhost/ipsetmgr
TAG=real-node
NS=ipsetmgr-system
RELEASE=ipsetmgr
# The chart names the agent DaemonSet <release>, the controller Deployment
# <release>-controller.
CONTROLLER=$RELEASE-controller
# The default setPrefix: the agent's kernel sets are ipm4-*, ipm6-*, ipmx-*, ipmt-*.
SETS='^ipm[46xt]-'
# helm (and kubectl where none is installed) from scripts/envtest-assets.sh.
PATH=$PATH:$ROOT/target/envtest

say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'e2e/real-node.sh: %s\n' "$*" >&2; exit 1; }

# --- phases and their times -----------------------------------------------------
now_ms() { date +%s%3N; }
T_START=$(now_ms)
PHASE="" PHASE_T0=0
TIMES=()
phase() {
  local t
  t=$(now_ms)
  [ -n "$PHASE" ] && TIMES+=("$(printf '%-34s %7.1f s' "$PHASE" "$(((t - PHASE_T0) / 100))e-1")")
  PHASE=$1 PHASE_T0=$t
  [ -n "$PHASE" ] && say "==> $PHASE"
  return 0
}
print_times() {
  local t
  t=$(now_ms)
  printf '\nreal-node e2e: time per phase\n' >&2
  printf '  %s\n' "${TIMES[@]}" >&2
  printf '  %-34s %7.1f s\n' total "$(((t - T_START) / 100))e-1" >&2
}

# --- prerequisites: fail, never skip ---------------------------------------------
[ "$(id -u)" = 0 ] || die "needs root (a kubelet, containerd, the host's ipsets)"
[ -x "$KIT/up.sh" ] || die "the kube-node kit is not at $KIT (set KUBE_NODE_KIT)"
[ -x "$BIN" ] || die "$BIN: no such executable (cargo build --locked --bin ipsetmgr, or set IPSETMGR_BIN)"
for tool in helm kubectl ipset unshare strip; do
  command -v "$tool" >/dev/null || die "$tool not found (helm: scripts/envtest-assets.sh)"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ipsetmgr-real-node.XXXXXX")
ipset list -n | sort > "$WORK/ipsets.before"
if grep -E "$SETS" "$WORK/ipsets.before" >/dev/null; then
  die "the host already has ipsetmgr's sets ($(grep -E "$SETS" "$WORK/ipsets.before" | tr '\n' ' ')): this run would take them over; remove them first (docs/install.md, Uninstall)"
fi

# --- always: diagnostics on failure, the node down, the host checked -----------
node_up=0
on_exit() {
  local rc=$? leftover
  set +e
  if ((rc != 0)) && ((node_up)); then
    say "FAILED (exit $rc): diagnostics"
    kubectl get nodes -o wide
    kubectl -n "$NS" get pods -o wide
    kubectl -n "$NS" describe pods -l app.kubernetes.io/name=ipsetmgr | tail -80
    kubectl -n "$NS" logs -l app.kubernetes.io/name=ipsetmgr --all-containers --prefix --tail=60
    kubectl get ipsp -o wide
    kubectl get ipsns -o yaml | tail -80
    kubectl get events -A --sort-by=.lastTimestamp | tail -30
    ipset list -n
  fi
  # the image goes with the node (its Debian stages stay cached in podman's
  # store): repeated runs do not pile up 80 MB each
  podman rmi "$REPO:$TAG" >/dev/null 2>&1
  phase "down.sh"
  "$KIT/down.sh" >"$WORK/down.log" 2>&1 || { cat "$WORK/down.log" >&2; say "down.sh failed"; rc=1; }
  phase "host clean"
  leftover=$(host_leftovers)
  if [ -n "$leftover" ]; then
    printf 'the host is not clean after down.sh:\n%s\n' "$leftover" >&2
    rc=1
  else
    say "host clean: no cluster process, no pod process, no knbr0, no ipset the run made"
  fi
  phase ""
  print_times
  rm -rf "$WORK"
  ((rc == 0)) && say "real-node e2e passed" || say "real-node e2e FAILED"
  exit "$rc"
}
# What the run may have left: the cluster's processes (all name the state
# directory in their command line: containerd, its shims, the kubelet, ...),
# the image's processes (the agent, the controller), the bridge, ipsets.
host_leftovers() {
  local p cmd
  for p in /proc/[0-9]*; do
    cmd=$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
    case "$cmd" in
      *"$KUBE_NODE_STATE/"*|/usr/local/bin/ipsetmgr\ *) echo "process ${p#/proc/}: $cmd" ;;
    esac
  done
  ip link show knbr0 >/dev/null 2>&1 && echo "bridge knbr0 is still there"
  ipset list -n | sort | comm -13 "$WORK/ipsets.before" - | sed 's/^/ipset left: /'
  return 0
}
trap on_exit EXIT
# a run stopped from outside still brings the node down
trap 'exit 143' TERM
trap 'exit 130' INT

# --- 1. the cluster ------------------------------------------------------------
phase "up.sh"
node_up=1
"$KIT/up.sh" >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log" >&2; die "the node did not start (up.sh failed)"; }
export KUBECONFIG=$KUBE_NODE_STATE/admin.kubeconfig
NODE=$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')
kubectl wait --for=condition=Ready "node/$NODE" --timeout="${TIMEOUT}s" >/dev/null \
  || die "node $NODE is not Ready"
say "node $NODE Ready"

# --- 2. base images, once per machine -----------------------------------------------
# Only those the runtime stage is built from; the rust image is the full
# build's (docs/image.md).
phase "base images (images.sh)"
"$KIT/images.sh" --keep-existing slim distroless >"$WORK/images.log" 2>&1 \
  || { cat "$WORK/images.log" >&2; die "images.sh failed"; }
export CONTAINERS_CONF=$KUBE_NODE_STATE/podman/containers.conf

# --- 3. the image: the Dockerfile's runtime stage around the binary ----------------
phase "image (runtime stage)"
"$ROOT/e2e/runtime-image.sh" "$BIN" "$REPO:$TAG" >"$WORK/image.log" 2>&1 \
  || { cat "$WORK/image.log" >&2; die "the runtime-stage image did not build"; }
podman image inspect "$REPO:$TAG" \
  --format 'image {{.Id}}: {{.Size}} bytes, user {{.Config.User}}, entrypoint {{.Config.Entrypoint}}' >&2
phase "load-image.sh"
"$KIT/load-image.sh" "$REPO:$TAG" >"$WORK/load.log" 2>&1 \
  || { cat "$WORK/load.log" >&2; die "load-image.sh failed"; }

# --- 4. helm install with the chart's defaults ----------------------------------
phase "helm install, pods Ready"
helm install "$RELEASE" charts/ipsetmgr -n "$NS" --create-namespace \
  --set image.repository="$REPO" --set image.tag="$TAG" --set image.pullPolicy=Never >/dev/null
kubectl -n "$NS" rollout status "daemonset/$RELEASE" --timeout="${TIMEOUT}s"
kubectl -n "$NS" rollout status "deployment/$CONTROLLER" --timeout="${TIMEOUT}s"
kubectl -n "$NS" wait --for=condition=Ready pod -l app.kubernetes.io/name=ipsetmgr --timeout="${TIMEOUT}s"
kubectl -n "$NS" get pods -o wide

# The processes as the kernel sees them (the pod specs' security context,
# applied by a real runtime): uid and effective capabilities.
check_process() { # ROLE UID CAPEFF
  local p found=0
  for p in /proc/[0-9]*; do
    case "$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null)" in "/usr/local/bin/ipsetmgr $1 "*) ;; *) continue ;; esac
    found=1
    local uid cap
    uid=$(awk '/^Uid:/ {print $3}' "$p/status")
    cap=$(awk '/^CapEff:/ {print $2}' "$p/status")
    [ "$uid" = "$2" ] && [ "$cap" = "$3" ] \
      || die "the $1 (pid ${p#/proc/}) runs as uid $uid with CapEff $cap; expected uid $2, CapEff $3"
    say "$1 (pid ${p#/proc/}): uid $uid, CapEff $cap"
  done
  ((found)) || die "no '/usr/local/bin/ipsetmgr $1' process on the host"
}
# CAP_NET_ADMIN is bit 12.
check_process agent 0 0000000000001000
check_process controller 65532 0000000000000000

# --- 5. the samples ---------------------------------------------------------------
# The Lease is owned by the controller's ServiceAccount, so the garbage
# collector deletes it with the release (checked after helm uninstall).
owner=""
for _ in $(seq "$TIMEOUT"); do
  owner=$(kubectl -n "$NS" get lease ipsetmgr-controller -o jsonpath='{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}' 2>/dev/null || true)
  [ "${owner%%/*}" = ServiceAccount ] && break
  sleep 1
done
[ "${owner%%/*}" = ServiceAccount ] || die "the controller's Lease has no ServiceAccount owner: '$owner'"
say "the controller's Lease is owned by $owner"

phase "samples Ready"
kubectl apply -f config/samples/ >/dev/null
# Which set types this kernel has, asked of it in a network namespace of our
# own (unshare: gone with the command), not assumed.
type_supported() { # TYPE
  local args=() out
  case $1 in bitmap:ip) args=(range 192.0.2.0/30) ;; bitmap:port) args=(range 1-2) ;; esac
  out=$(unshare -n ipset create probe "$1" "${args[@]}" 2>&1) && return 0
  case $out in *"not supported"*) return 1 ;; esac
  die "probing set type $1: $out"
}
ready=() unsupported=()
while read -r name type; do
  if type_supported "$type"; then ready+=("$name"); else unsupported+=("$name:$type"); fi
done < <(kubectl get -f config/samples/ -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.type}{"\n"}{end}')
say "expected READY True: ${ready[*]}"
say "expected not Ready (type not in this kernel): ${unsupported[*]:-none}"
for p in "${ready[@]}"; do
  kubectl wait --for=condition=Ready=true "ipsp/$p" --timeout="${TIMEOUT}s" >/dev/null \
    || die "policy $p is not Ready: $(kubectl get ipsp "$p" -o jsonpath='{.status.conditions}')"
done
# Such a policy is not Ready: its Ready condition names the node as not
# synced (reason NodesNotSynced), and the node's IPSetNodeState says why
# (the condition itself does not carry the node's error).
for pt in "${unsupported[@]}"; do
  p=${pt%%:*}
  deadline=$((SECONDS + TIMEOUT))
  while :; do
    rstate=$(kubectl get ipsp "$p" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].reason}')
    ready_msg=$(kubectl get ipsp "$p" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}')
    node_err=$(kubectl get ipsns "$NODE" -o jsonpath="{.status.policies[?(@.name==\"$p\")].error}")
    if [ "$rstate" = "False NodesNotSynced" ] && [[ $ready_msg == *"not yet: $NODE ("* ]] \
        && [[ $node_err == *"set type ${pt#*:} is not supported by this kernel"* ]]; then
      say "$p (${pt#*:}): Ready False: $ready_msg; node state: $node_err"
      break
    fi
    ((SECONDS < deadline)) || die "policy $p (${pt#*:}): expected Ready False (NodesNotSynced, naming $NODE) and the node state saying the type is not supported; Ready: '$rstate' '$ready_msg', node state error: '$node_err'"
    sleep 1
  done
done
kubectl get ipsp

# --- 6. the host's kernel ----------------------------------------------------------
phase "sets in the host's kernel"
ipset list -n | sort > "$WORK/ipsets.now"
expected=()
for p in "${ready[@]}"; do
  for s in $(kubectl get ipsns "$NODE" -o jsonpath="{.status.policies[?(@.name==\"$p\")].setNames[*]}"); do
    expected+=("$s")
  done
done
((${#expected[@]} >= ${#ready[@]})) || die "the node state names ${#expected[@]} sets for ${#ready[@]} Ready policies"
for s in "${expected[@]}" ipm4-blocklist; do
  grep -qxF "$s" "$WORK/ipsets.now" || die "set $s (node state) is not in the host's kernel: $(tr '\n' ' ' <"$WORK/ipsets.now")"
done
# a member of the blocklist sample, in the kernel (a member may carry
# " comment:..." after the address)
first=$(kubectl get ipsp blocklist -o jsonpath='{.spec.members[0]}')
first=${first%% *}
ipset test ipm4-blocklist "${first%%/*}" >/dev/null 2>&1 \
  || die "ipm4-blocklist lacks the sample's member $first"
say "in the host's kernel: ${expected[*]}"

# The chart's RBAC must cover what the binary asks of the API server: a
# refused request (a missing rule) shows only in the logs.
kubectl -n "$NS" logs -l app.kubernetes.io/name=ipsetmgr --all-containers --prefix --tail=-1 >"$WORK/pods.log"
if grep -E 'Forbidden|HTTP 403|is forbidden' "$WORK/pods.log" >"$WORK/forbidden.log"; then
  head -5 "$WORK/forbidden.log" >&2
  die "the API server refused requests of the agent or the controller ($(wc -l <"$WORK/forbidden.log") log lines): the chart's RBAC lacks a rule"
fi

# --- 7. uninstall -------------------------------------------------------------------
# docs/install.md: the agent does not delete sets on uninstall; deleting the
# policies while it runs does.
phase "delete samples, sets gone"
kubectl delete -f config/samples/ --wait --timeout="${TIMEOUT}s" >/dev/null
deadline=$((SECONDS + TIMEOUT))
while ipset list -n | grep -E "$SETS" >/dev/null; do
  ((SECONDS < deadline)) || die "the agent left sets after the policies were deleted: $(ipset list -n | grep -E "$SETS" | tr '\n' ' ')"
  sleep 1
done
phase "helm uninstall"
helm uninstall "$RELEASE" -n "$NS" --wait --timeout "${TIMEOUT}s" >/dev/null
kubectl -n "$NS" wait --for=delete pod -l app.kubernetes.io/name=ipsetmgr --timeout="${TIMEOUT}s" >/dev/null 2>&1 || true
[ -z "$(kubectl -n "$NS" get pods -l app.kubernetes.io/name=ipsetmgr -o name)" ] || die "pods left after helm uninstall"
# The controller releases its Lease on SIGTERM (docs/install.md,
# "Uninstall"): a reinstall must not wait for it to expire.
holder=$(kubectl -n "$NS" get lease ipsetmgr-controller -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)
[ -z "$holder" ] || die "the controller's Lease still names $holder after helm uninstall"
say "the controller's Lease names no holder after helm uninstall"
kubectl delete -f crds/ --wait --timeout="${TIMEOUT}s" >/dev/null
if ipset list -n | grep -E "$SETS" >/dev/null; then
  die "sets left after uninstall: $(ipset list -n | grep -E "$SETS" | tr '\n' ' ')"
fi
