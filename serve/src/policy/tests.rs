//! The policy's decisions and its file, end to end.

use crate::policy::add::add;
use crate::policy::api_key::{key_digest, new_key, read_key, KEY_HEADER};
use crate::policy::error::Denied;
use crate::policy::principals::{Policy, Principal};
use crate::policy::rules::{operator, Right, Rules};

fn headers(key: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert(KEY_HEADER, key.parse().expect("header"));
    h
}

fn policy(key: &str) -> Policy {
    let text = format!(
        r#"{{"principals": {{"orders": {{"keys": ["{}"], "acquire": ["orders."], "read": ["orders.", "shared"]}}}}}}"#,
        key_digest(key)
    );
    Policy::parse(&text).expect("policy")
}

#[test]
fn a_known_key_is_its_principal_and_rights_are_prefixes() {
    let key = new_key().expect("key");
    let policy = policy(&key);
    let who = policy.authenticate(&headers(&key)).expect("known");
    assert_eq!(who, Principal("orders".into()));
    assert!(policy.allow(&who, Right::Acquire, "orders.eu").is_ok());
    assert!(matches!(
        policy.allow(&who, Right::Acquire, "payments"),
        Err(Denied::Forbidden(_))
    ));
    assert!(matches!(
        policy.allow(&who, Right::Acquire, "shared"),
        Err(Denied::Forbidden(_))
    ));
    assert!(policy.allow(&who, Right::Read, "shared.x").is_ok());
    assert!(policy.allow(&who, Right::Admin, "orders.eu").is_err());
    assert!(policy.allow_prefix(&who, Right::Read, "orders.e").is_ok());
    assert!(policy.allow_prefix(&who, Right::Read, "orders").is_err());
    assert!(policy.allow_prefix(&who, Right::Read, "").is_err());
    assert!(policy.allow_cluster(&who).is_err());
}

#[test]
fn unknown_or_missing_keys_are_unauthenticated() {
    let key = new_key().expect("key");
    let policy = policy(&key);
    let other = new_key().expect("key");
    assert!(matches!(
        policy.authenticate(&headers(&other)),
        Err(Denied::Unauthenticated(_))
    ));
    assert!(matches!(
        policy.authenticate(&http::HeaderMap::new()),
        Err(Denied::Unauthenticated(_))
    ));
    // The digest is not the key.
    assert!(policy.authenticate(&headers(&key_digest(&key))).is_err());
}

#[test]
fn bad_files_name_what_is_wrong() {
    let err = Policy::parse("{\"principals\": {\"a\": {\"keys\": [], \"acqire\": []}}}")
        .expect_err("typo");
    assert!(err.contains("acqire") && err.contains("line 1"), "{err}");
    let err =
        Policy::parse("{\"principals\": {\"a\": {\"keys\": [\"abc\"]}}}").expect_err("bad digest");
    assert!(err.contains("sha256:"), "{err}");
    let digest = key_digest("k");
    let twice = format!(
        r#"{{"principals": {{"a": {{"keys": ["{digest}"]}}, "b": {{"keys": ["{digest}"]}}}}}}"#
    );
    assert!(Policy::parse(&twice).expect_err("shared").contains("share"));
    assert!(Policy::parse("{\"principals\": {\"a\": {\"keys\": []}}}").is_err());
    assert!(Policy::parse("not json").is_err());
}

#[test]
fn add_writes_a_policy_that_loads_and_secret_key_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    add(dir.path(), "admin", &operator()).expect("add");
    let path = dir.path().join("policy.json");
    let policy = Policy::load(&path).expect("loads");
    let key = read_key(&dir.path().join("admin.key")).expect("key");
    let who = policy.authenticate(&headers(&key)).expect("admin");
    assert!(policy.allow_cluster(&who).is_ok());
    assert!(policy.allow_prefix(&who, Right::Read, "").is_ok());
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(!text.contains(&key), "the policy holds digests only");
    assert!(
        add(dir.path(), "admin", &operator()).is_err(),
        "names are unique"
    );
    let orders = Rules {
        acquire: vec!["orders.".into()],
        ..Rules::default()
    };
    add(dir.path(), "orders", &orders).expect("a second principal");
    let policy = Policy::load(&path).expect("loads");
    let orders_key = read_key(&dir.path().join("orders.key")).expect("key");
    let who = policy.authenticate(&headers(&orders_key)).expect("orders");
    assert!(policy.allow(&who, Right::Acquire, "orders.x").is_ok());
    assert!(policy.allow_cluster(&who).is_err());
    assert!(policy.authenticate(&headers(&key)).is_ok(), "admin kept");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("admin.key"))
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_principal_named_twice_is_refused() {
    let rules = format!(
        r#"{{"keys": ["sha256:{}"], "read": [""]}}"#,
        "ab".repeat(32)
    );
    let text = format!(r#"{{"principals": {{"ops": {rules}, "ops": {rules}}}}}"#);
    let err = Policy::parse(&text).expect_err("duplicate");
    assert!(err.contains("named twice"), "{err}");
}

#[test]
fn prefixes_without_a_separator_are_reported_loose() {
    let rules = crate::policy::rules::Rules {
        acquire: vec!["orders".into(), "jobs.".into()],
        read: vec!["orders".into(), "logs/".into(), "x-".into()],
        ..Default::default()
    };
    assert_eq!(rules.loose_prefixes(), ["orders"]);
}

/// A principal's name is shown on status pages and in logs: one with a
/// bidirectional control (which reorders the text around it) does not
/// load.
#[test]
fn a_principal_name_with_a_bidi_control_is_refused() {
    let digest = crate::policy::key_digest("pal_some_key");
    let policy = |name: &str| {
        Policy::parse(&format!(
            r#"{{"principals": {{"{name}": {{"keys": ["{digest}"], "read": [""]}}}}}}"#
        ))
    };
    assert!(policy("ops").is_ok());
    let refused = policy("ops\u{202E}nimda").expect_err("bidi");
    assert!(refused.contains("bidirectional-control"), "{refused}");
}
