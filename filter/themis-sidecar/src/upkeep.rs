//! What a sidecar keeps from its local agent between connections, and when it asks
//! again: sans-IO, in quinn-proto's shape, one machine every runtime drives. Three
//! lanes, each with at most one call in flight:
//!
//! * [`Lane::Identity`]: the workload's public identity (the Wasm filter, which can
//!   have the agent sign before it holds a delegated key);
//! * [`Lane::Delegation`]: a handshake key the agent delegates, renewed when the agent
//!   says (half its life at most), stopped when the agent refuses it (403);
//! * [`Lane::Revocations`]: the mesh's revocations, by long poll where the agent
//!   holds them, so a new one is in force as soon as the agent has it.
//!
//! The driver asks [`Upkeep::poll_request`] for a lane's call, makes it, gives the
//! answer to [`Upkeep::handle_answer`] and acts on the [`Learned`] it returns;
//! [`Upkeep::poll_timeout`] says when the lane wants to ask again. The Wasm root drives
//! every lane from its tick; the native module runs a thread per lane.

use std::time::Duration;

use ring::rand::SecureRandom;
use themis_contracts::{api, paths};
use themis_core::delegation::{Credential, DelegatedKey, HandshakeSigner};
use themis_core::identity::PublicIdentity;
use themis_core::MeshName;
use themis_trust::MeshRoot;

use crate::agent::{self, Cursor, NextPoll, RevocationList, REVOCATIONS_WAIT_MS};
use crate::config::Config;

/// One of the things kept from the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    Identity,
    Delegation,
    Revocations,
}

/// A call to the agent's local API a lane asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub path: String,
    /// A POST with this JSON body; a GET without.
    pub json: Option<Vec<u8>>,
    /// How long the call may take (a long poll's wait included).
    pub timeout: Duration,
}

/// What an answer taught, for the driver to act on.
pub enum Learned {
    /// Nothing new (the same revocations, an identity already known, an answer no
    /// call of the lane's is waiting for).
    Nothing,
    /// The workload's public identity, learned for the first time.
    Identity(PublicIdentity),
    /// A delegated credential to sign handshakes with from now on. `news` when one
    /// starts, or its endorsement comes or goes: worth a log line at info.
    Credential {
        credential: Box<Credential>,
        renew_at: u64,
        news: bool,
    },
    /// No delegated key this time: the agent signs each handshake meanwhile, where
    /// the runtime can ask it. `refused` (a 403: the workload revoked, or this proxy
    /// no longer its owner): the credential held stops speaking for the workload.
    NoCredential { refused: bool, why: String },
    /// A new revocation list, verified.
    Revocations(RevocationList),
    /// An answer that could not be used, to log; the lane asks again later.
    Failed(String),
}

impl std::fmt::Debug for Learned {
    // A credential's key stays out of logs and test output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Learned::Nothing => f.write_str("Nothing"),
            Learned::Identity(identity) => write!(f, "Identity({})", identity.printable_id()),
            Learned::Credential { renew_at, news, .. } => {
                write!(f, "Credential {{ renew_at: {renew_at}, news: {news} }}")
            }
            Learned::NoCredential { refused, why } => {
                write!(f, "NoCredential {{ refused: {refused}, why: {why:?} }}")
            }
            Learned::Revocations(list) => write!(f, "Revocations({})", list.revocations.len()),
            Learned::Failed(why) => write!(f, "Failed({why:?})"),
        }
    }
}

/// Waits that grow on repeated failure, from `first` to `cap`.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    first: u64,
    cap: u64,
    next: u64,
}

impl Backoff {
    const fn new(first: u64, cap: u64) -> Self {
        Backoff {
            first,
            cap,
            next: first,
        }
    }

    /// The wait after one more failure.
    fn fail(&mut self) -> u64 {
        let wait = self.next;
        self.next = (self.next * 2).min(self.cap);
        wait
    }

    fn reset(&mut self) {
        self.next = self.first;
    }
}

/// A delegation's retries: a second at first (an agent that restarts, a workload
/// registered a moment later), growing to 8 s (an agent older than delegation
/// answers 404 every time, and the agent signs meanwhile).
const DELEGATION_RETRY: Backoff = Backoff::new(1_000, 8_000);
/// The identity's: every 100 ms at first, as the workload is usually being
/// registered while the sidecar starts, growing to a second.
const IDENTITY_RETRY: Backoff = Backoff::new(100, 1_000);
/// A revocation poll that failed or came back at once with nothing new is asked
/// again this much later: never a loop against an agent.
const REVOCATIONS_RETRY_MS: u64 = 1_000;

/// A lane's pace: whether it is kept, whether its call is in flight, and when it asks
/// next.
#[derive(Debug)]
struct Pace {
    kept: bool,
    in_flight: bool,
    next_at: u64,
}

impl Pace {
    fn new(kept: bool) -> Self {
        Pace {
            kept,
            in_flight: false,
            next_at: 0,
        }
    }
}

/// One workload's upkeep.
pub struct Upkeep {
    workload: String,
    mesh: MeshName,
    root: MeshRoot,
    timeout: Duration,
    revocation_poll: Duration,

