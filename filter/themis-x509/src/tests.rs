//! The certificate's attacks, each written as the attacker would: a TLS key holder
//! can sign any certificate, so most cases here are self-signed and well formed, and
//! must still be refused for what they prove.

use super::*;
use ring::rand::SystemRandom;
use themis_core::delegation::MAX_LIFETIME_MS;
use themis_core::Identity;

const NOW: u64 = 1_800_000_000_000;
const HOUR: u64 = 3_600_000;

struct Case {
    rng: SystemRandom,
    mesh: MeshName,
    workload: Identity,
    key: TlsKey,
}

impl Case {
    fn new() -> Case {
        let rng = SystemRandom::new();
        let mesh = MeshName::new("demo").unwrap();
        Case {
            workload: Identity::generate(mesh.clone(), &rng).unwrap(),
            key: TlsKey::generate(&rng).unwrap(),
            mesh,
            rng,
        }
    }

    fn proof(&self) -> Proof {
        Proof {
            version: PROOF_VERSION,
            mesh: "demo".into(),
            workload_key: *self.workload.public_key(),
            delegation: delegate(&self.workload, &self.key, NOW, HOUR),
            endorsement: b"a node-signed record".to_vec(),
        }
    }

    fn principal(&self) -> String {
        principal(&self.mesh, &self.workload.id(), Some("check"))
    }

    fn issue(&self, proof: &Proof) -> Vec<u8> {
        issue(&self.key, proof, &self.principal(), &self.rng).unwrap()
    }

    fn good(&self) -> Vec<u8> {
        self.issue(&self.proof())
    }

    /// A certificate of this case's key as an attacker writes it.
    fn written(&self, edit: impl FnOnce(&mut Written)) -> Vec<u8> {
        let mut written = Written {
            proofs: vec![(self.proof().encode(), true)],
            others: Vec::new(),
            uris: vec![self.principal()],
            dns: vec![sni_name(&self.workload.id(), &self.mesh)],
        };
        edit(&mut written);
        let uris: Vec<&str> = written.uris.iter().map(String::as_str).collect();
        let dns: Vec<&str> = written.dns.iter().map(String::as_str).collect();
        let names = san_value(&uris, &dns);
        let named = (!uris.is_empty() || !dns.is_empty()).then(|| Extension {
            oid: SUBJECT_ALT_NAME_CONTENT,
            critical: false,
            value: &names,
        });
        let extensions: Vec<Extension<'_>> = named
            .into_iter()
            .chain(written.proofs.iter().map(|(p, critical)| Extension {
                oid: &PROOF_OID_CONTENT,
                critical: *critical,
                value: p,
            }))
            .chain(written.others.iter().map(|(o, critical, v)| Extension {
                oid: o,
                critical: *critical,
                value: v,
            }))
            .collect();
        let tbs = Tbs {
            serial: &[0x01, 0x02],
            not_before_secs: secs(NOW),
            not_after_secs: secs(NOW + HOUR),
            spki: &self.key.spki,
            extensions: &extensions,
        };
        signed(&self.key, &tbs.der().unwrap(), &self.rng).unwrap()
    }

    fn verify(&self, der: &[u8]) -> Result<Peer, CertError> {
        verify(der, &self.mesh, NOW + 1_000)
    }
}

struct Written {
    proofs: Vec<(Vec<u8>, bool)>,
    /// Extensions under other OIDs: (content octets, critical, value).
    others: Vec<(Vec<u8>, bool, Vec<u8>)>,
    uris: Vec<String>,
    dns: Vec<String>,
}

#[test]
fn the_oids_written_are_the_ones_compared() {
    let content = |arcs: &[u64]| yasna::construct_der(|w| w.write_oid(&oid(arcs)))[2..].to_vec();
    assert_eq!(content(EC_PUBLIC_KEY), EC_PUBLIC_KEY_CONTENT);
    assert_eq!(content(P256), P256_CONTENT);
    assert_eq!(content(ECDSA_SHA256), ECDSA_SHA256_CONTENT);
    assert_eq!(content(&[2, 5, 29, 17]), SUBJECT_ALT_NAME_CONTENT);
    // 2.25 (40 × 2 + 25), then base-128 arcs: the UUID's integer, then 1.
    assert_eq!(PROOF_OID_CONTENT[0], 40 * 2 + 25);
    let mut arcs = vec![2u128, 25];
    let mut arc = 0u128;
    for byte in &PROOF_OID_CONTENT[1..] {
        arc = arc << 7 | u128::from(byte & 0x7f);
        if byte & 0x80 == 0 {
            arcs.push(arc);
            arc = 0;
        }
    }
    let dotted: Vec<String> = arcs.iter().map(u128::to_string).collect();
    assert_eq!(dotted.join("."), PROOF_OID);
}

