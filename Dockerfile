# syntax=docker/dockerfile:1
#
# ipsetmgr agent image.
#
#   docker build -t ipsetmgr:dev .
#
# Stage 1 builds a release binary; stage 2 is a slim Debian with only what the
# agent needs at run time.

############################ builder ############################
FROM rust:1-bookworm AS builder
WORKDIR /src

# --- Dependency cache -------------------------------------------------------
# Copy only the manifests and build a dummy crate, so the (slow) dependency
# build is a cached layer that is reused until Cargo.toml/Cargo.lock change.
COPY Cargo.toml Cargo.lock ./
RUN set -eux; \
    mkdir -p src benches tests examples; \
    echo 'fn main() {}' > src/main.rs; \
    : > src/lib.rs; \
    # Cargo refuses a manifest whose declared [[bench]]/[[test]]/[[example]]
    # targets have no file: give each one a stub (criterion benches use
    # `harness = false`, so a plain main is enough).
    for kind in bench test example; do \
      dir="${kind}s"; [ "$kind" = bench ] && dir=benches; \
      awk -v k="[[${kind}]]" '$0==k{t=1;next} /^\[/{t=0} t && /^name *=/{gsub(/.*= *"|".*/,""); print}' Cargo.toml \
        | while read -r name; do echo 'fn main() {}' > "${dir}/${name}.rs"; done; \
    done; \
    cargo build --release --locked; \
    # Drop the dummy crate's own artefacts so the real source is rebuilt.
    rm -rf src benches tests examples \
      target/release/ipsetmgr target/release/deps/ipsetmgr-* target/release/deps/libipsetmgr-* \
      target/release/.fingerprint/ipsetmgr-*

# --- The real build ---------------------------------------------------------
COPY . .
RUN cargo build --release --locked --bin ipsetmgr \
 && install -D -m 0755 target/release/ipsetmgr /out/ipsetmgr

############################ runtime ############################
FROM debian:bookworm-slim

# `ipset` is only needed by the cli backend (--backend cli); the default
# netlink backend talks to the kernel directly. ca-certificates lets the agent
# verify the API server when a kubeconfig points at a public CA.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ipset ca-certificates \
 && rm -rf /var/lib/apt/lists/*

COPY --from=builder /out/ipsetmgr /usr/local/bin/ipsetmgr

LABEL org.opencontainers.image.title="ipsetmgr" \
      org.opencontainers.image.description="Keeps Linux ipsets on every node equal to IPSetPolicy resources"

# Run as root (uid 0), but NOT privileged. Changing ipsets needs CAP_NET_ADMIN
# in the node's network namespace (the pod uses hostNetwork). For a non-root
# user the capability granted in the pod spec would only be in the bounding
# set, not the effective set (Kubernetes has no ambient capabilities), so the
# netlink socket calls would fail with EPERM. The DaemonSet drops ALL other
# capabilities, disallows privilege escalation and mounts the root filesystem
# read-only: uid 0 here holds NET_ADMIN and nothing else.
USER root

EXPOSE 9477
ENTRYPOINT ["/usr/local/bin/ipsetmgr", "agent"]
