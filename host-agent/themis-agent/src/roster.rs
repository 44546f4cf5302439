//! The mesh's full membership as this agent knows it (issue 23, docs/PROTOCOL.md
//! §6.14): every admitted node with the address it signed itself. One-hop routing
//! computes replica holders from it (`themis_dht::Members`), and gossip carries it.
//!
//! An entry is credentials any agent checks offline: the node's root-signed admission,
//! its own address announcement and, on Kubernetes, the root's grant of its pod range
//! ([`themis_trust::AddressRange`]). Nobody can place another node, and the
//! newest announcement of a node wins. Announcements are dated: one older than
//! [`ANNOUNCEMENT_LIFETIME_MS`] no longer counts (a node re-announces at half that), so
//! a node that died without its farewell leaves the membership by itself, believing
//! no peer about it. Sans-IO: time and revocations come in through the [`Verifier`].
//!
//! Checking is apart from holding ([`Roster::check`] then [`Roster::insert`]), so a
//! caller verifies signatures without holding the roster's lock.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use ring::digest::{Context, SHA256};
use serde::{Deserialize, Serialize};
use themis_core::PeerId;
use themis_dht::{Contact, Key, Members};
use themis_trust::{grant_digest, Announced, Announcement, IpNet, Signed, TrustError, Verifier};

/// The most members a roster holds (the scale is 10,000 nodes).
pub const MAX_MEMBERS: usize = 16_384;

/// The most members one gossip answer carries (about 430 KiB with address ranges);
/// a larger roster is fetched in pages, in node-key order ([`Roster::missing`]).
pub const PAGE: usize = 1024;

/// The buckets a roster is cut into for comparing ([`Roster::bucket_digests`]): at
/// 10,000 members about 40 in each.
pub const BUCKETS: usize = 256;

/// One bucket's summary: the first 8 bytes of its SHA-256.
pub type BucketDigest = [u8; 8];

/// What an agent holds of one bucket, sent so that a peer sends only the rest
/// ([`Roster::missing`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketHave {
    /// The bucket: the first byte of its members' node keys.
    pub bucket: u8,
    /// Each member held: node key and announcement date.
    pub members: Vec<([u8; 32], u64)>,
}

/// SHA-256 over the bucket digests: the whole roster's summary.
pub fn top_digest(buckets: &[BucketDigest]) -> [u8; 32] {
    let mut ctx = Context::new(&SHA256);
    for b in buckets {
        ctx.update(b);
    }
    ctx.finish().as_ref().try_into().expect("32 bytes")
}

/// How long an announcement counts; nodes announce again at half of it.
pub const ANNOUNCEMENT_LIFETIME_MS: u64 = 3_600_000;

/// A node's next announcement is taken no sooner than this after the one held (unless
/// it says the node is leaving, or back): a member re-announcing in a loop cannot
/// make every roster change, and every agent gossip, in a loop.
pub const MIN_REANNOUNCE_MS: u64 = 5_000;

/// One member's credentials, as they travel (encoded `Signed` statements).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// The root's admission of the node key.
    pub admission: Vec<u8>,
    /// The node's own address announcement.
    pub announcement: Vec<u8>,
    /// The root's grant of addresses to the node (its pod range), if it has one.
    pub address_range: Option<Vec<u8>>,
}

/// A member's checked credentials, ready to be held.
#[derive(Debug, Clone)]
pub struct Entry {
    key: [u8; 32],
    announced: Announced,
    /// The admission's `not_after`, kept so that listing members needs no signature.
    not_after: Option<u64>,
    /// The granted range, its `not_after` and when the root signed it.
    range: Option<(IpNet, Option<u64>, u64)>,
    credentials: Credentials,
}

impl Entry {
    /// The range the root granted this member, while it holds: not expired, and no
    /// newer grant for the node in the trust log (`newest`: the newest grant's date
    /// per node key) — a newer grant, even a narrower one, withdraws it.
    fn range(&self, verifier: &Verifier<'_>, newest: &HashMap<[u8; 32], u64>) -> Option<&IpNet> {
        self.range
            .as_ref()
            .filter(|(_, not_after, issued_at)| {
                not_after.is_none_or(|t| t > verifier.now_ms)
                    && newest.get(&self.key).is_none_or(|n| *n <= *issued_at)
            })
            .map(|(net, _, _)| net)
    }

