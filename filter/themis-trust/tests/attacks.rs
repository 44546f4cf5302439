//! The attacks on naming, admission and revocation, as tests: each forged, altered,
//! misplaced or replayed credential is refused with the reason `themis explain` shows.

use std::net::SocketAddr;

use ring::rand::SystemRandom;
use themis_core::{Identity, MeshName, PeerId};
use themis_trust::*;

const NOW: u64 = 1_800_000_000_000;
const MINUTE: u64 = 60_000;

fn identity(mesh: &str) -> Identity {
    Identity::generate(MeshName::new(mesh).unwrap(), &SystemRandom::new()).unwrap()
}

struct Mesh {
    root_key: Identity,
    root: MeshRoot,
}

impl Mesh {
    fn new() -> Mesh {
        let root_key = identity("demo");
        let root = MeshRoot {
            mesh: root_key.mesh().clone(),
            key: *root_key.public_key(),
        };
        Mesh { root_key, root }
    }

    fn grant(&self, by: &Identity, service: &str, to: &Identity, delegate: bool) -> Signed {
        Signed::sign(
            by,
            GRANT_LABEL,
            &Grant {
                mesh: "demo".into(),
                service: service.into(),
                grantee: *to.public_key(),
                delegate,
                issued_at: NOW - MINUTE,
                not_after: None,
            },
        )
    }

    fn record(
        &self,
        node: &Identity,
        service: &str,
        workload: &Identity,
        issued_at: u64,
    ) -> Signed {
        record_with(
            node,
            service,
            workload,
            issued_at,
            issued_at + 10 * MINUTE,
            Some(endpoint()),
        )
    }

    fn verifier<'a>(&'a self, revoked: &'a Revocations) -> Verifier<'a> {
        Verifier {
            root: &self.root,
            now_ms: NOW,
            revoked,
        }
    }

    fn revoke(&self, id: [u8; 32]) -> Vec<u8> {
        Signed::sign(
            &self.root_key,
            REVOCATION_LABEL,
            &Revocation {
                mesh: "demo".into(),
                id,
                issued_at: NOW,
                reason: "stolen".into(),
            },
        )
        .encode()
    }
}

fn endpoint() -> SocketAddr {
    "127.0.0.1:15006".parse().unwrap()
}

fn record_with(
    node: &Identity,
    service: &str,
    workload: &Identity,
    issued_at: u64,
    not_after: u64,
    endpoint: Option<SocketAddr>,
) -> Signed {
    Signed::sign(
        node,
        RECORD_LABEL,
        &Record {
            mesh: "demo".into(),
            service: service.into(),
            workload_key: *workload.public_key(),
            endpoint,
            metadata: Metadata::new(),
            issued_at,
            not_after,
        },
    )
}

fn value(grants: Vec<Signed>, record: Signed) -> Vec<u8> {
    InstanceValue { grants, record }.encode()
}

#[test]
fn an_endorsed_instance_verifies_and_names_its_workload() {
    let (mesh, node, w) = (Mesh::new(), identity("demo"), identity("demo"));
    let none = Revocations::new();
    let v = value(
        vec![mesh.grant(&mesh.root_key, "check", &node, false)],
        mesh.record(&node, "check", &w, NOW),
    );
    let instance = mesh.verifier(&none).instance(&v, "check").unwrap();
    assert_eq!(instance.id, w.id());
    assert_eq!(instance.endorser, *node.public_key());
    assert_eq!(instance.endpoint, Some(endpoint()));
}

