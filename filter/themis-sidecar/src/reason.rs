//! Every reason a sidecar refuses for, in one table: the connection roles'
//! (`themis.<role>.refused.<reason>`) and the outbound HTTP filter's
//! (`themis.outbound.rejected.<reason>`). Both runtimes define their counters from
//! these tables, so a reason cannot be given without being counted, and
//! `docs/FILTER.md`'s tables are checked against them both ways (`tests/docs.rs`).

use themis_core::stream::Refusal;

/// An enum whose every value has a name, listed in `ALL`.
macro_rules! named {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name { $($(#[$vmeta])* $variant,)* }

        impl $name {
            /// Every value, in the table's order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The name counted and logged.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            /// The value of that name.
            pub fn named(name: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|v| v.as_str() == name)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named! {
    /// Why a connection was closed, on either side: counted `refused.<reason>`.
    pub enum Reason {
        /// Not this protocol (e.g. plaintext).
        Malformed = "malformed",
        /// The peer's stream ends inside a message.
        Truncated = "truncated",
        /// Message 1 outside the freshness window.
        Stale = "stale",
        /// A message 1 seen already, or a record out of order, dropped or repeated.
        Replay = "replay",
        /// A refused handshake message.
        Handshake = "handshake",
        /// A record that does not open.
        Tampered = "tampered",
        /// A message the state does not expect.
        OutOfTurn = "out_of_turn",
        /// The caller's metadata does not decode.
        Meta = "meta",
        /// Not the carried protocol's preface.
        Preface = "preface",
        /// No rule of the policy matches the caller.
        Policy = "policy",
        /// The sidecar has no policy: deny by default.
        NoPolicy = "no_policy",
        /// The source is over `hellos_per_source`.
        RateLimited = "rate_limited",
        /// The peer's id is revoked.
        Revoked = "revoked",
        /// The revocations were not read from the agent for longer than
        /// `revocations_max_age_secs`: no new caller is let in.
        RevocationsStale = "revocations_stale",
        /// The sidecar holds no identity (or no delegated key) yet.
        NoIdentity = "no_identity",
        /// Envoy gave the socket no peer address (native).
        Address = "address",
        /// Writing message 1 failed (native).
        Io = "io",
        /// No resolution of the cluster's service yet (native).
        Unresolved = "unresolved",
        /// The address connected to lists no endorsed instance (native).
        NotEndorsed = "not_endorsed",
        /// Two ids at one address (native).
        Ambiguous = "ambiguous",
        /// The worker's handshake budget is spent.
        Busy = "busy",
        /// More bytes held than the stream's bound.
        Overflow = "overflow",
        /// The connection names no expected peer (Wasm seal).
        NoPeer = "no_peer",
        /// The agent refused to sign, or could not be asked.
        SignFailed = "sign_failed",
        /// The agent did not sign in time.
        SignTimeout = "sign_timeout",
        /// The caller's claimed service could not be resolved.
        ResolveFailed = "resolve_failed",
        /// The caller was not allowed within the handshake deadline.
        HandshakeTimeout = "handshake_timeout",
        /// TLS binding: the peer's certificate is not a Themis one, or does not prove
        /// its id.
        Certificate = "certificate",
        /// TLS binding: the certificate's principal is not what its endorsement proves.
        Principal = "principal",
        /// TLS binding: the peer proved another id than the SNI named.
        WrongPeer = "wrong_peer",
        /// A driver was asked for what it cannot do (a bug, never expected).
        Internal = "internal",
        /// The sidecar's own code panicked on this connection (native: the hook was
        /// caught, the connection closed, Envoy kept serving).
        Panicked = "panicked",
    }
}

impl Reason {
    /// A flood's refusals: counted, not worth a log line each.
    pub fn is_flood(self) -> bool {
        matches!(
            self,
            Reason::RateLimited | Reason::Stale | Reason::Replay | Reason::Busy
        )
    }

    /// The counter it adds one to, under the role's prefix.
    pub fn counter(self) -> String {
        format!("refused.{}", self.as_str())
    }
}

/// The stream's own refusals keep the names `themis_core` gives them (one mapping,
/// the core's); a name missing from the table would be counted as `internal`, and a
/// test lists every refusal to make sure none is.
impl From<&Refusal> for Reason {
    fn from(refusal: &Refusal) -> Self {
        Reason::named(refusal.reason()).unwrap_or(Reason::Internal)
    }
}

named! {
    /// Why the outbound HTTP filter answered a request itself, with
    /// `x-themis-reject: <reason>`: counted `rejected.<reason>`.
    pub enum Rejection {
        /// The authority names no mesh service.
        NotAService = "not_a_service",
        /// The service has no instance the mesh vouches for.
        NoInstance = "no_instance",
        /// The service could not be resolved (yet).
        ResolveFailed = "resolve_failed",
        /// This sidecar has no sealing cluster for the service (native).
        NotRouted = "not_routed",
        /// The sidecar's own code failed on the request (native: a panic caught).
        Internal = "internal",
    }
}

impl Rejection {
    /// The counter it adds one to, under `themis.outbound.`.
    pub fn counter(self) -> String {
        format!("rejected.{}", self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_counter_safe() {
        let mut names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        names.extend(Rejection::ALL.iter().map(|r| r.as_str()));
        for name in &names {
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name}: a counter name is lowercase and underscores"
            );
        }
        let reasons = Reason::ALL.len();
        let mut unique = names[..reasons].to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), reasons, "a reason is named twice");
    }

    #[test]
    fn every_stream_refusal_is_in_the_table() {
        use themis_core::handshake::HandshakeError;
        use themis_core::{ChannelError, WireError};
        let refusals = [
            Refusal::Malformed(WireError::Truncated),
            Refusal::Handshake(HandshakeError::Stale),
            Refusal::Handshake(HandshakeError::Replayed),
            Refusal::Handshake(HandshakeError::BadSignature),
            Refusal::Record(ChannelError::Replay(0)),
            Refusal::Record(ChannelError::Authentication),
            Refusal::OutOfTurn("hello"),
            Refusal::Meta,
            Refusal::Preface,
            Refusal::Overflow,
        ];
        for refusal in refusals {
            let reason = Reason::from(&refusal);
            assert_ne!(reason, Reason::Internal, "{refusal}: not in the table");
            assert_eq!(reason.as_str(), refusal.reason());
        }
    }
}
