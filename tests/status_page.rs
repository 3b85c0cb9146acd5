//! The status page in a real browser: headless Chromium (Debian's
//! `chromium`) loads `/ui` from a node of a real cluster, takes a
//! screenshot, and the DOM it built shows the leader and the held leases,
//! with a holder named like a script rendered as text, never run.
//! A second test signs in through the form (`ui_login.rs`) in Chromium
//! driven over the DevTools protocol. Without Chromium the tests say so
//! and pass, unless
//! `PALISADE_FAULT_STRICT=1` (set by `.ci/run`, which installs it).

#[path = "support/devtools.rs"]
mod devtools;
use crate::support;

use std::process::Command;

use support::{acquire, gateway_for, http_client, node_setup, spawn_node, Cluster};

/// Chromium, or `None` after saying the test is skipped (a failure under
/// `PALISADE_FAULT_STRICT=1`, which `.ci/run` sets after installing it).
fn chromium_or_skip() -> Option<&'static str> {
    let browser = chromium();
    if browser.is_none() {
        assert!(
            std::env::var("PALISADE_FAULT_STRICT").as_deref() != Ok("1"),
            "PALISADE_FAULT_STRICT: chromium not found (apt-get install chromium)"
        );
        eprintln!("status page: SKIPPED: chromium not found (apt-get install chromium)");
    }
    browser
}

