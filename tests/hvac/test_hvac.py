#!/usr/bin/env python3
"""Drives a running Cairn server with the unmodified hvac client (Vault's Python client).

Environment: CAIRN_ADDR (http://127.0.0.1:8200), CAIRN_TOKEN (a root token).
Optional, for a real LDAP login (e.g. against the project's dev slapd):
CAIRN_HVAC_LDAP_URL, CAIRN_HVAC_LDAP_USERDN, CAIRN_HVAC_LDAP_USERATTR (default uid),
CAIRN_HVAC_LDAP_GROUPDN, CAIRN_HVAC_LDAP_BINDDN, CAIRN_HVAC_LDAP_BINDPASS,
CAIRN_HVAC_LDAP_USER, CAIRN_HVAC_LDAP_PASSWORD, CAIRN_HVAC_LDAP_GROUP (a group the user is in).

Each check runs on its own; the script prints one line per check and exits 1 if any failed.
LDAP checks are skipped only when the server answers 404 for auth/ldap/config.
"""

import importlib.metadata
import os
import sys
import traceback

import hvac
import requests
from hvac import exceptions

ADDR = os.environ.get("CAIRN_ADDR", "http://127.0.0.1:8200")
TOKEN = os.environ.get("CAIRN_TOKEN", "")

CHECKS = []


class Skip(Exception):
    """Raised by a check that cannot run against this server."""


def check(fn):
    CHECKS.append(fn)
    return fn


def client(token=TOKEN, **kw):
    return hvac.Client(url=ADDR, token=token, **kw)


def eq(got, want, what):
    if got != want:
        raise AssertionError("%s: got %r, want %r" % (what, got, want))


def as_list(v):
    """Policies and groups may come back as a list or a comma-separated string."""
    if v is None:
        return []
    if isinstance(v, str):
        return [p.strip() for p in v.split(",") if p.strip()]
    return list(v)


def ldap_available():
    r = requests.get(
        ADDR + "/v1/auth/ldap/config", headers={"X-Vault-Token": TOKEN}, timeout=30
    )
    if r.status_code == 404:
        raise Skip("auth/ldap/config answers 404 (LDAP endpoints not implemented yet)")


# --- sys -------------------------------------------------------------------------------


@check
def health_and_init_status():
    c = client(token=None)
    h = c.sys.read_health_status(method="GET")
    eq(h["initialized"], True, "health initialized")
    eq(h["sealed"], False, "health sealed")
    eq(h["standby"], False, "health standby")
    head = c.sys.read_health_status()  # HEAD by default
    eq(head.status_code, 200, "HEAD sys/health status")
    # The connection is still usable after a HEAD answer.
    eq(c.sys.is_initialized(), True, "sys.is_initialized")
    eq(c.sys.read_init_status()["initialized"], True, "sys.read_init_status")
    eq(c.sys.is_sealed(), False, "sys.is_sealed")
    st = c.sys.read_seal_status()
    eq(st["sealed"], False, "seal status sealed")
    eq(st["type"], "shamir", "seal status type")
    code = c.sys.read_health_status(method="GET", active_code=299)
    eq(code.status_code, 299, "health activecode")


# --- tokens ----------------------------------------------------------------------------


@check
def token_lookup_create_renew_revoke():
    c = client()
    eq(c.is_authenticated(), True, "is_authenticated")
    me = c.auth.token.lookup_self()
    if "root" not in me["data"]["policies"]:
        raise AssertionError("lookup_self policies: %r" % me["data"]["policies"])
    created = c.auth.token.create(policies=["default"], ttl="1h")
    tok = created["auth"]["client_token"]
    eq(created["auth"]["policies"], ["default"], "create policies")
    looked = c.auth.token.lookup(tok)
    eq(looked["data"]["id"], tok, "lookup id")
    renewed = c.auth.token.renew(tok, increment="30m")
    eq(renewed["auth"]["client_token"], tok, "renew client_token")
    child = client(token=tok)
    eq(child.auth.token.lookup_self()["data"]["id"], tok, "child lookup_self")
    c.auth.token.revoke(tok)
    eq(child.is_authenticated(), False, "revoked token is not authenticated")
    try:
        client(token="not-a-token").auth.token.lookup_self()
        raise AssertionError("a bad token was accepted")
    except exceptions.Forbidden:
        pass


# --- KV v1 -----------------------------------------------------------------------------