    identity: Pace,
    identity_retry: Backoff,
    /// The workload's public key, once learned (from its identity or a
    /// delegation): a delegation for another key is not taken.
    known_key: Option<[u8; 32]>,

    delegation: Pace,
    delegation_retry: Backoff,
    /// The key of the delegation asked for.
    delegating: Option<DelegatedKey>,
    /// Whether the credential held carries the workload's endorsement (`None`: none
    /// held).
    carries_endorsement: Option<bool>,

    revocations: Pace,
    revocations_asked: u64,
    /// Where the agent's list is read from next, page by page; kept through a
    /// failure (a restarted agent answers a stale position from its first).
    cursor: Option<Cursor>,
    /// `false` once the agent showed it is older than paging: then the whole list,
    /// by `next_poll`.
    paged: bool,
    next_poll: Option<NextPoll>,
    revocations_held: usize,
    /// When the revocations were last read (Unix ms), else first asked for: how
    /// fresh what the filter holds is ([`Upkeep::revocations_fresh_since`]).
    revocations_read_at: Option<u64>,
    revocations_first_asked: Option<u64>,
    /// How long the feed had been silent when it was last read (ms).
    silence_ms: u64,
    /// Whether the last revocations call failed.
    revocations_failed: bool,
    /// What the feed's alarm last said ([`Upkeep::revocations_alarm`]).
    feed: Feed,
    revocations_max_age: Duration,
}

/// A revocations feed silent this long (three held polls missed) raises the alarm.
pub const REVOCATIONS_ALARM_MS: u64 = 60_000;

/// The state of the revocations feed, as the alarm tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// Read within [`REVOCATIONS_ALARM_MS`].
    Fresh,
    /// Not read for longer: a revocation may be missing.
    Stale,
    /// Not read for longer than `revocations_max_age`: new callers are refused.
    Closed,
}

/// A change of the feed's state, to be logged once: the state and the feed's age
/// (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedAlarm {
    pub feed: Feed,
    pub age_ms: u64,
}

impl std::fmt::Display for FeedAlarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.age_ms / 1_000;
        match self.feed {
            Feed::Fresh => write!(f, "the revocations are read again (after {secs} s)"),
            Feed::Stale => write!(
                f,
                "the revocations have not been read for {secs} s: a revocation may be missing"
            ),
            Feed::Closed => write!(
                f,
                "the revocations have not been read for {secs} s, past revocations_max_age_secs: new callers are refused until the agent answers (inbound)"
            ),
        }
    }
}

/// Whether a feed fresh since `fresh_since` is past `max_age` at `now`: `Some(age in
/// ms)` if so (then new callers are refused). Never asked yet: not past.
pub fn revocations_stale(fresh_since: Option<u64>, now: u64, max_age: Duration) -> Option<u64> {
    let age = now.saturating_sub(fresh_since?);
    (age > max_age.as_millis() as u64).then_some(age)
}

impl Upkeep {
    /// The upkeep of `config`'s workload, keeping `lanes`.
    pub fn new(config: &Config, lanes: &[Lane]) -> Self {
        Upkeep {
            workload: config.workload.clone(),
            mesh: config.mesh.clone(),
            root: config.mesh_root.clone(),
            timeout: config.timeout,
            revocation_poll: config.revocation_poll,
            identity: Pace::new(lanes.contains(&Lane::Identity)),
            identity_retry: IDENTITY_RETRY,
            known_key: None,
            delegation: Pace::new(lanes.contains(&Lane::Delegation)),
            delegation_retry: DELEGATION_RETRY,
            delegating: None,
            carries_endorsement: None,
            revocations: Pace::new(lanes.contains(&Lane::Revocations)),
            revocations_asked: 0,
            cursor: None,
            paged: true,
            next_poll: None,
            revocations_held: 0,
            revocations_read_at: None,
            revocations_first_asked: None,
            silence_ms: 0,
            revocations_failed: false,
            feed: Feed::Fresh,
            revocations_max_age: config.revocations_max_age,
        }
    }

    /// Whether `lane` is kept at all.
    pub fn keeps(&self, lane: Lane) -> bool {
        self.pace(lane).kept
    }

    fn pace(&self, lane: Lane) -> &Pace {
        match lane {
            Lane::Identity => &self.identity,
            Lane::Delegation => &self.delegation,
            Lane::Revocations => &self.revocations,
        }
    }

    fn pace_mut(&mut self, lane: Lane) -> &mut Pace {
        match lane {
            Lane::Identity => &mut self.identity,
            Lane::Delegation => &mut self.delegation,
            Lane::Revocations => &mut self.revocations,
        }
    }

    /// When `lane` wants to ask next (Unix ms): `None` while its call is in flight or
    /// when it has nothing left to ask.
    pub fn poll_timeout(&self, lane: Lane) -> Option<u64> {
        let pace = self.pace(lane);
        let done = lane == Lane::Identity && self.known_key.is_some();
        (pace.kept && !pace.in_flight && !done).then_some(pace.next_at)
    }

