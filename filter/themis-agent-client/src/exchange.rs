//! One HTTP/1.1 exchange with the agent, as bytes: no sockets, no clock.

use http::{Method, StatusCode};

/// The most of an answer a client reads: the largest answers (a copy of the trust
/// log, a resolution of many instances) stay well below it.
pub const ANSWER_LIMIT: u64 = 4 << 20;

/// Why an answer could not be read. Every input gets one of these or an answer: the
/// reader never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The bytes are not an HTTP/1.x response head.
    #[error("not HTTP: {0}")]
    NotHttp(String),
    /// The head, a chunk or the announced length was cut short.
    #[error("a truncated answer")]
    Truncated,
    /// A chunk's size line does not parse, or does not fit.
    #[error("a bad chunk")]
    BadChunk,
    /// More headers than a reader of the agent needs.
    #[error("too many headers")]
    TooManyHeaders,
}

/// The bytes of `method path` with `body` (of `content_type`), or `None` if `path`
/// would not fit in a request line (a space, a control character: no smuggling of
/// headers through a name).
pub fn request(method: &Method, path: &str, content_type: &str, body: &[u8]) -> Option<Vec<u8>> {
    let fits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    if !fits(path) || !path.starts_with('/') || !fits(content_type) {
        return None;
    }
    let mut bytes = format!(
        "{method} {path} HTTP/1.1\r\nhost: themis-agent\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    Some(bytes)
}

/// The status and body of the whole answer `bytes` (the connection was closed after
/// it): a plain body, one of `content-length`, or a chunked one.
pub fn answer(bytes: &[u8]) -> Result<(StatusCode, Vec<u8>), AnswerError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let at = match response.parse(bytes) {
        Ok(httparse::Status::Complete(at)) => at,
        Ok(httparse::Status::Partial) => return Err(AnswerError::Truncated),
        Err(httparse::Error::TooManyHeaders) => return Err(AnswerError::TooManyHeaders),
        Err(e) => return Err(AnswerError::NotHttp(e.to_string())),
    };
    let status = response
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or_else(|| AnswerError::NotHttp("no status".into()))?;
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let body = &bytes[at..];
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case(b"chunked")) {
        dechunk(body)?
    } else if let Some(length) = header("content-length") {
        let length = std::str::from_utf8(length)
            .ok()
            .and_then(|l| l.trim().parse::<usize>().ok())
            .ok_or_else(|| AnswerError::NotHttp("a bad content-length".into()))?;
        body.get(..length).ok_or(AnswerError::Truncated)?.to_vec()
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, AnswerError> {
    let mut out = Vec::new();
    loop {
        let (at, size) = match httparse::parse_chunk_size(body) {
            Ok(httparse::Status::Complete(found)) => found,
            Ok(httparse::Status::Partial) => return Err(AnswerError::Truncated),
            Err(_) => return Err(AnswerError::BadChunk),
        };
        let size = usize::try_from(size).map_err(|_| AnswerError::BadChunk)?;
        if size == 0 {
            return Ok(out);
        }
        // A size near usize::MAX must not wrap: checked, then sliced with `get`.
        let end = at.checked_add(size).ok_or(AnswerError::BadChunk)?;
        out.extend_from_slice(body.get(at..end).ok_or(AnswerError::Truncated)?);
        body = body
            .get(end.saturating_add(2)..)
            .ok_or(AnswerError::Truncated)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_one_closed_exchange_and_a_path_cannot_carry_headers() {
        let bytes = request(&Method::PUT, "/v1/workloads/a", "application/json", b"{}").unwrap();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            "PUT /v1/workloads/a HTTP/1.1\r\nhost: themis-agent\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
        );
        for path in ["/a\r\nx-evil: 1", "/a b", "", "v1/status", "/\u{e9}"] {
            assert!(
                request(&Method::GET, path, "application/json", b"").is_none(),
                "{path:?}"
            );
        }
        assert!(request(&Method::GET, "/", "a\r\nb", b"").is_none());
    }

    #[test]
    fn bodies_are_read_plain_by_length_and_chunked() {
        let ok = StatusCode::OK;
        assert_eq!(
            answer(b"HTTP/1.1 200 OK\r\n\r\nhi").unwrap(),
            (ok, b"hi".to_vec())
        );
        assert_eq!(
            answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi!").unwrap(),
            (ok, b"hi".to_vec())
        );
        assert_eq!(
            answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n1\r\n!\r\n0\r\n\r\n")
                .unwrap(),
            (ok, b"hi!".to_vec())
        );
        let (status, body) = answer(b"HTTP/1.1 403 Forbidden\r\n\r\nrevoked").unwrap();
        assert_eq!(
            (status, &body[..]),
            (StatusCode::FORBIDDEN, &b"revoked"[..])
        );
    }

    #[test]
    fn cut_or_malformed_answers_are_refused_by_name() {
        assert_eq!(answer(b"HTTP/1.1 200"), Err(AnswerError::Truncated));
        assert_eq!(
            answer(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhi"),
            Err(AnswerError::Truncated)
        );
        assert!(matches!(answer(b"\x00\x01"), Err(AnswerError::NotHttp(_))));
        assert!(matches!(
            answer(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"),
            Err(AnswerError::NotHttp(_))
        ));
        assert!(matches!(
            answer(b"HTTP/1.1 999 OK\r\n\r\n"),
            Ok(_) | Err(AnswerError::NotHttp(_))
        ));
        assert_eq!(
            dechunk(b"ffffffffffffffffff\r\n"),
            Err(AnswerError::BadChunk)
        );
        assert_eq!(dechunk(b"5\r\nab"), Err(AnswerError::Truncated));
        assert_eq!(dechunk(b"2\r\nab"), Err(AnswerError::Truncated));
        let many = format!("HTTP/1.1 200 OK\r\n{}\r\n", "a: b\r\n".repeat(40));
        assert_eq!(answer(many.as_bytes()), Err(AnswerError::TooManyHeaders));
    }
}
