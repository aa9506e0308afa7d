# syntax=docker/dockerfile:1
# The image of examples/pytorch/: its plain PyTorch DDP script, train.py, with Debian's CPU build of
# PyTorch and the Fashion-MNIST files it reads, for the end-to-end tests (`make images` builds it as
# tandem-pytorch-example:0.1 on the same Debian base as the trainer image).
#
# Nothing of Tandem is in it: the operator runs `tandem progress` beside rank 0 from spec.image. A
# user's own image is any image with Python, PyTorch and the script, e.g.:
#   FROM pytorch/pytorch:<tag>
#   COPY train.py /workspace/train.py
#   WORKDIR /workspace
# Debian's python3-torch (1.13, CPU) adds about 1 GB with its libraries; PyPI's Linux wheel is a
# CUDA build of about 4.7 GB. The uid is 1000, as in the trainer image, so that both containers of a
# rank-0 pod share the checkpoint and progress folders under the pod's fsGroup.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-torch python3-numpy \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /usr/share/doc/* /usr/share/man/* \
 && useradd --uid 1000 --user-group --create-home --shell /bin/bash trainer
COPY data/fashion-mnist/ /opt/data/fashion-mnist/
ENV TANDEM_DATA_DIR=/opt/data
COPY examples/pytorch/train.py /home/trainer/train.py
USER 1000:1000
WORKDIR /home/trainer
CMD ["python3", "train.py"]
