//! Address announcements and endpoint ownership (issue 23): an admitted node says where
//! it is, nobody else can say it for it, and a record's endpoint must be at its
//! endorser's address or in the address range the root granted it (its pods').

use std::net::SocketAddr;

use ring::rand::SystemRandom;
use themis_core::{Identity, MeshName, PeerId};
use themis_trust::*;

const NOW: u64 = 1_800_000_000_000;
const MINUTE: u64 = 60_000;

fn identity(mesh: &str) -> Identity {
    Identity::generate(MeshName::new(mesh).unwrap(), &SystemRandom::new()).unwrap()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn announce(node: &Identity, mesh: &str, address: &str, issued_at: u64) -> Vec<u8> {
    announce_under(node, ANNOUNCEMENT_LABEL, mesh, address, issued_at)
}

fn announce_under(node: &Identity, label: &str, mesh: &str, address: &str, at: u64) -> Vec<u8> {
    let body = Announcement {
        mesh: mesh.into(),
        address: addr(address),
        issued_at: at,
        leaving: false,
        address_range: None,
    };
    Signed::sign(node, label, &body).encode()
}

struct Mesh {
    root_key: Identity,
    root: MeshRoot,
    node: Identity,
    revoked: Revocations,
}

impl Mesh {
    /// The root's grant of `network/prefix_len` to `node`, signed under `label`.
    fn range_under(&self, label: &str, node: &Identity, mesh: &str, net: (&str, u8)) -> Vec<u8> {
        let body = AddressRange {
            mesh: mesh.into(),
            node_key: *node.public_key(),
            network: net.0.parse().unwrap(),
            prefix_len: net.1,
            issued_at: NOW - MINUTE,
            not_after: None,
        };
        Signed::sign(&self.root_key, label, &body).encode()
    }

    fn range(&self, net: (&str, u8)) -> Vec<u8> {
        self.range_under(ADDRESS_RANGE_LABEL, &self.node, "demo", net)
    }

    fn check_range(&self, bytes: &[u8]) -> Result<IpNet, TrustError> {
        let (_, net) = self
            .verifier()
            .address_range(bytes, self.node.public_key())?;
        Ok(net)
    }

    /// The root revokes the node.
    fn revoke_node(&mut self) {
        let revocation = Signed::sign(
            &self.root_key,
            REVOCATION_LABEL,
            &Revocation {
                mesh: "demo".into(),
                id: PeerId::derive(self.node.public_key(), "demo").0,
                issued_at: NOW,
                reason: "node retired".into(),
            },
        )
        .encode();
        self.revoked
            .add(&self.root, &revocation)
            .expect("revocation");
    }

    fn new() -> Mesh {
        let root_key = identity("demo");
        let root = MeshRoot {
            mesh: root_key.mesh().clone(),
            key: *root_key.public_key(),
        };
        Mesh {
            root_key,
            root,
            node: identity("demo"),
            revoked: Revocations::new(),
        }
    }

    fn verifier(&self) -> Verifier<'_> {
        Verifier {
            root: &self.root,
            now_ms: NOW,
            revoked: &self.revoked,
        }
    }

    /// The trust log's admitted node keys: only `self.node` here.
    fn check(&self, bytes: &[u8]) -> Result<Announced, TrustError> {
        let node = *self.node.public_key();
        self.verifier().announcement(bytes, |key| *key == node)
    }

    fn instance_at(&self, endorser: &Identity, endpoint: Option<&str>) -> Instance {
        let workload = identity("demo");
        let grant = Signed::sign(
            &self.root_key,
            GRANT_LABEL,
            &Grant {
                mesh: "demo".into(),
                service: "check".into(),
                grantee: *endorser.public_key(),
                delegate: false,
                issued_at: NOW - MINUTE,
                not_after: None,
            },
        );
        let record = Signed::sign(
            endorser,
            RECORD_LABEL,
            &Record {
                mesh: "demo".into(),
                service: "check".into(),
                workload_key: *workload.public_key(),
                endpoint: endpoint.map(addr),
                metadata: Metadata::new(),
                issued_at: NOW,
                not_after: NOW + 10 * MINUTE,
            },
        );
        let value = InstanceValue {
            grants: vec![grant],
            record,
        };
        self.verifier()
            .instance(&value.encode(), "check")
            .expect("an endorsed instance")
    }
}

#[test]
fn an_admitted_nodes_announcement_verifies_and_names_its_ring_id() {
    let mesh = Mesh::new();
    let bytes = announce(&mesh.node, "demo", "10.77.0.2:7946", NOW);
    let got = mesh.check(&bytes).expect("verifies");
    assert_eq!(got.id, PeerId::derive(mesh.node.public_key(), "demo"));
    assert_eq!(got.announcement.address, addr("10.77.0.2:7946"));
    // What every agent holds per member, beside the member's id (issue 23: ≤ 2 MB for
    // 10,000 members): printed for the figures, bounded here.
    eprintln!("an address announcement encodes to {} bytes", bytes.len());
    assert!(bytes.len() <= 160, "{} bytes", bytes.len());
}

