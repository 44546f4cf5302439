//! Identities as people handle them: key files, printable ids, mesh names.

mod common;

use common::identity;
use themis_core::identity::MAX_MESH_NAME_LEN;
use themis_core::{Identity, KeyFileError, MeshName, MeshNameError, PeerId, PeerIdError};

/// A key made by `openssl genpkey -algorithm ed25519`, and its public key as printed
/// by `openssl pkey -pubout`: Themis reads what platform tooling writes.
#[test]
fn openssl_key_files_load_with_the_same_public_key() {
    let pem = include_str!("fixtures/openssl-ed25519.pem");
    let public = include_str!("fixtures/openssl-ed25519.pub.hex").trim();
    let id = Identity::from_key_file(MeshName::new("prod").unwrap(), pem).unwrap();
    assert_eq!(hex::encode(id.public_key()), public);
    // Written back, it is the same document openssl wrote (PKCS#8 v1).
    assert_eq!(id.to_key_file().as_str(), pem);
}

#[test]
fn key_files_round_trip_and_garbage_is_named() {
    let original = identity("demo", 9);
    let loaded =
        Identity::from_key_file(MeshName::new("demo").unwrap(), &original.to_key_file()).unwrap();
    assert_eq!(loaded.id(), original.id());
    for junk in [
        "",
        "hello",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    ] {
        let err = Identity::from_key_file(MeshName::new("demo").unwrap(), junk).unwrap_err();
        assert!(matches!(err, KeyFileError::Format(_)), "{junk:?}: {err}");
    }
}

#[test]
fn printable_ids_catch_typos_and_wrong_meshes() {
    let me = identity("demo", 9);
    let printable = me.printable_id();
    assert!(printable.starts_with("demo1"));
    assert_eq!(
        PeerId::parse(&printable).unwrap(),
        (me.mesh().clone(), me.id())
    );
    // Bech32 allows an all-upper-case spelling; Themis does not, so that an id has one
    // spelling only.
    assert_eq!(
        PeerId::parse(&printable.to_uppercase()),
        Err(PeerIdError::NonCanonical)
    );
    // One character changed.
    let mut typo = printable.clone().into_bytes();
    let i = typo.len() - 10;
    typo[i] = if typo[i] == b'q' { b'p' } else { b'q' };
    let typo = String::from_utf8(typo).unwrap();
    assert!(
        matches!(PeerId::parse(&typo), Err(PeerIdError::Encoding(_))),
        "{typo}"
    );
    // The right id in the wrong mesh.
    assert_eq!(
        PeerId::parse_in(&printable, &MeshName::new("prod").unwrap()),
        Err(PeerIdError::WrongMesh {
            expected: "prod".into(),
            found: "demo".into()
        })
    );
}

#[test]
fn mesh_names_are_checked() {
    assert_eq!(MeshName::new(""), Err(MeshNameError::Empty));
    assert_eq!(MeshName::new("Prod"), Err(MeshNameError::BadCharacter('P')));
    assert_eq!(MeshName::new("-prod"), Err(MeshNameError::BadStart));
    let long = "a".repeat(MAX_MESH_NAME_LEN + 1);
    assert_eq!(
        MeshName::new(&long),
        Err(MeshNameError::TooLong(MAX_MESH_NAME_LEN + 1))
    );
    assert!(MeshName::new(&long[1..]).is_ok());
    assert!(MeshName::new("prod.eu-west-1").is_ok());
}

/// Signed statements (the registry's instance records) verify only under the signer's
/// key, the same label and the exact message.
#[test]
fn statements_bind_key_label_and_message() {
    use themis_core::identity::verify_statement;
    let (alice, bob) = (identity("demo", 1), identity("demo", 2));
    let sig = alice.sign_statement("registry", b"check at 10.0.0.1:15006");
    assert!(verify_statement(
        alice.public_key(),
        "registry",
        b"check at 10.0.0.1:15006",
        &sig
    ));
    assert!(!verify_statement(
        bob.public_key(),
        "registry",
        b"check at 10.0.0.1:15006",
        &sig
    ));
    assert!(!verify_statement(
        alice.public_key(),
        "other",
        b"check at 10.0.0.1:15006",
        &sig
    ));
    assert!(!verify_statement(
        alice.public_key(),
        "registry",
        b"check at 10.0.0.2:15006",
        &sig
    ));
    // The label length is part of what is signed: moving bytes between label and
    // message does not keep a signature valid.
    let sig = alice.sign_statement("ab", b"c");
    assert!(!verify_statement(alice.public_key(), "a", b"bc", &sig));
    for bit in 0..8 * 64 {
        let mut bad = sig;
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(!verify_statement(alice.public_key(), "ab", b"c", &bad));
    }
}
