//! The TLS binding's certificate as Envoy's TLS validator hands it over
//! (docs/PROTOCOL.md §8): raw bytes, or edits of a genuine certificate. `verify`
//! returns on any input and takes an edited certificate only when the edits changed
//! nothing (the genuine bytes: the self-signature covers the TBSCertificate, and the
//! profile check the rest); `Proof::decode` and `id_of_sni_name` return.
#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use themis_core::{Identity, MeshName};
use themis_fuzz::Edit;
use themis_x509::{delegate, id_of_sni_name, issue, principal, verify, Proof, TlsKey};

const NOW: u64 = 1_800_000_000_000;

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(Vec<u8>),
    Edited(Vec<Edit>),
}

/// A certificate of fixed keys, as the agent writes one.
#[allow(deprecated)]
fn genuine() -> &'static Vec<u8> {
    static DER: OnceLock<Vec<u8>> = OnceLock::new();
    DER.get_or_init(|| {
        // Fixed randomness: the key, the serial and the signature reproduce.
        let rng = ring::test::rand::FixedByteRandom { byte: 7 };
        let mesh = MeshName::new(themis_fuzz::MESH).unwrap();
        let workload = Identity::generate(mesh.clone(), &rng).unwrap();
        let key = TlsKey::generate(&rng).unwrap();
        let proof = Proof {
            version: themis_x509::PROOF_VERSION,
            mesh: mesh.as_str().into(),
            workload_key: *workload.public_key(),
            delegation: delegate(&workload, &key, NOW, 3_600_000),
            endorsement: b"a node-signed record".to_vec(),
        };
        let named = principal(&mesh, &workload.id(), Some("check"));
        let der = issue(&key, &proof, &named, &rng).unwrap();
        assert!(verify(&der, &mesh, NOW).is_ok());
        der
    })
}

fuzz_target!(|input: Input| {
    let mesh = MeshName::new(themis_fuzz::MESH).unwrap();
    match input {
        Input::Raw(bytes) => {
            let _ = verify(&bytes, &mesh, NOW);
            let _ = Proof::decode(&bytes);
            if let Ok(text) = std::str::from_utf8(&bytes) {
                let _ = id_of_sni_name(text);
            }
        }
        Input::Edited(edits) => {
            let mut der = genuine().clone();
            for edit in &edits {
                edit.apply(&mut der);
            }
            if verify(&der, &mesh, NOW).is_ok() {
                assert_eq!(&der, genuine(), "an edited certificate was taken");
            }
        }
    }
});
