# syntax=docker/dockerfile:1
# The image of examples/pytorch/: its plain PyTorch DDP script, train.py, with Debian's CPU build of
# PyTorch and the Fashion-MNIST files it reads, for the end-to-end tests (`make images` builds it as
# tandem-pytorch-example:0.1 on the same Debian base as the trainer image). It also holds
# python/examples/fashion_mnist.py and the `tandem` wheel (tandem.torch), which `make images` builds
# into target/image-bin/wheels/.
#
# Nothing of Tandem's binary is in it: the operator runs `tandem progress` beside rank 0, and a
# `backend: mpi` group's `tandem launcher`, from spec.image. For tandem.torch a user's image needs
# only `pip install tandem-*.whl`; Debian's Python here has no pip, so the wheel (pure files, no
# dependencies) is unpacked into site-packages, which is what pip does with it. A user's own image is any image with
# Python, PyTorch and the script, e.g.:
#   FROM pytorch/pytorch:<tag>
#   COPY train.py /workspace/train.py
#   WORKDIR /workspace
# For `workers.backend: mpi` (the launcher's mpirun starts the ranks over ssh) it also needs what
# this image adds below: OpenMPI of the trainer image's major version (Debian bookworm's 4.1),
# OpenSSH's server, the user `tandem` (uid 1000, a login shell, an unlocked account), Tandem's
# sshd_config, ssh_config and tandem-sshd from docker/, and the script in /home/tandem (the
# launcher's working folder, where mpirun starts the ranks). Ranks started over ssh see the
# contract's variables and workers.env, not the image's ENV.
# Debian's python3-torch (1.13, CPU) adds about 1 GB with its libraries; PyPI's Linux wheel is a
# CUDA build of about 4.7 GB. The uid is 1000, as in the trainer image, so that both containers of a
# rank-0 pod share the checkpoint and progress folders under the pod's fsGroup.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-torch python3-numpy \
      openmpi-bin openssh-server openssh-client \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /etc/ssh/ssh_host_* \
      /usr/share/doc/* /usr/share/man/* \
 && useradd --uid 1000 --user-group --create-home --shell /bin/bash tandem \
 && usermod -p '*' tandem
COPY docker/sshd_config /etc/ssh/sshd_config
COPY docker/ssh_config /etc/ssh/ssh_config.d/tandem.conf
COPY --chmod=0755 docker/tandem-sshd /usr/local/bin/tandem-sshd
# In /home/tandem/data, where the script looks by default: ranks that mpirun starts over ssh get
# the contract's variables and workers.env, not this image's ENV.
COPY data/fashion-mnist/ /home/tandem/data/fashion-mnist/
ENV TANDEM_DATA_DIR=/home/tandem/data
COPY target/image-bin/wheels/ /tmp/wheels/
RUN python3 -m zipfile -e /tmp/wheels/tandem-*.whl "$(python3 -c 'import site; print(site.getsitepackages()[0])')" \
 && rm -rf /tmp/wheels \
 && python3 -c 'import tandem.torch'
COPY examples/pytorch/train.py /home/tandem/train.py
COPY python/examples/fashion_mnist.py /home/tandem/fashion_mnist.py
USER 1000:1000
WORKDIR /home/tandem
CMD ["python3", "train.py"]
