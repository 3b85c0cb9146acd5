//! `GET /v1/objects?prefix=&after=&limit=`: one page of the objects under
//! a key prefix, in key order, and under a policy only those whose lease
//! the caller may read.
//!
//! The scan is confined to what the caller may read: under a policy that
//! does not give it the whole prefix, the store is asked only for the keys
//! under each of its read prefixes that lie inside the query's (in key
//! order: disjoint prefixes order their keys as they order themselves), so
//! a page costs at most `limit` keys per read prefix, and `next`, the last
//! key of a full page, is always a key the caller may read. (It once was
//! the last key the store gave, read or not, and named every key of the
//! gateway to any principal, one page at a time.)

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
    let readable = Readable::new(&state, principal.map(|p| p.0), &query.prefix);
    let mut objects = Vec::new();
    let mut more = false;
    for prefix in readable.scan(&query.prefix) {
        let room = limit - objects.len();
        let after = objects
            .last()
            .map(|o: &palisade_store::ObjectSummary| o.key.clone())
            .or_else(|| query.after.clone());
        let page = state.store.list(&prefix, after.as_deref(), room).await?;
        objects.extend(
            page.objects
                .into_iter()
                .filter(|object| readable.may_read(&object.key)),
        );
        // A page cut short by the room left, or a full page: more may
        // follow (the next page may then be empty).
        if page.more || objects.len() >= limit {
            more = true;
            break;
        }
    }
    // Every key here is one the caller may read, so `next` names no other.
    let next = more
        .then(|| objects.last().map(|o| o.key.clone()))
        .flatten();
    let objects = objects
        .into_iter()
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

    /// The key prefixes to scan for a listing under `asked`, in key order:
    /// `asked` itself when every key under it may be read; else each of the
    /// caller's read prefixes that lies inside `asked` (or `asked`, when it
    /// lies inside one), without those inside another.
    fn scan(&self, asked: &str) -> Vec<String> {
        let Readable::PerLease(policy, principal) = self else {
            return vec![asked.to_owned()];
        };
        let mut prefixes: Vec<String> = policy
            .prefixes(principal, Right::Read)
            .iter()
            // A lease name has no '/': such a right covers no lease.
            .filter(|p| !p.contains('/'))
            .filter_map(|p| {
                if p.starts_with(asked) {
                    Some(p.clone())
                } else if asked.starts_with(p.as_str()) {
                    Some(asked.to_owned())
                } else {
                    None
                }
            })
            .collect();
        prefixes.sort();
        prefixes.dedup();
        let mut disjoint: Vec<String> = Vec::new();
        for prefix in prefixes {
            if !disjoint
                .last()
                .is_some_and(|kept| prefix.starts_with(kept.as_str()))
            {
                disjoint.push(prefix);
            }
        }
        disjoint
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
