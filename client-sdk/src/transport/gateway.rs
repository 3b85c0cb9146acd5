//! The gateway's half of [`Transport`]: object reads, listings and
//! fenced writes. One request each, never retried (a write carries its
//! token, so the caller may send it again; a read is cheap to repeat).

use bytes::Bytes;
use serde_json::Value;

use super::answer::Answer;
use super::{unavailable, Transport};
use crate::error::Error;
use crate::model::{encode_key, Object};
use crate::objects::{ObjectInfo, ObjectPage};

impl Transport {
    /// The gateway URL, or an error if none is configured.
    fn gateway(&self) -> Result<&str, Error> {
        self.config
            .gateway
            .as_deref()
            .map(|g| g.trim_end_matches('/'))
            .ok_or_else(|| Error::BadRequest("no gateway configured".into()))
    }

    /// Sends `method` (GET or HEAD) for `key`: the answer, and its URL
    /// for errors.
    async fn object_request(
        &self,
        method: reqwest::Method,
        key: &str,
    ) -> Result<(reqwest::Response, String), Error> {
        let url = format!("{}/v1/objects/{}", self.gateway()?, encode_key(key));
        let response = self
            .http
            .request(method, &url)
            .send()
            .await
            .map_err(|e| unavailable(&url, &e))?;
        Ok((response, url))
    }

    /// Reads `key` through the gateway.
    pub(crate) async fn get_object(&self, key: &str) -> Result<Option<Object>, Error> {
        let (response, url) = self.object_request(reqwest::Method::GET, key).await?;
        match response.status().as_u16() {
            200 => {
                let (version, token) = described(response.headers());
                let value = response.bytes().await.map_err(|e| unavailable(&url, &e))?;
                Ok(Some(Object {
                    value,
                    version: version.to_string(),
                    token,
                }))
            }
            404 => Ok(None),
            status => {
                let body = response.json().await.unwrap_or(Value::Null);
                Err(Answer { status, body }.error())
            }
        }
    }

    /// What `key` is without its bytes (`HEAD`): `None` when there is no
    /// object.
    pub(crate) async fn head_object(&self, key: &str) -> Result<Option<ObjectInfo>, Error> {
        let (response, _) = self.object_request(reqwest::Method::HEAD, key).await?;
        match response.status().as_u16() {
            200 => {
                let (version, token) = described(response.headers());
                let size = header(response.headers(), "content-length")
                    .parse()
                    .unwrap_or(0);
                Ok(Some(ObjectInfo {
                    key: key.to_owned(),
                    version,
                    token,
                    size,
                }))
            }
            404 => Ok(None),
            // A HEAD answer has no body to say more.
            status => Err(Answer {
                status,
                body: Value::Null,
            }
            .error()),
        }
    }

    /// One page of the objects under `prefix` after `after`.
    pub(crate) async fn list_objects(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ObjectPage, Error> {
        let url = format!("{}/v1/objects", self.gateway()?);
        let limit = limit.to_string();
        let mut query = vec![("prefix", prefix), ("limit", limit.as_str())];
        if let Some(after) = after {
            query.push(("after", after));
        }
        let response = self
            .http
            .get(&url)
            .query(&query)
            .send()
            .await
            .map_err(|e| unavailable(&url, &e))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status != 200 {
            return Err(Answer { status, body }.error());
        }
        serde_json::from_value(body).map_err(|e| Error::Protocol {
            status,
            message: format!("a listing the SDK cannot read: {e}"),
        })
    }

    /// One fenced gateway request stamped with `jwt` (and `headers`); the
    /// answer's JSON body on 200, the mapped error otherwise.
    pub(crate) async fn gateway_write(
        &self,
        jwt: &str,
        method: reqwest::Method,
        path: &str,
        headers: &[(&'static str, String)],
        body: Option<Bytes>,
    ) -> Result<Value, Error> {
        let url = format!("{}{path}", self.gateway()?);
        let mut request = self.http.request(method, &url).bearer_auth(jwt);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        let response = request.send().await.map_err(|e| unavailable(&url, &e))?;
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        if status == 200 {
            return Ok(body);
        }
        Err(Answer { status, body }.error())
    }
}

fn header(headers: &reqwest::header::HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// An object's version (its `ETag`, bare or quoted) and token.
fn described(headers: &reqwest::header::HeaderMap) -> (u64, u64) {
    let version = header(headers, "etag")
        .trim_matches('"')
        .parse()
        .unwrap_or(0);
    let token = header(headers, "fencing-token").parse().unwrap_or(0);
    (version, token)
}
