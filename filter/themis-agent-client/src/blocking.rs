//! The blocking driver: one connection per call, bounded in bytes and in time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
#[cfg(unix)]
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{Method, StatusCode};
use serde::de::DeserializeOwned;

use crate::exchange::{self, ANSWER_LIMIT};
use crate::ClientError;

/// Where the agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Its local API (`--socket`).
    #[cfg(unix)]
    Unix(PathBuf),
    /// Its read-only endpoint (`--resolve-listen`), for what cannot reach a socket
    /// file (the wasmtime component).
    Tcp(SocketAddr),
}

/// Calls one agent, a connection per call, each read and write within a timeout.
#[derive(Debug, Clone)]
pub struct Client {
    at: Endpoint,
    timeout: Duration,
}

/// A stream either kind of endpoint gives.
trait Stream: Read + Write {
    fn timeouts(&self, read: Duration, write: Duration) -> std::io::Result<()>;
}
#[cfg(unix)]
impl Stream for UnixStream {
    fn timeouts(&self, read: Duration, write: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(read))?;
        self.set_write_timeout(Some(write))
    }
}
impl Stream for TcpStream {
    fn timeouts(&self, read: Duration, write: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(read))?;
        self.set_write_timeout(Some(write))
    }
}

impl Client {
    /// The default bound on each read and write of a call.
    pub const TIMEOUT: Duration = Duration::from_secs(10);

    /// A client of the agent serving `socket`.
    #[cfg(unix)]
    pub fn unix(socket: impl AsRef<Path>) -> Self {
        Client::at(Endpoint::Unix(socket.as_ref().to_owned()))
    }

    /// A client of the agent's read-only endpoint at `address`.
    pub fn tcp(address: SocketAddr) -> Self {
        Client::at(Endpoint::Tcp(address))
    }

    /// A client of `at`.
    pub fn at(at: Endpoint) -> Self {
        Client {
            at,
            timeout: Self::TIMEOUT,
        }
    }

    /// The same client, each read and write bounded by `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends `method path` with `body` of `content_type`; the status and the answer's
    /// bytes, whatever the status. A read waits at most `wait` (a long poll waits
    /// longer than the client's timeout).
    pub fn call_raw_within(
        &self,
        method: Method,
        path: &str,
        body: &[u8],
        content_type: &str,
        wait: Duration,
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        let request = exchange::request(&method, path, content_type, body)
            .ok_or_else(|| ClientError::BadPath(path.to_owned()))?;
        let mut stream = self.connect()?;
        // Best effort: WASI's sockets may not take a timeout, and an answer still comes.
        stream.timeouts(wait, self.timeout).ok();
        stream.write_all(&request)?;
        let mut answer = Vec::new();
        stream.take(ANSWER_LIMIT).read_to_end(&mut answer)?;
        Ok(exchange::answer(&answer)?)
    }

    /// [`Client::call_raw_within`] the client's timeout.
    pub fn call_raw(
        &self,
        method: Method,
        path: &str,
        body: &[u8],
        content_type: &str,
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        self.call_raw_within(method, path, body, content_type, self.timeout)
    }

    /// `GET path`, read as `T` if the agent answered 2xx.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let (status, body) = self.call_raw(Method::GET, path, b"", "application/json")?;
        Ok(serde_json::from_slice(&crate::success(status, body)?)?)
    }

    /// `POST path` with `body` as JSON, the answer read as `T` if the agent answered 2xx.
    pub fn post<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let body = serde_json::to_vec(body)?;
        let (status, answer) = self.call_raw(Method::POST, path, &body, "application/json")?;
        Ok(serde_json::from_slice(&crate::success(status, answer)?)?)
    }

    fn connect(&self) -> Result<Box<dyn Stream>, ClientError> {
        let unreachable = |at: String, hint: &'static str| {
            move |source| ClientError::Connect { at, source, hint }
        };
        Ok(match &self.at {
            #[cfg(unix)]
            Endpoint::Unix(path) => Box::new(UnixStream::connect(path).map_err(unreachable(
                path.display().to_string(),
                "is `themis agent` running? set --socket or THEMIS_SOCKET",
            ))?),
            Endpoint::Tcp(address) => {
                Box::new(TcpStream::connect(address).map_err(unreachable(
                    address.to_string(),
                    "is the agent running with --resolve-listen at that address?",
                ))?)
            }
        })
    }
}
