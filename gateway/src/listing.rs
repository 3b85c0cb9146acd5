//! `GET /v1/objects?prefix=&after=&limit=`: one page of the objects under
//! a key prefix, in key order, and under a policy only those whose lease
//! the caller may read.
//!
//! A page costs at most `limit` keys of the store, whatever the policy
//! leaves out: `next` is the last key the store gave, so a caller walks
//! the whole prefix in bounded steps even when most keys are not its to
//! read (a page may then hold fewer than `limit`, or none, with a `next`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::{Extension, Json};
use palisade_serve::policy::{Principal, Right};
use palisade_store::{FencedStore, MAX_KEY_LEN, MAX_LIST_PAGE};
use serde::Deserialize;

use crate::error::ApiError;
use crate::schema::{ObjectInfo, ObjectList, ReadErrors};
use crate::state::AppState;

/// A page's size when `limit` is not given.
pub const DEFAULT_PAGE: usize = 100;

/// The query of a listing.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Keys that start with this (empty: every key). A prefix may span
    /// leases: `ord` lists `orders/...` and `ordinal/...`. No control
    /// character, at most 1 024 characters (a key is at most 1 024 bytes).
    #[serde(default)]
    #[param(max_length = 1024, pattern = r"^[^\x00-\x1F\x7F-\x9F]*$")]
    prefix: String,
    /// Start after this key (the `next` of the page before); as `prefix`.
    #[param(max_length = 1024, pattern = r"^[^\x00-\x1F\x7F-\x9F]*$")]
    after: Option<String>,
    /// 1..=1000, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

#[utoipa::path(get, path = "/v1/objects", tag = "objects", params(ListQuery),
    responses((status = 200, body = ObjectList), ReadErrors))]
/// `GET /v1/objects`: one page of the objects under `prefix`, after
/// `after`, in key order.
pub async fn list<S: FencedStore>(
    State(state): State<AppState<S>>,
    principal: Option<Extension<Principal>>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ObjectList>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_LIST_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be 1..={MAX_LIST_PAGE}, not {limit}"
        )));
    }
    for (name, text) in [
        ("prefix", Some(&query.prefix)),
        ("after", query.after.as_ref()),
    ] {
        check_bound(name, text.map_or("", String::as_str))?;
    }
    let page = state
        .store
        .list(&query.prefix, query.after.as_deref(), limit)
        .await?;
    let next = page
        .more
        .then(|| page.objects.last().map(|o| o.key.clone()))
        .flatten();
    let readable = Readable::new(&state, principal.map(|p| p.0), &query.prefix);
    let objects = page
        .objects
        .into_iter()
        .filter(|object| readable.may_read(&object.key))
        .map(|object| ObjectInfo {
            key: object.key,
            version: object.version,
            token: object.token.0,
            size: object.size,
        })
        .collect();
    Ok(Json(ObjectList { objects, next }))
}

/// A prefix or `after` no key could reach is refused rather than scanned
/// for: keys hold no control character and at most `MAX_KEY_LEN` bytes
/// (counted here in characters, as the OpenAPI document's `maxLength`
/// counts them).
fn check_bound(name: &str, text: &str) -> Result<(), ApiError> {
    if text.chars().count() > MAX_KEY_LEN {
        return Err(ApiError::BadRequest(format!(
            "{name} is longer than a key can be ({MAX_KEY_LEN} characters)"
        )));
    }
    if text.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(format!(
            "{name} has a control character, which no key has"
        )));
    }
    Ok(())
}

/// Which listed keys the caller may see: all without a policy or with
/// `read` on every lease the prefix can name; else each key's lease asks.
enum Readable {
    All,
    PerLease(std::sync::Arc<palisade_serve::policy::Policy>, Principal),
}

impl Readable {
    fn new<S>(state: &AppState<S>, principal: Option<Principal>, prefix: &str) -> Self {
        let (Some(policy), Some(principal)) = (&state.policy, principal) else {
            return Readable::All;
        };
        let policy = policy.current();
        let whole = match prefix.split_once('/') {
            // A key prefix inside one lease: that lease's right decides.
            Some((lease, _)) => policy.allow(&principal, Right::Read, lease),
            None => policy.allow_prefix(&principal, Right::Read, prefix),
        };
        match whole {
            Ok(()) => Readable::All,
            Err(_) => Readable::PerLease(policy, principal),
        }
    }

    fn may_read(&self, key: &str) -> bool {
        match self {
            Readable::All => true,
            Readable::PerLease(policy, principal) => {
                let lease = key.split('/').next().unwrap_or(key);
                policy.allow(principal, Right::Read, lease).is_ok()
            }
        }
    }
}
