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
n=$(sort -u "$secrets" | wc -l)
if hits=$(grep -F -n -f <(sort -u "$secrets") "${logs[@]}"); then
  echo "check-secrets: FAILED: secrets found in server logs:" >&2
  echo "$hits" | head -20 >&2
  exit 1
fi
echo "check-secrets: $n secrets checked against $lines log lines in ${#logs[@]} files: none found"
