//! The binary's command line: bad flags, `palisade dev` start and stop.

use crate::support;

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
    // clap's "did you mean" stays on the one line.
    for (args, tip) in [
        (vec!["lease", "aquire", "x"], "'acquire'"),
        (
            vec!["lease", "acquire", "x", "--holder", "a", "--ttl", "5"],
            "--ttl-ms",
        ),
    ] {
        let output = palisade().args(&args).output().expect("run");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(tip), "{args:?}: {stderr}");
    }
    // A command that does nothing is not a success: the help, exit 2.
    for args in [vec![], vec!["lease"]] {
        let output = palisade().args(&args).output().expect("run");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn a_policy_file_that_does_not_parse_stops_the_server_with_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        "{\"principals\": {\"a\": {\n  \"keys\": [],\n  \"acqire\": []}}}",
    )
    .expect("write");
    let data = dir.path().join("data");
    for args in [
        vec!["gateway", "--public-key", "/nonexistent.pem"],
        vec![
            "election",
            "--id",
            "1",
            "--listen",
            "127.0.0.1:1",
            "--peers",
            "1=127.0.0.1:2",
            "--insecure-peers",
        ],
    ] {
        let output = palisade()
            .args(&args)
            .args(["--data-dir", data.to_str().expect("utf8")])
            .args(["--policy", policy.to_str().expect("utf8")])
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("acqire") && stderr.contains("line 3"),
            "names the field and line: {stderr}"
        );
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
    // dev runs with a policy: the CLI needs the key dev wrote.
    let election = format!("http://127.0.0.1:{}", ports[0]);
    let key_file = dir.path().join("admin.key");
    let acquire = |extra: &[&str]| {
        palisade()
            .args([
                "lease",
                "acquire",
                "orders",
                "--holder",
                "A",
                "--election",
                &election,
            ])
            .args(extra)
            .env_remove("PALISADE_API_KEY")
            .env_remove("PALISADE_API_KEY_FILE")
            .output()
            .expect("run the CLI")
    };
    let refused = acquire(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains("unauthorized"), "{stderr}");
    let granted = acquire(&["--api-key-file", key_file.to_str().expect("utf8")]);
    assert!(
        granted.status.success(),
        "{}",
        String::from_utf8_lossy(&granted.stderr)
    );
    // A plain acquire naming the gateway raises its fence: after A lets
    // go and B acquires, A's late write (its JWT still valid) is refused.
    let gateway = format!("http://127.0.0.1:{}", ports[3]);
    let run = |args: &[&str]| {
        let mut command = palisade();
        command.args(args).args(["--gateway", &gateway]);
        if args[0] == "lease" {
            command.args(["--election", &election]);
        }
        command
            .args(["--api-key-file", key_file.to_str().expect("utf8")])
            .output()
            .expect("run the CLI")
    };
    let grant = |holder: &str| -> serde_json::Value {
        let out = run(&[
            "lease",
            "acquire",
            "fenced",
            "--holder",
            holder,
            "--ttl-ms",
            "60000",
            "--wait-ms",
            "10000",
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let grant: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(grant["fence"], grant["token"], "the fence raised: {grant}");
        grant
    };
    let a = grant("A");
    let jwt_a = a["jwt"].as_str().expect("jwt").to_owned();
    let put_as_a = |value: &str| {
        run(&[
            "object", "put", "fenced/x", "--value", value, "--jwt", &jwt_a,
        ])
    };
    assert!(put_as_a("a").status.success());
    let token_a = a["token"].to_string();
    let released = run(&[
        "lease",
        "release",
        "fenced",
        "--holder",
        "A",
        "--token",
        &token_a,
        "--secret",
        a["secret"].as_str().expect("secret"),
    ]);
    assert!(
        released.status.success(),
        "{}",
        String::from_utf8_lossy(&released.stderr)
    );
    grant("B");
    let late = put_as_a("late");
    let stderr = String::from_utf8_lossy(&late.stderr);
    assert!(
        !late.status.success(),
        "A's late write accepted after B's plain acquire"
    );
    assert!(stderr.contains("stale_token"), "{stderr}");
    // `cluster status`: one row per node, each from its own view.
    let all: Vec<String> = (0..3)
        .map(|i| format!("http://127.0.0.1:{}", ports[0] + i))
        .collect();
    let status = palisade()
        .args(["cluster", "status", "--election", &all.join(",")])
        .args(["--api-key-file", key_file.to_str().expect("utf8")])
        .output()
        .expect("run the CLI");
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{table}");
    let rows: Vec<&str> = table.lines().skip(1).take(3).collect();
    assert!(
        rows.iter().filter(|r| r.contains("Leader")).count() == 1
            && rows.iter().filter(|r| r.contains("Follower")).count() == 2,
        "{table}"
    );
    assert!(
        table.lines().any(|l| l.starts_with("leader: node ")),
        "{table}"
    );
    // The members, from the acting leader: three voters, each reachable.
    let members = table
        .lines()
        .filter(|l| l.contains(" voter ") && l.contains(" yes "))
        .count();
    assert_eq!(members, 3, "{table}");
    // A wrong key is an error (exit 8, one line), not a table of zeros.
    let wrong = palisade()
        .args(["cluster", "status", "--election", &all.join(",")])
        .env("PALISADE_API_KEY", "not-a-key")
        .env_remove("PALISADE_API_KEY_FILE")
        .output()
        .expect("run the CLI");
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains("unauthorized"), "{stderr}");
    assert!(
        wrong.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&wrong.stdout)
    );
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