#[test]
fn nobody_but_the_admitted_node_can_announce_it() {
    let mesh = Mesh::new();
    let stranger = identity("demo");
    // A key the log does not admit (a stranger's, a workload's, the root's).
    for key in [&stranger, &mesh.root_key] {
        let bytes = announce(key, "demo", "10.77.0.9:7946", NOW);
        assert_eq!(mesh.check(&bytes), Err(TrustError::NotAdmitted));
    }
    // The node's body with the stranger's signature, and the stranger's body passed
    // off under the node's key.
    let mut forged = Signed::decode(&announce(&mesh.node, "demo", "10.77.0.9:7946", NOW)).unwrap();
    forged.signature = Signed::decode(&announce(&stranger, "demo", "10.77.0.9:7946", NOW))
        .unwrap()
        .signature;
    assert_eq!(mesh.check(&forged.encode()), Err(TrustError::BadSignature));
    // Another kind of statement signed by the node cannot pass as an announcement.
    let other = announce_under(&mesh.node, RECORD_LABEL, "demo", "10.77.0.2:7946", NOW);
    assert_eq!(mesh.check(&other), Err(TrustError::BadSignature));
}

#[test]
fn another_mesh_the_future_and_a_revoked_node_are_refused() {
    let mut mesh = Mesh::new();
    let wrong_mesh = announce(&mesh.node, "prod", "10.77.0.2:7946", NOW);
    assert_eq!(mesh.check(&wrong_mesh), Err(TrustError::WrongMesh));
    let skew = themis_core::delegation::MAX_CLOCK_SKEW_MS;
    let ahead = announce(&mesh.node, "demo", "10.77.0.2:7946", NOW + skew + 1);
    assert_eq!(mesh.check(&ahead), Err(TrustError::FromTheFuture));
    let within = announce(&mesh.node, "demo", "10.77.0.2:7946", NOW + skew);
    assert!(mesh.check(&within).is_ok(), "clock skew is tolerated");

    mesh.revoke_node();
    let bytes = announce(&mesh.node, "demo", "10.77.0.2:7946", NOW);
    assert_eq!(mesh.check(&bytes), Err(TrustError::Revoked));
}

#[test]
fn every_byte_flipped_and_every_truncation_is_refused() {
    let mesh = Mesh::new();
    let bytes = announce(&mesh.node, "demo", "10.77.0.2:7946", NOW);
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x01;
        // A flip may still decode to the same announcement only if it hit nothing
        // signed; every flip here lands in signed, signer or framing bytes.
        assert!(mesh.check(&b).is_err(), "flip at byte {i} accepted");
    }
    for len in 0..bytes.len() {
        assert!(mesh.check(&bytes[..len]).is_err(), "cut at {len} accepted");
    }
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(mesh.check(&long), Err(TrustError::Malformed));
    assert_eq!(mesh.check(&vec![0xff; 4096]), Err(TrustError::Malformed));
}

#[test]
fn a_record_endpoint_must_be_at_its_endorsers_address() {
    let mesh = Mesh::new();
    let announced = mesh
        .check(&announce(&mesh.node, "demo", "10.77.0.2:7946", NOW))
        .expect("verifies");
    let v = mesh.verifier();
    // Its own address, any port (its sidecars' inbound listeners): owned.
    let own = mesh.instance_at(&mesh.node, Some("10.77.0.2:15006"));
    assert_eq!(v.endpoint_owned(&own, &announced, None), Ok(()));
    // Pointed at another node's (or anyone's) address: refused.
    for elsewhere in ["10.77.0.3:15006", "127.0.0.1:15006", "[::1]:15006"] {
        let hijack = mesh.instance_at(&mesh.node, Some(elsewhere));
        assert_eq!(
            v.endpoint_owned(&hijack, &announced, None),
            Err(TrustError::EndpointNotOwned),
            "{elsewhere}"
        );
    }
    // Checked against another node's announcement: refused, whatever the address.
    let other = identity("demo");
    let by_other = mesh.instance_at(&other, Some("10.77.0.2:15006"));
    assert_eq!(
        v.endpoint_owned(&by_other, &announced, None),
        Err(TrustError::EndpointNotOwned)
    );
    // A tombstone names no endpoint.
    let tombstone = mesh.instance_at(&mesh.node, None);
    assert_eq!(v.endpoint_owned(&tombstone, &announced, None), Ok(()));
}