#[test]
fn an_impostor_with_a_valid_mesh_key_but_no_grant_is_refused() {
    // The old registry accepted any record signed by the key inside it.
    let (mesh, impostor) = (Mesh::new(), identity("demo"));
    let none = Revocations::new();
    let v = mesh.verifier(&none);
    // No grant at all.
    assert_eq!(
        v.instance(
            &value(vec![], mesh.record(&impostor, "check", &impostor, NOW)),
            "check"
        ),
        Err(TrustError::ChainLength)
    );
    // A grant it signed for itself.
    let self_grant = mesh.grant(&impostor, "check", &impostor, false);
    assert_eq!(
        v.instance(
            &value(
                vec![self_grant],
                mesh.record(&impostor, "check", &impostor, NOW)
            ),
            "check"
        ),
        Err(TrustError::NotFromRoot)
    );
    // A real grant for another service (handler), used for check.
    let handler = mesh.grant(&mesh.root_key, "handler", &impostor, false);
    assert_eq!(
        v.instance(
            &value(
                vec![handler.clone()],
                mesh.record(&impostor, "check", &impostor, NOW)
            ),
            "check"
        ),
        Err(TrustError::WrongService)
    );
    // A real grant for check to another node, with the impostor's own record.
    let node = identity("demo");
    let real = mesh.grant(&mesh.root_key, "check", &node, false);
    assert_eq!(
        v.instance(
            &value(vec![real], mesh.record(&impostor, "check", &impostor, NOW)),
            "check"
        ),
        Err(TrustError::NotGranted)
    );
    // A record for handler, resolved as check.
    assert_eq!(
        v.instance(
            &value(
                vec![handler],
                mesh.record(&impostor, "handler", &impostor, NOW)
            ),
            "check"
        ),
        Err(TrustError::WrongService)
    );
}

#[test]
fn delegation_needs_the_delegate_flag_and_an_unbroken_chain() {
    let (mesh, authority, node, w) = (
        Mesh::new(),
        identity("demo"),
        identity("demo"),
        identity("demo"),
    );
    let none = Revocations::new();
    let v = mesh.verifier(&none);
    let to_authority = mesh.grant(&mesh.root_key, "check", &authority, true);
    let to_node = mesh.grant(&authority, "check", &node, false);
    let record = mesh.record(&node, "check", &w, NOW);
    assert!(v
        .instance(
            &value(vec![to_authority, to_node.clone()], record.clone()),
            "check"
        )
        .is_ok());

    let no_delegate = mesh.grant(&mesh.root_key, "check", &authority, false);
    assert_eq!(
        v.instance(
            &value(vec![no_delegate, to_node.clone()], record.clone()),
            "check"
        ),
        Err(TrustError::NotDelegable)
    );
    // A link signed by someone else than the previous grantee.
    let other = mesh.grant(&mesh.root_key, "check", &identity("demo"), true);
    assert_eq!(
        v.instance(
            &value(vec![other, to_node.clone()], record.clone()),
            "check"
        ),
        Err(TrustError::BrokenChain)
    );
    // Three links: over the bound.
    let a = mesh.grant(&mesh.root_key, "check", &authority, true);
    assert_eq!(
        v.instance(&value(vec![a.clone(), a.clone(), to_node], record), "check"),
        Err(TrustError::ChainLength)
    );
}

#[test]
fn every_byte_flipped_and_every_truncation_is_refused() {
    let (mesh, node, w) = (Mesh::new(), identity("demo"), identity("demo"));
    let none = Revocations::new();
    let v = mesh.verifier(&none);
    let good = value(
        vec![mesh.grant(&mesh.root_key, "check", &node, false)],
        mesh.record(&node, "check", &w, NOW),
    );
    for i in 0..good.len() {
        for bit in [0x01, 0x80] {
            let mut bad = good.clone();
            bad[i] ^= bit;
            assert!(v.instance(&bad, "check").is_err(), "byte {i} bit {bit:#x}");
        }
    }
    for len in 0..good.len() {
        assert!(
            v.instance(&good[..len], "check").is_err(),
            "truncated to {len}"
        );
    }
    let mut long = good.clone();
    long.push(0);
    assert_eq!(v.instance(&long, "check"), Err(TrustError::Malformed));
    assert_eq!(
        v.instance(&vec![0xff; MAX_ENCODED_LEN + 1], "check"),
        Err(TrustError::Malformed)
    );
}

