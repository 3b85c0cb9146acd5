//! Just enough of the Chrome DevTools protocol to drive headless Chromium
//! through a page as a person would: navigate, run a line of script (fill
//! a form, submit it, read the DOM), wait for a condition, take a
//! screenshot. One page, one WebSocket, commands answered in turn; the
//! browser is killed when the [`Page`] is dropped.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A headless Chromium and its one page.
pub struct Page {
    browser: Child,
    socket: Socket,
    next_id: u64,
    /// Every URL a navigation of this page reached.
    visited: Vec<String>,
}

impl Drop for Page {
    fn drop(&mut self) {
        let _ = self.browser.kill();
        let _ = self.browser.wait();
    }
}

impl Page {
    /// Starts `binary` (its profile under `dir`; test certificates are
    /// accepted) and attaches to its first page.
    pub async fn open(binary: &str, dir: &Path) -> Self {
        let mut browser = Command::new(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--ignore-certificate-errors",
                "--window-size=1400,1000",
                "--remote-debugging-port=0",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.join("chromium").display()
            ))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let stderr = browser.stderr.take().expect("stderr");
        let endpoint = tokio::task::spawn_blocking(move || {
            let mut lines = BufReader::new(stderr).lines();
            let found = lines.by_ref().map_while(Result::ok).find_map(|line| {
                line.split_once("DevTools listening on ")
                    .map(|(_, url)| url.trim().to_owned())
            });
            // Keep draining, so the browser never blocks on a full pipe.
            std::thread::spawn(move || lines.for_each(drop));
            found
        })
        .await
        .expect("reader")
        .expect("chromium printed no DevTools address");
        let port = endpoint
            .trim_start_matches("ws://")
            .split(['/', ':'])
            .nth(1)
            .expect("port")
            .to_owned();
        let page_url = page_socket(&port).await;
        let (socket, _) = tokio_tungstenite::connect_async(page_url.as_str())
            .await
            .expect("connect to the page");
        let mut page = Self {
            browser,
            socket,
            next_id: 0,
            visited: Vec::new(),
        };
        page.call("Page.enable", json!({})).await;
        page
    }

    /// Navigates to `url` (what it leads to is for [`Page::wait_for`]).
    pub async fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
    }

    /// Evaluates `script` in the page; its value as text.
    pub async fn eval(&mut self, script: &str) -> String {
        let answer = self
            .call(
                "Runtime.evaluate",
                json!({"expression": script, "returnByValue": true}),
            )
            .await;
        let value = &answer["result"]["value"];
        value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned)
    }

    /// Waits (10 s at most) until `condition` is true in the page.
    pub async fn wait_for(&mut self, condition: &str) {
        let until = Instant::now() + Duration::from_secs(10);
        let script = format!("document.readyState === 'complete' && ({condition})");
        loop {
            // A page navigating (a form just submitted) answers an
            // evaluation with "Inspected target navigated or closed": not
            // yet, ask again.
            let answer = self
                .call_answer(
                    "Runtime.evaluate",
                    json!({"expression": script, "returnByValue": true}),
                )
                .await;
            let navigating = answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("navigated or closed"));
            assert!(
                navigating || answer["error"].is_null(),
                "Runtime.evaluate failed: {}",
                answer["error"]
            );
            if answer["result"]["result"]["value"] == true {
                let href = self.eval("location.href").await;
                self.visited.push(href);
                return;
            }
            assert!(
                Instant::now() < until,
                "never true in the page: {condition} (at {})",
                self.eval("location.href").await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves a PNG of the page as `target/ui-screenshots/<name>.png`.
    pub async fn screenshot(&mut self, name: &str) {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap_or_default())
            .expect("base64 screenshot");
        assert!(png.len() > 1000, "an empty screenshot of {name}");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write screenshot");
    }

    /// Every cookie the browser keeps (DevTools' view: `HttpOnly` ones
    /// too), as DevTools describes them (`name`, `value`, `path`,
    /// `httpOnly`, `sameSite`, ...).
    pub async fn cookies(&mut self) -> Vec<Value> {
        let answer = self.call("Network.getAllCookies", json!({})).await;
        answer["cookies"].as_array().cloned().unwrap_or_default()
    }

    /// The URLs the page was at each time a wait ended.
    pub fn visited(&self) -> &[String] {
        &self.visited
    }

    /// Sends `method` and returns its result (events in between are
    /// skipped); panics on a protocol error or after 10 s.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let answer = self.call_answer(method, params).await;
        assert!(
            answer["error"].is_null(),
            "{method} failed: {}",
            answer["error"]
        );
        answer["result"].clone()
    }

    /// [`Page::call`]'s whole answer, an `error` included.
    async fn call_answer(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let command = json!({"id": id, "method": method, "params": params});
        self.socket
            .send(Message::text(command.to_string()))
            .await
            .expect("send to chromium");
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(message) = self.socket.next().await {
                let Ok(Message::Text(text)) = message else {
                    continue;
                };
                let parsed: Value = serde_json::from_str(&text).unwrap_or_default();
                if parsed["id"] == id {
                    return parsed;
                }
            }
            panic!("chromium closed the connection during {method}")
        })
        .await
        .unwrap_or_else(|_| panic!("chromium did not answer {method}"))
    }
}

/// The WebSocket of the browser's first page (`/json/list`), asked until
/// the browser lists one.
async fn page_socket(port: &str) -> String {
    let list = format!("http://127.0.0.1:{port}/json/list");
    for _ in 0..100 {
        if let Ok(answer) = reqwest::get(&list).await {
            let targets: Value = answer.json().await.unwrap_or_default();
            let page = targets.as_array().and_then(|targets| {
                targets
                    .iter()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            });
            if let Some(url) = page {
                return url.to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromium lists no page at {list}");
}