/// Three nodes whose status pages show the refused writes of a gateway
/// (its port chosen first, so the nodes can name it), and that gateway
/// (`exp` leeway 30 s, so a late writer's expired JWT reaches the fence);
/// the gateway's URL.
fn cluster_showing_a_gateway(dir: &std::path::Path) -> (Cluster, support::Process, String) {
    let gateway_port = support::free_ports(1)[0];
    let gateway_url = format!("http://127.0.0.1:{gateway_port}");
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir, id, "127.0.0.1");
            setup.args = vec!["--ui-gateway".into(), gateway_url.clone()];
            setup
        })
        .collect();
    let cluster = Cluster::start_with(dir, setups);
    let mut gateway = gateway_for(&cluster, &dir.join("gateway"));
    gateway.listen = format!("127.0.0.1:{gateway_port}");
    gateway.args = vec!["--exp-leeway-secs".into(), "30".into()];
    let gateway = spawn_node(gateway);
    (cluster, gateway, gateway_url)
}

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
    let Some(browser) = chromium_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, _gateway, gateway_url) = cluster_showing_a_gateway(dir.path());
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
                "--window-size=1400,1000",
            ])
            .args(extra)
            .arg(format!("{base}/ui"))
            .output()
            .expect("run chromium")
    };
    // (Leadership may have moved since `leader` was read: any node will do.
    // A node between leaders renders "leader none"; on a loaded machine an
    // election can fall in the page load, so the page is loaded again, a
    // bounded number of times, until it names a leader.)
    let _ = leader;
    let names_a_leader =
        |dom: &str| (1..=3).any(|id| dom.contains(&format!("id=\"leader\">node {id}<")));
    let mut dom = String::new();
    for _ in 0..20 {
        let dumped = run(&["--dump-dom".to_owned()]);
        dom = String::from_utf8_lossy(&dumped.stdout).into_owned();
        if names_a_leader(&dom) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let role_line = dom
        .find("id=\"role\"")
        .map_or("(no role line)", |at| &dom[at..dom.len().min(at + 200)]);
    assert!(
        names_a_leader(&dom),
        "no leader in the DOM ({role_line}): {dom}"
    );
    assert!(
        dom.contains(" (leader)</td>") && dom.matches("class=\"up\"").count() == 3,
        "no leader among the members, or a member not answering: {dom}"
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
    // Each lease's last change (its history's newest entry), the hostile
    // holder's name as text there too.
    assert!(
        dom.contains("class=\"last-change\">acquire of alpha (token")
            && dom.contains("class=\"last-change\">acquire of &lt;script&gt;"),
        "no last change per lease: {dom}"
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

/// The sign-in form in a real browser, driven over the DevTools protocol
/// (`devtools.rs`), against a cluster over TLS with a policy: `/ui` sends
/// a browser without a key to `/ui/login`; a wrong key stays there with
/// the reason; the right one lands on the page with the held leases. The
/// key is in no URL the browser visited and in no cookie: the browser
/// keeps a session id (`HttpOnly`, `SameSite=Strict`, `Path=/ui`,
/// `Secure`), which the API refuses as a key; signing out ends the session
/// on the node (a copy of the id is refused) and `/ui` sends the browser
/// back to the form. The page's own forms carry its `Origin` (the headers
/// `/ui` sends must not make the browser send `Origin: null`). Screenshots of the form and the signed-in page are kept in
/// `target/ui-screenshots/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_signs_in_through_the_form_and_no_script_sees_the_key() {
    let Some(browser) = chromium_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let setups = (1..=3)
        .map(|id| node_setup(dir.path(), id, "127.0.0.1"))
        .collect();
    let (cluster, access) = Cluster::start_secure(dir.path(), setups);
    let admin = access.http("admin");
    let base = cluster.url(cluster.leader(&admin).await);
    let (status, held) = acquire(&admin, &base, "orders.signed-in", "shown-holder", 60_000).await;
    assert_eq!(status, 200, "{held}");
    let key = access.key("admin");

    let mut page = devtools::Page::open(browser, dir.path()).await;
    page.navigate(&format!("{base}/ui")).await;
    page.wait_for("location.pathname === '/ui/login' && !!document.getElementById('login')")
        .await;
    page.screenshot("login-form").await;

    page.eval("document.querySelector('input[name=key]').value = 'pal_not-a-key'; document.getElementById('login').submit(); true")
        .await;
    page.wait_for("!!document.getElementById('problem')").await;
    let problem = page
        .eval("document.getElementById('problem').textContent")
        .await;
    assert_eq!(problem, "unknown API key");

    let fill = format!(
        "document.querySelector('input[name=key]').value = {}; document.getElementById('login').submit(); true",
        serde_json::Value::String(key.clone())
    );
    page.eval(&fill).await;
    page.wait_for("location.pathname === '/ui' && !!document.getElementById('role')")
        .await;
    let text = page.eval("document.body.innerText").await;
    assert!(
        text.contains("orders.signed-in") && text.contains("shown-holder"),
        "the signed-in page does not show the held lease: {text}"
    );
    page.screenshot("signed-in").await;
    let cookies = page.eval("document.cookie").await;
    assert!(
        !cookies.contains(&key) && !cookies.contains("palisade_key"),
        "a script can read the key: {cookies:?}"
    );
    for visited in page.visited() {
        assert!(!visited.contains(&key), "the key is in a URL: {visited}");
    }
    // What the browser keeps is a session id, scoped to /ui, HttpOnly,
    // SameSite=Strict, and no API call takes it for a key (issue 43).
    let jar = page.cookies().await;
    assert!(
        jar.iter()
            .all(|c| c["value"].as_str() != Some(key.as_str())),
        "the browser keeps the key in a cookie: {jar:?}"
    );
    let session = jar
        .iter()
        .find(|c| {
            c["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("palisade_session_"))
        })
        .unwrap_or_else(|| panic!("no session cookie: {jar:?}"));
    assert_eq!(session["path"], "/ui", "{session}");
    assert_eq!(session["httpOnly"], true, "{session}");
    assert_eq!(session["sameSite"], "Strict", "{session}");
    assert_eq!(session["secure"], true, "over TLS: {session}");
    let id = session["value"].as_str().expect("session id");
    let anonymous = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&access.ca).expect("ca")).expect("pem"),
        )
        .build()
        .expect("client");
    let as_key = anonymous
        .get(format!("{base}/v1/leases"))
        .header("x-palisade-key", id)
        .send()
        .await
        .expect("list");
    assert_eq!(as_key.status(), 401, "the session id passed for a key");

    page.eval("document.getElementById('logout').submit(); true")
        .await;
    page.wait_for("location.pathname === '/ui/login'").await;
    let jar = page.cookies().await;
    assert!(
        !jar.iter().any(|c| c["value"].as_str() == Some(id)),
        "the session cookie outlived the sign-out: {jar:?}"
    );
    let after = anonymous
        .get(format!("{base}/ui"))
        .header(
            "cookie",
            format!("{}={id}", session["name"].as_str().unwrap_or_default()),
        )
        .send()
        .await
        .expect("page");
    assert_eq!(
        after.status(),
        401,
        "the signed-out session still opens the page"
    );
    page.navigate(&format!("{base}/ui")).await;
    page.wait_for("location.pathname === '/ui/login' && !!document.getElementById('login')")
        .await;

    // Login CSRF: another site's page posts the intruder's key to the
    // form. Refused (403, the form with the reason), and /ui still asks
    // for a key: the browser was not signed in as the intruder.
    let attacker = attacker_page(&base, &access.key("intruder")).await;
    page.navigate(&attacker.url).await;
    page.wait_for("!!document.getElementById('problem')").await;
    let problem = page
        .eval("document.getElementById('problem').textContent")
        .await;
    assert!(problem.contains("another site"), "{problem}");
    page.navigate(&format!("{base}/ui")).await;
    page.wait_for("location.pathname === '/ui/login' && !!document.getElementById('login')")
        .await;
    attacker.server.abort();
}

