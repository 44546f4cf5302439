//! A client of the local API over its Unix socket, for the `themis` tool and tests.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::UnixStream;

/// Why a call to the local API failed before an answer came.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("cannot reach the agent at {path}: {source} (is `themis agent` running? set --socket or THEMIS_SOCKET)")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("talking to the agent: {0}")]
    Http(#[from] hyper::Error),
    /// The answer was not JSON.
    #[error("the agent answered with something that is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Calls the local API of one agent.
#[derive(Debug, Clone)]
pub struct ApiClient {
    socket: PathBuf,
}

impl ApiClient {
    /// A client of the agent serving `socket`.
    pub fn new(socket: impl AsRef<Path>) -> Self {
        ApiClient {
            socket: socket.as_ref().to_owned(),
        }
    }

    /// Sends `method path` with an optional JSON body; returns the status and the
    /// JSON answer.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), ClientError> {
        let bytes = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let (status, body) = self
            .call_raw(method, path, bytes, "application/json")
            .await?;
        let value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body)?
        };
        Ok((status, value))
    }

    /// Sends `method path` with `body` of `content_type`; returns the status and the
    /// answer's bytes.
    pub async fn call_raw(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &str,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ClientError::Connect {
                    path: self.socket.clone(),
                    source,
                })?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "themis-agent")
            .header("content-type", content_type)
            .body(Full::new(body))
            .expect("a valid request");
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<(StatusCode, Value), ClientError> {
        self.call(Method::GET, path, None).await
    }
}
