//! What keeps a bug in this module from taking Envoy down, and the one rule for
//! touching a connection from a hook.
//!
//! * Every hook runs its safe code through [`hook`]: a panic is caught there (it may
//!   not unwind into Envoy's C++, where Rust aborts the process), logged, counted, and
//!   the hook returns a value that fails closed (for a connection: close it).
//! * A transport socket's state lives in a [`Slot`]. Envoy runs every hook of one
//!   connection on its worker thread, but a callback the module makes inside a hook
//!   (a write, an event raised) may make Envoy call another hook of the same
//!   connection before the first returns. So a hook takes the connection only through
//!   [`Slot::enter`], which refuses a second, re-entrant `&mut`: a nested `close` is
//!   deferred to the end of the outer hook, any other nested hook is refused (it fails
//!   closed; the questions Envoy asks while it closes — the failure reason, the
//!   protocol — get a neutral answer). The one callback known to re-enter, raising
//!   `Connected` (Envoy writes at once: `do_write`), is made after the hook lets go
//!   (`EnvoySocket::connected`). A hook that panicked poisons the slot: the
//!   connection is closed, and no later hook touches its state again (only the close
//!   bookkeeping runs).

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::socket::Connection;

/// Runs `f`, a hook's safe code; a panic is logged with the hook's name and the
/// hook returns `on_panic` instead.
pub fn hook<T>(name: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(value) => value,
        Err(payload) => {
            super::log(
                5,
                &format!(
                    "themis native: a panic in the hook {name} was caught ({}); failing closed, Envoy goes on",
                    message(&*payload)
                ),
            );
            on_panic
        }
    }
}

/// The panic's message, if it has one.
pub fn message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    /// A hook holds the connection.
    Busy,
    /// A hook holds it, and Envoy closed the connection meanwhile.
    BusyClosed,
    /// A hook panicked: the connection's state is not to be trusted.
    Poisoned,
}

/// One transport socket's state, as Envoy holds it between hooks.
pub struct Slot {
    connection: UnsafeCell<Option<Connection>>,
    state: Cell<State>,
    /// Envoy's close came while a hook held the connection: whether it was Envoy's
    /// own (`LocalClose`), for the deferred bookkeeping.
    closed_by_envoy: Cell<bool>,
}

/// What [`Slot::enter`] came to.
pub enum Entered<T> {
    Ran(T),
    /// Not run: the slot was poisoned, held by an outer hook, or `f` panicked now.
    Refused,
}

impl Slot {
    pub fn new(connection: Connection) -> Self {
        Slot {
            connection: UnsafeCell::new(Some(connection)),
            state: Cell::new(State::Idle),
            closed_by_envoy: Cell::new(false),
        }
    }

    /// A slot whose connection could not be made (its `new` panicked): every hook
    /// fails closed.
    pub fn poisoned() -> Self {
        Slot {
            connection: UnsafeCell::new(None),
            state: Cell::new(State::Poisoned),
            closed_by_envoy: Cell::new(false),
        }
    }

    pub fn is_poisoned(&self) -> bool {
        self.state.get() == State::Poisoned
    }

    /// Runs hook `name`'s `f` on the connection, unless another hook of it is running
    /// (re-entrancy: refused) or one panicked before (poisoned: refused). A panic in
    /// `f` poisons the slot and is counted as `refused.panicked`.
    pub fn enter<T>(&self, name: &str, f: impl FnOnce(&mut Connection) -> T) -> Entered<T> {
        match self.state.get() {
            State::Idle => {}
            State::Poisoned => return Entered::Refused,
            State::Busy | State::BusyClosed => {
                // Envoy asks for the failure reason or the protocol while it closes a
                // connection inside one of its hooks: answered without it, quietly.
                let level = match name {
                    "get_failure_reason" | "get_protocol" | "can_flush_close" => 1,
                    _ => 4,
                };
                super::log(
                    level,
                    &format!(
                        "themis native: the hook {name} re-entered a connection's hook: refused"
                    ),
                );
                return Entered::Refused;
            }
        }
        self.state.set(State::Busy);
        // SAFETY: `state` was Idle and is Busy until this returns, so this is the only
        // reference to the connection (hooks of one connection run on one thread).
        let connection = unsafe { &mut *self.connection.get() };
        let Some(connection) = connection.as_mut() else {
            self.state.set(State::Poisoned);
            return Entered::Refused;
        };
        let role = connection.role();
        let ran = catch_unwind(AssertUnwindSafe(|| f(connection)));
        match ran {
            Ok(value) => {
                let closed = self.state.get() == State::BusyClosed;
                self.state.set(State::Idle);
                if closed {
                    self.close(self.closed_by_envoy.get());
                }
                Entered::Ran(value)
            }
            Err(payload) => {
                self.state.set(State::Poisoned);
                crate::metrics::count(role, &themis_sidecar::reason::Reason::Panicked.counter());
                super::log(
                    5,
                    &format!(
                        "themis native {role}: a panic in the hook {name} was caught ({}); the connection is closed, Envoy goes on",
                        message(&*payload)
                    ),
                );
                Entered::Refused
            }
        }
    }

    /// Envoy closed the connection (`by_envoy`: a `LocalClose` of its own): its
    /// bookkeeping (gauges, the worker's tables) runs now, after the hook that holds
    /// it returns, or (poisoned) once, guarded.
    pub fn close(&self, by_envoy: bool) {
        match self.state.get() {
            State::Busy => {
                self.closed_by_envoy.set(by_envoy);
                self.state.set(State::BusyClosed);
            }
            State::BusyClosed => {}
            State::Idle => {
                let _ = self.enter("close", |c| c.closed(by_envoy));
            }
            State::Poisoned => {
                // SAFETY: no hook holds a poisoned slot's connection (enter refuses).
                let connection = unsafe { &mut *self.connection.get() };
                if let Some(mut connection) = connection.take() {
                    hook("close", (), move || connection.closed(by_envoy));
                }
            }
        }
    }
}
