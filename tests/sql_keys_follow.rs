//! `palisade sql keys --follow` survives the database restarting: it opens
//! its session again and installs the key the cluster rotated to meanwhile
//! (it once exited on its first database error, leaving the database on
//! the old keys: every JWT of the new key then failed to prove).

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::pg::PgServer;
use support::{sdk, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_keys_survives_a_database_restart() {
    let Some(mut pg) = PgServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    cluster.leader(&support::http_client()).await;
    let urls = cluster.urls().join(",");
    let url = pg.url();
    let (code, stderr) =
        support::run_palisade(&["sql", "install", "--url", &url, "--election", &urls]);
    assert_eq!(code, Some(0), "{stderr}");
    let mut follower = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "sql",
            "keys",
            "--follow",
            "--every-ms",
            "200",
            "--url",
            &url,
            "--election",
            &urls,
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the follower");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The database restarts (its sessions end), then the key rotates.
    let port = pg.server().port();
    pg.server().stop("fast");
    tokio::time::sleep(Duration::from_millis(600)).await;
    pg.server().start(port).expect("start PostgreSQL again");
    let kid = sdk(&cluster, None).rotate_key().await.expect("rotate");

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            follower.try_wait().expect("wait").is_none(),
            "the follower exited on the database restart"
        );
        let kids = pg
            .server()
            .sql("SELECT string_agg(kid, ',') FROM palisade.keys")
            .unwrap_or_default();
        if kids.contains(&kid) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "key {kid} never installed: {kids}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = follower.kill();
    let _ = follower.wait();
}

/// A rebuilt cluster's key set (a lower index than the one installed) is
/// not installed silently over, nor silently ignored: `sql keys` exits 1
/// naming `--replace`, and with it the new cluster's keys take the old
/// ones' place (the old set once pinned the database's keys for good while
/// `sql keys` exited 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_clusters_keys_replace_the_old_ones_when_asked() {
    let Some(mut pg) = PgServer::start() else {
        return;
    };
    let url = pg.url();
    let old_dir = tempfile::tempdir().expect("tempdir");
    let old = Cluster::start(old_dir.path());
    old.leader(&support::http_client()).await;
    let client = sdk(&old, None);
    // A key set index well above a fresh cluster's.
    for _ in 0..8 {
        client.rotate_key().await.expect("rotate");
    }
    let old_urls = old.urls().join(",");
    let (code, stderr) =
        support::run_palisade(&["sql", "install", "--url", &url, "--election", &old_urls]);
    assert_eq!(code, Some(0), "{stderr}");
    drop(old);

    let new_dir = tempfile::tempdir().expect("tempdir");
    let new = Cluster::start(new_dir.path());
    new.leader(&support::http_client()).await;
    let new_urls = new.urls().join(",");
    let jwks = sdk(&new, None).jwks().await.expect("jwks");
    let new_kids = support::kids_of(&jwks);
    let (code, stderr) =
        support::run_palisade(&["sql", "keys", "--url", &url, "--election", &new_urls]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--replace"), "{stderr}");
    let (code, stderr) = support::run_palisade(&[
        "sql",
        "keys",
        "--replace",
        "--url",
        &url,
        "--election",
        &new_urls,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let installed = pg
        .server()
        .sql("SELECT string_agg(kid, ',' ORDER BY kid) FROM palisade.keys")
        .expect("psql");
    let mut wanted = new_kids.clone();
    wanted.sort();
    assert_eq!(
        installed.trim(),
        wanted.join(","),
        "the new cluster's keys alone"
    );
}
