//! The one client of a Themis agent's local API, over its Unix socket (or the
//! read-only endpoint, over TCP).
//!
//! Sans-IO at its core, like the rest of the sidecar: [`exchange::request`] gives the
//! bytes of one HTTP/1.1 exchange (`connection: close`) and [`exchange::answer`] reads
//! whatever came back, total on any bytes (fuzzed: `fuzz/fuzz_targets/envoy_decoders.rs`).
//! Two thin drivers move the bytes: [`Client`], over a blocking std stream with
//! timeouts (the native module's runtime threads, the wasmtime component), and, with
//! the `tokio` feature, [`ApiClient`] (the CLI, the node controller, the test kit).

pub mod exchange;

mod blocking;
#[cfg(feature = "tokio")]
mod nonblocking;

pub use blocking::{Client, Endpoint};
pub use exchange::AnswerError;
pub use http::{Method, StatusCode};
#[cfg(feature = "tokio")]
pub use nonblocking::ApiClient;

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent could not be reached.
    #[error("cannot reach the agent at {at}: {source} ({hint})")]
    Connect {
        /// The socket or address.
        at: String,
        /// What the system said.
        source: std::io::Error,
        /// What to check.
        hint: &'static str,
    },
    /// The exchange broke off (a write failed, or no answer within the timeout).
    #[error("talking to the agent: {0}")]
    Io(#[from] std::io::Error),
    /// What came back is not an HTTP answer this client reads.
    #[error("the agent's answer: {0}")]
    Answer(#[from] AnswerError),
    /// The path would not fit in a request line.
    #[error("not a request path: {0:?}")]
    BadPath(String),
    /// The answer's body is not the JSON expected.
    #[error("the agent answered with something that is not the JSON expected: {0}")]
    Json(#[from] serde_json::Error),
    /// The agent answered, but not with 2xx.
    #[error("the agent answered {status}: {message}")]
    Refused {
        /// Its status.
        status: StatusCode,
        /// Its `error` (an [`ErrorBody`](themis_contracts::api::ErrorBody)), or the
        /// start of the body as text.
        message: String,
    },
}

/// The body of a 2xx answer, or [`ClientError::Refused`] saying what the agent said.
pub fn success(status: StatusCode, body: Vec<u8>) -> Result<Vec<u8>, ClientError> {
    if status.is_success() {
        return Ok(body);
    }
    let message = match serde_json::from_slice::<themis_contracts::api::ErrorBody>(&body) {
        Ok(e) => e.error,
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
    };
    Err(ClientError::Refused { status, message })
}