    /// The call `lane` makes now, if it is due; it is in flight until
    /// [`Upkeep::handle_answer`] takes its answer. `rng` draws a delegation's key.
    pub fn poll_request(
        &mut self,
        lane: Lane,
        now: u64,
        rng: &dyn SecureRandom,
    ) -> Option<Request> {
        if self.poll_timeout(lane).is_none_or(|at| now < at) {
            return None;
        }
        let request = match lane {
            Lane::Identity => Request {
                path: paths::workload_identity(&self.workload),
                json: None,
                timeout: self.timeout,
            },
            Lane::Delegation => {
                let Ok(key) = DelegatedKey::generate(rng) else {
                    // No randomness now: as a failed call.
                    self.delegation.next_at = now + self.delegation_retry.fail();
                    return None;
                };
                let body = serde_json::to_vec(&api::DelegateRequest {
                    delegated_key: hex::encode(key.public_key()),
                    lifetime_secs: None,
                })
                .expect("a delegation request serialises");
                self.delegating = Some(key);
                Request {
                    path: paths::workload_delegate(&self.workload),
                    json: Some(body),
                    timeout: self.timeout,
                }
            }
            Lane::Revocations => {
                self.revocations_asked = now;
                self.revocations_first_asked.get_or_insert(now);
                let (path, held) = self.revocations_path();
                Request {
                    path,
                    json: None,
                    timeout: match held {
                        true => self.timeout + Duration::from_millis(REVOCATIONS_WAIT_MS),
                        false => self.timeout,
                    },
                }
            }
        };
        self.pace_mut(lane).in_flight = true;
        Some(request)
    }

    /// Takes the answer to `lane`'s call: the agent's `status` and `body`, or `None`
    /// and the reason when no answer came (refused, timed out, no connection).
    pub fn handle_answer(
        &mut self,
        lane: Lane,
        status: Option<u16>,
        body: &[u8],
        now: u64,
    ) -> Learned {
        self.pace_mut(lane).in_flight = false;
        match lane {
            Lane::Identity => self.take_identity(status, body, now).unwrap_or_else(|why| {
                self.identity.next_at = now + self.identity_retry.fail();
                Learned::Failed(why)
            }),
            Lane::Delegation => self.take_delegation(status, body, now),
            Lane::Revocations => self.take_revocations(status, body, now),
        }
    }

    /// An identity answer to a call a connection made itself (one that needs the
    /// identity before the lane has it): read as the lane's own, without touching the
    /// lane's pace.
    pub fn identity_answered(&mut self, status: Option<u16>, body: &[u8], now: u64) -> Learned {
        match self.take_identity(status, body, now) {
            Ok(learned) => learned,
            Err(why) => Learned::Failed(why),
        }
    }

    fn take_identity(
        &mut self,
        status: Option<u16>,
        body: &[u8],
        now: u64,
    ) -> Result<Learned, String> {
        if self.known_key.is_some() {
            return Ok(Learned::Nothing);
        }
        let identity = match status {
            Some(200) => agent::parse_public_identity(body, &self.workload, &self.mesh)
                .map_err(|e| e.to_string())?,
            _ => {
                return Err(format!(
                    "the agent has no identity for workload {} ({})",
                    self.workload,
                    answered(status, body)
                ))
            }
        };
        self.known_key = Some(*identity.public_key());
        // A delegation refused while the agent did not know the workload yet is asked
        // for again now, not after its back-off.
        if self.carries_endorsement.is_none() && !self.delegation.in_flight {
            self.delegation.next_at = now;
            self.delegation_retry.reset();
        }
        Ok(Learned::Identity(identity))
    }

    fn take_delegation(&mut self, status: Option<u16>, body: &[u8], now: u64) -> Learned {
        let Some(key) = self.delegating.take() else {
            return Learned::Nothing;
        };
        let retry = now + self.delegation_retry.fail();
        self.delegation.next_at = retry;
        if status != Some(200) {
            let refused = status == Some(403);
            if refused {
                self.carries_endorsement = None;
            }
            return Learned::NoCredential {
                refused,
                why: format!(
                    "the agent delegated no handshake key to workload {} ({})",
                    self.workload,
                    answered(status, body)
                ),
            };
        }
        let parsed = agent::parse_delegated(body, key, &self.workload, &self.mesh, now);
        let (credential, renew_at) = match parsed {
            Ok(parsed) => parsed,
            Err(e) => return Learned::Failed(e.to_string()),
        };
        let key = *credential.identity().public_key();
        if self.known_key.is_some_and(|known| known != key) {
            return Learned::Failed(format!(
                "the agent delegated for another key than workload {}'s; not taken",
                self.workload
            ));
        }
        self.known_key = Some(key);
        self.delegation_retry.reset();
        self.delegation.next_at = renew_at;
        let carries = !credential.endorsement().is_empty();
        let news = self.carries_endorsement != Some(carries);
        self.carries_endorsement = Some(carries);
        Learned::Credential {
            credential: Box::new(credential),
            renew_at,
            news,
        }
    }

