//! The status pages in process: what a client chose is escaped, the
//! session cookie is no key, the forms come from this node's origin only,
//! every answer carries the frame and content-security headers, and a
//! principal limited to a prefix sees nothing of the rest.

use axum::body::Body;
use http::{Method, Request, StatusCode};
use palisade_serve::policy::{key_digest, Policy};
use serde_json::json;
use tower::ServiceExt;

use super::{node_with, Node};

const READER: &str = "pal_reader_key_for_the_ui_test_0000001";
const ADMIN: &str = "pal_admin_key_for_the_ui_test_00000001";
/// The origin the test node is configured with (`--public-url`).
const ORIGIN: &str = "https://node.example:7001";

/// A node with a policy: `reader` (acquire and read `ui.`) and `admin`
/// (everything), public at [`ORIGIN`].
async fn node_with_policy() -> Node {
    let policy = Policy::parse(&format!(
        r#"{{"principals": {{
            "reader": {{"keys": ["{}"], "acquire": ["ui."], "read": ["ui."]}},
            "admin": {{"keys": ["{}"], "acquire": [""], "read": [""], "admin": [""], "cluster": true}}
        }}}}"#,
        key_digest(READER),
        key_digest(ADMIN)
    ))
    .expect("policy");
    node_with(|c| {
        c.policy = Some(std::sync::Arc::new(policy.into()));
        c.ui.public_urls = vec![ORIGIN.to_owned()];
    })
    .await
}

/// A request to `uri` with `headers`.
fn request(method: Method, uri: &str, headers: &[(&str, &str)]) -> http::request::Builder {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
}

/// The answer to `request` (an empty body), its status, headers and text.
async fn answer(
    node: &Node,
    request: http::request::Builder,
) -> (StatusCode, http::HeaderMap, String) {
    answer_with(node, request.body(Body::empty()).expect("request")).await
}

async fn answer_with(node: &Node, request: Request<Body>) -> (StatusCode, http::HeaderMap, String) {
    let response = node.app.clone().oneshot(request).await.expect("answer");
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 22)
        .await
        .expect("body");
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

/// Signs `key` in from [`ORIGIN`]; the answer's `Set-Cookie` and `Location`.
async fn sign_in(node: &Node, key: &str) -> (String, String) {
    let form = request(
        Method::POST,
        "/ui/login",
        &[
            ("origin", ORIGIN),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
    )
    .body(Body::from(format!("key={key}")))
    .expect("request");
    let (status, headers, body) = answer_with(node, form).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    let cookie = headers["set-cookie"].to_str().expect("cookie").to_owned();
    let location = headers["location"].to_str().expect("location").to_owned();
    (cookie, location)
}

/// `name=value` of a `Set-Cookie`.
fn pair(set_cookie: &str) -> &str {
    set_cookie.split(';').next().expect("pair")
}

/// The session cookie holds a fresh 256-bit id, never the key; the id
/// opens the status page and nothing else — not as a key, not as a
/// cookie on the API, not on `/metrics`; signing out ends it on the
/// server, and a copy kept from before is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cookie_is_no_key_and_ends_at_sign_out() {
    let node = node_with_policy().await;
    let (cookie, location) = sign_in(&node, READER).await;
    assert_eq!(
        location, "/ui?prefix=ui.",
        "a prefix-limited principal lands on its prefix"
    );
    let (name, id) = pair(&cookie).split_once('=').expect("name=value");
    assert_eq!(name, "palisade_session_1");
    assert!(
        id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    assert!(
        !cookie.contains(READER),
        "the key is in the cookie: {cookie}"
    );
    assert!(
        cookie.ends_with("; Path=/ui; HttpOnly; SameSite=Strict")
            && cookie.contains("Max-Age=28800"),
        "{cookie}"
    );
    let jar = format!("theme=dark; {}", pair(&cookie));
    let (status, _, html) = answer(
        &node,
        request(Method::GET, "/ui?prefix=ui.", &[("cookie", &jar)]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{html}");

    // Not a key anywhere, not a cookie the API reads.
    for (method, uri) in [
        (Method::GET, "/v1/leases?prefix=ui."),
        (Method::GET, "/v1/cluster"),
        (Method::GET, "/metrics"),
        (Method::POST, "/v1/leases/ui.x/acquire"),
    ] {
        for headers in [vec![("x-palisade-key", id)], vec![("cookie", jar.as_str())]] {
            let call = request(method.clone(), uri, &headers)
                .header("content-type", "application/json")
                .body(Body::from(
                    json!({"holder": "thief", "ttl_ms": 5000}).to_string(),
                ))
                .expect("request");
            let (status, _, body) = answer_with(&node, call).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} {headers:?}: {body}"
            );
        }
    }
    let out = request(
        Method::POST,
        "/ui/logout",
        &[("origin", ORIGIN), ("cookie", &jar)],
    );
    let (status, headers, _) = answer(&node, out).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cleared = headers["set-cookie"].to_str().expect("cookie");
    assert!(
        cleared.starts_with("palisade_session_1=; Max-Age=0;"),
        "{cleared}"
    );
    let browser = [("cookie", jar.as_str()), ("accept", "text/html")];
    let (status, headers, _) =
        answer(&node, request(Method::GET, "/ui?prefix=ui.", &browser)).await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "the signed-out id is refused"
    );
    assert_eq!(headers["location"], "/ui/login");
}

