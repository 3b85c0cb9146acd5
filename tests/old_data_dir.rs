//! A data dir written by the binary of commit e798757 opens with the current
//! binary and serves its leases (issue 45: "a data dir from e798757 opens
//! and serves its leases").
//!
//! The fixture, `tests/fixtures/e798757-dev.tar.gz`, is a `palisade dev`
//! layout (election-1..3, gateway, certs, policy.json, admin.key) that the
//! old binary wrote through its HTTP API: `held` (holder `keeper`, a
//! 10-minute ttl, still held), `churn` (50 grants and releases), `released`
//! (`leaver`, released) and `twice` (`first`, released, then `second`,
//! still held); `held/state` and `twice/state` written through the gateway
//! with the holders' JWTs, so its fences stand at `held`'s token and
//! `second`'s. The nodes ran with `--snapshot-every 100`: each committed a
//! snapshot at index 99 (`held` and most of `churn` in it; `released` and
//! `twice` only in the log after it) and purged no log entry (openraft
//! keeps up to 1000 behind a snapshot). So a node opens with its state
//! machine at 99, from the snapshot, and applies 100..=109 from the log.
//! What the old binary answered (grants, leases, histories, fences, JWKS) is
//! in `tests/fixtures/e798757-dev.json`; `tests/fixtures/README.md` says how
//! both were made.
//!
//! The current binary starts on the unpacked dir as dev would start it,
//! with two differences that the age of the fixture forces:
//! - The Raft membership stores the peers' addresses, so the nodes listen
//!   for peers on the addresses written (127.0.45.1:17451-17453, a loopback
//!   address nothing else in the suite uses); their client ports are fresh.
//!   (This is also why the fixture's nodes were started by hand, not by
//!   `palisade dev`, which puts peers on 127.0.0.1 at fixed ports.)
//! - Its wall-clock stamps are old: the nodes reclaim free records only
//!   after 30 days (else `released` may go at once, as a free record the
//!   old leader freed long ago), and the gateway tolerates 10 years on a
//!   token's `exp` (else every old JWT is expired), so the old JWTs test
//!   the old key and the old fences rather than the clock (until 2036,
//!   when the fixture must be remade).
//!
//! A live lease counts as renewed when a leader takes over, so `held` is
//! still held, and its holder renews it.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use palisade_local_cluster::{Cluster, ClusterConfig, GatewayKeys, Logs, NodeSpec, PeerAuth};
use serde_json::{json, Value};

/// The packed data dir, one directory `e798757-dev` inside.
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/e798757-dev.tar.gz"
);

/// What the old binary answered while writing the fixture.
const WRITTEN: &str = include_str!("fixtures/e798757-dev.json");

/// The peer addresses the fixture's Raft membership holds.
const PEER_HOST: &str = "127.0.45.1";
const PEER_PORTS: [u16; 3] = [17451, 17452, 17453];

/// Ten years, in seconds: the gateway's `--exp-leeway-secs`.
const EXP_LEEWAY_SECS: u64 = 10 * 365 * 24 * 3600;

/// Thirty days, in ms: the nodes' `--reclaim-after-ms`.
const RECLAIM_AFTER_MS: u64 = 30 * 24 * 3600 * 1000;

#[tokio::test]
async fn a_data_dir_from_e798757_opens_and_serves_its_leases() {
    let written: Value = serde_json::from_str(WRITTEN).expect("fixture JSON");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unpack(dir.path());
    let key = palisade_serve::policy::read_key(&root.join("admin.key")).expect("admin.key");
    let http = client_with_key(&key);

    let cluster = start_cluster(&root);
    let leader = cluster
        .granting_leader(&http, 400)
        .await
        .expect("a leader with its signing key within 20 s");
    let base = cluster.url(leader);
    let gateway = start_gateway(&root, cluster.urls());
    let gw = gateway.url.clone();

    leases_as_written(&http, &base, &written).await;
    histories_as_written(&http, &base, &written).await;
    old_key_still_published(&http, &base, &written).await;
    fences_as_written(&http, &gw, &written).await;
    assert_eq!(read_object(&http, &gw, "held/state").await, "from keeper");
    assert_eq!(read_object(&http, &gw, "twice/state").await, "from second");

    let grants = &written["grants"];
    let oldest = jwt(&grants["twice_first"]);
    let (status, body) = put_object(&http, &gw, "twice/state", oldest, "late first").await;
    assert_eq!(status, 409, "a token below the old fence: {body}");
    assert_eq!(body["error"], "stale_token", "{body}");
    assert_eq!(body["fence"], written["fences"]["twice"], "{body}");
    let (status, body) =
        put_object(&http, &gw, "held/state", jwt(&grants["held"]), "old jwt").await;
    assert_eq!(
        status, 200,
        "a JWT the old cluster signed still verifies: {body}"
    );

    renew_held(&http, &base, &gw, &grants["held"]).await;
    let newest = max_old_token(&written);
    let (status, fresh) = support::acquire(&http, &base, "released", "newcomer", 60_000).await;
    assert_eq!(status, 200, "{fresh}");
    assert!(
        token(&fresh) > newest,
        "a new grant {} above every old token ({newest})",
        token(&fresh)
    );
    hand_twice_on(&http, &base, &gw, grants, newest).await;
}

