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

/// What a sealed stream carries, negotiated in the handshake as ALPN is in TLS: the
/// initiator offers a set, the responder picks one (its own preference first). A
/// responder in front of an HTTP/2-only server (the Wasm runtime) offers only
/// [`Carries::HTTP2`]; a native one in front of an auto-detecting server takes any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Carries(pub u8);

impl Carries {
    /// HTTP/2 (gRPC, and TCP tunnelled in `CONNECT`): the stream starts with the
    /// HTTP/2 client preface.
    pub const HTTP2: Carries = Carries(0b001);
    /// HTTP/1.1 as the app wrote it.
    pub const HTTP1: Carries = Carries(0b010);
    /// Raw TCP bytes.
    pub const TCP: Carries = Carries(0b100);
    /// The preference order when several are acceptable.
    pub const PREFERENCE: [Carries; 3] = [Carries::HTTP2, Carries::HTTP1, Carries::TCP];

    /// The union of two sets.
    pub const fn or(self, other: Carries) -> Carries {
        Carries(self.0 | other.0)
    }

    /// True if every bit of `other` is in `self`.
    pub const fn contains(self, other: Carries) -> bool {
        other.0 != 0 && self.0 & other.0 == other.0
    }

    /// True if exactly one protocol is named.
    pub const fn is_single(self) -> bool {
        self.0.count_ones() == 1 && self.0 & !0b111 == 0
    }

    /// The first of `ours` (in [`Carries::PREFERENCE`] order) the peer offered.
    pub fn pick(offered: Carries, ours: Carries) -> Option<Carries> {
        Carries::PREFERENCE
            .into_iter()
            .find(|c| ours.contains(*c) && offered.contains(*c))
    }

    /// The ALPN-style name (`h2`, `http/1.1`, `tcp`) of a single protocol.
    pub fn name(self) -> &'static str {
        match self {
            Carries::HTTP2 => "h2",
            Carries::HTTP1 => "http/1.1",
            Carries::TCP => "tcp",
            _ => "several",
        }
    }
}

impl Default for Carries {
    fn default() -> Self {
        Carries::HTTP2
    }
}

/// The protocol bits of the handshake's `carries` byte; the bits above them are
/// [`StreamOptions`].
pub(crate) const CARRIES_MASK: u8 = 0b111;

/// Stream options, negotiated in the high bits of the handshake's `carries` byte (its
/// low three bits name the protocol): the initiator offers a set, the responder echoes
/// the ones it takes too. A v3 peer built before an option ignores its bit in an offer
/// and never echoes it, so old and new builds still agree, on the option off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions(pub u8);

impl StreamOptions {
    /// No options: 16 KiB records, what every v3 peer reads.
    pub const NONE: StreamOptions = StreamOptions(0);
    /// Records of up to [`LARGE_RECORD_PAYLOAD`] of plaintext both ways, instead of
    /// [`RECORD_PAYLOAD`]: fewer seals and header reads for large bodies.
    pub const LARGE_RECORDS: StreamOptions = StreamOptions(0b1000);
    /// Offered by an initiator that could carry HTTP/1.1 as is; echoed by a
    /// responder whose server takes [`Carries::HTTP1`]. It changes nothing on this
    /// stream: it tells the caller, signed, that its later connections to this peer
    /// may carry an HTTP/1.1 app's requests as they are (a responder in front of an
    /// HTTP/2-only server never echoes it).
    pub const TAKES_HTTP1: StreamOptions = StreamOptions(0b1_0000);

    /// The options of a `carries` byte.
    pub(crate) const fn of(carries_byte: u8) -> StreamOptions {
        StreamOptions(carries_byte & !CARRIES_MASK)
    }

    /// The union of two sets.
    pub const fn or(self, other: StreamOptions) -> StreamOptions {
        StreamOptions(self.0 | other.0)
    }

    /// The options both sets name.
    pub const fn and(self, other: StreamOptions) -> StreamOptions {
        StreamOptions(self.0 & other.0)
    }

    /// True if every option of `other` is in `self`.
    pub const fn contains(self, other: StreamOptions) -> bool {
        self.0 & other.0 == other.0
    }

    /// The most plaintext a sealed stream's record carries under these options.
    pub const fn record_payload(self) -> usize {
        if self.contains(StreamOptions::LARGE_RECORDS) {
            LARGE_RECORD_PAYLOAD
        } else {
            RECORD_PAYLOAD
        }
    }
}

/// Plaintext per stream record, as in TLS, unless both sides take
/// [`StreamOptions::LARGE_RECORDS`].
pub const RECORD_PAYLOAD: usize = 16 * 1024;

/// Plaintext per stream record with [`StreamOptions::LARGE_RECORDS`]: a 64 KiB body
/// in two records instead of five, and a peer can still make a receiver hold no more
/// than this (and a header and tag) before a record opens.
pub const LARGE_RECORD_PAYLOAD: usize = 64 * 1024;

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
    /// What the stream may carry: offered by an initiator, accepted by a responder.
    pub carries: Carries,
    /// The stream options this side takes: offered by an initiator, echoed by a
    /// responder where it takes them too.
    pub options: StreamOptions,
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
            carries: Carries::HTTP2,
            options: StreamOptions::LARGE_RECORDS,
        }
    }
}
