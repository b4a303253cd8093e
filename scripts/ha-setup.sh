#!/usr/bin/env bash
# Installs what the chaos harness's --ha mode and the tests of
# lab/chaos/ha need: pg_auto_failover's pg_autoctl, from Debian's
# postgresql-15-auto-failover (it brings PostgreSQL 15's server with it).
# Does nothing when pg_autoctl is there already. Prints pg_autoctl's path.
#
#   bash scripts/ha-setup.sh
#
# Needs root (apt-get). pg_autoctl itself refuses to run as root: the
# package runs it as the postgres user the server package creates.
set -euo pipefail

if ! command -v pg_autoctl >/dev/null 2>&1 && [ ! -x /usr/bin/pg_autoctl ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "pg_autoctl is missing; run this script as root to install postgresql-15-auto-failover" >&2
    exit 1
  fi
  echo "installing postgresql-15-auto-failover"
  export DEBIAN_FRONTEND=noninteractive
  # An install right after a fresh machine's start may find no package
  # lists yet; update them only then.
  if ! apt-get install -y -qq postgresql-15-auto-failover >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq postgresql-15-auto-failover >/dev/null
  fi
fi
command -v pg_autoctl || echo /usr/bin/pg_autoctl
pg_autoctl --version | head -1
