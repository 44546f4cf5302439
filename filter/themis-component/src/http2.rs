//! A minimal HTTP/2 client (RFC 9113) for one request on stream 1, sans-IO: it makes
//! the bytes to send and reads the bytes that arrive, and the caller moves them
//! (here, through the sealed stream to a sidecar's inbound listener, which speaks
//! HTTP/2 with prior knowledge). Header compression is `loona-hpack`'s.
//!
//! What it does: the connection preface and SETTINGS (push off), the request's HEADERS
//! (split into CONTINUATION frames past the peer's frame size) and DATA within the
//! peer's flow-control windows; it acknowledges the peer's SETTINGS and PINGs, gives
//! back the receive window as DATA is read, reassembles header blocks across
//! CONTINUATION frames, takes padding and priority fields off, honours GOAWAY and
//! RST_STREAM, and reports the response as [`Event`]s.

mod frame;

use std::borrow::Cow;

pub use frame::code::name as code_name;
use frame::{code, setting, Frame, FrameError, DEFAULT_MAX_FRAME_SIZE, MAX_WINDOW};

/// The client's only stream.
const STREAM: u32 = 1;
/// The default initial flow-control window (both directions, connection and stream).
const DEFAULT_WINDOW: i64 = 65_535;
/// The largest header block (all its fragments) accepted, and the largest decoded
/// header list (announced as SETTINGS_MAX_HEADER_LIST_SIZE).
const MAX_HEADER_BLOCK: usize = 256 * 1024;
const MAX_HEADER_LIST: usize = 256 * 1024;
/// HPACK's dynamic table: the default size, which this client never changes.
const HEADER_TABLE_SIZE: usize = 4096;

/// Headers that are the connection's business in HTTP/1.1 and forbidden in HTTP/2
/// (RFC 9113 §8.2.2).
const CONNECTION_SPECIFIC: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// The request to make.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// `:authority` (a `host` header, if given, takes its place).
    pub authority: String,
    pub headers: Vec<(String, String)>,
    /// `Some` sends a body (and its `content-length`), even an empty one.
    pub body: Option<Vec<u8>>,
}

/// What the response brought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A 1xx answer (the final one follows).
    Informational {
        status: u16,
        headers: Vec<(String, String)>,
    },
    /// The final status and headers.
    Response {
        status: u16,
        headers: Vec<(String, String)>,
    },
    /// A piece of the body.
    Data(Vec<u8>),
    Trailers(Vec<(String, String)>),
    /// The response is complete.
    End,
}

/// Why the exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The request cannot be sent as given.
    BadRequest(String),
    /// The peer broke the protocol: the connection ends with this code (the caller
    /// sends [`Error::goaway`]).
    Connection { code: u32, reason: String },
    /// The peer reset the stream.
    Reset(u32),
    /// The peer is going away without having processed the request.
    Refused { code: u32, debug: String },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::BadRequest(why) => write!(f, "bad request: {why}"),
            Error::Connection { code: c, reason } => {
                write!(f, "HTTP/2 protocol error ({}): {reason}", code::name(*c))
            }
            Error::Reset(c) => write!(f, "the server reset the stream ({})", code::name(*c)),
            Error::Refused { code: c, debug } => write!(
                f,
                "the server went away without processing the request ({}{}{debug})",
                code::name(*c),
                if debug.is_empty() { "" } else { ": " }
            ),
        }
    }
}

impl Error {
    /// The GOAWAY that ends the connection after a connection error.
    pub fn goaway(&self) -> Option<Vec<u8>> {
        let Error::Connection { code, .. } = self else {
            return None;
        };
        let mut out = Vec::new();
        Frame::GoAway {
            last_stream: 0,
            code: *code,
            debug: Vec::new(),
        }
        .encode(&mut out);
        Some(out)
    }
}

impl From<FrameError> for Error {
    fn from(e: FrameError) -> Error {
        Error::Connection {
            code: e.code,
            reason: e.reason.to_owned(),
        }
    }
}

fn connection(code: u32, reason: impl Into<String>) -> Error {
    Error::Connection {
        code,
        reason: reason.into(),
    }
}

/// A header block being reassembled from HEADERS and CONTINUATION frames.
struct PartialBlock {
    end_stream: bool,
    block: Vec<u8>,
}

