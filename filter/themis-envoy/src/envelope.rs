//! What travels inside a sealed record between the two Envoys: the whole HTTP
//! request (method, path, authority, headers, body) and the whole response. The
//! postcard codec is bounded and total, like every decoder of the core.

use serde::{Deserialize, Serialize};

/// The envelope format version.
const VERSION: u8 = 1;
/// At most this many headers in either direction.
pub const MAX_HEADERS: usize = 128;

/// Headers that describe one hop and are never forwarded (RFC 9110 §7.6.1), plus
/// Envoy's own pseudo-headers and the ones the filter sets itself.
pub fn is_forwarded(name: &str) -> bool {
    !(name.starts_with(':')
        || name.starts_with("x-themis-")
        || name.starts_with("x-envoy-")
        || matches!(
            name,
            "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "te"
                | "upgrade"
                | "content-length"
                | "host"
        ))
}

/// A request as the caller's app sent it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request<'a> {
    version: u8,
    /// The service the caller claims to be (checked by the callee against the DHT).
    pub caller_service: Option<&'a str>,
    /// `:method`.
    pub method: &'a str,
    /// `:path`.
    pub path: &'a str,
    /// `:authority` as the app wrote it.
    pub authority: &'a str,
    /// End-to-end headers.
    pub headers: Vec<(&'a str, &'a str)>,
    /// The body.
    pub body: &'a [u8],
}

/// A response as the callee's app (or its filter) gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response<'a> {
    version: u8,
    /// The HTTP status.
    pub status: u16,
    /// End-to-end headers.
    pub headers: Vec<(&'a str, &'a str)>,
    /// The body.
    pub body: &'a [u8],
}

/// Why an envelope did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Not a postcard envelope.
    #[error("the envelope is malformed")]
    Malformed,
    /// Another envelope version.
    #[error("unsupported envelope version {0}")]
    Version(u8),
    /// Too many headers, or bytes left over.
    #[error("the envelope breaks a limit")]
    Limit,
    /// A status outside 100..=599.
    #[error("invalid HTTP status")]
    Status,
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, EnvelopeError> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|_| EnvelopeError::Malformed)?;
    if !rest.is_empty() {
        return Err(EnvelopeError::Limit);
    }
    Ok(value)
}

fn check_version_and_headers(version: u8, headers: usize) -> Result<(), EnvelopeError> {
    if version != VERSION {
        return Err(EnvelopeError::Version(version));
    }
    if headers > MAX_HEADERS {
        return Err(EnvelopeError::Limit);
    }
    Ok(())
}

impl<'a> Request<'a> {
    /// A request envelope; hop-by-hop headers are dropped.
    pub fn new(
        caller_service: Option<&'a str>,
        method: &'a str,
        path: &'a str,
        authority: &'a str,
        headers: &'a [(String, String)],
        body: &'a [u8],
    ) -> Self {
        Request {
            version: VERSION,
            caller_service,
            method,
            path,
            authority,
            headers: forwarded(headers),
            body,
        }
    }

    /// The bytes to seal.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("envelopes serialize")
    }

    /// Reads an opened record. Total.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, EnvelopeError> {
        let request: Request = decode(bytes)?;
        check_version_and_headers(request.version, request.headers.len())?;
        Ok(request)
    }
}

impl<'a> Response<'a> {
    /// A response envelope; hop-by-hop headers are dropped.
    pub fn new(status: u16, headers: &'a [(String, String)], body: &'a [u8]) -> Self {
        Response {
            version: VERSION,
            status,
            headers: forwarded(headers),
            body,
        }
    }

    /// A response the filter makes itself (a policy denial).
    pub fn local(status: u16, headers: Vec<(&'a str, &'a str)>, body: &'a [u8]) -> Self {
        Response {
            version: VERSION,
            status,
            headers,
            body,
        }
    }

    /// The bytes to seal.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("envelopes serialize")
    }

    /// Reads an opened record. Total.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, EnvelopeError> {
        let response: Response = decode(bytes)?;
        check_version_and_headers(response.version, response.headers.len())?;
        if !(100..=599).contains(&response.status) {
            return Err(EnvelopeError::Status);
        }
        Ok(response)
    }
}

fn forwarded(headers: &[(String, String)]) -> Vec<(&str, &str)> {
    headers
        .iter()
        .filter(|(name, _)| is_forwarded(name))
        .take(MAX_HEADERS)
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers() -> Vec<(String, String)> {
        [
            (":method", "POST"),
            (":path", "/check"),
            ("content-type", "text/plain"),
            ("connection", "keep-alive"),
            ("x-themis-peer-id", "forged"),
            ("x-request-id", "42"),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn requests_round_trip_without_hop_headers_or_forged_themis_headers() {
        let h = headers();
        let request = Request::new(Some("handler"), "POST", "/check?x=1", "check", &h, b"body");
        let bytes = request.encode();
        let back = Request::decode(&bytes).unwrap();
        assert_eq!(back, request);
        assert_eq!(
            back.headers,
            vec![("content-type", "text/plain"), ("x-request-id", "42")]
        );
    }

    #[test]
    fn responses_round_trip_and_bad_ones_are_refused() {
        let h = headers();
        let response = Response::new(200, &h, b"ok");
        let bytes = response.encode();
        assert_eq!(Response::decode(&bytes).unwrap(), response);
        for len in 0..bytes.len() {
            assert!(Response::decode(&bytes[..len]).is_err(), "length {len}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(Response::decode(&trailing), Err(EnvelopeError::Limit));
        let bad_status = Response::local(1000, vec![], b"").encode();
        assert_eq!(Response::decode(&bad_status), Err(EnvelopeError::Status));
        let mut other_version = bytes.clone();
        other_version[0] = 9;
        assert_eq!(
            Response::decode(&other_version),
            Err(EnvelopeError::Version(9))
        );
    }

    #[test]
    fn too_many_headers_are_refused() {
        let many: Vec<(&str, &str)> = (0..=MAX_HEADERS).map(|_| ("a", "b")).collect();
        let bytes = Response::local(200, many, b"").encode();
        assert_eq!(Response::decode(&bytes), Err(EnvelopeError::Limit));
    }
}
