//! What both ends of a session agree on in the handshake and the channel then runs
//! with: the role each took, the channel's ordering and the settings. Apart from the
//! handshake and the channel so that neither imports the other for them.

use crate::suite::Suite;

/// How records are ordered on the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelMode {
    /// A reliable, ordered transport (TCP): each record must be the next one.
    Stream,
    /// Datagrams (UDP) may be lost or reordered: each sequence number is accepted
    /// once, within a window of [`REPLAY_WINDOW`](crate::channel::REPLAY_WINDOW)
    /// behind the highest seen.
    Datagram,
}

/// Which end of the handshake a session came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sent message 1.
    Initiator,
    /// Answered it.
    Responder,
}

/// Records per traffic key before the channel ratchets to a new one. Records carry
/// up to 1 MiB, so 2^18 of them are at most 2^38 bytes (2^34 AES blocks) per key: the
/// data volume TLS 1.3 allows one AES-GCM key (2^24.5 records of 16 KiB).
pub const DEFAULT_RECORDS_PER_KEY: u64 = 1 << 18;

/// Settings both roles use.
#[derive(Clone, Debug)]
pub struct HandshakeConfig {
    /// AEAD suites, most preferred first. The initiator offers them all; the
    /// responder picks its first one that was offered.
    pub suites: &'static [Suite],
    /// How the resulting channel orders records.
    pub mode: ChannelMode,
    /// Records per traffic key before rekeying (at least 2). Both sides use the
    /// smaller of their two settings, agreed in the signed handshake.
    pub records_per_key: u64,
}

/// The smallest rekey interval accepted (0 would divide by zero; 1, a key per record,
/// only costs). Settings below it are raised to it.
pub(crate) const MIN_RECORDS_PER_KEY: u64 = 2;

impl HandshakeConfig {
    /// The rekey interval this side offers or accepts: its setting, raised to the
    /// minimum.
    pub(crate) fn offered_records_per_key(&self) -> u64 {
        self.records_per_key.max(MIN_RECORDS_PER_KEY)
    }
}

impl Default for HandshakeConfig {
    fn default() -> Self {
        HandshakeConfig {
            suites: Suite::preferred(),
            mode: ChannelMode::Stream,
            records_per_key: DEFAULT_RECORDS_PER_KEY,
        }
    }
}
