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

use crate::agent::{self, NextPoll, RevocationList, REVOCATIONS_WAIT_MS};
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
    next_poll: Option<NextPoll>,
    revocations_held: usize,
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
            next_poll: None,
            revocations_held: 0,
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
                let long_poll = self.next_poll.is_some_and(|n| n.long_poll);
                Request {
                    path: NextPoll::path(self.next_poll),
                    json: None,
                    timeout: match long_poll {
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

    fn take_revocations(&mut self, status: Option<u16>, body: &[u8], now: u64) -> Learned {
        let parsed = match status {
            Some(200) => agent::parse_new_revocations(body, &self.root, self.revocations_held)
                .map_err(|e| e.to_string()),
            _ => Err(format!("revocations: {}", answered(status, body))),
        };
        let list = match parsed {
            Ok(list) => list,
            Err(why) => {
                // Asked plainly, a second later.
                self.next_poll = None;
                self.revocations.next_at = now + REVOCATIONS_RETRY_MS;
                return Learned::Failed(why);
            }
        };
        self.next_poll = NextPoll::of(body);
        let changed = list.is_some();
        self.revocations.next_at = match self.next_poll.is_some_and(|n| n.long_poll) {
            // Held by the agent, or bringing news: asked again at once. Answered at
            // once with nothing new: a second later, never a loop.
            true if changed || now.saturating_sub(self.revocations_asked) >= 1_000 => now,
            true => now + REVOCATIONS_RETRY_MS,
            // An agent that does not hold polls: every `revocation_poll`.
            false => now + self.revocation_poll.as_millis() as u64,
        };
        match list {
            Some(list) => {
                self.revocations_held = list.revocations.len();
                Learned::Revocations(list)
            }
            None => Learned::Nothing,
        }
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
    use themis_core::Identity;
    use themis_trust::{Revocation, Signed, REVOCATION_LABEL};

    struct Agent {
        rng: SystemRandom,
        root: Identity,
        workload: Identity,
        config: Config,
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

        /// A revocations answer listing `n` root-signed revocations.
        fn revocations(&self, n: u8, long_poll: bool) -> Vec<u8> {
            let revocations = (0..n)
                .map(|i| {
                    let signed = Signed::sign(
                        &self.root,
                        REVOCATION_LABEL,
                        &Revocation {
                            mesh: "demo".into(),
                            id: [i; 32],
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
                })
                .collect();
            serde_json::to_vec(&api::Revocations {
                checkpoint: None,
                revocations,
                long_poll,
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
        // First a plain poll, at once.
        let first = ask(&mut upkeep, NOW);
        assert_eq!(first.path, paths::REVOCATIONS);
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
}