/// Unpacks the fixture into `dir`; answers the data dir.
fn unpack(dir: &Path) -> PathBuf {
    let status = std::process::Command::new("tar")
        .args(["-xzf", FIXTURE, "-C"])
        .arg(dir)
        .status()
        .expect("run tar");
    assert!(status.success(), "tar -xzf {FIXTURE}: {status}");
    dir.join("e798757-dev")
}

/// An HTTP client sending the admin key, as dev's walkthrough does.
fn client_with_key(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        palisade_client::API_KEY_HEADER,
        key.parse().expect("header"),
    );
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .default_headers(headers)
        .build()
        .expect("client")
}

/// The three election nodes as dev starts them on `root` (its certs, its
/// policy, `election-<id>`), on the peer addresses the fixture holds.
fn start_cluster(root: &Path) -> Cluster {
    let mut config = ClusterConfig::new(root, 3, PeerAuth::Certs(root.join("certs")));
    config.policy = Some(root.join("policy.json"));
    config.wait_listening = Some(Duration::from_secs(30));
    for (i, node) in config.nodes.iter_mut().enumerate() {
        node.host = PEER_HOST.to_owned();
        node.peer_port = PEER_PORTS[i];
        node.args = vec![
            "--reclaim-after-ms".to_owned(),
            RECLAIM_AFTER_MS.to_string(),
        ];
        node.logs = Logs::File(root.join(format!("election-{}.log", i + 1)));
    }
    let binary = Path::new(env!("CARGO_BIN_EXE_palisade"));
    Cluster::start(binary, config).expect("the current binary starts on the old data dir")
}

/// The gateway as dev starts it on `root` (port 0), with the long leeway.
fn start_gateway(root: &Path, elections: Vec<String>) -> support::Process {
    let spec = NodeSpec::gateway(
        "127.0.0.1:0",
        root.join("gateway"),
        GatewayKeys::Election(elections),
    );
    support::spawn_node(NodeSpec {
        args: vec![
            "--policy".to_owned(),
            root.join("policy.json").display().to_string(),
            "--exp-leeway-secs".to_owned(),
            EXP_LEEWAY_SECS.to_string(),
        ],
        logs: Logs::File(root.join("gateway.log")),
        ..spec
    })
}

