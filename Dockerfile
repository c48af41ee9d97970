# syntax=docker/dockerfile:1
# bufscope container image for the DaemonSet in deploy/ (docs/kubernetes.md).
#
#   docker build -t registry.example.com/bufscope:0.1.0 .
#       builds from source: the builder runs the project's own `cargo xtask setup` (nightly
#       rust-src, bpf-linker linked against nightly's libLLVM), then a release build.
#   cargo xtask build && cargo build --release -p bufscope && \
#   docker build --target prebuilt -t registry.example.com/bufscope:0.1.0 .
#       packs the binary already built on a Debian 12 (glibc 2.36) host instead.
#
# The runtime image holds only the binary and glibc: bufscope runs no external program. It
# runs as uid 0 with the capabilities the DaemonSet grants (see docs/kubernetes.md for why).
# No Docker engine exists where this repository is tested, so this file is not built in CI;
# integration/tests/deploy.rs checks it against the DaemonSet.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
ENV CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
RUN cargo xtask setup --no-packages
RUN cargo build --release --package bufscope \
    && install -D -m 0755 target/release/bufscope /out/bufscope

FROM gcr.io/distroless/cc-debian12 AS prebuilt
COPY target/release/bufscope /usr/bin/bufscope
USER 0:0
EXPOSE 9477
ENTRYPOINT ["/usr/bin/bufscope"]
CMD ["run"]

FROM gcr.io/distroless/cc-debian12 AS runtime
COPY --from=build /out/bufscope /usr/bin/bufscope
USER 0:0
EXPOSE 9477
ENTRYPOINT ["/usr/bin/bufscope"]
CMD ["run"]
