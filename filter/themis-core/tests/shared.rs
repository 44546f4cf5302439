//! The shared responder (`themis_core::shared`): two "workers" rebuilt from the same
//! stored ticket and one stored replay window, attacked the way a network or a
//! corrupted store would.

mod common;

use common::{identity, with_rng};
use themis_core::handshake::{self, Initiator};
use themis_core::shared::{SharedResponder, Ticket, MAX_TICKET_LEN};
use themis_core::{
    ChannelError, ChannelMode, HandshakeConfig, HandshakeError, ReplayWindow, Session, WireError,
};

struct Setup {
    client: Session,
    confirm: Vec<u8>,
    stored_ticket: Vec<u8>,
}

fn config(records_per_key: u64) -> HandshakeConfig {
    HandshakeConfig {
        mode: ChannelMode::Datagram,
        records_per_key,
        ..HandshakeConfig::default()
    }
}

fn setup_with(records_per_key: u64) -> Setup {
    let (a, b) = (identity("shared", 1), identity("shared", 2));
    let config = config(records_per_key);
    let (waiting, hello) = with_rng(&[&[3; 32], &[4; 32]], |rng| {
        Initiator::start(&a, b.id(), &config, rng)
    })
    .unwrap();
    let (pending, reply) = with_rng(&[&[5; 32], &[6; 32]], |rng| {
        handshake::respond(&b, &hello, &config, rng)
    })
    .unwrap();
    let stored_ticket = Ticket::from(&pending).encode().to_vec();
    let (client, confirm) = waiting.read_hello_reply(&reply).unwrap();
    Setup {
        client,
        confirm,
        stored_ticket,
    }
}

fn setup() -> Setup {
    setup_with(HandshakeConfig::default().records_per_key)
}

fn worker(s: &Setup) -> SharedResponder {
    let ticket = Ticket::decode(&s.stored_ticket).unwrap();
    ticket.check_confirm(&s.confirm).unwrap();
    SharedResponder::new(&ticket)
}

fn open(
    w: &mut SharedResponder,
    record: &[u8],
    window: &mut ReplayWindow,
) -> Result<Vec<u8>, ChannelError> {
    let mut buf = record.to_vec();
    w.open_request(&mut buf, window).map(|o| o.payload.to_vec())
}

#[test]
fn two_workers_serve_one_session_and_the_client_reads_every_answer() {
    let mut s = setup();
    let (mut w1, mut w2) = (worker(&s), worker(&s));
    let mut window = ReplayWindow::new();
    for i in 0..10u8 {
        let (seq, record) = s.client.seal(&[i; 100], None).unwrap();
        let w = if i % 2 == 0 { &mut w1 } else { &mut w2 };
        assert_eq!(open(w, &record, &mut window).unwrap(), [i; 100]);
        let mut response = w.seal_reply(seq, &[i ^ 0xff; 50]).unwrap();
        let opened = s.client.open_in_place(&mut response).unwrap();
        opened.expect_reply_to(seq).unwrap();
        assert_eq!(opened.payload, [i ^ 0xff; 50]);
    }
    assert_eq!(w1.info().peer_id, s.client.info().local_id);
}

#[test]
fn a_request_replayed_to_another_worker_is_refused_through_the_shared_window() {
    let mut s = setup();
    let (mut w1, mut w2) = (worker(&s), worker(&s));
    let mut window = ReplayWindow::new();
    let (_, record) = s.client.seal(b"pay 10", None).unwrap();
    open(&mut w1, &record, &mut window).unwrap();
    // The window travels through the store as bytes.
    let mut stored = ReplayWindow::from_bytes(&window.to_bytes()).unwrap();
    assert_eq!(
        open(&mut w2, &record, &mut stored),
        Err(ChannelError::Replay(1))
    );
    assert_eq!(
        open(&mut w1, &record, &mut stored),
        Err(ChannelError::Replay(1))
    );
}

#[test]
fn requests_may_arrive_out_of_order_within_the_window_but_each_only_once() {
    let mut s = setup();
    let mut w = worker(&s);
    let mut window = ReplayWindow::new();
    let records: Vec<_> = (0..5)
        .map(|_| s.client.seal(b"x", None).unwrap().1)
        .collect();
    for i in [4, 0, 2, 1, 3] {
        open(&mut w, &records[i], &mut window).unwrap();
    }
    for record in &records {
        assert!(matches!(
            open(&mut w, record, &mut window),
            Err(ChannelError::Replay(_))
        ));
    }
}

#[test]
fn a_refused_record_leaves_the_window_unchanged() {
    let mut s = setup();
    let mut w = worker(&s);
    let mut window = ReplayWindow::new();
    let (_, mut record) = s.client.seal(b"x", None).unwrap();
    let last = record.len() - 1;
    record[last] ^= 1;
    assert_eq!(
        open(&mut w, &record, &mut window),
        Err(ChannelError::Authentication)
    );
    assert_eq!(window, ReplayWindow::new());
}