#[test]
fn a_signature_of_one_kind_cannot_pass_as_another() {
    // The root signs an admission body; presented as a grant it must fail.
    let (mesh, node) = (Mesh::new(), identity("demo"));
    let none = Revocations::new();
    let admission = Signed::sign(
        &mesh.root_key,
        ADMISSION_LABEL,
        &Admission {
            mesh: "demo".into(),
            node_key: *node.public_key(),
            issued_at: NOW,
            not_after: None,
        },
    );
    let record = mesh.record(&node, "check", &node, NOW);
    assert_eq!(
        mesh.verifier(&none)
            .instance(&value(vec![admission.clone()], record), "check"),
        Err(TrustError::BadSignature)
    );
    assert!(mesh
        .verifier(&none)
        .admission(&admission.encode(), node.public_key())
        .is_ok());
}

#[test]
fn admissions_bind_the_key_the_mesh_and_the_root() {
    let (mesh, node, other) = (Mesh::new(), identity("demo"), identity("demo"));
    let none = Revocations::new();
    let v = mesh.verifier(&none);
    let admit = |by: &Identity, mesh_name: &str, key: &Identity, not_after| {
        Signed::sign(
            by,
            ADMISSION_LABEL,
            &Admission {
                mesh: mesh_name.into(),
                node_key: *key.public_key(),
                issued_at: NOW - MINUTE,
                not_after,
            },
        )
        .encode()
    };
    assert!(v
        .admission(
            &admit(&mesh.root_key, "demo", &node, None),
            node.public_key()
        )
        .is_ok());
    // Someone else's admission presented by a node that holds another key.
    assert_eq!(
        v.admission(
            &admit(&mesh.root_key, "demo", &node, None),
            other.public_key()
        ),
        Err(TrustError::WrongKey)
    );
    // Self-admitted.
    assert_eq!(
        v.admission(&admit(&node, "demo", &node, None), node.public_key()),
        Err(TrustError::NotFromRoot)
    );
    // Another mesh's root (same name, other key): not this root.
    let foreign = identity("demo");
    assert_eq!(
        v.admission(&admit(&foreign, "demo", &node, None), node.public_key()),
        Err(TrustError::NotFromRoot)
    );
    // Expired.
    assert_eq!(
        v.admission(
            &admit(&mesh.root_key, "demo", &node, Some(NOW)),
            node.public_key()
        ),
        Err(TrustError::Expired)
    );
    // Presented over a channel authenticated as another peer.
    let good = admit(&mesh.root_key, "demo", &node, None);
    assert!(v.admission_of(&good, &node.id()).is_ok());
    assert_eq!(
        v.admission_of(&good, &other.id()),
        Err(TrustError::WrongKey)
    );
    // Revoked.
    let mut revoked = Revocations::new();
    revoked.add(&mesh.root, &mesh.revoke(node.id().0)).unwrap();
    assert_eq!(
        mesh.verifier(&revoked).admission(
            &admit(&mesh.root_key, "demo", &node, None),
            node.public_key()
        ),
        Err(TrustError::Revoked)
    );
}

#[test]
fn records_are_short_lived_and_cannot_claim_the_future() {
    let (mesh, node, w) = (Mesh::new(), identity("demo"), identity("demo"));
    let none = Revocations::new();
    let v = mesh.verifier(&none);
    let grant = || vec![mesh.grant(&mesh.root_key, "check", &node, false)];
    let check = |issued, not_after| {
        v.instance(
            &value(
                grant(),
                record_with(&node, "check", &w, issued, not_after, Some(endpoint())),
            ),
            "check",
        )
    };
    assert_eq!(
        check(NOW - 20 * MINUTE, NOW - MINUTE).unwrap_err(),
        TrustError::Expired
    );
    // The old serial game: a record "issued" at u64::MAX to beat every later one.
    assert_eq!(
        check(u64::MAX - 1, u64::MAX).unwrap_err(),
        TrustError::FromTheFuture
    );
    assert_eq!(
        check(NOW + 2 * MINUTE, NOW + 3 * MINUTE).unwrap_err(),
        TrustError::FromTheFuture
    );
    assert_eq!(
        check(NOW, NOW + MAX_RECORD_LIFETIME_MS + 1).unwrap_err(),
        TrustError::BadLifetime
    );
    assert_eq!(check(NOW, NOW).unwrap_err(), TrustError::BadLifetime);
    assert!(check(NOW, NOW + MAX_RECORD_LIFETIME_MS).is_ok());
}

