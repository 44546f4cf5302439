//! The trust log against the attacks a peer, a copy on disk or a forking root can
//! make: every refusal leaves the copy as it was.

use proptest::prelude::*;
use ring::rand::SystemRandom;
use themis_core::{Identity, MeshName};
use themis_log::{Audit, Checkpoint, Entry, Kind, Log, LogError, SignedCheckpoint, Statement};
use themis_trust::{
    AddressRange, Admission, Binding, Grant, MeshRoot, Revocation, Signed, Subject, TrustError,
    ADDRESS_RANGE_LABEL, ADMISSION_LABEL, BINDING_LABEL, GRANT_LABEL, REVOCATION_LABEL,
};

const MESH: &str = "logtest";

fn key(mesh: &str) -> Identity {
    Identity::generate(MeshName::new(mesh).unwrap(), &SystemRandom::new()).unwrap()
}

fn root_of(key: &Identity) -> MeshRoot {
    MeshRoot {
        mesh: key.mesh().clone(),
        key: *key.public_key(),
    }
}

/// A statement of each kind in turn, signed by `signer`, as a leaf.
fn leaf(signer: &Identity, n: u64) -> Vec<u8> {
    let mesh = signer.mesh().as_str().to_owned();
    let subject = [n as u8; 32];
    let entry = match n % 3 {
        0 => Entry::new(
            Kind::Admission,
            Signed::sign(
                signer,
                ADMISSION_LABEL,
                &Admission {
                    mesh,
                    node_key: subject,
                    issued_at: n,
                    not_after: None,
                },
            ),
        ),
        1 => Entry::new(
            Kind::Grant,
            Signed::sign(
                signer,
                GRANT_LABEL,
                &Grant {
                    mesh,
                    service: format!("svc-{n}"),
                    grantee: subject,
                    delegate: false,
                    issued_at: n,
                    not_after: None,
                },
            ),
        ),
        _ => revocation(signer, n),
    };
    entry.encode()
}

fn revocation(signer: &Identity, n: u64) -> Entry {
    let mut id = [0u8; 32];
    id[..8].copy_from_slice(&n.to_be_bytes());
    Entry::new(
        Kind::Revocation,
        Signed::sign(
            signer,
            REVOCATION_LABEL,
            &Revocation {
                mesh: signer.mesh().as_str().to_owned(),
                id,
                issued_at: n,
                reason: format!("test {n}"),
            },
        ),
    )
}

/// The operator's log of `n` leaves, checkpointed.
fn operator_log(root: &Identity, n: u64) -> (Log, SignedCheckpoint) {
    let mut log = Log::new(root_of(root));
    for i in 0..n {
        log.append(leaf(root, i)).unwrap();
    }
    let checkpoint = log.sign_checkpoint(root, 1_000);
    (log, checkpoint)
}

fn all_leaves(log: &Log) -> Vec<Vec<u8>> {
    log.leaves(0, usize::MAX).to_vec()
}

#[test]
fn an_agent_catches_up_from_nothing_and_in_steps() {
    let root = key(MESH);
    let (operator, checkpoint) = operator_log(&root, 10);
    let mut agent = Log::new(root_of(&root));
    assert_eq!(
        agent.extend(checkpoint.encoded(), &all_leaves(&operator)),
        Ok(10)
    );
    assert_eq!(agent.root_hash(), operator.root_hash());
    assert_eq!(agent.checkpoint(), Some(&checkpoint));
    let kinds: Vec<Kind> = agent.statements().map(|(_, s)| s.kind()).collect();
    assert_eq!(kinds[..3], [Kind::Admission, Kind::Grant, Kind::Revocation]);

    // Five more, then the agent takes only what it lacks.
    let mut operator = operator;
    for i in 10..15 {
        operator.append(leaf(&root, i)).unwrap();
    }
    let newer = operator.sign_checkpoint(&root, 2_000);
    assert_eq!(
        agent.extend(newer.encoded(), operator.leaves(10, 100)),
        Ok(5)
    );
    assert_eq!(agent.size(), 15);
    // The same checkpoint again: nothing to add.
    assert_eq!(agent.extend(newer.encoded(), &[]), Ok(0));
}

#[test]
fn a_log_of_the_empty_tree_is_a_valid_start() {
    let root = key(MESH);
    let (operator, checkpoint) = operator_log(&root, 0);
    let mut agent = Log::new(root_of(&root));
    assert_eq!(agent.extend(checkpoint.encoded(), &[]), Ok(0));
    assert_eq!(agent.root_hash(), operator.root_hash());
}

