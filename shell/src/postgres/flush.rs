//! Pipelined commits on PostgreSQL: the durability barrier that lets the core thread commit
//! the next batch while the previous one is being made durable.
//!
//! With pipelining on ([`super::PgStorage::pipeline`]), the storage's own connection commits
//! with `synchronous_commit = off`: `COMMIT` returns once the batch is in the server's WAL
//! buffers (the fence is still checked in the batch's transaction, and its locks are released
//! at that commit), without waiting for the WAL flush or a synchronous standby. Each such
//! commit leaves a [`Ticket`]. The runtime's sync thread then calls [`PgFlush::barrier`] on a
//! connection of its own: one `UPDATE` of the one-row `<table>_flush` table, committed with the
//! session's default `synchronous_commit`. PostgreSQL writes WAL in order, so that commit's
//! flush (and, with `synchronous_standby_names`, its wait for the synchronous standby) covers
//! every record before it: every batch whose `COMMIT` returned before the barrier started.
//! Only then are the batches' answers released. A transaction that writes no WAL before its
//! commit record (`SELECT txid_current()` alone) would not do: PostgreSQL flushes a commit,
//! and waits for the synchronous standby, only when the transaction wrote WAL before it.
//!
//! A ticket is honoured only by a barrier on the same database server (its postmaster's start
//! time) and on a flush connection that was already open when the batch's transaction began
//! ([`Ticket::gen`]): a server that crashed and restarted, or a failover to another server,
//! closes every session, so an unbroken flush connection proves that the server that took the
//! batch is the one that flushed it. Anything else — the barrier fails, the flush connection
//! was reopened, the server differs — fails the batch (its answers become errors) and marks
//! the [`Ledger`] lost. The storage then refuses its next commit, after which the runtime
//! reloads what the node derived from its writes (as after any failed commit), so a batch
//! whose base may have been lost is never built on. The storage marks the ledger lost itself
//! when its own connection is reopened while commits are still unconfirmed.

use super::{why, PgSettings};
use postgres::{Client, Statement};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// State shared by the storage (core thread) and its [`PgFlush`] (sync thread).
#[derive(Debug, Default)]
pub struct Ledger {
    /// The flush connection's generation: bumped each time it is (re)opened, after the
    /// connection is established. 0: never opened.
    gen: AtomicU64,
    /// Commits returned to the storage and not yet confirmed or failed by a barrier.
    unconfirmed: AtomicU64,
    /// A commit's durability could not be confirmed (or the storage's connection was reopened
    /// while some were unconfirmed): what the node derived from it may not be in the database.
    lost: AtomicBool,
}

impl Ledger {
    /// The flush connection's generation now (read before a batch's transaction begins).
    pub fn gen(&self) -> u64 {
        self.gen.load(Ordering::SeqCst)
    }

    /// A commit returned: one more to confirm.
    pub fn committed(&self) {
        self.unconfirmed.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether commits are waiting for a barrier.
    pub fn has_unconfirmed(&self) -> bool {
        self.unconfirmed.load(Ordering::SeqCst) > 0
    }

    /// Marks the node's view lost: the storage refuses its next commit.
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// True once after [`Ledger::mark_lost`] (the caller refuses its commit).
    pub fn take_lost(&self) -> bool {
        self.lost.swap(false, Ordering::SeqCst)
    }

    /// Whether the view is marked lost (not clearing it).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// `n` tickets were resolved, `failed` of them not durable. The loss is marked before
    /// the count drops, so that a storage that sees no unconfirmed commit also sees the loss.
    fn resolved(&self, n: u64, failed: bool) {
        if failed {
            self.mark_lost();
        }
        self.unconfirmed.fetch_sub(n, Ordering::SeqCst);
    }
}

/// What a barrier needs to know about an asynchronous commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// [`Ledger::gen`] when the batch's transaction began.
    pub gen: u64,
    /// The server that took the commit: its postmaster's start time.
    pub server: String,
}

