# syntax=docker/dockerfile:1
# The image of examples/pytorch/: its plain PyTorch DDP script, train.py, with Debian's CPU build of
# PyTorch, for the end-to-end tests (`make images` builds it as tandem-pytorch-example:0.1).
#
# It is built on the trainer image only because that holds the built-in data sets and
# TANDEM_DATA_DIR; Tandem needs nothing in a user's image (the operator runs `tandem progress`
# beside rank 0 from spec.image). A user's own image is any image with Python, PyTorch and the
# script, e.g.:
#   FROM pytorch/pytorch:<tag>
#   COPY train.py /workspace/train.py
#   WORKDIR /workspace
# Debian's python3-torch (1.13, CPU, about 300 MB with its libraries) keeps this test image small;
# PyPI's Linux wheel is a CUDA build of about 4.7 GB.
ARG BASE=tandem-trainer:0.1
FROM ${BASE}
USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-torch python3-numpy \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /usr/share/doc/* /usr/share/man/*
COPY examples/pytorch/train.py /home/tandem/train.py
USER 1000:1000
WORKDIR /home/tandem
ENTRYPOINT []
CMD ["python3", "train.py"]
