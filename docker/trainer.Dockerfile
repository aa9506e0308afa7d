# syntax=docker/dockerfile:1
# The `tandem` trainer image: the binary every TrainingJob pod runs (`tandem ps`, `tandem worker`,
# `tandem launcher`), OpenMPI for backend: mpi, and sshd for the MPI workers the launcher reaches.
#
# Build from the repository root after `make data` (the built-in data sets are baked in):
#   docker build -f docker/trainer.Dockerfile -t tandem-trainer:0.1 .
# (`tandem-trainer:0.1` is the default spec.image of a TrainingJob; push it and set spec.image to
# <registry>/tandem-trainer:0.1 on a real cluster.) Build arguments:
#   BASE        the Debian bookworm image to build on (default debian:bookworm-slim; `make images`
#               passes one made here from Debian packages by mmdebstrap, scripts/node/base.sh)
#   TANDEM_BIN  `source` (default): compile `tandem` in a Rust stage; `prebuilt`: take the binary
#               built on the host from target/image-bin/tandem (what `make images` does: the host's
#               cargo cache makes that faster than a fresh build inside the image). The host must be
#               Debian bookworm too (the same glibc and libmpi.so.40).
#
# What the operator's pod builder (operator/src/builder.rs, names.rs) expects of this image:
# - `tandem` on PATH; MPI workers run `tandem-sshd -p 2222` (below), which makes this pod's SSH host
#   key at start, has it certified by the job's host CA and runs sshd as user tandem.
# - The SSH Secret is mounted at /etc/tandem/ssh (ssh-privatekey, ssh-publickey, authorized_keys,
#   known_hosts, and on workers host-ca-key), the job config at /etc/tandem, hostfiles at
#   /etc/tandem/mpi, the token at /var/run/tandem and an emptyDir for output at /var/lib/tandem;
#   none of these may hold image content.
# - The launcher's mpirun reaches workers with -p 2222 -i /etc/tandem/ssh/ssh-privatekey and checks
#   their host certificates against the job's CA in /etc/tandem/ssh/known_hosts.
# - Secret files are root-owned: the pods run with `securityContext.fsGroup: 1000` (this image's
#   group), which the operator sets on every pod whose template sets none.

ARG RUST_VERSION=1.89
ARG BASE=debian:bookworm-slim
ARG TANDEM_BIN=source

FROM rust:${RUST_VERSION}-bookworm AS bin-source
# rsmpi builds against the system OpenMPI, and its bindgen needs libclang.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libopenmpi-dev openmpi-bin libclang-dev clang pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tandem-trainer --bin tandem \
 && install -D -m 0755 target/release/tandem /out/tandem

FROM scratch AS bin-prebuilt
COPY target/image-bin/tandem /out/tandem

FROM bin-${TANDEM_BIN} AS bin

FROM ${BASE}
# openmpi-bin brings mpirun, orted and libopenmpi3 (libmpi.so.40, which tandem links);
# openssh-server/-client for mpirun's rsh launcher. No host keys: each pod makes its own.
# ca-certificates: the roots that `s3://` data over TLS (AWS S3, an https endpoint) is checked against.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openmpi-bin openssh-server openssh-client ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /etc/ssh/ssh_host_* \
      /usr/share/doc/* /usr/share/man/* /usr/share/locale/*

ARG UID=1000
# A non-root user with a valid shell (mpirun runs orted through it) and an unlocked account: with
# UsePAM no, sshd refuses key logins to accounts whose password field is locked ('!').
RUN useradd --uid "${UID}" --user-group --create-home --shell /bin/bash tandem \
 && usermod -p '*' tandem
# sshd as the non-root user, and the ssh client side of mpirun (plain files: buildah before 1.33 has
# no heredocs in COPY).
COPY docker/sshd_config /etc/ssh/sshd_config
COPY docker/ssh_config /etc/ssh/ssh_config.d/tandem.conf
COPY --chmod=0755 docker/tandem-sshd /usr/local/bin/tandem-sshd

COPY --from=bin /out/tandem /usr/local/bin/tandem
# The built-in data sets (`make data`); TANDEM_DATA_DIR points `tandem worker` at them.
COPY data/ /opt/tandem/data/
ENV TANDEM_DATA_DIR=/opt/tandem/data

USER 1000:1000
WORKDIR /home/tandem
EXPOSE 2222
ENTRYPOINT ["tandem"]
CMD ["--help"]