/// `palisade dev --tls`: every node and the gateway serve clients over
/// https:// only, and what dev prints (the CA, the endpoints) is all a
/// client needs: the CLI, given just those variables and the key file,
/// acquires through an election node and reads a fence through the
/// gateway; without the CA it is refused.
#[test]
fn dev_tls_serves_clients_over_https_with_the_ca_it_prints() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ports = support::free_ports(4);
    let mut dev = palisade()
        .args(["dev", "--tls", "--data-dir"])
        .arg(dir.path())
        .args(["--election-port", &ports[0].to_string()])
        .args(["--gateway-port", &ports[3].to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dev");
    let mut lines = BufReader::new(dev.stdout.take().expect("stdout")).lines();
    let printed: Vec<String> = lines
        .by_ref()
        .map_while(Result::ok)
        .take_while(|line| !line.contains("Ctrl-C stops everything"))
        .collect();
    assert!(
        printed.iter().any(|l| l.contains("cluster is up")),
        "palisade dev --tls did not come up: {printed:?}"
    );
    let exports: Vec<(String, String)> = printed
        .iter()
        .find(|l| l.contains("export PALISADE_CA="))
        .expect("dev prints the CA to trust")
        .split_whitespace()
        .filter_map(|word| word.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let get = |name: &str| {
        exports
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} not printed: {exports:?}"))
    };
    assert_eq!(
        get("PALISADE_CA"),
        dir.path().join("certs/ca.pem").display().to_string()
    );
    assert!(get("PALISADE_ELECTION").starts_with("https://"));
    assert!(get("PALISADE_GATEWAY").starts_with("https://"));
    let cli = |args: &[&str], with_ca: bool| {
        let mut command = palisade();
        command
            .args(args)
            .env_remove("PALISADE_API_KEY")
            .env("PALISADE_API_KEY_FILE", dir.path().join("admin.key"))
            .env("PALISADE_ELECTION", get("PALISADE_ELECTION"))
            .env("PALISADE_GATEWAY", get("PALISADE_GATEWAY"));
        if with_ca {
            command.env("PALISADE_CA", get("PALISADE_CA"));
        } else {
            command.env_remove("PALISADE_CA");
        }
        command.output().expect("run the CLI")
    };
    let untrusted = cli(&["lease", "acquire", "orders", "--holder", "A"], false);
    assert!(!untrusted.status.success(), "granted without the CA");
    for args in [
        &["lease", "acquire", "orders", "--holder", "A"][..],
        &["fence", "get", "orders"][..],
    ] {
        let out = cli(args, true);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Command::new("kill")
        .args(["-TERM", &dev.id().to_string()])
        .status()
        .expect("kill");
    assert!(dev.wait().expect("wait").success());
}
