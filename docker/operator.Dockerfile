# syntax=docker/dockerfile:1
# The tandem-operator image: one binary (rustls, no OpenSSL, no MPI) on a glibc base, non-root.
#
# Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t <registry>/tandem-operator:0.1.0 .
# Build arguments:
#   BASE        the image to run on: anything with glibc 2.36 and libgcc_s (default
#               debian:bookworm-slim; `make images` passes a libc-only base made here by mmdebstrap,
#               scripts/node/base.sh, with no shell and no package manager)
#   TANDEM_BIN  `source` (default): compile in a Rust stage; `prebuilt`: take the binary built on the
#               host (Debian bookworm) from target/image-bin/tandem-operator, as `make images` does.
# The Helm chart (charts/tandem) runs it with a read-only root filesystem as uid 65532.

ARG RUST_VERSION=1.89
ARG BASE=debian:bookworm-slim
ARG TANDEM_BIN=source

FROM rust:${RUST_VERSION}-bookworm AS bin-source
# The operator needs neither OpenMPI nor libclang: only tandem-operator and its dependencies build.
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tandem-operator --bin tandem-operator \
 && install -D -m 0755 target/release/tandem-operator /out/tandem-operator

FROM scratch AS bin-prebuilt
COPY target/image-bin/tandem-operator /out/tandem-operator

FROM bin-${TANDEM_BIN} AS bin

# glibc, which the binary links dynamically, and nothing added: the API server's CA comes from the
# ServiceAccount mount. uid 65532 needs no passwd entry.
FROM ${BASE}
COPY --from=bin /out/tandem-operator /usr/local/bin/tandem-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/tandem-operator"]
