#!/usr/bin/env bash
# Copy the CRDs (crds/ipsetmgr.yaml, the output of `ipsetmgr crd`) to the
# places that need their own copy: the Helm chart's crds/ directory (Helm only
# reads files inside the chart) and config/crd/ (kustomize only reads files
# inside the kustomization tree). tests/manifests/ fails while they differ.
#
#   scripts/sync-crds.sh            # copy
#   scripts/sync-crds.sh --check    # only report differences (exit 1)
set -euo pipefail
cd "$(dirname "$0")/.."

src=crds/ipsetmgr.yaml
copies=(charts/ipsetmgr/crds/ipsetmgr.yaml config/crd/ipsetmgr.yaml)

status=0
for dst in "${copies[@]}"; do
  if [[ "${1:-}" == "--check" ]]; then
    if ! cmp -s "$src" "$dst"; then
      echo "$dst differs from $src (run scripts/sync-crds.sh)" >&2
      status=1
    fi
  else
    mkdir -p "$(dirname "$dst")"
    cp "$src" "$dst"
    echo "updated $dst"
  fi
done
exit "$status"
