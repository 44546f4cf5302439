//! The inbound role's session logic, independent of Envoy: Envoy's workers share no
//! memory but a key-value store with compare-and-swap ([`SharedStore`]), so each
//! session is a ticket (written once at the handshake) plus a replay window (updated
//! by compare-and-swap on every request), as `themis_core::shared` describes. Each
//! worker keeps the sessions it has rebuilt in a cache.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use ring::rand::SecureRandom;
use themis_core::shared::{SharedResponder, Ticket};
use themis_core::wire::RecordHeader;
use themis_core::{
    handshake, ChannelError, ChannelMode, HandshakeConfig, HandshakeError, Identity, ReplayWindow,
    SessionInfo,
};

/// The host's shared key-value store (Envoy's shared data).
pub trait SharedStore {
    /// The value and its compare-and-swap token.
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Writes `value` if `cas` is `None` or still current.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasConflict>;
}

/// Another worker wrote the key since it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CasConflict;

/// How often a request retries its window update when other workers keep winning.
const CAS_ATTEMPTS: usize = 16;

/// Why an inbound exchange was refused (the metric label and the status class).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// Message 1 was refused.
    #[error("handshake refused: {0}")]
    Handshake(#[from] HandshakeError),
    /// No such session here (never made, expired, or this Envoy restarted).
    #[error("unknown or expired session")]
    UnknownSession,
    /// The session's first request came without a valid key confirmation.
    #[error("the session is not confirmed")]
    Unconfirmed,
    /// The record failed: tampered, forged, replayed, truncated.
    #[error("record refused: {0}")]
    Record(#[from] ChannelError),
    /// Other workers kept updating the window; the request is refused, not lost.
    #[error("the session is too contended")]
    Contended,
}

impl Reject {
    /// The counter this rejection is counted under.
    pub fn reason(&self) -> &'static str {
        match self {
            Reject::Handshake(_) => "handshake",
            Reject::UnknownSession => "unknown_session",
            Reject::Unconfirmed => "unconfirmed",
            Reject::Record(ChannelError::Replay(_)) => "replay",
            Reject::Record(_) => "tampered",
            Reject::Contended => "contended",
        }
    }

    /// Whether the initiator should handshake again (its session is gone here).
    pub fn needs_new_session(&self) -> bool {
        matches!(self, Reject::UnknownSession | Reject::Unconfirmed)
    }
}

/// The handshake settings of the channel between Envoys: requests of a session may
/// overtake each other (several connections, several workers), so datagram mode.
pub fn channel_config() -> HandshakeConfig {
    HandshakeConfig {
        mode: ChannelMode::Datagram,
        ..HandshakeConfig::default()
    }
}

const PENDING: u8 = 0;
const CONFIRMED: u8 = 1;

fn ticket_key(session_id: u64) -> String {
    format!("themis.inbound.ticket.{session_id:016x}")
}

fn window_key(session_id: u64) -> String {
    format!("themis.inbound.window.{session_id:016x}")
}

/// A stored ticket: state, expiry (Unix ms), then the ticket.
fn entry(state: u8, expires_ms: u64, ticket: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(9 + ticket.len());
    value.push(state);
    value.extend_from_slice(&expires_ms.to_le_bytes());
    value.extend_from_slice(ticket);
    value
}

fn read_entry(value: &[u8]) -> Option<(u8, u64, Ticket)> {
    let (&state, rest) = value.split_first()?;
    let (expires, ticket) = rest.split_at_checked(8)?;
    let expires = u64::from_le_bytes(expires.try_into().ok()?);
    Some((state, expires, Ticket::decode(ticket).ok()?))
}

struct Cached {
    responder: SharedResponder,
    expires_ms: u64,
}

/// A request that opened.
pub struct OpenedRequest {
    /// Its sequence number (the response is sealed under it).
    pub seq: u64,
    /// The session it came on.
    pub session_id: u64,
    /// The authenticated peer.
    pub peer: SessionInfo,
    /// The plaintext envelope.
    pub payload: Vec<u8>,
}

/// One worker's inbound sessions.
#[derive(Default)]
pub struct InboundSessions {
    cache: HashMap<u64, Cached>,
    /// Sessions this worker created, to remove from the store when they expire.
    created: Vec<(u64, u64)>,
}

