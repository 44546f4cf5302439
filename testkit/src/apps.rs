//! The real-protocol apps of themis-envoy's `tests/protocols.rs` and their clients:
//! gRPC and WebSocket (Python scripts in this crate's `apps/`, run by the `.venv` that
//! `scripts/setup.sh` fills), an upload sink that counts and hashes what it receives,
//! and Debian's redis.

use std::convert::Infallible;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};

use crate::app::Http1Server;
use crate::build::venv_binary;
use crate::http;
use crate::process::{installed, Process};

/// How long a client script may run.
const CLIENT_LIMIT: Duration = Duration::from_secs(90);

/// `python3 -u testkit/apps/<name>`, by the `.venv`'s Python (it has grpcio and
/// websockets); unbuffered, so the log shows what the script said as it says it.
fn python_script(name: &str) -> Command {
    let mut command = Command::new(venv_binary("python3"));
    command.arg("-u").arg(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("apps")
            .join(name),
    );
    command
}

/// A server script that prints `listening <port>` once it accepts connections.
pub struct PyServer {
    pub addr: SocketAddr,
    process: Process,
}

impl PyServer {
    pub fn start(dir: &Path, name: &str, script_name: &str, ip: &str, args: &[&str]) -> PyServer {
        let mut command = python_script(script_name);
        command.args(["server", "--listen", ip]).args(args);
        let mut process = Process::spawn(name, command, &dir.join(format!("{name}.log")));
        let port: u16 =
            process.wait_running(&format!("{name} to listen"), Duration::from_secs(30), |p| {
                p.log()
                    .lines()
                    .find_map(|l| l.strip_prefix("listening ")?.trim().parse().ok())
            });
        PyServer {
            addr: SocketAddr::new(ip.parse().unwrap(), port),
            process,
        }
    }

    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// Runs a client script to its end (bounded); returns the JSON it wrote to `--out`,
/// or panics with its output.
pub fn run_client(dir: &Path, name: &str, script_name: &str, args: &[&str]) -> Value {
    let out = dir.join(format!("{name}.json"));
    let _ = std::fs::remove_file(&out);
    let mut command = python_script(script_name);
    command.arg("client").args(args).arg("--out").arg(&out);
    let mut process = Process::spawn(name, command, &dir.join(format!("{name}.log")));
    let status = process.wait_exit(CLIENT_LIMIT);
    let log = process.log();
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("{name} failed ({s}):\n{log}"),
        None => panic!("{name} did not finish within {CLIENT_LIMIT:?}:\n{log}"),
    }
    let text = std::fs::read_to_string(&out)
        .unwrap_or_else(|e| panic!("{name} wrote no {}: {e}\n{log}", out.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}: {text}"))
}

/// An HTTP/1.1 app that reads each request's body as it streams and answers
/// `{"bytes": n, "sha256": hex}`.
pub struct Sink {
    pub addr: SocketAddr,
    /// Serves until the sink drops.
    _server: Http1Server,
}

impl Sink {
    pub fn start(ip: &str) -> Sink {
        let server = Http1Server::start(ip, sink);
        Sink {
            addr: server.addr,
            _server: server,
        }
    }
}

async fn sink(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut body = request.into_body();
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let mut bytes = 0u64;
    let mut error = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    bytes += data.len() as u64;
                    hash.update(data);
                }
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let answer = json!({
        "bytes": bytes,
        "sha256": hex::encode(hash.finish().as_ref()),
        "error": error,
    });
    Ok(Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(answer.to_string())))
        .unwrap())
}

/// A generated body of `total` bytes, made piece by piece: pseudo-random bytes with
/// `marker` at the start of every MiB.
pub struct Generated {
    state: u64,
    left: u64,
    offset: u64,
    marker: Vec<u8>,
}

impl Generated {
    pub fn new(total: u64, marker: &str) -> Generated {
        Generated {
            state: 0x9E37_79B9_7F4A_7C15,
            left: total,
            offset: 0,
            marker: marker.as_bytes().to_vec(),
        }
    }

    /// The next piece (at most 1 MiB, aligned on MiB), empty at the end.
    pub fn next_piece(&mut self) -> Vec<u8> {
        let len = self.left.min(1 << 20) as usize;
        let mut piece = Vec::with_capacity(len);
        while piece.len() + 8 <= len {
            // xorshift64*
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            piece.extend_from_slice(&self.state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        piece.resize(len, b'.');
        let m = self.marker.len().min(len);
        piece[..m].copy_from_slice(&self.marker[..m]);
        self.left -= len as u64;
        self.offset += len as u64;
        piece
    }
}

/// POSTs a generated body of `total` bytes to `http://<host>/upload` on `addr`
/// (content-length, written as it is generated); returns the response and the
/// SHA-256 of what was sent.
pub fn upload(addr: SocketAddr, host: &str, total: u64, marker: &str) -> (http::Response, String) {
    let mut stream = TcpStream::connect_timeout(&addr, http::IO_TIMEOUT).expect("connecting");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "POST /upload HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/octet-stream\r\ncontent-length: {total}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut body = Generated::new(total, marker);
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    loop {
        let piece = body.next_piece();
        if piece.is_empty() {
            break;
        }
        hash.update(&piece);
        stream
            .write_all(&piece)
            .unwrap_or_else(|e| panic!("writing the upload at byte {}: {e}", body.offset));
    }
    let response = http::read_response(&mut BufReader::new(stream)).expect("the upload's answer");
    (response, hex::encode(hash.finish().as_ref()))
}

/// Debian's redis-server on `ip`, without persistence.
pub struct Redis {
    pub addr: SocketAddr,
    process: Process,
}

impl Redis {
    pub fn start(dir: &Path, ip: &str) -> Redis {
        let addr = crate::ports::closed_port(ip);
        let data = dir.join("redis");
        std::fs::create_dir_all(&data).unwrap();
        let mut command = Command::new(installed("redis-server"));
        command
            .args(["--bind", ip, "--port", &addr.port().to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "no", "--dir"])
            .arg(&data);
        let mut process = Process::spawn("redis-server", command, &dir.join("redis-server.log"));
        process.wait_running(
            "redis-server to accept connections",
            Duration::from_secs(20),
            |p| {
                p.log()
                    .contains("Ready to accept connections")
                    .then_some(())
            },
        );
        Redis { addr, process }
    }

    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// `redis-cli -h <ip> -p <port> ARGS` (with `stdin` for -x), bounded by timeout(1);
/// returns (exit code, stdout, stderr).
pub fn redis_cli(addr: SocketAddr, args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    let mut command = Command::new("timeout");
    command
        .arg("30")
        .arg(installed("redis-cli"))
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(if stdin.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        });
    let mut child = command.spawn().expect("running redis-cli");
    if let Some(bytes) = stdin {
        let mut input = child.stdin.take().unwrap();
        input.write_all(bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
