//! Objects through the gateway, typed: what a fenced write answers
//! ([`Written`], [`Deleted`]), what a listing holds ([`ObjectInfo`],
//! [`ObjectPage`]), and the [`Precondition`] a write may carry
//! (`If-Match`/`If-None-Match`, checked by the gateway in the same atomic
//! step as the fence).
//!
//! The writes are [`Lease`]'s: stamped with its JWT, refused locally once
//! it is not held, and a stale token marks it lost.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::lease::Lease;
use crate::model::encode_key;

/// What an accepted `PUT` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    /// The key written.
    pub key: String,
    /// The object's new version (its `ETag`).
    pub version: u64,
    /// The token the write carried.
    pub token: u64,
}

/// What an accepted `DELETE` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    /// The key deleted.
    pub key: String,
    /// Whether there was an object (the fence is raised either way).
    pub deleted: bool,
    /// The token the delete carried.
    pub token: u64,
}

/// One object of a listing, or what `HEAD` says of one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// Its key.
    pub key: String,
    /// Its version (its `ETag`).
    pub version: u64,
    /// The token of the write that stored it.
    pub token: u64,
    /// The value's length in bytes.
    pub size: u64,
}

/// One page of [`crate::Client::list_objects`], in key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectPage {
    /// Under a policy, only keys whose lease this client may read: a page
    /// may hold fewer than the limit while more follow.
    pub objects: Vec<ObjectInfo>,
    /// Pass as `after` for the next page; `None` when no key under the
    /// prefix follows.
    pub next: Option<String>,
}

/// What a write requires of the object it replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precondition {
    /// Nothing: the write replaces whatever is there.
    #[default]
    Any,
    /// The object is at this version (`If-Match`).
    Version(u64),
    /// An object exists (`If-Match: *`).
    Exists,
    /// No object exists (`If-None-Match: *`; `PUT` only).
    Absent,
}

impl Precondition {
    fn headers(self) -> Vec<(&'static str, String)> {
        match self {
            Precondition::Any => vec![],
            Precondition::Version(v) => vec![("if-match", format!("\"{v}\""))],
            Precondition::Exists => vec![("if-match", "*".to_owned())],
            Precondition::Absent => vec![("if-none-match", "*".to_owned())],
        }
    }
}

impl Lease {
    /// Writes `value` at `key` (whose first segment must be this lease's name)
    /// through the gateway, stamped with the lease token. Refused locally,
    /// with nothing sent, once the lease is not held.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] (locally), [`Error::Fenced`] (a newer holder has
    /// written; the lease is marked lost), [`Error::Unavailable`].
    pub async fn put(&self, key: &str, value: impl Into<Bytes>) -> Result<Written, Error> {
        self.put_if(key, value, Precondition::Any).await
    }

    /// [`Lease::put`] only if the object satisfies `when`.
    ///
    /// # Errors
    /// As [`Lease::put`]; [`Error::PreconditionFailed`] (with the object's
    /// version now) when it does not, and nothing changed.
    pub async fn put_if(
        &self,
        key: &str,
        value: impl Into<Bytes>,
        when: Precondition,
    ) -> Result<Written, Error> {
        let path = format!("/v1/objects/{}", encode_key(key));
        let answer = self
            .gateway_write(
                reqwest::Method::PUT,
                &path,
                &when.headers(),
                Some(value.into()),
            )
            .await?;
        typed(answer)
    }

    /// Deletes `key` through the gateway (fenced like [`Lease::put`]).
    ///
    /// # Errors
    /// As [`Lease::put`].
    pub async fn delete(&self, key: &str) -> Result<Deleted, Error> {
        self.delete_if(key, Precondition::Any).await
    }

    /// [`Lease::delete`] only if the object satisfies `when`
    /// ([`Precondition::Absent`] is refused by the gateway: 400).
    ///
    /// # Errors
    /// As [`Lease::put_if`].
    pub async fn delete_if(&self, key: &str, when: Precondition) -> Result<Deleted, Error> {
        let path = format!("/v1/objects/{}", encode_key(key));
        let answer = self
            .gateway_write(reqwest::Method::DELETE, &path, &when.headers(), None)
            .await?;
        typed(answer)
    }
}

fn typed<T: serde::de::DeserializeOwned>(answer: Value) -> Result<T, Error> {
    serde_json::from_value(answer).map_err(|e| Error::Protocol {
        status: 200,
        message: format!("a gateway answer the SDK cannot read: {e}"),
    })
}