#[test]
fn a_pod_in_the_range_the_root_granted_the_node_is_the_nodes() {
    let mesh = Mesh::new();
    let announced = mesh
        .check(&announce(&mesh.node, "demo", "10.77.0.2:7946", NOW))
        .expect("verifies");
    let range = mesh
        .check_range(&mesh.range(("10.244.1.0", 24)))
        .expect("granted");
    assert_eq!(range.to_string(), "10.244.1.0/24");
    let v = mesh.verifier();
    let pods = [
        "10.244.1.7:15006",
        "10.244.1.255:15006",
        "10.77.0.2:15006",
        "[::ffff:10.244.1.7]:15006",
        "[::ffff:10.77.0.2]:15006",
    ];
    for pod in pods {
        let instance = mesh.instance_at(&mesh.node, Some(pod));
        assert_eq!(
            v.endpoint_owned(&instance, &announced, Some(&range)),
            Ok(()),
            "{pod}"
        );
    }
    // Outside the range (the next one, another node's pods), or a range checked for
    // another node's instance: refused.
    for elsewhere in ["10.244.2.7:15006", "10.244.0.255:15006", "[::1]:15006"] {
        let hijack = mesh.instance_at(&mesh.node, Some(elsewhere));
        assert_eq!(
            v.endpoint_owned(&hijack, &announced, Some(&range)),
            Err(TrustError::EndpointNotOwned),
            "{elsewhere}"
        );
    }
    let other = identity("demo");
    let by_other = mesh.instance_at(&other, Some("10.244.1.7:15006"));
    assert_eq!(
        v.endpoint_owned(&by_other, &announced, Some(&range)),
        Err(TrustError::EndpointNotOwned)
    );
}

#[test]
fn only_the_roots_range_grant_for_this_node_and_mesh_counts() {
    let mut mesh = Mesh::new();
    let net = ("10.244.1.0", 24);
    // Signed by the node itself (a node cannot grant itself addresses), or by a stranger.
    for signer in [&mesh.node, &identity("demo")] {
        let body = AddressRange {
            mesh: "demo".into(),
            node_key: *mesh.node.public_key(),
            network: net.0.parse().unwrap(),
            prefix_len: net.1,
            issued_at: NOW,
            not_after: None,
        };
        let forged = Signed::sign(signer, ADDRESS_RANGE_LABEL, &body).encode();
        assert_eq!(mesh.check_range(&forged), Err(TrustError::NotFromRoot));
    }
    // Another statement of the root's (its label) cannot pass as a range grant.
    let other_label = mesh.range_under(ADMISSION_LABEL, &mesh.node, "demo", net);
    assert_eq!(
        mesh.check_range(&other_label),
        Err(TrustError::BadSignature)
    );
    // For another mesh, or another node (presented by this one).
    let other_mesh = mesh.range_under(ADDRESS_RANGE_LABEL, &mesh.node, "prod", net);
    assert_eq!(mesh.check_range(&other_mesh), Err(TrustError::WrongMesh));
    let theirs = mesh.range_under(ADDRESS_RANGE_LABEL, &identity("demo"), "demo", net);
    assert_eq!(mesh.check_range(&theirs), Err(TrustError::WrongKey));
    // Not a range: host bits set, a prefix longer than the family has; or broader
    // than a node is granted (it would take every endpoint in it from every node).
    let bad_ranges = [
        ("10.244.1.7", 24),
        ("10.244.1.0", 33),
        ("::", 129),
        ("10.0.0.0", 7),
        ("0.0.0.0", 0),
        ("2001:db8::", 31),
    ];
    for bad in bad_ranges {
        assert_eq!(
            mesh.check_range(&mesh.range(bad)),
            Err(TrustError::Malformed),
            "{bad:?}"
        );
    }
    // Expired, from the future.
    let dated = |issued_at, not_after| {
        let body = AddressRange {
            mesh: "demo".into(),
            node_key: *mesh.node.public_key(),
            network: net.0.parse().unwrap(),
            prefix_len: net.1,
            issued_at,
            not_after,
        };
        Signed::sign(&mesh.root_key, ADDRESS_RANGE_LABEL, &body).encode()
    };
    assert_eq!(
        mesh.check_range(&dated(NOW - MINUTE, Some(NOW))),
        Err(TrustError::Expired)
    );
    let skew = MAX_CLOCK_SKEW_MS;
    assert_eq!(
        mesh.check_range(&dated(NOW + skew + 1, None)),
        Err(TrustError::FromTheFuture)
    );
    // Every flipped byte, every cut, oversize input.
    let bytes = mesh.range(net);
    for i in 0..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x01;
        assert!(mesh.check_range(&b).is_err(), "flip at byte {i} accepted");
    }
    for len in 0..bytes.len() {
        assert!(
            mesh.check_range(&bytes[..len]).is_err(),
            "cut at {len} accepted"
        );
    }
    assert_eq!(
        mesh.check_range(&vec![0xff; 4096]),
        Err(TrustError::Malformed)
    );
    // A revoked node's range no longer counts.
    mesh.revoke_node();
    assert_eq!(mesh.check_range(&bytes), Err(TrustError::Revoked));
}
