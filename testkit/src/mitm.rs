//! A man in the middle between Envoy A's sealing listener and Envoy B's inbound
//! listener: a TCP proxy that sees only the sealed stream. It splits the A→B
//! direction into Themis messages (`themis_core::wire::frame_len`: Hello, Confirm,
//! then records, the first of which is the Meta record) or, on the TLS binding, into
//! TLS records ([`Framing`]), and, when armed, tampers once with one record; B→A is
//! copied as it is. Every byte of every connection is recorded, both directions, for
//! [`replay`].

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use themis_core::wire::{frame_len, peek_kind, Kind, RECORD_HEADER_LEN};

use crate::process::wait_until;

/// How long [`replay`] waits for an answer or for the close.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS record's header: content type, legacy version, length.
const TLS_HEADER_LEN: usize = 5;
/// The content type of every encrypted TLS 1.3 record.
const TLS_APPLICATION_DATA: u8 = 23;

/// How the proxy splits the A→B stream into messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Themis messages: Hello and Confirm pass, records count (0: the Meta record).
    Themis,
    /// TLS records: the encrypted ones count (in TLS 1.3 the caller's Certificate
    /// and Finished flight is record 0), the ClientHello and ChangeCipherSpec pass.
    Tls,
}

impl Framing {
    /// The length of the message `buf` starts with, once its header is there
    /// (`Ok(None)` before); `Err` if `buf` is not of this framing.
    fn next_len(self, buf: &[u8]) -> Result<Option<usize>, ()> {
        match self {
            Framing::Themis => frame_len(buf).map_err(|_| ()),
            Framing::Tls => match buf {
                [kind, ..] if !(20..=24).contains(kind) => Err(()),
                [_, _, _, high, low, ..] => Ok(Some(
                    TLS_HEADER_LEN + usize::from(u16::from_be_bytes([*high, *low])),
                )),
                _ => Ok(None),
            },
        }
    }

    /// Whether `message` is a record: counted, and what a mode tampers with.
    fn is_record(self, message: &[u8]) -> bool {
        match self {
            Framing::Themis => peek_kind(message).ok() == Some(Kind::Record),
            Framing::Tls => message.first() == Some(&TLS_APPLICATION_DATA),
        }
    }

    /// A record's header, before its ciphertext.
    fn header_len(self) -> usize {
        match self {
            Framing::Themis => RECORD_HEADER_LEN,
            Framing::Tls => TLS_HEADER_LEN,
        }
    }
}

/// What the proxy does to the A→B stream. A tampering mode acts once, on the first
/// record of a connection whose index (0: the Meta record, right after Confirm) is at
/// least the one given, then the proxy passes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward as it is.
    Pass,
    /// Flip one bit in the middle of the record's ciphertext.
    Flip(usize),
    /// Forward the record without its last bytes, then close toward B.
    Truncate(usize),
    /// Swap the record with the next one.
    Reorder(usize),
    /// Send these bytes instead of the record.
    Inject(usize, &'static [u8]),
}

impl Mode {
    fn from(self) -> Option<usize> {
        match self {
            Mode::Pass => None,
            Mode::Flip(n) | Mode::Truncate(n) | Mode::Reorder(n) | Mode::Inject(n, _) => Some(n),
        }
    }
}

/// The bytes of one proxied connection.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    /// What went to B (after any tampering), in order.
    pub to_b: Vec<u8>,
    /// What B sent back.
    pub to_a: Vec<u8>,
    /// Both directions are finished.
    pub ended: bool,
}

#[derive(Default)]
struct Log {
    conn: Connection,
    /// Directions still running (2, then 1, then 0: ended).
    open: u8,
}

type Shared<T> = Arc<Mutex<T>>;

