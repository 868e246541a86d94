//! The node's side of [`crate::replication::forward`]: a performance secondary sending a
//! request to its primary instead of applying it (a write of replicated data, or a read it
//! is not caught up for when the client allows it), and a primary checking that what it
//! runs for a secondary writes only replicated data.

use super::{Node, Output};
use crate::api::{ApiError, ApiResult, Reply, Request, Response};
use crate::ctx::Ctx;
use crate::replication::class::Class;
use crate::replication::forward::{self, OnBehalf};
use crate::storage::{Storage, Txn, WriteSet};
use crate::{router, token};

impl<S: Storage> Node<S> {
    /// Whether a write set touches replicated data (a performance secondary must not write it).
    pub(super) fn writes_replicated(&self, ws: &WriteSet) -> ApiResult<bool> {
        let classes = self.st.repl.classes(&self.storage, &self.barrier, ws)?;
        Ok(classes.iter().any(|(_, c)| *c == Class::Replicated))
    }

    /// A primary running a secondary's request: its writes must all be replicated data
    /// (what the secondary cannot write itself), and replicated to that secondary (not
    /// left out by its paths filter); anything else is refused whole.
    pub(super) fn only_replicated(&mut self, on: &OnBehalf, ws: &WriteSet) -> ApiResult<()> {
        let classes = self.st.repl.classes(&self.storage, &self.barrier, ws)?;
        if let Some((key, c)) = classes.iter().find(|(_, c)| *c != Class::Replicated) {
            return Err(ApiError::Forbidden(format!(
                "a request forwarded by a performance secondary may write only replicated \
                 data, and this one writes {c:?} data ({key:?}): nothing was applied"
            )));
        }
        let ctx = node_ctx!(self);
        forward::check_writes_replicated_to(&ctx, on, classes.iter().map(|(k, _)| k.as_str()))
    }

    /// A performance secondary sends a request it authorized (and whose own writes it
    /// dropped) to its primary; the answer comes back as an `Input::PeerReply`. A use of a
    /// limited-use token is spent here, where the token lives.
    pub(super) fn forward_to_primary(&mut self, req: Request, spend: Option<&str>) -> ApiResult {
        let caller = {
            let mut ctx = node_ctx!(self);
            req.token
                .as_deref()
                .filter(|t| !t.is_empty())
                .map(|t| token::lookup(&mut ctx, t))
                .transpose()?
                .flatten()
                .map(|(_, e)| OnBehalf::of(&e))
        };
        let Some(caller) = caller else {
            // A route without a token that writes replicated data: nothing to vouch for.
            return Err(ApiError::bad(
                "this cluster is a performance secondary: replicated data is read-only here, \
                 and this request has no token to forward it to the primary with; send it to \
                 the primary",
            ));
        };
        self.spend(spend)?;
        forward::send(&mut self.env(), &req, caller)?;
        Ok(Reply::Pending)
    }

    /// `X-Vault-Inconsistent: forward-active-node` on a performance secondary that has not
    /// reached the request's `X-Vault-Index`: the request is authorized here and sent to the
    /// primary; `not_caught_up` (the 412) is the answer when it cannot be.
    pub(super) fn forward_inconsistent(
        &mut self,
        req: Request,
        not_caught_up: ApiError,
    ) -> ApiResult {
        if !self.st.repl.is_perf_secondary() {
            return Err(not_caught_up);
        }
        let mut ctx = node_ctx!(self);
        let authorized = router::authorize_only(&mut ctx, &mut self.st, &req);
        drop(ctx);
        // Taken before any error returns: a refused request spends its use too, and never
        // leaves it for a later request to spend.
        let spend = self.st.spend_use.take();
        let caller = match authorized {
            Ok(caller) => caller,
            Err(e) => {
                self.spend(spend.as_deref())?;
                return Err(e);
            }
        };
        let Some(caller) = caller else {
            return Err(not_caught_up);
        };
        self.spend(spend.as_deref())?;
        forward::send(&mut self.env(), &req, OnBehalf::of(&caller.entry))?;
        Ok(Reply::Pending)
    }

    /// Spends one use of the limited-use token `hash`, in a write set of its own.
    pub(super) fn spend(&mut self, hash: Option<&str>) -> ApiResult<()> {
        let Some(h) = hash else { return Ok(()) };
        let mut ctx = node_ctx!(self);
        super::spend_use(&mut ctx, h)?;
        let writes = ctx.txn.into_write_set();
        self.commit(writes)
    }

    /// Answers a client whose request went to another node (the active node of this HA
    /// cluster, or the primary cluster) with what came back.
    pub(super) fn answer_forwarded(&mut self, resp: Response) {
        self.st.outputs.push_back(Output::Response(resp));
    }
}