/// Every byte of a leaf flipped: the leaf does not verify, or the leaves do not
/// hash to the signed root; the copy is unchanged.
#[test]
fn a_leaf_with_any_bit_flipped_is_refused() {
    let root = key(MESH);
    let (operator, checkpoint) = operator_log(&root, 4);
    let leaves = all_leaves(&operator);
    for at in 0..leaves[2].len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = leaves.clone();
            bad[2][at] ^= bit;
            let mut agent = Log::new(root_of(&root));
            let refused = agent.extend(checkpoint.encoded(), &bad);
            assert!(refused.is_err(), "byte {at} bit {bit:#x} passed");
            assert_eq!(agent.size(), 0);
            assert!(agent.checkpoint().is_none());
        }
    }
}

#[test]
fn truncated_padded_or_reordered_leaves_are_refused() {
    let root = key(MESH);
    let (operator, checkpoint) = operator_log(&root, 6);
    let leaves = all_leaves(&operator);
    let mut agent = Log::new(root_of(&root));
    assert!(matches!(
        agent.extend(checkpoint.encoded(), &leaves[..5]),
        Err(LogError::SizeMismatch { .. })
    ));
    let mut padded = leaves.clone();
    padded.push(leaf(&root, 99));
    assert!(matches!(
        agent.extend(checkpoint.encoded(), &padded),
        Err(LogError::SizeMismatch { .. })
    ));
    let mut reordered = leaves.clone();
    reordered.swap(1, 4);
    assert_eq!(
        agent.extend(checkpoint.encoded(), &reordered),
        Err(LogError::RootMismatch)
    );
    // A valid statement the root never logged, in place of one it did.
    let mut replaced = leaves.clone();
    replaced[5] = leaf(&root, 50);
    assert_eq!(
        agent.extend(checkpoint.encoded(), &replaced),
        Err(LogError::RootMismatch)
    );
    assert_eq!(agent.size(), 0);
}

#[test]
fn leaves_not_from_the_root_or_of_another_mesh_or_kind_are_refused() {
    let root = key(MESH);
    let (mut operator, _) = operator_log(&root, 2);
    // The operator's own tool refuses them too.
    let stranger = key(MESH);
    assert!(matches!(
        operator.append(leaf(&stranger, 2)),
        Err(LogError::Leaf {
            index: 2,
            error: TrustError::NotFromRoot
        })
    ));
    // The root's key on another mesh's statement: not a decision of this mesh.
    let elsewhere = Entry::new(
        Kind::Admission,
        Signed::sign(
            &root,
            ADMISSION_LABEL,
            &Admission {
                mesh: "othermesh".into(),
                node_key: [3; 32],
                issued_at: 3,
                not_after: None,
            },
        ),
    );
    assert!(matches!(
        operator.append(elsewhere.encode()),
        Err(LogError::Leaf {
            error: TrustError::WrongMesh,
            ..
        })
    ));
    // A revocation relabelled as a grant: its signature is under another label.
    let mut relabelled = revocation(&root, 7);
    relabelled.kind = Kind::Grant;
    assert!(matches!(
        operator.append(relabelled.encode()),
        Err(LogError::Leaf {
            error: TrustError::BadSignature,
            ..
        })
    ));
    // A range grant of no valid network (host bits set, a prefix longer than the
    // family has), even root-signed: never a node's newest grant.
    for (network, prefix_len) in [("10.244.1.7", 24), ("10.244.1.0", 33)] {
        let grant = Entry::new(
            Kind::AddressRange,
            Signed::sign(
                &root,
                ADDRESS_RANGE_LABEL,
                &AddressRange {
                    mesh: MESH.into(),
                    node_key: [4; 32],
                    network: network.parse().unwrap(),
                    prefix_len,
                    issued_at: 4,
                    not_after: None,
                },
            ),
        );
        assert!(matches!(
            operator.append(grant.encode()),
            Err(LogError::Leaf {
                error: TrustError::Malformed,
                ..
            })
        ));
    }
    assert!(matches!(
        operator.append(vec![0xff; 40]),
        Err(LogError::Leaf {
            error: TrustError::Malformed,
            ..
        })
    ));
    assert!(matches!(
        operator.append(vec![0; themis_log::MAX_LEAF_LEN + 1]),
        Err(LogError::Leaf {
            error: TrustError::Malformed,
            ..
        })
    ));
    assert_eq!(operator.size(), 2);
}

