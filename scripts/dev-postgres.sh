#!/usr/bin/env bash
# A throwaway PostgreSQL server for development and tests.
#
#   scripts/dev-postgres.sh start [DIR [PORT]]  initdb into DIR/data, start the server on
#                                             127.0.0.1:PORT (a free port when none is given),
#                                             print `export` lines (CAIRN_PG_URL, ...); when
#                                             they go to a pipe (eval "$(... start)"), name
#                                             them on stderr
#   scripts/dev-postgres.sh env [DIR]         print the `export` lines of a running server again
#   scripts/dev-postgres.sh stop [DIR]        stop it (by its pid) and remove DIR
#   scripts/dev-postgres.sh standby DIR PRIMARY_DIR
#                                             a streaming standby of the server in PRIMARY_DIR
#                                             (pg_basebackup), made its synchronous standby:
#                                             from then on a commit on the primary returns only
#                                             once the standby has it; prints its `export` lines
#   scripts/dev-postgres.sh promote DIR       promotes the standby in DIR to a primary
#   scripts/dev-postgres.sh down DIR          stops the server in DIR (fast shutdown: its
#                                             clients are cut off) and keeps DIR: an outage
#   scripts/dev-postgres.sh up DIR            starts the server stopped by `down` again, on
#                                             the same port, with the same data
#
# DIR defaults to $CAIRN_PG_DIR or /tmp/cairn-dev-postgres. Everything lives in DIR: the
# cluster (DIR/data), its log (DIR/postgres.log), its Unix socket and lock file (DIR itself).
#
# Authentication: TCP connections (127.0.0.1 only) need a password (scram-sha-256): the
# superuser `cairn` has the password `cairn-dev-secret`, so a wrong password is refused as it
# would be in production; connections over the Unix socket in DIR are trusted (only this
# script uses it, to create the database). CAIRN_PG_URL names the database `cairn`.
#
# PostgreSQL refuses to run as root: as root the server runs as the `postgres` user (DIR is
# given to it); as anyone else it runs as that user. With CAIRN_PG_WATCH_PID set, the server
# stops when that process exits (tests). Installs `postgresql` with apt-get when no
# /usr/lib/postgresql/*/bin/initdb exists (needs root).
#
# TLS: the server offers TLS (and still accepts plain connections) with a certificate for
# 127.0.0.1 and localhost signed by a throwaway CA made in DIR/tls; CAIRN_PG_CA names that CA's
# PEM file and CAIRN_PG_OTHER_CA an unrelated CA (for refusals), so
# `...?sslmode=verify-full&sslrootcert=$CAIRN_PG_CA` checks the server as production would.
#
# Quick start:  eval "$(scripts/dev-postgres.sh start)"; echo "$CAIRN_PG_URL"
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CMD="${1:-}"
DIR="${2:-${CAIRN_PG_DIR:-${TMPDIR:-/tmp}/cairn-dev-postgres}}"
WANT_PORT="${3:-}"
PG_USER=cairn
PG_PASS=cairn-dev-secret
PG_DB=cairn

log() { echo "dev-postgres: $*" >&2; }
die() { log "$*"; exit 1; }

pg_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

ensure_installed() {
    [ -n "$(pg_bindir)" ] && return
    command -v apt-get >/dev/null 2>&1 || die "PostgreSQL is needed (no /usr/lib/postgresql/*/bin/initdb) and apt-get is not available"
    [ "$(id -u)" = 0 ] || die "PostgreSQL is needed (no /usr/lib/postgresql/*/bin/initdb): run as root or install the postgresql package"
    log "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends postgresql >&2
    [ -n "$(pg_bindir)" ] || die "postgresql installed but no /usr/lib/postgresql/*/bin/initdb"
}

