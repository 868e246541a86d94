//! The LDAP executor: runs the core's [`LdapCall`]s against real directories with ldap3's
//! sync API on a pool of threads, and hands each [`LdapReply`] to a delivery callback
//! (the runtime turns it into `Input::Ldap`).
//!
//! A login arrives as one [`LdapOp::Run`]: a worker runs the core's login machine to the
//! end with a connection of its own (no round trip through the core per step) and
//! answers with the finished job. Single operations use one connection per connection
//! id, kept in a table between calls: `Connect`
//! tries the URLs in order (TCP, then TLS for `ldaps://` or StartTLS), with the configured
//! CA (or the system roots), client certificate, TLS version bounds and `insecure_tls`;
//! `Search` uses the paged results control when asked and the requested alias
//! dereferencing. Calls for one connection arrive one at a time (the core waits for each
//! reply), so any thread may run them. Passwords are never logged: calls are logged by
//! kind only, and `Secret`'s `Debug` redacts anyway.
//!
//! Every call blocks its thread for a network round trip, so the pool grows when a call
//! arrives while no worker is idle (up to [`MAX_THREADS`]): each login in flight gets a
//! thread instead of queueing behind others. Workers beyond the initial count exit after
//! [`SPARE_IDLE`] without work.
//!
//! The pool, the connection table and the bound-connection pool live here; the exchanges
//! with a directory (search, entries, errors classified) in `wire`.

mod wire;

use crate::tls_client;
use cairn_core::auth::ldap::ad;
use cairn_core::auth::ldap::login::Job;
use cairn_core::auth::ldap::{
    ConnId, ConnectSpec, Deref, FailKind, LdapCall, LdapDone, LdapEntry, LdapFailure, LdapOp,
    LdapReply, Scope, SearchSpec, TlsVersion,
};
use ldap3::adapters::{Adapter, EntriesOnly, PagedResults};
use ldap3::{DerefAliases, LdapConn, LdapConnSettings, LdapError, SearchEntry, SearchOptions};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use std::collections::VecDeque;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use wire::{classify, search};

/// Connections idle longer than this are dropped (a login that was abandoned).
const IDLE_LIMIT: Duration = Duration::from_secs(600);
/// Most TLS configurations kept built at once.
const TLS_CACHE_MAX: usize = 64;
/// Bound pool: how long a connection may wait idle, how long it may serve at all (so a
/// URL list's first server is tried again after failover), how many wait per identity.
const POOL_IDLE: Duration = Duration::from_secs(30);
const POOL_MAX_AGE: Duration = Duration::from_secs(300);
const POOL_MAX_PER_KEY: usize = 64;
const POOL_MAX_KEYS: usize = 64;
/// Most worker threads (calls beyond this many in flight wait in the queue).
pub const MAX_THREADS: usize = 256;
/// How long a worker beyond the initial count waits for work before exiting.
const SPARE_IDLE: Duration = Duration::from_secs(60);

type Deliver = Box<dyn Fn(LdapReply) + Send + Sync>;

/// A pool of threads executing LDAP calls.
pub struct LdapPool {
    shared: Arc<Shared>,
}

/// Calls waiting for a worker. A condition variable wakes exactly one idle worker per call
/// (a shared `Mutex<Receiver>` woke a second one each time: the lock's next waiter).
#[derive(Default)]
struct Queue {
    calls: Mutex<(VecDeque<LdapCall>, bool)>,
    ready: Condvar,
}

/// Why [`Queue::pop`] returned no call.
enum NoCall {
    TimedOut,
    Closed,
}

impl Queue {
    /// Adds a call; false when the pool is closed.
    fn push(&self, call: LdapCall) -> bool {
        let mut q = lock(&self.calls);
        if q.1 {
            return false;
        }
        q.0.push_back(call);
        drop(q);
        self.ready.notify_one();
        true
    }

