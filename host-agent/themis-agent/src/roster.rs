//! The mesh's full membership as this agent knows it (issue 23, docs/PROTOCOL.md
//! §6.14): every admitted node with the address it signed itself. One-hop routing
//! computes replica holders from it (`themis_dht::Members`), and gossip carries it.
//!
//! A member is admitted by the root — in the trust log, which every agent holds, or
//! by an admission that came with its credentials when this agent's log does not hold
//! it yet (a node's own, a newcomer's) — and placed by its own address announcement;
//! on Kubernetes the root also grants it a pod range ([`themis_trust::AddressRange`]),
//! again from the log or carried. Nobody can place another node, and the newest
//! announcement of a node wins. Announcements are dated: one older than
//! [`ANNOUNCEMENT_LIFETIME_MS`] no longer counts (a node re-announces at half that), so
//! a node that died without its farewell leaves the membership by itself, believing
//! no peer about it. Sans-IO: time and revocations come in through the [`Verifier`].
//!
//! Memory is the design constraint (10,000 members in 2 MB with the routing list):
//! a member is held packed ([`Member`]: key, signature, date, address, flags; 128
//! bytes), sorted by key in one vector, and its announcement is encoded again from
//! those fields when it is passed on (an announcement whose encoding is not the one
//! this produces is refused). What the trust log holds (admissions, range grants) is
//! not copied, but for each node's newest range grant, held once, packed, in a sorted
//! list (its network and the digest announcements bind it by); only credentials the
//! log lacks are kept as they came.
//!
//! Checking is apart from holding ([`Roster::check`] then [`Roster::insert`]), so a
//! caller verifies signatures without holding the roster's lock.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;

use ring::digest::{Context, SHA256};
use serde::{Deserialize, Serialize};
use themis_core::PeerId;
use themis_dht::{Contact, Key, Members};
use themis_trust::{grant_digest, Announcement, IpNet, Signed, TrustError, Verifier};

/// The most members a roster holds (the scale is 10,000 nodes).
pub const MAX_MEMBERS: usize = 16_384;

/// The most members one gossip answer carries (about 430 KiB with carried
/// credentials); a larger roster is fetched in pages, in node-key order
/// ([`Roster::missing`]).
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

/// How long an announcement counts; nodes announce again at half of it. A week: every
/// re-announcement is news every agent hears (at 10,000 members a half-hourly one
/// would be 5.6 a second, 35 kbit/s per member), so the lifetime is long and a node
/// that dies without its farewell stays listed — passed over after one timeout of
/// each agent's own — until then, or until the operator revokes it (§6.14).
pub const ANNOUNCEMENT_LIFETIME_MS: u64 = 7 * 24 * 3_600_000;

/// A node's next announcement is taken no sooner than this after the one held (unless
/// it says the node is leaving: a farewell is taken at once; a return is not): a
/// member re-announcing, or flipping leaving, in a loop cannot make every roster
/// change, and every agent gossip, in a loop. An agent that restarts within this of
/// its farewell announces again this long after it (`gossip::Driver`).
pub const MIN_REANNOUNCE_MS: u64 = 5_000;

/// One member's credentials, as they travel: its announcement, and the root's
/// statements about it only where the sender's trust log lacks them (in a mesh whose
/// agents hold the log, an announcement alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// The root's admission of the node key, if it comes along.
    pub admission: Option<Vec<u8>>,
    /// The node's own address announcement.
    pub announcement: Vec<u8>,
    /// The root's grant of addresses to the node (its pod range), if it comes along.
    pub address_range: Option<Vec<u8>>,
}

/// A range grant the roster knows, checked: the network, until when, since when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeGrant {
    /// The addresses granted.
    pub net: IpNet,
    /// Unix ms; `None`: until revoked.
    pub not_after: Option<u64>,
    /// When the root signed it (Unix ms): a newer grant for the node replaces it.
    pub issued_at: u64,
}

/// A range grant from the trust log, with the digest an announcement binds it by.
pub type LoggedRange = ([u8; 32], RangeGrant);

/// What the trust log says of the membership ([`Roster::set_log`]): every admitted
/// node key with its admission's `not_after`, and each node's newest range grant with
/// the digest an announcement binds it by.
#[derive(Debug, Clone, Default)]
pub struct LogMembership {
    /// Admitted keys, in log order (a later admission of a key replaces an earlier).
    pub admissions: Vec<([u8; 32], Option<u64>)>,
    /// The newest range grant per node key, one per key, in any order (the roster
    /// keeps this vector, sorted).
    pub ranges: Vec<([u8; 32], LoggedRange)>,
}

const LEAVING: u8 = 1;
const V6: u8 = 2;
const IN_LOG: u8 = 4;
/// The member's announcement binds a range: kept as a flag so that the scan of every
/// member for an endpoint's claimants looks up only those that have one.
const RANGE: u8 = 8;
/// The range it binds is the trust log's newest grant for the node, held once in
/// `Roster::logged_ranges` (every ranged member, in a mesh whose agents hold the log);
/// without this flag, a bound range is in `Roster::ranges`.
const LOGGED_RANGE: u8 = 16;

/// One member, packed (128 bytes): an admitted key and its announcement as signed —
/// date, address, leaving — and its signature. The range it binds is the log's newest
/// grant for the node (`LOGGED_RANGE`: held once, in `Roster::logged_ranges`) or held
/// beside, as are credentials the log lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    key: [u8; 32],
    signature: [u8; 64],
    issued_at: u64,
    ip: [u8; 16],
    port: u16,
    flags: u8,
}

impl Member {
    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    fn set(&mut self, flag: u8, on: bool) {
        match on {
            true => self.flags |= flag,
            false => self.flags &= !flag,
        }
    }

    fn address(&self) -> SocketAddr {
        let ip = match self.has(V6) {
            true => IpAddr::V6(Ipv6Addr::from(self.ip)),
            false => IpAddr::V4(Ipv4Addr::new(
                self.ip[0], self.ip[1], self.ip[2], self.ip[3],
            )),
        };
        SocketAddr::new(ip, self.port)
    }

    /// The announcement's fields (the mesh and range digest come from outside).
    fn announcement(&self, mesh: &str, range: Option<[u8; 32]>) -> Announcement {
        Announcement {
            mesh: mesh.into(),
            address: self.address(),
            issued_at: self.issued_at,
            leaving: self.has(LEAVING),
            address_range: range,
        }
    }

    /// The announcement as signed, encoded again.
    fn encode(&self, mesh: &str, range: Option<[u8; 32]>) -> Vec<u8> {
        let body = postcard::to_allocvec(&self.announcement(mesh, range))
            .expect("announcements always encode");
        Signed {
            signer: self.key,
            body,
            signature: self.signature,
        }
        .encode()
    }
}

/// The range an announcement binds: its digest, and the grant if this agent holds
/// it (from the log or carried) — a range whose grant is not known does not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BoundRange {
    digest: [u8; 32],
    grant: Option<RangeGrant>,
}

/// Credentials of a member that this agent's trust log does not hold, kept as they
/// came so that they can be passed on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Carried {
    admission: Option<Box<[u8]>>,
    range: Option<Box<[u8]>>,
}

/// A member's checked credentials, ready to be held.
#[derive(Debug, Clone)]
pub struct Entry {
    member: Member,
    not_after: Option<u64>,
    range: Option<BoundRange>,
    /// What came along that the log lacks: the admission (when the roster did not know
    /// the key) and the range grant.
    carried: Carried,
}