@check
def kv_v1_write_read_list_delete():
    c = client()
    kv = c.secrets.kv.v1
    kv.create_or_update_secret(path="hvac/app", secret={"user": "alice", "n": 1})
    kv.create_or_update_secret(path="hvac/app", secret={"user": "bob", "n": 2})
    kv.create_or_update_secret(path="hvac/sub/x", secret={"k": "v"}, method="POST")
    got = kv.read_secret(path="hvac/app")
    eq(got["data"], {"user": "bob", "n": 2}, "read_secret data")
    eq(sorted(kv.list_secrets(path="hvac")["data"]["keys"]), ["app", "sub/"], "list_secrets")
    # The same list through GET ?list=true (hvac's strict_http mode).
    strict = client(strict_http=True)
    eq(
        sorted(strict.secrets.kv.v1.list_secrets(path="hvac")["data"]["keys"]),
        ["app", "sub/"],
        "list_secrets (strict_http)",
    )
    kv.delete_secret(path="hvac/app")
    try:
        kv.read_secret(path="hvac/app")
        raise AssertionError("deleted secret still readable")
    except exceptions.InvalidPath:
        pass


@check
def kv_v2_versions_patch_delete_undelete_destroy_metadata():
    c = client()
    c.sys.enable_secrets_engine("kv", path="hvac-kv2", options={"version": "2"})
    kv = c.secrets.kv.v2
    m = "hvac-kv2"
    r = kv.create_or_update_secret(path="app", secret={"user": "alice"}, mount_point=m)
    eq(r["data"]["version"], 1, "create_or_update_secret version")
    kv.create_or_update_secret(path="app", secret={"user": "bob"}, cas=1, mount_point=m)
    try:
        kv.create_or_update_secret(path="app", secret={"user": "eve"}, cas=1, mount_point=m)
        raise AssertionError("a stale check-and-set was accepted")
    except exceptions.InvalidRequest:
        pass
    got = kv.read_secret_version(path="app", mount_point=m, raise_on_deleted_version=True)
    eq(got["data"]["data"], {"user": "bob"}, "read_secret_version latest")
    got = kv.read_secret_version(path="app", version=1, mount_point=m, raise_on_deleted_version=True)
    eq(got["data"]["data"], {"user": "alice"}, "read_secret_version 1")
    r = kv.patch(path="app", secret={"team": "ops"}, mount_point=m)
    eq(r["data"]["version"], 3, "patch version")
    got = kv.read_secret_version(path="app", mount_point=m, raise_on_deleted_version=True)
    eq(got["data"]["data"], {"user": "bob", "team": "ops"}, "patched data")
    kv.delete_latest_version_of_secret(path="app", mount_point=m)
    try:
        kv.read_secret_version(path="app", mount_point=m, raise_on_deleted_version=True)
        raise AssertionError("deleted version still readable")
    except exceptions.InvalidPath:
        pass
    kv.undelete_secret_versions(path="app", versions=[3], mount_point=m)
    kv.destroy_secret_versions(path="app", versions=[1], mount_point=m)
    meta = kv.read_secret_metadata(path="app", mount_point=m)["data"]
    eq(meta["current_version"], 3, "metadata current_version")
    eq(meta["versions"]["1"]["destroyed"], True, "metadata destroyed version")
    eq(meta["versions"]["3"]["deletion_time"], "", "metadata undeleted version")
    kv.update_metadata(path="app", max_versions=2, custom_metadata={"owner": "me"}, mount_point=m)
    meta = kv.read_secret_metadata(path="app", mount_point=m)["data"]
    eq((meta["max_versions"], meta["custom_metadata"]), (2, {"owner": "me"}), "update_metadata")
    kv.create_or_update_secret(path="dir/x", secret={"a": 1}, mount_point=m)
    eq(sorted(kv.list_secrets(path="", mount_point=m)["data"]["keys"]), ["app", "dir/"], "list_secrets")
    kv.delete_metadata_and_all_versions(path="app", mount_point=m)
    try:
        kv.read_secret_metadata(path="app", mount_point=m)
        raise AssertionError("deleted metadata still readable")
    except exceptions.InvalidPath:
        pass


# --- response wrapping -----------------------------------------------------------------


@check
def wrap_and_unwrap():
    c = client()
    w = c.sys.wrap(payload={"a": "b"}, ttl=60)
    wt = w["wrap_info"]["token"]
    eq(w["wrap_info"]["ttl"], 60, "wrap ttl")
    un = c.sys.unwrap(token=wt)
    eq(un["data"], {"a": "b"}, "unwrapped payload")
    try:
        c.sys.unwrap(token=wt)
        raise AssertionError("a wrapping token unwrapped twice")
    except exceptions.InvalidRequest:
        pass
    # Any response can be wrapped with the adapter's wrap_ttl; unwrap with the wrapping token
    # itself as the client token.
    c.secrets.kv.v1.create_or_update_secret(path="hvac/wrapped", secret={"k": "v"})
    r = c.adapter.get("/v1/secret/hvac/wrapped", wrap_ttl="5m")
    wt = r["wrap_info"]["token"]
    eq(r["wrap_info"]["creation_path"], "secret/hvac/wrapped", "creation_path")
    eq(client(token=wt).sys.unwrap()["data"], {"k": "v"}, "unwrap with the wrapping token")


