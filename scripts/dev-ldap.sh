#!/usr/bin/env bash
# A throwaway OpenLDAP directory for development and tests.
#
#   scripts/dev-ldap.sh start [DIR]   start slapd on free loopback ports, load the sample
#                                     directory (scripts/ldap/directory.ldif), print `export`
#                                     lines (URLs, bind credentials, certificate files); when
#                                     they go to a pipe (eval "$(... start)"), name them on
#                                     stderr
#   scripts/dev-ldap.sh env [DIR]     print the `export` lines of a running directory again
#   scripts/dev-ldap.sh stop [DIR]    stop it (by pid) and remove DIR
#
# DIR defaults to $CAIRN_LDAP_DIR or /tmp/cairn-dev-ldap. Two slapd instances run from it:
# the main one (ldap:// with StartTLS, and ldaps://; client certificates optional) and a
# mutual-TLS one (ldaps:// that demands a client certificate). A throwaway CA signs the
# server certificate (SAN 127.0.0.1, localhost) and a client certificate.
# With CAIRN_LDAP_WATCH_PID set, both instances stop when that process exits (tests).
# Installs slapd, ldap-utils and openssl with apt-get when they are missing (needs root).
#
# Quick start:  eval "$(scripts/dev-ldap.sh start)"; echo "$CAIRN_LDAP_URL"
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="$HERE/ldap"
CMD="${1:-}"
DIR="${2:-${CAIRN_LDAP_DIR:-${TMPDIR:-/tmp}/cairn-dev-ldap}}"
SCHEMA=/etc/ldap/schema
MODULES=/usr/lib/ldap
BASE="dc=cairn,dc=test"
ADMIN_DN="cn=admin,$BASE"
ADMIN_PW="admin-secret"

log() { echo "dev-ldap: $*" >&2; }
die() { log "$*"; exit 1; }

slapd_bin() {
    if command -v slapd >/dev/null 2>&1; then command -v slapd; elif [ -x /usr/sbin/slapd ]; then echo /usr/sbin/slapd; fi
}