#[derive(Default)]
struct State {
    mode: Mutex<Option<Mode>>,
    connections: Mutex<Vec<Shared<Log>>>,
    /// Records changed so far.
    tampered: AtomicUsize,
    stop: AtomicBool,
    /// The live sockets, to shut down on [`Mitm::disconnect`] and on drop.
    sockets: Mutex<Vec<TcpStream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

pub struct Mitm {
    pub addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl Mitm {
    /// Listens on `ip` (a free port) and forwards to `upstream`, Themis-framed.
    pub fn start(ip: &str, upstream: SocketAddr) -> Mitm {
        Mitm::start_framed(ip, upstream, Framing::Themis)
    }

    /// [`Mitm::start`], splitting the A→B stream by `framing`.
    pub fn start_framed(ip: &str, upstream: SocketAddr, framing: Framing) -> Mitm {
        let listener = TcpListener::bind((ip, 0)).expect("binding the proxy");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
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
                let log = Arc::new(Mutex::new(Log {
                    open: 2,
                    ..Log::default()
                }));
                shared.connections.lock().unwrap().push(log.clone());
                shared
                    .sockets
                    .lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                let (c, s, l, st) = (
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    log.clone(),
                    shared.clone(),
                );
                let up = std::thread::spawn(move || a_to_b(c, s, &l, &st, framing));
                let down = std::thread::spawn(move || b_to_a(server, client, &log));
                shared.threads.lock().unwrap().extend([up, down]);
            }
        });
        Mitm {
            addr,
            state,
            accept: Some(accept),
        }
    }

    /// Arms a tampering mode (or disarms it with [`Mode::Pass`]).
    pub fn set_mode(&self, mode: Mode) {
        *self.state.mode.lock().unwrap() = Some(mode);
    }

    /// How many records were tampered with so far.
    pub fn tampered(&self) -> usize {
        self.state.tampered.load(Ordering::SeqCst)
    }

    /// Every connection so far, oldest first.
    pub fn connections(&self) -> Vec<Connection> {
        let all = self.state.connections.lock().unwrap();
        all.iter().map(|l| l.lock().unwrap().conn.clone()).collect()
    }

    /// Closes every live connection (both ends see it) and waits until they ended.
    pub fn disconnect(&self) {
        for socket in self.state.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        wait_until(
            "the proxied connections to end",
            Duration::from_secs(10),
            || self.connections().iter().all(|c| c.ended).then_some(()),
        );
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

fn finish(log: &Mutex<Log>) {
    let mut log = log.lock().unwrap();
    log.open -= 1;
    log.conn.ended = log.open == 0;
}

fn b_to_a(mut server: TcpStream, mut client: TcpStream, log: &Mutex<Log>) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = server.read(&mut buf) {
        log.lock().unwrap().conn.to_a.extend_from_slice(&buf[..n]);
        if client.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Write);
    finish(log);
}

/// Reads A's messages, one at a time, and forwards them, tampering when armed.
fn a_to_b(
    mut client: TcpStream,
    mut server: TcpStream,
    log: &Mutex<Log>,
    state: &State,
    framing: Framing,
) {
    let mut send = |bytes: &[u8]| {
        log.lock().unwrap().conn.to_b.extend_from_slice(bytes);
        server.write_all(bytes).is_ok()
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    // Records seen on this connection, and one held back to be reordered.
    let mut records = 0;
    let mut held: Option<Vec<u8>> = None;
    'read: while let Ok(n @ 1..) = client.read(&mut chunk) {
        buf.extend_from_slice(&chunk[..n]);
        while let Ok(Some(len)) = framing.next_len(&buf) {
            if len > buf.len() {
                break;
            }
            let mut frame: Vec<u8> = buf.drain(..len).collect();
            if !framing.is_record(&frame) {
                if !send(&frame) {
                    break 'read;
                }
                continue;
            }
            let index = records;
            records += 1;
            if let Some(first) = held.take() {
                // The swap: this record first, then the one held back.
                if !send(&frame) || !send(&first) {
                    break 'read;
                }
                continue;
            }
            let mode = {
                let mut armed = state.mode.lock().unwrap();
                match armed.and_then(Mode::from) {
                    Some(from) if index >= from => armed.take().unwrap(),
                    _ => Mode::Pass,
                }
            };
            if mode != Mode::Pass {
                state.tampered.fetch_add(1, Ordering::SeqCst);
            }
            let sent = match mode {
                Mode::Pass => send(&frame),
                Mode::Flip(_) => {
                    let header = framing.header_len();
                    let middle = header + (frame.len() - header) / 2;
                    frame[middle] ^= 0x01;
                    send(&frame)
                }
                Mode::Truncate(_) => {
                    send(&frame[..frame.len() - 10]);
                    break 'read;
                }
                Mode::Reorder(_) => {
                    held = Some(frame);
                    true
                }
                Mode::Inject(_, bytes) => send(bytes),
            };
            if !sent {
                break 'read;
            }
        }
        if framing.next_len(&buf).is_err() {
            // Not of this framing: pass it on as it is.
            if !send(&std::mem::take(&mut buf)) {
                break;
            }
        }
    }
    let _ = server.shutdown(Shutdown::Write);
    finish(log);
}

