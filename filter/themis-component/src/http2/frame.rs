//! HTTP/2 frames (RFC 9113 §4.1, §6): the 9-octet header and the payloads a client of
//! one request reads and writes. Decoding is bounded (a frame longer than the
//! negotiated maximum is refused before it is buffered) and total: any input gives a
//! frame or an error, never a panic.

/// The frame header: length (24 bits), type, flags, stream id (31 bits).
pub const HEADER_LEN: usize = 9;
/// SETTINGS_MAX_FRAME_SIZE until a peer says otherwise, and the smallest it may say.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 16_384;
/// The largest SETTINGS_MAX_FRAME_SIZE a peer may announce.
pub const MAX_MAX_FRAME_SIZE: usize = (1 << 24) - 1;
/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;

/// Frame types.
pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// SETTINGS identifiers (the whole table; not all are used).
#[allow(dead_code)]
pub mod setting {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub const ENABLE_PUSH: u16 = 0x2;
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
}

/// Error codes (RFC 9113 §7; not all are used).
#[allow(dead_code)]
pub mod code {
    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const INTERNAL_ERROR: u32 = 0x2;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const REFUSED_STREAM: u32 = 0x7;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;

    /// The code's name, for messages.
    pub fn name(code: u32) -> &'static str {
        match code {
            0x0 => "NO_ERROR",
            0x1 => "PROTOCOL_ERROR",
            0x2 => "INTERNAL_ERROR",
            0x3 => "FLOW_CONTROL_ERROR",
            0x4 => "SETTINGS_TIMEOUT",
            0x5 => "STREAM_CLOSED",
            0x6 => "FRAME_SIZE_ERROR",
            0x7 => "REFUSED_STREAM",
            0x8 => "CANCEL",
            0x9 => "COMPRESSION_ERROR",
            0xa => "CONNECT_ERROR",
            0xb => "ENHANCE_YOUR_CALM",
            0xc => "INADEQUATE_SECURITY",
            0xd => "HTTP_1_1_REQUIRED",
            _ => "unknown error code",
        }
    }
}

/// A frame the peer sent that breaks the framing rules: a connection error with this
/// code (RFC 9113 §5.4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    pub code: u32,
    pub reason: &'static str,
}

fn protocol(reason: &'static str) -> FrameError {
    FrameError {
        code: code::PROTOCOL_ERROR,
        reason,
    }
}

