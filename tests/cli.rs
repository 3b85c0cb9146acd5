//! The binary's command line: bad flags, `palisade dev` start and stop.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn palisade() -> Command {
    Command::new(env!("CARGO_BIN_EXE_palisade"))
}

#[test]
fn bad_flags_are_one_line_and_exit_2() {
    for args in [
        vec!["gateway", "--bogus"],
        vec!["gateway", "--data-dir", "/tmp/x"],
        vec![
            "election",
            "--id",
            "1",
            "--listen",
            "127.0.0.1:1",
            "--data-dir",
            "/tmp/x",
            "--peers",
            "1",
        ],
        vec![
            "election",
            "--id",
            "9",
            "--listen",
            "127.0.0.1:1",
            "--data-dir",
            "/tmp/x",
            "--peers",
            "1=127.0.0.1:1",
        ],
        vec![
            "election",
            "--id",
            "1",
            "--listen",
            "127.0.0.1:1",
            "--data-dir",
            "/tmp/x",
            "--peers",
            "1=h:1",
            "--min-ttl-ms",
            "100",
        ],
        vec!["nonsense"],
    ] {
        let output = palisade().args(&args).output().expect("run");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("error:"), "{args:?}: {stderr}");
    }
}

#[test]
fn dev_starts_a_cluster_and_stops_it_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = support::free_ports(4);
    let mut dev = palisade()
        .args([
            "dev",
            "--data-dir",
            dir.path().to_str().expect("utf8"),
            "--election-port",
            &ports[0].to_string(),
            "--gateway-port",
            &ports[3].to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dev");
    let stdout = dev.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let started = Instant::now();
    let mut up = false;
    for line in lines.by_ref().map_while(Result::ok) {
        if line.contains("cluster is up") {
            up = true;
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30));
    }
    // The election ports are free only if dev's contiguous range was; if a
    // port was taken, dev exits early and says so.
    assert!(up, "palisade dev did not come up");
    let health = std::net::TcpStream::connect(("127.0.0.1", ports[3]));
    assert!(health.is_ok(), "gateway port open");
    Command::new("kill")
        .args(["-TERM", &dev.id().to_string()])
        .status()
        .expect("kill");
    let status = dev.wait().expect("wait");
    assert!(status.success(), "{status}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", ports[3])).is_err(),
        "the gateway is gone after dev stops"
    );
}