#[test]
fn a_certificate_proves_its_workloads_id_and_carries_its_names() {
    let case = Case::new();
    let der = case.good();
    assert!(der.len() < 1_024, "{} bytes", der.len());
    let peer = case.verify(&der).unwrap();
    assert_eq!(peer.id, case.workload.id());
    assert_eq!(&peer.identity, case.workload.public());
    assert_eq!(peer.principal, "spiffe://demo/svc/check");
    assert_eq!(peer.endorsement, b"a node-signed record");
    assert_eq!(peer.not_after_ms, NOW + HOUR);
    // A stock parser reads it as Envoy's BoringSSL will: one URI SAN and one DNS SAN.
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let sans = cert.subject_alternative_name().unwrap().unwrap();
    assert_eq!(sans.value.general_names.len(), 2);
    // The key Envoy is given is the certificate's.
    let again = TlsKey::from_pkcs8(case.key.pkcs8_der(), &case.rng).unwrap();
    assert_eq!(again.spki_sha256(), case.key.spki_sha256());
}

#[test]
fn an_sni_name_names_one_id_and_nothing_else_parses_as_one() {
    let case = Case::new();
    let id = case.workload.id();
    let name = sni_name(&id, &case.mesh);
    assert!(name.ends_with(".demo.themis.invalid"), "{name}");
    assert!(name.split('.').all(|label| label.len() <= 63), "{name}");
    assert_eq!(id_of_sni_name(&name), Some((case.mesh.clone(), id)));
    // A mesh name with dots and a '1' in it still round-trips.
    let dotted = MeshName::new("team-1.prod").unwrap();
    let other = Identity::generate(dotted.clone(), &case.rng).unwrap().id();
    assert_eq!(
        id_of_sni_name(&sni_name(&other, &dotted)),
        Some((dotted, other))
    );
    let mut flipped = name.clone().into_bytes();
    flipped[3] = if flipped[3] == b'q' { b'p' } else { b'q' };
    for bad in [
        String::from_utf8(flipped).unwrap(),
        name.replace(".themis.invalid", ".themis"),
        name.replace(".demo.", ".other."),
        "check.shop.svc.cluster.local".into(),
        String::new(),
    ] {
        assert_eq!(id_of_sni_name(&bad), None, "{bad}");
    }
}

#[test]
fn a_certificate_of_another_mesh_is_refused() {
    let case = Case::new();
    let other = MeshName::new("other").unwrap();
    // As it is: the proof names mesh demo.
    assert_eq!(
        verify(&case.good(), &other, NOW),
        Err(CertError::OtherMesh("demo".into()))
    );
    // Renamed to ours: the workload key delegated for mesh demo, not this one.
    let renamed = Proof {
        mesh: "other".into(),
        ..case.proof()
    };
    let der = case.issue(&renamed);
    assert_eq!(
        verify(&der, &other, NOW),
        Err(CertError::Delegation(DelegationError::BadSignature))
    );
}

#[test]
fn a_key_with_another_keys_or_workloads_delegation_is_refused() {
    let case = Case::new();
    let other = Case::new();
    // This key, another key's delegation (by the same workload key).
    let proof = Proof {
        delegation: delegate(&case.workload, &other.key, NOW, HOUR),
        ..case.proof()
    };
    assert_eq!(
        case.verify(&case.issue(&proof)),
        Err(CertError::KeyMismatch)
    );
    // Another workload's delegation of this key, claiming this workload.
    let proof = Proof {
        delegation: delegate(&other.workload, &case.key, NOW, HOUR),
        ..case.proof()
    };
    assert_eq!(
        case.verify(&case.issue(&proof)),
        Err(CertError::Delegation(DelegationError::BadSignature))
    );
    // ...and claiming the other workload: that one's id, since its key signed (the
    // key/id binding is the hash; the principal is the caller's to check).
    let proof = Proof {
        workload_key: *other.workload.public_key(),
        delegation: delegate(&other.workload, &case.key, NOW, HOUR),
        ..case.proof()
    };
    let peer = case.verify(&case.written(|w| {
        w.proofs = vec![(proof.encode(), true)];
        w.dns = vec![sni_name(&other.workload.id(), &case.mesh)];
    }));
    assert_eq!(peer.unwrap().id, other.workload.id());
    // A handshake delegation of the same 32 bytes is not a TLS key's.
    let handshake = Delegation::issue(&case.workload, case.key.spki_sha256(), NOW, HOUR);
    let proof = Proof {
        delegation: handshake,
        ..case.proof()
    };
    assert_eq!(
        case.verify(&case.issue(&proof)),
        Err(CertError::Delegation(DelegationError::BadSignature))
    );
}

