//! The mesh's full membership as this agent knows it (issue 23, docs/PROTOCOL.md
//! §6.14): every admitted node with the address it signed itself. One-hop routing
//! computes replica holders from it (`themis_dht::Members`), and gossip carries it.
//!
//! An entry is a pair of credentials any agent checks offline: the node's root-signed
//! admission and its own address announcement. Nobody can place another node, and the
//! newest announcement of a node wins. Sans-IO: time and revocations come in through
//! the [`Verifier`].

use std::collections::BTreeMap;
use std::net::SocketAddr;

use ring::digest::{Context, SHA256};
use themis_dht::{Contact, Key, Members};
use themis_trust::{Announced, Announcement, Signed, TrustError, Verifier};

/// The most members a roster holds (and a gossip answer carries: about 560 KiB at
/// most). A mesh larger than this needs paged roster answers (not built).
pub const MAX_MEMBERS: usize = 2048;

/// One member's credentials, as they travel: its admission and its announcement.
pub type Credentials = (Vec<u8>, Vec<u8>);

#[derive(Debug, Clone)]
struct Entry {
    announced: Announced,
    /// The admission's `not_after`, kept so that listing members needs no signature.
    not_after: Option<u64>,
    credentials: Credentials,
}

/// The members, by node key.
#[derive(Debug, Default)]
pub struct Roster {
    entries: BTreeMap<[u8; 32], Entry>,
}

impl Roster {
    /// Takes one member's credentials if they verify and are newer than what is held
    /// for that node. Returns whether the roster changed.
    pub fn offer(
        &mut self,
        verifier: &Verifier<'_>,
        admission: &[u8],
        announcement: &[u8],
    ) -> Result<bool, TrustError> {
        let signed = Signed::decode(announcement)?;
        let key = signed.signer;
        // What is held already costs no signature check: a gossip answer carries
        // every member, and all but the changed ones are the same.
        let claimed = Announcement::decode(&signed.body)?;
        if self
            .entries
            .get(&key)
            .is_some_and(|held| held.announced.announcement.issued_at >= claimed.issued_at)
        {
            return Ok(false);
        }
        let admitted = verifier.admission(admission, &key)?;
        let announced = verifier.announcement(announcement, |k| *k == key)?;
        if let Some(held) = self.entries.get(&key) {
            if held.announced.announcement.issued_at >= announced.announcement.issued_at {
                return Ok(false);
            }
        } else if self.entries.len() >= MAX_MEMBERS {
            return Err(TrustError::TooLarge);
        }
        self.entries.insert(
            key,
            Entry {
                announced,
                not_after: admitted.not_after,
                credentials: (admission.to_vec(), announcement.to_vec()),
            },
        );
        Ok(true)
    }

    /// The members one-hop routing uses now: not leaving, admission not expired, key
    /// not revoked.
    pub fn members(&self, verifier: &Verifier<'_>) -> Members<SocketAddr> {
        Members::new(
            self.entries
                .iter()
                .filter(|(key, e)| {
                    !e.announced.announcement.leaving
                        && e.not_after.is_none_or(|t| t > verifier.now_ms)
                        && !verifier.revoked.contains_key(verifier.root, key)
                })
                .map(|(_, e)| Contact {
                    id: Key(e.announced.id.0),
                    addr: e.announced.announcement.address,
                }),
        )
    }

    /// A summary two agents compare to see whether their rosters differ: SHA-256 over
    /// every (node key, announcement date), in key order.
    pub fn digest(&self) -> [u8; 32] {
        let mut ctx = Context::new(&SHA256);
        for (key, e) in &self.entries {
            ctx.update(key);
            ctx.update(&e.announced.announcement.issued_at.to_be_bytes());
        }
        ctx.finish().as_ref().try_into().expect("32 bytes")
    }

    /// Every member's credentials (what a gossip answer carries).
    pub fn credentials(&self) -> Vec<Credentials> {
        self.entries
            .values()
            .map(|e| e.credentials.clone())
            .collect()
    }

    /// The credentials held for the node with this key.
    pub fn get(&self, key: &[u8; 32]) -> Option<&Credentials> {
        self.entries.get(key).map(|e| &e.credentials)
    }

