//! What one endpoint check costs an agent at 10,000 members, each granted a pod range
//! (`Roster::check_endpoint`, run for every record an agent stores or resolves): the
//! roster holds each member packed and scans the others for a competing claim.

use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};

use criterion::{criterion_group, criterion_main, Criterion};
use ring::rand::SystemRandom;
use themis_agent::roster::{Credentials, LogMembership, RangeGrant, Roster};
use themis_core::{Identity, MeshName};
use themis_trust::{
    Announcement, IpNet, MeshRoot, Revocations, Signed, Verifier, ANNOUNCEMENT_LABEL,
};

const MEMBERS: u32 = 10_000;
const NOW: u64 = 1_800_000_000_000;

fn check_endpoint(c: &mut Criterion) {
    let mesh = MeshName::new("demo").unwrap();
    let random = SystemRandom::new();
    // The log's statements are given (no root signature is checked here): the root's
    // key is never used.
    let root = MeshRoot {
        mesh: mesh.clone(),
        key: [0; 32],
    };
    let revoked = Revocations::new();
    let verifier = Verifier {
        root: &root,
        now_ms: NOW,
        revoked: &revoked,
    };
    // What the trust log says (every node admitted, a /26 of pods each), and each
    // node's announcement binding its grant.
    let mut log = LogMembership::default();
    let mut offered = Vec::new();
    for i in 0..MEMBERS {
        let node = Identity::generate(mesh.clone(), &random).unwrap();
        let key = *node.public_key();
        let [_, _, hi, lo] = i.to_be_bytes();
        let pods = IpAddr::from([
            10,
            128 + (hi >> 2),
            ((hi & 3) << 6) | (lo >> 2),
            (lo & 3) << 6,
        ]);
        let digest = *ring::digest::digest(&ring::digest::SHA256, &i.to_be_bytes())
            .as_ref()
            .first_chunk()
            .unwrap();
        let grant = RangeGrant {
            net: IpNet::new(pods, 26).unwrap(),
            not_after: None,
            issued_at: NOW - 1,
        };
        log.admissions.push((key, None));
        log.ranges.push((key, (digest, grant)));
        let announcement = Announcement {
            mesh: "demo".into(),
            address: SocketAddr::from(([10, 0, hi, lo], 7946)),
            issued_at: NOW - 1,
            leaving: false,
            address_range: Some(digest),
        };
        offered.push(Credentials {
            admission: None,
            announcement: Signed::sign(&node, ANNOUNCEMENT_LABEL, &announcement).encode(),
            address_range: None,
        });
    }
    let first = Signed::decode(&offered[0].announcement).unwrap().signer;
    let mut roster = Roster::default();
    roster.set_log(log, &verifier);
    for credentials in &offered {
        assert_eq!(roster.offer(&verifier, credentials), Ok(true));
    }

    let mut group = c.benchmark_group("check_endpoint_10k_ranged_members");
    let cases = [
        ("pod_in_own_range", [10, 128, 0, 1], true),
        ("own_announced_address", [10, 0, 0, 0], true),
        ("address_of_nobody", [192, 0, 2, 1], false),
    ];
    for (name, ip, owned) in cases {
        let endpoint = Some(SocketAddr::from((ip, 15006)));
        assert_eq!(
            roster.check_endpoint(&first, endpoint, &verifier).is_ok(),
            owned
        );
        group.bench_function(name, |b| {
            b.iter(|| black_box(roster.check_endpoint(&first, black_box(endpoint), &verifier)))
        });
    }
    group.finish();
}

criterion_group!(benches, check_endpoint);
criterion_main!(benches);
