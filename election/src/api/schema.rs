//! The OpenAPI types every handler's annotation names: the error body
//! (defined beside `ApiError`, which alone builds it), the path and holder
//! parameters, and the error-response lists (written once,
//! one per kind of call).

use std::collections::BTreeMap;

use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::IntoResponses;

use palisade_names::MAX_HOLDER_LEN;

/// A lease name: 1..=128 of `A-Z a-z 0-9 . _ -`, not `.` or `..` (the
/// schema also keeps a leading `.` out, which the servers accept).
#[derive(Debug, utoipa::ToSchema)]
#[schema(value_type = String, pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$", example = "orders")]
pub struct LeaseNameParam(#[allow(dead_code)] String);

/// A holder name: 1..=256 characters, no control characters (what
/// `palisade_names::Holder` enforces; derive cannot state lengths on a
/// newtype, so the schema is written out).
#[derive(Debug)]
pub struct HolderParam;

impl utoipa::PartialSchema for HolderParam {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_HOLDER_LEN))
            .pattern(Some(
                "^[^\\u0000-\\u001F\\u007F-\\u009F\\u061C\\u200E\\u200F\\u202A-\\u202E\\u2066-\\u2069]+$",
            ))
            .examples(["worker-1"])
            .into()
    }
}

impl utoipa::ToSchema for HolderParam {}

/// The error answers of `statuses`, each an
/// [`ErrorBody`](crate::error::ErrorBody).
fn error_responses(statuses: &[u16]) -> BTreeMap<String, RefOr<Response>> {
    statuses
        .iter()
        .map(|status| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build();
            let response = ResponseBuilder::new()
                .description("")
                .content("application/json", body)
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// The errors of a call on a lease that proposes or extends a grant.
#[derive(Debug)]
pub struct LeaseCallErrors;

impl IntoResponses for LeaseCallErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        error_responses(&[400, 401, 403, 408, 409, 413, 415, 429, 503])
    }
}

/// The errors of a read of leases.
#[derive(Debug)]
pub struct ReadErrors;

impl IntoResponses for ReadErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        error_responses(&[400, 401, 403, 404, 429, 503])
    }
}

/// The errors of a change to the cluster (keys, members).
#[derive(Debug)]
pub struct ClusterChangeErrors;

impl IntoResponses for ClusterChangeErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        error_responses(&[400, 401, 403, 404, 408, 409, 413, 415, 503])
    }
}

/// The errors of a batch renewal (each lease's own answer is in the body).
#[derive(Debug)]
pub struct BatchErrors;

impl IntoResponses for BatchErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        error_responses(&[400, 401, 408, 413, 415, 429, 503])
    }
}