# --- LDAP auth method ------------------------------------------------------------------


@check
def ldap_enable_configure_read_configuration():
    ldap_available()
    c = client()
    c.sys.enable_auth_method(method_type="ldap", path="hvac-ldap", description="hvac test")
    methods = c.sys.list_auth_methods()
    eq(methods["data"]["hvac-ldap/"]["type"], "ldap", "list_auth_methods type")
    for mount in ("ldap", "hvac-ldap"):
        c.auth.ldap.configure(
            url="ldap://127.0.0.1:1",
            userdn="ou=Users,dc=example,dc=com",
            groupdn="ou=Groups,dc=example,dc=com",
            binddn="cn=admin,dc=example,dc=com",
            bindpass="hunter2",
            userattr="uid",
            groupattr="cn",
            token_ttl="1h",
            mount_point=mount,
        )
        cfg = c.auth.ldap.read_configuration(mount_point=mount)["data"]
        eq(cfg["url"], "ldap://127.0.0.1:1", "config url")
        eq(cfg["userdn"], "ou=Users,dc=example,dc=com", "config userdn")
        eq(cfg["groupdn"], "ou=Groups,dc=example,dc=com", "config groupdn")
        eq(cfg["binddn"], "cn=admin,dc=example,dc=com", "config binddn")
        eq(cfg["userattr"], "uid", "config userattr")
        eq(cfg["deny_null_bind"], True, "config deny_null_bind")
        if "bindpass" in cfg and cfg["bindpass"]:
            raise AssertionError("read_configuration returned the bind password")
    try:
        c.auth.ldap.configure(url="ldap://x", certificate="not a pem", mount_point="hvac-ldap")
        raise AssertionError("a bad certificate was accepted")
    except exceptions.InvalidRequest:
        pass
    c.sys.disable_auth_method(path="hvac-ldap")
    if "hvac-ldap/" in c.sys.list_auth_methods()["data"]:
        raise AssertionError("disabled auth method still listed")


@check
def ldap_group_and_user_mappings():
    ldap_available()
    c = client()
    ldap = c.auth.ldap
    ldap.create_or_update_group(name="devs", policies=["dev", "ops"])
    ldap.create_or_update_group(name="admins", policies=["admin"])
    eq(sorted(as_list(ldap.read_group(name="devs")["data"]["policies"])), ["dev", "ops"], "group policies")
    eq(sorted(ldap.list_groups()["data"]["keys"]), ["admins", "devs"], "list_groups")
    ldap.create_or_update_user(username="alice", policies=["p1"], groups=["devs", "admins"])
    u = ldap.read_user(username="alice")["data"]
    eq(as_list(u["policies"]), ["p1"], "user policies")
    eq(sorted(as_list(u["groups"])), ["admins", "devs"], "user groups")
    eq(ldap.list_users()["data"]["keys"], ["alice"], "list_users")
    ldap.delete_user(username="alice")
    ldap.delete_group(name="admins")
    ldap.delete_group(name="devs")
    for fn in (ldap.list_groups, ldap.list_users):
        try:
            keys = fn()["data"]["keys"]
            eq(keys, [], fn.__name__ + " after deletes")
        except exceptions.InvalidPath:
            pass
    try:
        ldap.read_group(name="devs")
        raise AssertionError("deleted group still readable")
    except exceptions.InvalidPath:
        pass