fn size(reason: &'static str) -> FrameError {
    FrameError {
        code: code::FRAME_SIZE_ERROR,
        reason,
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// `data` without padding; `flow_len` is what counts against flow control (the
    /// whole payload, padding included).
    Data {
        stream: u32,
        end_stream: bool,
        data: Vec<u8>,
        flow_len: u32,
    },
    /// A header block fragment, without padding and priority fields.
    Headers {
        stream: u32,
        end_stream: bool,
        end_headers: bool,
        fragment: Vec<u8>,
    },
    Priority {
        stream: u32,
    },
    RstStream {
        stream: u32,
        code: u32,
    },
    Settings {
        ack: bool,
        settings: Vec<(u16, u32)>,
    },
    PushPromise {
        stream: u32,
    },
    Ping {
        ack: bool,
        data: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        code: u32,
        debug: Vec<u8>,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    Continuation {
        stream: u32,
        end_headers: bool,
        fragment: Vec<u8>,
    },
    /// A type this client does not know: ignored (RFC 9113 §4.1).
    Unknown {
        kind: u8,
        stream: u32,
    },
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Takes the padding off a PADDED payload.
fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], FrameError> {
    if flags & flag::PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or_else(|| size("a padded frame without its pad length"))?;
    let pad = pad as usize;
    if pad > rest.len() {
        return Err(protocol("padding longer than the frame"));
    }
    Ok(&rest[..rest.len() - pad])
}

/// Decodes the first frame of `buf`: `None` until it is whole; the frame and how many
/// bytes it took. A frame longer than `max_frame_size` is an error as soon as its
/// header is there.
pub fn decode(buf: &[u8], max_frame_size: usize) -> Result<Option<(Frame, usize)>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = (buf[0] as usize) << 16 | (buf[1] as usize) << 8 | buf[2] as usize;
    if len > max_frame_size {
        return Err(size("a frame longer than SETTINGS_MAX_FRAME_SIZE"));
    }
    if buf.len() < HEADER_LEN + len {
        return Ok(None);
    }
    let (kind, flags) = (buf[3], buf[4]);
    let stream = u32_at(&buf[5..9]) & 0x7fff_ffff;
    let payload = &buf[HEADER_LEN..HEADER_LEN + len];
    let on_stream = |what| match stream {
        0 => Err(protocol(what)),
        _ => Ok(()),
    };
    let on_connection = |what| match stream {
        0 => Ok(()),
        _ => Err(protocol(what)),
    };
    let frame = match kind {
        kind::DATA => {
            on_stream("DATA on stream 0")?;
            Frame::Data {
                stream,
                end_stream: flags & flag::END_STREAM != 0,
                data: unpad(flags, payload)?.to_vec(),
                flow_len: len as u32,
            }
        }
        kind::HEADERS => {
            on_stream("HEADERS on stream 0")?;
            let mut fragment = unpad(flags, payload)?;
            if flags & flag::PRIORITY != 0 {
                if fragment.len() < 5 {
                    return Err(size("HEADERS too short for its priority fields"));
                }
                fragment = &fragment[5..];
            }
            Frame::Headers {
                stream,
                end_stream: flags & flag::END_STREAM != 0,
                end_headers: flags & flag::END_HEADERS != 0,
                fragment: fragment.to_vec(),
            }
        }
        kind::PRIORITY => {
            on_stream("PRIORITY on stream 0")?;
            if len != 5 {
                return Err(size("PRIORITY is 5 octets"));
            }
            Frame::Priority { stream }
        }
        kind::RST_STREAM => {
            on_stream("RST_STREAM on stream 0")?;
            if len != 4 {
                return Err(size("RST_STREAM is 4 octets"));
            }
            Frame::RstStream {
                stream,
                code: u32_at(payload),
            }
        }
        kind::SETTINGS => {
            on_connection("SETTINGS on a stream")?;
            let ack = flags & flag::ACK != 0;
            if ack && len != 0 {
                return Err(size("a SETTINGS acknowledgement with a payload"));
            }
            if !len.is_multiple_of(6) {
                return Err(size("SETTINGS is a multiple of 6 octets"));
            }
            let settings = payload
                .chunks_exact(6)
                .map(|s| (u16::from_be_bytes([s[0], s[1]]), u32_at(&s[2..])))
                .collect();
            Frame::Settings { ack, settings }
        }
        kind::PUSH_PROMISE => {
            on_stream("PUSH_PROMISE on stream 0")?;
            Frame::PushPromise { stream }
        }
        kind::PING => {
            on_connection("PING on a stream")?;
            let data: [u8; 8] = payload.try_into().map_err(|_| size("PING is 8 octets"))?;
            Frame::Ping {
                ack: flags & flag::ACK != 0,
                data,
            }
        }
        kind::GOAWAY => {
            on_connection("GOAWAY on a stream")?;
            if len < 8 {
                return Err(size("GOAWAY is at least 8 octets"));
            }
            Frame::GoAway {
                last_stream: u32_at(payload) & 0x7fff_ffff,
                code: u32_at(&payload[4..]),
                debug: payload[8..].to_vec(),
            }
        }
        kind::WINDOW_UPDATE => {
            if len != 4 {
                return Err(size("WINDOW_UPDATE is 4 octets"));
            }
            let increment = u32_at(payload) & 0x7fff_ffff;
            if increment == 0 {
                return Err(protocol("a WINDOW_UPDATE of 0"));
            }
            Frame::WindowUpdate { stream, increment }
        }
        kind::CONTINUATION => {
            on_stream("CONTINUATION on stream 0")?;
            Frame::Continuation {
                stream,
                end_headers: flags & flag::END_HEADERS != 0,
                fragment: payload.to_vec(),
            }
        }
        kind => Frame::Unknown { kind, stream },
    };
    Ok(Some((frame, HEADER_LEN + len)))
}

/// Appends one frame with this header and payload (at most [`MAX_MAX_FRAME_SIZE`]
/// octets: the callers split longer ones).
pub fn encode_raw(kind: u8, flags: u8, stream: u32, payload: &[u8], out: &mut Vec<u8>) {
    debug_assert!(payload.len() <= MAX_MAX_FRAME_SIZE);
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

impl Frame {
    /// Appends the frame as this client sends it (never padded, no priority).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let set = |on: bool, f: u8| if on { f } else { 0 };
        match self {
            Frame::Data {
                stream,
                end_stream,
                data,
                ..
            } => encode_raw(
                kind::DATA,
                set(*end_stream, flag::END_STREAM),
                *stream,
                data,
                out,
            ),
            Frame::Headers {
                stream,
                end_stream,
                end_headers,
                fragment,
            } => encode_raw(
                kind::HEADERS,
                set(*end_stream, flag::END_STREAM) | set(*end_headers, flag::END_HEADERS),
                *stream,
                fragment,
                out,
            ),
            Frame::Priority { stream } => {
                encode_raw(kind::PRIORITY, 0, *stream, &[0, 0, 0, 0, 15], out)
            }
            Frame::RstStream { stream, code } => {
                encode_raw(kind::RST_STREAM, 0, *stream, &code.to_be_bytes(), out)
            }
            Frame::Settings { ack, settings } => {
                let mut payload = Vec::with_capacity(settings.len() * 6);
                for (id, value) in settings {
                    payload.extend_from_slice(&id.to_be_bytes());
                    payload.extend_from_slice(&value.to_be_bytes());
                }
                encode_raw(kind::SETTINGS, set(*ack, flag::ACK), 0, &payload, out)
            }
            Frame::PushPromise { stream } => {
                encode_raw(kind::PUSH_PROMISE, flag::END_HEADERS, *stream, &[0; 4], out)
            }
            Frame::Ping { ack, data } => encode_raw(kind::PING, set(*ack, flag::ACK), 0, data, out),
            Frame::GoAway {
                last_stream,
                code,
                debug,
            } => {
                let mut payload = Vec::with_capacity(8 + debug.len());
                payload.extend_from_slice(&last_stream.to_be_bytes());
                payload.extend_from_slice(&code.to_be_bytes());
                payload.extend_from_slice(debug);
                encode_raw(kind::GOAWAY, 0, 0, &payload, out)
            }
            Frame::WindowUpdate { stream, increment } => encode_raw(
                kind::WINDOW_UPDATE,
                0,
                *stream,
                &increment.to_be_bytes(),
                out,
            ),
            Frame::Continuation {
                stream,
                end_headers,
                fragment,
            } => encode_raw(
                kind::CONTINUATION,
                set(*end_headers, flag::END_HEADERS),
                *stream,
                fragment,
                out,
            ),
            Frame::Unknown { kind, stream } => encode_raw(*kind, 0, *stream, &[], out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frame: Frame) {
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        let (decoded, used) = decode(&bytes, DEFAULT_MAX_FRAME_SIZE).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(decoded, frame);
    }

    #[test]
    fn every_frame_round_trips() {
        round_trip(Frame::Data {
            stream: 1,
            end_stream: true,
            data: b"hello".to_vec(),
            flow_len: 5,
        });
        round_trip(Frame::Headers {
            stream: 1,
            end_stream: false,
            end_headers: true,
            fragment: vec![0x82, 0x84],
        });
        round_trip(Frame::Priority { stream: 3 });
        round_trip(Frame::RstStream {
            stream: 1,
            code: code::CANCEL,
        });
        round_trip(Frame::Settings {
            ack: false,
            settings: vec![
                (setting::ENABLE_PUSH, 0),
                (setting::INITIAL_WINDOW_SIZE, 1 << 20),
            ],
        });
        round_trip(Frame::Settings {
            ack: true,
            settings: vec![],
        });
        round_trip(Frame::PushPromise { stream: 1 });
        round_trip(Frame::Ping {
            ack: true,
            data: *b"12345678",
        });
        round_trip(Frame::GoAway {
            last_stream: 1,
            code: code::NO_ERROR,
            debug: b"bye".to_vec(),
        });
        round_trip(Frame::WindowUpdate {
            stream: 0,
            increment: 65_535,
        });
        round_trip(Frame::Continuation {
            stream: 1,
            end_headers: true,
            fragment: vec![1, 2, 3],
        });
        round_trip(Frame::Unknown {
            kind: 0xfa,
            stream: 7,
        });
    }

    #[test]
    fn the_header_is_rfc_9113s() {
        let mut bytes = Vec::new();
        Frame::WindowUpdate {
            stream: 1,
            increment: 0x0102_0304,
        }
        .encode(&mut bytes);
        assert_eq!(bytes, [0, 0, 4, 8, 0, 0, 0, 0, 1, 1, 2, 3, 4]);
        // The reserved bit of the stream id is ignored on the way in.
        bytes[5] |= 0x80;
        let (frame, _) = decode(&bytes, DEFAULT_MAX_FRAME_SIZE).unwrap().unwrap();
        assert_eq!(
            frame,
            Frame::WindowUpdate {
                stream: 1,
                increment: 0x0102_0304
            }
        );
    }

    #[test]
    fn partial_frames_wait_and_what_follows_stays() {
        let mut bytes = Vec::new();
        Frame::Ping {
            ack: false,
            data: [7; 8],
        }
        .encode(&mut bytes);
        for cut in 0..bytes.len() {
            assert_eq!(
                decode(&bytes[..cut], DEFAULT_MAX_FRAME_SIZE),
                Ok(None),
                "{cut}"
            );
        }
        bytes.extend_from_slice(&[0, 0]);
        let (_, used) = decode(&bytes, DEFAULT_MAX_FRAME_SIZE).unwrap().unwrap();
        assert_eq!(used, HEADER_LEN + 8);
    }

    #[test]
    fn padding_and_priority_come_off() {
        // DATA, PADDED: pad length 3, "abc", 3 octets of padding.
        let mut bytes = Vec::new();
        encode_raw(
            kind::DATA,
            flag::PADDED | flag::END_STREAM,
            1,
            &[3, b'a', b'b', b'c', 0, 0, 0],
            &mut bytes,
        );
        let (frame, _) = decode(&bytes, DEFAULT_MAX_FRAME_SIZE).unwrap().unwrap();
        assert_eq!(
            frame,
            Frame::Data {
                stream: 1,
                end_stream: true,
                data: b"abc".to_vec(),
                flow_len: 7
            }
        );
        // HEADERS, PADDED and PRIORITY: pad length, 5 priority octets, fragment, pad.
        let mut bytes = Vec::new();
        encode_raw(
            kind::HEADERS,
            flag::PADDED | flag::PRIORITY | flag::END_HEADERS,
            1,
            &[2, 0, 0, 0, 3, 16, 0x88, 0, 0],
            &mut bytes,
        );
        let (frame, _) = decode(&bytes, DEFAULT_MAX_FRAME_SIZE).unwrap().unwrap();
        assert_eq!(
            frame,
            Frame::Headers {
                stream: 1,
                end_stream: false,
                end_headers: true,
                fragment: vec![0x88]
            }
        );
    }

    #[test]
    fn malformed_frames_are_connection_errors() {
        let cases: &[(u8, u8, u32, &[u8], u32)] = &[
            (kind::DATA, 0, 0, b"x", code::PROTOCOL_ERROR),
            (kind::DATA, flag::PADDED, 1, &[5, 1], code::PROTOCOL_ERROR),
            (kind::DATA, flag::PADDED, 1, &[], code::FRAME_SIZE_ERROR),
            (
                kind::HEADERS,
                flag::PRIORITY,
                1,
                &[0, 0],
                code::FRAME_SIZE_ERROR,
            ),
            (kind::HEADERS, 0, 0, &[0x88], code::PROTOCOL_ERROR),
            (kind::PRIORITY, 0, 1, &[0; 4], code::FRAME_SIZE_ERROR),
            (kind::RST_STREAM, 0, 0, &[0; 4], code::PROTOCOL_ERROR),
            (kind::RST_STREAM, 0, 1, &[0; 5], code::FRAME_SIZE_ERROR),
            (kind::SETTINGS, 0, 1, &[], code::PROTOCOL_ERROR),
            (kind::SETTINGS, 0, 0, &[0; 5], code::FRAME_SIZE_ERROR),
            (
                kind::SETTINGS,
                flag::ACK,
                0,
                &[0; 6],
                code::FRAME_SIZE_ERROR,
            ),
            (kind::PING, 0, 0, &[0; 7], code::FRAME_SIZE_ERROR),
            (kind::PING, 0, 1, &[0; 8], code::PROTOCOL_ERROR),
            (kind::GOAWAY, 0, 0, &[0; 7], code::FRAME_SIZE_ERROR),
            (kind::WINDOW_UPDATE, 0, 0, &[0; 4], code::PROTOCOL_ERROR),
            (kind::WINDOW_UPDATE, 0, 1, &[0; 3], code::FRAME_SIZE_ERROR),
            (kind::CONTINUATION, 0, 0, &[], code::PROTOCOL_ERROR),
        ];
        for (i, &(kind, flags, stream, payload, expected)) in cases.iter().enumerate() {
            let mut bytes = Vec::new();
            encode_raw(kind, flags, stream, payload, &mut bytes);
            let got = decode(&bytes, DEFAULT_MAX_FRAME_SIZE);
            assert!(
                matches!(&got, Err(e) if e.code == expected),
                "case {i}: {got:?}"
            );
        }
    }

    #[test]
    fn an_oversized_frame_is_refused_by_its_header_alone() {
        let header = [0, 0x40, 1, kind::DATA, 0, 0, 0, 0, 1];
        assert_eq!(
            decode(&header, DEFAULT_MAX_FRAME_SIZE).unwrap_err().code,
            code::FRAME_SIZE_ERROR
        );
    }

    #[test]
    fn decoding_is_total() {
        // Every short input of a few shapes: a frame, a wait or an error, no panic.
        let mut state = 0x1234_5678u32;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let len = (state % 24) as usize;
            let mut bytes: Vec<u8> = (0..HEADER_LEN + len)
                .map(|i| (state.rotate_left(i as u32 * 3) & 0xff) as u8)
                .collect();
            bytes[0] = 0;
            bytes[1] = 0;
            bytes[2] = len as u8;
            bytes[3] %= 11;
            let _ = decode(&bytes, DEFAULT_MAX_FRAME_SIZE);
        }
    }
}
