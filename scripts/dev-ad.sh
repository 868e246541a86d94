#!/usr/bin/env bash
# A throwaway Active Directory domain controller (Samba 4) for development and tests.
#
#   scripts/dev-ad.sh start DIR   provision a domain (realm CAIRN.TEST) into DIR, seed users
#                                 and groups, start samba on a loopback address of its own
#                                 (127.0.0.x), wait until LDAP answers, print `export` lines
#   scripts/dev-ad.sh env DIR     print the `export` lines of a running DC again
#   scripts/dev-ad.sh stop DIR    stop it (SIGTERM by pid, then wait), remove the loopback
#                                 address it added, remove DIR
#
# Samba's ports (389, 636, 88, ...) cannot be changed, so each DC gets an address of its own:
# the first 127.0.0.x (x in 2..254) that no interface has and nothing listens on; it is added
# to `lo` (needs root). A throwaway CA signs the DC's certificate (IP SAN = that address).
# Nothing is written outside DIR (pid files, sockets, logs, the domain's database all live
# in it). Installs samba, samba-ad-dc, winbind, ldap-utils and krb5-user with apt-get when
# missing (needs root).
#
# Seeded domain (base DC=cairn,DC=test, UPN suffix cairn.test, every user under CN=Users):
#   alice   Alice-Pass1!  in eng (eng is nested in all-staff)
#   bob     Bob-Pass1!    in ops
#   carol   Carol-Pass1!  disabled                          -> bind fails with data 533
#   dave    Dave-Pass1!   must change password at next login -> data 773
#   frank   Frank-Pass1!  for lockout tests (threshold 3)   -> data 775 once locked
#   gina    Gina-Pass1!   account expired                   -> data 701
#   erin    Erin-Pass1!   password expired (made with faketime; passwords expire after 2 days)
#                                                            -> data 532
#   "o'brien jr"  Obrien-Pass1!  a name with a space and a quote, in eng
#   svc-cairn  Svc-Pass1!  a service account for binddn
#   grp-000..grp-019 twenty groups alice is in (for paged group searches)
# With CAIRN_AD_WATCH_PID set, the DC stops when that process exits (tests).
#
# Quick start:  eval "$(scripts/dev-ad.sh start /tmp/ad)"; echo "$AD_URL"
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CMD="${1:-}"
DIR="${2:-${CAIRN_AD_DIR:-${TMPDIR:-/tmp}/cairn-dev-ad}}"
REALM=CAIRN.TEST
DOMAIN=cairn.test
BASE="DC=cairn,DC=test"
ADMIN_PASS='Adm1n-Pass!'

log() { echo "dev-ad: $*" >&2; }
die() { log "$*"; exit 1; }

ensure_installed() {
    if command -v samba >/dev/null 2>&1 && command -v samba-tool >/dev/null 2>&1 &&
        command -v ldapsearch >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1; then
        ensure_faketime
        return
    fi
    command -v apt-get >/dev/null 2>&1 || die "samba (AD DC) and ldap-utils are needed and apt-get is not available"
    [ "$(id -u)" = 0 ] || die "samba and ldap-utils are needed: run as root or install them"
    log "installing samba samba-ad-dc winbind ldap-utils krb5-user"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q samba samba-ad-dc winbind ldap-utils krb5-user openssl >&2 || {
        apt-get update -q >&2
        apt-get install -y -q samba samba-ad-dc winbind ldap-utils krb5-user openssl >&2
    }
    ensure_faketime
}

# faketime (65 kB) makes the password-expired user; without it that user is left out.
ensure_faketime() {
    command -v faketime >/dev/null 2>&1 && return
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime >&2 || log "faketime not installed: no password-expired user"
}

addr_in_use() {
    ip -o addr show | grep -q " inet $1/" && return 0
    (exec 3<>"/dev/tcp/$1/389") 2>/dev/null && return 0
    return 1
}

