# The cumulus binary alone in an image with no shell and no root:
#   docker build -t cumulus .
# Every role is the same image: its first argument (shard, router,
# manager) picks one; deploy/kubernetes runs it.

# The Go named by go.mod. The repository's .git comes along so that
# `cumulus --version` (and the build each shard reports) names the commit.
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static: no C library in the image to link against.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/cumulus ./cmd/cumulus

# distroless/static: CA certificates, time zones and /etc/passwd, no
# shell, no package manager; "nonroot" is user 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/cumulus /cumulus
USER 65532:65532
# Kubernetes' pod securityContext runs it as 65532 too; the shard's
# --data-dir and the manager's volume are made writable by fsGroup.
ENTRYPOINT ["/cumulus"]