# as_pg CMD...: runs a PostgreSQL program as the user that owns the cluster.
as_pg() {
    if [ "$(id -u)" = 0 ]; then
        (cd "$DIR" && runuser -u postgres -- "$@")
    else
        (cd "$DIR" && "$@")
    fi
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Ports are picked below the kernel's ephemeral range (see scripts/dev-ldap.sh).
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

# The postmaster's pid (first line of DIR/data/postmaster.pid) when it runs.
server_pid() {
    local f="$DIR/data/postmaster.pid" pid
    [ -f "$f" ] || return 1
    read -r pid < "$f" || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# The throwaway CA and the server's certificate (IP SAN 127.0.0.1, DNS localhost) in DIR/tls.
make_certs() {
    local c="$DIR/tls"
    mkdir -p "$c"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$c/ca.key" -out "$c/ca.pem" -days 7 \
        -subj "/CN=cairn dev-postgres CA" >/dev/null 2>&1 || die "openssl: CA"
    openssl req -newkey rsa:2048 -nodes -keyout "$c/server.key" -out "$c/server.csr" \
        -subj "/CN=127.0.0.1" >/dev/null 2>&1 || die "openssl: server key"
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n' > "$c/ext.cnf"
    openssl x509 -req -in "$c/server.csr" -CA "$c/ca.pem" -CAkey "$c/ca.key" -CAcreateserial \
        -out "$c/server.pem" -days 7 -extfile "$c/ext.cnf" >/dev/null 2>&1 || die "openssl: sign"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$c/other-ca.key" -out "$c/other-ca.pem" \
        -days 7 -subj "/CN=some other CA" >/dev/null 2>&1 || die "openssl: other CA"
    rm -f "$c/ca.key" "$c/other-ca.key" "$c/server.csr"
    chmod 600 "$c/server.key"
    [ "$(id -u)" = 0 ] && chown -R postgres "$c"
    chmod 755 "$c"; chmod 644 "$c/ca.pem" "$c/other-ca.pem" "$c/server.pem"
}

# pg_ctl start on a free (or the given) port: sets `port`.
start_server() {
    local bin="$1" attempt
    port=""
    for attempt in 1 2 3 4 5; do
        if [ -n "$WANT_PORT" ]; then port="$WANT_PORT"; else port=$(pick_port) || die "no free loopback port"; fi
        if as_pg "$bin/pg_ctl" -D "$DIR/data" -l "$DIR/postgres.log" -w -t 60 \
            -o "-p $port -k $DIR -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file=$DIR/tls/server.pem -c ssl_key_file=$DIR/tls/server.key" \
            start >/dev/null 2>&1; then
            return 0
        fi
        log "postgres did not start on port $port (attempt $attempt): $(tail -3 "$DIR/postgres.log" 2>/dev/null)"
        [ -n "$WANT_PORT" ] && die "giving up (port $WANT_PORT was asked for)"
    done
    die "giving up"
}

write_env() {
    local dead
    dead=$(pick_port) || die "no free loopback port"
    {
        exp CAIRN_PG_URL "postgres://$PG_USER:$PG_PASS@127.0.0.1:$port/$PG_DB?sslmode=disable"
        exp CAIRN_PG_DIR "$DIR"
        exp CAIRN_PG_HOST 127.0.0.1
        exp CAIRN_PG_PORT "$port"
        exp CAIRN_PG_USER "$PG_USER"
        exp CAIRN_PG_PASSWORD "$PG_PASS"
        exp CAIRN_PG_DB "$PG_DB"
        exp CAIRN_PG_CA "$DIR/tls/ca.pem"
        exp CAIRN_PG_OTHER_CA "$DIR/tls/other-ca.pem"
        exp CAIRN_PG_DEAD_URL "postgres://$PG_USER:$PG_PASS@127.0.0.1:$dead/$PG_DB?sslmode=disable&connect_timeout=5"
        exp CAIRN_PG_PID "$(server_pid)"
    } > "$DIR/env"
}

watch() {
    if [ -n "${CAIRN_PG_WATCH_PID:-}" ]; then
        local watched="$CAIRN_PG_WATCH_PID"
        (
            trap '' HUP
            while kill -0 "$watched" 2>/dev/null; do sleep 1; done
            "$HERE/dev-postgres.sh" stop "$DIR"
        ) </dev/null >/dev/null 2>&1 &
        echo $! > "$DIR/watcher.pid"
    fi
}

exp() { printf "export %s='%s'\n" "$1" "$2"; }

print_env() {
    [ -f "$DIR/env" ] || die "no server running in $DIR (run: $0 start)"
    cat "$DIR/env"
}

announce_env() {
    [ -t 1 ] && return
    log "exported CAIRN_PG_URL and $(( $(grep -c '^export ' "$DIR/env") - 1 )) more (\`$0 env $DIR\` prints them all)"
}

stop() {
    local pid
    if pid=$(server_pid); then
        # SIGINT: PostgreSQL's fast shutdown (clients are disconnected, then it exits).
        kill -INT "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    # The watcher runs this very script as its last command, which bash may exec in its
    # place (same pid): it must not kill itself before removing DIR.
    if alive "$DIR/watcher.pid" && [ "$(cat "$DIR/watcher.pid")" != "$$" ]; then
        kill "$(cat "$DIR/watcher.pid")" 2>/dev/null || true
    fi
    rm -rf "$DIR"
}

stop_cmd() {
    if server_pid >/dev/null; then
        stop
        log "stopped the server in $DIR (and removed it)"
    elif [ -e "$DIR" ]; then
        stop
        log "no server was running in $DIR; removed it"
    else
        log "no server was running in $DIR"
    fi
}

# Makes DIR (owned by the postgres user when run as root) and arms the clean-up on failure.
prepare_dir() {
    stop
    mkdir -p "$DIR"
    trap 'rc=$?; if [ "$rc" != 0 ]; then stop; fi' EXIT
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || die "no \`postgres\` user to run PostgreSQL as (install the postgresql package)"
        chown postgres "$DIR"
        chmod 700 "$DIR"
        runuser -u postgres -- test -w "$DIR" \
            || die "the postgres user cannot reach $DIR (a parent directory is closed to it): use a DIR under /tmp, or set TMPDIR"
    fi
}

finish_start() {
    write_env
    watch
    trap - EXIT
    log "postgres running: 127.0.0.1:$port (database $PG_DB, user $PG_USER), data in $DIR/data"
    print_env
    announce_env
}

start() {
    if server_pid >/dev/null && [ -f "$DIR/env" ]; then
        log "already running in $DIR"
        print_env
        announce_env
        return
    fi
    ensure_installed
    local bin
    bin=$(pg_bindir)
    prepare_dir
    printf '%s\n' "$PG_PASS" > "$DIR/pwfile"
    [ "$(id -u)" = 0 ] && chown postgres "$DIR/pwfile"
    as_pg "$bin/initdb" -D "$DIR/data" -U "$PG_USER" --pwfile="$DIR/pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C >"$DIR/initdb.log" 2>&1 \
        || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
    rm -f "$DIR/pwfile"
    # Only loopback TCP (password; replication too, for a standby) and the socket in DIR
    # (trusted).
    cat > "$DIR/data/pg_hba.conf" <<EOF
local all all trust
host all all 127.0.0.1/32 scram-sha-256
host replication all 127.0.0.1/32 scram-sha-256
EOF
    [ "$(id -u)" = 0 ] && chown postgres "$DIR/data/pg_hba.conf"
    make_certs
    start_server "$bin"
    as_pg "$bin/createdb" -h "$DIR" -p "$port" -U "$PG_USER" "$PG_DB" \
        || die "createdb $PG_DB failed"
    finish_start
}

# A streaming standby of the server in $1, then made the primary's synchronous standby.
standby() {
    local primary_dir="$1" bin pport
    [ -f "$primary_dir/env" ] || die "no server running in $primary_dir"
    ensure_installed
    bin=$(pg_bindir)
    pport=$(sed -n "s/^export CAIRN_PG_PORT='\(.*\)'$/\1/p" "$primary_dir/env")
    prepare_dir
    # The base backup carries the primary's configuration, pg_hba.conf included; -R writes
    # standby.signal and primary_conninfo (its application_name names it for the sync setting).
    PGPASSWORD="$PG_PASS" as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$pport" -U "$PG_USER" \
        -D "$DIR/data" -R -X stream -c fast -d "application_name=cairn_standby" \
        >"$DIR/basebackup.log" 2>&1 || { cat "$DIR/basebackup.log" >&2; die "pg_basebackup failed"; }
    # The same CA and certificate as the primary: one sslrootcert serves a multi-host URL.
    cp -a "$primary_dir/tls" "$DIR/tls"
    start_server "$bin"
    # From now on the primary's commits wait for this standby to have them.
    as_pg "$bin/psql" -h "$primary_dir" -p "$pport" -U "$PG_USER" -d "$PG_DB" -Atq \
        -c "ALTER SYSTEM SET synchronous_standby_names = 'cairn_standby'" \
        -c "SELECT pg_reload_conf()" >/dev/null || die "setting the synchronous standby failed"
    local i
    for i in $(seq 1 100); do
        if [ "$(as_pg "$bin/psql" -h "$primary_dir" -p "$pport" -U "$PG_USER" -d "$PG_DB" -Atq \
            -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'cairn_standby'")" = sync ]; then
            finish_start
            return
        fi
        sleep 0.1
    done
    die "the standby did not become synchronous within 10 s"
}

promote() {
    local bin
    bin=$(pg_bindir)
    server_pid >/dev/null || die "no server running in $DIR"
    as_pg "$bin/pg_ctl" -D "$DIR/data" -w -t 60 promote >/dev/null || die "promote failed"
    log "promoted the standby in $DIR"
}

# An outage of the server in DIR: stopped, data and port kept for `up`.
down() {
    local bin
    bin=$(pg_bindir)
    server_pid >/dev/null || die "no server running in $DIR"
    as_pg "$bin/pg_ctl" -D "$DIR/data" -m fast -w -t 60 stop >/dev/null || die "pg_ctl stop failed"
    log "stopped the server in $DIR (kept; \`$0 up $DIR\` starts it again)"
}

# The end of an outage: the server in DIR started again on the port it had.
up() {
    local bin
    bin=$(pg_bindir)
    [ -f "$DIR/env" ] || die "no server was started in $DIR (run: $0 start)"
    server_pid >/dev/null && die "the server in $DIR is running"
    WANT_PORT=$(sed -n "s/^export CAIRN_PG_PORT='\(.*\)'$/\1/p" "$DIR/env")
    start_server "$bin"
    sed -i "s/^export CAIRN_PG_PID=.*/export CAIRN_PG_PID='$(server_pid)'/" "$DIR/env"
    log "postgres running again: 127.0.0.1:$port"
    print_env
}

case "$CMD" in
    start) start ;;
    down) down ;;
    up) up ;;
    stop) stop_cmd ;;
    env) print_env ;;
    standby) [ -n "${3:-}" ] || { echo "usage: $0 standby DIR PRIMARY_DIR" >&2; exit 2; }
        WANT_PORT=""; standby "$3" ;;
    promote) promote ;;
    *) echo "usage: $0 start|stop|env|standby|promote [DIR [PORT|PRIMARY_DIR]]" >&2; exit 2 ;;
esac
