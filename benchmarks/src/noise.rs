//! snow's Noise XX, both ends in memory, with snow's default resolver (pure Rust:
//! curve25519-dalek, the RustCrypto `chacha20poly1305` and `sha2` crates).

use snow::params::NoiseParams;
use snow::{Builder, Keypair, TransportState};

/// The Noise protocol benchmarked.
pub const PATTERN: &str = "Noise_XX_25519_ChaChaPoly_SHA256";
/// The longest Noise message.
pub const MAX_MESSAGE: usize = 65535;
/// The longest transport payload: a message minus its tag.
pub const MAX_PAYLOAD: usize = MAX_MESSAGE - 16;

/// The static key pairs of both ends, generated once.
pub struct NoisePeers {
    params: NoiseParams,
    initiator: Keypair,
    responder: Keypair,
}

impl NoisePeers {
    /// Two fresh static key pairs.
    pub fn generate() -> Self {
        let params: NoiseParams = PATTERN.parse().expect("valid pattern");
        let builder = Builder::new(params.clone());
        let initiator = builder.generate_keypair().expect("key pair");
        let responder = builder.generate_keypair().expect("key pair");
        NoisePeers {
            params,
            initiator,
            responder,
        }
    }

    fn builder<'a>(&self, keys: &'a Keypair) -> Builder<'a> {
        Builder::new(self.params.clone())
            .local_private_key(&keys.private)
            .expect("key")
    }

    /// A full XX handshake (`-> e`, `<- e, ee, s, es`, `-> s, se`) with empty
    /// payloads; each side checks the other's static key, as an application must.
    /// Returns the (initiator, responder) transport states.
    pub fn handshake(&self) -> (TransportState, TransportState) {
        let mut initiator = self
            .builder(&self.initiator)
            .build_initiator()
            .expect("initiator");
        let mut responder = self
            .builder(&self.responder)
            .build_responder()
            .expect("responder");
        let (mut message, mut payload) = ([0u8; 256], [0u8; 256]);
        let (mut from, mut to) = (&mut initiator, &mut responder);
        while !(from.is_handshake_finished() && to.is_handshake_finished()) {
            let len = from.write_message(&[], &mut message).expect("write");
            to.read_message(&message[..len], &mut payload)
                .expect("read");
            (from, to) = (to, from);
        }
        assert_eq!(
            initiator.get_remote_static(),
            Some(&self.responder.public[..])
        );
        assert_eq!(
            responder.get_remote_static(),
            Some(&self.initiator.public[..])
        );
        (
            initiator.into_transport_mode().expect("transport"),
            responder.into_transport_mode().expect("transport"),
        )
    }
}

/// Encrypts `payload` from `sender` in messages of at most [`MAX_PAYLOAD`] bytes and
/// decrypts each on `receiver` into `received`. `wire` holds one message
/// ([`MAX_MESSAGE`] bytes). Returns the bytes received.
pub fn send(
    sender: &mut TransportState,
    receiver: &mut TransportState,
    payload: &[u8],
    wire: &mut [u8],
    received: &mut [u8],
) -> usize {
    payload
        .chunks(MAX_PAYLOAD)
        .zip(received.chunks_mut(MAX_PAYLOAD))
        .fold(0, |got, (chunk, out)| {
            let len = sender.write_message(chunk, wire).expect("encrypt");
            got + receiver.read_message(&wire[..len], out).expect("decrypt")
        })
}
