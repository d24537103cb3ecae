#!/usr/bin/env bash
# End-to-end test of ipsetmgr on a throw-away kind cluster.
#
#   e2e/run.sh                 # create cluster, build, install, test, delete
#   KEEP_CLUSTER=1 e2e/run.sh  # leave the cluster running afterwards
#
# Needs docker, kind, helm, kubectl and cargo on PATH (see e2e/README.md).
# Everything it creates is named ipsetmgr-e2e / ipsetmgr:e2e; the kubeconfig
# lives in e2e/.work/ and your own ~/.kube/config is not touched.
set -euo pipefail

CLUSTER_NAME="${CLUSTER_NAME:-ipsetmgr-e2e}"
IMAGE="ipsetmgr:e2e"
NAMESPACE="ipsetmgr-system"
RELEASE="ipsetmgr"
# The chart names the controller's Deployment <release>-controller; the agent
# DaemonSet is <release>.
CONTROLLER="$RELEASE-controller"
ROLLOUT_TIMEOUT="${ROLLOUT_TIMEOUT:-300s}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$ROOT/e2e/.work"
export KUBECONFIG="$WORK/kubeconfig"

log() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'e2e/run.sh: %s\n' "$*" >&2; exit "${2:-1}"; }

# --- 1. Prerequisites --------------------------------------------------------
# Exit code 2: something is missing, nothing was created.
missing=()
for tool in docker kind helm kubectl cargo; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  die "missing required tools: ${missing[*]}
  docker:  https://docs.docker.com/engine/install/
  kind:    https://kind.sigs.k8s.io/docs/user/quick-start/#installation
  helm:    https://helm.sh/docs/intro/install/
  kubectl: https://kubernetes.io/docs/tasks/tools/
  cargo:   https://rustup.rs/" 2
fi
docker info >/dev/null 2>&1 || die "docker is installed but its daemon is not reachable (is it running? are you in the docker group?)" 2

mkdir -p "$WORK"

# --- Clean-up and diagnostics (always run on exit) --------------------------
cluster_created=0
on_exit() {
  local rc=$?
  if ((rc != 0)) && ((cluster_created)); then
    log "FAILED (exit $rc): collecting diagnostics"
    kubectl -n "$NAMESPACE" get pods -o wide || true
    kubectl -n "$NAMESPACE" describe daemonset "$RELEASE" || true
    kubectl -n "$NAMESPACE" describe deployment "$CONTROLLER" || true
    # Both components' pods and logs (agents and controller share the name label).
    kubectl -n "$NAMESPACE" describe pods -l app.kubernetes.io/name=ipsetmgr || true
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/name=ipsetmgr \
      --all-containers --prefix --tail=-1 || true
    kubectl get ipsetpolicies -o yaml || true
    kubectl get ipsetnodestates -o yaml || true
    kubectl get ipsetmemberslices || true
    kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp || true
    # The controller's Events about (cluster-scoped) policies are in default.
    kubectl -n default get events --field-selector involvedObject.kind=IPSetPolicy \
      --sort-by=.lastTimestamp || true
  fi
  if ((cluster_created)); then
    if [[ "${KEEP_CLUSTER:-0}" == "1" ]]; then
      log "KEEP_CLUSTER=1: cluster $CLUSTER_NAME left running (KUBECONFIG=$KUBECONFIG)"
      log "delete it with: kind delete cluster --name $CLUSTER_NAME"
    else
      log "deleting cluster $CLUSTER_NAME"
      kind delete cluster --name "$CLUSTER_NAME" || true
    fi
  fi
  exit "$rc"
}
trap on_exit EXIT

# --- 2. Cluster --------------------------------------------------------------
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  log "reusing existing kind cluster $CLUSTER_NAME"
else
  log "creating kind cluster $CLUSTER_NAME (1 control-plane, 2 workers, one labelled edge)"
  kind create cluster --name "$CLUSTER_NAME" --config "$ROOT/e2e/kind-config.yaml" --wait 180s
fi
cluster_created=1
kind get kubeconfig --name "$CLUSTER_NAME" >"$KUBECONFIG"

# --- 3. Image ----------------------------------------------------------------
log "building $IMAGE"
docker build -t "$IMAGE" "$ROOT"
log "loading $IMAGE into the kind nodes"
kind load docker-image "$IMAGE" --name "$CLUSTER_NAME"

# --- 4. Install --------------------------------------------------------------
# The agents and the controller (controller.enabled, the chart's default) run
# the same image. It is only in the nodes' containerd: pullPolicy Never. `upgrade
# --install` so that a reused cluster (KEEP_CLUSTER=1) can be rerun.
log "installing the chart"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
# hostNetwork + NET_ADMIN need the "privileged" Pod Security level.
kubectl label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=privileged --overwrite
# Helm installs crds/ only on first install; apply them so reruns pick up changes.
kubectl apply -f "$ROOT/crds/"
helm upgrade --install "$RELEASE" "$ROOT/charts/ipsetmgr" \
  --namespace "$NAMESPACE" \
  --set image.repository=ipsetmgr \
  --set image.tag=e2e \
  --set image.pullPolicy=Never \
  --set backend=netlink \
  --set logFormat=text \
  --set controller.enabled=true

log "waiting for the agent DaemonSet and the controller Deployment"
kubectl -n "$NAMESPACE" rollout status "daemonset/$RELEASE" --timeout="$ROLLOUT_TIMEOUT"
kubectl -n "$NAMESPACE" rollout status "deployment/$CONTROLLER" --timeout="$ROLLOUT_TIMEOUT"
kubectl -n "$NAMESPACE" wait --for=condition=Available "deployment/$CONTROLLER" \
  --timeout="$ROLLOUT_TIMEOUT"
kubectl -n "$NAMESPACE" get pods -o wide

# --- 5. Tests ----------------------------------------------------------------
# The suite (tests/e2e.rs) creates IPSetPolicies through the API and, in kind
# mode, reads each node's kernel with `docker exec <node> ipset save`. kind
# names the worker containers <cluster>-worker and <cluster>-worker2.
log "running the end-to-end suite"
(
  cd "$ROOT"
  IPSETMGR_E2E_KUBECONFIG="$KUBECONFIG" \
  IPSETMGR_E2E_MODE=kind \
  IPSETMGR_E2E_NODES="$CLUSTER_NAME-worker,$CLUSTER_NAME-worker2" \
  IPSETMGR_E2E_KIND_CLUSTER="$CLUSTER_NAME" \
  IPSETMGR_E2E_NAMESPACE="$NAMESPACE" \
    cargo test --test e2e -- --test-threads=1
)

log "end-to-end tests passed"
