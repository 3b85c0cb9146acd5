//! [`PrefixWatch`]: one stream of the changes to every lease under a
//! prefix (`GET /v1/watch`), read as typed [`WatchEvent`]s. On a cluster
//! of several partitions one stream follows all of them: each event names
//! its partition, and a [`WatchCursor`] (one index per partition) says
//! where to resume.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde_json::Value;

use crate::error::Error;
use crate::model::LeaseInfo;
use crate::transport::answer::Answer;
use crate::transport::Transport;
use crate::watch_cursor::WatchCursor;

/// How long an open watch's request may last (the server ends it first).
const STREAM_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A stream silent this long is taken for dead: the server sends a
/// keep-alive every 10 s (the default `keepalive_ms`).
const SILENT_FOR: Duration = Duration::from_secs(35);

/// Partitions past this in a line are the server's error (a cluster runs
/// at most 64): the cursor keeps an index for every partition below.
const MAX_PARTITIONS: u64 = 4096;

/// The longest line the SDK accepts (a lease with its fields is far less).
const MAX_LINE: usize = 1 << 20;

/// One event of a [`PrefixWatch`]. `partition` is the partition whose log
/// `index` is of (0 on a cluster of one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A lease under the prefix changed: `lease` as the change at `index`
    /// left it.
    Changed {
        /// The lease's partition.
        partition: usize,
        /// The change's log index (the lease's `modify_index`).
        index: u64,
        /// The lease.
        lease: LeaseInfo,
    },
    /// A free lease's record was reclaimed (forgotten) at `index`.
    Deleted {
        /// The lease's partition.
        partition: usize,
        /// The reclaim's log index.
        index: u64,
        /// The lease's name.
        lease: String,
    },
    /// A keep-alive of one partition: every change of it up to `index`
    /// has been sent.
    Progress {
        /// The partition.
        partition: usize,
        /// Where to resume that partition from.
        index: u64,
    },
}

impl WatchEvent {
    /// The index the event carries (where a new watch resumes its
    /// partition after it).
    pub fn index(&self) -> u64 {
        match self {
            WatchEvent::Changed { index, .. }
            | WatchEvent::Deleted { index, .. }
            | WatchEvent::Progress { index, .. } => *index,
        }
    }

    /// The partition whose log the event's index is of.
    pub fn partition(&self) -> usize {
        match self {
            WatchEvent::Changed { partition, .. }
            | WatchEvent::Deleted { partition, .. }
            | WatchEvent::Progress { partition, .. } => *partition,
        }
    }
}

/// Where a [`PrefixWatch`] starts.
#[derive(Debug, Clone)]
pub(crate) enum Start {
    /// After an index of one partition alone.
    Partition { partition: usize, index: u64 },
    /// After a cursor: every partition, or the one of a cluster of one
    /// (a cursor of one index no partitioned stream moved).
    After(WatchCursor),
}

