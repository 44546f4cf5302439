//! What the full membership costs an agent in memory (issue 23 sets ≤ 2 MB per node at
//! 10,000 members): a roster of 10,000 admitted members — the admissions in the
//! agent's trust log, as in a mesh whose agents hold it, each member's signed address
//! announcement heard by gossip — and the routing membership made from it, measured
//! with a counting allocator. The figures are printed (`--nocapture`) for
//! benchmarks/RESULTS.md, with the trust log's own (which every agent holds anyway,
//! §6.13). The bound asserted is the target's; the figure is about 192 bytes a member:
//! a packed member (key, signature, date, address: 128 bytes) and its routing contact
//! (id and address: 64).

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};

use ring::rand::SystemRandom;
use themis_agent::roster::{Credentials, LogMembership, Roster};
use themis_core::{Identity, MeshName};
use themis_log::{Entry, Kind, Log};
use themis_trust::{
    Admission, Announcement, MeshRoot, Revocations, Signed, Verifier, ADMISSION_LABEL,
    ANNOUNCEMENT_LABEL,
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

#[test]
fn what_the_membership_of_ten_thousand_members_holds() {
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
            let address = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 7946));
            let announcement = Announcement {
                mesh: "demo".into(),
                address,
                issued_at: now - 1,
                leaving: false,
                address_range: None,
            };
            let admission = Signed::sign(&root_key, ADMISSION_LABEL, &admission);
            log.append(Entry::new(Kind::Admission, admission).encode())
                .unwrap();
            Credentials {
                admission: None,
                announcement: Signed::sign(&node, ANNOUNCEMENT_LABEL, &announcement).encode(),
                address_range: None,
            }
        })
        .collect();

    let before = LIVE.load(Ordering::Relaxed);
    let mut roster = Roster::default();
    roster.set_log(LogMembership {
        admissions: log
            .statements()
            .filter_map(|(_, s)| match s {
                themis_log::Statement::Admission(a) => Some((a.node_key, a.not_after)),
                _ => None,
            })
            .collect(),
        ranges: Default::default(),
    });
    for credentials in &offered {
        assert_eq!(roster.offer(&verifier, credentials), Ok(true));
    }
    let roster_bytes = LIVE.load(Ordering::Relaxed) - before;
    let members = roster.members(&verifier);
    let with_membership = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(members.len(), MEMBERS);
    let per = |bytes: isize| bytes as f64 / MEMBERS as f64;
    // The trust log the agent holds anyway, measured the same way.
    let before_log = LIVE.load(Ordering::Relaxed);
    let copy = log.clone();
    let log_bytes = LIVE.load(Ordering::Relaxed) - before_log;
    drop(copy);
    eprintln!(
        "{MEMBERS} members: the roster holds {:.2} MB ({:.0} B/member), with the routing \
         membership {:.2} MB ({:.0} B/member); an announcement as sent {} B; the trust \
         log of their {MEMBERS} admissions {:.2} MB",
        roster_bytes as f64 / 1e6,
        per(roster_bytes),
        with_membership as f64 / 1e6,
        per(with_membership),
        offered[0].announcement.len(),
        log_bytes as f64 / 1e6,
    );
    assert!(
        with_membership <= 2_000_000,
        "{with_membership} bytes held for {MEMBERS} members"
    );
}