pick_addr() {
    local x
    for x in $(seq 2 254); do
        if ! addr_in_use "127.0.0.$x"; then echo "127.0.0.$x"; return 0; fi
    done
    return 1
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

make_certs() {
    local c="$DIR/tls" addr="$1"
    mkdir -p "$c"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$c/ca.key" -out "$c/ca.pem" -days 7 \
        -subj '/CN=cairn test AD CA' \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout "$c/key.pem" -out "$c/req.csr" \
        -subj "/CN=dc1.$DOMAIN" 2>/dev/null
    printf 'subjectAltName=DNS:dc1.%s,DNS:localhost,IP:%s\nextendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\n' \
        "$DOMAIN" "$addr" > "$c/ext.cnf"
    openssl x509 -req -in "$c/req.csr" -CA "$c/ca.pem" -CAkey "$c/ca.key" -CAcreateserial \
        -out "$c/cert.pem" -days 7 -extfile "$c/ext.cnf" 2>/dev/null
    # A second, unrelated CA: what a client that trusts the wrong CA has.
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$c/other-ca.key" -out "$c/other-ca.pem" \
        -days 7 -subj '/CN=some other CA' 2>/dev/null
    chmod 600 "$c"/*.key "$c/key.pem"
}

provision() {
    local addr="$1"
    mkdir -p "$DIR/run" "$DIR/log"
    samba-tool domain provision -s /dev/null \
        --realm="$REALM" --domain=CAIRN --server-role=dc --dns-backend=NONE --use-rfc2307 \
        --adminpass="$ADMIN_PASS" --host-name=dc1 --targetdir="$DIR" \
        --option="interfaces=$addr" --option="bind interfaces only=yes" \
        --option="server services=ldap kdc" \
        --option="pid directory=$DIR/run" --option="ncalrpc dir=$DIR/run/ncalrpc" \
        --option="winbindd socket directory=$DIR/run/winbindd" \
        --option="ntp signd socket directory=$DIR/run/ntp_signd" \
        --option="log file=$DIR/log/samba.log" \
        --option="tls keyfile=$DIR/tls/key.pem" --option="tls certfile=$DIR/tls/cert.pem" \
        --option="tls cafile=$DIR/tls/ca.pem" >"$DIR/provision.log" 2>&1 ||
        { tail -20 "$DIR/provision.log" >&2; return 1; }
}

seed() {
    local S=(-s "$DIR/etc/smb.conf") out="$DIR/seed.log"
    st() { samba-tool "$@" "${S[@]}" >>"$out" 2>&1 || { tail -5 "$out" >&2; return 1; }; }
    st_faketime() { faketime -f "$FAKETIME" samba-tool "$@" "${S[@]}" >>"$out" 2>&1 || { tail -5 "$out" >&2; return 1; }; }
    st domain passwordsettings set --complexity=off --history-length=0 \
        --min-pwd-age=0 --max-pwd-age=2 --min-pwd-length=0 --account-lockout-threshold=3 \
        --account-lockout-duration=30 --reset-account-lockout-after=30
    st user create alice 'Alice-Pass1!' --use-username-as-cn --given-name=Alice --surname=Liddell
    st user create bob 'Bob-Pass1!'
    st user create carol 'Carol-Pass1!'
    st user create dave 'Dave-Pass1!'
    st user create frank 'Frank-Pass1!'
    st user create gina 'Gina-Pass1!'
    st user create "o'brien jr" 'Obrien-Pass1!'
    st user create svc-cairn 'Svc-Pass1!'
    # Passwords expire after 2 days (Samba treats 1 day or less as never): erin's was set 3
    # days ago.
    if command -v faketime >/dev/null 2>&1; then
        FAKETIME='-3d' st_faketime user create erin 'Erin-Pass1!'
    fi
    st user disable carol
    st user setpassword dave --newpassword='Dave-Pass1!' --must-change-at-next-login
    st user setexpiry gina --days=0
    st group add eng
    st group add ops
    st group add all-staff
    st group addmembers all-staff eng
    st group addmembers eng "alice,o'brien jr"
    st group addmembers ops bob
    # Twenty more groups alice is in, added over LDAP in one go (samba-tool per group is slow).
    local i ldif="$DIR/groups.ldif"
    : > "$ldif"
    for i in $(seq -w 0 19); do
        printf 'dn: CN=grp-0%s,CN=Users,%s\nobjectClass: group\nsAMAccountName: grp-0%s\nmember: CN=alice,CN=Users,%s\n\n' \
            "$i" "$BASE" "$i" "$BASE" >> "$ldif"
    done
    echo "$ldif"
}

start_samba() {
    samba -F --debug-stdout -M single -s "$DIR/etc/smb.conf" </dev/null >"$DIR/samba.out" 2>&1 &
    echo $! > "$DIR/samba.pid"
}

wait_ready() {
    local addr="$1" pid i
    pid="$(cat "$DIR/samba.pid")"
    # Up to 30 s: a loaded machine can be slow to schedule samba.
    for i in $(seq 1 600); do
        if ldapsearch -x -H "ldap://$addr" -s base -b '' dnsHostName >/dev/null 2>&1; then return 0; fi
        kill -0 "$pid" 2>/dev/null || { tail -20 "$DIR/samba.out" >&2; return 1; }
        sleep 0.05
    done
    return 1
}

exp() { printf "export %s='%s'\n" "$1" "$2"; }

print_env() {
    [ -f "$DIR/env" ] || die "no DC running in $DIR (run: $0 start $DIR)"
    cat "$DIR/env"
}

stop() {
    local pid
    if alive "$DIR/samba.pid"; then
        pid="$(cat "$DIR/samba.pid")"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    if alive "$DIR/watcher.pid"; then kill "$(cat "$DIR/watcher.pid")" 2>/dev/null || true; fi
    if [ -f "$DIR/added-addr" ]; then
        ip addr del "$(cat "$DIR/added-addr")/8" dev lo 2>/dev/null || true
    fi
    rm -rf "$DIR"
}

stop_cmd() {
    if alive "$DIR/samba.pid"; then
        stop
        log "stopped the DC in $DIR (and removed it)"
    elif [ -e "$DIR" ]; then
        stop
        log "no DC was running in $DIR; removed it"
    else
        log "no DC was running in $DIR"
    fi
}

start() {
    if alive "$DIR/samba.pid" && [ -f "$DIR/env" ]; then
        log "already running in $DIR"
        print_env
        return
    fi
    [ "$(id -u)" = 0 ] || die "a Samba DC needs root (its own loopback address, ports 389/636)"
    ensure_installed
    stop
    mkdir -p "$DIR"
    DIR="$(cd "$DIR" && pwd)"
    trap 'rc=$?; if [ "$rc" != 0 ]; then stop; fi' EXIT
    local t0 addr ldif
    t0=$(date +%s.%N)
    addr="$(pick_addr)" || die "no free loopback address 127.0.0.2..254"
    if ! ip -o addr show dev lo | grep -q " inet $addr/"; then
        ip addr add "$addr/8" dev lo
        echo "$addr" > "$DIR/added-addr"
    fi
    make_certs "$addr"
    provision "$addr" || die "provisioning failed (see $DIR/provision.log)"
    # Simple binds over plain ldap:// too (StartTLS is still offered).
    sed -i 's/^\[global\]$/[global]\n\tldap server require strong auth = no/' "$DIR/etc/smb.conf"
    ldif="$(seed)" || die "seeding failed (see $DIR/seed.log)"
    start_samba
    wait_ready "$addr" || die "samba does not answer on ldap://$addr (see $DIR/samba.out)"
    LDAPTLS_CACERT="$DIR/tls/ca.pem" ldapadd -x -H "ldaps://$addr" \
        -D "CN=Administrator,CN=Users,$BASE" -w "$ADMIN_PASS" -f "$ldif" >>"$DIR/seed.log" 2>&1 ||
        die "adding the paging groups failed (see $DIR/seed.log)"
    {
        exp AD_DIR "$DIR"
        exp AD_ADDR "$addr"
        exp AD_URL "ldaps://$addr"
        exp AD_LDAP_URL "ldap://$addr"
        exp AD_CA "$DIR/tls/ca.pem"
        exp AD_OTHER_CA "$DIR/tls/other-ca.pem"
        exp AD_BASE "$BASE"
        exp AD_DOMAIN "$DOMAIN"
        exp AD_ADMIN_DN "CN=Administrator,CN=Users,$BASE"
        exp AD_ADMIN_PASS "$ADMIN_PASS"
        exp AD_BINDDN "CN=svc-cairn,CN=Users,$BASE"
        exp AD_BINDPASS "Svc-Pass1!"
        exp AD_PID "$(cat "$DIR/samba.pid")"
        exp AD_EXPIRED_USER "$(command -v faketime >/dev/null 2>&1 && echo erin || true)"
    } > "$DIR/env"
    if [ -n "${CAIRN_AD_WATCH_PID:-}" ]; then
        local watched="$CAIRN_AD_WATCH_PID"
        (
            trap '' HUP
            while kill -0 "$watched" 2>/dev/null; do sleep 1; done
            # bash may exec the last command in place of this subshell: `stop` must not
            # take it for a watcher to kill.
            rm -f "$DIR/watcher.pid"
            "$HERE/dev-ad.sh" stop "$DIR"
        ) </dev/null >/dev/null 2>&1 &
        echo $! > "$DIR/watcher.pid"
    fi
    trap - EXIT
    log "samba AD DC running: ldaps://$addr (and ldap:// with StartTLS), base $BASE; ready in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
    print_env
}

case "$CMD" in
    start) start ;;
    stop) stop_cmd ;;
    env) print_env ;;
    *) echo "usage: $0 start|stop|env DIR" >&2; exit 2 ;;
esac
