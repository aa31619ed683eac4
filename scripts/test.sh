#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests use
# (LIBLINEAR, Redis, PyTorch and, for the network-namespace cluster, etcd,
# iproute2, curl and openssl from Debian; chromium for the console's
# browser test; grpcurl and staticcheck from the
# Go module proxy), checks formatting and lints, then runs every Go test.
# CUMULUS_REQUIRE_TOOLS=1 makes tests that need those tools fail, rather
# than skip, when a tool is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v liblinear-train >/dev/null || need_apt+=(liblinear-tools)
command -v redis-server >/dev/null || need_apt+=(redis-server)
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || need_apt+=(python3-torch python3-numpy)
command -v etcd >/dev/null || need_apt+=(etcd-server)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v curl >/dev/null || need_apt+=(curl)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v chromium >/dev/null || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== installing ${need_apt[*]} (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  # Packages only: the tests start their own redis-server and etcd, so
  # keep the packages from starting system services.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

export PATH="$(go env GOPATH)/bin:$PATH"
command -v grpcurl >/dev/null || { echo "== installing grpcurl"; GOFLAGS= go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4; }
command -v staticcheck >/dev/null || { echo "== installing staticcheck"; GOFLAGS= go install honnef.co/go/tools/cmd/staticcheck@v0.8.2; }

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted"; exit 1; fi
echo "== go vet"
go vet ./...
echo "== staticcheck"
staticcheck ./...
echo "== go test"
export CUMULUS_REQUIRE_TOOLS=1
go test -count=1 -timeout 15m ./... "$@"
echo "== go test -race (the packages with concurrent request paths)"
go test -race -count=1 -timeout 15m ./shard ./router ./manager ./internal/topo ./internal/hedge ./internal/scratch ./server ./internal/raftstore ./internal/raftgroup "$@"