fn binding(signer: &Identity, namespace: &str, accounts: &[&str], issued_at: u64) -> Entry {
    Entry::new(
        Kind::Binding,
        Signed::sign(
            signer,
            BINDING_LABEL,
            &Binding {
                mesh: signer.mesh().as_str().to_owned(),
                service: "payments".into(),
                namespace: namespace.into(),
                service_accounts: accounts.iter().map(|a| a.to_string()).collect(),
                issued_at,
                not_after: None,
            },
        ),
    )
}

#[test]
fn bindings_count_from_the_root_only_and_the_newest_of_a_namespace_wins() {
    let root = key(MESH);
    let mut log = Log::new(root_of(&root));
    log.append(binding(&root, "team-a", &["payments"], 10).encode())
        .unwrap();
    log.append(binding(&root, "team-b", &[], 10).encode())
        .unwrap();
    let now = 100;
    let bindings = log.bindings();
    let allowed = |b: &themis_trust::Bindings, ns, sa| {
        b.check("payments", &Subject::new(ns, sa).unwrap(), now)
            .is_ok()
    };
    assert!(allowed(&bindings, "team-a", "payments"));
    assert!(
        !allowed(&bindings, "team-a", "default"),
        "another ServiceAccount"
    );
    assert!(allowed(&bindings, "team-b", "default"));
    assert!(
        !allowed(&bindings, "team-c", "payments"),
        "another namespace"
    );
    // The root narrows team-b's binding: the newer one replaces it.
    log.append(binding(&root, "team-b", &["web"], 20).encode())
        .unwrap();
    assert!(!allowed(&log.bindings(), "team-b", "default"));
    assert!(allowed(&log.bindings(), "team-b", "web"));
    // A binding signed by anyone else, or with a name Kubernetes would not take, is
    // no leaf of the log.
    let stranger = key(MESH);
    assert!(matches!(
        log.append(binding(&stranger, "team-c", &[], 30).encode()),
        Err(LogError::Leaf {
            error: TrustError::NotFromRoot,
            ..
        })
    ));
    for (ns, accounts) in [
        ("Team-C", &[][..]),
        ("team-c", &["a/b"][..]),
        ("team-c", &["x", "x"][..]),
    ] {
        assert!(
            matches!(
                log.append(binding(&root, ns, accounts, 30).encode()),
                Err(LogError::Leaf {
                    error: TrustError::Malformed,
                    ..
                })
            ),
            "{ns} {accounts:?}"
        );
    }
    // A binding relabelled as a grant: its signature is under another label.
    let mut relabelled = binding(&root, "team-c", &[], 30);
    relabelled.kind = Kind::Grant;
    assert!(log.append(relabelled.encode()).is_err());
    assert!(!allowed(&log.bindings(), "team-c", "payments"));
}

#[test]
fn checkpoints_tampered_forged_of_another_mesh_or_older_are_refused() {
    let root = key(MESH);
    let (operator, checkpoint) = operator_log(&root, 3);
    let leaves = all_leaves(&operator);
    let bytes = checkpoint.encoded().to_vec();
    for at in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x01;
        let mut agent = Log::new(root_of(&root));
        assert!(
            agent.extend(&bad, &leaves).is_err(),
            "checkpoint byte {at} flipped passed"
        );
        assert_eq!(agent.size(), 0);
    }
    // Signed by another key, claiming this mesh.
    let forger = key(MESH);
    let forged = Checkpoint {
        mesh: MESH.into(),
        size: 3,
        root_hash: operator.root_hash(),
        issued_at: 5,
    }
    .sign(&forger);
    let mut agent = Log::new(root_of(&root));
    assert_eq!(
        agent.extend(forged.encoded(), &leaves),
        Err(LogError::NotFromRoot)
    );
    // The root's signature on another mesh's checkpoint.
    let other = Checkpoint {
        mesh: "another".into(),
        size: 3,
        root_hash: operator.root_hash(),
        issued_at: 5,
    }
    .sign(&root);
    assert_eq!(
        agent.extend(other.encoded(), &leaves),
        Err(LogError::WrongMesh)
    );
    // Oversize and empty input.
    assert_eq!(
        SignedCheckpoint::verify(&root_of(&root), &vec![0; 4096]),
        Err(LogError::Malformed)
    );
    assert_eq!(
        SignedCheckpoint::verify(&root_of(&root), &[]),
        Err(LogError::Malformed)
    );
    // A replayed older checkpoint after a newer one: a rollback.
    agent.extend(checkpoint.encoded(), &leaves).unwrap();
    let mut operator = operator;
    operator.append(leaf(&root, 3)).unwrap();
    let newer = operator.sign_checkpoint(&root, 9);
    agent
        .extend(newer.encoded(), operator.leaves(3, 10))
        .unwrap();
    assert_eq!(
        agent.extend(checkpoint.encoded(), &[]),
        Err(LogError::Rollback {
            offered: 3,
            held: 4
        })
    );
    assert_eq!(agent.checkpoint(), Some(&newer));
}