/// The members, by node key.
#[derive(Debug, Default)]
pub struct Roster {
    /// The members heard from, sorted by key.
    members: Vec<Member>,
    /// The keys the trust log admits that are not among the members (yet, or any
    /// more), sorted: 32 bytes each, where a member takes 128.
    admitted_only: Vec<[u8; 32]>,
    /// Admissions that expire, by key (most do not).
    expiring: HashMap<[u8; 32], u64>,
    /// The range a member's announcement binds where it is not the log's newest
    /// grant for the node (carried ahead of the log, not known yet, or an older grant
    /// a newer one withdrew): few once the log has caught up, and then its room is
    /// given back ([`fit_map`]).
    ranges: HashMap<[u8; 32], BoundRange>,
    /// Credentials the trust log lacks, as they came.
    carried: HashMap<[u8; 32], Carried>,
    /// The trust log's newest range grant per node key, with its digest, sorted by
    /// key (a vector: a hash map of 10,000 took twice the room): an older grant no
    /// longer counts ([`Roster::set_log`]).
    logged_ranges: Vec<([u8; 32], LoggedRange)>,
    /// Who claims which IP, for [`Roster::check_endpoint`]: made on the first check,
    /// moved in place when a member announces a new address, dropped when members
    /// join or go or the log changes (made again at the next check).
    claims: OnceLock<ClaimIndex>,
}

/// Positions sorted by the IP they claim, so that an endpoint check looks up its
/// rivals instead of scanning every member (0.87 ms a check at 10,000 ranged
/// members, `benches/roster.rs`): 4 bytes a member and a range.
#[derive(Debug, Default)]
struct ClaimIndex {
    /// Indices into `Roster::members`, by announced IP (canonical).
    by_address: Vec<u32>,
    /// Indices into `Roster::logged_ranges`, by network (then prefix length).
    by_range: Vec<u32>,
}

impl ClaimIndex {
    fn of(members: &[Member], logged: &[([u8; 32], LoggedRange)]) -> ClaimIndex {
        let mut by_address: Vec<u32> = (0..members.len() as u32).collect();
        by_address.sort_by_cached_key(|&i| canonical_ip(&members[i as usize]));
        let mut by_range: Vec<u32> = (0..logged.len() as u32).collect();
        by_range.sort_unstable_by_key(|&i| logged[i as usize].1 .1.net);
        ClaimIndex {
            by_address,
            by_range,
        }
    }

    /// Member `i` (same position) announced a new address: moved, not rebuilt
    /// (a member can change its address as often as it flips leaving).
    fn readdress(&mut self, i: u32, members: &[Member]) {
        if let Some(at) = self.by_address.iter().position(|&j| j == i) {
            self.by_address.remove(at);
        }
        let ip = canonical_ip(&members[i as usize]);
        let to = self
            .by_address
            .partition_point(|&j| canonical_ip(&members[j as usize]) < ip);
        self.by_address.insert(to, i);
    }
}

/// The IP member `m` announced, canonical (an IPv4-mapped IPv6 address as IPv4).
fn canonical_ip(m: &Member) -> IpAddr {
    m.address().ip().to_canonical()
}

/// The trust log's newest range grant for `key` in `logged` (sorted by key).
fn find_logged<'a>(
    logged: &'a [([u8; 32], LoggedRange)],
    key: &[u8; 32],
) -> Option<&'a LoggedRange> {
    let at = logged.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
    Some(&logged[at].1)
}

/// The log's newest grant for `key` as the range an announcement binds.
fn logged_bound(logged: &[([u8; 32], LoggedRange)], key: &[u8; 32]) -> Option<BoundRange> {
    find_logged(logged, key).map(|(digest, grant)| BoundRange {
        digest: *digest,
        grant: Some(*grant),
    })
}

/// Whether `digest` is that of the log's newest grant for `key`.
fn is_logged_newest(logged: &[([u8; 32], LoggedRange)], key: &[u8; 32], digest: &[u8; 32]) -> bool {
    find_logged(logged, key).is_some_and(|(d, _)| d == digest)
}

impl Roster {
    fn find(&self, key: &[u8; 32]) -> Result<usize, usize> {
        self.members.binary_search_by(|m| m.key.cmp(key))
    }

    fn get(&self, key: &[u8; 32]) -> Option<&Member> {
        self.find(key).ok().map(|i| &self.members[i])
    }

    /// What the trust log says: the keys it admits (revoked and expired admissions
    /// left out) may be members — credentials they carried are dropped, the log holds
    /// them — and each node's newest range grant is the one that counts: the root
    /// withdraws or narrows a range by granting the node a new one.
    pub fn set_log(&mut self, log: LogMembership, verifier: &Verifier<'_>) {
        self.claims.take();
        let mut admitted = Vec::with_capacity(log.admissions.len());
        let mut expiring = HashMap::new();
        for (key, not_after) in log.admissions {
            // A later admission of a key replaces an earlier one.
            match not_after {
                Some(t) => expiring.insert(key, t),
                None => expiring.remove(&key),
            };
            admitted.push(key);
        }
        let now = verifier.now_ms;
        admitted.retain(|key| {
            expiring.get(key).is_none_or(|t| *t > now)
                && !verifier.revoked.contains_key(verifier.root, key)
        });
        admitted.sort_unstable();
        admitted.dedup();
        for member in &mut self.members {
            let logged = admitted.binary_search(&member.key).is_ok();
            member.set(IN_LOG, logged);
            if logged {
                if let Some(carried) = self.carried.get_mut(&member.key) {
                    carried.admission = None;
                }
            }
        }
        // Members admitted only by what they carried keep their own dates.
        for member in self.members.iter().filter(|m| !m.has(IN_LOG)) {
            if let Some(t) = self.expiring.get(&member.key) {
                expiring.insert(member.key, *t);
            }
        }
        let members = &self.members;
        let is_member = |key: &[u8; 32]| members.binary_search_by(|m| m.key.cmp(key)).is_ok();
        admitted.retain(|key| !is_member(key));
        admitted.shrink_to_fit();
        expiring.retain(|key, _| admitted.binary_search(key).is_ok() || is_member(key));
        self.admitted_only = admitted;
        self.expiring = expiring;
        let mut logged = log.ranges;
        // The index finds a range by its network exactly (the log holds only
        // truncated ones; this keeps it so whoever calls).
        for (_, (_, grant)) in &mut logged {
            grant.net = grant.net.trunc();
        }
        logged.sort_unstable_by_key(|(key, _)| *key);
        logged.dedup_by_key(|(key, _)| *key);
        logged.shrink_to_fit();
        // What each ranged member binds, against the new newest grants: held once in
        // the log's list where it is the newest, beside it where it is not.
        for member in self.members.iter_mut().filter(|m| m.has(RANGE)) {
            let bound = match member.has(LOGGED_RANGE) {
                true => logged_bound(&self.logged_ranges, &member.key),
                false => self.ranges.remove(&member.key),
            };
            let Some(bound) = bound else {
                // Not reachable (`insert` holds every bound range one way or the
                // other); were it, no range must count on a flag left pointing at
                // whatever the new list holds.
                debug_assert!(false, "a ranged member with its range held nowhere");
                member.set(LOGGED_RANGE, false);
                continue;
            };
            let newest = is_logged_newest(&logged, &member.key, &bound.digest);
            member.set(LOGGED_RANGE, newest);
            match newest {
                true => {
                    if let Some(carried) = self.carried.get_mut(&member.key) {
                        carried.range = None;
                    }
                }
                false => {
                    self.ranges.insert(member.key, bound);
                }
            }
        }
        self.logged_ranges = logged;
        self.carried
            .retain(|_, c| c.admission.is_some() || c.range.is_some());
        // Members held ahead of the log's grants (a new agent's first pulls) leave
        // these maps once the log has them: give back the room.
        fit_map(&mut self.ranges);
        fit_map(&mut self.carried);
    }

    /// Whether the roster would take this (decoded) announcement: from its unchecked
    /// date alone, with no signature checked (a gossip answer carries every member,
    /// nearly all unchanged). `Ok(false)`: nothing to do.
    pub fn wants(&self, signed: &Signed, brings_range: bool) -> Result<bool, TrustError> {
        let claimed = Announcement::decode(&signed.body)?;
        match self.get(&signed.signer) {
            None if self.members.len() >= MAX_MEMBERS => Err(TrustError::TooLarge),
            None => Ok(true),
            Some(held) => Ok(newer(held, claimed.issued_at, claimed.leaving)
                || (brings_range && self.lacks_grant(held, &signed.signature))),
        }
    }

