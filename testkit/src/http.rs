//! A small blocking HTTP/1.1 client: every byte of what is sent is under the test's
//! control (forged headers, replayed records), and every wait is bounded.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// Limit on connecting and on every read.
pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// A response as received.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of a header (names are compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the response if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("the body is not JSON ({e}):\n{self}"))
    }
}

impl fmt::Display for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "HTTP {}", self.status)?;
        for (n, v) in &self.headers {
            writeln!(f, "{n}: {v}")?;
        }
        let text = self.text();
        let cut: String = text.chars().take(2000).collect();
        write!(f, "\n{cut}")
    }
}

/// Sends one request on a new connection (`connection: close`) and reads the answer.
/// `headers` must include `host`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method != "GET" {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("connection: close\r\n\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    exchange(addr, &bytes).unwrap_or_else(|e| panic!("{method} {path} at {addr}: {e}"))
}

/// Writes raw bytes on a new connection and reads one response.
pub fn exchange(addr: SocketAddr, bytes: &[u8]) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(bytes)?;
    read_response(&mut BufReader::new(stream))
}

fn bad(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// One line without its CRLF; `None` at the end of the stream.
pub fn read_line(reader: &mut impl BufRead, raw: &mut Vec<u8>) -> io::Result<Option<String>> {
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line)? == 0 {
        return Ok(None);
    }
    raw.extend_from_slice(&line);
    if !line.ends_with(b"\n") {
        return Err(bad("the stream ended in the middle of a line"));
    }
    let text = String::from_utf8(line).map_err(|_| bad("a line is not UTF-8"))?;
    Ok(Some(text.trim_end_matches(['\r', '\n']).to_owned()))
}

/// Header lines up to the empty line.
pub fn read_headers(
    reader: &mut impl BufRead,
    raw: &mut Vec<u8>,
) -> io::Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    loop {
        let line = read_line(reader, raw)?.ok_or_else(|| bad("the stream ended in the headers"))?;
        if line.is_empty() {
            return Ok(headers);
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(format!("not a header line: {line:?}")))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
}

/// How a message's body is delimited.
pub enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

pub fn framing(headers: &[(String, String)], default: Framing) -> io::Result<Framing> {
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"))
    {
        return Ok(Framing::Chunked);
    }
    match headers.iter().find(|(n, _)| n == "content-length") {
        Some((_, v)) => v
            .parse()
            .map(Framing::Length)
            .map_err(|_| bad(format!("bad content-length {v:?}"))),
        None => Ok(default),
    }
}

/// Reads a body; returns the decoded bytes (`raw` gets the bytes as they came).
pub fn read_body(
    reader: &mut impl BufRead,
    framing: Framing,
    raw: &mut Vec<u8>,
) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    match framing {
        Framing::Length(n) => {
            body.resize(n, 0);
            reader.read_exact(&mut body)?;
            raw.extend_from_slice(&body);
        }
        Framing::UntilClose => {
            reader.read_to_end(&mut body)?;
            raw.extend_from_slice(&body);
        }
        Framing::Chunked => loop {
            let line = read_line(reader, raw)?.ok_or_else(|| bad("the stream ended in a chunk"))?;
            let size = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size, 16)
                .map_err(|_| bad(format!("bad chunk size {line:?}")))?;
            if size == 0 {
                // Trailers, up to the empty line.
                read_headers(reader, raw)?;
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            raw.extend_from_slice(&chunk);
            body.extend_from_slice(&chunk[..size]);
        },
    }
    Ok(body)
}

/// Reads one response.
pub fn read_response(reader: &mut impl BufRead) -> io::Result<Response> {
    let mut raw = Vec::new();
    let line = read_line(reader, &mut raw)?
        .ok_or_else(|| bad("the connection closed without a response"))?;
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("not a status line: {line:?}")))?;
    let headers = read_headers(reader, &mut raw)?;
    let body = if status < 200 || status == 204 || status == 304 {
        Vec::new()
    } else {
        let framing = framing(&headers, Framing::UntilClose)?;
        read_body(reader, framing, &mut raw)?
    };
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// One client connection, kept alive across calls (so they run on one Envoy worker
/// and share its pooled upstream connection).
pub struct KeepAlive {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl KeepAlive {
    pub fn connect(addr: SocketAddr) -> KeepAlive {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        KeepAlive { stream, reader }
    }

    /// A POST to `http://<host><path>`; an error if the connection is gone.
    pub fn post(&mut self, host: &str, path: &str, body: &[u8]) -> io::Result<Response> {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        self.stream.write_all(head.as_bytes())?;
        self.stream.write_all(body)?;
        read_response(&mut self.reader)
    }
}
