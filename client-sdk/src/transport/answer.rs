//! [`Answer`]: one HTTP answer of a server, and the [`Error`] an error
//! answer means (one mapping for the election nodes and the gateway).

use std::time::Duration;

use serde_json::Value;

use crate::error::Error;

/// One HTTP answer: status and JSON body (Null when not JSON).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

impl Answer {
    fn message(&self) -> String {
        self.body["message"].as_str().unwrap_or("").to_owned()
    }

    /// The body as `T` if the status is 200; the mapped error otherwise.
    pub(crate) fn parse<T: serde::de::DeserializeOwned>(self) -> Result<T, Error> {
        if self.status == 200 {
            return serde_json::from_value(self.body).map_err(|e| Error::Protocol {
                status: 200,
                message: e.to_string(),
            });
        }
        Err(self.error())
    }

    /// Maps an error answer to an [`Error`].
    pub(crate) fn error(&self) -> Error {
        match (self.status, self.body["error"].as_str()) {
            (409, Some("held")) => Error::Held {
                holder: self.body["holder"].as_str().unwrap_or("").to_owned(),
                token: self.body["token"].as_u64().unwrap_or(0),
            },
            (409, Some("lost" | "max_hold")) => Error::LeaseLost(self.message()),
            (409, Some("preempted")) => Error::Preempted(self.message()),
            (409, Some("lock_delay")) => Error::LockDelay {
                retry_after: Duration::from_millis(
                    self.body["retry_after_ms"].as_u64().unwrap_or(0),
                ),
            },
            (409, Some("stale_token")) => Error::Fenced {
                token: self.body["token"].as_u64().unwrap_or(0),
                fence: self.body["fence"].as_u64().unwrap_or(0),
            },
            (412, _) => Error::PreconditionFailed {
                key: self.body["key"].as_str().unwrap_or("").to_owned(),
                current_version: self.body["current_version"].as_u64(),
            },
            (404, _) => Error::NotFound(self.message()),
            (401, _) => Error::Unauthorized(self.message()),
            (403, _) => Error::Forbidden(self.message()),
            (400 | 413, _) => Error::BadRequest(self.message()),
            (status, _) => Error::Protocol {
                status,
                message: self.message(),
            },
        }
    }
}