ensure_installed() {
    if [ -n "$(slapd_bin)" ] && command -v ldapadd >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1; then
        return
    fi
    command -v apt-get >/dev/null 2>&1 || die "slapd, ldap-utils and openssl are needed and apt-get is not available"
    [ "$(id -u)" = 0 ] || die "slapd, ldap-utils and openssl are needed: run as root or install them"
    log "installing slapd ldap-utils openssl"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends slapd ldap-utils openssl >&2
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Ports are picked below the kernel's ephemeral range: a port in it may be the local end of
# some outgoing connection (slapd's bind then fails although nothing listens there).
PORT_LO=20000
PORT_HI=30000
if read -r eph_lo _ < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null && [ "$eph_lo" -gt 12000 ]; then
    PORT_HI=$((eph_lo - 1))
    PORT_LO=$((PORT_HI - 10000 > 10000 ? PORT_HI - 10000 : 10000))
fi
PICKED=" "
pick_port() {
    local p i
    for i in $(seq 1 500); do
        p=$(( (RANDOM * 7 + i) % (PORT_HI - PORT_LO) + PORT_LO ))
        case "$PICKED" in *" $p "*) continue ;; esac
        if port_free "$p"; then PICKED="$PICKED$p "; echo "$p"; return 0; fi
    done
    return 1
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

make_certs() {
    local c="$DIR/certs"
    [ -f "$c/client.pem" ] && return
    mkdir -p "$c"
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout "$c/ca.key" -out "$c/ca.pem" -days 30 \
        -subj "/CN=Cairn Test CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    for who in server client; do
        local cn usage san=""
        if [ "$who" = server ]; then
            cn=localhost; usage=serverAuth; san="subjectAltName=IP:127.0.0.1,DNS:localhost"
        else
            cn=cairn-client; usage=clientAuth
        fi
        openssl req "${ec[@]}" -keyout "$c/$who.key" -out "$c/$who.csr" -subj "/CN=$cn" 2>/dev/null
        printf '%s\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n' \
            "$san" "$usage" > "$c/$who.ext"
        openssl x509 -req -in "$c/$who.csr" -CA "$c/ca.pem" -CAkey "$c/ca.key" \
            -CAserial "$c/ca.srl" -CAcreateserial -days 30 -extfile "$c/$who.ext" \
            -out "$c/$who.pem" 2>/dev/null
    done
    chmod 600 "$c"/*.key
}

# start_instance NAME VERIFY URLS
start_instance() {
    local name="$1" verify="$2" urls="$3" run="$DIR/$1"
    rm -rf "$run"
    mkdir -p "$run/db"
    sed -e "s|@RUN@|$run|g" -e "s|@SCHEMA@|$SCHEMA|g" -e "s|@MODULES@|$MODULES|g" \
        -e "s|@CERTS@|$DIR/certs|g" -e "s|@VERIFY@|$verify|g" \
        "$DATA/slapd.conf.in" > "$run/slapd.conf"
    local rc=0
    "$(slapd_bin)" -f "$run/slapd.conf" -h "$urls" -n "cairn-ldap-$name" \
        </dev/null >"$run/slapd.log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        echo "$name: slapd exited with status $rc" >> "$run/slapd.log"
        return 1
    fi
    local i
    for i in $(seq 1 100); do
        if alive "$run/slapd.pid"; then return 0; fi
        sleep 0.1
    done
    echo "$name: no running slapd after 10 s" >> "$run/slapd.log"
    return 1
}

wait_ready() {
    local url="$1" i
    # Up to 30 s: a loaded machine (parallel builds) can be slow to schedule slapd.
    for i in $(seq 1 300); do
        if LDAPTLS_REQCERT=never ldapwhoami -x -H "$url" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    return 1
}

load() {
    local url="$1"
    LDAPTLS_REQCERT=never ldapadd -x -H "$url" -D "$ADMIN_DN" -w "$ADMIN_PW" \
        -f "$DATA/directory.ldif" >"$DIR/load.log" 2>&1 || { cat "$DIR/load.log" >&2; return 1; }
}

# exp NAME VALUE: one `export NAME='VALUE'` line (values never contain a quote).
exp() { printf "export %s='%s'\n" "$1" "$2"; }

print_env() {
    [ -f "$DIR/env" ] || die "no directory running in $DIR (run: $0 start)"
    cat "$DIR/env"
}

# Under `eval "$(scripts/dev-ldap.sh start)"` the export lines go to eval, not to the
# terminal: say on stderr what was exported.
announce_env() {
    [ -t 1 ] && return
    local n
    n=$(grep -c '^export ' "$DIR/env")
    log "exported CAIRN_LDAP_URL, CAIRN_LDAP_BASE, CAIRN_LDAP_BINDDN, CAIRN_LDAP_BINDPASS and" \
        "$((n - 4)) more (\`$0 env\` prints them all)"
}

stop() {
    local f pid
    for f in "$DIR"/main/slapd.pid "$DIR"/mtls/slapd.pid; do
        if alive "$f"; then
            pid="$(cat "$f")"
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
    if alive "$DIR/watcher.pid"; then kill "$(cat "$DIR/watcher.pid")" 2>/dev/null || true; fi
    rm -rf "$DIR"
}

# `stop` as a command: says what it stopped.
stop_cmd() {
    if alive "$DIR/main/slapd.pid" || alive "$DIR/mtls/slapd.pid"; then
        stop
        log "stopped the directory in $DIR (and removed it)"
    elif [ -e "$DIR" ]; then
        stop
        log "no directory was running in $DIR; removed it"
    else
        log "no directory was running in $DIR"
    fi
}

start() {
    if alive "$DIR/main/slapd.pid" && [ -f "$DIR/env" ]; then
        log "already running in $DIR"
        print_env
        announce_env
        return
    fi
    ensure_installed
    [ -f "$SCHEMA/inetorgperson.schema" ] || die "OpenLDAP schemas not found in $SCHEMA"
    stop
    mkdir -p "$DIR"
    # Whatever fails from here on leaves nothing running.
    trap 'rc=$?; if [ "$rc" != 0 ]; then stop; fi' EXIT
    make_certs
    local attempt ldap ldaps mtls dead
    for attempt in 1 2 3 4 5; do
        ldap=$(pick_port) && ldaps=$(pick_port) && mtls=$(pick_port) && dead=$(pick_port) \
            || die "no free loopback ports"
        if start_instance main allow "ldap://127.0.0.1:$ldap/ ldaps://127.0.0.1:$ldaps/" &&
            start_instance mtls demand "ldaps://127.0.0.1:$mtls/"; then
            if wait_ready "ldap://127.0.0.1:$ldap"; then
                break
            fi
            echo "main: slapd does not answer on ldap://127.0.0.1:$ldap" >> "$DIR/main/slapd.log"
        fi
        log "slapd did not start (attempt $attempt): $(cat "$DIR"/*/slapd.log 2>/dev/null | tail -3)"
        for f in "$DIR"/main/slapd.pid "$DIR"/mtls/slapd.pid; do
            if alive "$f"; then kill "$(cat "$f")" 2>/dev/null || true; fi
        done
        [ "$attempt" = 5 ] && die "giving up"
    done
    load "ldap://127.0.0.1:$ldap" || die "loading the sample directory failed"
    # The mutual-TLS instance has its own database: load it through its own port.
    LDAPTLS_CACERT="$DIR/certs/ca.pem" LDAPTLS_CERT="$DIR/certs/client.pem" \
        LDAPTLS_KEY="$DIR/certs/client.key" load "ldaps://127.0.0.1:$mtls" ||
        die "loading the mutual-TLS directory failed"
    {
        exp CAIRN_LDAP_DIR "$DIR"
        exp CAIRN_LDAP_URL "ldap://127.0.0.1:$ldap"
        exp CAIRN_LDAPS_URL "ldaps://127.0.0.1:$ldaps"
        exp CAIRN_LDAPS_MTLS_URL "ldaps://127.0.0.1:$mtls"
        exp CAIRN_LDAP_DEAD_URL "ldap://127.0.0.1:$dead"
        exp CAIRN_LDAP_BASE "$BASE"
        exp CAIRN_LDAP_BINDDN "cn=reader,ou=service,$BASE"
        exp CAIRN_LDAP_BINDPASS "reader-secret"
        exp CAIRN_LDAP_ADMIN_DN "$ADMIN_DN"
        exp CAIRN_LDAP_ADMIN_PASS "$ADMIN_PW"
        exp CAIRN_LDAP_CA "$DIR/certs/ca.pem"
        exp CAIRN_LDAP_CLIENT_CERT "$DIR/certs/client.pem"
        exp CAIRN_LDAP_CLIENT_KEY "$DIR/certs/client.key"
        exp CAIRN_LDAP_SIZE_LIMIT 50
        exp CAIRN_LDAP_PID "$(cat "$DIR/main/slapd.pid")"
        exp CAIRN_LDAP_MTLS_PID "$(cat "$DIR/mtls/slapd.pid")"
    } > "$DIR/env"
    if [ -n "${CAIRN_LDAP_WATCH_PID:-}" ]; then
        local watched="$CAIRN_LDAP_WATCH_PID"
        (
            trap '' HUP
            while kill -0 "$watched" 2>/dev/null; do sleep 1; done
            "$HERE/dev-ldap.sh" stop "$DIR"
        ) </dev/null >/dev/null 2>&1 &
        echo $! > "$DIR/watcher.pid"
    fi
    trap - EXIT
    log "slapd running: ldap://127.0.0.1:$ldap (StartTLS), ldaps://127.0.0.1:$ldaps, mutual TLS ldaps://127.0.0.1:$mtls"
    print_env
    announce_env
}

case "$CMD" in
    start) start ;;
    stop) stop_cmd ;;
    env) print_env ;;
    *) echo "usage: $0 start|stop|env [DIR]" >&2; exit 2 ;;
esac