    /// Where one-hop routing reaches this member.
    fn contact(&self) -> Contact<SocketAddr> {
        Contact {
            id: Key(self.announced.id.0),
            addr: self.announced.announcement.address,
        }
    }
}

/// The members, by node key.
#[derive(Debug, Default)]
pub struct Roster {
    entries: BTreeMap<[u8; 32], Entry>,
    /// The date of the newest address range grant per node key in the trust log
    /// ([`Roster::set_newest_ranges`]): an older grant no longer counts.
    newest_ranges: HashMap<[u8; 32], u64>,
}

impl Roster {
    /// Whether the roster would take this (decoded) announcement: from its unchecked
    /// date alone, with no signature checked (a gossip answer carries every member,
    /// nearly all unchanged). `Ok(false)`: nothing to do.
    pub fn wants(&self, signed: &Signed) -> Result<bool, TrustError> {
        let claimed = Announcement::decode(&signed.body)?;
        match self.entries.get(&signed.signer) {
            None if self.entries.len() >= MAX_MEMBERS => Err(TrustError::TooLarge),
            None => Ok(true),
            Some(held) => Ok(newer(&held.announced.announcement, &claimed)),
        }
    }

    /// Checks one member's credentials: the root's admission of the key that signed
    /// the announcement, the announcement itself, and the root's range grant for that
    /// key if one comes along. Holds no state: call it without the roster's lock, then
    /// [`Roster::insert`].
    pub fn check(verifier: &Verifier<'_>, credentials: &Credentials) -> Result<Entry, TrustError> {
        let key = Signed::decode(&credentials.announcement)?.signer;
        let admitted = verifier.admission(&credentials.admission, &key)?;
        let announced = verifier.announcement(&credentials.announcement, |k| *k == key)?;
        let given = credentials.address_range.as_deref();
        if announced.announcement.address_range != given.map(grant_digest) {
            return Err(TrustError::UnboundRange);
        }
        // An expired range no longer counts; the node stays a member.
        let range = match given.map(|bytes| verifier.address_range(bytes, &key)) {
            Some(Ok((range, net))) => Some((net, range.not_after, range.issued_at)),
            Some(Err(TrustError::Expired)) | None => None,
            Some(Err(error)) => return Err(error),
        };
        Ok(Entry {
            key,
            announced,
            not_after: admitted.not_after,
            range,
            credentials: credentials.clone(),
        })
    }

    /// The trust log's newest address range grant per node key (its `issued_at`):
    /// from now on a node's range counts only if it is that one or newer, so the root
    /// withdraws or narrows a range by granting the node a new one.
    pub fn set_newest_ranges(&mut self, newest: HashMap<[u8; 32], u64>) {
        self.newest_ranges = newest;
    }

    /// Holds a checked entry if it is newer than what is held for that node (see
    /// [`MIN_REANNOUNCE_MS`]). Returns whether the roster changed.
    pub fn insert(&mut self, entry: Entry) -> Result<bool, TrustError> {
        match self.entries.get(&entry.key) {
            Some(held) if !newer(&held.announced.announcement, &entry.announced.announcement) => {
                return Ok(false)
            }
            None if self.entries.len() >= MAX_MEMBERS => return Err(TrustError::TooLarge),
            _ => {}
        }
        self.entries.insert(entry.key, entry);
        Ok(true)
    }

    /// [`Roster::check`] then [`Roster::insert`], for callers that hold no lock.
    pub fn offer(
        &mut self,
        verifier: &Verifier<'_>,
        credentials: &Credentials,
    ) -> Result<bool, TrustError> {
        if !self.wants(&Signed::decode(&credentials.announcement)?)? {
            return Ok(false);
        }
        self.insert(Roster::check(verifier, credentials)?)
    }

    /// Forgets the entries that no longer count: revoked keys, expired admissions,
    /// announcements past their lifetime. Returns how many went.
    pub fn prune(&mut self, verifier: &Verifier<'_>) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, e| current(e, verifier));
        before - self.entries.len()
    }