/// The root signs two histories of one size: the first agent to see both holds the
/// evidence.
#[test]
fn two_checkpoints_of_one_size_are_a_fork() {
    let root = key(MESH);
    let (left, left_cp) = operator_log(&root, 5);
    let mut right = Log::new(root_of(&root));
    for i in 0..4 {
        right.append(leaf(&root, i)).unwrap();
    }
    right.append(leaf(&root, 40)).unwrap();
    let right_cp = right.sign_checkpoint(&root, 1_000);
    let mut agent = Log::new(root_of(&root));
    agent.extend(left_cp.encoded(), &all_leaves(&left)).unwrap();
    match agent.audit(&right_cp) {
        Audit::Fork(fork) => {
            assert_eq!(fork.ours, left_cp.encoded());
            assert_eq!(fork.theirs, right_cp.encoded());
        }
        other => panic!("not seen as a fork: {other:?}"),
    }
    // Its own checkpoint, and any prefix of it, are consistent.
    assert_eq!(agent.audit(&left_cp), Audit::Consistent);
    let (_, prefix_cp) = operator_log(&root, 3);
    assert_eq!(agent.audit(&prefix_cp), Audit::Consistent);
}

/// The root signs a longer log that rewrites the past: no leaves a peer serves make
/// it extend the agent's copy, and the peer's whole copy proves the fork. A peer that
/// serves a log which does not hash to the checkpoint it shows is a liar, not a
/// fork.
#[test]
fn a_longer_log_that_rewrites_the_past_is_a_fork() {
    let root = key(MESH);
    let (honest, honest_cp) = operator_log(&root, 4);
    let mut agent = Log::new(root_of(&root));
    agent
        .extend(honest_cp.encoded(), &all_leaves(&honest))
        .unwrap();

    let mut rewritten = Log::new(root_of(&root));
    rewritten.append(leaf(&root, 0)).unwrap();
    rewritten.append(leaf(&root, 77)).unwrap();
    for i in 2..8 {
        rewritten.append(leaf(&root, i)).unwrap();
    }
    let rewritten_cp = rewritten.sign_checkpoint(&root, 2_000);
    assert_eq!(agent.audit(&rewritten_cp), Audit::Ahead);
    assert_eq!(
        agent.extend(rewritten_cp.encoded(), rewritten.leaves(4, 100)),
        Err(LogError::RootMismatch)
    );
    let fork = agent
        .prove_fork(rewritten_cp.encoded(), &all_leaves(&rewritten))
        .unwrap()
        .expect("a fork");
    assert_eq!(fork.ours, honest_cp.encoded());
    assert_eq!(agent.size(), 4);

    // A consistent longer log is no fork.
    let mut longer = honest.clone();
    longer.append(leaf(&root, 4)).unwrap();
    let longer_cp = longer.sign_checkpoint(&root, 3_000);
    assert_eq!(
        agent.prove_fork(longer_cp.encoded(), &all_leaves(&longer)),
        Ok(None)
    );
    // A liar: the right checkpoint, leaves that are not its log.
    let mut lie = all_leaves(&longer);
    lie.swap(0, 1);
    assert_eq!(
        agent.prove_fork(longer_cp.encoded(), &lie),
        Err(LogError::RootMismatch)
    );
}

#[test]
fn inclusion_proofs_hold_for_every_leaf_and_nothing_else() {
    let root = key(MESH);
    let (log, cp) = operator_log(&root, 13);
    for i in 0..13 {
        let proof = log.inclusion_proof(i).unwrap();
        let leaf = log.leaf(i).unwrap();
        assert_eq!(cp.checkpoint.verify_inclusion(leaf, i, &proof), Ok(()));
        // Another index, another leaf, a flipped proof: refused.
        assert!(cp
            .checkpoint
            .verify_inclusion(leaf, (i + 1) % 13, &proof)
            .is_err());
        let other = log.leaf((i + 1) % 13).unwrap();
        assert!(cp.checkpoint.verify_inclusion(other, i, &proof).is_err());
        if !proof.is_empty() {
            let mut bad = proof.clone();
            bad[0] ^= 1;
            assert_eq!(
                cp.checkpoint.verify_inclusion(leaf, i, &bad),
                Err(LogError::BadProof)
            );
            assert_eq!(
                cp.checkpoint.verify_inclusion(leaf, i, &bad[1..]),
                Err(LogError::Malformed)
            );
        }
    }
    assert!(log.inclusion_proof(13).is_none());
    assert!(cp
        .checkpoint
        .verify_inclusion(log.leaf(0).unwrap(), 13, &[])
        .is_err());
    assert_eq!(
        cp.checkpoint.verify_inclusion(b"x", 0, &vec![0; 129 * 32]),
        Err(LogError::Malformed)
    );
}

