#!/usr/bin/env bash
# Checks that importing the core pulls in no integration's dependency: a
# throwaway module that imports only github.com/oncehq/once and its
# PostgreSQL store, pointed at this checkout, must list none of the
# modules below in `go list -m all`. CI runs it; it names each one found.
#
#   bash scripts/core-deps.sh
#
# It resolves from the module cache alone (GOPROXY=off) and asks the
# module proxy only when the cache lacks a module the core needs.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

# Module path prefixes a user of the core must never get: the queue,
# broker and tracing clients, the browser driver and the history checker.
forbidden=(
  github.com/riverqueue
  github.com/nats-io
  github.com/rabbitmq
  github.com/chromedp
  github.com/anishathalye/porcupine
  go.opentelemetry.io
  github.com/modelcontextprotocol
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

cat >go.mod <<EOF
module example.com/coreuser

go $(sed -n 's/^go //p' "$root/go.mod")

require github.com/oncehq/once v0.0.0-00010101000000-000000000000

replace github.com/oncehq/once => $root
EOF
cat >main.go <<'EOF'
package main

import (
	_ "github.com/oncehq/once"
	_ "github.com/oncehq/once/postgres"
)

func main() {}
EOF

# The throwaway module is outside the workspace: it sees what a user sees.
export GOWORK=off GOFLAGS=-mod=mod
if ! GOPROXY=off go mod tidy 2>tidy.log; then
  echo "core-deps: the module cache lacks a module the core needs; asking the module proxy"
  grep -m1 'module lookup disabled' tidy.log || true
  go mod tidy
fi
go list -m all >modules.txt

grep -qx 'github.com/oncehq/once v0.0.0-00010101000000-000000000000 => .*' modules.txt || {
  echo "core-deps: go list -m all does not list the checkout's github.com/oncehq/once:"
  cat modules.txt
  exit 1
}

found=0
while read -r path _; do
  for p in "${forbidden[@]}"; do
    if [ "$path" = "$p" ] || [ "${path#"$p"/}" != "$path" ]; then
      echo "core-deps: importing once and once/postgres pulls in $path"
      found=1
    fi
  done
done <modules.txt
if [ "$found" -ne 0 ]; then
  echo "core-deps: an integration's dependency belongs in that integration's own module"
  exit 1
fi
echo "core-deps: once and once/postgres pull in $(($(wc -l <modules.txt) - 1)) modules, none of an integration"
