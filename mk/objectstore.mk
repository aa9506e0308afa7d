# Object storage: the S3-compatible server (MinIO) that the trainer's `s3://` tests start on loopback,
# built from the Go module proxy into ${TANDEM_CACHE:-$HOME/.cache/tandem}/minio/<version>/bin
# (scripts/minio/).

## minio-bin: build the pinned MinIO server of the object-storage tests if missing.
.PHONY: minio-bin

minio-bin:
	@scripts/minio/build.sh >/dev/null

# `make test` builds it with the rest of the set-up, and the trainer's tests that need it (its
# `cluster-tests` feature: the tests that need what `prepare` builds) run in test-cluster's build.
prepare: minio-bin
CLUSTER_TEST_PACKAGES += tandem-trainer

# Where those tests find the server (trainer/tests/it/object_store.rs).
export TANDEM_MINIO := $(shell scripts/minio/bin-path.sh)