    /// The members one-hop routing uses now: current (see [`Roster::prune`]) and not
    /// leaving.
    pub fn members(&self, verifier: &Verifier<'_>) -> Members<SocketAddr> {
        Members::new(
            self.entries
                .values()
                .filter(|e| current(e, verifier) && !e.announced.announcement.leaving)
                .map(Entry::contact),
        )
    }

    /// A summary two agents compare to see whether their rosters differ: SHA-256 over
    /// the [`Roster::bucket_digests`]. Entries one agent still holds and another
    /// refused (revoked, expired) do not count, so two agents that agree on the
    /// members agree on the digest.
    pub fn digest(&self, verifier: &Verifier<'_>) -> [u8; 32] {
        top_digest(&self.bucket_digests(verifier))
    }

    /// The roster cut into [`BUCKETS`] by the first byte of the node key, each
    /// summarised by the first 8 bytes of SHA-256 over its current (node key,
    /// announcement date) in key order. Two agents whose rosters differ in a few
    /// members compare these and exchange only the buckets that differ.
    pub fn bucket_digests(&self, verifier: &Verifier<'_>) -> Vec<BucketDigest> {
        let mut digests = Vec::with_capacity(BUCKETS);
        let mut entries = self
            .entries
            .iter()
            .filter(|(_, e)| current(e, verifier))
            .peekable();
        for bucket in 0..=u8::MAX {
            let mut ctx = Context::new(&SHA256);
            while let Some((key, e)) = entries.next_if(|(key, _)| key[0] == bucket) {
                ctx.update(key);
                ctx.update(&e.announced.announcement.issued_at.to_be_bytes());
            }
            let hash = ctx.finish();
            digests.push(hash.as_ref()[..8].try_into().expect("8 bytes"));
        }
        digests
    }

    /// What this roster holds of `bucket`: each current member's node key and
    /// announcement date, in key order (what a peer needs to send only the rest).
    pub fn summary(&self, bucket: u8, verifier: &Verifier<'_>) -> Vec<([u8; 32], u64)> {
        self.in_bucket(bucket)
            .filter(|(_, e)| current(e, verifier))
            .map(|(key, e)| (*key, e.announced.announcement.issued_at))
            .collect()
    }

    fn in_bucket(&self, bucket: u8) -> impl Iterator<Item = (&[u8; 32], &Entry)> {
        let mut from = [0; 32];
        from[0] = bucket;
        self.entries
            .range(from..)
            .take_while(move |(key, _)| key[0] == bucket)
    }

    /// One page of what a peer lacks: the credentials of the current members in the
    /// buckets it asked about that its summary (`have`) does not list or lists with
    /// an older announcement, in node-key order after `after`, up to [`PAGE`]; and
    /// the key to ask the next page after, if there is more.
    pub fn missing(
        &self,
        have: &[BucketHave],
        after: Option<&[u8; 32]>,
        verifier: &Verifier<'_>,
    ) -> (Vec<Credentials>, Option<[u8; 32]>) {
        let mut buckets: Vec<&BucketHave> = have.iter().collect();
        buckets.sort_by_key(|b| b.bucket);
        buckets.dedup_by_key(|b| b.bucket);
        let mut lacking = buckets.into_iter().flat_map(|b| {
            let held: std::collections::HashMap<_, _> = b.members.iter().copied().collect();
            self.in_bucket(b.bucket).filter(move |(key, e)| {
                after.is_none_or(|a| *key > a)
                    && current(e, verifier)
                    && held
                        .get(*key)
                        .is_none_or(|at| *at < e.announced.announcement.issued_at)
            })
        });
        let page: Vec<_> = lacking.by_ref().take(PAGE).collect();
        let next = match lacking.next() {
            Some(_) => page.last().map(|(key, _)| **key),
            None => None,
        };
        let credentials = page
            .into_iter()
            .map(|(_, e)| e.credentials.clone())
            .collect();
        (credentials, next)
    }