    /// The revocations' next path, and whether the agent may hold it (never right
    /// after a failed call: an agent back from a silence is seen at once).
    fn revocations_path(&self) -> (String, bool) {
        match (self.paged, self.cursor) {
            (true, Some(cursor)) if self.revocations_failed => (cursor.unheld_path(), false),
            (true, Some(cursor)) => (cursor.path(), !cursor.behind()),
            (true, None) => (Cursor::first_path(), false),
            (false, _) => (
                NextPoll::path(self.next_poll),
                self.next_poll.is_some_and(|n| n.long_poll),
            ),
        }
    }

    /// The age past which the feed's alarm says new callers are refused: the inbound
    /// role's `revocations_max_age` (a native runtime serves every role of its
    /// workload, and only the inbound role refuses).
    pub fn set_revocations_max_age(&mut self, max_age: Duration) {
        self.revocations_max_age = max_age;
    }

    /// Since when the revocations held are known fresh (Unix ms): their last read,
    /// or before any, the first ask; `None` before that. A runtime refuses new
    /// callers by it ([`revocations_stale`]).
    pub fn revocations_fresh_since(&self) -> Option<u64> {
        self.revocations_read_at.or(self.revocations_first_asked)
    }

    /// How long ago the revocations were last read from the agent (ms); `None`:
    /// never.
    pub fn revocations_age(&self, now: u64) -> Option<u64> {
        self.revocations_read_at.map(|at| now.saturating_sub(at))
    }

    /// The feed's alarm, when its state changed since last asked (to be logged
    /// once): stale past [`REVOCATIONS_ALARM_MS`], closed past
    /// `revocations_max_age`, fresh again once read.
    pub fn revocations_alarm(&mut self, now: u64) -> Option<FeedAlarm> {
        let since = self.revocations_fresh_since()?;
        let age_ms = now.saturating_sub(since);
        let feed = if revocations_stale(Some(since), now, self.revocations_max_age).is_some() {
            Feed::Closed
        } else if age_ms > REVOCATIONS_ALARM_MS {
            Feed::Stale
        } else {
            Feed::Fresh
        };
        if feed == self.feed {
            return None;
        }
        self.feed = feed;
        // Fresh again: how long the silence lasted, not the new age.
        let age_ms = if feed == Feed::Fresh {
            self.silence_ms
        } else {
            age_ms
        };
        Some(FeedAlarm { feed, age_ms })
    }

    fn take_revocations(&mut self, status: Option<u16>, body: &[u8], now: u64) -> Learned {
        let read = match status {
            Some(200) if self.paged => self.take_revocation_page(body),
            Some(200) => self.take_revocation_list(body),
            Some(400) if self.paged => {
                // An agent from before paging refuses its query: the whole list.
                self.paged = false;
                Err(format!(
                    "revocations: {}; asking for the whole list",
                    answered(status, body)
                ))
            }
            _ => Err(format!("revocations: {}", answered(status, body))),
        };
        self.revocations_failed = read.is_err();
        let (list, held_by_agent) = match read {
            Ok(read) => read,
            Err(why) => {
                // Asked plainly, a second later.
                self.next_poll = None;
                self.revocations.next_at = now + REVOCATIONS_RETRY_MS;
                return Learned::Failed(why);
            }
        };
        self.silence_ms = now.saturating_sub(self.revocations_fresh_since().unwrap_or(now));
        self.revocations_read_at = Some(now);
        let changed = list.is_some();
        self.revocations.next_at = match held_by_agent {
            // Pages left to read: at once (a page that brought nothing is not
            // followed at once: an agent claiming more than it gives cannot spin us).
            _ if changed && self.paged && self.cursor.is_some_and(|c| c.behind()) => now,
            // Held by the agent, or bringing news: asked again at once. Answered at
            // once with nothing new: a second later, never a loop.
            true if changed || now.saturating_sub(self.revocations_asked) >= 1_000 => now,
            true => now + REVOCATIONS_RETRY_MS,
            // An agent that does not hold polls: every `revocation_poll`.
            false => now + self.revocation_poll.as_millis() as u64,
        };
        match list {
            Some(list) => Learned::Revocations(list),
            None => Learned::Nothing,
        }
    }

    /// A page of the agent's list: its revocations (`None` if none) and whether the
    /// agent holds polls (a paging one always does).
    fn take_revocation_page(
        &mut self,
        body: &[u8],
    ) -> Result<(Option<RevocationList>, bool), String> {
        let page = agent::parse_revocation_page(body, &self.root).map_err(|e| e.to_string())?;
        let Some(cursor) = page.cursor else {
            // An older agent that took the query and listed everything.
            self.paged = false;
            return self.take_revocation_list(body);
        };
        self.cursor = Some(cursor);
        let list = (!page.list.revocations.is_empty()).then_some(page.list);
        Ok((list, true))
    }

    /// An older agent's whole list: verified unless it lists as many as it did last.
    fn take_revocation_list(
        &mut self,
        body: &[u8],
    ) -> Result<(Option<RevocationList>, bool), String> {
        let list = agent::parse_new_revocations(body, &self.root, self.revocations_held)
            .map_err(|e| e.to_string())?;
        self.next_poll = NextPoll::of(body);
        if let Some(list) = &list {
            self.revocations_held = list.revocations.len();
        }
        Ok((list, self.next_poll.is_some_and(|n| n.long_poll)))
    }
}

