//! What the full membership costs an agent in memory (issue 23 sets ≤ 2 MB per node at
//! 10,000 members): a roster of 10,000 admitted members — the admissions in the
//! agent's trust log, as in a mesh whose agents hold it, each member's signed address
//! announcement heard by gossip — and the routing membership made from it, measured
//! with a counting allocator; then the same with a pod range granted to every node (as
//! on Kubernetes). The figures are printed (`--nocapture`) for benchmarks/RESULTS.md,
//! with the trust log's own (which every agent holds anyway, §6.13). The bounds asserted
//! are the target's for the mesh without ranges — about 196 bytes a member, a packed
//! member (key, signature, date, address: 128 bytes), its routing contact (id and
//! address: 64) and its place in the index of claims endpoint checks use (4) — and,
//! with ranges, 312: the log's newest grant per node, held once (docs/PROTOCOL.md
//! §6.14), and its place in that index, whether the grants reach the roster with the
//! log or after the members (the room they took meanwhile is given back).

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};

use ring::rand::SystemRandom;
use themis_agent::roster::{Credentials, LogMembership, Roster};
use themis_agent::trust_log::TrustLog;
use themis_core::{Identity, MeshName};
use themis_log::{Entry, Kind, Log};
use themis_trust::{
    grant_digest, AddressRange, Admission, Announcement, MeshRoot, Revocations, Signed, Verifier,
    ADDRESS_RANGE_LABEL, ADMISSION_LABEL, ANNOUNCEMENT_LABEL,
};

/// Bytes allocated and not yet freed, by everything in this test binary.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MEMBERS: usize = 10_000;

/// When the range grants reach the roster: with the admissions (the log first, as in
/// a mesh that has run a while), or after every member's announcement (a new agent
/// whose first pulls bring the roster before its log has the grants).
#[derive(Clone, Copy)]
enum Grants {
    WithTheLog,
    AfterTheMembers,
}

