//! The gateway reaches PostgreSQL over TLS, verified: a throwaway server
//! (Debian's binaries) that accepts TLS sessions only (`hostssl` in its
//! `pg_hba.conf`, `hostnossl` rejected) and serves a certificate of the
//! project's own CA. With `--pg-ca` naming that CA the gateway serves
//! writes and its sessions are TLS ones (`pg_stat_ssl`); without it the
//! server refuses it, with another CA it refuses the server, and a URL
//! asking for TLS without a CA is a one-line error — each stops the
//! gateway at start, never a gateway that writes in the clear.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use palisade_local_cluster::{GatewayKeys, NodeSpec};
use support::pg::PgServer;
use support::{spawn_node, TestKey};

use crate::gateway_pg;

/// The server's certificate, key and `pg_hba.conf` in `dir/pg-tls`
/// (readable by the `postgres` user, the key its own and private); the
/// settings that make the server use them.
fn server_tls(dir: &Path) -> Vec<String> {
    let certs = dir.join("certs");
    support::make_certs_for(&certs, &["127.0.0.1"]);
    let tls = dir.join("pg-tls");
    std::fs::create_dir_all(&tls).expect("mkdir");
    let (cert, key, hba) = (
        tls.join("server.crt"),
        tls.join("server.key"),
        tls.join("pg_hba.conf"),
    );
    std::fs::copy(certs.join("gateway.pem"), &cert).expect("cert");
    std::fs::copy(certs.join("gateway-key.pem"), &key).expect("key");
    std::fs::write(
        &hba,
        "hostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
    )
    .expect("hba");
    for (path, mode) in [
        (dir, "755"),
        (&tls, "755"),
        (&cert, "644"),
        (&hba, "644"),
        (&key, "600"),
    ] {
        Command::new("chmod")
            .arg(mode)
            .arg(path)
            .status()
            .expect("chmod");
    }
    // PostgreSQL runs as `postgres` when the tests run as root: the key
    // must be that user's (a failure here just means we are not root).
    let _ = Command::new("chown")
        .arg("postgres")
        .arg(&key)
        .stderr(std::process::Stdio::null())
        .status();
    vec![
        "ssl=on".to_owned(),
        format!("ssl_cert_file={}", cert.display()),
        format!("ssl_key_file={}", key.display()),
        format!("hba_file={}", hba.display()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_reaches_postgresql_over_verified_tls_only() {
    let dir = tempfile::Builder::new()
        .prefix("palisade-pg-tls-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let settings = server_tls(dir.path());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let Some(mut pg) = PgServer::start_with(&settings) else {
        return;
    };
    let key = TestKey::new(dir.path());
    let ca = dir.path().join("certs/ca.pem").display().to_string();

    // With the CA: writes are served, over TLS sessions.
    let mut spec = NodeSpec::gateway_on_postgres(
        "127.0.0.1:0",
        pg.url(),
        GatewayKeys::PublicKey(key.pem_path.clone()),
    );
    spec.args = vec!["--pg-ca".into(), ca.clone()];
    let gateway = spawn_node(spec);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let (status, body) =
        gateway_pg::put(&http, &gateway.url, "tls/x", &key.jwt("tls", 3), "secret").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        gateway_pg::get(&http, &gateway.url, "tls/x").await.1,
        "secret"
    );
    let sessions = pg
        .server()
        .sql(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'palisade-gateway'",
        )
        .expect("psql");
    let (tls, clear) = sessions.split_once('|').expect("two counts");
    assert!(tls.parse::<u32>().is_ok_and(|n| n >= 1), "{sessions}");
    assert_eq!(clear, "0", "a gateway session in the clear: {sessions}");
    drop(gateway);

    // Without a CA the server refuses the plain session; with another CA
    // the gateway refuses the server; a URL asking for TLS needs a CA.
    let other = dir.path().join("other");
    support::make_certs_for(&other, &["127.0.0.1"]);
    let other_ca = other.join("ca.pem").display().to_string();
    let pem = key.pem_path.display().to_string();
    let url = pg.url();
    let require = format!("{url}?sslmode=require");
    for (extra, says) in [
        (vec!["--postgres", url.as_str()], "no encryption"),
        (
            vec!["--postgres", url.as_str(), "--pg-ca", other_ca.as_str()],
            "certificate",
        ),
        (vec!["--postgres", require.as_str()], "--pg-ca"),
    ] {
        let mut args = vec!["gateway", "--listen", "127.0.0.1:0", "--public-key", &pem];
        args.extend(extra.iter().copied());
        let (code, stderr) = support::run_palisade(&args);
        assert!(code.is_some_and(|c| c != 0), "{extra:?} started: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
    }
}

/// `palisade sql` reaches PostgreSQL over verified TLS too (it once spoke
/// plaintext only, so a server that forces TLS refused it, and the key set
/// it installs could be swapped on the way): `install` and `keys` against
/// the TLS-only server with `--db-ca`; without it, with another CA, or with
/// `sslmode=require` and no CA, a one-line error and nothing installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn palisade_sql_reaches_postgresql_over_verified_tls_only() {
    let dir = tempfile::Builder::new()
        .prefix("palisade-sql-tls-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let settings = server_tls(dir.path());
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let Some(mut pg) = PgServer::start_with(&settings) else {
        return;
    };
    let ca = dir.path().join("certs/ca.pem").display().to_string();
    let other = dir.path().join("other");
    support::make_certs_for(&other, &["127.0.0.1"]);
    let other_ca = other.join("ca.pem").display().to_string();
    let url = pg.url();
    let require = format!("{url}?sslmode=require");
    for (extra, says) in [
        (vec!["--url", url.as_str()], "no encryption"),
        (
            vec!["--url", url.as_str(), "--db-ca", other_ca.as_str()],
            "certificate",
        ),
        (vec!["--url", require.as_str()], "--db-ca"),
    ] {
        let mut args = vec!["sql", "install", "--no-keys"];
        args.extend(extra.iter().copied());
        let (code, stderr) = support::run_palisade(&args);
        assert!(
            code.is_some_and(|c| c != 0),
            "{extra:?} installed: {stderr}"
        );
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{extra:?}: {stderr}");
    }
    let installed = pg
        .server()
        .sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'palisade'")
        .expect("psql");
    assert_eq!(installed.trim(), "0", "installed without verified TLS");

    // With the CA: the schema, then the cluster's keys (the cluster's own
    // certificates in a folder of its own: `certs/` is the server's CA).
    let cluster_dir = dir.path().join("cluster");
    std::fs::create_dir_all(&cluster_dir).expect("mkdir");
    let cluster = support::Cluster::start(&cluster_dir);
    let election = cluster.urls().join(",");
    let (code, stderr) =
        support::run_palisade(&["sql", "install", "--no-keys", "--url", &url, "--db-ca", &ca]);
    assert_eq!(code, Some(0), "{stderr}");
    let mut keyed = None;
    for _ in 0..50 {
        let (code, stderr) = support::run_palisade(&[
            "sql",
            "keys",
            "--url",
            &url,
            "--db-ca",
            &ca,
            "--election",
            &election,
        ]);
        if code == Some(0) {
            keyed = Some(stderr);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(keyed.is_some(), "sql keys never succeeded over TLS");
    let keys = pg
        .server()
        .sql("SELECT count(*) FROM palisade.keys")
        .expect("psql");
    assert!(
        keys.trim().parse::<u32>().is_ok_and(|n| n >= 1),
        "no key installed: {keys}"
    );
}
