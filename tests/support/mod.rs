//! What the integration tests share: spawning the real `palisade` binary on
//! port 0 and temp dirs, and signing test tokens.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::SigningKey;
use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// A child process that is killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Process {
    pub child: Child,
    /// The `http://host:port` it printed.
    pub url: String,
}

impl Process {
    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `palisade ARGS` and waits for it to print `listening on http://…`.
pub fn spawn_server(args: &[&str]) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn palisade");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.split("listening on ").nth(1) {
                let _ = tx.send(url.trim().to_owned());
            }
        }
    });
    let url = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(url) => url,
        Err(_) => {
            let _ = child.kill();
            panic!("palisade {args:?} did not start listening within 30 s");
        }
    };
    Process { child, url }
}

/// A gateway on port 0 over `data_dir`, verifying with `key`.
pub fn spawn_gateway(data_dir: &Path, key: &TestKey) -> Process {
    spawn_server(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir.to_str().expect("utf8 path"),
        "--public-key",
        key.pem_path.to_str().expect("utf8 path"),
    ])
}

/// A signing key with its public half in a PEM file.
pub struct TestKey {
    signing: EncodingKey,
    pub pem_path: std::path::PathBuf,
}

impl TestKey {
    pub fn new(dir: &Path) -> Self {
        let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
        let pem = key
            .verifying_key()
            .to_public_key_pem(Default::default())
            .expect("pem");
        let pem_path = dir.join("public.pem");
        std::fs::write(&pem_path, pem).expect("write pem");
        Self {
            signing: EncodingKey::from_ed_der(key.to_pkcs8_der().expect("der").as_bytes()),
            pem_path,
        }
    }

    /// A lease JWT valid for a minute.
    pub fn jwt(&self, lease: &str, token: u64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let claims = serde_json::json!({
            "iss": "palisade", "sub": "test", "lease": lease,
            "token": token, "iat": now, "exp": now + 60,
        });
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &self.signing).expect("sign")
    }
}
