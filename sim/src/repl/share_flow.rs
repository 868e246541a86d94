//! A key-share flow as the operator drives it. `sys/generate-root` on a performance
//! secondary and the DR operation token on a DR secondary are the same exchange: start an
//! attempt (the node answers an OTP and a nonce), send key shares with the nonce, decode the
//! OTP-encoded token from the last answer; after a refusal, cancel and start again. One
//! state and one set of answer handlers serve both.

use super::reply::Answer;
use cairn_core::replication::dr_token::decode_token;

/// Where one flow stands.
#[derive(Debug, Clone, Default)]
pub(super) struct ShareFlow {
    /// (otp, nonce) of the attempt in progress.
    pub(super) gen: Option<(String, String)>,
    /// The attempt must be cancelled before the next one starts.
    pub(super) cancel: bool,
    /// Attempts that ended without a token.
    pub(super) tries: u32,
}

/// The flow's next request.
pub(super) enum ShareStep<'a> {
    Cancel,
    Start,
    /// Send a key share with this nonce.
    Update(&'a str),
}

impl ShareFlow {
    pub(super) fn next(&self) -> ShareStep<'_> {
        match &self.gen {
            _ if self.cancel => ShareStep::Cancel,
            None => ShareStep::Start,
            Some((_, nonce)) => ShareStep::Update(nonce),
        }
    }

    /// The answer to starting an attempt: its OTP and nonce, or a cancel and a new try.
    pub(super) fn on_started(&mut self, a: &Answer) {
        let field = |k: &str| a.body[k].as_str().or_else(|| a.body["data"][k].as_str());
        match (a.ok, field("otp"), field("nonce")) {
            (true, Some(o), Some(n)) => self.gen = Some((o.to_string(), n.to_string())),
            _ if a.resp.is_ok() => {
                self.cancel = true;
                self.tries += 1;
            }
            _ => {}
        }
    }

    /// The answer to a cancel.
    pub(super) fn on_cancelled(&mut self, a: &Answer) {
        if a.resp.is_ok() {
            self.cancel = false;
            self.gen = None;
        }
    }

    /// The answer to a key share: the token, decoded with the attempt's OTP, once the
    /// threshold is reached; any other answer ends the attempt (cancel, try again). A lost
    /// answer changes nothing (the next share goes to the same attempt).
    pub(super) fn on_update(&mut self, a: &Answer) -> Option<String> {
        let enc = a.body["encoded_token"]
            .as_str()
            .or_else(|| a.body["data"]["encoded_token"].as_str());
        let otp = self.gen.as_ref().map(|g| g.0.clone()).unwrap_or_default();
        match enc.map(|e| decode_token(e, &otp)) {
            Some(Ok(t)) if a.ok => {
                self.gen = None;
                Some(t)
            }
            _ if a.resp.is_ok() => {
                self.gen = None;
                self.cancel = true;
                self.tries += 1;
                None
            }
            _ => None,
        }
    }
}