/// The sync thread's side: the barrier connection.
pub struct PgFlush {
    settings: PgSettings,
    ledger: Arc<Ledger>,
    conn: Option<FlushConn>,
}

struct FlushConn {
    client: Client,
    barrier: Statement,
    gen: u64,
    server: String,
}

/// The identity of the server a session is on: its postmaster's start time (differs between
/// a primary and its promoted standby).
pub(super) fn server_identity(client: &mut Client) -> Result<String, postgres::Error> {
    client
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .map(|r| r.get(0))
}

impl PgFlush {
    /// The flush side of `ledger`, connected at once (so that the first batches find a
    /// generation to be confirmed under).
    pub(super) fn open(settings: &PgSettings, ledger: Arc<Ledger>) -> Result<PgFlush, String> {
        let mut f = PgFlush {
            settings: settings.clone(),
            ledger,
            conn: None,
        };
        f.connect()?;
        Ok(f)
    }

    fn connect(&mut self) -> Result<(), String> {
        self.conn = None;
        let s = &self.settings;
        let mut client = s.connect()?;
        let fail = |e: postgres::Error| {
            format!(
                "PostgreSQL at {}: cannot open the flush connection: {}",
                s.target,
                why(&e)
            )
        };
        let barrier = client
            .prepare(&format!(
                "UPDATE {}_flush SET n = n + 1 WHERE id = 1",
                s.table
            ))
            .map_err(fail)?;
        let server = server_identity(&mut client).map_err(fail)?;
        let gen = self.ledger.gen.fetch_add(1, Ordering::SeqCst) + 1;
        self.conn = Some(FlushConn {
            client,
            barrier,
            gen,
            server,
        });
        Ok(())
    }

    /// Makes every commit that returned before this call durable (flushed, and on the
    /// synchronous standby if the server has one), then tells which of `tickets` that covers:
    /// one verdict per ticket, in order. A ticket not covered is not known durable.
    pub fn confirm(&mut self, tickets: &[Ticket]) -> Vec<Result<(), String>> {
        if tickets.is_empty() {
            return Vec::new();
        }
        let done = self.barrier();
        let verdicts: Vec<Result<(), String>> = tickets
            .iter()
            .map(|t| match &done {
                Err(e) => Err(e.clone()),
                Ok((gen, server)) if *gen == t.gen && *server == t.server => Ok(()),
                Ok((_, server)) if *server != t.server => Err(format!(
                    "the batch was committed on another database server (started {}) than the \
                     one that flushed (started {server}): its durability is unknown",
                    t.server
                )),
                Ok(_) => Err(
                    "the flush connection was reopened after the batch began: whether the \
                     database kept it is unknown"
                        .into(),
                ),
            })
            .collect();
        let failed = verdicts.iter().any(Result::is_err);
        self.ledger.resolved(tickets.len() as u64, failed);
        verdicts
    }

    /// One barrier commit: the generation and server it ran on.
    fn barrier(&mut self) -> Result<(u64, String), String> {
        if self.conn.as_ref().is_none_or(|c| c.client.is_closed()) {
            self.connect()?;
        }
        let Some(c) = self.conn.as_mut() else {
            return Err("no flush connection to PostgreSQL".into());
        };
        match c.client.execute(&c.barrier, &[]) {
            Ok(1) => Ok((c.gen, c.server.clone())),
            Ok(n) => Err(format!(
                "the flush table {}_flush has {n} rows instead of one",
                self.settings.table
            )),
            Err(e) => {
                let msg = format!(
                    "PostgreSQL at {}: the WAL flush of committed batches failed: {}",
                    self.settings.target,
                    why(&e)
                );
                // Reopened at once (a new generation), so that the batches that begin from
                // now on can be confirmed; those before it cannot.
                if let Err(e) = self.connect() {
                    log::warn!("{e}");
                }
                Err(msg)
            }
        }
    }
}