    /// Every current member's credentials (what the pages add up to).
    #[cfg(test)]
    pub fn credentials(&self, verifier: &Verifier<'_>) -> Vec<Credentials> {
        self.entries
            .values()
            .filter(|e| current(e, verifier))
            .map(|e| e.credentials.clone())
            .collect()
    }

    /// The member with ring id `id`, at the address it signed, if it is a current
    /// member (not leaving).
    pub fn contact(&self, id: &PeerId, verifier: &Verifier<'_>) -> Option<Contact<SocketAddr>> {
        self.entries
            .values()
            .find(|e| e.announced.id == *id)
            .filter(|e| current(e, verifier) && !e.announced.announcement.leaving)
            .map(Entry::contact)
    }

    /// How many entries are held (leaving ones included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `endpoint`, endorsed by the node with key `endorser`, belongs to that
    /// node: a current member, at an IP it claims (the address it announced, or in the
    /// range the root granted it) and no other current member claims. An IP claimed
    /// by two members belongs to neither (a node can announce any address), except
    /// loopback, which is every node's own. No signature is checked.
    pub fn check_endpoint(
        &self,
        endorser: &[u8; 32],
        endpoint: Option<SocketAddr>,
        verifier: &Verifier<'_>,
    ) -> Result<(), TrustError> {
        let entry = self
            .entries
            .get(endorser)
            .filter(|e| current(e, verifier))
            .ok_or(TrustError::EndpointNotOwned)?;
        entry.announced.owns(
            endorser,
            endpoint,
            entry.range(verifier, &self.newest_ranges),
        )?;
        let canonical = endpoint.map(|e| e.ip().to_canonical());
        let Some(ip) = canonical.filter(|ip| !ip.is_loopback()) else {
            return Ok(());
        };
        let claimed_by_another = self.entries.values().any(|e| {
            e.key != *endorser
                && current(e, verifier)
                && !e.announced.announcement.leaving
                && e.announced
                    .claims(ip, e.range(verifier, &self.newest_ranges))
        });
        match claimed_by_another {
            false => Ok(()),
            true => Err(TrustError::EndpointNotOwned),
        }
    }
}

/// Whether `claimed` replaces `held`: later, and either far enough later or a change
/// of leaving.
fn newer(held: &Announcement, claimed: &Announcement) -> bool {
    claimed.issued_at > held.issued_at
        && (claimed.leaving != held.leaving
            || claimed.issued_at >= held.issued_at.saturating_add(MIN_REANNOUNCE_MS))
}