#[test]
fn an_expired_future_or_overlong_delegation_is_refused() {
    let case = Case::new();
    let der = case.good();
    let skew = themis_core::delegation::MAX_CLOCK_SKEW_MS;
    assert_eq!(
        verify(&der, &case.mesh, NOW + HOUR + skew),
        Err(CertError::Delegation(DelegationError::Expired))
    );
    assert_eq!(
        verify(&der, &case.mesh, NOW - skew - 1),
        Err(CertError::Delegation(DelegationError::NotYetValid))
    );
    let mut proof = case.proof();
    proof.delegation.not_after_ms = NOW + MAX_LIFETIME_MS + 1;
    assert_eq!(
        case.verify(&case.issue(&proof)),
        Err(CertError::Delegation(DelegationError::BadLifetime))
    );
}

/// Every byte of the proof flipped, in a certificate its key signed anew: refused,
/// but for the endorsement's bytes, which the delegation does not cover (they are
/// the node's signed record: the sidecar checks them against the mesh root).
#[test]
fn every_byte_of_the_proof_flipped_is_refused_but_the_endorsement_is_left_to_its_check() {
    let case = Case::new();
    let proof = case.proof();
    let encoded = proof.encode();
    let endorsement_at = encoded.len() - proof.endorsement.len();
    for i in 0..encoded.len() {
        let mut flipped = encoded.clone();
        flipped[i] ^= 0x01;
        let result = case.verify(&case.written(|w| w.proofs = vec![(flipped, true)]));
        if i >= endorsement_at {
            let peer = result.unwrap_or_else(|e| panic!("byte {i}: {e}"));
            assert_ne!(peer.endorsement, proof.endorsement, "byte {i}");
        } else {
            assert!(
                result.is_err(),
                "byte {i} of {} flipped was taken",
                encoded.len()
            );
        }
    }
}

/// Every byte of a good certificate flipped, and every prefix of it: refused (the
/// self-signature covers what the proof does not).
#[test]
fn every_byte_of_the_certificate_flipped_and_every_truncation_is_refused() {
    let case = Case::new();
    let der = case.good();
    for i in 0..der.len() {
        let mut flipped = der.clone();
        flipped[i] ^= 0x80;
        assert!(case.verify(&flipped).is_err(), "byte {i} flipped was taken");
    }
    for len in 0..der.len() {
        assert!(case.verify(&der[..len]).is_err(), "{len} bytes were taken");
    }
    let mut longer = der.clone();
    longer.push(0);
    assert_eq!(case.verify(&longer), Err(CertError::Malformed));
    let huge = vec![0x30; MAX_CERTIFICATE_LEN + 1];
    assert_eq!(
        case.verify(&huge),
        Err(CertError::TooLong(MAX_CERTIFICATE_LEN + 1))
    );
}

#[test]
fn the_names_must_be_one_uri_and_the_proven_ids_sni_name() {
    let case = Case::new();
    let someone = Identity::generate(case.mesh.clone(), &case.rng)
        .unwrap()
        .id();
    type Edit = Box<dyn Fn(&mut Written)>;
    let cases: [(&str, Edit, CertError); 5] = [
        (
            "no names",
            Box::new(|w| {
                w.uris.clear();
                w.dns.clear()
            }),
            CertError::Names,
        ),
        (
            "two URIs",
            Box::new(|w| w.uris.push("spiffe://demo/svc/payments".into())),
            CertError::Names,
        ),
        ("no URI", Box::new(|w| w.uris.clear()), CertError::Names),
        (
            "two DNS names",
            Box::new(|w| w.dns.push("payments.demo.themis.invalid".into())),
            CertError::Names,
        ),
        (
            "another id's SNI name",
            Box::new(move |w| w.dns = vec![sni_name(&someone, &MeshName::new("demo").unwrap())]),
            CertError::WrongSniName(sni_name(&someone, &case.mesh)),
        ),
    ];
    for (what, edit, refused) in cases {
        assert_eq!(case.verify(&case.written(edit)), Err(refused), "{what}");
    }
    // The DNS name first: what the parser reads is the same, but it is not this
    // profile's encoding.
    let dns_first = case.written(|w| {
        w.others = vec![(SUBJECT_ALT_NAME_CONTENT.to_vec(), false, {
            let uri = case.principal();
            let dns = sni_name(&case.workload.id(), &case.mesh);
            yasna::construct_der(|w| {
                w.write_sequence(|w| {
                    w.next().write_tagged_implicit(yasna::Tag::context(2), |w| {
                        w.write_ia5_string(&dns)
                    });
                    w.next().write_tagged_implicit(yasna::Tag::context(6), |w| {
                        w.write_ia5_string(&uri)
                    });
                })
            })
        })];
        w.uris.clear();
        w.dns.clear();
    });
    assert_eq!(case.verify(&dns_first), Err(CertError::NotCanonical));
    // The URI is reported as written: the sidecar compares it with the principal the
    // endorsement proves (here a lie, `payments`, which this crate cannot know).
    let lying = case.written(|w| w.uris = vec!["spiffe://demo/svc/payments".into()]);
    assert_eq!(
        case.verify(&lying).unwrap().principal,
        "spiffe://demo/svc/payments"
    );
}