/// Another site: a page on its own port (another origin) whose form posts
/// `key` to `base`'s sign-in the moment it loads.
struct Attacker {
    url: String,
    server: tokio::task::JoinHandle<()>,
}

async fn attacker_page(base: &str, key: &str) -> Attacker {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the attacker's site");
    let url = format!("http://{}/", listener.local_addr().expect("address"));
    let html = format!(
        "<!doctype html><form method=\"post\" action=\"{base}/ui/login\">\
         <input name=\"key\" value=\"{key}\"></form>\
         <script>document.forms[0].submit()</script>"
    );
    let server = tokio::spawn(async move {
        // A page or two (the browser may also ask for a favicon).
        for _ in 0..8 {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                html.len()
            );
            let _ = socket.write_all(answer.as_bytes()).await;
        }
    });
    Attacker { url, server }
}

/// The `data-<name>` of the chart `id` in a status page's HTML (0 if
/// absent).
fn chart_figure(html: &str, id: &str, name: &str) -> f64 {
    html.split(&format!("<svg id=\"{id}\""))
        .nth(1)
        .and_then(|svg| svg.split(&format!("data-{name}=\"")).nth(1))
        .and_then(|rest| rest.split('"').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The plots and a lease's page in a real browser. A scripted load on a
/// cluster that has just failed over (its first leader killed): a grant
/// that expires, the next holder's grant and 40 renewals, the first
/// holder's late write refused by the gateway, and a lease held by a
/// holder named like markup. The new leader's page plots all of it, with
/// the failover marked on every time axis; the lease's page, reached by its
/// link, shows its history newest first and its refused write; the hostile
/// holder is text on its page. Screenshots in `target/ui-screenshots/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plots_show_a_scripted_load_and_a_lease_page_shows_its_history() {
    let Some(browser) = chromium_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut cluster, _gateway, gateway_url) = cluster_showing_a_gateway(dir.path());
    let client = http_client();
    let first = cluster.leader(&client).await;
    cluster.kill(first);
    let survivors: Vec<u64> = (1..=3).filter(|id| *id != first).collect();
    let leader = cluster
        .leader_among(&client, &survivors, 200)
        .await
        .expect("a new leader within 10 s");
    let base = cluster.url(leader);
    let page_of = |url: String| {
        let client = client.clone();
        async move {
            let answer = client.get(url).send().await.expect("ui");
            answer.text().await.expect("body")
        }
    };
    // The gateway's counter is a baseline until it has been read twice.
    for _ in 0..30 {
        let html = page_of(format!("{base}/ui")).await;
        if chart_figure(&html, "plot-refused", "points") > 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }

    let (status, old) = acquire(&client, &base, "plotted", "paused-old", 1000).await;
    assert_eq!(status, 200, "{old}");
    let fresh = loop {
        let (status, body) = acquire(&client, &base, "plotted", "fresh", 60_000).await;
        if status == 200 {
            break body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let renew = serde_json::json!({"holder": "fresh", "token": fresh["token"],
                                   "secret": support::test_secret("fresh")});
    for _ in 0..40 {
        let (status, body) = support::post_json(
            &client,
            &format!("{base}/v1/leases/plotted/renew"),
            renew.clone(),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let put = |jwt: &serde_json::Value| {
        let request = client
            .put(format!("{gateway_url}/v1/objects/plotted/state"))
            .bearer_auth(jwt.as_str().expect("jwt"))
            .body("x");
        async move { request.send().await.expect("put").status().as_u16() }
    };
    assert_eq!(put(&fresh["jwt"]).await, 200);
    assert_eq!(put(&old["jwt"]).await, 409);
    let evil = "<img src=x onerror=\"document.title='pwned'\">";
    let (status, body) = acquire(&client, &base, "zz-evil", evil, 60_000).await;
    assert_eq!(status, 200, "{body}");

    // The sampler takes a sample every 5 s: wait (bounded) for the load.
    let charts = ["plot-renewals", "plot-grants", "plot-refused", "plot-held"];
    let mut html = String::new();
    for _ in 0..60 {
        html = page_of(format!("{base}/ui")).await;
        if charts
            .iter()
            .all(|id| chart_figure(&html, id, "peak") > 0.0)
            && html.contains("class=\"leader-change\"")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    for id in charts {
        assert!(
            chart_figure(&html, id, "peak") > 0.0,
            "{id} shows nothing of the load: {html}"
        );
    }
    assert!(
        html.contains("class=\"leader-change\""),
        "the failover is not marked: {html}"
    );

    let mut page = devtools::Page::open(browser, dir.path()).await;
    page.navigate(&format!("{base}/ui")).await;
    page.wait_for("document.querySelectorAll('#plots svg').length === 6")
        .await;
    let marks = page
        .eval("document.querySelectorAll('#plot-renewals line.leader-change').length")
        .await;
    assert!(marks.parse::<u32>().is_ok_and(|n| n >= 1), "marks: {marks}");
    // The leases come before the plots, inside the first screen (the
    // browser's window is 1400x1000).
    let leases_top = page
        .eval("document.getElementById('leases').getBoundingClientRect().top < window.innerHeight")
        .await;
    assert_eq!(
        leases_top, "true",
        "the leases table is below the first screen"
    );
    page.screenshot("plots").await;

    // The follower's page: the cluster's renewals (the leader answered
    // them all; the follower none), and every member with whether it
    // answers — the killed one does not — and how far behind it is.
    let follower = survivors
        .iter()
        .copied()
        .find(|id| *id != leader)
        .expect("a follower");
    let mut html = String::new();
    for _ in 0..20 {
        html = page_of(format!("{}/ui", cluster.url(follower))).await;
        if chart_figure(&html, "plot-renewals", "peak") > 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert!(
        chart_figure(&html, "plot-renewals", "peak") > 0.0,
        "a follower's page plots no renewals of the cluster: {html}"
    );
    assert!(html.contains("from 2 of 3 nodes"), "{html}");
    page.navigate(&format!("{}/ui", cluster.url(follower)))
        .await;
    page.wait_for("document.querySelectorAll('#members tr[data-node]').length === 3")
        .await;
    let rows = page
        .eval("[...document.querySelectorAll('#members tr[data-node]')].map(r => r.dataset.node + ':' + r.className + ':' + (r.querySelector('.behind') ? r.querySelector('.behind').textContent : '-')).join(',')")
        .await;
    for id in 1..=3u64 {
        let row = rows
            .split(',')
            .find(|r| r.starts_with(&format!("{id}:")))
            .unwrap_or_else(|| panic!("no row for node {id}: {rows}"));
        if id == first {
            assert_eq!(row, format!("{id}:down:-"), "{rows}");
        } else {
            let behind: u64 = row
                .rsplit(':')
                .next()
                .and_then(|b| b.parse().ok())
                .expect("behind");
            assert!(
                row.starts_with(&format!("{id}:up:")) && behind < 1000,
                "{rows}"
            );
        }
    }
    page.screenshot("follower").await;

    page.navigate(&format!("{base}/ui")).await;
    page.wait_for("document.querySelectorAll('#plots svg').length === 6")
        .await;
    page.eval("document.querySelector('a[href=\"/ui/leases/plotted\"]').click(); true")
        .await;
    page.wait_for(
        "location.pathname === '/ui/leases/plotted' && !!document.getElementById('history')",
    )
    .await;
    let history = page
        .eval("[...document.querySelectorAll('#history tr')].slice(1).map(r => r.cells[2].textContent + ':' + r.cells[3].textContent).join(',')")
        .await;
    assert_eq!(
        history, "acquire:fresh,expire:paused-old,acquire:paused-old",
        "newest first"
    );
    let refused = page
        .eval("document.querySelector('#fences td.refused').textContent")
        .await;
    assert_eq!(refused, "1", "the refused write on the lease's page");
    page.screenshot("lease-page").await;

    page.navigate(&format!("{base}/ui/leases/zz-evil")).await;
    page.wait_for("!!document.getElementById('history')").await;
    let shown = page
        .eval("document.querySelector('#standing .holder').textContent")
        .await;
    assert_eq!(shown, evil, "the holder is shown as text");
    let markup = page
        .eval("document.querySelectorAll('body img').length + ':' + document.title")
        .await;
    assert_eq!(markup, "0:Palisade lease zz-evil", "a holder's markup ran");
}
