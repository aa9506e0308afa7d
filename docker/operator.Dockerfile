# syntax=docker/dockerfile:1
# The tandem-operator image: one binary (rustls, no OpenSSL, no MPI) on debian-slim, non-root.
#
# Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t <registry>/tandem-operator:0.1.0 .
# The Helm chart (charts/tandem) runs it with a read-only root filesystem as uid 65532.

ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS build
# The operator needs neither OpenMPI nor libclang: only tandem-operator and its dependencies build.
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tandem-operator --bin tandem-operator \
 && install -D -m 0755 target/release/tandem-operator /out/tandem-operator

# glibc, which the binary links dynamically, and nothing added: the API server's CA comes from the
# ServiceAccount mount. uid 65532 needs no passwd entry.
FROM debian:bookworm-slim
COPY --from=build /out/tandem-operator /usr/local/bin/tandem-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/tandem-operator"]