    /// How many members are held (leaving ones included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What the node with this key announced, checked.
    pub fn announced(&self, key: &[u8; 32]) -> Option<&Announced> {
        self.entries.get(key).map(|e| &e.announced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use themis_core::{Identity, MeshName};
    use themis_trust::{
        Admission, Announcement, MeshRoot, Revocation, Revocations, ADMISSION_LABEL,
        ANNOUNCEMENT_LABEL, REVOCATION_LABEL,
    };

    const NOW: u64 = 1_800_000_000_000;

    fn identity() -> Identity {
        Identity::generate(MeshName::new("demo").unwrap(), &SystemRandom::new()).unwrap()
    }

    struct Mesh {
        root_key: Identity,
        root: MeshRoot,
        revoked: Revocations,
    }

    impl Mesh {
        fn new() -> Mesh {
            let root_key = identity();
            let root = MeshRoot {
                mesh: root_key.mesh().clone(),
                key: *root_key.public_key(),
            };
            Mesh {
                root_key,
                root,
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

        fn admit(&self, node: &Identity, not_after: Option<u64>) -> Vec<u8> {
            let body = Admission {
                mesh: "demo".into(),
                node_key: *node.public_key(),
                issued_at: NOW - 1,
                not_after,
            };
            Signed::sign(&self.root_key, ADMISSION_LABEL, &body).encode()
        }
    }

    fn announce(node: &Identity, address: &str, issued_at: u64, leaving: bool) -> Vec<u8> {
        let body = Announcement {
            mesh: "demo".into(),
            address: address.parse().unwrap(),
            issued_at,
            leaving,
        };
        Signed::sign(node, ANNOUNCEMENT_LABEL, &body).encode()
    }

    #[test]
    fn an_admitted_node_is_a_member_at_its_newest_address() {
        let mesh = Mesh::new();
        let node = identity();
        let mut roster = Roster::default();
        let admission = mesh.admit(&node, None);
        let v = mesh.verifier();
        assert_eq!(
            roster.offer(
                &v,
                &admission,
                &announce(&node, "127.0.0.1:7001", NOW - 10, false)
            ),
            Ok(true)
        );
        let before = roster.digest();
        // An older one changes nothing; a newer one moves the node.
        let old = announce(&node, "127.0.0.1:7000", NOW - 20, false);
        assert_eq!(roster.offer(&v, &admission, &old), Ok(false));
        assert_eq!(roster.digest(), before);
        let new = announce(&node, "127.0.0.1:7002", NOW, false);
        assert_eq!(roster.offer(&v, &admission, &new), Ok(true));
        assert_ne!(roster.digest(), before);
        let members = roster.members(&v);
        assert_eq!(members.len(), 1);
        let me = members.iter().next().unwrap();
        assert_eq!(me.id, Key(node.id().0));
        assert_eq!(me.addr, "127.0.0.1:7002".parse().unwrap());
    }

    #[test]
    fn nobody_can_place_a_node_but_the_node_under_its_own_admission() {
        let mesh = Mesh::new();
        let (node, other, stranger) = (identity(), identity(), identity());
        let mut roster = Roster::default();
        let v = mesh.verifier();
        let at = |who: &Identity| announce(who, "127.0.0.1:7001", NOW, false);
        // Another node's admission with a stranger's announcement; a self-made
        // "admission"; a foreign root's.
        assert_eq!(
            roster.offer(&v, &mesh.admit(&node, None), &at(&stranger)),
            Err(TrustError::WrongKey)
        );
        let self_made = Signed::sign(
            &stranger,
            ADMISSION_LABEL,
            &Admission {
                mesh: "demo".into(),
                node_key: *stranger.public_key(),
                issued_at: NOW,
                not_after: None,
            },
        )
        .encode();
        assert_eq!(
            roster.offer(&v, &self_made, &at(&stranger)),
            Err(TrustError::NotFromRoot)
        );
        let foreign = Mesh::new();
        assert_eq!(
            roster.offer(&v, &foreign.admit(&other, None), &at(&other)),
            Err(TrustError::NotFromRoot)
        );
        assert!(roster.is_empty());
    }

    #[test]
    fn leaving_expired_and_revoked_nodes_are_not_members() {
        let mut mesh = Mesh::new();
        let (leaving, expired, revoked, staying) = (identity(), identity(), identity(), identity());
        let mut roster = Roster::default();
        {
            let v = mesh.verifier();
            for (node, not_after, bye) in [
                (&leaving, None, true),
                (&expired, Some(NOW + 1_000), false),
                (&revoked, None, false),
                (&staying, None, false),
            ] {
                let offered = roster.offer(
                    &v,
                    &mesh.admit(node, not_after),
                    &announce(node, "127.0.0.1:1", NOW, bye),
                );
                assert_eq!(offered, Ok(true));
            }
        }
        let revocation = Signed::sign(
            &mesh.root_key,
            REVOCATION_LABEL,
            &Revocation {
                mesh: "demo".into(),
                id: revoked.id().0,
                issued_at: NOW,
                reason: "test".into(),
            },
        )
        .encode();
        let root = mesh.root.clone();
        mesh.revoked.add(&root, &revocation).unwrap();
        let later = Verifier {
            now_ms: NOW + 2_000,
            ..mesh.verifier()
        };
        let members: Vec<Key> = roster.members(&later).iter().map(|c| c.id).collect();
        assert_eq!(members, vec![Key(staying.id().0)]);
        // The revoked node cannot come back with a newer announcement.
        let again = announce(&revoked, "127.0.0.1:2", NOW + 1, false);
        assert_eq!(
            roster.offer(&later, &mesh.admit(&revoked, None), &again),
            Err(TrustError::Revoked)
        );
    }

    #[test]
    fn the_roster_is_bounded() {
        let mesh = Mesh::new();
        let v = mesh.verifier();
        let mut roster = Roster::default();
        for _ in 0..MAX_MEMBERS {
            let node = identity();
            let offered = roster.offer(
                &v,
                &mesh.admit(&node, None),
                &announce(&node, "127.0.0.1:1", NOW, false),
            );
            assert_eq!(offered, Ok(true));
        }
        let one_more = identity();
        assert_eq!(
            roster.offer(
                &v,
                &mesh.admit(&one_more, None),
                &announce(&one_more, "127.0.0.1:1", NOW, false)
            ),
            Err(TrustError::TooLarge)
        );
        assert_eq!(roster.credentials().len(), MAX_MEMBERS);
    }
}
