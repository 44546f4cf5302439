//! A man in the middle between Envoy A and Envoy B: a TCP proxy that reads the
//! client-to-server direction as HTTP/1.1 requests (Envoy pools and reuses upstream
//! connections, so every request on a connection is parsed), records the
//! `/.themis/v1/request` exchanges, and tampers with their body in the current mode.
//! The server-to-client direction is copied as it is.

use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use themis_core::wire::RECORD_HEADER_LEN;
use themis_envoy::protocol::path;

use super::http::{self, Framing};

/// What the proxy does to the body of a request exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward as it is (and record it).
    Pass,
    /// Flip one bit in the middle of the ciphertext.
    Flip,
    /// Drop the last bytes.
    Truncate,
    /// Swap two 8-byte chunks of the ciphertext.
    Reorder,
}

#[derive(Default)]
struct State {
    mode: Mutex<Option<Mode>>,
    /// Raw bytes (head and body) of every request exchange forwarded untouched.
    recorded: Mutex<Vec<Vec<u8>>>,
    /// Request exchanges changed so far.
    tampered: AtomicUsize,
    stop: AtomicBool,
    /// Every socket, to shut down when the proxy stops.
    sockets: Mutex<Vec<TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

pub struct Mitm {
    pub addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl Mitm {
    /// Listens on `ip` (a free port) and forwards to `upstream`.
    pub fn start(ip: &str, upstream: SocketAddr) -> Mitm {
        let listener = TcpListener::bind((ip, 0)).expect("binding the proxy");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        *state.mode.lock().unwrap() = Some(Mode::Pass);
        let shared = state.clone();
        let accept = std::thread::spawn(move || {
            for client in listener.incoming() {
                if shared.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                {
                    let mut sockets = shared.sockets.lock().unwrap();
                    sockets.push(client.try_clone().unwrap());
                    sockets.push(server.try_clone().unwrap());
                }
                let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let st = shared.clone();
                let up = std::thread::spawn(move || client_to_server(c, s, &st));
                let down = std::thread::spawn(move || {
                    let (mut server, mut client) = (server, client);
                    let _ = std::io::copy(&mut server, &mut client);
                    let _ = client.shutdown(Shutdown::Write);
                });
                shared.threads.lock().unwrap().extend([up, down]);
            }
        });
        Mitm {
            addr,
            state,
            accept: Some(accept),
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = Some(mode);
    }

    /// The request exchanges forwarded untouched so far, oldest first.
    pub fn recorded(&self) -> Vec<Vec<u8>> {
        self.state.recorded.lock().unwrap().clone()
    }

    /// How many request exchanges were tampered with so far.
    pub fn tampered(&self) -> usize {
        self.state.tampered.load(Ordering::SeqCst)
    }
}

impl Drop for Mitm {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for socket in self.state.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = self.state.threads.lock().unwrap().drain(..).collect();
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Reads requests from the client and forwards them, tampering as told.
fn client_to_server(client: TcpStream, mut server: TcpStream, state: &State) {
    let mut reader = BufReader::new(client);
    loop {
        let mut raw = Vec::new();
        let Ok(Some(line)) = http::read_line(&mut reader, &mut raw) else {
            break;
        };
        let Ok(headers) = http::read_headers(&mut reader, &mut raw) else {
            break;
        };
        let head_len = raw.len();
        let Ok(framing) = http::framing(&headers, Framing::Length(0)) else {
            break;
        };
        let Ok(body) = http::read_body(&mut reader, framing, &mut raw) else {
            break;
        };
        let is_request = line.split(' ').nth(1) == Some(path::REQUEST);
        let mode = state.mode.lock().unwrap().unwrap_or(Mode::Pass);
        let out = if !is_request || mode == Mode::Pass {
            if is_request {
                state.recorded.lock().unwrap().push(raw.clone());
            }
            raw
        } else {
            state.tampered.fetch_add(1, Ordering::SeqCst);
            rebuild(&raw[..head_len], &headers, &tamper(body, mode))
        };
        if server.write_all(&out).is_err() {
            break;
        }
    }
    let _ = server.shutdown(Shutdown::Write);
}

fn tamper(mut body: Vec<u8>, mode: Mode) -> Vec<u8> {
    let h = RECORD_HEADER_LEN;
    assert!(
        body.len() >= h + 32,
        "a request record of {} bytes is shorter than expected",
        body.len()
    );
    let middle = h + (body.len() - h) / 2;
    match mode {
        Mode::Pass => {}
        Mode::Flip => body[middle] ^= 0x01,
        Mode::Truncate => body.truncate(body.len() - 10),
        Mode::Reorder => {
            let (first, second) = body[h..h + 16].split_at_mut(8);
            first.swap_with_slice(second);
        }
    }
    body
}

/// The request head with the body's framing replaced by a content-length.
fn rebuild(head: &[u8], headers: &[(String, String)], body: &[u8]) -> Vec<u8> {
    let head = String::from_utf8_lossy(head);
    let request_line = head.lines().next().unwrap_or_default();
    let mut out = format!("{request_line}\r\n");
    for (name, value) in headers {
        if name != "content-length" && name != "transfer-encoding" {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    out.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}
