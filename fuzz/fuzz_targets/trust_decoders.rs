//! Mesh trust as agents, filters and `themis` read it: signed statements, instance
//! values (a record and its grant chain), revocations and PEM credential files, under
//! a fixed mesh root (docs/PROTOCOL.md §6).
//!
//! Every decoder and verifier returns on any input, and a decoded statement encodes
//! and decodes to itself. Acceptance is checked against the genuine statements the
//! fixed root, authority and node signed (`src/trust.rs`): whatever the fuzzer sends,
//! a verifier accepts only a genuine statement of the kind it checks, and never an
//! instance of the workload once the workload is revoked. Flipped bits and
//! truncations of a genuine encoding are accepted only when they change nothing (the
//! genuine bytes themselves); for inserted bytes and raw input the check is on content
//! (the same signed statements), because the encoding's varints are not canonical.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use themis_fuzz::trust::{trust, Genuine, SERVICE};
use themis_fuzz::MESH;
use themis_fuzz::Edit;
use themis_trust::{
    chain_from_pem, from_pem, InstanceValue, PemKind, Revocations, Signed, Subject,
    MAX_GRANT_CHAIN,
};

#[derive(Arbitrary, Debug)]
enum Input {
    /// Bytes of its own, to every decoder and verifier (and as text to the PEM readers).
    Raw(Vec<u8>),
    /// A genuine encoding (chosen by `which`), edited.
    Edited { which: u8, edits: Vec<Edit> },
    /// A genuine credential file (chosen by `which`), edited.
    Pem { which: u8, edits: Vec<Edit> },
}

/// How strictly an accepted input must match a genuine one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Match {
    /// Byte for byte (flips and truncations only).
    Bytes,
    /// The same signed statements (inserted bytes, raw input, PEM text).
    Content,
}

/// The decoded statements of an encoding of `kind`, for comparing content.
fn content(kind: Genuine, bytes: &[u8]) -> Option<Vec<Signed>> {
    match kind {
        Genuine::Value => InstanceValue::decode(bytes).ok().map(|v| {
            let mut all = v.grants;
            all.push(v.record);
            all
        }),
        _ => Signed::decode(bytes).ok().map(|s| vec![s]),
    }
}

/// `what` accepted `bytes`: they must be a genuine encoding of `kind`.
fn assert_genuine(what: &str, kind: Genuine, bytes: &[u8], strictness: Match) {
    let genuine = trust().genuine();
    let found = genuine.iter().filter(|(k, _)| *k == kind).any(|(_, g)| match strictness {
        Match::Bytes => g == bytes,
        Match::Content => content(kind, g) == content(kind, bytes),
    });
    assert!(found, "{what} accepted something the fixed keys never signed: {bytes:02x?}");
}

/// The decoders return, and what they decode round-trips.
fn decoders(bytes: &[u8]) {
    // A record's subject label (set by a node, read by every agent that endorses).
    let text = String::from_utf8_lossy(bytes);
    if let Ok(subject) = Subject::from_uri(&text, MESH) {
        assert_eq!(subject.uri(MESH), text, "a subject reads back as another");
        assert_eq!(Subject::new(&subject.namespace, &subject.service_account), Ok(subject));
    }
    if let Ok(signed) = Signed::decode(bytes) {
        let encoded = signed.encode();
        assert!(encoded.len() <= bytes.len(), "the canonical encoding is never longer");
        assert_eq!(Signed::decode(&encoded).as_ref(), Ok(&signed));
    }
    if let Ok(value) = InstanceValue::decode(bytes) {
        let encoded = value.encode();
        assert!(encoded.len() <= bytes.len(), "the canonical encoding is never longer");
        assert_eq!(InstanceValue::decode(&encoded).as_ref(), Ok(&value));
    }
}