/// The log line of a credential taken in: the same in every runtime.
pub fn credential_line(workload: &str, credential: &Credential, renew_at: u64) -> String {
    format!(
        "workload {workload} signs its handshakes with a delegated key until {} \
         (renewed at {renew_at}), carrying {}",
        credential.delegation().not_after_ms,
        match credential.endorsement().is_empty() {
            false => "its endorsement",
            true => "no endorsement",
        }
    )
}

/// An answer's status and body, or that none came, for a log line.
fn answered(status: Option<u16>, body: &[u8]) -> String {
    let body = String::from_utf8_lossy(&body[..body.len().min(256)]);
    match status {
        Some(status) => format!("status {status}: {body}"),
        None => format!("no answer: {body}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{delegated, public_identity, HOUR, NOW};
    use ring::rand::SystemRandom;
    use std::ops::Range;
    use themis_core::Identity;
    use themis_trust::{Revocation, Signed, REVOCATION_LABEL};

    struct Agent {
        rng: SystemRandom,
        root: Identity,
        workload: Identity,
        config: Config,
        /// The configuration's JSON.
        json: String,
    }

    impl Agent {
        fn new() -> Agent {
            let rng = SystemRandom::new();
            let mesh = MeshName::new("demo").unwrap();
            let root = Identity::generate(mesh.clone(), &rng).unwrap();
            let json = format!(
                r#"{{"role":"inbound","mesh":"demo","mesh_root":"demo:{}","workload":"check",
                    "revocation_poll_secs":30,"policy":{{"allow_any_caller":true}}}}"#,
                hex::encode(root.public_key())
            );
            Agent {
                config: Config::parse(json.as_bytes()).unwrap(),
                json,
                workload: Identity::generate(mesh, &rng).unwrap(),
                root,
                rng,
            }
        }

        /// The agent's answer to `request` (a delegation), endorsed or not.
        fn delegate(&self, request: &Request, endorsed: bool) -> Vec<u8> {
            let asked: api::DelegateRequest =
                serde_json::from_slice(request.json.as_ref().unwrap()).unwrap();
            let mut key = [0; 32];
            hex::decode_to_slice(&asked.delegated_key, &mut key).unwrap();
            let endorsement = endorsed.then_some(&b"an endorsement"[..]);
            serde_json::to_vec(&delegated(&self.workload, key, endorsement)).unwrap()
        }

        /// A root-signed revocation of id `n` as the agent lists it.
        fn revocation(&self, n: u16) -> api::Revocation {
            let mut id = [0; 32];
            id[..2].copy_from_slice(&n.to_le_bytes());
            let signed = Signed::sign(
                &self.root,
                REVOCATION_LABEL,
                &Revocation {
                    mesh: "demo".into(),
                    id,
                    issued_at: 1,
                    reason: String::new(),
                },
            );
            api::Revocation {
                id: String::new(),
                issued_at: 1,
                reason: String::new(),
                revocation: hex::encode(signed.encode()),
                logged: None,
            }
        }

        /// An older agent's answer listing `n` root-signed revocations.
        fn revocations(&self, n: u8, long_poll: bool) -> Vec<u8> {
            serde_json::to_vec(&api::Revocations {
                checkpoint: None,
                revocations: (0..u16::from(n)).map(|i| self.revocation(i)).collect(),
                long_poll,
                list: None,
                from: None,
                total: None,
            })
            .unwrap()
        }

        /// A paging agent's answer: the revocations `ids` of its list `list` from
        /// position `from`, of `total`.
        fn page(&self, list: u64, from: usize, total: usize, ids: Range<u16>) -> Vec<u8> {
            serde_json::to_vec(&api::Revocations {
                checkpoint: None,
                revocations: ids.map(|i| self.revocation(i)).collect(),
                long_poll: true,
                list: Some(list),
                from: Some(from),
                total: Some(total),
            })
            .unwrap()
        }
    }

    fn upkeep(agent: &Agent, lanes: &[Lane]) -> Upkeep {
        Upkeep::new(&agent.config, lanes)
    }

    #[test]
    fn a_delegation_is_asked_once_at_a_time_and_renewed_when_the_agent_says() {
        let agent = Agent::new();
        let mut upkeep = upkeep(&agent, &[Lane::Delegation, Lane::Revocations]);
        let lane = Lane::Delegation;
        assert_eq!(upkeep.poll_timeout(lane), Some(0));
        let request = upkeep.poll_request(lane, NOW, &agent.rng).unwrap();
        assert_eq!(request.path, "/v1/workloads/check/delegate");
        // In flight: nothing more is asked, however late.
        assert_eq!(upkeep.poll_timeout(lane), None);
        assert!(upkeep.poll_request(lane, NOW + HOUR, &agent.rng).is_none());
        let body = agent.delegate(&request, false);
        let Learned::Credential { renew_at, news, .. } =
            upkeep.handle_answer(lane, Some(200), &body, NOW)
        else {
            panic!("a credential")
        };
        assert!(news);
        assert_eq!(renew_at, NOW + HOUR / 2);
        assert_eq!(upkeep.poll_timeout(lane), Some(renew_at));
        assert!(upkeep
            .poll_request(lane, renew_at - 1, &agent.rng)
            .is_none());
        // Renewed with its endorsement now: news; renewed the same again: not.
        for (endorsed, expect_news) in [(true, true), (true, false), (false, true)] {
            let request = upkeep.poll_request(lane, renew_at, &agent.rng).unwrap();
            let body = agent.delegate(&request, endorsed);
            match upkeep.handle_answer(lane, Some(200), &body, NOW) {
                Learned::Credential { news, .. } => assert_eq!(news, expect_news),
                other => panic!("{other:?}"),
            }
        }
        // An answer no call waits for (a replayed or late one) teaches nothing.
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &body, NOW),
            Learned::Nothing
        ));
        // A lane not kept never asks.
        assert_eq!(upkeep.poll_timeout(Lane::Identity), None);
        assert!(upkeep
            .poll_request(Lane::Identity, NOW, &agent.rng)
            .is_none());
    }

    #[test]
    fn a_refusal_stops_the_credential_and_failures_back_off() {
        let agent = Agent::new();
        let mut upkeep = upkeep(&agent, &[Lane::Delegation]);
        let lane = Lane::Delegation;
        let mut now = NOW;
        for (status, wait) in [
            (Some(500), 1_000),
            (None, 2_000),
            (Some(404), 4_000),
            (Some(503), 8_000),
            (Some(500), 8_000),
        ] {
            upkeep.poll_request(lane, now, &agent.rng).unwrap();
            match upkeep.handle_answer(lane, status, b"down", now) {
                Learned::NoCredential {
                    refused: false,
                    why,
                } => assert!(why.contains("down")),
                other => panic!("{other:?}"),
            }
            assert_eq!(upkeep.poll_timeout(lane), Some(now + wait));
            now += wait;
        }
        // A credential resets the back-off; a 403 then stops it.
        let request = upkeep.poll_request(lane, now, &agent.rng).unwrap();
        let body = agent.delegate(&request, true);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &body, now),
            Learned::Credential { .. }
        ));
        let renew_at = upkeep.poll_timeout(lane).unwrap();
        upkeep.poll_request(lane, renew_at, &agent.rng).unwrap();
        assert!(matches!(
            upkeep.handle_answer(lane, Some(403), b"revoked", renew_at),
            Learned::NoCredential { refused: true, .. }
        ));
        assert_eq!(upkeep.poll_timeout(lane), Some(renew_at + 1_000));
        // The next credential is news again.
        let request = upkeep
            .poll_request(lane, renew_at + 1_000, &agent.rng)
            .unwrap();
        let body = agent.delegate(&request, true);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &body, now),
            Learned::Credential { news: true, .. }
        ));
    }

    #[test]
    fn the_identity_is_asked_until_known_and_a_delegation_for_another_key_is_not_taken() {
        let agent = Agent::new();
        let mut upkeep = upkeep(&agent, &[Lane::Identity, Lane::Delegation]);
        // The delegation is refused while the agent does not know the workload yet.
        upkeep
            .poll_request(Lane::Delegation, NOW, &agent.rng)
            .unwrap();
        upkeep.handle_answer(Lane::Delegation, Some(404), b"unknown", NOW);
        assert_eq!(upkeep.poll_timeout(Lane::Delegation), Some(NOW + 1_000));
        upkeep
            .poll_request(Lane::Identity, NOW, &agent.rng)
            .unwrap();
        assert!(matches!(
            upkeep.handle_answer(Lane::Identity, Some(404), b"unknown", NOW),
            Learned::Failed(_)
        ));
        assert_eq!(upkeep.poll_timeout(Lane::Identity), Some(NOW + 100));
        upkeep
            .poll_request(Lane::Identity, NOW + 100, &agent.rng)
            .unwrap();
        let body = serde_json::to_vec(&public_identity(&agent.workload)).unwrap();
        assert!(matches!(
            upkeep.handle_answer(Lane::Identity, Some(200), &body, NOW + 100),
            Learned::Identity(_)
        ));
        // Known: the identity is never asked again, and the delegation is asked now.
        assert_eq!(upkeep.poll_timeout(Lane::Identity), None);
        assert_eq!(upkeep.poll_timeout(Lane::Delegation), Some(NOW + 100));
        // An agent that then delegates for another workload key: not taken.
        let request = upkeep
            .poll_request(Lane::Delegation, NOW + 100, &agent.rng)
            .unwrap();
        let impostor = Agent {
            workload: Identity::generate(agent.config.mesh.clone(), &agent.rng).unwrap(),
            ..Agent::new()
        };
        let body = impostor.delegate(&request, true);
        match upkeep.handle_answer(Lane::Delegation, Some(200), &body, NOW + 100) {
            Learned::Failed(why) => assert!(why.contains("another key"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn revocations_are_long_polled_where_the_agent_holds_them_and_never_in_a_loop() {
        let agent = Agent::new();
        let mut upkeep = upkeep(&agent, &[Lane::Revocations]);
        let lane = Lane::Revocations;
        let ask = |upkeep: &mut Upkeep, now| upkeep.poll_request(lane, now, &agent.rng).unwrap();
        // First a page from the first, at once; an agent from before paging answers
        // with its whole list, and is then asked for the whole list.
        let first = ask(&mut upkeep, NOW);
        assert_eq!(first.path, Cursor::first_path());
        assert_eq!(first.timeout, agent.config.timeout);
        let listed = agent.revocations(1, true);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &listed, NOW),
            Learned::Revocations(list) if list.revocations.len() == 1
        ));
        // News: asked again at once, by long poll (waiting longer).
        assert_eq!(upkeep.poll_timeout(lane), Some(NOW));
        let long = ask(&mut upkeep, NOW);
        assert_eq!(long.path, paths::revocations_after(1, REVOCATIONS_WAIT_MS));
        assert_eq!(
            long.timeout,
            agent.config.timeout + Duration::from_millis(REVOCATIONS_WAIT_MS)
        );
        // Answered at once with nothing new: a second later, not in a loop.
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &listed, NOW + 10),
            Learned::Nothing
        ));
        assert_eq!(upkeep.poll_timeout(lane), Some(NOW + 10 + 1_000));
        // Held by the agent, nothing new: asked again at once.
        ask(&mut upkeep, NOW + 1_010);
        upkeep.handle_answer(lane, Some(200), &listed, NOW + 21_010);
        assert_eq!(upkeep.poll_timeout(lane), Some(NOW + 21_010));
        // A failure: a plain poll a second later.
        ask(&mut upkeep, NOW + 21_010);
        assert!(matches!(
            upkeep.handle_answer(lane, None, b"timed out", NOW + 21_010),
            Learned::Failed(_)
        ));
        assert_eq!(upkeep.poll_timeout(lane), Some(NOW + 22_010));
        assert_eq!(ask(&mut upkeep, NOW + 22_010).path, paths::REVOCATIONS);
        // An agent that holds no polls: every `revocation_poll`, and only a new count
        // is verified again.
        let old = agent.revocations(2, false);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &old, NOW + 22_010),
            Learned::Revocations(list) if list.revocations.len() == 2
        ));
        assert_eq!(upkeep.poll_timeout(lane), Some(NOW + 52_010));
        assert_eq!(ask(&mut upkeep, NOW + 52_010).path, paths::REVOCATIONS);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &old, NOW + 52_010),
            Learned::Nothing
        ));
        // A list the root did not sign: unusable, and the list held stands.
        ask(&mut upkeep, NOW + 82_010);
        let forged = Agent::new().revocations(3, true);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &forged, NOW + 82_010),
            Learned::Failed(_)
        ));
        assert_eq!(upkeep.revocations_held, 2);
        // A shorter list (an agent restarted with less, which may hold one the
        // filter lacks) is verified and handed on: the runtimes merge it, so nothing
        // is taken back (themis-trust's merged_revocations_are_never_taken_back), and
        // the agent's own count is what the next poll compares.
        ask(&mut upkeep, NOW + 112_010);
        let shorter = agent.revocations(1, false);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &shorter, NOW + 112_010),
            Learned::Revocations(list) if list.revocations.len() == 1
        ));
        assert_eq!(upkeep.revocations_held, 1);
    }

    #[test]
    fn revocations_are_read_by_page_from_where_the_filter_stands_and_kept_through_a_failure() {
        let agent = Agent::new();
        let mut upkeep = upkeep(&agent, &[Lane::Revocations]);
        let lane = Lane::Revocations;
        let ask = |upkeep: &mut Upkeep, now| upkeep.poll_request(lane, now, &agent.rng).unwrap();
        let page = paths::MAX_REVOCATIONS_PAGE;
        let held = agent.config.timeout + Duration::from_millis(REVOCATIONS_WAIT_MS);
        assert_eq!(upkeep.revocations_age(NOW), None, "never read");
        // 600 revocations: three pages, each asked at once and not held.
        let first = ask(&mut upkeep, NOW);
        assert_eq!(first.path, paths::revocations_since(0, 0, 0));
        assert_eq!(first.timeout, agent.config.timeout);
        let mut at = 0;
        while at < 600 {
            let n = page.min(600 - at);
            let answer = agent.page(7, at, 600, at as u16..(at + n) as u16);
            assert!(matches!(
                upkeep.handle_answer(lane, Some(200), &answer, NOW),
                Learned::Revocations(list) if list.revocations.len() == n
            ));
            at += n;
            assert_eq!(upkeep.poll_timeout(lane), Some(NOW), "asked again at once");
            let next = ask(&mut upkeep, NOW);
            let wait = if at < 600 { 0 } else { REVOCATIONS_WAIT_MS };
            assert_eq!(next.path, paths::revocations_since(7, at, wait));
        }
        // An agent that says there is more but gives nothing is not asked in a loop.
        let mut liar = self::upkeep(&agent, &[Lane::Revocations]);
        ask(&mut liar, NOW);
        let empty = agent.page(7, 0, 1_000_000, 0..0);
        assert!(matches!(
            liar.handle_answer(lane, Some(200), &empty, NOW),
            Learned::Nothing
        ));
        assert_eq!(liar.poll_timeout(lane), Some(NOW + 1_000));
        // All read: held by the agent, and a held answer with nothing new asks again.
        assert_eq!(upkeep.revocations_age(NOW + 5_000), Some(5_000));
        let quiet = agent.page(7, 600, 600, 0..0);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &quiet, NOW + 20_000),
            Learned::Nothing
        ));
        assert_eq!(upkeep.revocations_age(NOW + 20_000), Some(0));
        let held_poll = ask(&mut upkeep, NOW + 20_000);
        assert_eq!(
            held_poll.path,
            paths::revocations_since(7, 600, REVOCATIONS_WAIT_MS)
        );
        assert_eq!(held_poll.timeout, held);
        // A failure: a second later, from the same position (nothing read twice),
        // and the age grows.
        assert!(matches!(
            upkeep.handle_answer(lane, None, b"timed out", NOW + 45_000),
            Learned::Failed(_)
        ));
        assert_eq!(upkeep.revocations_age(NOW + 45_000), Some(25_000));
        assert_eq!(upkeep.poll_timeout(lane), Some(NOW + 46_000));
        let again = ask(&mut upkeep, NOW + 46_000);
        assert_eq!(again.path, paths::revocations_since(7, 600, 0), "not held");
        assert_eq!(again.timeout, agent.config.timeout);
        // A page the root did not sign: refused, the position stands.
        let forged = Agent::new().page(7, 600, 601, 600..601);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &forged, NOW + 46_000),
            Learned::Failed(_)
        ));
        assert_eq!(
            ask(&mut upkeep, NOW + 47_000).path,
            paths::revocations_since(7, 600, 0)
        );
        // The agent restarted (another list, answered from its first): read anew.
        let restarted = agent.page(9, 0, 2, 600..602);
        assert!(matches!(
            upkeep.handle_answer(lane, Some(200), &restarted, NOW + 47_000),
            Learned::Revocations(list) if list.revocations.len() == 2
        ));
        assert_eq!(
            ask(&mut upkeep, NOW + 47_000).path,
            paths::revocations_since(9, 2, REVOCATIONS_WAIT_MS)
        );
        // An agent from before paging refuses the query: the whole list from then on.
        let mut older = self::upkeep(&agent, &[Lane::Revocations]);
        ask(&mut older, NOW);
        assert!(matches!(
            older.handle_answer(lane, Some(400), b"unknown field `list`", NOW),
            Learned::Failed(why) if why.contains("whole list")
        ));
        assert_eq!(ask(&mut older, NOW + 1_000).path, paths::REVOCATIONS);
    }

    #[test]
    fn a_silent_feed_raises_the_alarm_then_closes_to_new_callers_and_says_when_it_is_back() {
        let agent = Agent::new();
        let mut upkeep = upkeep(&agent, &[Lane::Revocations]);
        let lane = Lane::Revocations;
        let max_age = agent.config.revocations_max_age;
        assert_eq!(max_age, Duration::from_secs(300), "the default");
        let stale = |u: &Upkeep, now| revocations_stale(u.revocations_fresh_since(), now, max_age);
        // Never asked: nothing to say, nothing refused.
        assert_eq!(upkeep.revocations_alarm(NOW), None);
        assert_eq!(stale(&upkeep, NOW), None);
        // Asked at start and never answered: the age runs from the first ask.
        upkeep.poll_request(lane, NOW, &agent.rng).unwrap();
        upkeep.handle_answer(lane, None, b"connection refused", NOW);
        assert_eq!(upkeep.revocations_alarm(NOW + 30_000), None);
        let alarm = upkeep.revocations_alarm(NOW + 61_000).unwrap();
        assert_eq!(alarm.feed, Feed::Stale);
        assert!(alarm.to_string().contains("61 s"), "{alarm}");
        assert_eq!(upkeep.revocations_alarm(NOW + 62_000), None, "said once");
        assert_eq!(stale(&upkeep, NOW + 300_000), None);
        assert_eq!(stale(&upkeep, NOW + 300_001), Some(300_001));
        let alarm = upkeep.revocations_alarm(NOW + 300_001).unwrap();
        assert_eq!(alarm.feed, Feed::Closed);
        // Read at last: fresh, said with how long the silence lasted.
        upkeep
            .poll_request(lane, NOW + 310_000, &agent.rng)
            .unwrap();
        let page = agent.page(7, 0, 0, 0..0);
        upkeep.handle_answer(lane, Some(200), &page, NOW + 310_000);
        assert_eq!(stale(&upkeep, NOW + 310_000), None);
        let alarm = upkeep.revocations_alarm(NOW + 310_000).unwrap();
        assert_eq!((alarm.feed, alarm.age_ms), (Feed::Fresh, 310_000));
        // A held poll's 20 s is far from either.
        assert_eq!(upkeep.revocations_alarm(NOW + 330_000), None);
        // The age bound is checked: under a minute would refuse callers at an
        // agent's restart.
        for age in ["59", "86401"] {
            let json = agent.json.replace(
                r#""revocation_poll_secs":30"#,
                &format!(r#""revocation_poll_secs":30,"revocations_max_age_secs":{age}"#),
            );
            let refused = Config::parse(json.as_bytes()).unwrap_err().to_string();
            assert!(refused.contains("revocations_max_age_secs"), "{refused}");
        }
    }
}