#[test]
fn a_revoked_workload_node_or_authority_is_refused_whatever_its_serial() {
    let (mesh, authority, node, w) = (
        Mesh::new(),
        identity("demo"),
        identity("demo"),
        identity("demo"),
    );
    let chain = vec![
        mesh.grant(&mesh.root_key, "check", &authority, true),
        mesh.grant(&authority, "check", &node, false),
    ];
    // The freshest possible record, signed by the node for the workload.
    let v = value(
        chain,
        record_with(
            &node,
            "check",
            &w,
            NOW + MAX_CLOCK_SKEW_MS,
            NOW + 2 * MAX_CLOCK_SKEW_MS,
            Some(endpoint()),
        ),
    );
    for revoked_id in [w.id(), node.id(), authority.id()] {
        let mut revoked = Revocations::new();
        assert!(revoked.add(&mesh.root, &mesh.revoke(revoked_id.0)).unwrap());
        assert_eq!(
            mesh.verifier(&revoked).instance(&v, "check"),
            Err(TrustError::Revoked)
        );
    }
    // Revocations come only from the root, for this mesh, with a bounded reason.
    let revocation = |by: &Identity, mesh_name: &str, reason: String| {
        Signed::sign(
            by,
            REVOCATION_LABEL,
            &Revocation {
                mesh: mesh_name.into(),
                id: w.id().0,
                issued_at: NOW,
                reason,
            },
        )
        .encode()
    };
    let mut revoked = Revocations::new();
    for (bytes, refused) in [
        (
            revocation(&node, "demo", String::new()),
            TrustError::NotFromRoot,
        ),
        (
            revocation(&mesh.root_key, "prod", String::new()),
            TrustError::WrongMesh,
        ),
        (
            revocation(&mesh.root_key, "demo", "x".repeat(MAX_REASON_LEN + 1)),
            TrustError::TooLarge,
        ),
    ] {
        assert_eq!(revoked.add(&mesh.root, &bytes), Err(refused));
    }
    assert!(revoked.is_empty());
}

/// A filter's revocations only grow: a later, shorter or different list merged in
/// never takes one back.
#[test]
fn merged_revocations_are_never_taken_back() {
    let mesh = Mesh::new();
    let mut held = Revocations::new();
    held.add(&mesh.root, &mesh.revoke([1; 32])).unwrap();
    held.add(&mesh.root, &mesh.revoke([2; 32])).unwrap();
    let mut later = Revocations::new();
    later.add(&mesh.root, &mesh.revoke([2; 32])).unwrap();
    later.add(&mesh.root, &mesh.revoke([3; 32])).unwrap();
    assert_eq!(held.merge(later), 1, "only [3] is new");
    assert_eq!(held.merge(Revocations::new()), 0);
    for id in [[1; 32], [2; 32], [3; 32]] {
        assert!(held.contains(&PeerId(id)), "{id:?}");
    }
    assert_eq!(held.len(), 3);
    // Pages follow the order they arrived in, so a position names the same ones for
    // as long as the set lives (what an agent serves its filters by).
    let page =
        |from, limit| -> Vec<PeerId> { held.page(from, limit).map(|(id, _, _)| *id).collect() };
    assert_eq!(page(0, 2), [PeerId([1; 32]), PeerId([2; 32])]);
    assert_eq!(page(2, 256), [PeerId([3; 32])]);
    assert!(page(3, 256).is_empty() && page(usize::MAX, 1).is_empty());
}

#[test]
fn the_newest_record_wins_and_tombstones_withdraw() {
    let (mesh, node, a, b) = (
        Mesh::new(),
        identity("demo"),
        identity("demo"),
        identity("demo"),
    );
    let none = Revocations::new();
    let v = mesh.verifier(&none);
    let grant = || vec![mesh.grant(&mesh.root_key, "check", &node, false)];
    let at = |w: &Identity, t: u64, ep| {
        v.instance(
            &value(
                grant(),
                record_with(&node, "check", w, t, t + 10 * MINUTE, ep),
            ),
            "check",
        )
        .unwrap()
    };
    let records = [
        at(&a, NOW - 3, Some(endpoint())),
        at(&a, NOW - 2, None),
        at(&b, NOW - 3, None),
        at(&b, NOW - 1, Some(endpoint())),
    ];
    let live = live(records);
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].id, b.id());
}

