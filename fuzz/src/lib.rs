//! What the fuzz targets share: deterministic randomness, two fixed identities,
//! deterministic handshakes between them, and fuzzer-chosen edits of genuine
//! messages (random bytes almost never get past a signature check; an edited genuine
//! message reaches every check behind it). [`trust`] holds the fixed mesh root and
//! credentials of the `trust_decoders` target.

use std::cell::UnsafeCell;
use std::fmt::Debug;
use std::mem::ManuallyDrop;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use ring::rand::SecureRandom;
use themis_core::handshake::{self, Initiator, DEFAULT_RECORDS_PER_KEY};
use themis_core::{
    AwaitingConfirm, AwaitingHelloReply, ChannelMode, HandshakeConfig, HandshakeError, Identity,
    MeshName, Session, Suite,
};

pub mod trust;

/// The mesh of the fixed identities.
pub const MESH: &str = "fuzz";

/// Runs `f` with a random number generator that returns `chunks`, one per call, in
/// order. `f` may use fewer chunks than given (a rejected message draws none); using
/// more panics, as the core documents exactly what each step draws. ring's fixed
/// generator asserts on drop that every chunk was drawn, so it is never dropped (it
/// owns nothing on the heap).
#[allow(deprecated)]
pub fn with_rng<T>(chunks: &[&[u8]], f: impl FnOnce(&dyn SecureRandom) -> T) -> T {
    let rng = ManuallyDrop::new(ring::test::rand::FixedSliceSequenceRandom {
        bytes: chunks,
        current: UnsafeCell::new(0),
    });
    f(&*rng)
}

/// The mesh name of the fixed identities.
pub fn mesh() -> MeshName {
    MeshName::new(MESH).expect("a valid mesh name")
}

/// The two fixed identities: the initiator and the responder of every handshake.
pub struct Peers {
    /// Sends message 1.
    pub initiator: Identity,
    /// Answers it.
    pub responder: Identity,
}

/// The fixed identities, made once per process.
pub fn peers() -> &'static Peers {
    static PEERS: OnceLock<Peers> = OnceLock::new();
    PEERS.get_or_init(|| {
        let identity = |seed: u8| {
            with_rng(&[&[seed; 32]], |rng| Identity::generate(mesh(), rng)).expect("identity")
        };
        Peers { initiator: identity(0xa1), responder: identity(0xb0) }
    })
}

/// Session settings, chosen by the fuzzer.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct Settings {
    chacha: bool,
    datagram: bool,
    /// `None`: the default; small values make the channel rekey every few records
    /// (the core raises 0 and 1 to 2).
    records_per_key: Option<u8>,
    /// Whether both sides take 64 KiB records.
    large_records: bool,
}

impl Settings {
    /// The handshake configuration both sides use.
    pub fn config(&self) -> HandshakeConfig {
        HandshakeConfig {
            suites: if self.chacha { Suite::ChaCha20Poly1305 } else { Suite::Aes256Gcm }.only(),
            mode: if self.datagram { ChannelMode::Datagram } else { ChannelMode::Stream },
            records_per_key: self.records_per_key.map_or(DEFAULT_RECORDS_PER_KEY, u64::from),
            carries: themis_core::Carries::HTTP2,
            options: if self.large_records {
                themis_core::StreamOptions::LARGE_RECORDS
            } else {
                themis_core::StreamOptions::NONE
            },
        }
    }
}

/// The clock of every handshake here (Unix ms): fixed, so runs reproduce.
pub const NOW_MS: u64 = 1_700_000_000_000;

/// The initiator's message 1 to the responder, always the same for one `config`, and
/// the state that waits for the answer.
pub fn start(config: &HandshakeConfig) -> (AwaitingHelloReply, Vec<u8>) {
    let peers = peers();
    with_rng(&[&[0x11; 32], &[0x12; 32]], |rng| {
        Initiator::start(&peers.initiator, peers.responder.id(), config, NOW_MS, rng)
    })
    .expect("the fixed initiator starts")
}