#[test]
fn the_proof_must_be_there_once_critical_and_alone_in_being_critical() {
    let case = Case::new();
    let proof = case.proof().encode();
    let two = vec![(proof.clone(), true), (proof.clone(), true)];
    assert_eq!(
        case.verify(&case.written(|w| w.proofs = two)),
        Err(CertError::ProofTwice)
    );
    assert_eq!(
        case.verify(&case.written(|w| w.proofs = vec![(proof.clone(), false)])),
        Err(CertError::ProofNotCritical)
    );
    assert_eq!(
        case.verify(&case.written(|w| w.proofs.clear())),
        Err(CertError::NoProof)
    );
    let mut old = case.proof();
    old.version = 2;
    assert_eq!(
        case.verify(&case.issue(&old)),
        Err(CertError::ProofVersion(2))
    );
    let mut long = case.proof();
    long.endorsement = vec![7; MAX_ENDORSEMENT_LEN + 1];
    assert_eq!(
        case.verify(&case.written(|w| w.proofs = vec![(long.encode(), true)])),
        Err(CertError::EndorsementTooLong(MAX_ENDORSEMENT_LEN + 1))
    );
    let too_long = Proof {
        endorsement: vec![0; MAX_PROOF_LEN],
        ..case.proof()
    };
    assert!(matches!(
        issue(&case.key, &too_long, "x", &case.rng),
        Err(IssueError::ProofTooLong(_))
    ));
}

/// Certificates of other makers: a CA-signed leaf (the mTLS pair's kind), a
/// self-signed one without the proof, an Ed25519 one, one with an unknown critical
/// extension.
#[test]
fn certificates_that_are_not_themis_ones_are_refused() {
    let case = Case::new();
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf_params = rcgen::CertificateParams::new(vec!["check.demo".to_owned()]).unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    assert_eq!(case.verify(leaf.der()), Err(CertError::NotSelfSigned));
    // The CA's own certificate: self-signed, but it is a CA's (basicConstraints is
    // critical) and proves nothing.
    assert!(case.verify(ca.der()).is_err());
    let plain = rcgen::CertificateParams::new(vec!["check.demo".to_owned()])
        .unwrap()
        .self_signed(&leaf_key)
        .unwrap();
    assert_eq!(case.verify(plain.der()), Err(CertError::NoProof));
    let ed_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let ed = rcgen::CertificateParams::new(vec!["check.demo".to_owned()])
        .unwrap()
        .self_signed(&ed_key)
        .unwrap();
    assert_eq!(case.verify(ed.der()), Err(CertError::NotP256));
    let mut with_critical = rcgen::CertificateParams::new(vec!["check.demo".to_owned()]).unwrap();
    let mut unknown = rcgen::CustomExtension::from_oid_content(&[1, 2, 3, 4], vec![0x05, 0x00]);
    unknown.set_criticality(true);
    with_critical.custom_extensions = vec![unknown];
    let with_critical = with_critical.self_signed(&leaf_key).unwrap();
    assert_eq!(case.verify(with_critical.der()), Err(CertError::NoProof));
}

#[test]
fn an_unknown_critical_extension_beside_the_proof_is_refused() {
    let case = Case::new();
    // The proof's OID with its last arc changed: someone else's extension.
    let mut neighbour = PROOF_OID_CONTENT.to_vec();
    *neighbour.last_mut().unwrap() = 0x02;
    let critical = case.written(|w| w.others = vec![(neighbour.clone(), true, vec![0x05, 0x00])]);
    assert_eq!(case.verify(&critical), Err(CertError::UnknownCritical));
    // Not critical: a validator may pass over it, and this one does.
    let plain = case.written(|w| w.others = vec![(neighbour, false, vec![0x05, 0x00])]);
    assert!(case.verify(&plain).is_ok());
}
