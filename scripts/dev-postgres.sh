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
    printf '%s\n' "$PG_PASS" > "$DIR/pwfile"
    [ "$(id -u)" = 0 ] && chown postgres "$DIR/pwfile"
    as_pg "$bin/initdb" -D "$DIR/data" -U "$PG_USER" --pwfile="$DIR/pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C >"$DIR/initdb.log" 2>&1 \
        || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
    rm -f "$DIR/pwfile"
    # Only loopback TCP (password) and the socket in DIR (trusted).
    cat > "$DIR/data/pg_hba.conf" <<EOF
local all all trust
host all all 127.0.0.1/32 scram-sha-256
EOF
    [ "$(id -u)" = 0 ] && chown postgres "$DIR/data/pg_hba.conf"
    local attempt port=""
    for attempt in 1 2 3 4 5; do
        if [ -n "$WANT_PORT" ]; then port="$WANT_PORT"; else port=$(pick_port) || die "no free loopback port"; fi
        if as_pg "$bin/pg_ctl" -D "$DIR/data" -l "$DIR/postgres.log" -w -t 60 \
            -o "-p $port -k $DIR -c listen_addresses=127.0.0.1" start >/dev/null 2>&1; then
            break
        fi
        log "postgres did not start on port $port (attempt $attempt): $(tail -3 "$DIR/postgres.log" 2>/dev/null)"
        [ -n "$WANT_PORT" ] && die "giving up (port $WANT_PORT was asked for)"
        [ "$attempt" = 5 ] && die "giving up"
    done
    as_pg "$bin/createdb" -h "$DIR" -p "$port" -U "$PG_USER" "$PG_DB" \
        || die "createdb $PG_DB failed"
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
        exp CAIRN_PG_DEAD_URL "postgres://$PG_USER:$PG_PASS@127.0.0.1:$dead/$PG_DB?sslmode=disable&connect_timeout=5"
        exp CAIRN_PG_PID "$(server_pid)"
    } > "$DIR/env"
    if [ -n "${CAIRN_PG_WATCH_PID:-}" ]; then
        local watched="$CAIRN_PG_WATCH_PID"
        (
            trap '' HUP
            while kill -0 "$watched" 2>/dev/null; do sleep 1; done
            "$HERE/dev-postgres.sh" stop "$DIR"
        ) </dev/null >/dev/null 2>&1 &
        echo $! > "$DIR/watcher.pid"
    fi
    trap - EXIT
    log "postgres running: 127.0.0.1:$port (database $PG_DB, user $PG_USER), data in $DIR/data"
    print_env
    announce_env
}

case "$CMD" in
    start) start ;;
    stop) stop_cmd ;;
    env) print_env ;;
    *) echo "usage: $0 start|stop|env [DIR [PORT]]" >&2; exit 2 ;;
esac
