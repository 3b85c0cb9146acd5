//! The server loop over real sockets: mutual TLS accepted and refused, the
//! connection cap, the slow-header timeout, the drain.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use palisade_serve::certs::{init, node_name, Layout};
use palisade_serve::{serve, tls, PeerCertificate, ServeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn who(certificate: Option<Extension<PeerCertificate>>) -> &'static str {
    if certificate.is_some() {
        "verified"
    } else {
        "anonymous"
    }
}

fn app() -> Router {
    Router::new()
        .route("/", get(who))
        .route(
            "/slow",
            get(|query: axum::extract::RawQuery| async move {
                // `?wait=long` waits past the idle tests' timeout.
                let long = query.0.as_deref() == Some("wait=long");
                tokio::time::sleep(Duration::from_millis(if long { 900 } else { 300 })).await;
                "done"
            }),
        )
        // A request in flight for as long as a test needs (it drops it).
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "done"
            }),
        )
}

/// Starts the server; returns its address and a sender that stops it.
async fn start(
    config: ServeConfig,
) -> (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        serve(listener, app(), config, shutdown)
            .await
            .expect("serve");
    });
    (addr, stop, task)
}

fn layout() -> Layout {
    Layout {
        nodes: 2,
        dns: vec![],
        ips: vec![],
    }
}

fn client(dir: &Path, identity: Option<&str>, addr: SocketAddr) -> reqwest::Client {
    let cert = identity.map(|name| {
        (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        )
    });
    let config = tls::client_config(
        &dir.join("ca.pem"),
        cert.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
    )
    .expect("client config");
    reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .resolve(&node_name(1), addr)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

#[tokio::test]
async fn mutual_tls_admits_only_certificates_of_the_cluster_ca() {
    let ours = tempfile::tempdir().expect("dir");
    let theirs = tempfile::tempdir().expect("dir");
    init(ours.path(), &layout()).expect("certs");
    init(theirs.path(), &layout()).expect("other CA");
    let server = tls::server_config(
        &ours.path().join("node-1.pem"),
        &ours.path().join("node-1-key.pem"),
        Some(&ours.path().join("ca.pem")),
    )
    .expect("server config");
    let (addr, stop, task) = start(ServeConfig::new("test").with_tls(server)).await;
    let url = format!("https://{}:{}/", node_name(1), addr.port());

    let answer = client(ours.path(), Some("node-2"), addr)
        .get(&url)
        .send()
        .await;
    let body = answer
        .expect("a member's certificate is admitted")
        .text()
        .await
        .expect("body");
    assert_eq!(body, "verified");

    let anonymous = client(ours.path(), None, addr).get(&url).send().await;
    assert!(anonymous.is_err(), "no client certificate: {anonymous:?}");
    // A certificate from another CA, trusting our CA for the server side.
    let foreign = tls::client_config(
        &ours.path().join("ca.pem"),
        Some((
            &theirs.path().join("node-2.pem"),
            &theirs.path().join("node-2-key.pem"),
        )),
    )
    .expect("config");
    let foreign = reqwest::Client::builder()
        .use_preconfigured_tls(foreign)
        .resolve(&node_name(1), addr)
        .build()
        .expect("client");
    assert!(
        foreign.get(&url).send().await.is_err(),
        "foreign CA admitted"
    );
    // Plain HTTP to a TLS port gets nothing.
    let plain = reqwest::get(format!("http://{addr}/")).await;
    assert!(plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()));

    let _ = stop.send(());
    task.await.expect("stopped");
}

#[tokio::test]
async fn keys_are_written_for_the_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let certs = dir.path().join("certs");
    for path in init(&certs, &layout()).expect("certs") {
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with("-key.pem") {
            assert_eq!(mode, 0o600, "{name}");
        } else {
            assert_eq!(mode & 0o022, 0, "{name} writable by others");
        }
    }
    let mode = std::fs::metadata(&certs)
        .expect("meta")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700);
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_and_others_still_served() {
    let mut config = ServeConfig::new("test");
    config.max_connections = 2;
    a_third_connection_is_closed_until_two_leave(config, "over the cap").await;
}

