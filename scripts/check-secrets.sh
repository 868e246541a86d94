#!/usr/bin/env bash
# Fails when any log line written by a server during the end-to-end tests contains one of
# the secrets the tests handled (tokens, passwords, bind passwords, key shares, OTPs).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/debug/e2e-logs}"
[ -d "$dir" ] || { echo "check-secrets: no logs in $dir (run the e2e tests first)" >&2; exit 1; }
secrets="$dir/secrets.txt"
[ -s "$secrets" ] || { echo "check-secrets: no secrets recorded in $secrets" >&2; exit 1; }
logs=("$dir"/*.log)
lines=$(cat "${logs[@]}" | wc -l)
# Patterns shorter than 6 characters (or empty lines from a torn append) would match
# everything; the harness never records such secrets.
patterns=$(mktemp)
trap 'rm -f "$patterns"' EXIT
awk 'length($0) >= 6' "$secrets" | sort -u >"$patterns"
n=$(wc -l <"$patterns")
if hits=$(grep -F -n -f "$patterns" "${logs[@]}"); then
  echo "check-secrets: FAILED: secrets found in server logs:" >&2
  printf '%s\n' "$hits" | awk 'NR <= 20' >&2
  exit 1
fi
echo "check-secrets: $n secrets checked against $lines log lines in ${#logs[@]} files: none found"
