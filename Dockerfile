# syntax=docker/dockerfile:1
# bufscope container image for the DaemonSet in deploy/ (docs/kubernetes.md).
#
#   cargo xtask image
#       what CI and developers run: a release build on this Debian 12 host, then
#       `podman build --target prebuilt`, tagged localhost/bufscope:dev and localhost/bufscope:<version>
#       (`--base IMAGE` for another base, `--local-base` for a Debian base made here by
#       mmdebstrap when no registry is reachable).
#   docker build -t registry.example.com/bufscope:0.1.0 .
#       builds from source: the builder runs the project's own `cargo xtask setup` (nightly
#       rust-src, bpf-linker linked against nightly's libLLVM), then a release build.
#   docker build --target prebuilt -t registry.example.com/bufscope:0.1.0 .
#       packs target/release/bufscope, built on a Debian 12 (glibc 2.36) host as `cargo xtask
#       image` builds it, instead.
#
# The image's binary is built with --no-default-features: the daemon without the terminal UI of
# `bufscope top` (ratatui, crossterm), which is a client to run on a workstation or the host;
# in the image, `bufscope top` says so. `bufscope explain` and the status page are there.
#
# The runtime image holds only the binary on a glibc base (libc6, libgcc-s1, CA certificates):
# bufscope runs no external program. It runs as uid 0 with the capabilities the DaemonSet
# grants (see docs/kubernetes.md for why). integration/tests/image.rs builds the `prebuilt`
# stage with podman and runs it with the DaemonSet's security context.

ARG RUST_VERSION=1.95
# The runtime base: any image with glibc >= 2.36 and libgcc_s at /lib/x86_64-linux-gnu (or the
# arch's multiarch dir). distroless/cc-debian12 by default; tests use a Debian 12 base made
# locally (`cargo xtask setup`: mmdebstrap libc6,libgcc-s1,ca-certificates + podman import).
ARG BASE=gcr.io/distroless/cc-debian12

FROM ${BASE} AS prebuilt
# Path of the binary inside the build context.
ARG BINARY=target/release/bufscope
COPY ${BINARY} /usr/bin/bufscope
USER 0:0
EXPOSE 9477
ENTRYPOINT ["/usr/bin/bufscope"]
CMD ["run"]

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
ENV CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
RUN cargo xtask setup --no-packages
RUN cargo build --release -p bufscope --no-default-features \
    && install -D -m 0755 target/release/bufscope /out/bufscope

FROM ${BASE} AS runtime
COPY --from=build /out/bufscope /usr/bin/bufscope
USER 0:0
EXPOSE 9477
ENTRYPOINT ["/usr/bin/bufscope"]
CMD ["run"]