/// Every verifier on `bytes`; each acceptance must be of a genuine statement of the
/// verifier's kind, and the genuine bytes themselves are always accepted.
fn verifiers(bytes: &[u8], strictness: Match) {
    let t = trust();
    let v = t.verifier();
    let is = |kind: Genuine| t.genuine().iter().any(|(k, g)| *k == kind && g == bytes);

    let admission = v.admission(bytes, t.node.public_key());
    let admission_of = v.admission_of(bytes, &t.node.id());
    assert_eq!(admission.is_ok(), admission_of.is_ok(), "{admission:?} {admission_of:?}");
    if admission.is_ok() {
        assert_genuine("Verifier::admission", Genuine::Admission, bytes, strictness);
    } else {
        assert!(!is(Genuine::Admission), "the genuine admission refused: {admission:?}");
    }
    // Another peer never gets the node's admission accepted.
    assert!(v.admission(bytes, t.workload.public_key()).is_err());
    assert!(v.admission_of(bytes, &t.workload.id()).is_err());

    match v.instance(bytes, SERVICE) {
        Ok(instance) => {
            assert_genuine("Verifier::instance", Genuine::Value, bytes, strictness);
            assert_eq!(instance.id, t.workload.id());
            assert_eq!(&instance.endorser, t.node.public_key());
        }
        Err(e) => assert!(!is(Genuine::Value), "a genuine value refused: {e:?}"),
    }
    // The genuine records are all for `check`, and all of the revoked workload.
    assert!(v.instance(bytes, "handler").is_err());
    assert!(t.revoking_verifier().instance(bytes, SERVICE).is_err());

    // Address announcements: only the admitted node's own, and its records' endpoints
    // are at its address.
    let node_key = *t.node.public_key();
    match v.announcement(bytes, |key| *key == node_key) {
        Ok(announced) => {
            assert_genuine("Verifier::announcement", Genuine::Announcement, bytes, strictness);
            assert_eq!(announced.id, t.node.id());
            for value in &t.values {
                let instance = v.instance(value, SERVICE).expect("a genuine value");
                assert_eq!(v.endpoint_owned(&instance, &announced, None), Ok(()));
            }
        }
        Err(e) => assert!(!is(Genuine::Announcement), "the genuine announcement refused: {e:?}"),
    }
    assert!(v.announcement(bytes, |_| false).is_err(), "an unadmitted key announced");

    // Address ranges: only the root's, for the node it names, and always a network.
    match v.address_range(bytes, t.node.public_key()) {
        Ok((range, net)) => {
            assert_genuine("Verifier::address_range", Genuine::AddressRange, bytes, strictness);
            assert_eq!(net.network(), range.network);
            assert_eq!(net.trunc(), net);
        }
        Err(e) => assert!(!is(Genuine::AddressRange), "the genuine range refused: {e:?}"),
    }
    assert!(v.address_range(bytes, t.workload.public_key()).is_err(), "a range for another key");

    match Revocations::verify(&t.root, bytes) {
        Ok(revocation) => {
            assert_genuine("Revocations::verify", Genuine::Revocation, bytes, strictness);
            assert_eq!(revocation.id, t.workload.id().0);
            let mut set = Revocations::new();
            assert_eq!(set.add(&t.root, bytes), Ok(true));
            assert_eq!(set.add(&t.root, bytes), Ok(false));
            assert!(set.contains(&t.workload.id()));
        }
        Err(e) => {
            assert!(!is(Genuine::Revocation), "the genuine revocation refused: {e:?}");
            assert!(Revocations::new().add(&t.root, bytes).is_err());
        }
    }
}

/// The PEM readers on `text`; what they read is checked as a credential.
fn pem(text: &str) {
    let t = trust();
    for (kind, genuine) in [
        (PemKind::Admission, Genuine::Admission),
        (PemKind::Grant, Genuine::Grant),
        (PemKind::Revocation, Genuine::Revocation),
    ] {
        if let Ok(signed) = from_pem(kind, text) {
            let bytes = signed.encode();
            decoders(&bytes);
            verifiers(&bytes, Match::Content);
            // A grant file holds a grant: only the genuine ones form a chain.
            if kind == PemKind::Grant && t.verifier().grants(&[signed], SERVICE).is_ok() {
                assert_genuine("Verifier::grants", genuine, &bytes, Match::Content);
            }
        }
    }
    if let Ok(chain) = chain_from_pem(text) {
        assert!(!chain.is_empty() && chain.len() <= MAX_GRANT_CHAIN);
        if t.verifier().grants(&chain, SERVICE).is_ok() {
            assert!(
                t.chains().contains(&chain),
                "a grant chain the fixed keys never made verified: {chain:02x?}"
            );
        }
    }
}

fuzz_target!(|input: Input| {
    let t = trust();
    match input {
        Input::Raw(bytes) => {
            decoders(&bytes);
            verifiers(&bytes, Match::Content);
            pem(&String::from_utf8_lossy(&bytes));
        }
        Input::Edited { which, edits } => {
            let genuine = t.genuine();
            let mut bytes = genuine[usize::from(which) % genuine.len()].1.clone();
            edits.iter().for_each(|edit| edit.apply(&mut bytes));
            let inserted = edits.iter().any(|edit| matches!(edit, Edit::Insert { .. }));
            decoders(&bytes);
            verifiers(&bytes, if inserted { Match::Content } else { Match::Bytes });
        }
        Input::Pem { which, edits } => {
            let files = t.pem_files();
            let mut text = files[usize::from(which) % files.len()].1.clone().into_bytes();
            edits.iter().for_each(|edit| edit.apply(&mut text));
            pem(&String::from_utf8_lossy(&text));
        }
    }
});
