#!/usr/bin/env bash
# Compares two ipsetmgr images in podman's store: the full Dockerfile build
# and the runtime stage built around a binary (e2e/runtime-image.sh).
#
#   e2e/compare-images.sh IMAGE_A IMAGE_B
#
# Equal means: the same image configuration (user, entrypoint, cmd, env,
# exposed ports, working directory, labels) and the same files (path, type,
# mode, owner, link target, and size for every file but the ipsetmgr binary,
# whose size depends on the cargo profile it was built with). Prints the
# differences and exits 1 if there are any. docs/install.md ("The image")
# says when to run it.
set -euo pipefail
[ $# = 2 ] || { echo "usage: e2e/compare-images.sh IMAGE_A IMAGE_B" >&2; exit 2; }
BINARY=usr/local/bin/ipsetmgr

work=$(mktemp -d "${TMPDIR:-/tmp}/ipsetmgr-compare.XXXXXX")
trap 'rm -rf "$work"' EXIT

describe() { # IMAGE OUT
  local c
  podman image inspect "$1" --format '
user       {{json .Config.User}}
entrypoint {{json .Config.Entrypoint}}
cmd        {{json .Config.Cmd}}
env        {{json .Config.Env}}
ports      {{json .Config.ExposedPorts}}
workdir    {{json .Config.WorkingDir}}
labels     {{json .Config.Labels}}' > "$2.config"
  # the files, from a container that is created, never started (the command
  # is given for images without one; it is never run)
  c=$(podman create "$1" /never-run)
  podman export "$c" | tar -tvf - --numeric-owner --quoting-style=escape \
    | awk -v bin="$BINARY" '{
        # mode owner size date time path [-> target]
        size = $3; path = $6
        if (path == bin) size = "*"
        rest = ""; for (i = 7; i <= NF; i++) rest = rest " " $i
        print $1, $2, size, path rest
      }' | sort -k4 > "$2.files"
  podman rm "$c" >/dev/null
  podman image inspect "$1" --format '{{.Size}}' > "$2.size"
}
describe "$1" "$work/a"
describe "$2" "$work/b"

rc=0
diff -u --label "$1" --label "$2" "$work/a.config" "$work/b.config" || rc=1
diff -u --label "$1 files" --label "$2 files" "$work/a.files" "$work/b.files" || rc=1
printf '%s: %s bytes, %s files; %s: %s bytes, %s files\n' \
  "$1" "$(cat "$work/a.size")" "$(wc -l <"$work/a.files")" \
  "$2" "$(cat "$work/b.size")" "$(wc -l <"$work/b.files")"
if [ $rc = 0 ]; then
  echo "same configuration (user, entrypoint, cmd, env, ports, workdir, labels) and same files (the binary's size aside)"
  cat "$work/a.config"
fi
exit $rc