/// 1,000 revocations: no ceiling short of the log's own size.
#[test]
fn a_thousand_revocations_are_one_log() {
    let root = key(MESH);
    let mut operator = Log::new(root_of(&root));
    for n in 0..1_000 {
        operator.append(revocation(&root, n).encode()).unwrap();
    }
    let cp = operator.sign_checkpoint(&root, 1);
    let mut agent = Log::new(root_of(&root));
    let leaves = all_leaves(&operator);
    // In batches, as a peer serves them.
    let mut staged = Vec::new();
    for batch in leaves.chunks(256) {
        staged.extend_from_slice(batch);
    }
    assert_eq!(agent.extend(cp.encoded(), &staged), Ok(1_000));
    let revoked = agent
        .statements()
        .filter(|(_, s)| matches!(s, Statement::Revocation(_)))
        .count();
    assert_eq!(revoked, 1_000);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// For any two sizes, the larger log's consistency proof shows the smaller is a
    /// prefix; against a checkpoint of any other prefix it fails.
    #[test]
    fn consistency_proofs_verify_exactly_the_prefixes(old in 0u64..40, more in 0u64..40) {
        let root = key(MESH);
        let (mut log, _) = operator_log(&root, old);
        let old_cp = log.sign_checkpoint(&root, 1);
        for i in old..old + more {
            log.append(leaf(&root, i)).unwrap();
        }
        let new_cp = log.sign_checkpoint(&root, 2);
        let proof = log.consistency_proof(old).unwrap_or_default();
        prop_assert_eq!(new_cp.checkpoint.verify_extends(&old_cp.checkpoint, &proof), Ok(()));
        // A checkpoint of the same size over other leaves does not pass.
        if old > 0 {
            let mut other = Log::new(root_of(&root));
            for i in 0..old {
                other.append(leaf(&root, i + 1_000)).unwrap();
            }
            let other_cp = other.sign_checkpoint(&root, 3);
            prop_assert!(new_cp.checkpoint.verify_extends(&other_cp.checkpoint, &proof).is_err());
        }
        // Nor does a newer checkpoint shown as the older one.
        if more > 0 {
            prop_assert!(old_cp.checkpoint.verify_extends(&new_cp.checkpoint, &proof).is_err());
        }
    }

    /// Decoders are total: arbitrary bytes never panic.
    #[test]
    fn decoders_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let root = key(MESH);
        let _ = Entry::decode(&bytes);
        let _ = SignedCheckpoint::verify(&root_of(&root), &bytes);
        let (log, cp) = operator_log(&root, 3);
        let _ = cp.checkpoint.verify_inclusion(&bytes, 1, &bytes);
        let _ = cp.checkpoint.verify_extends(&cp.checkpoint, &bytes);
        let mut copy = Log::new(root_of(&root));
        let _ = copy.extend(&bytes, std::slice::from_ref(&bytes));
        let _ = copy.extend(cp.encoded(), &[bytes.clone(), bytes.clone(), bytes]);
        prop_assert_eq!(copy.size(), 0);
        prop_assert_eq!(log.size(), 3);
    }
}

/// A whole copy round-trips, and one bit flipped anywhere in it fails to load.
#[test]
fn a_whole_copy_verifies_from_its_first_leaf_and_any_flipped_bit_fails() {
    let root = key(MESH);
    let (log, _) = operator_log(&root, 5);
    let copy = log.to_copy().unwrap();
    let loaded = Log::from_copy(root_of(&root), &copy).unwrap();
    assert_eq!(loaded.root_hash(), log.root_hash());
    assert_eq!(loaded.size(), 5);
    for at in 0..copy.len() {
        let mut bad = copy.clone();
        bad[at] ^= 0x04;
        assert!(
            Log::from_copy(root_of(&root), &bad).is_err(),
            "byte {at} flipped loaded"
        );
    }
    assert!(Log::from_copy(root_of(&root), &copy[..copy.len() - 1]).is_err());
    // Under another root: refused.
    assert!(Log::from_copy(root_of(&key(MESH)), &copy).is_err());
    assert!(Log::new(root_of(&root)).to_copy().is_none());
}
