#!/usr/bin/env bash
# Render a kustomization to stdout (default: config/default), the way
# `kubectl apply -k` would, without any cluster.
#
# Uses the first of:
#   - `kustomize build`   (standalone kustomize, v4 or newer)
#   - `kubectl kustomize` (kubectl 1.21 or newer embeds kustomize v4+; older
#                          kubectl, e.g. Debian bookworm's kubernetes-client
#                          1.20, embeds kustomize v2 and cannot read
#                          directories under `resources:`)
# Exits 127 with a message when neither is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-config/default}"

if command -v kustomize >/dev/null 2>&1; then
  exec kustomize build "$dir"
elif command -v kubectl >/dev/null 2>&1; then
  exec kubectl kustomize "$dir"
else
  echo "render-kustomize.sh: neither 'kustomize' nor 'kubectl' is installed;" >&2
  echo "install kubectl >= 1.21 (it includes kustomize) or kustomize >= 4." >&2
  exit 127
fi
