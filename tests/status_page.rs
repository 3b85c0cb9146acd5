//! The status page in a real browser: headless Chromium (Debian's
//! `chromium`) loads `/ui` from a node of a real cluster, takes a
//! screenshot, and the DOM it built shows the leader and the held leases,
//! with a holder named like a script rendered as text, never run.
//! Without Chromium the test says so and passes, unless
//! `PALISADE_FAULT_STRICT=1` (set by `.ci/run`, which installs it).

mod support;

use std::process::Command;

use support::{acquire, http_client, Cluster};

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_the_leader_and_the_leases_and_runs_no_holder_script() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("PALISADE_FAULT_STRICT").as_deref() != Ok("1"),
            "PALISADE_FAULT_STRICT: chromium not found (apt-get install chromium)"
        );
        eprintln!("status page: SKIPPED: chromium not found (apt-get install chromium)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let base = cluster.url(leader);
    let (status, orders) = acquire(&client, &base, "orders", "alpha", 60_000).await;
    assert_eq!(status, 200, "{orders}");
    let evil = "<script>document.title='pwned'</script>";
    let (status, body) = acquire(&client, &base, "zz-evil", evil, 60_000).await;
    assert_eq!(status, 200, "{body}");

    let shot = dir.path().join("ui.png");
    let run = |extra: &[String]| {
        Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--window-size=1200,900",
            ])
            .args(extra)
            .arg(format!("{base}/ui"))
            .output()
            .expect("run chromium")
    };
    let dom = run(&["--dump-dom".to_owned()]);
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(
        dom.contains(&format!("id=\"leader\">node {leader}<")),
        "no leader in the DOM: {dom}"
    );
    assert!(dom.contains("Leader"), "{dom}");
    assert!(
        dom.contains(">orders<") && dom.contains(">alpha<"),
        "no held lease: {dom}"
    );
    assert!(
        dom.contains("&lt;script&gt;document.title='pwned'&lt;/script&gt;"),
        "the holder is not shown as text: {dom}"
    );
    assert!(
        !dom.contains("<title>pwned"),
        "a holder's script ran: {dom}"
    );
    let taken = run(&[format!("--screenshot={}", shot.display())]);
    let size = std::fs::metadata(&shot).map_or(0, |m| m.len());
    assert!(
        size > 1000,
        "no screenshot ({size} bytes): {}",
        String::from_utf8_lossy(&taken.stderr)
    );
}