    /// Whether `held`'s announcement, the one signed `signature` (the grant is not
    /// among the signed bytes), binds a range whose grant this roster does not know:
    /// the same announcement with the grant along is taken (a forwarder that dropped
    /// the grant only delays it). Only the same one: another of the same date (back
    /// instead of leaving, elsewhere) would change the member past [`newer`]'s
    /// interval, as often as it likes.
    fn lacks_grant(&self, held: &Member, signature: &[u8; 64]) -> bool {
        held.signature == *signature
            && held.has(RANGE)
            && !held.has(LOGGED_RANGE)
            && self
                .ranges
                .get(&held.key)
                .is_some_and(|r| r.grant.is_none())
    }

    /// Whether the root admitted `key` as far as this roster knows (the trust log,
    /// or an admission that came with the node's credentials), and until when.
    pub fn admitted(&self, key: &[u8; 32]) -> Option<Option<u64>> {
        let known = self.get(key).is_some() || self.admitted_only.binary_search(key).is_ok();
        known.then(|| self.expiring.get(key).copied())
    }

    /// Checks one member's credentials: the node key admitted (`admitted`, what
    /// [`Roster::admitted`] says, or else the admission that came along), the
    /// announcement itself, and the range grant it binds — from the trust log
    /// (`logged_range`: the log's newest grant for the key, with its digest) or come
    /// along. Holds no state: call it without the roster's lock, then
    /// [`Roster::insert`]. An announcement of a key nobody showed admitted is
    /// [`TrustError::NotAdmitted`], found before any signature is checked.
    pub fn check(
        verifier: &Verifier<'_>,
        admitted: Option<Option<u64>>,
        logged_range: Option<LoggedRange>,
        credentials: &Credentials,
    ) -> Result<Entry, TrustError> {
        let signed = Signed::decode(&credentials.announcement)?;
        let key = signed.signer;
        let mut carried = Carried::default();
        let not_after = match (admitted, &credentials.admission) {
            (Some(Some(t)), _) if t <= verifier.now_ms => return Err(TrustError::Expired),
            (Some(not_after), _) => not_after,
            (None, Some(bytes)) => {
                let admission = verifier.admission(bytes, &key)?;
                carried.admission = Some(bytes.as_slice().into());
                admission.not_after
            }
            (None, None) => return Err(TrustError::NotAdmitted),
        };
        let announced = verifier.announcement(&credentials.announcement, |k| *k == key)?;
        let said = &announced.announcement;
        if said.issued_at.saturating_add(ANNOUNCEMENT_LIFETIME_MS) <= verifier.now_ms {
            return Err(TrustError::Expired);
        }
        let range = match said.address_range {
            None if credentials.address_range.is_some() => return Err(TrustError::UnboundRange),
            None => None,
            Some(digest) => {
                let grant = match (&credentials.address_range, logged_range) {
                    (Some(bytes), _) => {
                        if grant_digest(bytes) != digest {
                            return Err(TrustError::UnboundRange);
                        }
                        // An expired range no longer counts; the node stays a member.
                        match verifier.address_range(bytes, &key) {
                            Ok((range, net)) => {
                                carried.range = Some(bytes.as_slice().into());
                                Some(RangeGrant {
                                    net,
                                    not_after: range.not_after,
                                    issued_at: range.issued_at,
                                })
                            }
                            Err(TrustError::Expired) => None,
                            Err(error) => return Err(error),
                        }
                    }
                    (None, Some((logged, grant))) if logged == digest => Some(grant),
                    // Bound, but no grant known here yet: held, not counted.
                    (None, _) => None,
                };
                Some(BoundRange { digest, grant })
            }
        };
        let address = said.address;
        let (ip, v6) = match address.ip() {
            IpAddr::V4(v4) => {
                let mut ip = [0; 16];
                ip[..4].copy_from_slice(&v4.octets());
                (ip, false)
            }
            IpAddr::V6(v6) => (v6.octets(), true),
        };
        let mut member = Member {
            key,
            signature: signed.signature,
            issued_at: said.issued_at,
            ip,
            port: address.port(),
            flags: 0,
        };
        member.set(LEAVING, said.leaving);
        member.set(V6, v6);
        // Held packed and encoded again when passed on: only the one encoding.
        let mesh = verifier.root.mesh.as_str();
        if member.encode(mesh, said.address_range) != credentials.announcement {
            return Err(TrustError::Malformed);
        }
        Ok(Entry {
            member,
            not_after,
            range,
            carried,
        })
    }

    /// The trust log's newest range grant for `key`, for [`Roster::check`].
    pub fn logged_range(&self, key: &[u8; 32]) -> Option<LoggedRange> {
        find_logged(&self.logged_ranges, key).copied()
    }

    /// Holds a checked entry if it is newer than what is held for that node (see
    /// [`MIN_REANNOUNCE_MS`]), or the same one with the range grant it lacked.
    /// Returns whether the roster changed.
    pub fn insert(&mut self, entry: Entry) -> Result<bool, TrustError> {
        let Entry {
            mut member,
            not_after,
            range,
            mut carried,
        } = entry;
        let key = member.key;
        let at = self.find(&key);
        if let Ok(i) = at {
            let held = &self.members[i];
            let fills = range.as_ref().is_some_and(|r| r.grant.is_some())
                && self.lacks_grant(held, &member.signature);
            if !newer(held, member.issued_at, member.has(LEAVING)) && !fills {
                return Ok(false);
            }
        }
        // The log may have brought the grant since the entry was checked; where it is
        // the log's newest, it is not held twice.
        let logged =
            range.is_some_and(|bound| is_logged_newest(&self.logged_ranges, &key, &bound.digest));
        if logged {
            carried.range = None;
        }
        member.set(RANGE, range.is_some());
        member.set(LOGGED_RANGE, logged);
        match at {
            Ok(i) => {
                member.set(IN_LOG, self.members[i].has(IN_LOG));
                if member.has(IN_LOG) {
                    carried.admission = None;
                }
                let moved = canonical_ip(&self.members[i]) != canonical_ip(&member);
                self.members[i] = member;
                // The index reads flags and dates when it is asked: only a new
                // address moves the member in it.
                if moved {
                    if let Some(index) = self.claims.get_mut() {
                        index.readdress(i as u32, &self.members);
                    }
                }
            }
            Err(_) if self.members.len() >= MAX_MEMBERS => return Err(TrustError::TooLarge),
            Err(i) => {
                match self.admitted_only.binary_search(&key) {
                    // The log admits it: what came along is not kept.
                    Ok(j) => {
                        self.admitted_only.remove(j);
                        member.set(IN_LOG, true);
                        carried.admission = None;
                    }
                    Err(_) => {
                        if let Some(t) = not_after {
                            self.expiring.insert(key, t);
                        }
                    }
                }
                self.members.insert(i, member);
                // A new member (an admitted key: not at a peer's whim) shifts the
                // positions the index holds.
                self.claims.take();
            }
        }
        match range {
            Some(bound) if !logged => self.ranges.insert(key, bound),
            _ => self.ranges.remove(&key),
        };
        let held = self.carried.entry(key).or_default();
        if carried.admission.is_some() {
            held.admission = carried.admission;
        }
        held.range = carried.range;
        if held.admission.is_none() && held.range.is_none() {
            self.carried.remove(&key);
        }
        Ok(true)
    }

    /// [`Roster::check`] then [`Roster::insert`], for callers that hold no lock.
    pub fn offer(
        &mut self,
        verifier: &Verifier<'_>,
        credentials: &Credentials,
    ) -> Result<bool, TrustError> {
        let signed = Signed::decode(&credentials.announcement)?;
        if !self.wants(&signed, credentials.address_range.is_some())? {
            return Ok(false);
        }
        let (admitted, logged) = (
            self.admitted(&signed.signer),
            self.logged_range(&signed.signer),
        );
        self.insert(Roster::check(verifier, admitted, logged, credentials)?)
    }