/// Two calls from `mesh`'s handler to `check` (registered at `mitm`), `body` each, go
/// through the proxy as they are: answered, and each reaching the app. Then every
/// connection is closed; what went over them is returned, none holding the body's
/// first 64 bytes in plaintext.
pub fn pass_through(mesh: &crate::mesh::Mesh, mitm: &Mitm, body: &[u8]) -> Vec<Connection> {
    for n in 0..2 {
        let r = mesh.call("POST", "check", &format!("/pass/{n}"), &[], body);
        assert_eq!(r.status, 200, "{r}\n{}", mesh.logs());
        assert_eq!(r.json()["body_len"], body.len());
    }
    assert_eq!(mesh.app.count(), 2);
    mitm.disconnect();
    let recorded = mitm.connections();
    assert!(!recorded.is_empty());
    for c in &recorded {
        assert!(c.ended);
        let plain = c.to_b.windows(64).filter(|w| *w == &body[..64]).count();
        assert_eq!(plain, 0, "the body crossed in plaintext");
    }
    recorded
}

/// A call of `mesh`'s handler to `check` through `mitm` armed with `mode`: the proxy
/// changes one record, the call fails (503) and nothing reaches the app.
pub fn tampered_call(mesh: &crate::mesh::Mesh, mitm: &Mitm, mode: Mode, path: &str, body: &[u8]) {
    let (tampered, served) = (mitm.tampered(), mesh.app.count());
    mitm.set_mode(mode);
    let r = mesh.call("POST", "check", path, &[], body);
    assert_eq!(
        mitm.tampered(),
        tampered + 1,
        "{mode:?}: the proxy changed nothing"
    );
    assert_eq!(r.status, 503, "{mode:?}: {r}\n{}", mesh.logs());
    assert_eq!(
        mesh.app.count(),
        served,
        "{mode:?}: the request reached the app"
    );
}

/// What came back from a [`replay`].
#[derive(Debug)]
pub struct Replayed {
    /// Every byte the server sent.
    pub answer: Vec<u8>,
    /// The server closed the connection (rather than going quiet).
    pub closed: bool,
}

/// Opens a new connection to `target` and sends `bytes`: all at once, or `paced`
/// like the original initiator (the Hello, then the rest once the server answered).
pub fn replay(target: SocketAddr, bytes: &[u8], paced: bool) -> Replayed {
    let mut stream = TcpStream::connect_timeout(&target, REPLAY_TIMEOUT).unwrap();
    stream.set_read_timeout(Some(REPLAY_TIMEOUT)).unwrap();
    let split = match paced {
        true => frame_len(bytes).ok().flatten().unwrap_or(bytes.len()),
        false => bytes.len(),
    };
    let mut answer = Vec::new();
    // Writes may fail once the server closed: what it did is in what it answered.
    let _ = stream.write_all(&bytes[..split]);
    let closed = if split < bytes.len() {
        match read_some(&mut stream, &mut answer) {
            Some(true) => true,
            _ => {
                let _ = stream.write_all(&bytes[split..]);
                read_to_close(&mut stream, &mut answer)
            }
        }
    } else {
        read_to_close(&mut stream, &mut answer)
    };
    Replayed { answer, closed }
}

/// Reads once; `Some(closed)`, `None` on a timeout.
fn read_some(stream: &mut TcpStream, answer: &mut Vec<u8>) -> Option<bool> {
    let mut buf = [0u8; 16 * 1024];
    match stream.read(&mut buf) {
        Ok(0) => Some(true),
        Ok(n) => {
            answer.extend_from_slice(&buf[..n]);
            Some(false)
        }
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
        Err(_) => Some(true),
    }
}

/// Reads until the server closes (`true`) or goes quiet (`false`).
fn read_to_close(stream: &mut TcpStream, answer: &mut Vec<u8>) -> bool {
    loop {
        match read_some(stream, answer) {
            Some(true) => return true,
            Some(false) => continue,
            None => return false,
        }
    }
}
