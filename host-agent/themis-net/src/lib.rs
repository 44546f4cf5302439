//! The Themis secure channel over TCP, driven by tokio: the transport of the host
//! agents (every DHT message travels over it) and of anything else that talks Themis
//! outside Envoy.
//!
//! * [`connect`] and [`accept`] run the three-message key agreement of `themis-core`
//!   on a TCP connection and return a [`SecureStream`] bound to an authenticated peer.
//! * [`serve`] answers requests on a listener, concurrently per connection, holding
//!   what peers that are not admitted can make it keep within [`Limits`]
//!   ([`serve_with`]): a connection is admitted when its [`Handler`] says a request
//!   proved the peer belongs ([`Standing`]), not merely when its handshake is done.
//! * [`Client`] sends requests to peers by id and address over pooled connections,
//!   matching responses to requests by their sealed `reply_to`.
//!
//! Why TCP and not UDP: the channel's stream mode then detects dropped, replayed and
//! reordered records by itself (each record must be the next one), the handshake needs
//! no retransmission logic (a bad or lost message just ends the connection), one
//! connection carries many requests so the handshake cost is paid once per peer, and
//! records up to 1 MiB need no fragmentation. `docs/AGENT.md` has the longer argument.

mod client;
mod codec;
mod limits;
mod server;
mod stream;

pub use client::{Client, ClientConfig};
pub use codec::FrameCodec;
pub use limits::{
    source_of, Gate, Guarded, Limits, Permit, DEFAULT_HELLOS_PER_SOURCE, DEFAULT_MAX_PER_PEER,
    DEFAULT_MAX_UNADMITTED_FRAME,
};
pub use server::{serve, serve_with, Answer, Handler, NetStats, Standing};
pub use stream::{accept, connect, Received, SecureReader, SecureStream, SecureWriter};

use std::time::Duration;

use themis_core::{ChannelError, HandshakeConfig, HandshakeError, WireError};

/// Settings of a connection.
#[derive(Clone, Debug)]
pub struct Config {
    /// The key agreement and channel settings.
    pub handshake: HandshakeConfig,
    /// How long the whole key agreement may take before the connection is dropped.
    pub handshake_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            handshake: HandshakeConfig::default(),
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a connection or request failed.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The socket failed.
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent bytes that are not a Themis message.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// The key agreement failed.
    #[error("handshake: {0}")]
    Handshake(#[from] HandshakeError),
    /// A record was refused.
    #[error("record: {0}")]
    Channel(#[from] ChannelError),
    /// The peer closed the connection, or answered a handshake message by closing it
    /// (a peer that is not the id asked for, or that refuses us, does that).
    #[error("the peer closed the connection")]
    Closed,
    /// A handshake message arrived where a record was expected.
    #[error("the peer sent a handshake message inside the session")]
    UnexpectedHandshake,
    /// Nothing came in time.
    #[error("timed out {0}")]
    Timeout(&'static str),
    /// A fresh Hello over a handshake limit, refused before any public-key work; the
    /// reason is the limit's label in [`NetStats::limits`].
    #[error("refused the handshake: {0}")]
    Busy(&'static str),
}

impl NetError {
    /// A short, stable name for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            NetError::Io(_) => "io",
            NetError::Wire(_) => "malformed",
            NetError::Handshake(HandshakeError::KeyIdMismatch) => "key_id_mismatch",
            NetError::Handshake(HandshakeError::BadSignature) => "bad_signature",
            NetError::Handshake(HandshakeError::NotForMe) => "not_for_me",
            NetError::Handshake(HandshakeError::WrongMesh) => "wrong_mesh",
            NetError::Handshake(HandshakeError::Wire(_)) => "malformed",
            NetError::Handshake(_) => "handshake",
            NetError::Channel(ChannelError::Authentication) => "authentication",
            NetError::Channel(ChannelError::Replay(_) | ChannelError::OutOfOrder { .. }) => {
                "replay"
            }
            NetError::Channel(_) => "record",
            NetError::Closed => "closed",
            NetError::UnexpectedHandshake => "unexpected_handshake",
            NetError::Timeout(_) => "timeout",
            NetError::Busy(_) => "busy",
        }
    }
}
