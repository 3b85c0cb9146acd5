//! [`UiAccess`]: who may sign in to the status page from where, and for how
//! long (`api/ui/sessions.rs`, `api/ui/origin.rs`).

use std::net::SocketAddr;
use std::time::Duration;

/// The status page's sign-in settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiAccess {
    /// The origins (`scheme://host[:port]`) browsers reach this node's
    /// client API at (`--public-url`, each checked by [`parse_origin`]):
    /// a sign-in or sign-out form is accepted only when its `Origin` is one
    /// of them. Empty: the origins of `--listen` ([`UiAccess::origins`]).
    pub public_urls: Vec<String>,
    /// A session unused this long ends. Default 30 min.
    pub idle: Duration,
    /// A session ends this long after sign-in, used or not. Default 8 h.
    pub lifetime: Duration,
    /// Sessions kept on this node at most; a sign-in beyond ends the oldest.
    /// Default 10 000.
    pub max_sessions: usize,
    /// Sessions of one principal at most; its sign-in beyond ends its own
    /// oldest (so one principal's logins never end another's sessions
    /// while the node has room). Default 32.
    pub max_per_principal: usize,
}

impl Default for UiAccess {
    fn default() -> Self {
        Self {
            public_urls: Vec::new(),
            idle: Duration::from_secs(30 * 60),
            lifetime: Duration::from_secs(8 * 3600),
            max_sessions: 10_000,
            max_per_principal: 32,
        }
    }
}

impl UiAccess {
    /// Checks the settings.
    ///
    /// # Errors
    /// A sentence naming the bad setting.
    pub fn validate(&self) -> Result<(), String> {
        for url in &self.public_urls {
            parse_origin(url)?;
        }
        if self.idle.is_zero() || self.lifetime < self.idle {
            return Err(
                "a status-page session's idle limit must be above 0 and at most its lifetime"
                    .into(),
            );
        }
        if self.max_sessions == 0 || self.max_per_principal == 0 {
            return Err("the status page needs room for at least one session".into());
        }
        Ok(())
    }

    /// The origins a status-page form may be posted from: the
    /// `public_urls`; without them, `listen` with the scheme clients speak
    /// (`https` when `tls`), and for a loopback or unspecified address the
    /// loopback names of its port too (`127.0.0.1`, `localhost`, `[::1]`).
    /// Never the request's own `Host`: a page served under another name
    /// (DNS rebinding) must not pass for this node's.
    pub fn origins(&self, listen: SocketAddr, tls: bool) -> Vec<String> {
        if !self.public_urls.is_empty() {
            return self
                .public_urls
                .iter()
                .filter_map(|url| parse_origin(url).ok())
                .collect();
        }
        let scheme = if tls { "https" } else { "http" };
        let port = listen.port();
        let ip = listen.ip();
        let mut hosts = Vec::new();
        if !ip.is_unspecified() {
            hosts.push(SocketAddr::new(ip, port).to_string());
        }
        if ip.is_loopback() || ip.is_unspecified() {
            for host in ["127.0.0.1", "localhost", "[::1]"] {
                let host = format!("{host}:{port}");
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
        }
        hosts
            .into_iter()
            .map(|host| origin(scheme, &host))
            .collect()
    }
}

/// `scheme://host:port` as a browser writes it in `Origin`: lower case,
/// the port left out when it is the scheme's default.
fn origin(scheme: &str, host_port: &str) -> String {
    let default = if scheme == "https" { ":443" } else { ":80" };
    let host = host_port.strip_suffix(default).unwrap_or(host_port);
    format!("{scheme}://{}", host.to_ascii_lowercase())
}

/// The origin of a `--public-url`: `http(s)://host[:port]`, with nothing
/// after it but an optional `/`.
///
/// # Errors
/// A sentence naming the bad URL.
pub fn parse_origin(url: &str) -> Result<String, String> {
    let bad = || format!("--public-url {url:?} is not http(s)://HOST[:PORT]");
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(bad());
    }
    let host = rest.strip_suffix('/').unwrap_or(rest);
    let clean = |c: char| c.is_ascii_alphanumeric() || ".-:[]".contains(c);
    if host.is_empty() || !host.chars().all(clean) || host.starts_with(':') {
        return Err(bad());
    }
    Ok(origin(&scheme, host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_come_from_the_public_urls_or_the_listen_address() {
        let listen: SocketAddr = "127.0.0.1:7001".parse().expect("addr");
        let plain = UiAccess::default();
        assert_eq!(
            plain.origins(listen, false),
            [
                "http://127.0.0.1:7001",
                "http://localhost:7001",
                "http://[::1]:7001"
            ]
        );
        let public = UiAccess {
            public_urls: vec![
                "HTTPS://Status.Example:443/".into(),
                "http://e1:7001".into(),
            ],
            ..UiAccess::default()
        };
        assert_eq!(
            public.origins(listen, true),
            ["https://status.example", "http://e1:7001"]
        );
        let anywhere: SocketAddr = "0.0.0.0:7001".parse().expect("addr");
        assert_eq!(plain.origins(anywhere, true)[0], "https://127.0.0.1:7001");
        let lan: SocketAddr = "10.1.2.3:80".parse().expect("addr");
        assert_eq!(plain.origins(lan, false), ["http://10.1.2.3"]);
    }

    #[test]
    fn bad_public_urls_and_limits_are_refused() {
        for bad in [
            "status.example",
            "ftp://h",
            "https://",
            "https://h/ui",
            "https://h:7001/x",
            "https://a b",
        ] {
            let access = UiAccess {
                public_urls: vec![bad.into()],
                ..UiAccess::default()
            };
            assert!(access.validate().is_err(), "{bad}");
        }
        let access = UiAccess {
            idle: Duration::from_secs(10),
            lifetime: Duration::from_secs(5),
            ..UiAccess::default()
        };
        assert!(access.validate().is_err());
        UiAccess::default().validate().expect("defaults");
    }
}
