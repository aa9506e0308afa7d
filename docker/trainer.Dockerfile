# syntax=docker/dockerfile:1
# The `tandem` trainer image: the binary every TrainingJob pod runs (`tandem ps`, `tandem worker`,
# `tandem launcher`), OpenMPI for backend: mpi, and sshd for the MPI workers the launcher reaches.
#
# Build from the repository root after `make data` (the built-in data sets are baked in):
#   docker build -f docker/trainer.Dockerfile -t tandem-trainer:0.1 .
# (`tandem-trainer:0.1` is the default spec.image of a TrainingJob; push it and set spec.image to
# <registry>/tandem-trainer:0.1 on a real cluster).
#
# What the operator's pod builder (operator/src/builder.rs, names.rs) expects of this image:
# - `tandem` on PATH; MPI workers run `/usr/sbin/sshd -De -p 2222` with no other arguments, so the
#   sshd configuration below must hold every setting (port, keys, no PAM, non-root).
# - The SSH Secret is mounted at /etc/tandem/ssh (ssh-privatekey, ssh-publickey, authorized_keys),
#   the job config at /etc/tandem, hostfiles at /etc/tandem/mpi, the token at /var/run/tandem and an
#   emptyDir for output at /var/lib/tandem; none of these may hold image content.
# - The launcher's mpirun reaches workers with -p 2222 -i /etc/tandem/ssh/ssh-privatekey.
# - The Secret's files are root-owned, mode 0600: the pods must run with `securityContext.fsGroup:
#   1000` (this image's group) so that user tandem can read them; set it in the job's pod templates.

ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS build
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

FROM debian:bookworm-slim
# openmpi-bin brings mpirun, orted and libopenmpi3 (libmpi.so.40, which tandem links);
# openssh-server/-client for mpirun's rsh launcher.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openmpi-bin openssh-server openssh-client ca-certificates \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*

ARG UID=1000
# A non-root user with a valid shell (mpirun runs orted through it) and an unlocked account: with
# UsePAM no, sshd refuses key logins to accounts whose password field is locked ('!').
RUN useradd --uid "${UID}" --user-group --create-home --shell /bin/bash tandem \
 && usermod -p '*' tandem \
 && mkdir -p /etc/ssh/tandem \
 && ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/tandem/ssh_host_ed25519_key \
 && chown -R tandem:tandem /etc/ssh/tandem \
 && chmod 0600 /etc/ssh/tandem/ssh_host_ed25519_key
# sshd as the non-root user: its own host key and pid file, keys from the operator's Secret mount,
# no PAM or privilege separation (both need root). StrictModes is off because the Secret's files
# belong to root (readable through the pod's fsGroup).
COPY <<'SSHD' /etc/ssh/sshd_config
Port 2222
HostKey /etc/ssh/tandem/ssh_host_ed25519_key
PidFile /tmp/sshd.pid
AuthorizedKeysFile /etc/tandem/ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
StrictModes no
AllowUsers tandem
PermitUserEnvironment no
X11Forwarding no
Subsystem sftp none
SSHD
# The ssh client side of mpirun: workers are reached by their stable DNS names on port 2222.
COPY <<'SSH' /etc/ssh/ssh_config.d/tandem.conf
Host *
    Port 2222
    IdentityFile /etc/tandem/ssh/ssh-privatekey
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
SSH

COPY --from=build /out/tandem /usr/local/bin/tandem
# The built-in data sets (`make data`); TANDEM_DATA_DIR points `tandem worker` at them.
COPY data/ /opt/tandem/data/
ENV TANDEM_DATA_DIR=/opt/tandem/data

USER tandem:tandem
WORKDIR /home/tandem
EXPOSE 2222
ENTRYPOINT ["tandem"]
CMD ["--help"]
