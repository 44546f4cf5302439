//! The secure channel under a hostile network. A fresh deterministic session pair
//! first opens the fuzzer's bytes as a record (which must fail), then a fuzzed script
//! seals records on either side and delivers, duplicates, drops, corrupts or
//! reflects them. Invariants:
//!
//! * a modified record never opens, nor does one sent back to its sender;
//! * a record already opened never opens again: it is a `Replay`;
//! * an unmodified record that is the next one in its direction always opens, to
//!   exactly what was sealed (so no failure before it changed any state);
//! * on a stream channel nothing else opens; a datagram channel may open an
//!   unmodified record out of order, once, to what was sealed.
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use themis_core::{ChannelError, ChannelMode, Session};
use themis_fuzz::{handshake, Settings};

#[derive(Arbitrary, Debug)]
struct Input {
    settings: Settings,
    /// Opened by both sides before anything else.
    record: Vec<u8>,
    script: Vec<Step>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Side {
    Initiator,
    Responder,
}

/// One step. `from` names the sending side, whose queue of records in flight the
/// step works on; `index` picks a record in that queue, modulo its length.
#[derive(Arbitrary, Debug)]
enum Step {
    /// Seal a payload and queue the record.
    Seal { from: Side, payload: Vec<u8>, reply_to: Option<u64> },
    /// Take a record off the queue and open it at the other side.
    Deliver { from: Side, index: u8 },
    /// Queue a second copy of a record.
    Duplicate { from: Side, index: u8 },
    /// Lose a record.
    Drop { from: Side, index: u8 },
    /// XOR one byte of a record with `mask`.
    Corrupt { from: Side, index: u8, at: u16, mask: u8 },
    /// Send a record back to its sender.
    Reflect { from: Side, index: u8 },
}

/// A record on its way, with what it was sealed from.
#[derive(Clone)]
struct InFlight {
    bytes: Vec<u8>,
    sealed: Vec<u8>,
    seq: u64,
    payload: Vec<u8>,
    reply_to: Option<u64>,
}

/// One direction of the session pair: the sequence numbers its receiver opened.
#[derive(Default)]
struct Direction {
    queue: Vec<InFlight>,
    opened: BTreeSet<u64>,
    sealed: u64,
}

struct World {
    mode: ChannelMode,
    initiator: Session,
    responder: Session,
    /// Indexed by the sending side.
    directions: [Direction; 2],
}

impl World {
    /// The sending and the receiving session of records from `from`.
    fn sessions(&mut self, from: Side) -> (&mut Session, &mut Session) {
        match from {
            Side::Initiator => (&mut self.initiator, &mut self.responder),
            Side::Responder => (&mut self.responder, &mut self.initiator),
        }
    }

    fn direction(&mut self, from: Side) -> &mut Direction {
        &mut self.directions[from as usize]
    }

    fn pick(&mut self, from: Side, index: u8) -> Option<usize> {
        let len = self.direction(from).queue.len();
        (len > 0).then(|| usize::from(index) % len)
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::Seal { from, payload, reply_to } => {
                let sealed = self.sessions(from).0.seal(&payload, reply_to);
                if reply_to == Some(0) {
                    // 0 means "no reply" on the wire, so it is refused, and nothing is used up.
                    assert_eq!(sealed.err(), Some(ChannelError::InvalidReplyTo));
                    return;
                }
                let (seq, record) = sealed.expect("seal");
                let direction = self.direction(from);
                direction.sealed += 1;
                assert_eq!(seq, direction.sealed, "sequence numbers count up from 1");
                direction.queue.push(InFlight {
                    bytes: record.clone(),
                    sealed: record,
                    seq,
                    payload,
                    reply_to,
                });
            }
            Step::Deliver { from, index } => {
                if let Some(i) = self.pick(from, index) {
                    let record = self.direction(from).queue.remove(i);
                    self.deliver(from, record);
                }
            }
            Step::Duplicate { from, index } => {
                if let Some(i) = self.pick(from, index) {
                    let queue = &mut self.direction(from).queue;
                    queue.push(queue[i].clone());
                }
            }
            Step::Drop { from, index } => {
                if let Some(i) = self.pick(from, index) {
                    self.direction(from).queue.remove(i);
                }
            }
            Step::Corrupt { from, index, at, mask } => {
                if let Some(i) = self.pick(from, index) {
                    let bytes = &mut self.direction(from).queue[i].bytes;
                    let at = usize::from(at) % bytes.len();
                    bytes[at] ^= mask;
                }
            }
            Step::Reflect { from, index } => {
                if let Some(i) = self.pick(from, index) {
                    let mut bytes = self.direction(from).queue[i].bytes.clone();
                    let sender = self.sessions(from).0;
                    assert!(sender.open_in_place(&mut bytes).is_err(), "a reflected record opened");
                }
            }
        }
    }

    fn deliver(&mut self, from: Side, record: InFlight) {
        let mode = self.mode;
        let mut buf = record.bytes.clone();
        let result = self
            .sessions(from)
            .1
            .open_in_place(&mut buf)
            .map(|opened| (opened.seq, opened.reply_to, opened.payload.to_vec()));
        let direction = self.direction(from);
        if record.bytes != record.sealed {
            assert!(result.is_err(), "a modified record opened: {result:?}");
            return;
        }
        if direction.opened.contains(&record.seq) {
            assert_eq!(result, Err(ChannelError::Replay(record.seq)), "a replayed record");
            return;
        }
        let highest = direction.opened.last().copied().unwrap_or(0);
        let next = record.seq == highest + 1;
        match result {
            Ok(opened) => {
                // 0 on the wire means "no reply": `Some(0)` opens as `None`.
                assert_eq!(opened, (record.seq, record.reply_to, record.payload), "opened contents");
                assert!(
                    next || mode == ChannelMode::Datagram,
                    "a stream record opened out of order"
                );
                direction.opened.insert(record.seq);
            }
            Err(e) => assert!(!next, "record {}, the next one, was refused: {e}", record.seq),
        }
    }
}

fuzz_target!(|input: Input| {
    let config = input.settings.config();
    let (initiator, responder) = handshake(&config);
    let mut world =
        World { mode: config.mode, initiator, responder, directions: Default::default() };
    for session in [&mut world.initiator, &mut world.responder] {
        let mut bytes = input.record.clone();
        assert!(session.open_in_place(&mut bytes).is_err(), "forged a record: {:?}", input.record);
    }
    for step in input.script {
        world.step(step);
    }
});
