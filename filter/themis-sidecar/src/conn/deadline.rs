//! An inbound connection's handshake deadline: a caller not allowed within
//! `handshake_timeout` of opening is closed (`refused.handshake_timeout`), so one
//! that stalls — silent, inside a message, or behind an agent that does not
//! answer — holds no connection. Sans-IO, quinn-proto's shape: the driver asks
//! [`Deadline::poll_timeout`] when to wake and calls [`Deadline::handle_timeout`]
//! then. The Wasm filter wakes on its root's tick and closes the connection itself;
//! the native module has no timer, so Envoy's listener closes it
//! (`transport_socket_connect_timeout`, rendered from the same setting) and the
//! module asks [`Deadline::closed_by_host`] whether that close was this deadline.

use std::time::Duration;

use super::Close;
use crate::reason::Reason;

/// How much earlier than the deadline a close by the host still counts as the
/// deadline's: Envoy's timer starts when it accepts the connection, a little before
/// the module first sees it.
pub const HOST_TIMER_SLACK_MS: u64 = 1_000;

/// One connection's deadline, from its opening until its caller is allowed (then the
/// driver drops it) or the deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    at_ms: u64,
    timeout: Duration,
    passed: bool,
}

impl Deadline {
    /// For a connection that opened at `now_ms`.
    pub fn starting(now_ms: u64, timeout: Duration) -> Self {
        Deadline {
            at_ms: now_ms.saturating_add(timeout.as_millis() as u64),
            timeout,
            passed: false,
        }
    }

    /// When the driver must call [`Deadline::handle_timeout`]: `None` once passed.
    pub fn poll_timeout(&self) -> Option<u64> {
        (!self.passed).then_some(self.at_ms)
    }

    /// The clock reached `now_ms`: past the deadline, the connection is closed
    /// (once: a passed deadline says nothing more).
    pub fn handle_timeout(&mut self, now_ms: u64) -> Option<Close> {
        if self.passed || now_ms < self.at_ms {
            return None;
        }
        self.passed = true;
        Some(Close::new(
            Reason::HandshakeTimeout,
            format!("the caller was not allowed within {:?}", self.timeout),
        ))
    }

    /// Whether the deadline passed: nothing more of the connection is decided or
    /// passed on, whatever the agent answers or the peer sends.
    pub fn is_passed(&self) -> bool {
        self.passed
    }

    /// The host closed the connection, on its own timer, at `now_ms`, its caller not
    /// allowed: the deadline's close if it came within [`HOST_TIMER_SLACK_MS`] of it.
    pub fn closed_by_host(&mut self, now_ms: u64) -> Option<Close> {
        self.handle_timeout(now_ms.saturating_add(HOST_TIMER_SLACK_MS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEN_S: Duration = Duration::from_secs(10);

    #[test]
    fn it_closes_once_at_its_deadline_and_not_before() {
        let mut deadline = Deadline::starting(1_000, TEN_S);
        assert_eq!(deadline.poll_timeout(), Some(11_000));
        assert_eq!(deadline.handle_timeout(10_999), None);
        assert!(!deadline.is_passed());
        let close = deadline.handle_timeout(11_000).expect("due");
        assert_eq!(close.reason, Reason::HandshakeTimeout);
        assert!(close.detail.contains("10s"), "{}", close.detail);
        assert!(deadline.is_passed());
        assert_eq!(deadline.poll_timeout(), None);
        assert_eq!(deadline.handle_timeout(99_000), None, "only once");
    }

    #[test]
    fn a_close_by_the_host_counts_only_near_the_deadline() {
        // Closed by the peer, or by Envoy draining, early on: not the deadline's.
        let mut early = Deadline::starting(0, TEN_S);
        assert_eq!(early.closed_by_host(5_000), None);
        assert_eq!(early.closed_by_host(10_000 - HOST_TIMER_SLACK_MS - 1), None);
        // Envoy's timer, started at accept, fires a little before the module's.
        let mut due = Deadline::starting(0, TEN_S);
        let close = due.closed_by_host(10_000 - HOST_TIMER_SLACK_MS / 2);
        assert_eq!(close.map(|c| c.reason), Some(Reason::HandshakeTimeout));
    }

    #[test]
    fn a_clock_at_its_end_does_not_overflow() {
        let mut deadline = Deadline::starting(u64::MAX - 5, TEN_S);
        assert_eq!(deadline.poll_timeout(), Some(u64::MAX));
        assert!(deadline.closed_by_host(u64::MAX - 5).is_some());
    }
}
