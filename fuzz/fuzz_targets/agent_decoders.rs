//! What the host agent decodes from the network: frames between agents (a DHT message,
//! the sender's listening address and, with mesh trust, its admission). Decoding
//! returns, and a decoded frame re-encodes and decodes to the same bytes. The values
//! the DHT stores (instance records with their grant chains, revocations) and the
//! admissions are fuzzed by `trust_decoders`.
//!
//! Gossip frames' member credentials go through the roster's checks (one-hop routing).
//!
//! Also what it decodes from local callers and its own state: the local API's request
//! bodies (a workload's owner, a sign request, a revocation to publish) and
//! `owners.json`. Each decodes or is refused, and what decodes round-trips.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};
use themis_agent::overlay::Frame;
use themis_contracts::api::{
    CreateWorkload, DelegateRequest, Delegated, Owner, PublishRevocation, SignRequest,
};

/// Decodes `bytes` as JSON of `T`; if it decodes, it encodes and decodes again to the
/// same value.
fn json_round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    if let Ok(value) = serde_json::from_slice::<T>(bytes) {
        let encoded = serde_json::to_vec(&value).expect("a decoded body encodes");
        let again: T = serde_json::from_slice(&encoded).expect("and decodes");
        assert_eq!(again, value);
    }
}

fuzz_target!(|bytes: &[u8]| {
    json_round_trip::<CreateWorkload>(bytes);
    json_round_trip::<SignRequest>(bytes);
    json_round_trip::<DelegateRequest>(bytes);
    json_round_trip::<Delegated>(bytes);
    // The /sign parser and the checks before any signature: they return.
    if let Ok(request) = serde_json::from_slice::<SignRequest>(bytes) {
        if let Ok(to_sign) = themis_agent::signing::parse(&request) {
            let someone = themis_core::identity::PublicIdentity::new(
                [7; 32],
                themis_core::MeshName::new("fuzz").unwrap(),
            );
            let _ = themis_core::handshake::signing_digest(&someone, &to_sign);
        }
    }
    json_round_trip::<PublishRevocation>(bytes);
    json_round_trip::<BTreeMap<String, Owner>>(bytes);
    if let Ok(frame) = postcard::from_bytes::<Frame>(bytes) {
        match &frame {
            Frame::Dht { message, .. } => {
                let _ = message.check();
            }
            // A gossip frame's members go through the roster's checks (under the
            // fixed mesh of `trust_decoders`): they return, and whatever the fuzzer
            // sends, no member is taken without the root's admission.
            Frame::Roster(gossip) => {
                let t = themis_fuzz::trust::trust();
                let mut roster = themis_agent::roster::Roster::default();
                for member in &gossip.members {
                    if roster.offer(&t.verifier(), member).is_ok() {
                        assert_eq!(
                            member.admission,
                            Some(t.admission.encode()),
                            "a member without the root's admission"
                        );
                    }
                }
            }
            _ => {}
        }
        let encoded = postcard::to_allocvec(&frame).expect("a decoded frame encodes");
        let again: Frame = postcard::from_bytes(&encoded).expect("and decodes");
        assert_eq!(postcard::to_allocvec(&again).unwrap(), encoded);
    }
});
