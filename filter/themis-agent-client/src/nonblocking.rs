//! The async driver (feature `tokio`): the same exchange over tokio's Unix socket.

use std::path::{Path, PathBuf};

use http::{Method, StatusCode};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::exchange::{self, ANSWER_LIMIT};
use crate::ClientError;

/// Calls the local API of one agent, a connection per call. It waits as long as the
/// agent takes: its callers are a person at a terminal, tests and the node controller.
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

    /// Sends `method path` with an optional JSON body; the status and the JSON answer
    /// (`null` for an empty one), whatever the status.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), ClientError> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let (status, answer) = self
            .call_raw(method, path, body.as_bytes(), "application/json")
            .await?;
        Ok((status, json(&answer)?))
    }

    /// Sends `method path` with `body` of `content_type`; the status and the answer's
    /// bytes, whatever the status.
    pub async fn call_raw(
        &self,
        method: Method,
        path: &str,
        body: &[u8],
        content_type: &str,
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        let request = exchange::request(&method, path, content_type, body)
            .ok_or_else(|| ClientError::BadPath(path.to_owned()))?;
        let mut stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ClientError::Connect {
                    at: self.socket.display().to_string(),
                    source,
                    hint: "is `themis agent` running? set --socket or THEMIS_SOCKET",
                })?;
        stream.write_all(&request).await?;
        let mut answer = Vec::new();
        stream.take(ANSWER_LIMIT).read_to_end(&mut answer).await?;
        Ok(exchange::answer(&answer)?)
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<(StatusCode, Value), ClientError> {
        self.call(Method::GET, path, None).await
    }
}

/// `body` as JSON; an empty body reads as `null`.
fn json(body: &[u8]) -> Result<serde_json::Value, ClientError> {
    if body.is_empty() {
        return Ok(serde_json::Value::Null);
    }
    Ok(serde_json::from_slice(body)?)
}