/// The cookie an earlier version set held the key itself: it opens
/// nothing now, and a status page that sees it clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_key_cookie_is_no_key_and_is_cleared() {
    let node = node_with_policy().await;
    let legacy = format!("palisade_key={READER}");
    let (status, headers, _) = answer(
        &node,
        request(Method::GET, "/ui?prefix=ui.", &[("cookie", &legacy)]),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers["set-cookie"]
        .to_str()
        .expect("cookie")
        .starts_with("palisade_key=; Max-Age=0;"));
}

/// Sign-in and sign-out are accepted only with an `Origin` that is this
/// node's configured public URL: not another site, not the right host
/// with the wrong scheme or port, not a DNS-rebinding host whose `Host`
/// and `Origin` agree, not a proxy header, and not a POST with no
/// `Origin` at all. Nothing is set or ended by a refused form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_from_any_origin_but_the_public_url_is_refused() {
    let node = node_with_policy().await;
    let host = ("host", "node.example:7001");
    let refused: [(&str, Vec<(&str, &str)>); 8] = [
        ("/ui/login", vec![host, ("origin", "https://evil.example")]),
        ("/ui/login", vec![host, ("origin", "null")]),
        (
            "/ui/login",
            vec![host, ("origin", "https://node.example:7002")],
        ),
        (
            "/ui/login",
            vec![host, ("origin", "http://node.example:7001")],
        ),
        (
            "/ui/login",
            vec![
                ("host", "rebind.evil:7001"),
                ("origin", "https://rebind.evil:7001"),
            ],
        ),
        (
            "/ui/login",
            vec![
                ("x-forwarded-host", "evil.example"),
                ("origin", "https://evil.example"),
            ],
        ),
        ("/ui/login", vec![host]),
        ("/ui/logout", vec![host, ("origin", "https://evil.example")]),
    ];
    for (path, headers) in refused {
        let form = request(Method::POST, path, &headers)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(format!("key={READER}")))
            .expect("request");
        let (status, answered, body) = answer_with(&node, form).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path} {headers:?}");
        assert!(
            answered.get("set-cookie").is_none(),
            "{path} {headers:?} set a cookie"
        );
        assert!(body.contains("refused"), "{body}");
    }
    let (cookie, _) = sign_in(&node, READER).await;
    assert!(cookie.starts_with("palisade_session_1="), "{cookie}");
}

