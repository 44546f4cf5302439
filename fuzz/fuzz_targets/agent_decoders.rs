//! What the host agent decodes from the network: frames between agents (a DHT message
//! and the sender's listening address), and instance records read back from the DHT.
//! Decoding returns, a decoded frame re-encodes and decodes to the same bytes, and a
//! record verifies only if it is signed (random bytes never are).
#![no_main]

use libfuzzer_sys::fuzz_target;
use themis_agent::names::ServiceName;
use themis_agent::overlay::Frame;
use themis_fuzz::mesh;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(frame) = postcard::from_bytes::<Frame>(bytes) {
        if let Frame::Dht { message, .. } = &frame {
            let _ = message.check();
        }
        let encoded = postcard::to_allocvec(&frame).expect("a decoded frame encodes");
        let again: Frame = postcard::from_bytes(&encoded).expect("and decodes");
        assert_eq!(postcard::to_allocvec(&again).unwrap(), encoded);
    }
    let service = ServiceName::new("check").unwrap();
    // Accepting bytes nobody signed would be a forgery.
    assert!(themis_agent::record::verify(bytes, &mesh(), &service).is_err());
});