/// GETs `url` (retrying 503s for up to 5 s): the status and JSON body.
async fn get(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let answer = support::send_retrying(|| http.get(url)).await;
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

fn token(grant: &Value) -> u64 {
    grant["token"].as_u64().expect("a token")
}

fn jwt(grant: &Value) -> &str {
    grant["jwt"].as_str().expect("a jwt")
}

/// Each lease has the holder and token the old binary answered.
async fn leases_as_written(http: &reqwest::Client, base: &str, written: &Value) {
    for old in written["leases"].as_array().expect("leases") {
        let name = old["lease"].as_str().expect("lease name");
        let (status, now) = get(http, &format!("{base}/v1/leases/{name}")).await;
        assert_eq!(status, 200, "{name}: {now}");
        assert_eq!(now["holder"], old["holder"], "{name}: {now}");
        assert_eq!(now["token"], old["token"], "{name}: {now}");
    }
    let names: Vec<&str> = written["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .filter_map(|l| l["lease"].as_str())
        .collect();
    assert_eq!(names, ["churn", "held", "released", "twice"]);
}

/// (index, cause, holder, token) of each transition.
fn transitions(history: &Value) -> Vec<(Value, Value, Value, Value)> {
    let entries = history.as_array().expect("a history");
    entries
        .iter()
        .map(|t| {
            let field = |f: &str| t[f].clone();
            (
                field("index"),
                field("cause"),
                field("holder"),
                field("token"),
            )
        })
        .collect()
}

/// Each lease's history is the one the old binary answered.
async fn histories_as_written(http: &reqwest::Client, base: &str, written: &Value) {
    for (name, old) in written["history"].as_object().expect("histories") {
        let (status, now) = get(http, &format!("{base}/v1/leases/{name}/history")).await;
        assert_eq!(status, 200, "{name}: {now}");
        assert_eq!(transitions(&now["history"]), transitions(old), "{name}");
    }
    let twice = transitions(&written["history"]["twice"]);
    let causes: Vec<&Value> = twice.iter().map(|(_, cause, _, _)| cause).collect();
    assert_eq!(causes, ["acquire", "release", "acquire"], "{twice:?}");
}

/// The JWKS still publishes the key id the old grants were signed with.
async fn old_key_still_published(http: &reqwest::Client, base: &str, written: &Value) {
    let old_kid = written["grants"]["held"]["kid"].as_str().expect("kid");
    let kids = support::published_kids(http, base).await;
    assert!(kids.iter().any(|k| k == old_kid), "{old_kid} in {kids:?}");
}

/// The gateway's fences are the ones the old gateway answered.
async fn fences_as_written(http: &reqwest::Client, gateway: &str, written: &Value) {
    for lease in ["held", "twice"] {
        let (status, now) = get(http, &format!("{gateway}/v1/fences/{lease}")).await;
        assert_eq!(status, 200, "{lease}: {now}");
        assert_eq!(now["fence"], written["fences"][lease], "{lease}: {now}");
        assert!(now["fence"].as_u64().is_some_and(|f| f > 0), "{now}");
    }
}

async fn read_object(http: &reqwest::Client, gateway: &str, key: &str) -> String {
    let answer = support::send_retrying(|| http.get(format!("{gateway}/v1/objects/{key}"))).await;
    assert_eq!(answer.status(), 200, "GET {key}");
    answer.text().await.expect("object text")
}

/// PUTs `value` at `key` with `jwt`: the status and JSON body.
async fn put_object(
    http: &reqwest::Client,
    gateway: &str,
    key: &str,
    jwt: &str,
    value: &str,
) -> (u16, Value) {
    let url = format!("{gateway}/v1/objects/{key}");
    let answer =
        support::send_retrying(|| http.put(&url).bearer_auth(jwt).body(value.to_owned())).await;
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// The highest token the old binary granted or recorded.
fn max_old_token(written: &Value) -> u64 {
    let granted = written["grants"]
        .as_object()
        .expect("grants")
        .values()
        .map(token);
    let recorded = written["history"]
        .as_object()
        .expect("histories")
        .values()
        .flat_map(|h| h.as_array().expect("history").iter().map(token));
    granted.chain(recorded).max().expect("old tokens")
}

/// `keeper` renews `held` with the grant's token and secret: the same
/// token, a fresh JWT that the gateway takes at the old fence.
async fn renew_held(http: &reqwest::Client, base: &str, gateway: &str, old: &Value) {
    let body = json!({"holder": "keeper", "token": old["token"], "secret": old["secret"]});
    let url = format!("{base}/v1/leases/held/renew");
    let (status, renewed) = support::post_json(http, &url, body).await;
    assert_eq!(status, 200, "keeper renews held: {renewed}");
    assert_eq!(renewed["token"], old["token"], "{renewed}");
    assert_ne!(renewed["jwt"], old["jwt"], "a fresh JWT");
    let (status, body) = put_object(http, gateway, "held/state", jwt(&renewed), "renewed").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(read_object(http, gateway, "held/state").await, "renewed");
}

/// `second` releases `twice`; `third` gets it with a token above every
/// old one and writes past the old fence, which then refuses `second`.
async fn hand_twice_on(
    http: &reqwest::Client,
    base: &str,
    gateway: &str,
    grants: &Value,
    newest: u64,
) {
    let second = &grants["twice_second"];
    let body = json!({"holder": "second", "token": second["token"], "secret": second["secret"]});
    let url = format!("{base}/v1/leases/twice/release");
    let (status, released) = support::post_json(http, &url, body).await;
    assert_eq!(status, 200, "second releases twice: {released}");
    let (status, third) = support::acquire(http, base, "twice", "third", 60_000).await;
    assert_eq!(status, 200, "{third}");
    assert!(token(&third) > newest, "{third} above {newest}");
    let (status, body) = put_object(http, gateway, "twice/state", jwt(&third), "from third").await;
    assert_eq!(status, 200, "a token above the old fence: {body}");
    let (_, fence) = get(http, &format!("{gateway}/v1/fences/twice")).await;
    assert_eq!(fence["fence"], third["token"], "{fence}");
    let (status, body) = put_object(http, gateway, "twice/state", jwt(second), "late").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "stale_token", "{body}");
    assert_eq!(
        read_object(http, gateway, "twice/state").await,
        "from third"
    );
}