    /// Forgets the members that no longer count — revoked keys, expired admissions,
    /// announcements past their lifetime — with what came along with them; a key the
    /// trust log admits, not revoked and not expired, stays admitted. Returns how many
    /// went.
    pub fn prune(&mut self, verifier: &Verifier<'_>) -> usize {
        let (mut gone, mut still_admitted) = (Vec::new(), Vec::new());
        let expiring = &self.expiring;
        self.members.retain(|m| {
            if current(m, expiring, verifier) {
                return true;
            }
            gone.push(m.key);
            let admission_holds = expiring.get(&m.key).is_none_or(|t| *t > verifier.now_ms)
                && !verifier.revoked.contains_key(verifier.root, &m.key);
            if m.has(IN_LOG) && admission_holds {
                still_admitted.push(m.key);
            }
            false
        });
        if !gone.is_empty() {
            self.claims.take();
        }
        for key in &gone {
            self.ranges.remove(key);
            self.carried.remove(key);
            if !still_admitted.contains(key) {
                self.expiring.remove(key);
            }
        }
        if !still_admitted.is_empty() {
            self.admitted_only.extend(still_admitted);
            self.admitted_only.sort_unstable();
        }
        // Growth by insertion doubles a vector's room; memory is the constraint here.
        fit(&mut self.members);
        fit(&mut self.admitted_only);
        fit_map(&mut self.ranges);
        fit_map(&mut self.carried);
        fit_map(&mut self.expiring);
        gone.len()
    }

    /// The current members (see [`Roster::prune`]), announced.
    fn current_members<'a>(
        &'a self,
        verifier: &'a Verifier<'_>,
    ) -> impl Iterator<Item = &'a Member> + 'a {
        self.members
            .iter()
            .filter(move |m| current(m, &self.expiring, verifier))
    }

    /// The members one-hop routing uses now: current (see [`Roster::prune`]) and not
    /// leaving.
    pub fn members(&self, verifier: &Verifier<'_>) -> Members<SocketAddr> {
        let mesh = verifier.root.mesh.as_str();
        Members::new(
            self.current_members(verifier)
                .filter(|m| !m.has(LEAVING))
                .map(|m| Contact {
                    id: Key(PeerId::derive(&m.key, mesh).0),
                    addr: m.address(),
                }),
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
        let mut members = self.current_members(verifier).peekable();
        for bucket in 0..=u8::MAX {
            let mut ctx = Context::new(&SHA256);
            while let Some(m) = members.next_if(|m| m.key[0] == bucket) {
                ctx.update(&m.key);
                ctx.update(&m.issued_at.to_be_bytes());
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
            .filter(|m| current(m, &self.expiring, verifier))
            .map(|m| (m.key, m.issued_at))
            .collect()
    }

    fn in_bucket(&self, bucket: u8) -> impl Iterator<Item = &Member> {
        let from = self.members.partition_point(|m| m.key[0] < bucket);
        self.members[from..]
            .iter()
            .take_while(move |m| m.key[0] == bucket)
    }

    /// A member's credentials as they are passed on: its announcement encoded again,
    /// and what the trust log lacks of it.
    fn credentials_of(&self, member: &Member, mesh: &str) -> Credentials {
        let range = self.bound(member).map(|r| r.digest);
        let carried = self.carried.get(&member.key);
        Credentials {
            admission: carried.and_then(|c| c.admission.as_deref().map(<[u8]>::to_vec)),
            announcement: member.encode(mesh, range),
            address_range: carried.and_then(|c| c.range.as_deref().map(<[u8]>::to_vec)),
        }
    }

    /// Member `key`'s credentials as this agent passes them on, if it has heard
    /// from it.
    pub fn passed_on(&self, key: &[u8; 32], verifier: &Verifier<'_>) -> Option<Credentials> {
        let member = self.get(key)?;
        Some(self.credentials_of(member, verifier.root.mesh.as_str()))
    }

    /// The credentials of the current members whose announcement is dated after
    /// `since`, in key order, at most `limit`.
    pub fn fresh(&self, since: u64, limit: usize, verifier: &Verifier<'_>) -> Vec<Credentials> {
        let mesh = verifier.root.mesh.as_str();
        self.current_members(verifier)
            .filter(|m| m.issued_at > since)
            .take(limit)
            .map(|m| self.credentials_of(m, mesh))
            .collect()
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
            let held: HashMap<_, _> = b.members.iter().copied().collect();
            self.in_bucket(b.bucket).filter(move |m| {
                after.is_none_or(|a| m.key > *a)
                    && current(m, &self.expiring, verifier)
                    && held.get(&m.key).is_none_or(|at| *at < m.issued_at)
            })
        });
        let page: Vec<&Member> = lacking.by_ref().take(PAGE).collect();
        let next = match lacking.next() {
            Some(_) => page.last().map(|m| m.key),
            None => None,
        };
        let mesh = verifier.root.mesh.as_str();
        let credentials = page
            .into_iter()
            .map(|m| self.credentials_of(m, mesh))
            .collect();
        (credentials, next)
    }

    /// Every current member's credentials (what the pages add up to).
    #[cfg(test)]
    pub fn credentials(&self, verifier: &Verifier<'_>) -> Vec<Credentials> {
        let mesh = verifier.root.mesh.as_str();
        self.current_members(verifier)
            .map(|m| self.credentials_of(m, mesh))
            .collect()
    }

    /// How many members are held (leaving ones included).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The range the root granted member `m`, while it holds: not expired, and no
    /// other grant for the node in the trust log as new or newer — a newer grant, even
    /// a narrower one, withdraws it, and of two signed at the same time only the log's
    /// (the first in log order) counts, so that every agent holding the log counts the
    /// same one.
    fn range(&self, m: &Member, verifier: &Verifier<'_>) -> Option<IpNet> {
        if !m.has(RANGE) {
            return None;
        }
        let (grant, newest) = match m.has(LOGGED_RANGE) {
            true => (find_logged(&self.logged_ranges, &m.key)?.1, true),
            false => {
                let grant = self.ranges.get(&m.key)?.grant?;
                let newest = find_logged(&self.logged_ranges, &m.key)
                    .is_none_or(|(_, g)| g.issued_at < grant.issued_at);
                (grant, newest)
            }
        };
        let holds = newest && grant.not_after.is_none_or(|t| t > verifier.now_ms);
        holds.then_some(grant.net)
    }

    /// The range member `m`'s announcement binds, wherever it is held.
    fn bound(&self, m: &Member) -> Option<BoundRange> {
        match (m.has(RANGE), m.has(LOGGED_RANGE)) {
            (false, _) => None,
            (true, true) => logged_bound(&self.logged_ranges, &m.key),
            (true, false) => self.ranges.get(&m.key).copied(),
        }
    }

    /// Whether `endpoint`, endorsed by the node with key `endorser`, belongs to that
    /// node, a current member. The root's grants outrank what nodes announce (a node
    /// can announce any address): an IP in the range the root granted the endorser is
    /// its own unless another current member's range holds it too; outside its range,
    /// only its announced IP is, unless another current member announces it or holds
    /// it in a range — an IP two members claim alike belongs to neither — except
    /// loopback, which is every node's own. No signature is checked.
    pub fn check_endpoint(
        &self,
        endorser: &[u8; 32],
        endpoint: Option<SocketAddr>,
        verifier: &Verifier<'_>,
    ) -> Result<(), TrustError> {
        let member = self
            .get(endorser)
            .filter(|m| current(m, &self.expiring, verifier))
            .ok_or(TrustError::EndpointNotOwned)?;
        let Some(ip) = endpoint.map(|e| e.ip().to_canonical()) else {
            return Ok(());
        };
        let in_range = |m: &Member| self.range(m, verifier).is_some_and(|r| r.contains(&ip));
        let owned = if in_range(member) {
            !self.range_held_by_another(endorser, ip, verifier)
        } else if canonical_ip(member) == ip {
            ip.is_loopback()
                || !(self.announced_by_another(endorser, ip, verifier)
                    || self.range_held_by_another(endorser, ip, verifier))
        } else {
            false
        };
        match owned {
            true => Ok(()),
            false => Err(TrustError::EndpointNotOwned),
        }
    }

    /// A current member other than `endorser`, not leaving: a rival for an IP.
    fn rival(&self, m: &Member, endorser: &[u8; 32], verifier: &Verifier<'_>) -> bool {
        m.key != *endorser && !m.has(LEAVING) && current(m, &self.expiring, verifier)
    }

    fn index(&self) -> &ClaimIndex {
        self.claims
            .get_or_init(|| ClaimIndex::of(&self.members, &self.logged_ranges))
    }

    /// Whether a rival of `endorser` announced `ip` (canonical).
    fn announced_by_another(
        &self,
        endorser: &[u8; 32],
        ip: IpAddr,
        verifier: &Verifier<'_>,
    ) -> bool {
        let by_address = &self.index().by_address;
        let from = by_address.partition_point(|&i| canonical_ip(&self.members[i as usize]) < ip);
        by_address[from..]
            .iter()
            .map(|&i| &self.members[i as usize])
            .take_while(|m| canonical_ip(m) == ip)
            .any(|m| self.rival(m, endorser, verifier))
    }

    /// Whether a rival of `endorser` holds `ip` (canonical) in its range. A network
    /// holding `ip` is one of its prefixes, so each prefix length is looked up; the
    /// ranges held beside the log's (few) are scanned.
    fn range_held_by_another(
        &self,
        endorser: &[u8; 32],
        ip: IpAddr,
        verifier: &Verifier<'_>,
    ) -> bool {
        let holds = |key: &[u8; 32]| {
            self.get(key).is_some_and(|m| {
                self.rival(m, endorser, verifier)
                    && self.range(m, verifier).is_some_and(|r| r.contains(&ip))
            })
        };
        let by_range = &self.index().by_range;
        let longest = match ip {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        let logged = (0..=longest).any(|len| {
            let Ok(net) = IpNet::new(ip, len).map(|n| n.trunc()) else {
                return false;
            };
            let net_of = |i: u32| self.logged_ranges[i as usize].1 .1.net;
            let from = by_range.partition_point(|&i| net_of(i) < net);
            by_range[from..]
                .iter()
                .take_while(|&&i| net_of(i) == net)
                .any(|&i| holds(&self.logged_ranges[i as usize].0))
        });
        logged || self.ranges.keys().any(holds)
    }
}

/// Gives back a vector's room beyond a sixteenth more than it holds.
fn fit<T>(v: &mut Vec<T>) {
    if v.capacity() > v.len() + v.len() / 16 + 16 {
        v.shrink_to_fit();
    }
}

/// Gives back a map's room beyond twice what it holds (a hash map never shrinks by
/// itself: 10,000 entries once held keep their 16,384 slots).
fn fit_map<K: Eq + std::hash::Hash, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > 2 * m.len() + 16 {
        m.shrink_to_fit();
    }
}