/// The responder's answer to `hello`, always the same for the same input.
pub fn respond(
    hello: &[u8],
    config: &HandshakeConfig,
) -> Result<(AwaitingConfirm, Vec<u8>), HandshakeError> {
    with_rng(&[&[0x21; 32], &[0x22; 32]], |rng| {
        let mut guard = themis_core::HelloGuard::default();
        handshake::respond(&peers().responder, hello, config, &mut guard, NOW_MS, rng)
    })
}

/// A complete deterministic handshake: the initiator's and the responder's sessions.
pub fn handshake(config: &HandshakeConfig) -> (Session, Session) {
    let (waiting, hello) = start(config);
    let (pending, reply) = respond(&hello, config).expect("the genuine message 1 is accepted");
    let (initiator, confirm) =
        waiting.read_hello_reply(&reply).expect("the genuine message 2 is accepted");
    let responder = pending.read_confirm(&confirm).expect("the genuine message 3 is accepted");
    (initiator, responder)
}

/// Checks that a state machine accepted `sent` exactly when it is the genuine
/// message: nobody but the fixed identities can sign, and the fuzzer cannot forge
/// a key confirmation.
pub fn assert_accepted_iff_genuine<T, E: Debug>(
    what: &str,
    result: &Result<T, E>,
    sent: &[u8],
    genuine: &[u8],
) {
    match result {
        Ok(_) => assert_eq!(sent, genuine, "a forged {what} was accepted"),
        Err(e) => assert_ne!(sent, genuine, "the genuine {what} was refused: {e:?}"),
    }
}

/// Checks that a freshly established pair talks both ways.
pub fn assert_session_works(initiator: &mut Session, responder: &mut Session) {
    fn ping(sender: &mut Session, receiver: &mut Session) {
        let (seq, mut record) = sender.seal(b"ping", Some(7)).expect("seal");
        let opened = receiver.open_in_place(&mut record).expect("a genuine record opens");
        assert_eq!(
            (opened.seq, opened.reply_to, &opened.payload[..]),
            (seq, Some(7), &b"ping"[..])
        );
    }
    ping(initiator, responder);
    ping(responder, initiator);
}

/// A handshake message as the fuzzer sends it.
#[derive(Arbitrary, Debug)]
pub enum Message {
    /// Bytes of its own.
    Raw(Vec<u8>),
    /// The genuine message, edited.
    Edited(Vec<Edit>),
}

impl Message {
    /// The bytes to deliver, given the genuine message of this step.
    pub fn bytes(&self, genuine: &[u8]) -> Vec<u8> {
        match self {
            Message::Raw(bytes) => bytes.clone(),
            Message::Edited(edits) => {
                let mut bytes = genuine.to_vec();
                edits.iter().for_each(|edit| edit.apply(&mut bytes));
                bytes
            }
        }
    }
}

/// One change to a message. Positions wrap around the message length.
#[derive(Arbitrary, Debug, Clone)]
pub enum Edit {
    /// XOR one byte with `mask`.
    Xor {
        /// Where.
        at: u16,
        /// What with.
        mask: u8,
    },
    /// Keep the first `len` bytes.
    Truncate {
        /// How many.
        len: u16,
    },
    /// Insert `bytes` at `at`.
    Insert {
        /// Where.
        at: u16,
        /// What.
        bytes: Vec<u8>,
    },
}

impl Edit {
    /// Applies the edit to `message`.
    pub fn apply(&self, message: &mut Vec<u8>) {
        match self {
            Edit::Xor { at, mask } => {
                if !message.is_empty() {
                    let at = usize::from(*at) % message.len();
                    message[at] ^= mask;
                }
            }
            Edit::Truncate { len } => message.truncate(usize::from(*len)),
            Edit::Insert { at, bytes } => {
                let at = usize::from(*at) % (message.len() + 1);
                message.splice(at..at, bytes.iter().copied());
            }
        }
    }
}
