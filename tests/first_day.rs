//! A new user's first day (issue 47), on real processes: `palisade dev`
//! on ports other than the defaults, and the CLI given only the `export`
//! line dev prints. Keys and endpoints, messages that name their cause, no
//! panic on a closed stdout, what `lease get`, `object get` and the proxy
//! print, the README's proxy line as written, and dev restarting a node
//! that died (with its limit).

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// How long any one awaited event may take (a bound against a hang, not a
/// timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

fn palisade() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_palisade"));
    // Only what a test gives: none of the runner's own settings.
    for name in [
        "PALISADE_ELECTION",
        "PALISADE_GATEWAY",
        "PALISADE_CA",
        "PALISADE_API_KEY",
        "PALISADE_API_KEY_FILE",
        "PALISADE_SECRET",
        "PALISADE_JWT",
        "PALISADE_JWT_FILE",
    ] {
        command.env_remove(name);
    }
    command.stdin(Stdio::null());
    command
}

/// The lines a reader sends, from a thread (so a test can wait on them
/// with a bound).
fn lines_of(reader: impl Read + Send + 'static) -> Receiver<String> {
    let (send, receive) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

/// Waits for a line of `lines` that `wanted` accepts; the lines seen.
fn wait_for(lines: &Receiver<String>, what: &str, wanted: impl Fn(&str) -> bool) -> Vec<String> {
    seen_before(lines, wanted).unwrap_or_else(|seen| panic!("never saw {what}: {seen:?}"))
}

/// [`wait_for`], answering the lines seen as the error when none was
/// wanted within [`PATIENCE`] (or the lines ended).
fn seen_before(
    lines: &Receiver<String>,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<String>, Vec<String>> {
    let started = Instant::now();
    let mut seen = Vec::new();
    while started.elapsed() < PATIENCE {
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                let done = wanted(&line);
                seen.push(line);
                if done {
                    return Ok(seen);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    Err(seen)
}

/// Waits (bounded) for `child` to exit.
fn wait_exit(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("{what} did not exit");
}

fn sigterm(child: &Child) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A `palisade dev` on free ports, the variables its export line set, and
/// its stderr (where it reports processes that died).
struct Dev {
    child: Child,
    dir: tempfile::TempDir,
    exports: Vec<(String, String)>,
    stderr: Receiver<String>,
    /// What it printed on stdout until its walkthrough ended.
    printed: Vec<String>,
}

impl Dev {
    fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = support::free_ports(4);
        let mut child = palisade()
            .args(["dev", "--data-dir"])
            .arg(dir.path())
            .args(["--election-port", &ports[0].to_string()])
            .args(["--gateway-port", &ports[3].to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dev");
        let stdout = lines_of(child.stdout.take().expect("stdout"));
        let stderr = lines_of(child.stderr.take().expect("stderr"));
        // What dev said on stderr goes with a failure to come up.
        let printed = seen_before(&stdout, |l| l.contains("Ctrl-C stops everything"))
            .unwrap_or_else(|seen| {
                let exited = child.try_wait().ok().flatten();
                let said: Vec<String> = stderr.try_iter().collect();
                panic!("dev's walkthrough never ended (exited: {exited:?}): {seen:?}; stderr: {said:?}")
            });
        let exports = printed
            .iter()
            .find(|l| l.trim_start().starts_with("export PALISADE_ELECTION="))
            .unwrap_or_else(|| panic!("no export line: {printed:?}"))
            .split_whitespace()
            .skip(1)
            .filter_map(|word| word.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Self {
            child,
            dir,
            exports,
            stderr,
            printed,
        }
    }

    fn var(&self, name: &str) -> &str {
        self.exports
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{name} not exported: {:?}", self.exports))
    }

    /// `palisade` with the variables of the export line, and nothing else.
    fn command(&self) -> Command {
        let mut command = palisade();
        command.envs(self.exports.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Runs the CLI with `args` and the export line's variables.
    fn cli(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run the CLI")
    }

    /// As [`Dev::cli`], which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// As [`Dev::cli`], which must fail with exit code `code` (README,
    /// "Exit codes"); its stderr.
    fn refused(&self, args: &[&str], code: i32) -> String {
        let out = self.cli(args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        assert!(!text(&out.stderr).contains("panicked"), "{args:?}");
        text(&out.stderr)
    }

    /// A grant as `lease acquire --json` prints it.
    fn acquire(&self, lease: &str, holder: &str) -> serde_json::Value {
        let out = self.ok(&["lease", "acquire", lease, "--holder", holder, "--json"]);
        serde_json::from_str(&out).expect("grant JSON")
    }

    fn key_file(&self) -> PathBuf {
        self.dir.path().join("admin.key")
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        sigterm(&self.child);
        let _ = wait_exit(&mut self.child, "palisade dev");
    }
}

/// Dev's export line names its own endpoints and key, and is all the CLI
/// needs; a key and a key file both set work (the key wins), and a flag
/// beats the variable.
#[test]
fn the_export_line_dev_prints_is_all_the_cli_needs() {
    let dev = Dev::start(&[]);
    let printed = dev.printed.join("\n");
    assert!(!printed.contains("the CLI defaults to"), "{printed}");
    assert!(
        dev.var("PALISADE_ELECTION").split(',').count() == 3
            && !dev.var("PALISADE_ELECTION").contains(":7001"),
        "{:?}",
        dev.exports
    );
    assert_eq!(
        dev.var("PALISADE_API_KEY_FILE"),
        dev.key_file().display().to_string()
    );
    dev.ok(&["lease", "acquire", "orders", "--holder", "A"]);
    let key = std::fs::read_to_string(dev.key_file()).expect("key");
    let key = key.trim();
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut command = dev.command();
        command.envs(env.iter().copied());
        let out = command
            .args(["lease", "get", "orders"])
            .args(args)
            .output()
            .expect("run");
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    };
    // Both variables (the main README's and the Python README's).
    let (code, said) = run(&[("PALISADE_API_KEY", key)], &[]);
    assert_eq!(code, Some(0), "both variables: {said}");
    // The key beats the key file: a file that does not exist is not read.
    let missing = [
        ("PALISADE_API_KEY", key),
        ("PALISADE_API_KEY_FILE", "/nonexistent"),
    ];
    let (code, said) = run(&missing, &[]);
    assert_eq!(code, Some(0), "key over a missing file: {said}");
    // A flag beats the variable: a wrong key in the environment is not sent.
    let file = dev.key_file().display().to_string();
    let (code, said) = run(
        &[("PALISADE_API_KEY", "pal_wrong")],
        &["--api-key-file", &file],
    );
    assert_eq!(
        code,
        Some(0),
        "--api-key-file over a wrong variable: {said}"
    );
    // And the wrong key alone is refused (so the cases above chose).
    let (code, said) = run(&[("PALISADE_API_KEY", "pal_wrong")], &[]);
    assert_eq!(code, Some(8), "unauthorized: {said}");
    assert!(said.contains("unauthorized"), "{said}");
}

/// Refusals say what to do; `lease get` shows the deadline and whether
/// the grant was revoked; `lease list --prefix` filters.
#[test]
fn refusals_name_their_cause_and_what_to_do() {
    let dev = Dev::start(&[]);
    let said = dev.refused(&["lease", "get", "orders/state"], 2);
    assert!(
        said.contains("'/'") && !said.contains("no such route"),
        "{said}"
    );
    let first = dev.acquire("orders", "A");
    // The same holder name from another process: a hint to release it.
    let said = dev.refused(&["lease", "acquire", "orders", "--holder", "A"], 5);
    assert!(said.contains("held by \"A\""), "{said}");
    assert!(said.contains("hint:") && said.contains("release"), "{said}");
    // Another holder: a hint to wait.
    let said = dev.refused(&["lease", "acquire", "orders", "--holder", "B"], 5);
    assert!(
        said.contains("hint:") && said.contains("--wait-ms"),
        "{said}"
    );
    // lease get: expires_in_ms and revoked, readable and JSON.
    let readable = dev.ok(&["lease", "get", "orders"]);
    assert!(readable.contains("expires in "), "{readable}");
    let json: serde_json::Value =
        serde_json::from_str(&dev.ok(&["lease", "get", "orders", "--json"])).expect("json");
    assert!(json["expires_in_ms"].as_u64().is_some(), "{json}");
    assert_eq!(json["revoked"], false, "{json}");
    let token = first["token"].as_u64().expect("token").to_string();
    dev.ok(&["lease", "revoke", "orders", "--token", &token]);
    let json: serde_json::Value =
        serde_json::from_str(&dev.ok(&["lease", "get", "orders", "--json"])).expect("json");
    assert_eq!(json["revoked"], true, "{json}");
    assert!(dev.ok(&["lease", "get", "orders"]).contains("revoked"));
    // lease list --prefix.
    dev.acquire("zz.other", "A");
    let listed = dev.ok(&["lease", "list", "--prefix", "ord"]);
    assert!(
        listed.contains("orders") && !listed.contains("zz.other"),
        "{listed}"
    );
}

/// After a handover the successor's token and grant index differ: a
/// release given the token as `--grant-index` says so.
#[test]
fn a_release_with_the_token_as_grant_index_says_what_differs() {
    let dev = Dev::start(&[]);
    let a = dev.acquire("orders", "A");
    let field = |grant: &serde_json::Value, name: &str| match &grant[name] {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    dev.ok(&[
        "lease",
        "handover",
        "orders",
        "--holder",
        "A",
        "--token",
        &field(&a, "token"),
        "--secret",
        &field(&a, "secret"),
        "--to",
        "B",
    ]);
    // Before B takes it: `lease get --json` is the server's document, which
    // says the lease is reserved for B; the text says so too (it showed
    // "held by B" and nothing else).
    let got: serde_json::Value =
        serde_json::from_str(&dev.ok(&["lease", "get", "orders", "--json"])).expect("json");
    assert_eq!(
        (&got["holder"], &got["reserved"]),
        (&"B".into(), &true.into()),
        "{got}"
    );
    let text = dev.ok(&["lease", "get", "orders"]);
    assert!(text.contains("reserved for B"), "{text}");
    let b = dev.acquire("orders", "B");
    let (token, index) = (field(&b, "token"), field(&b, "grant_index"));
    assert_ne!(token, index, "a handover's grant: {b}");
    let said = dev.refused(
        &[
            "lease",
            "release",
            "orders",
            "--holder",
            "B",
            "--token",
            &token,
            "--secret",
            &field(&b, "secret"),
            "--grant-index",
            &token,
        ],
        3,
    );
    assert!(
        said.contains("does hold orders") && said.contains("grant_index"),
        "{said}"
    );
    dev.ok(&[
        "lease",
        "release",
        "orders",
        "--holder",
        "B",
        "--token",
        &token,
        "--secret",
        &field(&b, "secret"),
        "--grant-index",
        &index,
    ]);
}

/// Reads lines of `stdout` until one `wanted` accepts, then closes it.
fn read_then_close(stdout: ChildStdout, wanted: impl Fn(&str) -> bool) -> Vec<String> {
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref().map_while(Result::ok) {
        let done = wanted(&line);
        seen.push(line);
        if done {
            return seen;
        }
    }
    panic!("stdout ended before the line wanted: {seen:?}");
}

/// `lease watch` of a lease never granted says so at once and waits; with
/// its reader gone (`| head -1`) it stops quietly (exit 0), as `worker`
/// does; `--hold` released at a signal logs no loss.
#[test]
fn no_command_panics_on_a_closed_stdout() {
    let dev = Dev::start(&[]);
    let mut watch = dev
        .command()
        .args(["lease", "watch", "fresh"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("watch");
    let stderr = lines_of(watch.stderr.take().expect("stderr"));
    // At once, not when the first watch request (30 s) ends.
    let asked = Instant::now();
    wait_for(&stderr, "the not-yet notice", |l| {
        l.contains("does not exist yet") && l.contains("waiting")
    });
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    let grant = dev.acquire("fresh", "A");
    let stdout = watch.stdout.take().expect("stdout");
    read_then_close(stdout, |l| l.contains("fresh held by A"));
    // The next change (a release) makes watch write to the closed pipe.
    dev.ok(&[
        "lease",
        "release",
        "fresh",
        "--holder",
        "A",
        "--token",
        &grant["token"].to_string(),
        "--secret",
        grant["secret"].as_str().expect("secret"),
    ]);
    let status = wait_exit(&mut watch, "watch after its reader left");
    let rest: Vec<String> = stderr.try_iter().collect();
    assert_eq!(status.code(), Some(0), "{rest:?}");
    assert!(!rest.iter().any(|l| l.contains("panicked")), "{rest:?}");

    let mut worker = dev
        .command()
        .args(["worker", "--lease", "work", "--holder", "w1"])
        .args(["--gateway", dev.var("PALISADE_GATEWAY")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("worker");
    let stderr = lines_of(worker.stderr.take().expect("stderr"));
    read_then_close(worker.stdout.take().expect("stdout"), |l| {
        l.starts_with("wrote ")
    });
    let status = wait_exit(&mut worker, "worker after its reader left");
    let said: Vec<String> = stderr.try_iter().collect();
    assert_eq!(status.code(), Some(0), "{said:?}");
    assert!(!said.iter().any(|l| l.contains("panicked")), "{said:?}");

    let mut hold = dev
        .command()
        .args(["lease", "acquire", "held", "--holder", "H", "--hold"])
        .args(["--status-ms", "60000"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hold");
    let stdout = lines_of(hold.stdout.take().expect("stdout"));
    wait_for(&stdout, "held", |l| l.starts_with("held held"));
    sigterm(&hold);
    let status = wait_exit(&mut hold, "hold after SIGTERM");
    let mut said = String::new();
    hold.stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut said)
        .expect("stderr");
    assert!(status.success(), "{said}");
    assert!(
        !said.contains("WARN") && !said.contains("lease lost"),
        "{said}"
    );
    assert!(said.contains("lease released"), "{said}");
}

/// The README's `palisade proxy` line, as written (its fixed port swapped
/// for a free one, the gateway for dev's), serves; its GET answers the
/// version as a number, like a write; a clean stop logs no loss.
/// `object get` ends a text value with a newline (`--raw`: as stored).
#[test]
fn the_readme_proxy_line_runs_and_answers_numbers() {
    let dev = Dev::start(&[]);
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let line = readme
        .lines()
        .find(|l| l.starts_with("palisade proxy "))
        .expect("the README's proxy line");
    let command = line.split('#').next().expect("command");
    let args: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(|word| {
            word.replace("127.0.0.1:9000", "127.0.0.1:0")
                .replace("http://127.0.0.1:8080", dev.var("PALISADE_GATEWAY"))
        })
        .collect();
    let mut proxy = dev
        .command()
        .args(&args)
        // As written: the gateway comes from the line, not the variable.
        .env_remove("PALISADE_GATEWAY")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("proxy");
    let stdout = lines_of(proxy.stdout.take().expect("stdout"));
    let listening = wait_for(&stdout, "the proxy's address", |l| {
        l.starts_with("proxy listening on ")
    });
    let url = listening
        .last()
        .and_then(|l| l.split_whitespace().nth(3))
        .expect("url")
        .to_owned();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let http = reqwest::Client::new();
    let read: serde_json::Value = runtime.block_on(async {
        let put = http
            .put(format!("{url}/v1/objects/nightly/state"))
            .body("from the proxy")
            .send()
            .await
            .expect("put");
        assert_eq!(put.status().as_u16(), 200);
        let put: serde_json::Value = put.json().await.expect("json");
        assert!(put["version"].is_u64(), "{put}");
        let get = http
            .get(format!("{url}/v1/objects/nightly/state"))
            .send()
            .await
            .expect("get");
        get.json().await.expect("json")
    });
    assert!(read["version"].is_u64() && read["token"].is_u64(), "{read}");
    assert_eq!(read["value"], "from the proxy");
    sigterm(&proxy);
    let status = wait_exit(&mut proxy, "proxy after SIGTERM");
    let mut said = String::new();
    proxy
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut said)
        .expect("stderr");
    assert!(status.success(), "{said}");
    assert!(!said.contains("WARN"), "{said}");

    let stored = dev.ok(&["object", "get", "nightly/state"]);
    assert_eq!(stored, "from the proxy\n");
    let raw = dev.ok(&["object", "get", "nightly/state", "--raw"]);
    assert_eq!(raw, "from the proxy");
    let json: serde_json::Value =
        serde_json::from_str(&dev.ok(&["object", "get", "nightly/state", "--json"])).expect("json");
    assert!(json["version"].is_u64(), "{json}");
}

/// `cluster status` asks every node at once: three endpoints that accept
/// connections and never answer cost one node timeout (2 s), not three;
/// they show as unreachable beside the real nodes, and the status exits 9
/// naming each (a script can tell; it exited 0 with members down). The
/// healthy cluster alone exits 0.
#[test]
fn cluster_status_asks_nodes_at_once() {
    let dev = Dev::start(&[]);
    let silent: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let mut endpoints: Vec<String> = dev
        .var("PALISADE_ELECTION")
        .split(',')
        .map(str::to_owned)
        .collect();
    endpoints.extend(
        silent
            .iter()
            .map(|l| format!("http://{}", l.local_addr().expect("addr"))),
    );
    let healthy = dev.var("PALISADE_ELECTION").to_owned();
    dev.ok(&["cluster", "status", "--election", &healthy]);
    let started = Instant::now();
    let stderr = dev.refused(
        &["cluster", "status", "--election", &endpoints.join(",")],
        9,
    );
    let took = started.elapsed();
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("did not answer"))
            .count(),
        3,
        "{stderr}"
    );
    let table = text(
        &dev.cli(&["cluster", "status", "--election", &endpoints.join(",")])
            .stdout,
    );
    assert_eq!(
        table.lines().filter(|l| l.contains("unreachable")).count(),
        3,
        "{table}"
    );
    // One after another they took at least 3 x 2 s.
    assert!(took < Duration::from_millis(5_500), "{took:?}\n{stderr}");
}

/// With the leader and a follower down, a refused acquire names the
/// server's `no_quorum` (the follower left answers it at once), not only
/// the last connection error of a node that is down.
#[tokio::test]
async fn without_quorum_the_cli_names_no_quorum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = support::Cluster::start(dir.path());
    let urls = cluster.urls().join(",");
    let leader = cluster.leader(&support::http_client()).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster.kill(leader);
    cluster.kill(follower);
    let refused = palisade()
        .args([
            "lease",
            "acquire",
            "orders",
            "--holder",
            "A",
            "--election",
            &urls,
        ])
        .output()
        .expect("run");
    let said = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(9), "unavailable: {said}");
    assert!(said.contains("no_quorum"), "{said}");
}

/// The pids of `parent`'s children.
fn children(parent: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{parent}/task")).expect("tasks");
    let mut pids = Vec::new();
    for task in tasks.map_while(Result::ok) {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        pids.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    pids
}

/// The pid of dev's election node `id`, once it runs.
fn node_pid(dev: &Dev, id: u64, not: Option<u32>) -> u32 {
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        for pid in children(dev.child.id()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_node = args
                .windows(2)
                .any(|w| w[0] == b"--id" && w[1] == id.to_string().as_bytes());
            if is_node && Some(pid) != not {
                return pid;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("dev runs no election node {id}");
}

/// dev notices a node that died, says so and starts it again, three times
/// within its window; the fourth time it says it leaves it down.
#[test]
fn dev_restarts_a_node_that_died_up_to_its_limit() {
    // A window no run outlasts: the limit, not the clock, decides.
    let dev = Dev::start(&["--restart-window-secs", "3600"]);
    let mut pid = node_pid(&dev, 2, None);
    for round in 1..=4 {
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .expect("kill");
        let said = wait_for(&dev.stderr, "dev's report", |l| {
            l.contains("election node 2 exited")
        });
        let report = said.last().expect("report");
        if round <= 3 {
            assert!(report.contains("restarting it"), "{said:?}");
            pid = node_pid(&dev, 2, Some(pid));
            // Up again: it answers on its port.
            let url = dev
                .var("PALISADE_ELECTION")
                .split(',')
                .nth(1)
                .expect("node 2");
            let health = format!("{url}/healthz");
            let started = Instant::now();
            while palisade()
                .args(["health", &health])
                .output()
                .map(|o| !o.status.success())
                .unwrap_or(true)
            {
                assert!(started.elapsed() < PATIENCE, "node 2 never answered");
                std::thread::sleep(Duration::from_millis(100));
            }
        } else {
            assert!(report.contains("not restarting it again"), "{said:?}");
        }
    }
}

/// The gateway as a store, from the CLI, on sled: see
/// [`store_from_the_cli`].
#[test]
fn the_gateway_is_a_store_from_the_cli() {
    store_from_the_cli(&Dev::start(&[]));
}

/// The same with `palisade dev --postgres`: two gateways on one throwaway
/// PostgreSQL (skipped without PostgreSQL's binaries unless
/// `PALISADE_PG_STRICT` is set).
#[test]
fn the_gateway_on_postgres_is_a_store_from_the_cli() {
    if !Path::new("/usr/lib/postgresql/15/bin/initdb").exists() {
        assert!(
            std::env::var_os("PALISADE_PG_STRICT").is_none(),
            "PALISADE_PG_STRICT is set but PostgreSQL 15 is missing"
        );
        eprintln!("SKIPPED: PostgreSQL 15 is missing (apt-get install postgresql)");
        return;
    }
    store_from_the_cli(&Dev::start(&["--postgres"]));
}

/// A create-only write, a write and a delete conditional on the version
/// (412 and nothing changed when it moved on), `object head`, and a
/// listing that pages through a prefix.
fn store_from_the_cli(dev: &Dev) {
    let grant = dev.acquire("shelf", "A");
    let jwt = grant["jwt"].as_str().expect("jwt").to_owned();
    let write = |args: &[&str]| {
        let mut all = vec!["object"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--jwt", &jwt]);
        dev.cli(&all)
    };
    let json = |out: &Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_str(&text(&out.stdout)).expect("JSON")
    };
    let precondition_failed = |out: Output| {
        assert_eq!(out.status.code(), Some(7), "{}", text(&out.stdout));
        let said = text(&out.stderr);
        assert!(said.contains("412 precondition_failed"), "{said}");
    };
    let created = json(&write(&[
        "put",
        "shelf/a",
        "--value",
        "one",
        "--if-absent",
        "--json",
    ]));
    let v1 = created["version"].as_u64().expect("version").to_string();
    precondition_failed(write(&["put", "shelf/a", "--value", "two", "--if-absent"]));
    let head = json(&dev.cli(&["object", "head", "shelf/a", "--json"]));
    assert_eq!(
        (head["version"].to_string(), &head["size"]),
        (v1.clone(), &3.into()),
        "{head}"
    );
    let replaced = json(&write(&[
        "put",
        "shelf/a",
        "--value",
        "two",
        "--if-match",
        &v1,
        "--json",
    ]));
    let v2 = replaced["version"].as_u64().expect("version").to_string();
    precondition_failed(write(&[
        "put",
        "shelf/a",
        "--value",
        "three",
        "--if-match",
        &v1,
    ]));
    precondition_failed(write(&["delete", "shelf/a", "--if-match", &v1]));
    assert_eq!(dev.ok(&["object", "get", "shelf/a"]), "two\n");
    write(&["delete", "shelf/a", "--if-match", &v2]);
    let said = dev.refused(&["object", "head", "shelf/a"], 4);
    assert!(said.contains("404 not_found"), "{said}");

    for key in ["shelf/b", "shelf/c", "shelf/d"] {
        assert!(write(&["put", key, "--value", key]).status.success());
    }
    let page = dev.cli(&["object", "list", "--prefix", "shelf/", "--limit", "2"]);
    let listed: Vec<String> = text(&page.stdout).lines().map(str::to_owned).collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed[0].starts_with("shelf/b\tversion "), "{listed:?}");
    assert!(text(&page.stderr).contains("more follow: --after shelf/c"));
    let all = dev.ok(&[
        "object", "list", "--prefix", "shelf/", "--limit", "2", "--all",
    ]);
    let keys: Vec<&str> = all.lines().filter_map(|l| l.split('\t').next()).collect();
    assert_eq!(keys, ["shelf/b", "shelf/c", "shelf/d"]);
}

/// The same from the Rust SDK, typed: `Error::PreconditionFailed` with the
/// version now (the lease still held), `head_object`, `list_objects`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_is_a_store_from_the_sdk() {
    use palisade_client::{Client, ClientConfig, Error, Precondition};
    let dev = tokio::task::spawn_blocking(|| Dev::start(&[]))
        .await
        .expect("dev");
    let key = std::fs::read_to_string(dev.key_file()).expect("admin key");
    let config = ClientConfig::new(dev.var("PALISADE_ELECTION").split(','))
        .with_gateway(dev.var("PALISADE_GATEWAY"))
        .with_api_key(key.trim())
        .expect("key");
    let client = Client::new(config);
    let lease = client
        .acquire("pantry", "S", Duration::from_secs(10), None)
        .await
        .expect("acquire");
    let created = lease
        .put_if("pantry/jam", "one", Precondition::Absent)
        .await
        .expect("created");
    match lease
        .put_if("pantry/jam", "two", Precondition::Absent)
        .await
    {
        Err(Error::PreconditionFailed {
            key,
            current_version,
        }) => assert_eq!(
            (key.as_str(), current_version),
            ("pantry/jam", Some(created.version))
        ),
        other => panic!("expected a failed precondition, got {other:?}"),
    }
    assert!(lease.is_held(), "a failed precondition is not a lost lease");
    let head = client
        .head_object("pantry/jam")
        .await
        .expect("head")
        .expect("there");
    assert_eq!(
        (head.version, head.token, head.size),
        (created.version, lease.token(), 3)
    );
    lease.put("pantry/tea", "x").await.expect("put");
    let page = client.list_objects("pantry/", None, 1).await.expect("list");
    assert_eq!(page.objects[0].key, "pantry/jam");
    assert_eq!(page.next.as_deref(), Some("pantry/jam"));
    let rest = client
        .list_objects("pantry/", page.next.as_deref(), 10)
        .await
        .expect("list");
    assert_eq!((rest.objects.len(), rest.next), (1, None));
    let deleted = lease
        .delete_if("pantry/jam", Precondition::Version(created.version))
        .await
        .expect("deleted");
    assert!(deleted.deleted);
    assert_eq!(client.head_object("pantry/jam").await.expect("head"), None);
    lease.release().await.expect("release");
    drop(dev);
}

/// A closed stderr is not a crash either: a refused command whose stderr
/// reader is gone ends with its own exit code (2, a bad lease name), not a
/// panic's (101).
#[test]
fn a_closed_stderr_does_not_panic() {
    let mut child = palisade()
        .args(["lease", "get", "orders/state"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stderr.take());
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(2), "{status:?}");
}