/// What one agent holds for a mesh of [`MEMBERS`] nodes, each granted a pod range or
/// not: (the roster, with the routing membership, the trust log).
fn measure(with_ranges: bool, grants: Grants) -> (isize, isize, isize) {
    let mesh = MeshName::new("demo").unwrap();
    let random = SystemRandom::new();
    let root_key = Identity::generate(mesh.clone(), &random).unwrap();
    let root = MeshRoot {
        mesh: mesh.clone(),
        key: *root_key.public_key(),
    };
    let revoked = Revocations::new();
    let now = 1_800_000_000_000;
    let verifier = Verifier {
        root: &root,
        now_ms: now,
        revoked: &revoked,
    };
    let mut log = Log::new(root.clone());
    let offered: Vec<Credentials> = (0..MEMBERS)
        .map(|i| {
            let node = Identity::generate(mesh.clone(), &random).unwrap();
            let admission = Admission {
                mesh: "demo".into(),
                node_key: *node.public_key(),
                issued_at: now - 1,
                not_after: None,
            };
            let admission = Signed::sign(&root_key, ADMISSION_LABEL, &admission);
            log.append(Entry::new(Kind::Admission, admission).encode())
                .unwrap();
            let [_, _, hi, lo] = (i as u32).to_be_bytes();
            let range = with_ranges.then(|| {
                let grant = AddressRange {
                    mesh: "demo".into(),
                    node_key: *node.public_key(),
                    network: std::net::IpAddr::from([
                        10,
                        128 + (hi >> 2),
                        ((hi & 3) << 6) | (lo >> 2),
                        (lo & 3) << 6,
                    ]),
                    prefix_len: 26,
                    issued_at: now - 1,
                    not_after: None,
                };
                let grant = Signed::sign(&root_key, ADDRESS_RANGE_LABEL, &grant);
                log.append(Entry::new(Kind::AddressRange, grant.clone()).encode())
                    .unwrap();
                grant_digest(&grant.encode())
            });
            let announcement = Announcement {
                mesh: "demo".into(),
                address: SocketAddr::from(([10, 0, hi, lo], 7946)),
                issued_at: now - 1,
                leaving: false,
                address_range: range,
            };
            Credentials {
                admission: None,
                announcement: Signed::sign(&node, ANNOUNCEMENT_LABEL, &announcement).encode(),
                address_range: None,
            }
        })
        .collect();
    log.sign_checkpoint(&root_key, now);
    // The agent's own copy of the log, and what it says of the membership.
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("trust-log.bin"), log.to_copy().unwrap()).unwrap();
    let trust_log = TrustLog::load(Some(state.path()), root.clone());

    // What the roster keeps (what the log says is made and dropped within).
    let before = LIVE.load(Ordering::Relaxed);
    let from_log = trust_log.membership();
    assert_eq!(from_log.admissions.len(), MEMBERS);
    assert_eq!(from_log.ranges.len(), if with_ranges { MEMBERS } else { 0 });
    let mut roster = Roster::default();
    // The grants reach the roster with the log, or only after every member.
    let (first, later) = match grants {
        Grants::WithTheLog => (from_log, None),
        Grants::AfterTheMembers => {
            let admissions_only = LogMembership {
                admissions: from_log.admissions.clone(),
                ranges: Vec::new(),
            };
            (admissions_only, Some(from_log))
        }
    };
    roster.set_log(first, &verifier);
    for credentials in &offered {
        assert_eq!(roster.offer(&verifier, credentials), Ok(true));
    }
    if let Some(log) = later {
        roster.set_log(log, &verifier);
    }
    // What the agent does every gossip period: forget what no longer counts (and
    // give back the room the vectors grew by), make the routing membership; and
    // checks of endpoints, whose index of claims (4 bytes a member and a range) is
    // then held too.
    assert_eq!(roster.prune(&verifier), 0);
    let owner = Signed::decode(&offered[0].announcement).unwrap().signer;
    let own_address = SocketAddr::from(([10, 0, 0, 0], 15006));
    assert_eq!(
        roster.check_endpoint(&owner, Some(own_address), &verifier),
        Ok(())
    );
    if with_ranges {
        let first_pod = SocketAddr::from(([10, 128, 0, 1], 15006));
        assert_eq!(
            roster.check_endpoint(&owner, Some(first_pod), &verifier),
            Ok(())
        );
    }
    let roster_bytes = LIVE.load(Ordering::Relaxed) - before;
    let members = roster.members(&verifier);
    let with_membership = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(members.len(), MEMBERS);
    // The trust log the agent holds anyway, measured the same way.
    let before_log = LIVE.load(Ordering::Relaxed);
    let copy = log.clone();
    let log_bytes = LIVE.load(Ordering::Relaxed) - before_log;
    drop(copy);
    (roster_bytes, with_membership, log_bytes)
}

#[test]
fn what_the_membership_of_ten_thousand_members_holds() {
    let per = |bytes: isize| bytes as f64 / MEMBERS as f64;
    let mb = |bytes: isize| bytes as f64 / 1e6;
    // One after the other: the allocator's count is the whole binary's.
    let plain = measure(false, Grants::WithTheLog);
    let pods = measure(true, Grants::WithTheLog);
    let pods_late = measure(true, Grants::AfterTheMembers);
    for ((roster, with_membership, log), what) in [
        (plain, "no pod ranges"),
        (pods, "a pod range each"),
        (pods_late, "a pod range each, the grants after the members"),
    ] {
        eprintln!(
            "{MEMBERS} members, {what}: the roster holds {:.2} MB ({:.0} B/member), with the \
             routing membership {:.2} MB ({:.0} B/member); the trust log {:.2} MB",
            mb(roster),
            per(roster),
            mb(with_membership),
            per(with_membership),
            mb(log),
        );
    }
    assert!(
        plain.1 <= 2_000_000,
        "{} bytes held for {MEMBERS} members",
        plain.1
    );
    // With ranges, each node's newest grant is held once, packed (key, digest, range:
    // 112 bytes), and not again beside the member that binds it, with its place in
    // the index of claims: 312 bytes a member. Two hash maps held it at 562.
    for (held, what) in [(pods.1, "with the log"), (pods_late.1, "after the members")] {
        assert!(
            held <= 3_200_000,
            "{held} bytes held for {MEMBERS} members with a pod range each, the grants {what}"
        );
    }
}