impl Start {
    /// The query naming where to start.
    fn query(&self) -> String {
        match self {
            Start::Partition { partition, index } => {
                format!("&index={index}&partition={partition}")
            }
            Start::After(cursor) => cursor.query(),
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
    /// The partition a line without `partition` is of.
    partition: usize,
    cursor: WatchCursor,
    ended: bool,
}

impl PrefixWatch {
    /// Opens a watch of `prefix` from `from` on the first node that
    /// answers, trying each configured node once in turn (a partition's
    /// leader first, when it names one and the leader is known).
    pub(crate) async fn open(
        transport: &Arc<Transport>,
        prefix: &str,
        from: Start,
    ) -> Result<Self, Error> {
        let path = format!(
            "/v1/watch?prefix={}{}",
            crate::model::encode_key(prefix),
            from.query()
        );
        let (partition, cursor) = match from {
            Start::Partition { partition, index } => {
                let mut cursor = WatchCursor::default();
                cursor.advance(partition, index, true);
                (Some(partition), cursor)
            }
            Start::After(cursor) => (None, cursor),
        };
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
                        partition: partition.unwrap_or(0),
                        cursor,
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

    /// Where a new watch of one partition resumes: the index of the last
    /// event read (or the one this watch was opened with). A watch of
    /// every partition resumes from [`PrefixWatch::cursor`].
    pub fn index(&self) -> u64 {
        self.cursor.index_of(self.partition)
    }

    /// Where a new watch of every partition resumes
    /// ([`crate::Client::watch_prefix_from`]): the last index read of each.
    pub fn cursor(&self) -> &WatchCursor {
        &self.cursor
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
        let named = !value["partition"].is_null();
        let partition = match &value["partition"] {
            Value::Null => self.partition,
            named => named
                .as_u64()
                .filter(|k| *k < MAX_PARTITIONS)
                .ok_or_else(|| Error::Protocol {
                    status: 200,
                    message: format!("a watch line whose partition is {named}"),
                })? as usize,
        };
        if let Some(code) = value["error"].as_str() {
            self.cursor.advance(partition, index, named);
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
            WatchEvent::Deleted {
                partition,
                index,
                lease,
            }
        } else if value.get("lease").is_some() {
            let lease =
                serde_json::from_value(value["lease"].clone()).map_err(|e| Error::Protocol {
                    status: 200,
                    message: format!("a watch line with a malformed lease: {e}"),
                })?;
            WatchEvent::Changed {
                partition,
                index,
                lease,
            }
        } else {
            WatchEvent::Progress { partition, index }
        };
        self.cursor.advance(partition, index, named);
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
        let from = Start::After(WatchCursor::new(vec![index]));
        PrefixWatch::open(&Arc::new(Transport::new(config)), prefix, from).await
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
        let Some(Ok(WatchEvent::Changed {
            index: 7, lease, ..
        })) = watch.next().await
        else {
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
                partition: 0,
                index: 9,
                lease: "jobs.b".into()
            }
        );
        let progress = watch.next().await.expect("an event").expect("ok");
        assert_eq!(
            progress,
            WatchEvent::Progress {
                partition: 0,
                index: 12
            }
        );
        let behind = watch.next().await.expect("the last line");
        assert!(
            matches!(&behind, Err(Error::Unavailable { last, .. }) if last.contains("behind")),
            "{behind:?}"
        );
        assert!(watch.next().await.is_none(), "nothing after the last line");
        assert_eq!(watch.index(), 12, "where to resume");
        assert_eq!(
            watch.cursor().query(),
            "&index=12",
            "as nodes of one partition read it"
        );
    }

    #[tokio::test]
    async fn a_watch_of_every_partition_keeps_an_index_per_partition() {
        let body = concat!(
            r#"{"index":4,"partition":2,"lease_name":"jobs.c","deleted":true}"#,
            "\n",
            r#"{"index":9,"partition":0}"#,
            "\n",
            r#"{"index":6,"partition":2}"#,
            "\n",
            r#"{"index":3,"partition":1,"error":"behind","message":"resume"}"#,
            "\n",
        );
        let url = server("200 OK", body).await;
        let mut config = ClientConfig::new([url.as_str()]);
        config.http2 = false;
        let transport = Arc::new(Transport::new(config));
        let from = Start::After(WatchCursor::new(vec![1, 2]));
        let mut watch = PrefixWatch::open(&transport, "jobs.", from)
            .await
            .expect("open");
        let deleted = watch.next().await.expect("an event").expect("ok");
        assert_eq!(deleted.partition(), 2);
        assert_eq!(watch.cursor().indexes(), [1, 2, 4]);
        let progress = watch.next().await.expect("an event").expect("ok");
        assert_eq!((progress.partition(), progress.index()), (0, 9));
        watch.next().await.expect("an event").expect("ok");
        assert!(watch.next().await.expect("the last line").is_err());
        assert_eq!(watch.cursor().to_string(), "9,3,6", "where to resume");
        assert_eq!("9,3,6".parse::<WatchCursor>(), Ok(watch.cursor().clone()));
        assert_eq!(watch.cursor().query(), "&indexes=9,3,6");
        assert_eq!(
            "7".parse::<WatchCursor>().map(|c| c.query()),
            Ok("&index=7".into())
        );
        assert_eq!("".parse::<WatchCursor>(), Ok(WatchCursor::default()));
        assert!("9,x".parse::<WatchCursor>().is_err());
    }

    #[tokio::test]
    async fn a_partition_past_any_cluster_is_a_protocol_error() {
        let url = server("200 OK", "{\"index\":1,\"partition\":1000000000000000}\n").await;
        let mut watch = watch_prefix(&url, "", 0).await.expect("open");
        let line = watch.next().await.expect("a line");
        assert!(matches!(line, Err(Error::Protocol { .. })), "{line:?}");
        assert!(watch.cursor().indexes().len() <= 1, "no index kept for it");
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
