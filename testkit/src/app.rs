//! The app behind Envoy B: an HTTP/1.1 server that answers every request with JSON
//! echoing its method, path, every header (in order, duplicates kept) and body, plus
//! a marker of its own, and counts the requests it received. Its responses also claim
//! a false `x-themis-peer-id`/`-service`, which the caller's sidecar must replace.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;

/// An HTTP/1.1 server on a runtime of its own (the tests' threads block), stopped
/// when it drops.
pub struct Http1Server {
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Http1Server {
    /// Listens on `ip` (a free port); `handle` answers every request.
    pub fn start<F, A>(ip: &str, handle: F) -> Http1Server
    where
        F: Fn(Request<Incoming>) -> A + Clone + Send + Sync + 'static,
        A: Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
    {
        let ip: std::net::IpAddr = ip.parse().expect("an IP address");
        Http1Server::start_at(SocketAddr::new(ip, 0), handle)
    }

    /// [`Http1Server::start`] at `addr`.
    pub fn start_at<F, A>(addr: SocketAddr, handle: F) -> Http1Server
    where
        F: Fn(Request<Incoming>) -> A + Clone + Send + Sync + 'static,
        A: Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
    {
        let listener = std::net::TcpListener::bind(addr)
            .unwrap_or_else(|e| panic!("binding an HTTP server on {addr}: {e}"));
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper::service::service_fn(handle.clone());
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Http1Server {
            addr,
            runtime: Some(runtime),
        }
    }
}

impl Drop for Http1Server {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

pub struct App {
    pub addr: SocketAddr,
    count: Arc<AtomicUsize>,
    /// Serves until the app drops.
    _server: Http1Server,
}

impl App {
    /// Listens on `ip` (a free port); `marker` goes into every response body.
    pub fn start(ip: &str, marker: &str) -> App {
        let ip: std::net::IpAddr = ip.parse().expect("an IP address");
        App::start_at(SocketAddr::new(ip, 0), marker)
    }

    /// [`App::start`] at `addr`: an app that starts where its sidecar expects it.
    pub fn start_at(addr: SocketAddr, marker: &str) -> App {
        let count = Arc::new(AtomicUsize::new(0));
        let marker: Arc<str> = marker.into();
        let counter = count.clone();
        let server = Http1Server::start_at(addr, move |request| {
            echo(request, counter.clone(), marker.clone())
        });
        App {
            addr: server.addr,
            count,
            _server: server,
        }
    }

    /// How many requests arrived so far.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

/// The id the echo app claims in its responses (never the truth).
pub const FORGED_PEER_ID: &str = "forged-by-the-app";

async fn echo(
    request: Request<Incoming>,
    count: Arc<AtomicUsize>,
    marker: Arc<str>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    count.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let answer = json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path_and_query().map_or("", |p| p.as_str()),
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
        "body_len": body.len(),
        "marker": &*marker,
    });
    // The callee's app claims to be someone else: the caller's sidecar must answer
    // with the id its connection proved, whatever the app says.
    Ok(Response::builder()
        .header("content-type", "application/json")
        .header("x-app", "echo")
        .header("x-themis-peer-id", FORGED_PEER_ID)
        .header("x-themis-peer-service", "forged-by-the-app")
        .body(Full::new(Bytes::from(answer.to_string())))
        .unwrap())
}

/// The values the app saw for header `name`.
pub fn seen_header<'a>(echo: &'a serde_json::Value, name: &str) -> Vec<&'a str> {
    echo["headers"]
        .as_array()
        .expect("the echo has headers")
        .iter()
        .filter(|pair| pair[0].as_str() == Some(name))
        .filter_map(|pair| pair[1].as_str())
        .collect()
}