    /// The next call, waiting up to `wait`.
    fn pop(&self, wait: Duration) -> Result<LdapCall, NoCall> {
        let deadline = Instant::now() + wait;
        let mut q = lock(&self.calls);
        loop {
            if let Some(c) = q.0.pop_front() {
                return Ok(c);
            }
            if q.1 {
                return Err(NoCall::Closed);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NoCall::TimedOut);
            }
            q = match self.ready.wait_timeout(q, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    fn close(&self) {
        lock(&self.calls).1 = true;
        self.ready.notify_all();
    }
}

impl Drop for LdapPool {
    fn drop(&mut self) {
        self.shared.queue.close();
    }
}

struct Conn {
    ldap: LdapConn,
    timeout: Option<Duration>,
    last_used: Instant,
    opened: Instant,
    /// The URL it is connected to.
    url: String,
}

/// The TLS settings that decide a `ClientConfig`.
#[derive(PartialEq, Eq, Hash, Clone)]
struct TlsKey {
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    insecure: bool,
    min: u8,
    max: u8,
}

struct Shared {
    queue: Queue,
    conns: Mutex<HashMap<ConnId, Conn>>,
    tls: Mutex<HashMap<TlsKey, Arc<ClientConfig>>>,
    /// Connections left bound as a service identity by finished logins.
    bound: BoundPool,
    /// Connections kept for checking users' passwords ([`LdapOp::CheckBind`]), by
    /// settings; whatever identity the last check left them bound as is never used.
    check: BoundPool,
    deliver: Deliver,
    /// Workers running, how many of them wait for a call, and calls not yet taken.
    threads: AtomicUsize,
    idle: AtomicUsize,
    queued: AtomicUsize,
    /// Workers that never exit.
    base: usize,
}

impl LdapPool {
    /// Starts `threads` workers (at least one); `deliver` receives every reply.
    pub fn new(threads: usize, deliver: Box<dyn Fn(LdapReply) + Send + Sync>) -> LdapPool {
        let base = threads.clamp(1, MAX_THREADS);
        let shared = Arc::new(Shared {
            queue: Queue::default(),
            conns: Mutex::new(HashMap::new()),
            tls: Mutex::new(HashMap::new()),
            bound: BoundPool::default(),
            check: BoundPool::default(),
            deliver,
            threads: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            base,
        });
        for _ in 0..base {
            spawn_worker(&shared);
        }
        LdapPool { shared }
    }

    /// Queues a call; its reply goes to the delivery callback. Starts another worker when
    /// more calls wait than workers are idle (up to [`MAX_THREADS`]).
    pub fn submit(&self, call: LdapCall) {
        let s = &self.shared;
        let queued = s.queued.fetch_add(1, Ordering::SeqCst) + 1;
        let op_id = call.op_id;
        if !s.queue.push(call) {
            s.queued.fetch_sub(1, Ordering::SeqCst);
            log::error!("LDAP pool is gone; dropping op {op_id}");
            return;
        }
        if queued > s.idle.load(Ordering::SeqCst) && s.threads.load(Ordering::SeqCst) < MAX_THREADS
        {
            spawn_worker(s);
        }
    }

    /// Workers running now.
    #[cfg(test)]
    pub fn threads(&self) -> usize {
        self.shared.threads.load(Ordering::SeqCst)
    }
}

fn spawn_worker(s: &Arc<Shared>) {
    let n = s.threads.fetch_add(1, Ordering::SeqCst);
    // Counted as idle from the start, so a burst of calls does not start one thread each
    // before the first of them runs.
    s.idle.fetch_add(1, Ordering::SeqCst);
    let shared = s.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("ldap-{n}"))
        .spawn(move || worker(shared));
    if let Err(e) = spawned {
        s.threads.fetch_sub(1, Ordering::SeqCst);
        s.idle.fetch_sub(1, Ordering::SeqCst);
        log::error!("cannot start LDAP worker thread: {e}");
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn worker(s: Arc<Shared>) {
    loop {
        let call = match s.queue.pop(SPARE_IDLE) {
            Ok(c) => c,
            Err(NoCall::TimedOut) => {
                // Exit when beyond the initial count (a compare-and-swap, so two idle
                // workers never both leave the pool below it).
                let n = s.threads.load(Ordering::SeqCst);
                if n > s.base
                    && s.threads
                        .compare_exchange(n, n - 1, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                {
                    s.idle.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                continue;
            }
            Err(NoCall::Closed) => {
                s.threads.fetch_sub(1, Ordering::SeqCst);
                s.idle.fetch_sub(1, Ordering::SeqCst);
                return;
            }
        };
        s.queued.fetch_sub(1, Ordering::SeqCst);
        s.idle.fetch_sub(1, Ordering::SeqCst);
        let reply = execute(&s, call);
        s.idle.fetch_add(1, Ordering::SeqCst);
        (s.deliver)(reply);
    }
}

fn kind_of(op: &LdapOp) -> &'static str {
    match op {
        LdapOp::Connect(_) => "connect",
        LdapOp::ConnectBound { .. } => "connect and bind",
        LdapOp::Bind { .. } => "bind",
        LdapOp::CheckBind { .. } => "check bind",
        LdapOp::Search(_) => "search",
        LdapOp::Close => "close",
        LdapOp::Run(_) => "run",
    }
}

fn execute(s: &Shared, call: LdapCall) -> LdapReply {
    let started = Instant::now();
    let conn_id = call.conn;
    if let LdapOp::Run(mut job) = call.op {
        run_job(s, &mut job);
        log::debug!(
            "ldap op {} (login run) on conn {conn_id}: done in {:?}",
            call.op_id,
            started.elapsed()
        );
        return LdapReply {
            op_id: call.op_id,
            conn: conn_id,
            result: Ok(LdapDone::Ran(job)),
        };
    }
    let result = match &call.op {
        LdapOp::Connect(spec) => {
            reap_idle(s);
            connect(s, spec).map(|(ldap, url)| {
                let mut c = new_conn(ldap, spec, &url);
                if call.close_after {
                    let _ = c.ldap.unbind();
                } else {
                    lock(&s.conns).insert(conn_id, c);
                }
                LdapDone::Connected { url }
            })
        }
        LdapOp::ConnectBound { spec, dn, password } => {
            reap_idle(s);
            connect(s, spec).and_then(|(ldap, url)| {
                let mut c = new_conn(ldap, spec, &url);
                let r = bind(&mut c, dn, password.expose());
                if call.close_after || r.is_err() {
                    let _ = c.ldap.unbind();
                } else {
                    lock(&s.conns).insert(conn_id, c);
                }
                r.map(|_| LdapDone::Connected { url })
            })
        }
        LdapOp::Close => {
            if let Some(mut c) = lock(&s.conns).remove(&conn_id) {
                let _ = c.ldap.unbind();
            }
            Ok(LdapDone::Closed)
        }
        LdapOp::CheckBind { spec, dn, password } => {
            check_bind(s, spec, dn, password.expose(), true)
        }
        op => {
            let taken = lock(&s.conns).remove(&conn_id);
            match taken {
                None => Err(LdapFailure::new(
                    FailKind::NoConnection,
                    None,
                    "the LDAP connection is not open",
                )),
                Some(mut c) => {
                    let r = match op {
                        LdapOp::Bind { dn, password } => bind(&mut c, dn, password.expose()),
                        LdapOp::Search(spec) => search(&mut c, spec),
                        _ => Ok(LdapDone::Closed),
                    };
                    if call.close_after {
                        let _ = c.ldap.unbind();
                    } else {
                        c.last_used = Instant::now();
                        lock(&s.conns).insert(conn_id, c);
                    }
                    r
                }
            }
        }
    };
    match &result {
        Ok(_) => log::debug!(
            "ldap op {} ({}) on conn {conn_id}: ok in {:?}",
            call.op_id,
            kind_of(&call.op),
            started.elapsed()
        ),
        Err(f) => log::debug!(
            "ldap op {} ({}) on conn {conn_id}: {:?}: {}",
            call.op_id,
            kind_of(&call.op),
            f.kind,
            f.message
        ),
    }
    LdapReply {
        op_id: call.op_id,
        conn: conn_id,
        result,
    }
}

/// Runs a login machine to its outcome. Its connection is closed at the end, unless the
/// machine left it bound as the service identity: then it waits in the bound pool for
/// the next login with the same settings. A pooled connection that turns out dead on its
/// first use is dropped and the login runs again on a fresh one.
fn run_job(s: &Shared, job: &mut Job) {
    let fresh = job.clone();
    if run_job_once(s, job, true) {
        log::debug!(
            "ldap login {}: an idle pooled connection was dead; retrying on a new one",
            job.login.request_id
        );
        *job = fresh;
        run_job_once(s, job, false);
    }
}

/// One run; returns true when it must be retried (a pooled connection failed first).
fn run_job_once(s: &Shared, job: &mut Job, use_pool: bool) -> bool {
    let mut conn: Option<Conn> = None;
    let mut key: Option<PoolKey> = None;
    let mut pooled = false;
    let mut ops_after_pooled = 0usize;
    let mut retry = false;
    let id = job.login.request_id;
    job.run(|op, _close_after| {
        let started = Instant::now();
        let r = match op {
            LdapOp::Connect(spec) => connect(s, spec).map(|(ldap, url)| {
                conn = Some(new_conn(ldap, spec, &url));
                LdapDone::Connected { url }
            }),
            LdapOp::ConnectBound { spec, dn, password } => {
                let k = PoolKey::new(spec, dn, password.expose());
                let idle = if use_pool { s.bound.take(&k) } else { None };
                key = Some(k);
                match idle {
                    Some(c) => {
                        pooled = true;
                        let url = c.url.clone();
                        conn = Some(c);
                        Ok(LdapDone::Connected { url })
                    }
                    None => connect(s, spec).and_then(|(ldap, url)| {
                        let mut c = new_conn(ldap, spec, &url);
                        let r = bind(&mut c, dn, password.expose());
                        conn = Some(c);
                        r.map(|_| LdapDone::Connected { url })
                    }),
                }
            }
            LdapOp::Bind { dn, password } => match conn.as_mut() {
                Some(c) => bind(c, dn, password.expose()),
                None => Err(not_open()),
            },
            LdapOp::Search(spec) => match conn.as_mut() {
                Some(c) => search(c, spec),
                None => Err(not_open()),
            },
            LdapOp::CheckBind { spec, dn, password } => {
                check_bind(s, spec, dn, password.expose(), use_pool)
            }
            LdapOp::Close => {
                if let Some(mut c) = conn.take() {
                    let _ = c.ldap.unbind();
                }
                Ok(LdapDone::Closed)
            }
            LdapOp::Run(_) => Err(LdapFailure::new(
                FailKind::Ldap,
                None,
                "a login cannot run inside another",
            )),
        };
        if pooled && !matches!(op, LdapOp::ConnectBound { .. }) {
            ops_after_pooled += 1;
            if ops_after_pooled == 1 {
                if let Err(f) = &r {
                    if matches!(f.kind, FailKind::Connect | FailKind::NoConnection) {
                        retry = true;
                    }
                }
            }
        }
        match &r {
            Ok(_) => log::debug!(
                "ldap login {id}: {}{} ok in {:?}",
                kind_of(op),
                if pooled && ops_after_pooled == 0 {
                    " (pooled)"
                } else {
                    ""
                },
                started.elapsed()
            ),
            Err(f) => log::debug!(
                "ldap login {id}: {}: {:?}: {}",
                kind_of(op),
                f.kind,
                f.message
            ),
        }
        r
    });
    if let Some(mut c) = conn.take() {
        match key {
            Some(k) if job.login.reusable() && !retry => {
                c.last_used = Instant::now();
                s.bound.put(k, c);
            }
            _ => {
                let _ = c.ldap.unbind();
            }
        }
    }
    retry
}

/// Checks credentials with a bind on a check connection: an idle one kept for `spec`'s
/// settings (a dead one is dropped and a fresh one opened), else a new one. The
/// connection goes back to the pool unless the connection itself failed.
fn check_bind(
    s: &Shared,
    spec: &ConnectSpec,
    dn: &str,
    password: &str,
    use_pool: bool,
) -> Result<LdapDone, LdapFailure> {
    let k = PoolKey::new(spec, "", "");
    let usable = |r: &Result<LdapDone, LdapFailure>| match r {
        Ok(_) => true,
        Err(f) => matches!(
            f.kind,
            FailKind::InvalidCredentials | FailKind::Ldap | FailKind::SizeLimit
        ),
    };
    let idle = if use_pool { s.check.take(&k) } else { None };
    if let Some(mut c) = idle {
        let r = bind(&mut c, dn, password);
        if usable(&r) {
            c.last_used = Instant::now();
            s.check.put(k, c);
            return r;
        }
        let _ = c.ldap.unbind();
        if !matches!(&r, Err(f) if matches!(f.kind, FailKind::Connect | FailKind::NoConnection)) {
            return r;
        }
        // The idle connection was dead: check on a fresh one.
    }
    let (ldap, url) = connect(s, spec)?;
    let mut c = new_conn(ldap, spec, &url);
    let r = bind(&mut c, dn, password);
    if usable(&r) {
        s.check.put(k, c);
    } else {
        let _ = c.ldap.unbind();
    }
    r
}

fn new_conn(ldap: LdapConn, spec: &ConnectSpec, url: &str) -> Conn {
    let now = Instant::now();
    Conn {
        ldap,
        timeout: (spec.request_timeout_ms > 0)
            .then(|| Duration::from_millis(spec.request_timeout_ms)),
        last_used: now,
        opened: now,
        url: url.to_string(),
    }
}

/// What decides whether an idle bound connection may serve a login: the same connection
/// settings and the same identity. Holds the bind password only to compare it; no
/// `Debug`, so it is never printed.
#[derive(PartialEq, Eq, Hash, Clone)]
struct PoolKey {
    urls: Vec<String>,
    starttls: bool,
    insecure: bool,
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    min: u8,
    max: u8,
    connect_ms: u64,
    request_ms: u64,
    dn: String,
    password: String,
}

impl PoolKey {
    fn new(spec: &ConnectSpec, dn: &str, password: &str) -> PoolKey {
        PoolKey {
            urls: spec.urls.clone(),
            starttls: spec.starttls,
            insecure: spec.insecure_tls,
            ca: spec.ca_pem.clone(),
            cert: spec.client_cert_pem.clone(),
            key: spec.client_key_pem.as_ref().map(|k| k.expose().to_string()),
            min: version_rank(spec.tls_min),
            max: version_rank(spec.tls_max),
            connect_ms: spec.connect_timeout_ms,
            request_ms: spec.request_timeout_ms,
            dn: dn.to_string(),
            password: password.to_string(),
        }
    }
}

/// Idle connections bound as a service identity, by settings and identity.
#[derive(Default)]
struct BoundPool {
    idle: Mutex<HashMap<PoolKey, Vec<Conn>>>,
}

impl BoundPool {
    /// The most recently used idle connection for `k` that is neither idle nor open for
    /// too long; older ones are closed.
    fn take(&self, k: &PoolKey) -> Option<Conn> {
        let mut stale = Vec::new();
        let found = {
            let mut idle = lock(&self.idle);
            let list = idle.get_mut(k)?;
            let mut found = None;
            while let Some(c) = list.pop() {
                if c.last_used.elapsed() < POOL_IDLE && c.opened.elapsed() < POOL_MAX_AGE {
                    found = Some(c);
                    break;
                }
                stale.push(c);
            }
            found
        };
        for mut c in stale {
            let _ = c.ldap.unbind();
        }
        found
    }

    fn put(&self, k: PoolKey, c: Conn) {
        let mut extra = None;
        {
            let mut idle = lock(&self.idle);
            if !idle.contains_key(&k) && idle.len() >= POOL_MAX_KEYS {
                // Settings changed many times: forget the oldest sets of connections.
                idle.retain(|_, l| l.iter().any(|c| c.last_used.elapsed() < POOL_IDLE));
            }
            let list = idle.entry(k).or_default();
            if list.len() < POOL_MAX_PER_KEY {
                list.push(c);
            } else {
                extra = Some(c);
            }
        }
        if let Some(mut c) = extra {
            let _ = c.ldap.unbind();
        }
    }
}

fn not_open() -> LdapFailure {
    LdapFailure::new(
        FailKind::NoConnection,
        None,
        "the LDAP connection is not open",
    )
}

fn reap_idle(s: &Shared) {
    let mut conns = lock(&s.conns);
    let before = conns.len();
    conns.retain(|_, c| c.last_used.elapsed() < IDLE_LIMIT);
    if conns.len() < before {
        log::warn!(
            "dropped {} idle LDAP connection(s) nobody closed",
            before - conns.len()
        );
    }
}

fn connect(s: &Shared, spec: &ConnectSpec) -> Result<(LdapConn, String), LdapFailure> {
    let mut errors = Vec::new();
    let mut kind = FailKind::Connect;
    let mut tls: Option<Arc<ClientConfig>> = None;
    for url in &spec.urls {
        let ldaps = url.starts_with("ldaps://");
        let starttls = spec.starttls && !ldaps;
        let mut settings = LdapConnSettings::new()
            .set_conn_timeout(Duration::from_millis(spec.connect_timeout_ms.max(1)))
            .set_starttls(starttls)
            .set_no_tls_verify(spec.insecure_tls);
        if ldaps || starttls {
            if tls.is_none() {
                match tls_config(s, spec) {
                    Ok(c) => tls = Some(c),
                    Err(e) => {
                        return Err(LdapFailure::new(
                            FailKind::Tls,
                            None,
                            format!("TLS settings are unusable: {e}"),
                        ))
                    }
                }
            }
            if let Some(c) = &tls {
                settings = settings.set_config(c.clone());
            }
        }
        match LdapConn::with_settings(settings, url) {
            Ok(c) => {
                if !errors.is_empty() {
                    log::info!(
                        "ldap: connected to {url} after failures: {}",
                        errors.join("; ")
                    );
                }
                return Ok((c, url.clone()));
            }
            Err(e) => {
                let f = classify(&e);
                if f.kind == FailKind::Tls {
                    kind = FailKind::Tls;
                }
                errors.push(format!("error connecting to host {url:?}: {}", f.message));
            }
        }
    }
    if errors.is_empty() {
        errors.push("no LDAP URL configured".into());
    }
    Err(LdapFailure::new(kind, None, errors.join("; ")))
}

fn bind(c: &mut Conn, dn: &str, password: &str) -> Result<LdapDone, LdapFailure> {
    let ldap = match c.timeout {
        Some(t) => c.ldap.with_timeout(t),
        None => &mut c.ldap,
    };
    ldap.simple_bind(dn, password)
        .and_then(|r| r.success())
        .map(|_| LdapDone::Bound)
        .map_err(|e| classify(&e))
}

fn version_rank(v: TlsVersion) -> u8 {
    match v {
        TlsVersion::Tls10 => 10,
        TlsVersion::Tls11 => 11,
        TlsVersion::Tls12 => 12,
        TlsVersion::Tls13 => 13,
    }
}

/// The rustls configuration for `spec`, built once per distinct TLS settings.
fn tls_config(s: &Shared, spec: &ConnectSpec) -> Result<Arc<ClientConfig>, String> {
    let key = TlsKey {
        ca: spec.ca_pem.clone(),
        cert: spec.client_cert_pem.clone(),
        key: spec.client_key_pem.as_ref().map(|k| k.expose().to_string()),
        insecure: spec.insecure_tls,
        min: version_rank(spec.tls_min),
        max: version_rank(spec.tls_max),
    };
    if let Some(c) = lock(&s.tls).get(&key) {
        return Ok(c.clone());
    }
    let cfg = Arc::new(build_tls(spec)?);
    let mut cache = lock(&s.tls);
    if cache.len() >= TLS_CACHE_MAX {
        cache.clear();
    }
    cache.insert(key, cfg.clone());
    Ok(cfg)
}

fn build_tls(spec: &ConnectSpec) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if spec.tls_min <= TlsVersion::Tls12 && spec.tls_max >= TlsVersion::Tls12 {
        versions.push(&rustls::version::TLS12);
    }
    if spec.tls_max >= TlsVersion::Tls13 {
        versions.push(&rustls::version::TLS13);
    }
    if versions.is_empty() {
        return Err(
            "TLS 1.0 and 1.1 are not supported; set tls_max_version to tls12 or tls13".into(),
        );
    }
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| e.to_string())?;
    let builder = if spec.insecure_tls {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(tls_client::NoVerify(provider.clone())))
    } else {
        let mut roots = RootCertStore::empty();
        match &spec.ca_pem {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    let cert = cert.map_err(|e| format!("certificate: {e}"))?;
                    roots.add(cert).map_err(|e| format!("certificate: {e}"))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    let _ = roots.add(cert);
                }
            }
        }
        builder.with_root_certificates(roots)
    };
    match (&spec.client_cert_pem, &spec.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("client_tls_cert: {e}"))?;
            // The key's own parse error could quote key bytes; say only what failed.
            let key = PrivateKeyDer::from_pem_slice(key.expose().as_bytes())
                .map_err(|_| "client_tls_key: not a usable PEM private key".to_string())?;
            tls_client::with_client_cert(builder, &provider, chain, key)
                .map_err(|e| format!("client_tls_cert/client_tls_key: {e}"))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::auth::ldap::Secret;
    use std::sync::mpsc;

    fn spec(urls: &[&str]) -> ConnectSpec {
        ConnectSpec {
            urls: urls.iter().map(|u| u.to_string()).collect(),
            starttls: false,
            insecure_tls: false,
            ca_pem: None,
            client_cert_pem: None,
            client_key_pem: None,
            tls_min: TlsVersion::Tls12,
            tls_max: TlsVersion::Tls12,
            connect_timeout_ms: 2000,
            request_timeout_ms: 2000,
        }
    }

    #[test]
    fn unreachable_urls_are_each_reported_and_ops_on_unknown_connections_fail() {
        let (tx, rx) = mpsc::channel();
        let pool = LdapPool::new(
            2,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        // Port 1 on loopback refuses connections.
        pool.submit(LdapCall {
            op_id: 1,
            conn: 1,
            op: LdapOp::Connect(spec(&["ldap://127.0.0.1:1", "ldap://127.0.0.1:2"])),
            close_after: false,
        });
        let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let f = r.result.unwrap_err();
        assert_eq!(f.kind, FailKind::Connect);
        assert!(f.message.contains("127.0.0.1:1") && f.message.contains("127.0.0.1:2"));
        pool.submit(LdapCall {
            op_id: 2,
            conn: 9,
            op: LdapOp::Bind {
                dn: "cn=x".into(),
                password: Secret::new("pw"),
            },
            close_after: false,
        });
        let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(r.result.unwrap_err().kind, FailKind::NoConnection);
    }

    #[test]
    fn the_pool_grows_so_slow_calls_do_not_queue_behind_each_other() {
        // A listener that accepts TCP but never answers LDAP: every bind waits for the
        // request timeout.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("ldap://{}", silent.local_addr().unwrap());
        let (tx, rx) = mpsc::channel();
        let pool = LdapPool::new(
            1,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        let n = 4;
        for i in 0..n {
            pool.submit(LdapCall {
                op_id: i,
                conn: 100 + i,
                op: LdapOp::Connect(spec(&[url.as_str()])),
                close_after: false,
            });
        }
        for _ in 0..n {
            let r = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert!(r.result.is_ok(), "{:?}", r.result);
        }
        let started = Instant::now();
        for i in 0..n {
            pool.submit(LdapCall {
                op_id: 10 + i,
                conn: 100 + i,
                op: LdapOp::Bind {
                    dn: "cn=x".into(),
                    password: Secret::new("pw"),
                },
                close_after: true,
            });
        }
        for _ in 0..n {
            let r = rx.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(r.result.unwrap_err().kind, FailKind::Timeout);
        }
        // Four 2 s timeouts in parallel, not one after the other.
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "{:?}",
            started.elapsed()
        );
        assert!(pool.threads() >= n as usize, "{} threads", pool.threads());
    }

    #[test]
    fn tls_versions_below_12_only_are_refused() {
        let mut s = spec(&["ldaps://127.0.0.1:1"]);
        s.tls_min = TlsVersion::Tls10;
        s.tls_max = TlsVersion::Tls11;
        assert!(build_tls(&s).unwrap_err().contains("not supported"));
        s.tls_max = TlsVersion::Tls13;
        assert!(build_tls(&s).is_ok());
        s.insecure_tls = true;
        assert!(build_tls(&s).is_ok());
    }
}
