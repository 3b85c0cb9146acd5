//! [`PrefixWatch`]: one stream of the changes to every lease under a
//! prefix (`GET /v1/watch`), read as typed [`WatchEvent`]s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde_json::Value;

use crate::error::Error;
use crate::model::LeaseInfo;
use crate::transport::answer::Answer;
use crate::transport::Transport;

/// How long an open watch's request may last (the server ends it first).
const STREAM_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest line the SDK accepts (a lease with its fields is far less).
const MAX_LINE: usize = 1 << 20;

/// One event of a [`PrefixWatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A lease under the prefix changed: `lease` as the change at `index`
    /// left it.
    Changed {
        /// The change's log index (the lease's `modify_index`).
        index: u64,
        /// The lease.
        lease: LeaseInfo,
    },
    /// A free lease's record was reclaimed (forgotten) at `index`.
    Deleted {
        /// The reclaim's log index.
        index: u64,
        /// The lease's name.
        lease: String,
    },
    /// A keep-alive: every change up to `index` has been sent.
    Progress {
        /// Where to resume from.
        index: u64,
    },
}

impl WatchEvent {
    /// The index the event carries (where a new watch resumes after it).
    pub fn index(&self) -> u64 {
        match self {
            WatchEvent::Changed { index, .. }
            | WatchEvent::Deleted { index, .. }
            | WatchEvent::Progress { index } => *index,
        }
    }
}

/// An open prefix watch ([`crate::Client::watch_prefix`]). Read it with
/// [`PrefixWatch::next`]; once it ends (`None`, or an error), open another
/// from [`PrefixWatch::index`] to resume where it stopped.
#[derive(Debug)]
pub struct PrefixWatch {
    response: reqwest::Response,
    buffer: BytesMut,
    index: u64,
    ended: bool,
}

impl PrefixWatch {
    /// Opens a watch of `prefix` after `index` on the first node that
    /// answers, trying each configured node once in turn.
    pub(crate) async fn open(
        transport: &Arc<Transport>,
        prefix: &str,
        index: u64,
    ) -> Result<Self, Error> {
        let path = format!(
            "/v1/watch?prefix={}&index={index}",
            crate::model::encode_key(prefix)
        );
        let started = Instant::now();
        let first = transport.preferred();
        let mut last = String::from("no node answered");
        for attempt in 0..transport.endpoint_count().max(1) {
            let at = first + attempt;
            let url = transport.url(at, &path);
            let sent = transport.http().get(&url).timeout(STREAM_TIMEOUT).send();
            let failure = match tokio::time::timeout(transport.config.request_timeout, sent).await {
                Ok(Ok(response)) if response.status() == 200 => {
                    return Ok(Self {
                        response,
                        buffer: BytesMut::new(),
                        index,
                        ended: false,
                    })
                }
                Ok(Ok(response)) if !matches!(response.status().as_u16(), 503 | 429) => {
                    let status = response.status().as_u16();
                    let body = response.json().await.unwrap_or(Value::Null);
                    return Err(Answer { status, body }.error());
                }
                Ok(Ok(response)) => format!("{url}: {}", response.status()),
                Ok(Err(err)) => format!("{url}: {}", crate::transport::error_chain(&err)),
                Err(_) => format!("{url}: no answer in time"),
            };
            transport.pass_over(at);
            last = failure;
        }
        Err(Error::Unavailable {
            attempts: transport.endpoint_count().max(1) as u32,
            elapsed: started.elapsed(),
            last,
        })
    }

    /// Where a new watch resumes: the index of the last event read (or the
    /// one this watch was opened with).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The next event; `None` once the stream ended cleanly (the server
    /// closed it). A stream the server ends early (the client fell behind,
    /// or a policy reload took the right away) answers its error once,
    /// then `None`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the connection fails or the server says
    /// the watch fell behind; [`Error::Unauthorized`] / [`Error::Forbidden`]
    /// after a policy reload; [`Error::Protocol`] for a line that is not an
    /// event.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, Error>> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line = self.buffer.split_to(at + 1);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event = self.event(&line[..at]);
                if event.is_err() {
                    self.ended = true;
                }
                return Some(event);
            }
            if self.buffer.len() > MAX_LINE {
                return Some(Err(self.end_with("a line longer than 1 MiB")));
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => {
                    self.ended = true;
                    return None;
                }
                Err(err) => {
                    self.ended = true;
                    return Some(Err(Error::Unavailable {
                        attempts: 1,
                        elapsed: Duration::ZERO,
                        last: format!("the watch was cut: {}", crate::transport::error_chain(&err)),
                    }));
                }
            }
        }
    }

    fn end_with(&mut self, message: &str) -> Error {
        self.ended = true;
        Error::Protocol {
            status: 200,
            message: message.to_owned(),
        }
    }

    /// One line as an event (or the error it ends the stream with).
    fn event(&mut self, line: &[u8]) -> Result<WatchEvent, Error> {
        let value: Value = serde_json::from_slice(line).map_err(|e| Error::Protocol {
            status: 200,
            message: format!("a watch line that is not JSON: {e}"),
        })?;
        let index = value["index"].as_u64().ok_or_else(|| Error::Protocol {
            status: 200,
            message: "a watch line without an index".into(),
        })?;
        if let Some(code) = value["error"].as_str() {
            self.index = self.index.max(index);
            let status = match code {
                "unauthorized" => 401,
                "forbidden" => 403,
                _ => {
                    return Err(Error::Unavailable {
                        attempts: 1,
                        elapsed: Duration::ZERO,
                        last: format!("{code}: {}", value["message"].as_str().unwrap_or("")),
                    })
                }
            };
            return Err(Answer {
                status,
                body: value,
            }
            .error());
        }
        let event = if value["deleted"].as_bool() == Some(true) {
            let lease = value["lease_name"].as_str().unwrap_or_default().to_owned();
            WatchEvent::Deleted { index, lease }
        } else if value.get("lease").is_some() {
            let lease =
                serde_json::from_value(value["lease"].clone()).map_err(|e| Error::Protocol {
                    status: 200,
                    message: format!("a watch line with a malformed lease: {e}"),
                })?;
            WatchEvent::Changed { index, lease }
        } else {
            WatchEvent::Progress { index }
        };
        self.index = self.index.max(index);
        Ok(event)
    }
}