#[tokio::test]
async fn a_client_trickling_headers_is_cut_off() {
    let mut config = ServeConfig::new("test");
    config.header_timeout = Duration::from_millis(300);
    let (addr, stop, task) = start(config).await;
    let mut slow = TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), slow.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the connection was not closed");
    let _ = stop.send(());
    task.await.expect("stopped");
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish() {
    let (addr, stop, task) = start(ServeConfig::new("test")).await;
    let request = tokio::spawn(reqwest::get(format!("http://{addr}/slow")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = stop.send(());
    let answer = request.await.expect("join").expect("answered");
    assert_eq!(answer.text().await.expect("body"), "done");
    task.await.expect("stopped");
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

/// HTTP/2 by prior knowledge on the same port; one connection carries many
/// requests at once, but no more than `max_requests` are served over all
/// connections: one more is a fast 503 `overloaded`.
#[tokio::test]
async fn http2_multiplexes_but_requests_in_flight_are_capped() {
    let mut config = ServeConfig::new("test");
    config.max_requests = 4;
    let (addr, _stop, _task) = start(config).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let answer = h2.get(format!("http://{addr}/")).send().await.expect("h2c");
    assert_eq!(answer.version(), reqwest::Version::HTTP_2);
    // Ten slow requests at once over the one connection: four served, six
    // refused at once.
    let started = std::time::Instant::now();
    let calls = (0..10).map(|_| {
        let h2 = h2.clone();
        async move {
            let answer = h2
                .get(format!("http://{addr}/slow"))
                .send()
                .await
                .expect("send");
            let status = answer.status().as_u16();
            let retry = answer.headers().get("retry-after").is_some();
            let body: serde_json::Value = answer.json().await.unwrap_or_default();
            (status, retry, body["error"].as_str().map(str::to_owned))
        }
    });
    let answers = futures::future::join_all(calls).await;
    let served = answers.iter().filter(|(s, _, _)| *s == 200).count();
    let refused: Vec<_> = answers.iter().filter(|(s, _, _)| *s == 503).collect();
    assert_eq!(served, 4, "{answers:?}");
    assert_eq!(refused.len(), 6, "{answers:?}");
    assert!(refused
        .iter()
        .all(|(_, retry, error)| *retry && error.as_deref() == Some("overloaded")));
    assert!(started.elapsed() < Duration::from_secs(3));
    // Once they are done, the slots are free again.
    let answer = h2
        .get(format!("http://{addr}/slow"))
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn silent_and_idle_connections_are_closed_but_a_waiting_request_is_not() {
    let mut config = ServeConfig::new("test");
    config.idle_timeout = Duration::from_millis(300);
    let (addr, stop, task) = start(config).await;
    // Silent from the start: never sends a byte.
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    // Idle after a request: keep-alive, then nothing.
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut answer = [0u8; 256];
    let _ = idle.read(&mut answer).await.expect("answer");
    // A request that waits longer than the idle timeout is not cut.
    let waiting = tokio::spawn(async move {
        reqwest::get(format!("http://{addr}/slow?wait=long"))
            .await
            .map(|r| r.status().as_u16())
    });
    for (name, stream) in [("silent", &mut silent), ("idle", &mut idle)] {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "the {name} connection was not closed");
    }
    assert_eq!(waiting.await.expect("task").expect("answer"), 200);
    let _ = stop.send(());
    task.await.expect("stopped");
}

#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let mut config = ServeConfig::new("test");
    config.max_connections_per_address = 2;
    a_third_connection_is_closed_until_two_leave(config, "over the per-address cap").await;
}

#[tokio::test]
async fn an_addresss_silent_connections_give_way_to_its_new_ones() {
    let mut config = ServeConfig::new("test");
    config.max_connections_per_address = 50;
    let (addr, stop, task) = start(config).await;
    let served = after_a_request(addr).await;
    // 200 connections that never send a byte, four times the cap: each
    // newer one takes the place of the oldest silent one.
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(TcpStream::connect(addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let answer = reqwest::get(format!("http://{addr}/"))
        .await
        .expect("served");
    assert_eq!(answer.status(), 200);
    // Refused (reset) until the idle timeout closed the silent ones, before.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The oldest silent ones were closed; the one that had sent a request
    // was not, and still serves.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(2), silent[0].read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the oldest silent one: {read:?}"
    );
    let mut served = served;
    served
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("send again");
    let n = tokio::time::timeout(Duration::from_secs(5), served.read(&mut buf))
        .await
        .expect("answered")
        .expect("read");
    assert!(n > 0, "the connection that had sent a request was closed");
    let _ = stop.send(());
    task.await.expect("stopped");
}

/// A connection to `addr` that has sent a request, read its answer, and
/// stays open (HTTP/1.1 keep-alive).
async fn after_a_request(addr: SocketAddr) -> TcpStream {
    after_a_request_from([127, 0, 0, 1], addr).await
}

/// A keep-alive connection from loopback address `source` that has been
/// answered one request.
async fn after_a_request_from(source: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind a loopback source address");
    let mut stream = socket.connect(addr).await.expect("connect");
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("send");
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&answer).contains("anonymous") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("answered in time")
            .expect("read");
        assert!(n > 0, "closed before answering");
        answer.extend_from_slice(&buf[..n]);
    }
    stream
}

/// With two connections held that have each sent a request (the cap
/// `config` sets), a third is accepted and closed at once; once the two
/// leave, a request is served again.
async fn a_third_connection_is_closed_until_two_leave(config: ServeConfig, cap: &str) {
    let (addr, stop, task) = start(config).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(after_a_request(addr).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(addr).await.expect("connect");
    let _ = third.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(2), third.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{cap}: {read:?}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = reqwest::get(format!("http://{addr}/"))
        .await
        .expect("served again");
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.expect("body"), "anonymous");
    let _ = stop.send(());
    task.await.expect("stopped");
}

/// Four addresses fill the server's cap with idle keep-alive connections
/// (the attack: 4 × 1 024 against 4 096, scaled down): a fifth address is
/// still served at once, because the heaviest holder's idle connection
/// gives way; and an address that is itself the heaviest cannot push the
/// others out with its own newcomers.
#[tokio::test]
async fn a_few_addresses_cannot_lock_a_new_one_out() {
    let mut config = ServeConfig::new("test");
    config.max_connections = 16;
    config.max_connections_per_address = 4;
    let (addr, stop, task) = start(config).await;
    let mut held = Vec::new();
    for source in 1..=4u8 {
        for _ in 0..4 {
            held.push(after_a_request_from([127, 0, 0, source], addr).await);
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A fifth address: served within a second, again and again.
    for _ in 0..3 {
        let mut fifth = after_a_request_from([127, 0, 0, 5], addr).await;
        let _ = fifth.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(1), fifth.read(&mut buf))
            .await
            .expect("answered within a second")
            .expect("read");
        assert!(n > 0, "the fifth address's connection was closed");
        held.push(fifth);
    }
    // Three of the four addresses' connections gave way, each the oldest
    // of a then heaviest address.
    let mut closed = [0usize; 4];
    for (i, stream) in held.iter_mut().take(16).enumerate() {
        let mut buf = [0u8; 16];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await
        {
            closed[i / 4] += 1;
        }
    }
    assert_eq!(closed.iter().sum::<usize>(), 3, "{closed:?}");
    assert!(closed.iter().all(|c| *c <= 1), "{closed:?}");
    // The address that kept all four is now the heaviest: its newcomer
    // cannot push the others out, while one from a lighter address can.
    let heaviest = 1 + closed.iter().position(|c| *c == 0).expect("one kept four") as u8;
    let lighter = 1 + closed.iter().position(|c| *c == 1).expect("one gave way") as u8;
    for (source, served) in [(heaviest, false), (lighter, true)] {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, source], 0)))
            .expect("bind");
        let mut more = socket.connect(addr).await.expect("connect");
        let _ = more.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_secs(2), more.read(&mut buf)).await;
        let answered = matches!(read, Ok(Ok(n)) if n > 0);
        assert_eq!(answered, served, "127.0.0.{source}: {read:?}");
    }
    let _ = stop.send(());
    task.await.expect("stopped");
}

/// A connection with a request in flight (a renewal, a peer's append, a
/// watch) never gives way to a newcomer: at the cap with only busy
/// connections, the newcomer is the one closed; once they are gone, it is
/// served.
#[tokio::test]
async fn busy_connections_never_give_way() {
    let mut config = ServeConfig::new("test");
    config.max_connections = 4;
    config.max_connections_per_address = 4;
    let (addr, stop, task) = start(config).await;
    let mut busy = Vec::new();
    for _ in 0..4 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, 2], 0)))
            .expect("bind");
        let mut stream = socket.connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("send");
        busy.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ask = |source: u8| async move {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, source], 0)))
            .expect("bind");
        let mut stream = socket.connect(addr).await.expect("connect");
        let _ = stream.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await;
        matches!(read, Ok(Ok(n)) if n > 0)
    };
    assert!(!ask(3).await, "a busy connection gave way");
    for stream in &mut busy {
        let mut buf = [0u8; 16];
        let still = tokio::time::timeout(Duration::from_millis(50), stream.read(&mut buf)).await;
        assert!(still.is_err(), "a busy connection was closed: {still:?}");
    }
    drop(busy);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(ask(3).await, "not served once the busy ones left");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}
