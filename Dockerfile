# syntax=docker/dockerfile:1
#
# ipsetmgr image: one binary for both components. The ENTRYPOINT runs the
# agent (the DaemonSet keeps it); the controller Deployment runs the same
# image with `command: ["/usr/local/bin/ipsetmgr"]` and `args: ["controller"]`.
#
#   docker build \
#     --build-arg VERSION=0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg SOURCE="<the repository's URL>" \
#     -t ipsetmgr:0.1.0 .
#
# The builder stages build the binary with the `dist` profile (release code,
# no debug info, stripped; dependencies cached by cargo-chef). The runtime
# stage is distroless: no shell, no package manager, only the binary, the
# `ipset` tool with its two libraries, the `nft` tool with its ten, and the
# base's glibc, libgcc_s and CA certificates. docs/image.md says why and what
# it costs; tests/dockerfile.rs checks this file's shape.

# What the OCI labels say about the build. Declared before the first FROM so
# that `--build-arg` reaches them; the runtime stage uses them after its last
# file is in place, so they change the image config and no layer there; the
# builder's last step takes REVISION too (for the binary's build info), after
# the dependency cache, which it never invalidates.
# VERSION's default is the workspace version in Cargo.toml (a test keeps them
# equal); REVISION and SOURCE are unknown unless the build says them.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=unknown

############################ builder ############################
# The dependency cache is cargo-chef's: `prepare` reduces the workspace to a
# recipe of its manifests, `cook` builds the dependencies from it in a layer
# that is reused until a manifest or Cargo.lock changes. Cook and build use
# the same profile: dependencies cooked for another profile would be built a
# second time by `cargo build`.
FROM rust:1-bookworm AS chef
RUN cargo install cargo-chef --locked --version "^0.1"
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
# clang compiles the XDP program (crates/bpf/xdp/drop_from.bpf.c) in
# crates/bpf/build.rs; the source needs no other header or library
# (docs/bpf.md, "How the XDP object is built").
RUN apt-get update \
 && apt-get install -y --no-install-recommends clang \
 && rm -rf /var/lib/apt/lists/*
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --profile dist --locked --recipe-path recipe.json --bin ipsetmgr
COPY . .
# The revision goes into the binary (`ipsetmgr_build_info`; the context has
# no .git for build.rs to ask). Declared after the cook, so only this layer,
# which any source change rebuilds anyway, depends on it.
ARG REVISION
ENV IPSETMGR_REVISION=$REVISION
# Without clang build.rs would leave the XDP program out with a warning;
# under CI=true it fails the build instead, so the image always has it.
ENV CI=true
RUN cargo build --profile dist --locked --bin ipsetmgr \
 && install -D -m 0755 target/dist/ipsetmgr /out/ipsetmgr

############################ ipset ############################
# The cli backend (--backend cli, and the fallback when netlink is not
# available) runs the `ipset` binary. Distroless has no package manager, so
# Debian's `ipset` is installed here, in the same Debian release as the
# runtime base (bookworm = debian12, so the glibc it was built against is the
# one it runs with), and only its files are copied over: /usr/sbin/ipset and
# the shared libraries it links besides glibc, libipset and libmnl. The list
# comes from dpkg rather than from fixed paths so that it holds on every
# architecture (the library directory is x86_64-linux-gnu, aarch64-linux-gnu,
# ...). Docs, man pages and shell completions are left out. tar keeps the
# paths and the .so symlinks (bookworm's `cp -a --parents` fails when the
# working directory is not /).
FROM debian:bookworm-slim AS ipset
RUN apt-get update \
 && apt-get install -y --no-install-recommends ipset \
 && mkdir /out \
 && dpkg -L ipset libipset13 libmnl0 \
    | grep -E '^/usr/(sbin/ipset$|lib/.*\.so[.0-9]*$)' \
    | tar -cf - --files-from=- | tar -xf - -C /out \
 && rm -rf /var/lib/apt/lists/*

############################ nft ############################
# The nft-cli backend (--backend nft-cli) runs the `nft` binary; the nft and
# both backends speak nf_tables netlink and need none. Copied from Debian's
# `nftables` as `ipset` is above, with exactly the shared libraries `nft`
# links besides glibc (`ldd /usr/sbin/nft` on bookworm): libnftables and
# libedit directly, and through them libmnl, libnftnl, libxtables, libjansson,
# libgmp, libtinfo, libbsd and libmd. The grep names them, since libtinfo6
# also ships libtic, which nothing here links; libtinfo6 installs into /lib,
# the others into /usr/lib (distroless keeps both directories, and the loader
# searches both). libmnl comes with ipset too: the same file, so that each
# stage holds all its tool needs. /etc/nftables.conf and the systemd unit are
# left out.
FROM debian:bookworm-slim AS nft
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables \
 && mkdir /out \
 && dpkg -L nftables libnftables1 libedit2 libmnl0 libnftnl11 libxtables12 libjansson4 libgmp10 libtinfo6 libbsd0 libmd0 \
    | grep -E '^(/usr/sbin/nft|(/usr)?/lib/[^/]+/lib(nftables|edit|mnl|nftnl|xtables|jansson|gmp|tinfo|bsd|md)\.so\.[.0-9]+)$' \
    | tar -cf - --files-from=- | tar -xf - -C /out \
 && rm -rf /var/lib/apt/lists/*

############################ runtime ############################
# Distroless cc: glibc, libgcc_s (Rust's unwinder needs it), CA certificates
# (for an API server whose certificate chains to a public CA), /etc/protocols
# and /etc/services (ipset resolves `tcp`/`udp` in hash:ip,port members
# through them), /etc/passwd with root and nonroot (65532), /tmp. No shell:
# nothing in this stage may RUN; `kubectl exec` gets no shell either, and the
# agent's logs, /metrics and `ipset list` or `nft list table` on the node are
# how it is looked at.
FROM gcr.io/distroless/cc-debian12

COPY --from=ipset /out/ /
COPY --from=nft /out/ /
COPY --from=builder /out/ipsetmgr /usr/local/bin/ipsetmgr

ARG VERSION
ARG REVISION
ARG SOURCE
# .licenses is the repository's licence (LICENSE, `license` in Cargo.toml).
# No .created: a build
# timestamp would make every build's image config, and so its digest, differ
# even for the same sources; a release pipeline can add it with --label.
LABEL org.opencontainers.image.title="ipsetmgr" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.description="Keeps Linux ipsets on every node equal to IPSetPolicy resources" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"

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

# 9476: agent health (/healthz, /readyz), 9477: agent metrics, both on every
# node's addresses (hostNetwork). 9478: controller metrics, 9479: controller
# health, in the controller's own pod network namespace. EXPOSE only
# documents them; the pod specs declare the ports that are used.
EXPOSE 9476 9477 9478 9479
ENTRYPOINT ["/usr/local/bin/ipsetmgr", "agent"]
