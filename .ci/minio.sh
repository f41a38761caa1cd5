#!/usr/bin/env bash
# Prints the path of the pinned MinIO server binary the replica tests run
# against, building it first (go install from the module proxy, about 4
# minutes) into a cache outside the repository when it is missing.
# Usage: export SUPERVISOR_TEST_MINIO="$(.ci/minio.sh)"
set -euo pipefail
# Pinned: the newest github.com/minio/minio on the module proxy that builds
# with this repository's Go (go.mod). Change it here only.
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
cache="${SUPERVISOR_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/supervisor-ci}/minio-${MINIO_VERSION}"
bin="$cache/minio"
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  echo "== building MinIO ${MINIO_VERSION} into $cache (a few minutes, once)" >&2
  GOBIN="$cache" GOFLAGS=-buildvcs=false go install "github.com/minio/minio@${MINIO_VERSION}" >&2
fi
echo "$bin"
