//! Every decoder of the wire format, and the text parsers, on arbitrary bytes: they
//! must return, and agree with each other when they succeed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use themis_core::wire::{
    self, Confirm, Hello, HelloReply, Kind, RecordHeader, MAX_HANDSHAKE_LEN, RECORD_HEADER_LEN,
};
use themis_core::identity::PublicIdentity;
use themis_core::{Delegation, MeshName, PeerId, ReplayWindow};

fuzz_target!(|bytes: &[u8]| {
    let kind = wire::peek_kind(bytes);
    let frame = wire::frame_len(bytes);

    // A message that decodes is exactly as long as the stream framing says.
    if let Ok(signed) = Hello::decode(bytes) {
        assert_eq!(signed.body_bytes, &bytes[..bytes.len() - 64]);
        assert_eq!(frame, Ok(Some(bytes.len())));
    }
    if let Ok(signed) = HelloReply::decode(bytes) {
        assert_eq!(signed.body_bytes, &bytes[..bytes.len() - 64]);
        assert_eq!(frame, Ok(Some(bytes.len())));
    }
    if Confirm::decode(bytes).is_ok() {
        assert_eq!(frame, Ok(Some(bytes.len())));
    }
    if let Ok(header) = RecordHeader::decode(bytes) {
        assert_eq!(kind, Ok(Kind::Record));
        assert_eq!(header.encode(), bytes[..RECORD_HEADER_LEN]);
        assert_eq!(frame, Ok(Some(header.record_len())));
    }
    // And a complete handshake message within its size limit decodes.
    if let Ok(Some(n)) = frame {
        if n <= bytes.len() && n <= MAX_HANDSHAKE_LEN {
            let message = &bytes[..n];
            let decodes = match wire::peek_kind(message) {
                Ok(Kind::Hello) => Hello::decode(message).is_ok(),
                Ok(Kind::HelloReply) => HelloReply::decode(message).is_ok(),
                Ok(Kind::Confirm) => Confirm::decode(message).is_ok(),
                _ => true,
            };
            assert!(decodes, "frame_len said {n} bytes, but they do not decode");
        }
    }

    // Wire v3's delegation: total, and what decodes round-trips (the encoding may be
    // non-minimal: the signature covers the values, not these bytes); its check under
    // any identity returns (a made-up one never verifies).
    if let Some(d) = Delegation::decode(bytes) {
        assert_eq!(Delegation::decode(&d.encode()), Some(d));
        let someone = PublicIdentity::new([7; 32], MeshName::new("fuzz").unwrap());
        assert!(d.verify(&someone, d.not_before_ms).is_err());
    }

    if let Ok(window) = ReplayWindow::from_bytes(bytes) {
        assert_eq!(window.to_bytes(), bytes);
    }

    let text = String::from_utf8_lossy(bytes);
    if let Ok(mesh) = MeshName::new(&text) {
        assert_eq!(mesh.as_str(), text);
    }
    if let Ok((mesh, id)) = PeerId::parse(&text) {
        assert_eq!(id.printable(&mesh), *text);
    }
});
