//! The head of a client request, read once before anything runs: the canonical path, the
//! list form of `GET ?list=true`, the response-wrapping TTL (`X-Vault-Wrap-TTL`) and the
//! replication state the client asks for (`X-Vault-Index`), and a `PATCH` body's media type
//! (a JSON merge patch, as the reference insists: 415 for another type, 400 for none). A bad
//! value refuses the request with 400 (415) before routing, authorization or any handler, so it changes nothing; what comes
//! after (audit, router, handlers, wrapping) reads the typed fields, never the raw headers.

use crate::api::{ApiError, ApiResult, Method, Request, MERGE_PATCH};
use crate::replication::index_state::IndexState;
use crate::routes;
use crate::time;

/// A request head that parsed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Head {
    /// The canonical path ([`routes::canonical`]), also written back into the request.
    pub path: String,
    /// The response-wrapping TTL in seconds, when the client asked for wrapping.
    pub wrap_ttl: Option<u64>,
    /// The replication state the request must see applied, when the client sent one.
    pub index: Option<IndexState>,
}

impl Head {
    /// Parses `req`'s head and rewrites `req` to its canonical form: the canonical path, and
    /// `LIST` for a `GET` with `list=true` (or `1`).
    pub fn parse(req: &mut Request) -> ApiResult<Head> {
        if req.method == Method::Get && matches!(req.query("list"), Some("true") | Some("1")) {
            req.method = Method::List;
        }
        if req.method == Method::Patch && req.on_behalf.is_none() {
            // A performance secondary checked its client's request before forwarding it.
            patch_media_type(req.content_type.as_deref())?;
        }
        let path = routes::canonical(&req.path)?;
        req.path = path.clone();
        let wrap_ttl = match req.wrap_ttl.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(t) => Some(
                time::parse_duration(t)
                    .map_err(|e| ApiError::bad(format!("X-Vault-Wrap-TTL: {e}")))?,
            ),
        };
        let index = match req.index.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(h) => Some(IndexState::decode(h).map_err(ApiError::BadRequest)?),
        };
        Ok(Head {
            path,
            wrap_ttl,
            index,
        })
    }
}

/// Checks a `PATCH`'s `Content-Type`: its media type (parameters such as `charset` aside,
/// compared without regard to case) must be [`MERGE_PATCH`].
fn patch_media_type(content_type: Option<&str>) -> ApiResult<()> {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(str::trim)
        .unwrap_or("");
    if media.is_empty() {
        return Err(ApiError::bad(format!(
            "PATCH requires Content-Type of {MERGE_PATCH}; the request has no media type"
        )));
    }
    if !media.eq_ignore_ascii_case(MERGE_PATCH) {
        return Err(ApiError::UnsupportedMediaType(format!(
            "PATCH requires Content-Type of {MERGE_PATCH}, provided {media}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(path: &str) -> Request {
        Request::new(1, Method::Get, path)
    }

    #[test]
    fn a_good_head_is_read_into_typed_fields() {
        let mut r = req("/secret//x");
        assert!(Head::parse(&mut r).is_err(), "a doubled slash is refused");
        let mut r = req("/sys/mounts/");
        r.wrap_ttl = Some(" 90s ".into());
        let st = IndexState {
            perf_cluster_id: "c1".into(),
            dr_cluster_id: String::new(),
            index: 7,
        };
        r.index = Some(st.encode());
        let h = Head::parse(&mut r).unwrap();
        assert_eq!(h.path, "sys/mounts");
        assert_eq!(
            r.path, "sys/mounts",
            "the request carries the canonical path"
        );
        assert_eq!(h.wrap_ttl, Some(90));
        assert_eq!(h.index, Some(st));
    }

    #[test]
    fn patch_wants_a_merge_patch_media_type() {
        let patch = |ct: Option<&str>| {
            let mut r = Request::new(1, Method::Patch, "secret/data/x");
            r.content_type = ct.map(str::to_string);
            Head::parse(&mut r).map(|_| ())
        };
        for ok in [
            "application/merge-patch+json",
            "Application/Merge-Patch+JSON",
            "application/merge-patch+json; charset=utf-8",
            " application/merge-patch+json ; x=1",
        ] {
            assert_eq!(patch(Some(ok)), Ok(()), "{ok}");
        }
        for (ct, status) in [
            (Some("application/json"), 415),
            (Some("application/x-www-form-urlencoded"), 415),
            (Some("text/plain; charset=utf-8"), 415),
            (None, 400),
            (Some(""), 400),
            (Some(" ; charset=utf-8"), 400),
        ] {
            let e = patch(ct).unwrap_err();
            assert_eq!(e.status(), status, "{ct:?}: {e}");
            assert!(e.to_string().contains(MERGE_PATCH), "{e}");
        }
        let e = patch(Some("application/json")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "PATCH requires Content-Type of application/merge-patch+json, provided application/json"
        );
        // Other methods do not look at the content type.
        let mut r = Request::new(1, Method::Post, "secret/data/x");
        r.content_type = Some("text/plain".into());
        assert!(Head::parse(&mut r).is_ok());
    }

    #[test]
    fn get_with_list_true_is_a_list() {
        for (q, list) in [("true", true), ("1", true), ("false", false)] {
            let mut r = req("secret/");
            r.query = vec![("list".into(), q.into())];
            Head::parse(&mut r).unwrap();
            assert_eq!(r.method == Method::List, list, "list={q}");
        }
    }

    #[test]
    fn bad_values_are_a_400_naming_the_header() {
        let mut r = req("secret/x");
        r.wrap_ttl = Some("zzz".into());
        let e = Head::parse(&mut r).unwrap_err();
        assert!(
            matches!(e, ApiError::BadRequest(ref m) if m.contains("X-Vault-Wrap-TTL")),
            "{e:?}"
        );
        let mut r = req("secret/x");
        r.index = Some("%%%".into());
        let e = Head::parse(&mut r).unwrap_err();
        assert!(
            matches!(e, ApiError::BadRequest(ref m) if m.contains("X-Vault-Index")),
            "{e:?}"
        );
        let mut r = req("secret/../sys/seal");
        assert!(matches!(Head::parse(&mut r), Err(ApiError::BadRequest(_))));
    }

    #[test]
    fn empty_headers_mean_absent() {
        let mut r = req("secret/x");
        r.wrap_ttl = Some(" ".into());
        r.index = Some(String::new());
        let h = Head::parse(&mut r).unwrap();
        assert_eq!((h.wrap_ttl, h.index), (None, None));
    }
}
