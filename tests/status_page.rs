//! The status page in a real browser: headless Chromium (Debian's
//! `chromium`) loads `/ui` from a node of a real cluster, takes a
//! screenshot, and the DOM it built shows the leader and the held leases,
//! with a holder named like a script rendered as text, never run.
//! Without Chromium the test says so and passes, unless
//! `PALISADE_FAULT_STRICT=1` (set by `.ci/run`, which installs it).

mod support;

use std::process::Command;

use support::{acquire, gateway_for, http_client, node_setup, spawn_node, Cluster};

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
    // The nodes show this gateway's refused writes (its port chosen first).
    let gateway_port = support::free_ports(1)[0];
    let gateway_url = format!("http://127.0.0.1:{gateway_port}");
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, "127.0.0.1");
            setup.args = vec!["--ui-gateway".into(), gateway_url.clone()];
            setup
        })
        .collect();
    let cluster = Cluster::start_with(dir.path(), setups);
    let mut gateway = gateway_for(&cluster, &dir.path().join("gateway"));
    gateway.listen = format!("127.0.0.1:{gateway_port}");
    gateway.args = vec!["--exp-leeway-secs".into(), "30".into()];
    let _gateway = spawn_node(gateway);
    let client = http_client();
    let leader = cluster.leader(&client).await;
    let base = cluster.url(leader);
    // A paused old leader's write refused at the gateway: on the page.
    let (status, old) = acquire(&client, &base, "jobs", "paused-old-leader", 1000).await;
    assert_eq!(status, 200, "{old}");
    let new = loop {
        let (status, body) = acquire(&client, &base, "jobs", "new-leader", 60_000).await;
        if status == 200 {
            break body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let put = |jwt: String| {
        let (client, url) = (
            client.clone(),
            format!("{gateway_url}/v1/objects/jobs/state"),
        );
        async move {
            for _ in 0..50 {
                let answer = client.put(&url).bearer_auth(&jwt).body("x").send().await;
                let status = answer.map_or(0, |a| a.status().as_u16());
                if status != 401 && status != 0 {
                    return status;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            0
        }
    };
    assert_eq!(put(new["jwt"].as_str().expect("jwt").to_owned()).await, 200);
    assert_eq!(put(old["jwt"].as_str().expect("jwt").to_owned()).await, 409);
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
    // (Leadership may have moved since `leader` was read: any node will do.)
    let _ = leader;
    assert!(
        (1..=3).any(|id| dom.contains(&format!("id=\"leader\">node {id}<"))),
        "no leader in the DOM: {dom}"
    );
    assert!(
        dom.contains("<td>leader</td>"),
        "no leader among the members: {dom}"
    );
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
    assert!(
        dom.contains("id=\"fences\"")
            && dom.contains("<td class=\"holder\">paused-old-leader</td>")
            && dom.contains("<td class=\"refused\">1</td>"),
        "the gateway's refused write is not on the page: {dom}"
    );
    let taken = run(&[format!("--screenshot={}", shot.display())]);
    let size = std::fs::metadata(&shot).map_or(0, |m| m.len());
    assert!(
        size > 1000,
        "no screenshot ({size} bytes): {}",
        String::from_utf8_lossy(&taken.stderr)
    );
}
