# syntax=docker/dockerfile:1
#
# ipsetmgr image: one binary for both components. The ENTRYPOINT runs the
# agent (the DaemonSet keeps it); the controller Deployment runs the same
# image with `command: ["/usr/local/bin/ipsetmgr"]` and `args: ["controller"]`.
#
#   docker build -t ipsetmgr:dev .
#
# The builder stages build a release binary (dependencies cached by
# cargo-chef); the runtime stage is a slim Debian with only what the agent
# needs at run time.

############################ builder ############################
# The dependency cache is cargo-chef's: `prepare` reduces the workspace to a
# recipe of its manifests, `cook` builds the dependencies from it in a layer
# that is reused until a manifest or Cargo.lock changes.
FROM rust:1-bookworm AS chef
RUN cargo install cargo-chef --locked --version "^0.1"
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json --bin ipsetmgr
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
# The controller needs none of this: its Deployment runs the image as uid
# 65532 (runAsNonRoot), with no capabilities at all.
USER root

# The agent's port; the controller listens on 9478.
EXPOSE 9477
ENTRYPOINT ["/usr/local/bin/ipsetmgr", "agent"]
