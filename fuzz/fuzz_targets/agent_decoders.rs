//! What the host agent decodes from the network: frames between agents (a DHT message,
//! the sender's listening address and, with mesh trust, its admission). Decoding
//! returns, and a decoded frame re-encodes and decodes to the same bytes. The values
//! the DHT stores (instance records with their grant chains, revocations) and the
//! admissions are fuzzed by `trust_decoders`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use themis_agent::overlay::Frame;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(frame) = postcard::from_bytes::<Frame>(bytes) {
        if let Frame::Dht { message, .. } = &frame {
            let _ = message.check();
        }
        let encoded = postcard::to_allocvec(&frame).expect("a decoded frame encodes");
        let again: Frame = postcard::from_bytes(&encoded).expect("and decodes");
        assert_eq!(postcard::to_allocvec(&again).unwrap(), encoded);
    }
});