/// Whether an entry still counts: its key not revoked, its admission not expired,
/// its announcement within its lifetime.
fn current(e: &Entry, verifier: &Verifier<'_>) -> bool {
    let now = verifier.now_ms;
    e.not_after.is_none_or(|t| t > now)
        && e.announced
            .announcement
            .issued_at
            .saturating_add(ANNOUNCEMENT_LIFETIME_MS)
            > now
        && !verifier.revoked.contains_key(verifier.root, &e.key)
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

    fn creds(admission: &[u8], announcement: &[u8]) -> Credentials {
        Credentials {
            admission: admission.to_vec(),
            announcement: announcement.to_vec(),
            address_range: None,
        }
    }

    fn announce(node: &Identity, address: &str, issued_at: u64, leaving: bool) -> Vec<u8> {
        let body = Announcement {
            mesh: "demo".into(),
            address: address.parse().unwrap(),
            issued_at,
            leaving,
            address_range: None,
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
        let at = |address: &str, when: u64| announce(&node, address, when, false);
        assert_eq!(
            roster.offer(&v, &creds(&admission, &at("127.0.0.1:7001", NOW - 10_000))),
            Ok(true)
        );
        let before = roster.digest(&v);
        // An older one changes nothing, nor does a newer one too soon after; a newer
        // one moves the node.
        assert_eq!(
            roster.offer(&v, &creds(&admission, &at("127.0.0.1:7000", NOW - 20_000))),
            Ok(false)
        );
        let soon = NOW - 10_000 + MIN_REANNOUNCE_MS - 1;
        assert_eq!(
            roster.offer(&v, &creds(&admission, &at("127.0.0.1:7009", soon))),
            Ok(false)
        );
        assert_eq!(roster.digest(&v), before);
        assert_eq!(
            roster.offer(&v, &creds(&admission, &at("127.0.0.1:7002", NOW))),
            Ok(true)
        );
        assert_ne!(roster.digest(&v), before);
        let members = roster.members(&v);
        assert_eq!(members.len(), 1);
        let me = members.iter().next().unwrap();
        assert_eq!(me.id, Key(node.id().0));
        assert_eq!(me.addr, "127.0.0.1:7002".parse().unwrap());
        // Saying goodbye is taken at once, however soon.
        let bye = announce(&node, "127.0.0.1:7002", NOW + 1, true);
        assert_eq!(roster.offer(&v, &creds(&admission, &bye)), Ok(true));
        assert!(roster.members(&v).is_empty());
    }

    #[test]
    fn an_announcement_past_its_lifetime_no_longer_counts() {
        let mesh = Mesh::new();
        let (old, fresh) = (identity(), identity());
        let mut roster = Roster::default();
        let v = mesh.verifier();
        for (node, when) in [(&old, NOW - ANNOUNCEMENT_LIFETIME_MS + 1), (&fresh, NOW)] {
            let offered = roster.offer(
                &v,
                &creds(
                    &mesh.admit(node, None),
                    &announce(node, "127.0.0.1:1", when, false),
                ),
            );
            assert_eq!(offered, Ok(true));
        }
        assert_eq!(roster.members(&v).len(), 2);
        let later = Verifier {
            now_ms: NOW + 1,
            ..mesh.verifier()
        };
        let members: Vec<Key> = roster.members(&later).iter().map(|c| c.id).collect();
        assert_eq!(
            members,
            vec![Key(fresh.id().0)],
            "the old one died without a word"
        );
        assert_eq!(roster.credentials(&later).len(), 1);
        assert_eq!(roster.prune(&later), 1);
        assert_eq!(roster.len(), 1);
    }

    #[test]
    fn an_address_two_nodes_claim_belongs_to_neither() {
        let mesh = Mesh::new();
        let (honest, squatter, elsewhere) = (identity(), identity(), identity());
        let mut roster = Roster::default();
        let v = mesh.verifier();
        for (node, address) in [
            (&honest, "10.0.0.2:7946"),
            (&squatter, "10.0.0.2:9"),
            (&elsewhere, "10.0.0.3:7946"),
        ] {
            let offered = roster.offer(
                &v,
                &creds(
                    &mesh.admit(node, None),
                    &announce(node, address, NOW, false),
                ),
            );
            assert_eq!(offered, Ok(true));
        }
        let at = |ip: &str| Some(SocketAddr::new(ip.parse().unwrap(), 15006));
        for node in [&honest, &squatter] {
            assert_eq!(
                roster.check_endpoint(node.public_key(), at("10.0.0.2"), &v),
                Err(TrustError::EndpointNotOwned)
            );
        }
        assert_eq!(
            roster.check_endpoint(elsewhere.public_key(), at("10.0.0.3"), &v),
            Ok(())
        );
        // Not its address: refused; a tombstone names none.
        assert_eq!(
            roster.check_endpoint(honest.public_key(), at("10.0.0.3"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        assert_eq!(roster.check_endpoint(honest.public_key(), None, &v), Ok(()));
        // Loopback that several nodes announce (one host, or tests) stays each one's.
        let (one, two) = (identity(), identity());
        for (node, address) in [(&one, "127.0.0.1:7001"), (&two, "127.0.0.1:7002")] {
            let offered = roster.offer(
                &v,
                &creds(
                    &mesh.admit(node, None),
                    &announce(node, address, NOW, false),
                ),
            );
            assert_eq!(offered, Ok(true));
            assert_eq!(
                roster.check_endpoint(node.public_key(), at("127.0.0.1"), &v),
                Ok(())
            );
        }
        // A stranger's key is nobody's.
        assert_eq!(
            roster.check_endpoint(identity().public_key(), None, &v),
            Err(TrustError::EndpointNotOwned)
        );
    }

    #[test]
    fn a_nodes_pods_are_in_the_range_the_root_granted_it_and_nobody_elses() {
        let mesh = Mesh::new();
        let (kube, other, squatter) = (identity(), identity(), identity());
        let mut roster = Roster::default();
        let v = mesh.verifier();
        let signed_range = |signer: &Identity, node: &Identity, net: &str, not_after| {
            let body = themis_trust::AddressRange {
                mesh: "demo".into(),
                node_key: *node.public_key(),
                network: net.parse().unwrap(),
                prefix_len: 24,
                issued_at: NOW - 1,
                not_after,
            };
            Signed::sign(signer, themis_trust::ADDRESS_RANGE_LABEL, &body).encode()
        };
        let range = |node: &Identity, net: &str| signed_range(&mesh.root_key, node, net, None);
        // `node` at `address`, announcing (and so binding) the range grant `grant`.
        let bound = |node: &Identity, address: &str, grant: Vec<u8>| {
            let body = Announcement {
                mesh: "demo".into(),
                address: address.parse().unwrap(),
                issued_at: NOW,
                leaving: false,
                address_range: Some(grant_digest(&grant)),
            };
            Credentials {
                admission: mesh.admit(node, None),
                announcement: Signed::sign(node, ANNOUNCEMENT_LABEL, &body).encode(),
                address_range: Some(grant),
            }
        };
        let granted = bound(&kube, "10.0.0.1:7946", range(&kube, "10.244.1.0"));
        // Whoever forwards it can neither drop the range nor swap in another grant
        // of the root's for the same node.
        let stripped = Credentials {
            address_range: None,
            ..granted.clone()
        };
        assert_eq!(roster.offer(&v, &stripped), Err(TrustError::UnboundRange));
        let swapped = Credentials {
            address_range: Some(range(&kube, "10.244.7.0")),
            ..granted.clone()
        };
        assert_eq!(roster.offer(&v, &swapped), Err(TrustError::UnboundRange));
        assert_eq!(roster.offer(&v, &granted), Ok(true));
        let plain = creds(
            &mesh.admit(&other, None),
            &announce(&other, "10.0.0.2:7946", NOW, false),
        );
        assert_eq!(roster.offer(&v, &plain), Ok(true));
        let at = |ip: &str| Some(SocketAddr::new(ip.parse().unwrap(), 15006));
        // Its pods and its own address are its own; not the next range, and its
        // pods are no other node's.
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("10.244.1.9"), &v),
            Ok(())
        );
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("10.0.0.1"), &v),
            Ok(())
        );
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("10.244.2.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        assert_eq!(
            roster.check_endpoint(other.public_key(), at("10.244.1.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        // An IPv4-mapped IPv6 address is the IPv4 address it maps.
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("::ffff:10.244.1.9"), &v),
            Ok(())
        );
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("::ffff:10.244.2.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        // A node cannot bring another node's range, nor one it signed itself.
        let stolen = bound(&squatter, "10.0.0.3:7946", range(&kube, "10.244.1.0"));
        assert_eq!(roster.offer(&v, &stolen), Err(TrustError::WrongKey));
        let own_grant = signed_range(&squatter, &squatter, "10.244.1.0", None);
        let self_made = bound(&squatter, "10.0.0.3:7946", own_grant);
        assert_eq!(roster.offer(&v, &self_made), Err(TrustError::NotFromRoot));
        // An expired range no longer counts, and its node stays a member.
        let lapsed = identity();
        let expired = signed_range(&mesh.root_key, &lapsed, "10.244.5.0", Some(NOW));
        assert_eq!(
            roster.offer(&v, &bound(&lapsed, "10.0.0.5:7946", expired)),
            Ok(true)
        );
        assert_eq!(
            roster.check_endpoint(lapsed.public_key(), at("10.244.5.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        assert_eq!(
            roster.check_endpoint(lapsed.public_key(), at("10.0.0.5"), &v),
            Ok(())
        );
        // A member announcing an address in the range (it may announce any) takes
        // that one address from the range's node, and gets nothing for itself.
        let inside = creds(
            &mesh.admit(&squatter, None),
            &announce(&squatter, "10.244.1.9:7946", NOW, false),
        );
        assert_eq!(roster.offer(&v, &inside), Ok(true));
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("10.244.1.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        assert_eq!(
            roster.check_endpoint(squatter.public_key(), at("10.244.1.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("10.244.1.10"), &v),
            Ok(())
        );
    }

    /// The root narrows or withdraws a node's range by granting it a new one: once
    /// the trust log holds a newer grant for the node, the older one its
    /// announcement still binds no longer counts (its own address still does).
    #[test]
    fn a_newer_grant_in_the_log_withdraws_an_older_range() {
        let mesh = Mesh::new();
        let kube = identity();
        let v = mesh.verifier();
        let grant = Signed::sign(
            &mesh.root_key,
            themis_trust::ADDRESS_RANGE_LABEL,
            &themis_trust::AddressRange {
                mesh: "demo".into(),
                node_key: *kube.public_key(),
                network: "10.244.1.0".parse().unwrap(),
                prefix_len: 24,
                issued_at: NOW - 10,
                not_after: None,
            },
        )
        .encode();
        let announcement = Announcement {
            mesh: "demo".into(),
            address: "10.0.0.1:7946".parse().unwrap(),
            issued_at: NOW,
            leaving: false,
            address_range: Some(grant_digest(&grant)),
        };
        let credentials = Credentials {
            admission: mesh.admit(&kube, None),
            announcement: Signed::sign(&kube, ANNOUNCEMENT_LABEL, &announcement).encode(),
            address_range: Some(grant),
        };
        let mut roster = Roster::default();
        assert_eq!(roster.offer(&v, &credentials), Ok(true));
        let at = |ip: &str| Some(SocketAddr::new(ip.parse().unwrap(), 15006));
        let key = kube.public_key();
        // The log holds this grant (or none for the node): it counts.
        for newest in [HashMap::new(), HashMap::from([(*key, NOW - 10)])] {
            roster.set_newest_ranges(newest);
            assert_eq!(roster.check_endpoint(key, at("10.244.1.9"), &v), Ok(()));
        }
        // A newer grant for the node in the log: the old range is withdrawn.
        roster.set_newest_ranges(HashMap::from([(*key, NOW - 5)]));
        assert_eq!(
            roster.check_endpoint(key, at("10.244.1.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        assert_eq!(roster.check_endpoint(key, at("10.0.0.1"), &v), Ok(()));
        // Another node's newer grant changes nothing for this one.
        roster.set_newest_ranges(HashMap::from([(*identity().public_key(), NOW)]));
        assert_eq!(roster.check_endpoint(key, at("10.244.1.9"), &v), Ok(()));
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
            roster.offer(&v, &creds(&mesh.admit(&node, None), &at(&stranger))),
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
            roster.offer(&v, &creds(&self_made, &at(&stranger))),
            Err(TrustError::NotFromRoot)
        );
        let foreign = Mesh::new();
        assert_eq!(
            roster.offer(&v, &creds(&foreign.admit(&other, None), &at(&other))),
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
                    &creds(
                        &mesh.admit(node, not_after),
                        &announce(node, "127.0.0.1:1", NOW, bye),
                    ),
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
        // The revoked node cannot come back with a newer announcement, and agents
        // that hold it and agents that never took it agree on the digest.
        let again = announce(&revoked, "127.0.0.1:2", NOW + MIN_REANNOUNCE_MS, false);
        assert_eq!(
            roster.offer(&later, &creds(&mesh.admit(&revoked, None), &again)),
            Err(TrustError::Revoked)
        );
        let digest = roster.digest(&later);
        roster.prune(&later);
        assert_eq!(roster.digest(&later), digest);
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
                &creds(
                    &mesh.admit(&node, None),
                    &announce(&node, "127.0.0.1:1", NOW, false),
                ),
            );
            assert_eq!(offered, Ok(true));
        }
        let one_more = identity();
        assert_eq!(
            roster.offer(
                &v,
                &creds(
                    &mesh.admit(&one_more, None),
                    &announce(&one_more, "127.0.0.1:1", NOW, false)
                )
            ),
            Err(TrustError::TooLarge)
        );
        assert_eq!(roster.credentials(&v).len(), MAX_MEMBERS);
    }
}