/// The client's side of one connection carrying one request.
pub struct Client {
    inbox: Vec<u8>,
    decoder: loona_hpack::Decoder<'static>,
    partial: Option<PartialBlock>,
    /// What the peer allows: frame size, and the send windows.
    peer_max_frame: usize,
    peer_initial_window: i64,
    send_conn_window: i64,
    send_stream_window: i64,
    /// What we allow: the receive windows.
    recv_conn_window: i64,
    recv_stream_window: i64,
    /// The request body not sent yet; `None` once END_STREAM left.
    body: Option<Vec<u8>>,
    body_at: usize,
    final_headers: bool,
    done: bool,
    /// The peer's GOAWAY: last stream, code, debug data.
    goaway: Option<(u32, u32, Vec<u8>)>,
}

/// Lower-cases and checks one request header.
fn request_header(name: &str, value: &str) -> Result<(String, String), Error> {
    let name = name.trim().to_ascii_lowercase();
    let token = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(Error::BadRequest(format!("{name:?} is not a header name")));
    }
    if CONNECTION_SPECIFIC.contains(&name.as_str()) {
        return Err(Error::BadRequest(format!(
            "{name} is a connection header, which HTTP/2 does not carry"
        )));
    }
    let value = value.trim();
    if name == "te" && value != "trailers" {
        return Err(Error::BadRequest(
            "te may only be \"trailers\" in HTTP/2".into(),
        ));
    }
    if value.bytes().any(|c| c == b'\r' || c == b'\n' || c == 0) {
        return Err(Error::BadRequest(format!(
            "the value of {name} has a line break"
        )));
    }
    Ok((name, value.to_owned()))
}

impl Client {
    /// The client and its first bytes: the preface, SETTINGS, the request's HEADERS
    /// and as much of its body as the default windows allow.
    pub fn start(request: &Request) -> Result<(Client, Vec<u8>), Error> {
        let method = request.method.to_ascii_uppercase();
        if method.is_empty() || !method.bytes().all(|c| c.is_ascii_alphabetic()) {
            return Err(Error::BadRequest(format!(
                "{:?} is not a method",
                request.method
            )));
        }
        if method == "CONNECT" {
            return Err(Error::BadRequest("CONNECT is not supported".into()));
        }
        if !request.path.starts_with('/') || request.path.bytes().any(|c| c <= b' ') {
            return Err(Error::BadRequest(format!(
                "{:?} is not a path (it starts with /, without spaces)",
                request.path
            )));
        }
        let mut authority = request.authority.clone();
        let mut extra = Vec::new();
        for (name, value) in &request.headers {
            let (name, value) = request_header(name, value)?;
            match name.as_str() {
                "host" => authority = value,
                "content-length" if request.body.is_some() => {}
                _ => extra.push((name, value)),
            }
        }
        let mut headers: Vec<(String, String)> = vec![
            (":method".into(), method),
            (":scheme".into(), "http".into()),
            (":authority".into(), authority),
            (":path".into(), request.path.clone()),
        ];
        if let Some(body) = &request.body {
            headers.push(("content-length".into(), body.len().to_string()));
        }
        headers.extend(extra);
        let block = loona_hpack::Encoder::new()
            .encode(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));

        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(HEADER_TABLE_SIZE);
        let mut client = Client {
            inbox: Vec::new(),
            decoder,
            partial: None,
            peer_max_frame: DEFAULT_MAX_FRAME_SIZE,
            peer_initial_window: DEFAULT_WINDOW,
            send_conn_window: DEFAULT_WINDOW,
            send_stream_window: DEFAULT_WINDOW,
            recv_conn_window: DEFAULT_WINDOW,
            recv_stream_window: DEFAULT_WINDOW,
            body: request.body.clone().filter(|b| !b.is_empty()),
            body_at: 0,
            final_headers: false,
            done: false,
            goaway: None,
        };

