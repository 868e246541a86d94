#!/usr/bin/env bash
# Installs what a fresh machine lacks for building and testing Cairn:
# OpenLDAP (slapd, ldap-utils) and openssl for the LDAP tests, python3-venv for the hvac test,
# tmux for the terminal tests, curl and python3 for the README walkthrough tests, pip for
# the reference server of the differential test (scripts/reference.sh, OpenBao 2.6.2 from PyPI),
# PostgreSQL for the PostgreSQL storage tests (scripts/dev-postgres.sh runs a throwaway server).
set -euo pipefail
need=()
command -v slapd >/dev/null 2>&1 || [ -x /usr/sbin/slapd ] || need+=(slapd)
command -v ldapadd >/dev/null 2>&1 || need+=(ldap-utils)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v tmux >/dev/null 2>&1 || need+=(tmux)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v curl >/dev/null 2>&1 || need+=(curl ca-certificates)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
command -v flock >/dev/null 2>&1 || need+=(util-linux)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: need root to install: ${need[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust toolchain) is required" >&2; exit 1; }
# The differential test's reference server, downloaded once and cached outside the repository.
"$(dirname "$0")/reference.sh" >/dev/null
echo "setup: ok"