#[test]
fn every_byte_of_a_request_is_protected() {
    let mut s = setup();
    let mut w = worker(&s);
    let (_, record) = s.client.seal(b"GET /check", None).unwrap();
    for i in 0..record.len() {
        let mut tampered = record.clone();
        tampered[i] ^= 0x20;
        let mut window = ReplayWindow::new();
        assert!(open(&mut w, &tampered, &mut window).is_err(), "byte {i}");
        assert_eq!(window, ReplayWindow::new(), "byte {i}");
    }
    for len in 0..record.len() {
        let mut window = ReplayWindow::new();
        assert!(
            open(&mut w, &record[..len], &mut window).is_err(),
            "length {len}"
        );
    }
    let mut longer = record.clone();
    longer.push(0);
    assert!(open(&mut w, &longer, &mut ReplayWindow::new()).is_err());
}

#[test]
fn a_response_reflected_back_as_a_request_is_refused() {
    let mut s = setup();
    let mut w = worker(&s);
    let mut window = ReplayWindow::new();
    let (seq, request) = s.client.seal(b"x", None).unwrap();
    open(&mut w, &request, &mut window).unwrap();
    let response = w.seal_reply(seq, b"y").unwrap();
    assert_eq!(
        open(&mut w, &response, &mut ReplayWindow::new()),
        Err(ChannelError::Authentication)
    );
}

#[test]
fn a_response_is_bound_to_its_request() {
    let mut s = setup();
    let mut w = worker(&s);
    let mut window = ReplayWindow::new();
    let (first, r1) = s.client.seal(b"1", None).unwrap();
    let (second, r2) = s.client.seal(b"2", None).unwrap();
    open(&mut w, &r1, &mut window).unwrap();
    open(&mut w, &r2, &mut window).unwrap();
    let mut answer_to_second = w.seal_reply(second, b"for 2").unwrap();
    let opened = s.client.open_in_place(&mut answer_to_second).unwrap();
    assert_eq!(
        opened.expect_reply_to(first),
        Err(ChannelError::UnexpectedReply {
            expected: first,
            got: Some(second)
        })
    );
    assert_eq!(
        w.seal_reply(0, b"z").err(),
        Some(ChannelError::InvalidReplyTo)
    );
}

#[test]
fn workers_follow_the_client_across_rekeys() {
    let mut s = setup_with(3);
    let (mut w1, mut w2) = (worker(&s), worker(&s));
    let mut window = ReplayWindow::new();
    for i in 0..20u8 {
        let (seq, record) = s.client.seal(&[i], None).unwrap();
        let w = if i % 3 == 0 { &mut w1 } else { &mut w2 };
        assert_eq!(open(w, &record, &mut window).unwrap(), [i]);
        let mut response = w.seal_reply(seq, &[i]).unwrap();
        s.client.open_in_place(&mut response).unwrap();
    }
}

#[test]
fn a_wrong_or_forged_confirmation_is_refused() {
    let s = setup();
    let ticket = Ticket::decode(&s.stored_ticket).unwrap();
    for i in 0..s.confirm.len() {
        let mut forged = s.confirm.clone();
        forged[i] ^= 1;
        assert!(ticket.check_confirm(&forged).is_err(), "byte {i}");
    }
    let other = setup_with(7);
    let other_ticket = Ticket::decode(&other.stored_ticket).unwrap();
    assert_eq!(
        other_ticket.check_confirm(&s.confirm),
        Err(HandshakeError::BadKeyConfirmation)
    );
}

#[test]
fn a_ticket_round_trips_and_a_corrupted_one_never_yields_a_session() {
    let s = setup();
    let ticket = Ticket::decode(&s.stored_ticket).unwrap();
    assert_eq!(ticket.encode().as_slice(), s.stored_ticket.as_slice());
    assert_eq!(ticket.session_id(), s.client.info().session_id);
    assert_eq!(ticket.info().peer_id, s.client.info().local_id);

    for len in 0..s.stored_ticket.len() {
        assert!(
            Ticket::decode(&s.stored_ticket[..len]).is_err(),
            "length {len}"
        );
    }
    // A flipped byte in an id or the peer's key breaks the key→id link and is refused.
    let mut refused = 0;
    for i in 0..s.stored_ticket.len() {
        let mut corrupted = s.stored_ticket.clone();
        corrupted[i] ^= 0x01;
        match Ticket::decode(&corrupted) {
            Err(_) => refused += 1,
            Ok(t) => assert_eq!(
                themis_core::PeerId::derive(&t.info().peer_public_key, t.info().mesh.as_str()),
                t.info().peer_id
            ),
        }
    }
    assert!(
        refused > 64,
        "the 64 bytes of peer id and key are all checked"
    );
    let oversize = vec![0u8; MAX_TICKET_LEN + 1];
    assert!(matches!(
        Ticket::decode(&oversize),
        Err(WireError::TooLarge { .. })
    ));
    let mut trailing = s.stored_ticket.clone();
    trailing.push(0);
    assert_eq!(
        Ticket::decode(&trailing).err(),
        Some(WireError::TrailingBytes(1))
    );
}

#[test]
fn replay_window_bytes_are_fixed_size() {
    let mut window = ReplayWindow::new();
    window.accept(5);
    window.accept(3);
    let bytes = window.to_bytes();
    assert_eq!(ReplayWindow::from_bytes(&bytes).unwrap(), window);
    assert!(ReplayWindow::from_bytes(&bytes[..23]).is_err());
    assert!(ReplayWindow::from_bytes(&[0; 25]).is_err());
}
