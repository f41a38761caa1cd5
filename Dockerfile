# Multi-stage build: a static supervisor binary (with the demo and reference agents
# embedded) on a distroless, non-root base.
#
#   docker build -t supervisor .
#   docker run --rm -p 9464:9464 supervisor       # supervises the built-in demo agent
#
# To supervise your own agent, build FROM this image and add it (see docs/operations.md).
# On Kubernetes: deploy/kubernetes/ (its StatefulSet runs this binary with
# --data-dir /data/supervisor on a PVC). deploy/kubernetes/dockerfile_test.go
# checks what the manifests rely on here: the binary's path, USER 65532:65532,
# a /data owned by that user before VOLUME, port 9464.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# .git is not copied, so the build records no VCS revision: pass both, e.g.
#   docker build --build-arg VERSION=v1.2.0 --build-arg REVISION=$(git rev-parse HEAD) .
# Empty values fall back to the Go build info (`supervisor version`).
ARG VERSION=
ARG REVISION=
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/agent-sidecar/supervisor/supervisor.version=${VERSION} -X github.com/agent-sidecar/supervisor/supervisor.revision=${REVISION}" -o /out/supervisor ./cmd/supervisor \
 && mkdir -p -m 0700 /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/supervisor /usr/local/bin/supervisor
COPY --from=build --chown=65532:65532 /out/data /data
USER 65532:65532
VOLUME ["/data"]
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/supervisor"]
CMD ["run", "--data-dir", "/data", "--http-addr", "0.0.0.0:9464", "--http-allow-remote"]