@check
def ldap_login():
    ldap_available()
    url = os.environ.get("CAIRN_HVAC_LDAP_URL")
    c = client()
    if not url:
        # No directory: the login is still routed and fails with an error, not a token.
        c.auth.ldap.configure(
            url="ldap://127.0.0.1:1",
            userdn="ou=Users,dc=example,dc=com",
            binddn="cn=admin,dc=example,dc=com",
            bindpass="x",
        )
        anon = client(token=None)
        try:
            anon.auth.ldap.login(username="alice", password="pw")
            raise AssertionError("login succeeded without a directory")
        except exceptions.VaultError:
            pass
        raise Skip("no directory (set CAIRN_HVAC_LDAP_URL ... for a real login)")
    env = os.environ
    c.auth.ldap.configure(
        url=url,
        userdn=env.get("CAIRN_HVAC_LDAP_USERDN"),
        groupdn=env.get("CAIRN_HVAC_LDAP_GROUPDN"),
        binddn=env.get("CAIRN_HVAC_LDAP_BINDDN"),
        bindpass=env.get("CAIRN_HVAC_LDAP_BINDPASS"),
        userattr=env.get("CAIRN_HVAC_LDAP_USERATTR", "uid"),
        groupattr="cn",
    )
    group = env.get("CAIRN_HVAC_LDAP_GROUP")
    if group:
        c.auth.ldap.create_or_update_group(name=group, policies=["hvac-group-policy"])
    user = env["CAIRN_HVAC_LDAP_USER"]
    anon = client(token=None)
    r = anon.auth.ldap.login(username=user, password=env["CAIRN_HVAC_LDAP_PASSWORD"])
    tok = r["auth"]["client_token"]
    eq(anon.token, tok, "hvac adopted the login token")
    me = anon.auth.token.lookup_self()["data"]
    if group and "hvac-group-policy" not in me["policies"]:
        raise AssertionError("group policy missing: %r" % me["policies"])
    try:
        client(token=None).auth.ldap.login(username=user, password="wrong-password")
        raise AssertionError("a wrong password logged in")
    except exceptions.InvalidRequest:
        pass


@check
def identity_entities_groups_and_ldap_login():
    ldap_available()
    env = os.environ
    if not env.get("CAIRN_HVAC_LDAP_URL"):
        raise Skip("no directory (set CAIRN_HVAC_LDAP_URL ...)")
    c = client()
    ident = c.secrets.identity
    e = ident.create_or_update_entity(name="hvac-e", policies=["hvac-e-pol"], metadata={"team": "x"})
    eid = e["data"]["id"]
    r = ident.read_entity(entity_id=eid)["data"]
    eq(r["name"], "hvac-e", "entity name")
    eq(r["metadata"], {"team": "x"}, "entity metadata")
    eq(ident.read_entity_by_name(name="hvac-e")["data"]["id"], eid, "entity by name")
    if eid not in ident.list_entities()["data"]["keys"]:
        raise AssertionError("entity not listed")
    auths = c.sys.list_auth_methods()
    accessor = (auths.get("data") or auths)["ldap/"]["accessor"]
    a = ident.create_or_update_entity_alias(name="hvac-alias", canonical_id=eid, mount_accessor=accessor)
    eq(a["data"]["canonical_id"], eid, "alias canonical id")
    found = ident.lookup_entity(alias_name="hvac-alias", alias_mount_accessor=accessor)
    eq(found["data"]["id"], eid, "lookup entity by alias")
    # An external group aliased to the directory group: logins carry its policies.
    group = env.get("CAIRN_HVAC_LDAP_GROUP", "engineers")
    g = ident.create_or_update_group(name="hvac-ext", group_type="external", policies=["hvac-ext-pol"])
    gid = g["data"]["id"]
    ga = ident.create_or_update_group_alias(name=group, mount_accessor=accessor, canonical_id=gid)
    eq(ga["data"]["canonical_id"], gid, "group alias canonical id")
    gi = ident.create_or_update_group(name="hvac-int", policies=["hvac-int-pol"], member_entity_ids=[eid])
    if eid not in ident.read_group(group_id=gi["data"]["id"])["data"]["member_entity_ids"]:
        raise AssertionError("internal group member missing")
    anon = client(token=None)
    user = env["CAIRN_HVAC_LDAP_USER"]
    r = anon.auth.ldap.login(username=user, password=env["CAIRN_HVAC_LDAP_PASSWORD"])
    auth = r["auth"]
    if "hvac-ext-pol" not in (auth.get("identity_policies") or []):
        raise AssertionError("identity policies missing: %r" % auth)
    me = anon.auth.token.lookup_self()["data"]
    eq(me["entity_id"], auth["entity_id"], "lookup-self entity id")
    found = ident.lookup_entity(entity_id=auth["entity_id"])["data"]
    eq([x["name"] for x in found["aliases"]], [user], "login alias")


def main():
    only = set(sys.argv[1:])
    passed = failed = skipped = 0
    for fn in CHECKS:
        if only and fn.__name__ not in only:
            continue
        try:
            fn()
        except Skip as e:
            skipped += 1
            print("SKIP %s: %s" % (fn.__name__, e))
        except Exception:  # noqa: BLE001 - report every failure, keep going
            failed += 1
            print("FAIL %s" % fn.__name__)
            traceback.print_exc(file=sys.stdout)
        else:
            passed += 1
            print("ok   %s" % fn.__name__)
    print("hvac %s checks: ok=%d failed=%d skipped=%d" % (
        importlib.metadata.version("hvac"), passed, failed, skipped))
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