#[test]
fn one_granted_node_cannot_withdraw_or_redirect_another_nodes_instance() {
    // Both nodes hold a grant for check; the rogue one signs a newer tombstone, then
    // a newer record with its own endpoint, for the honest node's workload (workload
    // keys are public). The honest record stays live.
    let (mesh, honest, rogue, w) = (
        Mesh::new(),
        identity("demo"),
        identity("demo"),
        identity("demo"),
    );
    let none = Revocations::new();
    let v = mesh.verifier(&none);
    let by = |node: &Identity, t: u64, ep| {
        let grants = vec![mesh.grant(&mesh.root_key, "check", node, false)];
        v.instance(
            &value(
                grants,
                record_with(node, "check", &w, t, t + 10 * MINUTE, ep),
            ),
            "check",
        )
        .unwrap()
    };
    let trap: SocketAddr = "127.0.0.66:1".parse().unwrap();
    let good = by(&honest, NOW - 2, Some(endpoint()));
    let tombstone = by(&rogue, NOW + MAX_CLOCK_SKEW_MS - 1, None);
    let redirect = by(&rogue, NOW + MAX_CLOCK_SKEW_MS - 1, Some(trap));
    assert_eq!(live([good.clone(), tombstone]), vec![good.clone()]);
    let both = live([good.clone(), redirect]);
    assert_eq!(both.len(), 2, "each endorser's record stands on its own");
    assert!(both.contains(&good));
}

#[test]
fn roots_and_pem_files_round_trip_and_refuse_garbage() {
    let mesh = Mesh::new();
    let text = mesh.root.to_string();
    assert_eq!(text.parse::<MeshRoot>().unwrap(), mesh.root);
    for bad in [
        "",
        "demo",
        "demo:zz",
        "Demo:00",
        &format!("demo:{}", "0".repeat(63)),
    ] {
        assert!(bad.parse::<MeshRoot>().is_err(), "{bad:?}");
    }
    let node = identity("demo");
    let grant = mesh.grant(&mesh.root_key, "check", &node, false);
    let pem = to_pem(PemKind::Grant, &grant);
    assert!(pem.starts_with("-----BEGIN THEMIS GRANT-----"));
    assert_eq!(from_pem(PemKind::Grant, &pem).unwrap(), grant);
    assert_eq!(
        from_pem(PemKind::Admission, &pem),
        Err(TrustError::Malformed)
    );
    assert_eq!(
        from_pem(PemKind::Grant, "garbage"),
        Err(TrustError::Malformed)
    );
}

/// A file of several credentials (saved revocations, a grant chain, files cat
/// together): every block is read as its label says, the text around them ignored; a
/// block of another label, or cut short, is an error of its own, not the file's.
#[test]
fn pem_blocks_reads_every_block_by_its_label() {
    let key = identity("demo");
    let signed = |label: &str| Signed::sign(&key, label, &"body");
    let (revocation, grant) = (signed(REVOCATION_LABEL), signed(GRANT_LABEL));
    let text = format!(
        "notes\n{}between\n{}{}-----BEGIN OTHER-----\nAAAA\n-----END OTHER-----\n",
        to_pem(PemKind::Revocation, &revocation),
        to_pem(PemKind::Grant, &grant),
        to_pem(PemKind::Revocation, &revocation),
    );
    let blocks = pem_blocks(&text);
    assert_eq!(blocks.len(), 4, "{blocks:?}");
    assert_eq!(blocks[0], Ok((PemKind::Revocation, revocation.clone())));
    assert_eq!(blocks[1], Ok((PemKind::Grant, grant)));
    assert_eq!(blocks[2], Ok((PemKind::Revocation, revocation.clone())));
    assert_eq!(blocks[3], Err(TrustError::Malformed));
    let cut = to_pem(PemKind::Revocation, &revocation);
    assert_eq!(
        pem_blocks(&cut[..cut.len() - 10]),
        [Err(TrustError::Malformed)]
    );
    assert!(pem_blocks("no credentials here").is_empty());
}