/// Every status-page answer — the page, a lease's page, the form, a
/// refusal, a redirect — forbids framing, names a content security policy
/// that allows no script, sends no referrer to another site and is not
/// cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_page_answer_carries_the_frame_and_csp_headers() {
    let node = node_with_policy().await;
    let key = [("x-palisade-key", ADMIN)];
    let answers = [
        answer(&node, request(Method::GET, "/ui", &key)).await,
        answer(&node, request(Method::GET, "/ui/leases/ui.none", &key)).await,
        answer(&node, request(Method::GET, "/ui/login", &[])).await,
        answer(
            &node,
            request(Method::GET, "/ui", &[("accept", "text/html")]),
        )
        .await,
        answer(&node, request(Method::POST, "/ui/logout", &[])).await,
    ];
    for (status, headers, _) in &answers {
        let csp = headers["content-security-policy"].to_str().expect("csp");
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.starts_with("default-src 'none'"),
            "{status}: {csp}"
        );
        assert!(
            !csp.contains("script-src") && !csp.contains("unsafe"),
            "{csp}"
        );
        assert_eq!(headers["x-frame-options"], "DENY", "{status}");
        assert_eq!(headers["referrer-policy"], "same-origin", "{status}");
        assert_eq!(headers["cache-control"], "no-store", "{status}");
    }
    let (_, _, html) = &answers[0];
    assert!(
        !html.contains("style=\""),
        "an inline style attribute the CSP would block"
    );
}

/// What clients chose is text on the page; a principal that may read
/// only `ui.` sees its leases and no cluster-wide figure, an admin sees
/// the plots and the table's size. A bidirectional control that got into
/// a record before the rule is shown as a visible mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_escapes_client_text_and_shows_a_prefix_only_its_own() {
    let node = node_with_policy().await;
    let evil = "<script>alert('owned')</script>";
    for (lease, holder) in [("ui.x", evil), ("other.y", "someone-else")] {
        let acquire = request(
            Method::POST,
            &format!("/v1/leases/{lease}/acquire"),
            &[("x-palisade-key", ADMIN)],
        )
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"holder": holder, "ttl_ms": 60_000}).to_string(),
        ))
        .expect("request");
        let (status, _, body) = answer_with(&node, acquire).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let reader = [("x-palisade-key", READER)];
    let (status, _, _) = answer(&node, request(Method::GET, "/ui", &reader)).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the whole table needs read on \"\""
    );
    let (status, _, html) = answer(&node, request(Method::GET, "/ui?prefix=ui.", &reader)).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(
        html.contains("&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;"),
        "{html}"
    );
    assert!(!html.contains(evil), "{html}");
    assert!(
        !html.contains("other.y") && !html.contains("someone-else"),
        "{html}"
    );
    assert!(
        !html.contains("id=\"in-table\"") && !html.contains("id=\"plots\""),
        "cluster-wide figures: {html}"
    );
    let (_, _, html) = answer(
        &node,
        request(Method::GET, "/ui", &[("x-palisade-key", ADMIN)]),
    )
    .await;
    assert!(
        html.contains("<span id=\"in-table\">2</span>") && html.contains("id=\"plots\""),
        "{html}"
    );
    assert_eq!(
        super::super::ui::escape("a\u{202E}b"),
        "a&lt;U+202E&gt;b",
        "a stored bidi control is shown, not obeyed"
    );
}

/// An acquire or a handover naming a holder with a bidirectional control
/// is refused with 400 and says why; nothing is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_with_a_bidi_control_is_refused() {
    let node = super::node().await;
    for c in ['\u{202E}', '\u{2066}', '\u{200F}', '\u{061C}'] {
        let holder = format!("admin{c}gpj.exe");
        let (status, body) = node
            .post(
                "/v1/leases/bidi/acquire",
                json!({"holder": holder, "ttl_ms": 5000}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"], "bad_request");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("bidirectional-control")),
            "{body}"
        );
    }
    let (status, grant) = node
        .post(
            "/v1/leases/bidi/acquire",
            json!({"holder": "a", "ttl_ms": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let handover = json!({"holder": "a", "token": grant["token"], "secret": grant["secret"],
                          "to": "b\u{202E}"});
    let (status, body) = node.post("/v1/leases/bidi/handover", handover).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}
