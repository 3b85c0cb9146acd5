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

/// A stream silent this long is taken for dead: the server sends a
/// keep-alive every 10 s (the default `keepalive_ms`).
const SILENT_FOR: Duration = Duration::from_secs(35);

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
    /// Opens a watch of `prefix` after `index` (of `partition`'s log, if
    /// it names one) on the first node that answers, trying each
    /// configured node once in turn (the partition's leader first, when
    /// known).
    pub(crate) async fn open(
        transport: &Arc<Transport>,
        prefix: &str,
        partition: Option<usize>,
        index: u64,
    ) -> Result<Self, Error> {
        let mut path = format!(
            "/v1/watch?prefix={}&index={index}",
            crate::model::encode_key(prefix)
        );
        if let Some(partition) = partition {
            path.push_str(&format!("&partition={partition}"));
        }
        let started = Instant::now();
        let first = partition
            .and_then(|k| transport.leader_endpoint(k))
            .unwrap_or_else(|| transport.preferred());
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
    /// [`Error::Unavailable`] when the connection fails, the server says
    /// the watch fell behind, or nothing (not even a keep-alive) came for
    /// 35 s; [`Error::Unauthorized`] / [`Error::Forbidden`]
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
            let Ok(chunk) = tokio::time::timeout(SILENT_FOR, self.response.chunk()).await else {
                self.ended = true;
                return Some(Err(Error::Unavailable {
                    attempts: 1,
                    elapsed: SILENT_FOR,
                    last: format!(
                        "the watch sent nothing, not even a keep-alive, for {SILENT_FOR:?}"
                    ),
                }));
            };
            match chunk {
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

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::transport::config::ClientConfig;

    /// A one-shot HTTP/1.1 server answering `status` and `body`, then
    /// closing; its URL.
    async fn server(status: &'static str, body: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            while !request.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                if socket.read(&mut byte).await.expect("read") == 0 {
                    return;
                }
                request.push(byte[0]);
            }
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/x-ndjson\r\nconnection: close\r\n\r\n{body}"
            );
            socket.write_all(answer.as_bytes()).await.expect("write");
        });
        url
    }

    /// What `Client::watch_prefix` does, on a transport to `url`.
    async fn watch_prefix(url: &str, prefix: &str, index: u64) -> Result<PrefixWatch, Error> {
        let mut config = ClientConfig::new([url]);
        config.http2 = false;
        PrefixWatch::open(&Arc::new(Transport::new(config)), prefix, None, index).await
    }

    #[tokio::test]
    async fn lines_become_typed_events_and_a_last_line_an_error() {
        let body = concat!(
            r#"{"index":7,"lease":{"lease":"jobs.a","holder":"w","token":7,"ttl_ms":1000,"#,
            r#""transitions":1,"modify_index":7,"acquire_time":"2026-11-28T00:40:12.345Z"}}"#,
            "\n\n",
            r#"{"index":9,"lease_name":"jobs.b","deleted":true}"#,
            "\n",
            r#"{"index":12}"#,
            "\n",
            r#"{"index":12,"error":"behind","message":"resume from index 12"}"#,
            "\n",
        );
        let url = server("200 OK", body).await;
        let mut watch = watch_prefix(&url, "jobs.", 3).await.expect("open");
        assert_eq!(watch.index(), 3);
        let Some(Ok(WatchEvent::Changed { index: 7, lease })) = watch.next().await else {
            panic!("a change first");
        };
        assert_eq!(
            lease.acquire_time.as_deref(),
            Some("2026-11-28T00:40:12.345Z")
        );
        assert_eq!(lease.renew_time, None);
        let deleted = watch.next().await.expect("an event").expect("ok");
        assert_eq!(
            deleted,
            WatchEvent::Deleted {
                index: 9,
                lease: "jobs.b".into()
            }
        );
        let progress = watch.next().await.expect("an event").expect("ok");
        assert_eq!(progress, WatchEvent::Progress { index: 12 });
        let behind = watch.next().await.expect("the last line");
        assert!(
            matches!(&behind, Err(Error::Unavailable { last, .. }) if last.contains("behind")),
            "{behind:?}"
        );
        assert!(watch.next().await.is_none(), "nothing after the last line");
        assert_eq!(watch.index(), 12, "where to resume");
    }

    #[tokio::test]
    async fn a_refusal_is_the_mapped_error() {
        let url = server(
            "403 Forbidden",
            r#"{"error":"forbidden","message":"no read right on \"\""}"#,
        )
        .await;
        let refused = watch_prefix(&url, "", 0).await;
        assert!(matches!(refused, Err(Error::Forbidden(_))), "{refused:?}");
    }
}