/// Whether an announcement dated `issued_at` saying `leaving` replaces `held`: later,
/// and either far enough later or a farewell (taken at once, so that nobody waits on
/// a node that said it goes). A return waits like any other: were it taken at once
/// too, a member flipping leaving in a loop would change every roster, and fill
/// every agent's gossip, in a loop; so a node changes at most twice an interval.
fn newer(held: &Member, issued_at: u64, leaving: bool) -> bool {
    issued_at > held.issued_at
        && ((leaving && !held.has(LEAVING))
            || issued_at >= held.issued_at.saturating_add(MIN_REANNOUNCE_MS))
}

/// Whether an announced member still counts: its key not revoked, its admission not
/// expired, its announcement within its lifetime.
fn current(m: &Member, expiring: &HashMap<[u8; 32], u64>, verifier: &Verifier<'_>) -> bool {
    let now = verifier.now_ms;
    expiring.get(&m.key).is_none_or(|t| *t > now)
        && m.issued_at.saturating_add(ANNOUNCEMENT_LIFETIME_MS) > now
        && !verifier.revoked.contains_key(verifier.root, &m.key)
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

        /// The root's grant of `network`/24 to `node`, signed 10 ms before now.
        fn grant_range(&self, node: &Identity, network: &str) -> Vec<u8> {
            let body = themis_trust::AddressRange {
                mesh: "demo".into(),
                node_key: *node.public_key(),
                network: network.parse().unwrap(),
                prefix_len: 24,
                issued_at: NOW - 10,
                not_after: None,
            };
            Signed::sign(&self.root_key, themis_trust::ADDRESS_RANGE_LABEL, &body).encode()
        }

        /// Revokes `node` (the root signs it; this mesh's verifiers know it).
        fn revoke(&mut self, node: &Identity) {
            let body = Revocation {
                mesh: "demo".into(),
                id: node.id().0,
                issued_at: NOW,
                reason: "test".into(),
            };
            let revocation = Signed::sign(&self.root_key, REVOCATION_LABEL, &body).encode();
            let root = self.root.clone();
            self.revoked.add(&root, &revocation).unwrap();
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

    /// What [`Roster::check_endpoint`] says, by a scan of every member (the rule
    /// itself, without the index).
    fn owned_by_scan(
        roster: &Roster,
        endorser: &[u8; 32],
        endpoint: Option<SocketAddr>,
        v: &Verifier<'_>,
    ) -> bool {
        let Some(member) = roster
            .get(endorser)
            .filter(|m| current(m, &roster.expiring, v))
        else {
            return false;
        };
        let Some(ip) = endpoint.map(|e| e.ip().to_canonical()) else {
            return true;
        };
        let in_range = |m: &Member| roster.range(m, v).is_some_and(|r| r.contains(&ip));
        let claims = |m: &Member| canonical_ip(m) == ip || in_range(m);
        let mut others = roster
            .current_members(v)
            .filter(|m| m.key != *endorser && !m.has(LEAVING));
        if in_range(member) {
            !others.any(in_range)
        } else if canonical_ip(member) == ip {
            ip.is_loopback() || !others.any(claims)
        } else {
            false
        }
    }

    fn creds(admission: &[u8], announcement: &[u8]) -> Credentials {
        Credentials {
            admission: Some(admission.to_vec()),
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
        // Saying goodbye is taken at once, however soon; coming back is not.
        let bye = announce(&node, "127.0.0.1:7002", NOW + 1, true);
        assert_eq!(roster.offer(&v, &creds(&admission, &bye)), Ok(true));
        assert!(roster.members(&v).is_empty());
        let back = |when: u64| announce(&node, "127.0.0.1:7002", when, false);
        assert_eq!(
            roster.offer(&v, &creds(&admission, &back(NOW + 2))),
            Ok(false)
        );
        assert!(roster.members(&v).is_empty());
        let later = NOW + 1 + MIN_REANNOUNCE_MS;
        assert_eq!(roster.offer(&v, &creds(&admission, &back(later))), Ok(true));
        assert_eq!(roster.members(&v).len(), 1);
    }

    /// The attack on gossip's bound: a member flipping leaving (and its address) as
    /// fast as it likes, each announcement validly signed. Every flip taken would be news
    /// every agent passes on; the roster takes at most two an interval (a farewell at
    /// once, the return only an interval after the last change).
    #[test]
    fn a_member_flipping_leaving_in_a_loop_changes_the_roster_twice_an_interval() {
        let mesh = Mesh::new();
        let node = identity();
        let mut roster = Roster::default();
        let admission = mesh.admit(&node, None);
        let v = mesh.verifier();
        let start = NOW - 60_000;
        // Every 50 ms rather than every one: the same bound, a fiftieth of the
        // signatures to check.
        let (step, intervals) = (50, 4);
        let flips = intervals * MIN_REANNOUNCE_MS / step;
        let mut taken = 0;
        for n in 0..flips {
            let leaving = n % 2 == 1;
            let address = format!("127.0.0.1:{}", 7000 + n % 1000);
            let said = announce(&node, &address, start + n * step, leaving);
            if roster.offer(&v, &creds(&admission, &said)) == Ok(true) {
                taken += 1;
            }
        }
        eprintln!("{taken} of {flips} flips taken in {intervals} intervals");
        assert!(
            taken >= 2,
            "the first announcement and a farewell are taken"
        );
        assert!(
            taken <= 2 * intervals + 1,
            "{taken} of {flips} flips taken in {intervals} intervals"
        );
    }

    /// The same-date path that fills in a grant a forwarder dropped is the same
    /// announcement's only: a member cannot use it to flip leaving or move at one
    /// date, past the re-announce interval.
    #[test]
    fn only_the_same_announcement_fills_in_its_grant() {
        let mesh = Mesh::new();
        let node = identity();
        let v = mesh.verifier();
        let admission = mesh.admit(&node, None);
        let grant = mesh.grant_range(&node, "10.244.3.0");
        let said = |leaving: bool, address: &str| {
            let body = Announcement {
                mesh: "demo".into(),
                address: address.parse().unwrap(),
                issued_at: NOW,
                leaving,
                address_range: Some(grant_digest(&grant)),
            };
            Signed::sign(&node, ANNOUNCEMENT_LABEL, &body).encode()
        };
        let offered = |announcement: Vec<u8>, grant_along: bool| Credentials {
            admission: Some(admission.clone()),
            announcement,
            address_range: grant_along.then(|| grant.clone()),
        };
        let mut roster = Roster::default();
        // A farewell whose grant a forwarder dropped: held, its range not known.
        let farewell = said(true, "10.0.0.3:7946");
        assert_eq!(
            roster.offer(&v, &offered(farewell.clone(), false)),
            Ok(true)
        );
        // Another announcement of that date, the grant along: no fill.
        for other in [said(false, "10.0.0.3:7946"), said(true, "10.0.0.4:7946")] {
            assert_eq!(roster.offer(&v, &offered(other, true)), Ok(false));
        }
        assert!(roster.members(&v).is_empty(), "still leaving");
        assert_eq!(
            roster.credentials(&v)[0].announcement,
            farewell,
            "the farewell is held"
        );
        // The same one with its grant: filled.
        assert_eq!(roster.offer(&v, &offered(farewell, true)), Ok(true));
        assert!(roster.credentials(&v)[0].address_range.is_some());
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
                admission: Some(mesh.admit(node, None)),
                announcement: Signed::sign(node, ANNOUNCEMENT_LABEL, &body).encode(),
                address_range: Some(grant),
            }
        };
        let granted = bound(&kube, "10.0.0.1:7946", range(&kube, "10.244.1.0"));
        // Whoever forwards it can neither swap in another grant of the root's for
        // the same node, nor give a range to an announcement that binds none; one
        // that drops the grant gets the node held without it (the range counts once
        // the grant is known: see the next test).
        let swapped = Credentials {
            address_range: Some(range(&kube, "10.244.7.0")),
            ..granted.clone()
        };
        assert_eq!(roster.offer(&v, &swapped), Err(TrustError::UnboundRange));
        let unbound = Credentials {
            address_range: Some(range(&other, "10.244.7.0")),
            ..creds(
                &mesh.admit(&other, None),
                &announce(&other, "10.0.0.2:7946", NOW - 10_000, false),
            )
        };
        assert_eq!(roster.offer(&v, &unbound), Err(TrustError::UnboundRange));
        let stripped = Credentials {
            address_range: None,
            ..granted.clone()
        };
        assert_eq!(roster.offer(&v, &stripped), Ok(true));
        let at = |ip: &str| Some(SocketAddr::new(ip.parse().unwrap(), 15006));
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("10.244.1.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        // The same announcement with its grant along (as the node's own, or from an
        // honest forwarder) is taken, though no newer: the range counts.
        assert_eq!(roster.offer(&v, &granted), Ok(true));
        assert_eq!(
            roster.offer(&v, &granted),
            Ok(false),
            "nothing more to take"
        );
        let plain = creds(
            &mesh.admit(&other, None),
            &announce(&other, "10.0.0.2:7946", NOW, false),
        );
        assert_eq!(roster.offer(&v, &plain), Ok(true));
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
        // A member announcing an address in the range (it may announce any) gets
        // nothing for itself, and takes nothing from the range's node: the root's
        // grant outranks a node's word.
        let inside = creds(
            &mesh.admit(&squatter, None),
            &announce(&squatter, "10.244.1.9:7946", NOW, false),
        );
        assert_eq!(roster.offer(&v, &inside), Ok(true));
        assert_eq!(
            roster.check_endpoint(squatter.public_key(), at("10.244.1.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        for pod in ["10.244.1.9", "10.244.1.10"] {
            assert_eq!(
                roster.check_endpoint(kube.public_key(), at(pod), &v),
                Ok(()),
                "{pod}"
            );
        }
        // A node's own announced address, outside every range, is what a squatter
        // can still take (by announcing it too: then it is neither's).
        let on_its_address = creds(
            &mesh.admit(&squatter, None),
            &announce(&squatter, "10.0.0.1:7946", NOW + MIN_REANNOUNCE_MS, false),
        );
        assert_eq!(roster.offer(&v, &on_its_address), Ok(true));
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("10.0.0.1"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        assert_eq!(
            roster.check_endpoint(kube.public_key(), at("10.244.1.9"), &v),
            Ok(())
        );
        // Two grants in force that overlap (the operator refuses to sign the second,
        // the root's key could): their common addresses are neither node's.
        let overlapping = identity();
        assert_eq!(
            roster.offer(
                &v,
                &bound(
                    &overlapping,
                    "10.0.0.6:7946",
                    range(&overlapping, "10.244.1.0")
                )
            ),
            Ok(true)
        );
        for node in [&kube, &overlapping] {
            assert_eq!(
                roster.check_endpoint(node.public_key(), at("10.244.1.9"), &v),
                Err(TrustError::EndpointNotOwned)
            );
        }
        // So do nested ones: a /16 holding another node's /24.
        let broad = identity();
        let wide = themis_trust::AddressRange {
            mesh: "demo".into(),
            node_key: *broad.public_key(),
            network: "10.245.0.0".parse().unwrap(),
            prefix_len: 16,
            issued_at: NOW - 1,
            not_after: None,
        };
        let wide = Signed::sign(&mesh.root_key, themis_trust::ADDRESS_RANGE_LABEL, &wide).encode();
        let narrow = identity();
        for (node, address, grant) in [
            (&broad, "10.0.0.7:7946", wide),
            (&narrow, "10.0.0.8:7946", range(&narrow, "10.245.3.0")),
        ] {
            assert_eq!(roster.offer(&v, &bound(node, address, grant)), Ok(true));
        }
        for node in [&broad, &narrow] {
            assert_eq!(
                roster.check_endpoint(node.public_key(), at("10.245.3.4"), &v),
                Err(TrustError::EndpointNotOwned)
            );
        }
        assert_eq!(
            roster.check_endpoint(broad.public_key(), at("10.245.4.4"), &v),
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
        let grant = mesh.grant_range(&kube, "10.244.1.0");
        let announcement = Announcement {
            mesh: "demo".into(),
            address: "10.0.0.1:7946".parse().unwrap(),
            issued_at: NOW,
            leaving: false,
            address_range: Some(grant_digest(&grant)),
        };
        let credentials = Credentials {
            admission: Some(mesh.admit(&kube, None)),
            announcement: Signed::sign(&kube, ANNOUNCEMENT_LABEL, &announcement).encode(),
            address_range: Some(grant.clone()),
        };
        let mut roster = Roster::default();
        assert_eq!(roster.offer(&v, &credentials), Ok(true));
        let at = |ip: &str| Some(SocketAddr::new(ip.parse().unwrap(), 15006));
        let key = kube.public_key();
        let logged = |issued_at: u64, digest: [u8; 32]| {
            let grant = RangeGrant {
                net: "10.244.1.0/24".parse().unwrap(),
                not_after: None,
                issued_at,
            };
            (digest, grant)
        };
        let log = |ranges: Vec<([u8; 32], LoggedRange)>| LogMembership {
            admissions: Vec::new(),
            ranges: ranges.into_iter().collect(),
        };
        // Wherever the bound grant is held, the announcement passed on is the one signed.
        let passes_on_as_signed = |roster: &Roster| {
            let passed = roster.passed_on(key, &v).unwrap();
            assert_eq!(passed.announcement, credentials.announcement);
        };
        // The log holds this grant (or none for the node): it counts.
        for ranges in [vec![], vec![(*key, logged(NOW - 10, grant_digest(&grant)))]] {
            let logs_it = !ranges.is_empty();
            roster.set_log(log(ranges), &v);
            assert_eq!(roster.check_endpoint(key, at("10.244.1.9"), &v), Ok(()));
            passes_on_as_signed(&roster);
            // The log's newest grant is held once, in the log's list.
            assert_eq!(roster.ranges.is_empty(), logs_it);
        }
        // Another grant for the node signed in the same millisecond: the log's (the
        // first in log order) counts, the bound one does not.
        roster.set_log(log(vec![(*key, logged(NOW - 10, [8; 32]))]), &v);
        assert_eq!(
            roster.check_endpoint(key, at("10.244.1.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        passes_on_as_signed(&roster);
        // A newer grant for the node in the log: the old range is withdrawn.
        roster.set_log(log(vec![(*key, logged(NOW - 5, [7; 32]))]), &v);
        assert_eq!(
            roster.check_endpoint(key, at("10.244.1.9"), &v),
            Err(TrustError::EndpointNotOwned)
        );
        assert_eq!(roster.check_endpoint(key, at("10.0.0.1"), &v), Ok(()));
        passes_on_as_signed(&roster);
        // Another node's newer grant changes nothing for this one.
        let someone = *identity().public_key();
        roster.set_log(log(vec![(someone, logged(NOW, [7; 32]))]), &v);
        assert_eq!(roster.check_endpoint(key, at("10.244.1.9"), &v), Ok(()));
        passes_on_as_signed(&roster);
        // The log names this grant again: held once again, and it counts.
        roster.set_log(
            log(vec![(*key, logged(NOW - 10, grant_digest(&grant)))]),
            &v,
        );
        assert!(roster.ranges.is_empty());
        assert_eq!(roster.check_endpoint(key, at("10.244.1.9"), &v), Ok(()));
        passes_on_as_signed(&roster);
    }

    /// Endpoint checks look their rivals up in an index (the log's ranges by network,
    /// members by address) or scan the few ranges held beside the log: both give the
    /// same answers, for overlapping, nested and squatted addresses.
    #[test]
    fn endpoint_checks_agree_whether_the_log_or_the_credentials_hold_the_ranges() {
        let mesh = Mesh::new();
        let v = mesh.verifier();
        let grant = |node: &Identity, net: &str| {
            let net: IpNet = net.parse().unwrap();
            let body = themis_trust::AddressRange {
                mesh: "demo".into(),
                node_key: *node.public_key(),
                network: net.network(),
                prefix_len: net.prefix_len(),
                issued_at: NOW - 1,
                not_after: None,
            };
            let signed = Signed::sign(&mesh.root_key, themis_trust::ADDRESS_RANGE_LABEL, &body);
            (signed.encode(), net)
        };
        let nodes: Vec<(Identity, &str, Option<&str>)> = vec![
            (identity(), "10.0.0.1:7946", Some("10.244.1.0/24")),
            (identity(), "10.0.0.2:7946", Some("10.244.1.0/24")),
            (identity(), "10.0.0.3:7946", Some("10.245.0.0/16")),
            (identity(), "10.0.0.4:7946", Some("10.245.3.0/24")),
            (identity(), "10.246.0.9:7946", None),
            (identity(), "[::ffff:10.0.0.5]:7946", Some("10.246.0.0/24")),
            (identity(), "10.0.0.5:7946", None),
        ];
        let mut roster = Roster::default();
        let mut log = LogMembership::default();
        let mut digests = Vec::new();
        for (node, address, range) in &nodes {
            let granted = range.map(|net| grant(node, net));
            digests.push(granted.as_ref().map(|(bytes, _)| grant_digest(bytes)));
            let body = Announcement {
                mesh: "demo".into(),
                address: address.parse().unwrap(),
                issued_at: NOW,
                leaving: false,
                address_range: granted.as_ref().map(|(bytes, _)| grant_digest(bytes)),
            };
            let credentials = Credentials {
                admission: Some(mesh.admit(node, None)),
                announcement: Signed::sign(node, ANNOUNCEMENT_LABEL, &body).encode(),
                address_range: granted.as_ref().map(|(bytes, _)| bytes.clone()),
            };
            assert_eq!(roster.offer(&v, &credentials), Ok(true));
            log.admissions.push((*node.public_key(), None));
            if let Some((bytes, net)) = granted {
                let held = RangeGrant {
                    net,
                    not_after: None,
                    issued_at: NOW - 1,
                };
                log.ranges
                    .push((*node.public_key(), (grant_digest(&bytes), held)));
            }
        }
        let ips = [
            "10.244.1.9",
            "10.245.3.4",
            "10.245.4.4",
            "10.246.0.9",
            "10.246.0.10",
            "10.0.0.1",
            "10.0.0.3",
            "10.0.0.5",
            "192.0.2.1",
        ];
        let answers = |roster: &Roster| -> Vec<bool> {
            let mut all = Vec::new();
            for (node, _, _) in &nodes {
                for ip in ips {
                    let at = SocketAddr::new(ip.parse().unwrap(), 15006);
                    all.push(
                        roster
                            .check_endpoint(node.public_key(), Some(at), &v)
                            .is_ok(),
                    );
                }
            }
            all
        };
        let carried = answers(&roster);
        roster.set_log(log, &v);
        assert!(roster.ranges.is_empty(), "the log holds every range now");
        assert_eq!(answers(&roster), carried);
        // What is owned, and by whom (row: node, column: IP).
        let owned: Vec<(usize, &str)> = carried
            .iter()
            .enumerate()
            .filter(|(_, ok)| **ok)
            .map(|(i, _)| (i / ips.len(), ips[i % ips.len()]))
            .collect();
        // The two same /24s and the /24 inside the /16 are neither node's; the /16
        // outside it is; a squatter (4) takes nothing from the range of 5, and 6 and
        // 5 (IPv4-mapped) announcing one address both lose it.
        assert_eq!(
            owned,
            [
                (0, "10.0.0.1"),
                (2, "10.245.4.4"),
                (2, "10.0.0.3"),
                (5, "10.246.0.9"),
                (5, "10.246.0.10"),
            ]
        );
        // The index stays true through changes: each step's checks make it, the next
        // step changes the roster, and the checks after agree with a scan.
        let scan_agrees = |roster: &Roster, v: &Verifier<'_>| {
            for (node, _, _) in &nodes {
                for ip in ips {
                    let at = Some(SocketAddr::new(ip.parse().unwrap(), 15006));
                    let indexed = roster.check_endpoint(node.public_key(), at, v).is_ok();
                    assert_eq!(
                        indexed,
                        owned_by_scan(roster, node.public_key(), at, v),
                        "{ip}"
                    );
                }
            }
        };
        let announce_again = |roster: &mut Roster, n: usize, address: &str, at: u64, leaving| {
            let body = Announcement {
                mesh: "demo".into(),
                address: address.parse().unwrap(),
                issued_at: at,
                leaving,
                address_range: digests[n],
            };
            let announcement = Signed::sign(&nodes[n].0, ANNOUNCEMENT_LABEL, &body).encode();
            let credentials = Credentials {
                admission: None,
                announcement,
                address_range: None,
            };
            assert_eq!(roster.offer(&v, &credentials), Ok(true));
        };
        scan_agrees(&roster, &v);
        // 6 moves onto 0's address, then says it leaves (1 ms later: allowed), and 4
        // moves into 2's /16.
        let then = NOW + MIN_REANNOUNCE_MS;
        announce_again(&mut roster, 6, "10.0.0.1:7946", then, false);
        scan_agrees(&roster, &v);
        assert!(roster
            .check_endpoint(
                nodes[0].0.public_key(),
                Some("10.0.0.1:1".parse().unwrap()),
                &v
            )
            .is_err());
        announce_again(&mut roster, 6, "10.0.0.1:7946", then + 1, true);
        scan_agrees(&roster, &v);
        announce_again(&mut roster, 4, "10.245.4.4:7946", then, false);
        scan_agrees(&roster, &v);
        // A week on, all but 4 and 6 fell silent: pruned, and the index with them.
        let week_on = Verifier {
            now_ms: NOW + ANNOUNCEMENT_LIFETIME_MS,
            ..v
        };
        scan_agrees(&roster, &week_on);
        assert_eq!(roster.prune(&week_on), nodes.len() - 2);
        scan_agrees(&roster, &week_on);
    }

    /// In a mesh whose agents hold the trust log, a member's credentials are its
    /// announcement alone: the admission and the range grant it binds are the log's.
    /// Until the log holds them they must come along, and they are passed on then;
    /// once it does, they are dropped and passed on no more.
    #[test]
    fn the_logs_statements_need_not_travel() {
        let mesh = Mesh::new();
        let node = identity();
        let v = mesh.verifier();
        let key = *node.public_key();
        let grant = mesh.grant_range(&node, "10.244.3.0");
        let body = Announcement {
            mesh: "demo".into(),
            address: "10.0.0.3:7946".parse().unwrap(),
            issued_at: NOW,
            leaving: false,
            address_range: Some(grant_digest(&grant)),
        };
        let announcement = Signed::sign(&node, ANNOUNCEMENT_LABEL, &body).encode();
        let bare = Credentials {
            admission: None,
            announcement: announcement.clone(),
            address_range: None,
        };
        let full = Credentials {
            admission: Some(mesh.admit(&node, None)),
            address_range: Some(grant.clone()),
            ..bare.clone()
        };
        // Nobody showed the key admitted: refused before any signature is checked.
        let mut roster = Roster::default();
        assert_eq!(roster.offer(&v, &bare), Err(TrustError::NotAdmitted));
        // With the statements along: held, and passed on with them, byte for byte.
        assert_eq!(roster.offer(&v, &full), Ok(true));
        assert_eq!(roster.credentials(&v), vec![full.clone()]);
        // The log brings them: they are dropped, and the announcement travels alone.
        let logged = RangeGrant {
            net: "10.244.3.0/24".parse().unwrap(),
            not_after: None,
            issued_at: NOW - 10,
        };
        let log = LogMembership {
            admissions: vec![(key, None)],
            ranges: vec![(key, (grant_digest(&grant), logged))],
        };
        roster.set_log(log.clone(), &v);
        assert_eq!(roster.credentials(&v), vec![bare.clone()]);
        let at = |ip: &str| Some(SocketAddr::new(ip.parse().unwrap(), 15006));
        assert_eq!(roster.check_endpoint(&key, at("10.244.3.9"), &v), Ok(()));
        // An agent that holds the log takes the bare announcement, range and all.
        let mut other = Roster::default();
        other.set_log(log, &v);
        assert_eq!(other.len(), 0, "admitted, not heard from yet");
        assert_eq!(other.members(&v).len(), 0);
        assert_eq!(other.offer(&v, &bare), Ok(true));
        assert_eq!(other.check_endpoint(&key, at("10.244.3.9"), &v), Ok(()));
        assert_eq!(other.members(&v).len(), 1);
    }

    /// A member is held packed and its announcement encoded again when passed on, so
    /// an announcement must be in the one encoding that gives back: another spelling
    /// of the same fields, even correctly signed, is refused.
    #[test]
    fn an_announcement_in_another_encoding_is_refused() {
        let mesh = Mesh::new();
        let node = identity();
        let v = mesh.verifier();
        let body = Announcement {
            mesh: "demo".into(),
            address: "10.0.0.3:1".parse().unwrap(),
            issued_at: NOW,
            leaving: false,
            address_range: None,
        };
        let mut bytes = postcard::to_allocvec(&body).unwrap();
        // mesh (1 + 4), the address family (1), the IPv4 address (4), then the port,
        // 1, as a one-byte varint: spelled in two bytes instead.
        assert_eq!(bytes[10], 1);
        bytes.splice(10..11, [0x81, 0x00]);
        let signature = node.sign_statement(ANNOUNCEMENT_LABEL, &bytes);
        let announcement = Signed {
            signer: *node.public_key(),
            body: bytes,
            signature,
        }
        .encode();
        let mut roster = Roster::default();
        assert_eq!(
            roster.offer(&v, &creds(&mesh.admit(&node, None), &announcement)),
            Err(TrustError::Malformed)
        );
        assert!(roster.is_empty());
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
        mesh.revoke(&revoked);
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

    /// Review findings: an admission the log holds that has expired admits no new
    /// announcement (the member would be dropped at once and its news passed on in
    /// a loop); revoked and expired admissions are not kept as admitted keys; a
    /// member whose announcement lapses stays admitted by the log, not a member; and
    /// admitted keys that never announce do not count against [`MAX_MEMBERS`].
    #[test]
    fn only_current_admissions_in_the_log_admit() {
        let mut mesh = Mesh::new();
        let (lapsing, revoked, quiet) = (identity(), identity(), identity());
        let key = |node: &Identity| *node.public_key();
        mesh.revoke(&revoked);
        // Many admitted keys that never announce, more than a roster holds members.
        let mut admissions: Vec<([u8; 32], Option<u64>)> = (0..MAX_MEMBERS as u32 + 10)
            .map(|i| {
                let mut k = [0xee; 32];
                k[..4].copy_from_slice(&i.to_be_bytes());
                (k, None)
            })
            .collect();
        admissions.extend([
            (key(&lapsing), Some(NOW + 1_000)),
            (key(&revoked), None),
            (key(&quiet), None),
        ]);
        let log = LogMembership {
            admissions,
            ranges: Vec::new(),
        };
        let mut roster = Roster::default();
        roster.set_log(log, &mesh.verifier());
        assert_eq!(roster.admitted(&key(&revoked)), None);
        assert_eq!(roster.admitted(&key(&lapsing)), Some(Some(NOW + 1_000)));
        let bare = |node: &Identity, when: u64| Credentials {
            admission: None,
            announcement: announce(node, "10.0.0.9:7946", when, false),
            address_range: None,
        };
        let v = mesh.verifier();
        assert_eq!(
            roster.offer(&v, &bare(&quiet, NOW)),
            Ok(true),
            "room beside them"
        );
        assert_eq!(roster.offer(&v, &bare(&lapsing, NOW)), Ok(true));
        // The admission expires: no newer announcement is taken, and the member goes.
        let later = Verifier {
            now_ms: NOW + 2_000,
            ..mesh.verifier()
        };
        let again = bare(&lapsing, NOW + MIN_REANNOUNCE_MS);
        assert_eq!(roster.offer(&later, &again), Err(TrustError::Expired));
        assert_eq!(roster.prune(&later), 1);
        assert_eq!(roster.len(), 1);
        // A member whose announcement lapses is admitted still, by the log.
        let much_later = Verifier {
            now_ms: NOW + ANNOUNCEMENT_LIFETIME_MS,
            ..mesh.verifier()
        };
        assert_eq!(roster.prune(&much_later), 1);
        assert!(roster.is_empty());
        assert_eq!(roster.admitted(&key(&quiet)), Some(None));
        let back = bare(&quiet, NOW + ANNOUNCEMENT_LIFETIME_MS);
        assert_eq!(roster.offer(&much_later, &back), Ok(true));
        // An announcement past its lifetime is refused outright.
        let stale = bare(&quiet, NOW);
        assert_eq!(
            roster.offer(&much_later, &stale),
            Ok(false),
            "older than held"
        );
        let mut fresh = Roster::default();
        fresh.set_log(
            LogMembership {
                admissions: vec![(key(&quiet), None)],
                ranges: Vec::new(),
            },
            &much_later,
        );
        assert_eq!(fresh.offer(&much_later, &stale), Err(TrustError::Expired));
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