        let mut out = themis_core::stream::HTTP2_PREFACE.to_vec();
        Frame::Settings {
            ack: false,
            settings: vec![
                (setting::ENABLE_PUSH, 0),
                (setting::MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST as u32),
            ],
        }
        .encode(&mut out);
        let end_stream = client.body.is_none();
        let mut fragments = block.chunks(client.peer_max_frame).peekable();
        let first = fragments.next().unwrap_or_default();
        Frame::Headers {
            stream: STREAM,
            end_stream,
            end_headers: fragments.peek().is_none(),
            fragment: first.to_vec(),
        }
        .encode(&mut out);
        while let Some(fragment) = fragments.next() {
            Frame::Continuation {
                stream: STREAM,
                end_headers: fragments.peek().is_none(),
                fragment: fragment.to_vec(),
            }
            .encode(&mut out);
        }
        client.send_body(&mut out);
        Ok((client, out))
    }

    /// True once the response is complete.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The peer's GOAWAY, if it sent one: (code, debug data).
    pub fn goaway(&self) -> Option<(u32, &[u8])> {
        self.goaway.as_ref().map(|(_, c, d)| (*c, d.as_slice()))
    }

    /// Sends what the windows allow of the body.
    fn send_body(&mut self, out: &mut Vec<u8>) {
        let Some(body) = &self.body else { return };
        while !self.done {
            let left = body.len() - self.body_at;
            let n = (left as i64)
                .min(self.peer_max_frame as i64)
                .min(self.send_conn_window)
                .min(self.send_stream_window);
            if n <= 0 && left > 0 {
                return;
            }
            let n = n.max(0) as usize;
            let end_stream = n == left;
            Frame::Data {
                stream: STREAM,
                end_stream,
                data: body[self.body_at..self.body_at + n].to_vec(),
                flow_len: n as u32,
            }
            .encode(out);
            self.body_at += n;
            self.send_conn_window -= n as i64;
            self.send_stream_window -= n as i64;
            if end_stream {
                self.body = None;
                return;
            }
        }
    }

    /// Reads bytes from the server: what to send back, and what the response brought.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(Vec<u8>, Vec<Event>), Error> {
        self.inbox.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut events = Vec::new();
        let mut at = 0;
        let result = loop {
            if self.done {
                break Ok(());
            }
            // We never change SETTINGS_MAX_FRAME_SIZE: the default bounds what we read.
            match frame::decode(&self.inbox[at..], DEFAULT_MAX_FRAME_SIZE) {
                Ok(Some((frame, used))) => {
                    at += used;
                    if let Err(e) = self.on_frame(frame, &mut out, &mut events) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.into()),
            }
        };
        self.inbox.drain(..at);
        result.map(|()| (out, events))
    }

    fn on_frame(
        &mut self,
        frame: Frame,
        out: &mut Vec<u8>,
        events: &mut Vec<Event>,
    ) -> Result<(), Error> {
        if self.partial.is_some() && !matches!(frame, Frame::Continuation { .. }) {
            return Err(connection(
                code::PROTOCOL_ERROR,
                "a frame between HEADERS and its CONTINUATION",
            ));
        }
        match frame {
            Frame::Data {
                stream,
                end_stream,
                data,
                flow_len,
            } => {
                if stream != STREAM || !self.final_headers {
                    return Err(connection(
                        code::PROTOCOL_ERROR,
                        "DATA on a stream that has no response open",
                    ));
                }
                self.recv_conn_window -= flow_len as i64;
                self.recv_stream_window -= flow_len as i64;
                if self.recv_conn_window < 0 || self.recv_stream_window < 0 {
                    return Err(connection(
                        code::FLOW_CONTROL_ERROR,
                        "DATA beyond the window",
                    ));
                }
                if flow_len > 0 {
                    // Read at once: give the window back.
                    Frame::WindowUpdate {
                        stream: 0,
                        increment: flow_len,
                    }
                    .encode(out);
                    self.recv_conn_window += flow_len as i64;
                    if !end_stream {
                        Frame::WindowUpdate {
                            stream: STREAM,
                            increment: flow_len,
                        }
                        .encode(out);
                        self.recv_stream_window += flow_len as i64;
                    }
                }
                if !data.is_empty() {
                    events.push(Event::Data(data));
                }
                if end_stream {
                    self.end(events);
                }
            }
            Frame::Headers {
                stream,
                end_stream,
                end_headers,
                fragment,
            } => {
                if stream != STREAM {
                    return Err(connection(
                        code::PROTOCOL_ERROR,
                        "HEADERS on a stream this client did not open",
                    ));
                }
                self.partial = Some(PartialBlock {
                    end_stream,
                    block: fragment,
                });
                if end_headers {
                    self.header_block(events)?;
                } else {
                    self.check_block_size()?;
                }
            }
            Frame::Continuation {
                stream,
                end_headers,
                fragment,
            } => {
                let Some(partial) = self.partial.as_mut() else {
                    return Err(connection(
                        code::PROTOCOL_ERROR,
                        "CONTINUATION without HEADERS before it",
                    ));
                };
                if stream != STREAM {
                    return Err(connection(
                        code::PROTOCOL_ERROR,
                        "CONTINUATION on another stream than its HEADERS",
                    ));
                }
                partial.block.extend_from_slice(&fragment);
                self.check_block_size()?;
                if end_headers {
                    self.header_block(events)?;
                }
            }
            Frame::Priority { .. } | Frame::Unknown { .. } => {}
            Frame::RstStream { stream, code: c } => {
                if stream == STREAM && !self.done {
                    return Err(Error::Reset(c));
                }
            }
            Frame::Settings { ack: true, .. } => {}
            Frame::Settings {
                ack: false,
                settings,
            } => {
                for (id, value) in settings {
                    self.apply_setting(id, value)?;
                }
                Frame::Settings {
                    ack: true,
                    settings: Vec::new(),
                }
                .encode(out);
                self.send_body(out);
            }
            Frame::PushPromise { .. } => {
                return Err(connection(
                    code::PROTOCOL_ERROR,
                    "PUSH_PROMISE although push is disabled",
                ));
            }
            Frame::Ping { ack: true, .. } => {}
            Frame::Ping { ack: false, data } => Frame::Ping { ack: true, data }.encode(out),
            Frame::GoAway {
                last_stream,
                code: c,
                debug,
            } => {
                if last_stream < STREAM && !self.done {
                    return Err(Error::Refused {
                        code: c,
                        debug: String::from_utf8_lossy(&debug).into_owned(),
                    });
                }
                self.goaway = Some((last_stream, c, debug));
            }
            Frame::WindowUpdate { stream, increment } => {
                let window = match stream {
                    0 => &mut self.send_conn_window,
                    STREAM => &mut self.send_stream_window,
                    _ => return Ok(()),
                };
                *window += increment as i64;
                if *window > MAX_WINDOW {
                    return Err(connection(
                        code::FLOW_CONTROL_ERROR,
                        "a window beyond 2^31 - 1",
                    ));
                }
                self.send_body(out);
            }
        }
        Ok(())
    }

    fn apply_setting(&mut self, id: u16, value: u32) -> Result<(), Error> {
        match id {
            setting::ENABLE_PUSH if value > 1 => Err(connection(
                code::PROTOCOL_ERROR,
                "SETTINGS_ENABLE_PUSH is 0 or 1",
            )),
            setting::INITIAL_WINDOW_SIZE => {
                let value = value as i64;
                if value > MAX_WINDOW {
                    return Err(connection(
                        code::FLOW_CONTROL_ERROR,
                        "SETTINGS_INITIAL_WINDOW_SIZE beyond 2^31 - 1",
                    ));
                }
                self.send_stream_window += value - self.peer_initial_window;
                self.peer_initial_window = value;
                Ok(())
            }
            setting::MAX_FRAME_SIZE => {
                let value = value as usize;
                if !(DEFAULT_MAX_FRAME_SIZE..=frame::MAX_MAX_FRAME_SIZE).contains(&value) {
                    return Err(connection(
                        code::PROTOCOL_ERROR,
                        "SETTINGS_MAX_FRAME_SIZE out of range",
                    ));
                }
                self.peer_max_frame = value;
                Ok(())
            }
            // HEADER_TABLE_SIZE bounds our encoder, which encoded its only block
            // under the default before any SETTINGS could arrive; the others do not
            // matter for one stream; unknown ones are ignored.
            _ => Ok(()),
        }
    }

    fn check_block_size(&self) -> Result<(), Error> {
        match &self.partial {
            Some(p) if p.block.len() > MAX_HEADER_BLOCK => Err(connection(
                code::PROTOCOL_ERROR,
                "a header block larger than this client accepts",
            )),
            _ => Ok(()),
        }
    }

    /// Decodes a whole header block: the response's headers (or a 1xx's), or its
    /// trailers.
    fn header_block(&mut self, events: &mut Vec<Event>) -> Result<(), Error> {
        let Some(PartialBlock { end_stream, block }) = self.partial.take() else {
            return Ok(());
        };
        let mut fields: Vec<(String, String)> = Vec::new();
        let mut list_size = 0usize;
        let mut too_large = false;
        let mut bad_name = false;
        self.decoder
            .decode_with_cb(&block, |name: Cow<[u8]>, value: Cow<[u8]>| {
                list_size += name.len() + value.len() + 32;
                if list_size > MAX_HEADER_LIST {
                    too_large = true;
                    return;
                }
                if name.iter().any(|c| c.is_ascii_uppercase()) {
                    bad_name = true;
                }
                fields.push((
                    String::from_utf8_lossy(&name).into_owned(),
                    String::from_utf8_lossy(&value).into_owned(),
                ));
            })
            .map_err(|e| connection(code::COMPRESSION_ERROR, format!("HPACK: {e}")))?;
        if too_large {
            return Err(connection(
                code::PROTOCOL_ERROR,
                "a header list larger than SETTINGS_MAX_HEADER_LIST_SIZE",
            ));
        }
        if bad_name {
            return Err(Error::Reset(code::PROTOCOL_ERROR));
        }
        if self.done {
            return Ok(());
        }
        if self.final_headers {
            // Trailers: they end the stream and carry no pseudo-headers.
            if !end_stream || fields.iter().any(|(n, _)| n.starts_with(':')) {
                return Err(Error::Reset(code::PROTOCOL_ERROR));
            }
            events.push(Event::Trailers(fields));
            self.end(events);
            return Ok(());
        }
        let mut status = None;
        let mut headers = Vec::new();
        for (name, value) in fields {
            match name.as_str() {
                ":status" if status.is_none() && headers.is_empty() => status = Some(value),
                _ if name.starts_with(':') => return Err(Error::Reset(code::PROTOCOL_ERROR)),
                _ => headers.push((name, value)),
            }
        }
        let status: u16 = match status.as_deref().map(str::parse) {
            Some(Ok(s)) if (100..=999).contains(&s) && s != 101 => s,
            _ => return Err(Error::Reset(code::PROTOCOL_ERROR)),
        };
        if status < 200 {
            if end_stream {
                return Err(Error::Reset(code::PROTOCOL_ERROR));
            }
            events.push(Event::Informational { status, headers });
            return Ok(());
        }
        self.final_headers = true;
        events.push(Event::Response { status, headers });
        if end_stream {
            self.end(events);
        }
        Ok(())
    }

    fn end(&mut self, events: &mut Vec<Event>) {
        self.done = true;
        events.push(Event::End);
    }

    /// A polite end of the connection once the response is complete.
    pub fn goodbye(&self) -> Vec<u8> {
        let mut out = Vec::new();
        Frame::GoAway {
            last_stream: 0,
            code: code::NO_ERROR,
            debug: Vec::new(),
        }
        .encode(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::frame::{decode, encode_raw, flag, kind, HEADER_LEN};
    use super::*;

    /// The server's side of a test: the frames the client sent, and an HPACK decoder.
    fn frames(mut bytes: &[u8]) -> Vec<Frame> {
        let mut all = Vec::new();
        while let Some((frame, used)) = decode(bytes, frame::MAX_MAX_FRAME_SIZE).unwrap() {
            all.push(frame);
            bytes = &bytes[used..];
        }
        assert!(bytes.is_empty(), "a partial frame at the end");
        all
    }

    fn request(body: Option<&[u8]>) -> Request {
        Request {
            method: "post".into(),
            path: "/echo?x=1".into(),
            authority: "check".into(),
            headers: vec![("X-Marker".into(), " yes ".into())],
            body: body.map(<[u8]>::to_vec),
        }
    }

    fn block(headers: &[(&str, &str)]) -> Vec<u8> {
        loona_hpack::Encoder::new()
            .encode(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    }

    fn server_settings() -> Vec<u8> {
        let mut out = Vec::new();
        Frame::Settings {
            ack: false,
            settings: vec![(setting::MAX_CONCURRENT_STREAMS, 100)],
        }
        .encode(&mut out);
        out
    }

    #[test]
    fn the_request_is_preface_settings_headers_and_data() {
        let (_, out) = Client::start(&request(Some(b"hello"))).unwrap();
        let preface = themis_core::stream::HTTP2_PREFACE;
        assert_eq!(&out[..preface.len()], preface);
        let sent = frames(&out[preface.len()..]);
        assert!(matches!(&sent[0], Frame::Settings { ack: false, settings }
            if settings.contains(&(setting::ENABLE_PUSH, 0))));
        let Frame::Headers {
            stream: 1,
            end_stream: false,
            end_headers: true,
            fragment,
        } = &sent[1]
        else {
            panic!("{:?}", sent[1]);
        };
        let headers = loona_hpack::Decoder::new().decode(fragment).unwrap();
        let text: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| {
                (
                    std::str::from_utf8(n).unwrap(),
                    std::str::from_utf8(v).unwrap(),
                )
            })
            .collect();
        assert_eq!(
            text,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", "check"),
                (":path", "/echo?x=1"),
                ("content-length", "5"),
                ("x-marker", "yes"),
            ]
        );
        assert_eq!(
            sent[2],
            Frame::Data {
                stream: 1,
                end_stream: true,
                data: b"hello".to_vec(),
                flow_len: 5
            }
        );
        assert_eq!(sent.len(), 3);
    }

    #[test]
    fn without_a_body_the_headers_end_the_stream() {
        let mut req = request(None);
        req.method = "GET".into();
        req.headers.push(("host".into(), "elsewhere".into()));
        let (_, out) = Client::start(&req).unwrap();
        let sent = frames(&out[24..]);
        assert_eq!(sent.len(), 2);
        let Frame::Headers {
            end_stream: true,
            fragment,
            ..
        } = &sent[1]
        else {
            panic!("{:?}", sent[1]);
        };
        let headers = loona_hpack::Decoder::new().decode(fragment).unwrap();
        assert!(headers.contains(&(b":authority".to_vec(), b"elsewhere".to_vec())));
        assert!(!headers.iter().any(|(n, _)| n == b"host"));
    }

    #[test]
    fn bad_requests_are_refused_before_anything_is_sent() {
        for (method, path, header) in [
            ("GET", "no-slash", ("a", "b")),
            ("G T", "/", ("a", "b")),
            ("CONNECT", "/", ("a", "b")),
            ("GET", "/", ("connection", "close")),
            ("GET", "/", ("bad name", "b")),
            ("GET", "/", ("a", "b\r\nc: d")),
            ("GET", "/", ("te", "gzip")),
        ] {
            let req = Request {
                method: method.into(),
                path: path.into(),
                authority: "x".into(),
                headers: vec![(header.0.into(), header.1.into())],
                body: None,
            };
            assert!(
                matches!(Client::start(&req), Err(Error::BadRequest(_))),
                "{method} {path} {header:?}"
            );
        }
    }

    #[test]
    fn a_large_header_block_is_split_into_continuations() {
        let mut req = request(None);
        req.headers.push(("x-big".into(), "v".repeat(40_000)));
        let (_, out) = Client::start(&req).unwrap();
        let sent = frames(&out[24..]);
        let mut block = Vec::new();
        for (i, frame) in sent[1..].iter().enumerate() {
            let last = i == sent.len() - 2;
            match frame {
                Frame::Headers {
                    end_headers,
                    fragment,
                    ..
                } if i == 0 => {
                    assert_eq!(*end_headers, last);
                    assert!(fragment.len() <= DEFAULT_MAX_FRAME_SIZE);
                    block.extend_from_slice(fragment);
                }
                Frame::Continuation {
                    end_headers,
                    fragment,
                    ..
                } => {
                    assert_eq!(*end_headers, last);
                    assert!(fragment.len() <= DEFAULT_MAX_FRAME_SIZE);
                    block.extend_from_slice(fragment);
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(sent.len() >= 4);
        let headers = loona_hpack::Decoder::new().decode(&block).unwrap();
        assert!(headers.contains(&(b"x-big".to_vec(), "v".repeat(40_000).into_bytes())));
    }

    #[test]
    fn a_response_with_every_kind_of_frame() {
        let (mut client, _) = Client::start(&request(None)).unwrap();
        let mut input = server_settings();
        Frame::Ping {
            ack: false,
            data: *b"pingpong",
        }
        .encode(&mut input);
        Frame::WindowUpdate {
            stream: 0,
            increment: 1000,
        }
        .encode(&mut input);
        encode_raw(0xee, 0, 0, b"unknown frames are ignored", &mut input);
        // 100 Continue, then the response's headers: padded, with priority, in three
        // pieces.
        let informational = block(&[(":status", "100")]);
        encode_raw(
            kind::HEADERS,
            flag::END_HEADERS,
            1,
            &informational,
            &mut input,
        );
        let headers = block(&[
            (":status", "201"),
            ("content-type", "text/plain"),
            ("x-themis-peer-id", "test1abc"),
        ]);
        let (a, rest) = headers.split_at(3);
        let (b, c) = rest.split_at(4);
        let mut first = vec![2, 0, 0, 0, 0, 16];
        first.extend_from_slice(a);
        first.extend_from_slice(&[0, 0]);
        encode_raw(
            kind::HEADERS,
            flag::PADDED | flag::PRIORITY,
            1,
            &first,
            &mut input,
        );
        encode_raw(kind::CONTINUATION, 0, 1, b, &mut input);
        encode_raw(kind::CONTINUATION, flag::END_HEADERS, 1, c, &mut input);
        encode_raw(kind::PRIORITY, 0, 1, &[0, 0, 0, 0, 1], &mut input);
        encode_raw(
            kind::DATA,
            flag::PADDED,
            1,
            &[4, b'h', b'i', 0, 0, 0, 0],
            &mut input,
        );
        Frame::GoAway {
            last_stream: 1,
            code: code::NO_ERROR,
            debug: Vec::new(),
        }
        .encode(&mut input);
        encode_raw(kind::DATA, 0, 1, b" there", &mut input);
        let trailers = block(&[("grpc-status", "0")]);
        encode_raw(
            kind::HEADERS,
            flag::END_HEADERS | flag::END_STREAM,
            1,
            &trailers,
            &mut input,
        );

        // Byte by byte: framing never depends on how the bytes arrive.
        let mut out = Vec::new();
        let mut events = Vec::new();
        for byte in &input {
            let (o, e) = client.receive(std::slice::from_ref(byte)).unwrap();
            out.extend(o);
            events.extend(e);
        }
        assert!(client.is_done());
        assert_eq!(
            events,
            [
                Event::Informational {
                    status: 100,
                    headers: vec![]
                },
                Event::Response {
                    status: 201,
                    headers: vec![
                        ("content-type".into(), "text/plain".into()),
                        ("x-themis-peer-id".into(), "test1abc".into())
                    ]
                },
                Event::Data(b"hi".to_vec()),
                Event::Data(b" there".to_vec()),
                Event::Trailers(vec![("grpc-status".into(), "0".into())]),
                Event::End,
            ]
        );
        let answered = frames(&out);
        assert_eq!(
            answered[..2],
            [
                Frame::Settings {
                    ack: true,
                    settings: vec![]
                },
                Frame::Ping {
                    ack: true,
                    data: *b"pingpong"
                },
            ]
        );
        // The receive window is given back as DATA is read (padding included).
        let updates: Vec<(u32, u32)> = answered
            .iter()
            .filter_map(|f| match f {
                Frame::WindowUpdate { stream, increment } => Some((*stream, *increment)),
                _ => None,
            })
            .collect();
        assert_eq!(updates, [(0, 7), (1, 7), (0, 6), (1, 6)]);
        assert_eq!(client.goaway(), Some((code::NO_ERROR, &[][..])));
    }

    #[test]
    fn the_body_waits_for_the_window() {
        let body = vec![b'x'; 100_000];
        let (mut client, out) = Client::start(&request(Some(&body))).unwrap();
        let sent: usize = frames(&out[24..])
            .iter()
            .map(|f| match f {
                Frame::Data { data, .. } => data.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(sent, 65_535, "the default window, in frames of 16 KiB");
        // The server opens both windows wide: the rest goes, and ends the stream.
        let mut input = Vec::new();
        Frame::Settings {
            ack: false,
            settings: vec![(setting::INITIAL_WINDOW_SIZE, 1 << 20)],
        }
        .encode(&mut input);
        let (out, _) = client.receive(&input).unwrap();
        let more = frames(&out);
        assert!(
            more.iter().all(|f| !matches!(f, Frame::Data { .. })),
            "the connection window is spent"
        );
        let mut input = Vec::new();
        Frame::WindowUpdate {
            stream: 0,
            increment: 1 << 20,
        }
        .encode(&mut input);
        let (out, _) = client.receive(&input).unwrap();
        let rest = frames(&out);
        let sent: usize = rest
            .iter()
            .map(|f| match f {
                Frame::Data { data, .. } => data.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(sent, 100_000 - 65_535);
        assert!(matches!(
            rest.last(),
            Some(Frame::Data {
                end_stream: true,
                ..
            })
        ));
    }

    #[test]
    fn resets_refusals_and_protocol_errors() {
        let respond = |input: Vec<u8>| {
            let (mut client, _) = Client::start(&request(None)).unwrap();
            client.receive(&input)
        };
        let mut input = Vec::new();
        Frame::RstStream {
            stream: 1,
            code: code::REFUSED_STREAM,
        }
        .encode(&mut input);
        assert_eq!(respond(input), Err(Error::Reset(code::REFUSED_STREAM)));

        let mut input = Vec::new();
        Frame::GoAway {
            last_stream: 0,
            code: code::NO_ERROR,
            debug: b"draining".to_vec(),
        }
        .encode(&mut input);
        assert!(matches!(respond(input), Err(Error::Refused { debug, .. }) if debug == "draining"));

        // DATA before the response's headers.
        let mut input = Vec::new();
        encode_raw(kind::DATA, 0, 1, b"x", &mut input);
        assert!(matches!(
            respond(input),
            Err(Error::Connection {
                code: code::PROTOCOL_ERROR,
                ..
            })
        ));

        // A frame between HEADERS and its CONTINUATION.
        let mut input = Vec::new();
        encode_raw(
            kind::HEADERS,
            0,
            1,
            &block(&[(":status", "200")]),
            &mut input,
        );
        Frame::Ping {
            ack: false,
            data: [0; 8],
        }
        .encode(&mut input);
        let e = respond(input).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Connection {
                    code: code::PROTOCOL_ERROR,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.goaway().is_some());

        // A push promise, although push is off.
        let mut input = Vec::new();
        Frame::PushPromise { stream: 1 }.encode(&mut input);
        assert!(matches!(respond(input), Err(Error::Connection { .. })));

        // Garbage HPACK.
        let mut input = Vec::new();
        encode_raw(
            kind::HEADERS,
            flag::END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            &mut input,
        );
        assert!(matches!(
            respond(input),
            Err(Error::Connection {
                code: code::COMPRESSION_ERROR,
                ..
            })
        ));

        // A response without :status.
        let mut input = Vec::new();
        encode_raw(
            kind::HEADERS,
            flag::END_HEADERS,
            1,
            &block(&[("a", "b")]),
            &mut input,
        );
        assert_eq!(respond(input), Err(Error::Reset(code::PROTOCOL_ERROR)));

        // More DATA than the window.
        let mut input = Vec::new();
        encode_raw(
            kind::HEADERS,
            flag::END_HEADERS,
            1,
            &block(&[(":status", "200")]),
            &mut input,
        );
        let (mut client, _) = Client::start(&request(None)).unwrap();
        client.receive(&input).unwrap();
        let mut flood = Vec::new();
        for _ in 0..5 {
            encode_raw(kind::DATA, 0, 1, &[0; DEFAULT_MAX_FRAME_SIZE], &mut flood);
        }
        // The client gives the window back as it reads: a long body keeps flowing.
        assert!(client.receive(&flood).is_ok());

        // A frame too large for the default SETTINGS_MAX_FRAME_SIZE.
        let mut input = vec![0, 0x40, 1, kind::DATA, 0, 0, 0, 0, 1];
        input.resize(HEADER_LEN + 0x4001, 0);
        assert!(matches!(
            respond(input),
            Err(Error::Connection {
                code: code::FRAME_SIZE_ERROR,
                ..
            })
        ));
    }
}