impl InboundSessions {
    /// Answers message 1 and stores the new session's ticket and window.
    pub fn accept_hello(
        &mut self,
        store: &dyn SharedStore,
        me: &Identity,
        hello: &[u8],
        rng: &dyn SecureRandom,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(SessionInfo, Vec<u8>), Reject> {
        let (pending, reply) = handshake::respond(me, hello, &channel_config(), rng)?;
        let ticket = Ticket::from(&pending);
        let id = ticket.session_id();
        let expires_ms = now_ms.saturating_add(ttl_ms);
        // The window first: a worker that sees the ticket always finds its window.
        store
            .set(&window_key(id), &ReplayWindow::new().to_bytes(), None)
            .map_err(|CasConflict| Reject::Contended)?;
        store
            .set(
                &ticket_key(id),
                &entry(PENDING, expires_ms, &ticket.encode()),
                None,
            )
            .map_err(|CasConflict| Reject::Contended)?;
        self.created.push((id, expires_ms));
        Ok((ticket.info().clone(), reply))
    }

    /// Opens a request record (with message 3 on a session's first requests).
    pub fn open_request(
        &mut self,
        store: &dyn SharedStore,
        record: &[u8],
        confirm: Option<&[u8]>,
        now_ms: u64,
    ) -> Result<OpenedRequest, Reject> {
        let session_id = RecordHeader::decode(record)
            .map_err(ChannelError::from)?
            .session_id;
        let cached = self.session(store, session_id, confirm, now_ms)?;
        let wkey = window_key(session_id);
        for _ in 0..CAS_ATTEMPTS {
            let (bytes, cas) = store.get(&wkey).ok_or(Reject::UnknownSession)?;
            let mut window =
                ReplayWindow::from_bytes(&bytes).map_err(|_| Reject::UnknownSession)?;
            let mut buf = record.to_vec();
            let opened = cached.responder.open_request(&mut buf, &mut window)?;
            let (seq, len) = (opened.seq, opened.payload.len());
            if store.set(&wkey, &window.to_bytes(), Some(cas)).is_ok() {
                // The plaintext sits after the header, decrypted in place.
                let start = themis_core::wire::RECORD_HEADER_LEN;
                buf.truncate(start + len);
                buf.drain(..start);
                return Ok(OpenedRequest {
                    seq,
                    session_id,
                    peer: cached.responder.info().clone(),
                    payload: buf,
                });
            }
        }
        Err(Reject::Contended)
    }

    /// Seals the response to an opened request.
    pub fn seal_reply(
        &mut self,
        session_id: u64,
        seq: u64,
        payload: &[u8],
    ) -> Result<Vec<u8>, Reject> {
        let cached = self
            .cache
            .get_mut(&session_id)
            .ok_or(Reject::UnknownSession)?;
        Ok(cached.responder.seal_reply(seq, payload)?)
    }

    /// The worker's view of a session: cached, or rebuilt from the store (checking
    /// message 3 if the store says nobody has yet).
    fn session(
        &mut self,
        store: &dyn SharedStore,
        session_id: u64,
        confirm: Option<&[u8]>,
        now_ms: u64,
    ) -> Result<&mut Cached, Reject> {
        if self
            .cache
            .get(&session_id)
            .is_some_and(|c| c.expires_ms <= now_ms)
        {
            self.cache.remove(&session_id);
            return Err(Reject::UnknownSession);
        }
        let slot = match self.cache.entry(session_id) {
            Entry::Occupied(cached) => return Ok(cached.into_mut()),
            Entry::Vacant(slot) => slot,
        };
        let key = ticket_key(session_id);
        let (value, _) = store.get(&key).ok_or(Reject::UnknownSession)?;
        let (state, expires_ms, ticket) = read_entry(&value).ok_or(Reject::UnknownSession)?;
        if expires_ms <= now_ms {
            return Err(Reject::UnknownSession);
        }
        if state != CONFIRMED {
            let confirm = confirm.ok_or(Reject::Unconfirmed)?;
            ticket.check_confirm(confirm)?;
            // Idempotent: every worker that checks the same message 3 writes the same.
            let _ = store.set(&key, &entry(CONFIRMED, expires_ms, &ticket.encode()), None);
        }
        Ok(slot.insert(Cached {
            responder: SharedResponder::new(&ticket),
            expires_ms,
        }))
    }

    /// Forgets expired sessions: the cache, and the store entries this worker made.
    /// Returns how many sessions this worker created that ended.
    pub fn expire(&mut self, store: &dyn SharedStore, now_ms: u64) -> usize {
        self.cache.retain(|_, c| c.expires_ms > now_ms);
        let before = self.created.len();
        self.created.retain(|&(id, expires_ms)| {
            let live = expires_ms > now_ms;
            if !live {
                let _ = store.set(&ticket_key(id), &[], None);
                let _ = store.set(&window_key(id), &[], None);
            }
            live
        });
        before - self.created.len()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use themis_core::handshake::Initiator;
    use themis_core::{MeshName, Session};

    use super::*;

    /// Envoy's shared data semantics: a version per key, bumped on every write.
    #[derive(Default)]
    struct Store(RefCell<HashMap<String, (Vec<u8>, u32)>>);

    impl SharedStore for Store {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.0
                .borrow()
                .get(key)
                .filter(|(v, _)| !v.is_empty())
                .cloned()
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), CasConflict> {
            let mut map = self.0.borrow_mut();
            let entry = map.entry(key.to_string()).or_default();
            if cas.is_some_and(|c| c != entry.1) {
                return Err(CasConflict);
            }
            *entry = (value.to_vec(), entry.1 + 1);
            Ok(())
        }
    }

    fn client_and_session(
        store: &Store,
        worker: &mut InboundSessions,
        now: u64,
    ) -> (Session, Vec<u8>) {
        let rng = ring::rand::SystemRandom::new();
        let mesh = MeshName::new("demo").unwrap();
        let (a, b) = (
            Identity::generate(mesh.clone(), &rng).unwrap(),
            Identity::generate(mesh, &rng).unwrap(),
        );
        let (waiting, hello) = Initiator::start(&a, b.id(), &channel_config(), &rng).unwrap();
        let (info, reply) = worker
            .accept_hello(store, &b, &hello, &rng, now, 1000)
            .unwrap();
        assert_eq!(info.peer_id, a.id());
        waiting.read_hello_reply(&reply).unwrap()
    }

    #[test]
    fn the_handshake_on_one_worker_serves_requests_on_another() {
        let store = Store::default();
        let (mut w1, mut w2) = (InboundSessions::default(), InboundSessions::default());
        let (mut client, confirm) = client_and_session(&store, &mut w1, 0);
        let (seq, record) = client.seal(b"first", None).unwrap();
        // Without message 3 the first request is refused and the window is untouched.
        assert_eq!(
            w2.open_request(&store, &record, None, 1).err(),
            Some(Reject::Unconfirmed)
        );
        let opened = w2.open_request(&store, &record, Some(&confirm), 1).unwrap();
        assert_eq!(
            (opened.seq, opened.payload.as_slice()),
            (seq, &b"first"[..])
        );
        let mut response = w2.seal_reply(opened.session_id, seq, b"answer").unwrap();
        assert_eq!(
            client.open_in_place(&mut response).unwrap().payload,
            b"answer"
        );
        // Worker 1 finds the session confirmed in the store; no message 3 needed.
        let (_, second) = client.seal(b"second", None).unwrap();
        assert_eq!(
            w1.open_request(&store, &second, None, 2).unwrap().payload,
            b"second"
        );
        // A replay to either worker is refused through the shared window.
        for w in [&mut w1, &mut w2] {
            assert_eq!(
                w.open_request(&store, &second, None, 3)
                    .err()
                    .map(|r| r.reason()),
                Some("replay")
            );
        }
    }

    #[test]
    fn a_forged_confirmation_does_not_confirm() {
        let store = Store::default();
        let mut w = InboundSessions::default();
        let (mut client, mut confirm) = client_and_session(&store, &mut w, 0);
        let last = confirm.len() - 1;
        confirm[last] ^= 1;
        let (_, record) = client.seal(b"x", None).unwrap();
        assert_eq!(
            w.open_request(&store, &record, Some(&confirm), 1)
                .err()
                .map(|r| r.reason()),
            Some("handshake")
        );
        assert_eq!(
            w.open_request(&store, &record, None, 1).err(),
            Some(Reject::Unconfirmed)
        );
    }

    #[test]
    fn sessions_expire_everywhere() {
        let store = Store::default();
        let (mut w1, mut w2) = (InboundSessions::default(), InboundSessions::default());
        let (mut client, confirm) = client_and_session(&store, &mut w1, 0);
        let (_, record) = client.seal(b"x", None).unwrap();
        w2.open_request(&store, &record, Some(&confirm), 10)
            .unwrap();
        assert_eq!(w1.expire(&store, 1000), 1);
        let (_, late) = client.seal(b"y", None).unwrap();
        assert_eq!(
            w2.open_request(&store, &late, None, 1000).err(),
            Some(Reject::UnknownSession)
        );
        assert_eq!(
            w1.open_request(&store, &late, None, 1000).err(),
            Some(Reject::UnknownSession)
        );
    }

    #[test]
    fn garbage_is_refused_without_touching_the_store() {
        let store = Store::default();
        let mut w = InboundSessions::default();
        for bytes in [&b""[..], b"\x01\x04", &[0xff; 64]] {
            assert!(w.open_request(&store, bytes, None, 0).is_err());
        }
        assert!(store.0.borrow().is_empty());
    }
}
