//! The filter module as the sidecars load it: fetched over HTTP and pinned to its
//! SHA-256 (`deploy/envoy/sidecar.yaml`'s `FILTER_CODE`, a `remote` data source). A
//! [`ModuleServer`] serves bytes on loopback; [`Pin`] is what a rendered sidecar says
//! about them (where, and which hash they must have).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::build::filter_wasm;

/// The module's path on every server.
const PATH: &str = "/themis_envoy.wasm";

/// The hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// Where a sidecar fetches its module and the hash the bytes must have.
#[derive(Clone, Debug)]
pub struct Pin {
    /// The server (the `themis_module` cluster's one endpoint).
    pub server: SocketAddr,
    /// The hex SHA-256 Envoy checks the fetched bytes against.
    pub sha256: String,
}

impl Pin {
    pub fn url(&self) -> String {
        format!("http://{}{PATH}", self.server)
    }

    /// The filter's code, fetched from the server and pinned to the hash.
    pub fn filter_code(&self) -> themis_bootstrap::FilterCode {
        themis_bootstrap::FilterCode::Fetched {
            server: self.server,
            path: PATH.to_owned(),
            sha256: self.sha256.clone(),
        }
    }
}

/// An HTTP/1.1 server on 127.0.0.1 that answers every request with the same bytes
/// (and closes); it stops when dropped.
pub struct ModuleServer {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ModuleServer {
    pub fn start(bytes: Vec<u8>) -> ModuleServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the module server");
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(stream) = stream {
                    let _ = answer(stream, &bytes);
                }
            }
        });
        ModuleServer {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    /// The pin of these bytes' hash on this server (which may serve other bytes:
    /// the tests of the pin).
    pub fn pin(&self, sha256: &str) -> Pin {
        Pin {
            server: self.addr,
            sha256: sha256.to_owned(),
        }
    }
}

impl Drop for ModuleServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request's head and answers it with `body`.
fn answer(stream: TcpStream, body: &[u8]) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    // Bounded: at most 100 header lines.
    for _ in 0..100 {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/wasm\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    stream.flush()
}

/// The built filter, served for the whole test process and pinned to its own hash.
pub fn filter_pin() -> &'static Pin {
    static PIN: OnceLock<(ModuleServer, Pin)> = OnceLock::new();
    &PIN.get_or_init(|| {
        let bytes = std::fs::read(filter_wasm()).expect("reading the filter module");
        let sha256 = sha256_hex(&bytes);
        let server = ModuleServer::start(bytes);
        let pin = server.pin(&sha256);
        (server, pin)
    })
    .1
}
