# The pinned MinIO server of the object-storage tests (sourced, not run). MinIO publishes no semver
# tags, so the Go module proxy serves its commits as pseudo-versions; this is its last commit (the
# community repository was archived after it). Change it here and the next `make minio-bin` builds
# it into a fresh cache folder.
MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"

TANDEM_CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
MINIO_HOME="$TANDEM_CACHE/minio/$MINIO_VERSION"
MINIO_BIN="$MINIO_HOME/bin/minio"
