#!/usr/bin/env bash
# Builds the image of the Dockerfile's runtime stage around a binary that is
# already built (CI's target/debug/ipsetmgr), so that CI does not compile the
# project a second time inside the builder stages.
#
#   e2e/runtime-image.sh BINARY IMAGE
#   e2e/runtime-image.sh --print     # only print the derived Containerfile
#
# The image's revision label is REVISION, else `git rev-parse HEAD`.
#
# The Containerfile is derived from the Dockerfile, not written beside it: the
# global ARGs and every stage except the three compiling ones (chef, planner,
# builder) are copied verbatim (the ipset and nft stages and the runtime
# stage: the same files, USER, LABELs, EXPOSE and ENTRYPOINT), and the
# builder is replaced by a stage that holds only what the runtime stage takes
# from it, /out/ipsetmgr, mode 0755, owned by root, as `install -D -m 0755`
# leaves it there. Before building, the derivation is checked: the Dockerfile
# still has exactly those three compiling stages, its builder still produces
# only /out/ipsetmgr that way, and the kept stages take nothing else from it
# (nor from chef or planner). A Dockerfile whose shape changes makes this
# script fail instead of building another image than the Dockerfile's.
#
# The binary is copied stripped of symbols and debug info (`strip
# --strip-all`), as the `dist` profile strips the shipped one (Cargo.toml):
# a debug build is 300 MB with its debug info, about 50 MB without. Its code
# is the dev profile's (debug assertions, no optimisation), which is what CI
# has built; the release image's binary comes only from the full build
# (docs/image.md).
#
# Uses rootful podman with the kube-node kit's configuration when
# CONTAINERS_CONF is set (e2e/real-node.sh sets it); the base images
# (debian:bookworm-slim, gcr.io/distroless/cc-debian12) must be in podman's
# store: nothing is pulled.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKERFILE="$ROOT/Dockerfile"

die() { printf 'e2e/runtime-image.sh: %s\n' "$*" >&2; exit 1; }

# The stages that compile, dropped; the builder is replaced by BUILDER_STAGE.
COMPILING="chef planner builder"
BUILDER_STAGE='FROM scratch AS builder
COPY ipsetmgr /out/ipsetmgr'
# What the Dockerfile's builder must end with for the replacement to hold.
BUILDER_OUTPUT='install -D -m 0755 target/dist/ipsetmgr /out/ipsetmgr'
# What the kept stages may take from the builder: the binary, nothing else.
BUILDER_COPY='COPY --from=builder /out/ipsetmgr /usr/local/bin/ipsetmgr'

# stage_of FILE: prints each line prefixed with the name of the stage it is
# in ("-" before the first FROM, the FROM's `AS` name, or "#N" for an unnamed
# N-th stage) and a tab; the comments above a FROM go with its stage.
stage_of() {
  awk '
    # comments and blank lines right before a FROM belong to that stage
    /^[ \t]*(#|$)/ { held[nh++] = $0; next }
    toupper($1) == "FROM" {
      n++; name = "#" n
      for (i = 2; i < NF; i++) if (toupper($i) == "AS") name = $(i + 1)
    }
    {
      for (i = 0; i < nh; i++) print (n ? name : "-") "\t" held[i]
      nh = 0
      print (n ? name : "-") "\t" $0
    }
    END { for (i = 0; i < nh; i++) print (n ? name : "-") "\t" held[i] }
  ' "$1"
}

derive() {
  local line stage text emitted=0
  while IFS= read -r line; do
    stage=${line%%$'\t'*}
    text=${line#*$'\t'}
    case " $COMPILING " in
      *" $stage "*)
        if [ "$emitted" = 0 ]; then printf '%s\n\n' "$BUILDER_STAGE"; emitted=1; fi
        continue ;;
    esac
    printf '%s\n' "$text"
  done < <(stage_of "$DOCKERFILE")
}

check() {
  local stages kept
  stages=$(stage_of "$DOCKERFILE" | cut -f1 | uniq | grep -v '^-$' | tr '\n' ' ')
  for s in $COMPILING; do
    case " $stages" in *" $s "*) ;; *) die "the Dockerfile has no stage '$s' (stages: $stages): update this script" ;; esac
  done
  # The builder's only mention of /out is the command that installs the
  # binary there, alone on its line: the replacement stage holds exactly that.
  local out_lines
  out_lines=$(stage_of "$DOCKERFILE" | awk -F'\t' '$1 == "builder"' | cut -f2- \
    | grep -v '^[[:space:]]*#' | grep -F -- '/out' || true)
  [ -n "$out_lines" ] && ! printf '%s\n' "$out_lines" \
    | grep -vxE -- "[[:space:]]*(&&[[:space:]]*)?$BUILDER_OUTPUT[[:space:]]*" >/dev/null \
    || die "the Dockerfile's builder no longer writes only '$BUILDER_OUTPUT' to /out: update this script"
  kept=$(stage_of "$DOCKERFILE" | awk -F'\t' -v c=" $COMPILING " 'index(c, " " $1 " ") == 0' | cut -f2-)
  if printf '%s\n' "$kept" | grep -iE -- '--from=(chef|planner)\b' >/dev/null; then
    die "a kept stage copies from chef or planner: update this script"
  fi
  if printf '%s\n' "$kept" | grep -iE -- '--from=builder\b' | grep -vqxF -- "$BUILDER_COPY"; then
    die "a kept stage takes more from the builder than '$BUILDER_COPY': update this script"
  fi
  printf '%s\n' "$kept" | grep -qxF -- "$BUILDER_COPY" \
    || die "the runtime stage no longer has '$BUILDER_COPY': update this script"
}

check
if [ "${1:-}" = --print ]; then derive; exit 0; fi
[ $# = 2 ] || die "usage: e2e/runtime-image.sh BINARY IMAGE | --print"
bin=$1 image=$2
[ -x "$bin" ] || die "$bin: no such executable (build it first: cargo build --locked --bin ipsetmgr)"
command -v podman >/dev/null || die "podman not found (the kube-node kit's images.sh installs it)"

ctx=$(mktemp -d "${TMPDIR:-/tmp}/ipsetmgr-runtime.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
derive > "$ctx/Containerfile"
strip --strip-all -o "$ctx/ipsetmgr" "$bin"
chmod 0755 "$ctx/ipsetmgr"
revision=${REVISION:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}
podman build --network host --pull=never --build-arg REVISION="$revision" \
  -f "$ctx/Containerfile" -t "$image" "$ctx"
