//! Attacks on the sealed byte stream ([`themis_core::stream`]). The attacker owns the
//! network: it records, replays, cuts, reorders, alters, reflects and injects bytes.
//! Every run hands the bytes over in arbitrary pieces (whole, one byte at a time or
//! cut at seeded random points), since a proxy sees whatever the kernel gives it.
//!
//! The handshakes use fixed randomness, so a recorded connection is reproducible byte
//! for byte: a fresh end is brought to the same state and fed the recording, altered
//! at one place.
#![allow(deprecated)] // ring's `test::rand::FixedByteRandom`: the only deterministic generator.

use std::sync::OnceLock;

use ring::rand::{SecureRandom, SystemRandom};
use ring::test::rand::FixedByteRandom;
use themis_core::stream::{
    Meta, Output, Refusal, StreamInitiator, StreamResponder, HTTP2_PREFACE, MAX_CHUNK, MAX_HELD,
    MAX_SERVICE_LEN,
};
use themis_core::wire::{
    self, Kind, RecordHeader, WireError, MAX_HANDSHAKE_LEN, MAX_RECORD_LEN, MAX_RECORD_PAYLOAD,
};
use themis_core::{
    HandshakeConfig, HandshakeError, HelloGuard, Identity, MeshName, PeerId, StreamOptions,
    LARGE_RECORD_PAYLOAD, PROTOCOL_VERSION,
};

const MESH: &str = "stream";
/// The clock of every handshake here (Unix ms): each responder call gets a fresh
/// [`HelloGuard`] unless a test is about the guard.
const NOW_MS: u64 = 1_700_000_000_000;
const INIT_RNG: u8 = 0x11;
const RESP_RNG: u8 = 0x22;
const SERVICE: &str = "checkout";
/// The responder app's answer to the preface (its SETTINGS frame, in spirit).
const SETTINGS: &[u8] = b"SETTINGS";
const MIB: usize = 1 << 20;

// ---------------------------------------------------------------------------------
// Fixtures

fn identity(mesh: &str, seed: u8) -> Identity {
    Identity::generate(
        MeshName::new(mesh).unwrap(),
        &FixedByteRandom { byte: seed },
    )
    .unwrap()
}

fn alice() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| identity(MESH, 0xa1))
}

fn bob() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| identity(MESH, 0xb0))
}

fn carol() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| identity(MESH, 0xc0))
}

fn meta() -> Meta {
    Meta {
        service: Some(SERVICE.into()),
    }
}

fn fixed(byte: u8) -> Box<dyn SecureRandom> {
    Box::new(FixedByteRandom { byte })
}

/// xorshift64*: reproducible cut points and payloads without a dependency.
struct Prng(u64);

impl Prng {
    fn new(seed: u64) -> Self {
        Prng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random bytes: no run of them is the preface or a protocol message by accident.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut prng = Prng::new(seed);
    (0..len).map(|_| prng.next() as u8).collect()
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// How the network cuts the bytes it carries.
#[derive(Clone, Copy, Debug)]
enum Split {
    Whole,
    Bytes,
    /// Seeded random pieces, from one byte to several records long.
    Random(u64),
}

struct Cutter {
    split: Split,
    prng: Prng,
}

impl Cutter {
    fn new(split: Split) -> Self {
        let seed = match split {
            Split::Random(seed) => seed,
            _ => 0,
        };
        Cutter {
            split,
            prng: Prng::new(seed),
        }
    }

    fn pieces<'a>(&mut self, bytes: &'a [u8]) -> Vec<&'a [u8]> {
        match self.split {
            Split::Whole if bytes.is_empty() => Vec::new(),
            Split::Whole => vec![bytes],
            Split::Bytes => bytes.chunks(1).collect(),
            Split::Random(_) => {
                let mut out = Vec::new();
                let mut rest = bytes;
                while !rest.is_empty() {
                    // Mostly small pieces (headers cut apart), sometimes many records.
                    let max = [1, 7, 300, 3 * MAX_CHUNK][self.prng.below(4)];
                    let n = (1 + self.prng.below(max)).min(rest.len());
                    out.push(&rest[..n]);
                    rest = &rest[n..];
                }
                out
            }
        }
    }
}

/// The whole messages in `bytes`, as a receiver frames them.
fn frames(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let len = wire::frame_len(rest).unwrap().expect("only whole messages");
        out.push(&rest[..len]);
        rest = &rest[len..];
    }
    out
}

/// The plaintext length a record carries.
fn payload_len(record: &[u8]) -> usize {
    RecordHeader::decode(record).unwrap().len as usize
}

fn seq(record: &[u8]) -> u64 {
    RecordHeader::decode(record).unwrap().seq
}

/// What one end made of some pieces: the first refusal, if any, and what it handed
/// on until then.
#[derive(Default)]
struct Fed {
    refused: Option<Refusal>,
    to_app: Vec<u8>,
    to_peer: Vec<u8>,
}

/// Feeds `pieces` to one end until it refuses.
fn feed<'a>(
    mut end: impl FnMut(&[u8]) -> Result<Output, Refusal>,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> Fed {
    let mut fed = Fed::default();
    for piece in pieces {
        match end(piece) {
            Ok(out) => {
                fed.to_app.extend_from_slice(&out.to_app);
                fed.to_peer.extend_from_slice(&out.to_peer);
            }
            Err(refusal) => {
                fed.refused = Some(refusal);
                break;
            }
        }
    }
    fed
}

/// Like [`feed`], but an end still waiting at the end (an altered length promised
/// more) then gets zeros until a whole message is there: it must refuse by then.
fn feed_to_refusal<'a>(
    mut end: impl FnMut(&[u8]) -> Result<Output, Refusal>,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> Fed {
    let mut fed = feed(&mut end, pieces);
    let zeros = vec![0u8; 64 * 1024];
    let mut padded = 0;
    while fed.refused.is_none() {
        assert!(
            padded <= MAX_RECORD_LEN,
            "still waiting after a whole record's worth of bytes"
        );
        let more = feed(&mut end, [&zeros[..]]);
        fed.to_app.extend_from_slice(&more.to_app);
        fed.to_peer.extend_from_slice(&more.to_peer);
        fed.refused = more.refused;
        padded += zeros.len();
    }
    fed
}

/// Both ends of one connection and the wire between them.
struct Link {
    init: StreamInitiator,
    resp: StreamResponder,
    responder: &'static Identity,
    config: HandshakeConfig,
    resp_rng: Box<dyn SecureRandom>,
    cut: Cutter,
    /// Message 1, sent with the initiator app's first bytes ([`Link::connect`]).
    hello: Vec<u8>,
    /// Every byte each end put on the wire, in order.
    i2r: Vec<u8>,
    r2i: Vec<u8>,
    /// Everything each app was handed.
    resp_app: Vec<u8>,
    init_app: Vec<u8>,
}

impl Link {
    fn new(
        initiator: &Identity,
        target: PeerId,
        responder: &'static Identity,
        meta: Meta,
        split: Split,
        init_rng: &dyn SecureRandom,
        resp_rng: Box<dyn SecureRandom>,
    ) -> Link {
        let config = HandshakeConfig::default();
        let (init, hello) =
            StreamInitiator::start(initiator, target, meta, &config, NOW_MS, init_rng).unwrap();
        Link {
            init,
            resp: StreamResponder::new(HTTP2_PREFACE),
            responder,
            config,
            resp_rng,
            cut: Cutter::new(split),
            hello,
            i2r: Vec::new(),
            r2i: Vec::new(),
            resp_app: Vec::new(),
            init_app: Vec::new(),
        }
    }

    /// Alice to Bob with fixed randomness: the same bytes on every run.
    fn pair(split: Split) -> Link {
        Link::with_meta(meta(), split)
    }

    fn with_meta(meta: Meta, split: Split) -> Link {
        let rng = FixedByteRandom { byte: INIT_RNG };
        Link::new(
            alice(),
            bob().id(),
            bob(),
            meta,
            split,
            &rng,
            fixed(RESP_RNG),
        )
    }

    /// [`Link::pair`] with both ends taking `options` (and so agreeing on them).
    fn pair_with(options: StreamOptions, split: Split) -> Link {
        let mut link = Link::pair(split);
        link.config.options = options;
        let rng = FixedByteRandom { byte: INIT_RNG };
        let (init, hello) =
            StreamInitiator::start(alice(), bob().id(), meta(), &link.config, NOW_MS, &rng)
                .unwrap();
        (link.init, link.hello) = (init, hello);
        link
    }

    /// Bytes over the wire to the responder, piece by piece, up to its refusal.
    fn deliver_to_resp(&mut self, bytes: &[u8]) -> Result<(), Refusal> {
        self.i2r.extend_from_slice(bytes);
        for piece in self.cut.pieces(bytes) {
            let out = self.resp.from_peer(
                piece,
                self.responder,
                &self.config,
                &mut HelloGuard::default(),
                NOW_MS,
                &*self.resp_rng,
            )?;
            assert!(
                out.to_peer.is_empty(),
                "the responder only sends on its app's writes"
            );
            self.resp_app.extend_from_slice(&out.to_app);
        }
        Ok(())
    }

    /// Bytes over the wire to the initiator; returns what it answers.
    fn deliver_to_init(&mut self, bytes: &[u8]) -> Result<Vec<u8>, Refusal> {
        self.r2i.extend_from_slice(bytes);
        let mut answer = Vec::new();
        for piece in self.cut.pieces(bytes) {
            let out = self.init.from_peer(piece)?;
            answer.extend_from_slice(&out.to_peer);
            self.init_app.extend_from_slice(&out.to_app);
        }
        Ok(answer)
    }

    fn init_writes(&mut self, data: &[u8]) -> Result<(), Refusal> {
        let sealed = self.init.from_app(data)?;
        self.deliver_to_resp(&sealed)
    }

    /// The responder's app writes; whatever the initiator answers goes back.
    fn resp_writes(&mut self, data: &[u8]) -> Result<(), Refusal> {
        let sealed = self.resp.from_app(data)?;
        let answer = self.deliver_to_init(&sealed)?;
        self.deliver_to_resp(&answer)
    }

    /// The initiator's app writes `first` (held, message 1 goes out), the responder
    /// feeds its app the preface, the app answers `answer` (message 2 rides on it)
    /// and message 3 comes back with the held bytes.
    fn connect(&mut self, first: &[u8], answer: &[u8]) -> Result<(), Refusal> {
        assert!(
            self.init.from_app(first)?.is_empty(),
            "held until the key agreement is done"
        );
        let hello = self.hello.clone();
        self.deliver_to_resp(&hello)?;
        assert_eq!(
            self.resp_app, HTTP2_PREFACE,
            "message 1 gets the app the preface, nothing else"
        );
        self.resp_writes(answer)
    }

    /// What the initiator sent after message 1: message 3, the Meta record, records.
    fn i2r_after_hello(&self) -> Vec<u8> {
        self.i2r[self.hello.len()..].to_vec()
    }
}

/// A fresh responder that got `hello` and answered SETTINGS: the state message 3
/// finds it in. Returns message 2 too.
fn responder_after_reply(hello: &[u8], rng: &dyn SecureRandom) -> (StreamResponder, Vec<u8>) {
    let mut resp = StreamResponder::new(HTTP2_PREFACE);
    let out = resp
        .from_peer(
            hello,
            bob(),
            &HandshakeConfig::default(),
            &mut HelloGuard::default(),
            NOW_MS,
            rng,
        )
        .unwrap();
    assert_eq!(out.to_app, HTTP2_PREFACE);
    let reply = resp.from_app(SETTINGS).unwrap();
    assert!(!reply.is_empty());
    (resp, reply)
}

fn resp_feeder<'a>(
    resp: &'a mut StreamResponder,
    rng: &'a dyn SecureRandom,
) -> impl FnMut(&[u8]) -> Result<Output, Refusal> + 'a {
    let config = HandshakeConfig::default();
    move |piece| {
        resp.from_peer(
            piece,
            bob(),
            &config,
            &mut HelloGuard::default(),
            NOW_MS,
            rng,
        )
    }
}

/// After a refusal every call fails, even with the genuine next bytes: nothing may
/// slip through before the driver closes the connection.
fn assert_resp_closed(resp: &mut StreamResponder, genuine: &[u8]) {
    let rng = FixedByteRandom { byte: RESP_RNG };
    let config = HandshakeConfig::default();
    assert!(
        resp.from_peer(
            genuine,
            bob(),
            &config,
            &mut HelloGuard::default(),
            NOW_MS,
            &rng
        )
        .is_err(),
        "from_peer after a refusal"
    );
    assert!(
        resp.from_peer(
            &[],
            bob(),
            &config,
            &mut HelloGuard::default(),
            NOW_MS,
            &rng
        )
        .is_err(),
        "empty from_peer after a refusal"
    );
    assert!(resp.from_app(b"more").is_err(), "from_app after a refusal");
    assert!(
        resp.from_app(&[]).is_err(),
        "empty from_app after a refusal"
    );
}

fn assert_init_closed(init: &mut StreamInitiator, genuine: &[u8]) {
    assert!(
        init.from_peer(genuine).is_err(),
        "from_peer after a refusal"
    );
    assert!(
        init.from_peer(&[]).is_err(),
        "empty from_peer after a refusal"
    );
    assert!(init.from_app(b"more").is_err(), "from_app after a refusal");
    assert!(
        init.from_app(&[]).is_err(),
        "empty from_app after a refusal"
    );
}

const SPLITS: [Split; 5] = [
    Split::Whole,
    Split::Bytes,
    Split::Random(1),
    Split::Random(2),
    Split::Random(3),
];

// ---------------------------------------------------------------------------------
// 1. The happy path

#[test]
fn a_large_stream_flows_both_ways_whatever_the_cuts() {
    let runs = SPLITS.into_iter().flat_map(|split| {
        [StreamOptions::LARGE_RECORDS, StreamOptions::NONE].map(|options| (options, split))
    });
    for (options, split) in runs {
        let mut link = Link::pair_with(options, split);
        let chunk = options.record_payload();
        // 1 MiB each way: many records, some of them held across message 3.
        let a = pattern(MIB, 1);
        let (a1, a2, a3) = (
            cat(&[HTTP2_PREFACE, &a[..300_000]]),
            &a[300_000..500_000],
            &a[500_000..],
        );
        let b = pattern(MIB, 2);

        assert!(link.init.from_app(&a1).unwrap().is_empty());
        let hello = link.hello.clone();
        link.deliver_to_resp(&hello).unwrap();
        assert_eq!(link.resp_app, HTTP2_PREFACE);
        // The app may write again before message 2: still held, still nothing sent.
        assert!(link.init.from_app(a2).unwrap().is_empty());
        assert_eq!((link.init.peer_id(), link.init.is_open()), (None, false));
        assert!(link.resp.established().is_none());

        link.resp_writes(SETTINGS).unwrap();
        assert_eq!(link.init.peer_id(), Some(bob().id()), "{split:?}");
        let est = link
            .resp
            .established()
            .expect("message 3 and Meta arrived")
            .clone();
        assert_eq!(est.peer_id, alice().id(), "{split:?}");
        assert_eq!(est.meta, meta());
        // SETTINGS waits for the responder's next write.
        assert!(link.init_app.is_empty());

        link.init_writes(a3).unwrap();
        link.resp_writes(&b[..10]).unwrap();
        link.resp_writes(&b[10..]).unwrap();

        // The preface exactly once: from message 1, and stripped off the stream.
        assert_eq!(
            link.resp_app.len(),
            HTTP2_PREFACE.len() + a.len(),
            "{split:?}"
        );
        assert!(link.resp_app == cat(&[HTTP2_PREFACE, &a]), "{split:?}");
        assert!(link.init_app == cat(&[SETTINGS, &b]), "{split:?}");

        // Sealed as it flows: records of at most the agreed size, nothing in clear.
        let tail = link.i2r_after_hello();
        let records = &frames(&tail)[1..];
        assert!(records.len() > MIB / chunk, "{}", records.len());
        assert!(records.iter().all(|r| payload_len(r) <= chunk));
        assert!(records.iter().any(|r| payload_len(r) == chunk));
        assert!(!contains(&link.i2r, &a[400_000..400_032]));
        assert!(!contains(&link.r2i, &b[400_000..400_032]));
        assert!(!contains(&link.i2r, &HTTP2_PREFACE[..16]));
    }
}

#[test]
fn the_preface_is_stripped_across_writes_and_only_once() {
    for split in SPLITS {
        // The app's first write is only part of the preface; the rest comes later.
        let mut link = Link::pair(split);
        link.connect(&HTTP2_PREFACE[..5], SETTINGS).unwrap();
        link.init_writes(&HTTP2_PREFACE[5..9]).unwrap();
        link.init_writes(&cat(&[&HTTP2_PREFACE[9..], b"data"]))
            .unwrap();
        assert_eq!(link.resp_app, cat(&[HTTP2_PREFACE, b"data"]), "{split:?}");

        // A second preface is the app's data, not the handshake's.
        let mut link = Link::pair(split);
        link.connect(&cat(&[HTTP2_PREFACE, HTTP2_PREFACE, b"x"]), SETTINGS)
            .unwrap();
        assert_eq!(
            link.resp_app,
            cat(&[HTTP2_PREFACE, HTTP2_PREFACE, b"x"]),
            "{split:?}"
        );
    }
}

#[test]
fn meta_claims_are_carried_and_bounded() {
    let long = "s".repeat(MAX_SERVICE_LEN);
    for service in [None, Some(long)] {
        let mut link = Link::with_meta(
            Meta {
                service: service.clone(),
            },
            Split::Random(9),
        );
        link.connect(HTTP2_PREFACE, SETTINGS).unwrap();
        assert_eq!(link.resp.established().unwrap().meta.service, service);
    }
    // An empty or too long claim ends the stream before any data reaches the app.
    for service in [String::new(), "s".repeat(MAX_SERVICE_LEN + 1)] {
        let mut link = Link::with_meta(
            Meta {
                service: Some(service),
            },
            Split::Random(9),
        );
        let refusal = link
            .connect(&cat(&[HTTP2_PREFACE, b"data"]), SETTINGS)
            .unwrap_err();
        assert_eq!((refusal.clone(), refusal.reason()), (Refusal::Meta, "meta"));
        assert_eq!(link.resp_app, HTTP2_PREFACE);
        assert!(link.resp.established().is_none());
        assert_resp_closed(&mut link.resp, b"");
    }
}

// ---------------------------------------------------------------------------------
// 2. Replay of a whole connection

#[test]
fn a_replayed_connection_fails_at_message_3_and_reaches_no_app() {
    let mut link = Link::pair(Split::Whole);
    link.connect(&cat(&[HTTP2_PREFACE, b"POST /pay amount=100"]), SETTINGS)
        .unwrap();
    link.init_writes(b"and again").unwrap();
    let recorded = link.i2r.clone();
    let hello_len = link.hello.len();

    for split in SPLITS {
        // A fresh responder draws fresh randomness, so its message 2 is new.
        let rng = SystemRandom::new();
        let mut resp = StreamResponder::new(HTTP2_PREFACE);
        let mut cut = Cutter::new(split);
        let fed = feed(
            resp_feeder(&mut resp, &rng),
            cut.pieces(&recorded[..hello_len]),
        );
        assert!(fed.refused.is_none());
        assert_eq!(fed.to_app, HTTP2_PREFACE);
        let reply = resp.from_app(SETTINGS).unwrap();
        assert_ne!(reply, link.r2i, "a new message 2");

        let fed = feed(
            resp_feeder(&mut resp, &rng),
            cut.pieces(&recorded[hello_len..]),
        );
        let refusal = fed.refused.expect("the replay is refused");
        assert_eq!(refusal.reason(), "handshake", "{split:?}: {refusal}");
        assert_eq!(
            refusal,
            Refusal::Handshake(HandshakeError::BadKeyConfirmation)
        );
        assert!(
            fed.to_app.is_empty(),
            "{split:?}: only the preface ever reached the app"
        );
        assert!(resp.established().is_none());
        assert_resp_closed(&mut resp, &recorded[hello_len..]);
    }

    // Replayed in one go, before the app answered: out of turn, nothing delivered.
    let rng = SystemRandom::new();
    let mut resp = StreamResponder::new(HTTP2_PREFACE);
    let fed = feed(resp_feeder(&mut resp, &rng), [&recorded[..]]);
    assert_eq!(fed.refused.map(|r| r.reason()), Some("out_of_turn"));
    assert!(fed.to_app.is_empty());
    assert_resp_closed(&mut resp, &recorded);
}

// ---------------------------------------------------------------------------------
// 3. Tampering

/// A small deterministic connection, recorded: message 1, 2, then each way's rest.
struct Recording {
    hello: Vec<u8>,
    reply: Vec<u8>,
    /// Message 3, Meta and the data records.
    i2r_tail: Vec<u8>,
    /// What the responder's app got after the preface.
    resp_plain: Vec<u8>,
    /// The responder's records (held SETTINGS first) and what the initiator's app got.
    r2i_tail: Vec<u8>,
    init_plain: Vec<u8>,
}

fn record_small() -> Recording {
    let mut link = Link::pair(Split::Whole);
    link.connect(&cat(&[HTTP2_PREFACE, b"alice: one"]), SETTINGS)
        .unwrap();
    link.init_writes(b"alice: two").unwrap();
    let reply_len = link.r2i.len();
    link.resp_writes(b"bob: one").unwrap();
    link.resp_writes(b"bob: two").unwrap();
    Recording {
        hello: link.hello.clone(),
        reply: link.r2i[..reply_len].to_vec(),
        i2r_tail: link.i2r_after_hello(),
        resp_plain: link.resp_app[HTTP2_PREFACE.len()..].to_vec(),
        r2i_tail: link.r2i[reply_len..].to_vec(),
        init_plain: link.init_app.clone(),
    }
}

/// Every single-bit change of `bytes`: (byte, bit, altered copy).
fn bit_flips(bytes: &[u8]) -> impl Iterator<Item = (usize, u8, Vec<u8>)> + '_ {
    (0..bytes.len()).flat_map(move |pos| {
        (0..8).map(move |bit| {
            let mut altered = bytes.to_vec();
            altered[pos] ^= 1 << bit;
            (pos, bit, altered)
        })
    })
}

#[test]
fn altered_initiator_traffic_is_refused_and_never_delivered() {
    let rec = record_small();
    let frames_len: Vec<usize> = frames(&rec.i2r_tail).iter().map(|f| f.len()).collect();
    // Message 3 and the Meta record: an alteration there lets no data through.
    let handshake_end = frames_len[0] + frames_len[1];
    let rng = FixedByteRandom { byte: RESP_RNG };

    for (pos, bit, altered) in bit_flips(&rec.i2r_tail) {
        let (mut resp, reply) = responder_after_reply(&rec.hello, &rng);
        assert_eq!(reply, rec.reply, "the runs are reproducible");
        let mut cut = Cutter::new(Split::Random(pos as u64 * 8 + bit as u64));
        let fed = feed_to_refusal(resp_feeder(&mut resp, &rng), cut.pieces(&altered));
        let refusal = fed.refused.unwrap();
        let ctx = format!("byte {pos} bit {bit}: {refusal:?}");
        // Meta or Preface would mean an altered record had opened.
        assert!(
            ["handshake", "malformed", "tampered", "replay"].contains(&refusal.reason()),
            "{ctx}"
        );
        assert!(
            rec.resp_plain.starts_with(&fed.to_app),
            "{ctx}: altered plaintext delivered"
        );
        if pos < handshake_end {
            assert!(
                fed.to_app.is_empty() && resp.established().is_none(),
                "{ctx}"
            );
        }
        assert_resp_closed(&mut resp, &rec.i2r_tail);
    }
}

#[test]
fn altered_responder_records_are_refused_and_never_delivered() {
    let rec = record_small();
    for (pos, bit, altered) in bit_flips(&rec.r2i_tail) {
        let mut link = Link::pair(Split::Whole);
        link.connect(&cat(&[HTTP2_PREFACE, b"alice: one"]), SETTINGS)
            .unwrap();
        let mut cut = Cutter::new(Split::Random(pos as u64 * 8 + bit as u64));
        let init = &mut link.init;
        let fed = feed_to_refusal(|p| init.from_peer(p), cut.pieces(&altered));
        let refusal = fed.refused.unwrap();
        let ctx = format!("byte {pos} bit {bit}: {refusal:?}");
        assert!(
            ["malformed", "tampered", "replay"].contains(&refusal.reason()),
            "{ctx}"
        );
        assert!(
            rec.init_plain.starts_with(&fed.to_app),
            "{ctx}: altered plaintext delivered"
        );
        assert!(fed.to_peer.is_empty(), "{ctx}");
        assert_init_closed(&mut link.init, &rec.r2i_tail);
    }
}

#[test]
fn an_altered_message_2_is_refused_and_the_held_bytes_never_leave() {
    let rec = record_small();
    let config = HandshakeConfig::default();
    let rng = FixedByteRandom { byte: INIT_RNG };
    for (pos, bit, altered) in bit_flips(&rec.reply) {
        let (mut init, hello) =
            StreamInitiator::start(alice(), bob().id(), meta(), &config, NOW_MS, &rng).unwrap();
        assert_eq!(hello, rec.hello);
        assert!(init
            .from_app(&cat(&[HTTP2_PREFACE, b"alice: one"]))
            .unwrap()
            .is_empty());
        let mut cut = Cutter::new(Split::Random(pos as u64 * 8 + bit as u64));
        let fed = feed_to_refusal(|p| init.from_peer(p), cut.pieces(&altered));
        let refusal = fed.refused.unwrap();
        let ctx = format!("byte {pos} bit {bit}: {refusal:?}");
        assert!(
            ["handshake", "malformed"].contains(&refusal.reason()),
            "{ctx}"
        );
        assert!(
            fed.to_peer.is_empty() && fed.to_app.is_empty(),
            "{ctx}: no message 3"
        );
        assert_eq!(init.peer_id(), None);
        assert_init_closed(&mut init, &rec.reply);
    }
}

#[test]
fn an_altered_message_1_gets_no_preface_and_no_reply() {
    let rec = record_small();
    let rng = FixedByteRandom { byte: RESP_RNG };
    for (pos, bit, altered) in bit_flips(&rec.hello) {
        let mut resp = StreamResponder::new(HTTP2_PREFACE);
        let mut cut = Cutter::new(Split::Random(pos as u64 * 8 + bit as u64));
        let fed = feed_to_refusal(resp_feeder(&mut resp, &rng), cut.pieces(&altered));
        let refusal = fed.refused.unwrap();
        let ctx = format!("byte {pos} bit {bit}: {refusal:?}");
        assert!(
            // A flip that shifts the fields can land in the timestamp: stale.
            ["handshake", "malformed", "stale"].contains(&refusal.reason()),
            "{ctx}"
        );
        assert!(
            fed.to_app.is_empty(),
            "{ctx}: the preface only for a valid message 1"
        );
        assert_resp_closed(&mut resp, &rec.hello);
    }
}

// ---------------------------------------------------------------------------------
// 4. Truncation

#[test]
fn a_cut_stream_delivers_exactly_the_whole_records() {
    let mut link = Link::pair(Split::Whole);
    let first = cat(&[HTTP2_PREFACE, &pattern(40_000, 3)]);
    let second = pattern(20_000, 4);
    link.connect(&first, SETTINGS).unwrap();
    link.init_writes(&second).unwrap();
    let stream = cat(&[&first, &second]);
    let tail = link.i2r_after_hello();

    // End offset of each message, and the plaintext (preface included) up to it.
    let mut ends = Vec::new();
    let (mut end, mut plain) = (0, 0);
    for (i, frame) in frames(&tail).into_iter().enumerate() {
        end += frame.len();
        if i >= 2 {
            plain += payload_len(frame); // not message 3 (0) nor Meta (1)
        }
        ends.push((end, plain));
    }
    let meta_end = ends[1].0;
    let mut cuts: Vec<usize> = ends.iter().flat_map(|&(e, _)| [e - 1, e, e + 1]).collect();
    let mut prng = Prng::new(5);
    cuts.extend((0..30).map(|_| prng.below(tail.len())));
    cuts.push(0);
    cuts.retain(|&c| c < tail.len());

    let rng = FixedByteRandom { byte: RESP_RNG };
    for cut_at in cuts {
        let (mut resp, _) = responder_after_reply(&link.hello, &rng);
        let mut cut = Cutter::new(Split::Random(cut_at as u64));
        let fed = feed(resp_feeder(&mut resp, &rng), cut.pieces(&tail[..cut_at]));
        assert!(
            fed.refused.is_none(),
            "cut at {cut_at}: waiting is not an error"
        );
        let whole = ends
            .iter()
            .take_while(|&&(e, _)| e <= cut_at)
            .last()
            .map_or(0, |&(_, p)| p);
        let expected = &stream[whole.min(HTTP2_PREFACE.len())..whole];
        assert!(
            fed.to_app == expected,
            "cut at {cut_at}: {} bytes, not {}",
            fed.to_app.len(),
            expected.len()
        );
        assert_eq!(
            resp.established().is_some(),
            cut_at >= meta_end,
            "cut at {cut_at}"
        );
    }

    // The other way: the initiator's app gets only whole records too.
    let b = pattern(3 * MAX_CHUNK, 6);
    link.resp_writes(&b).unwrap();
    let reply_len = frames(&link.r2i)[0].len();
    let r_tail = link.r2i[reply_len..].to_vec();
    let sent = cat(&[SETTINGS, &b]);
    let mut end = 0;
    let mut plain = 0;
    for frame in frames(&r_tail) {
        for cut_at in [end, end + 1, end + frame.len() - 1] {
            let mut link = Link::pair(Split::Whole);
            link.connect(&first, SETTINGS).unwrap();
            let init = &mut link.init;
            let mut cut = Cutter::new(Split::Random(cut_at as u64));
            let fed = feed(|p| init.from_peer(p), cut.pieces(&r_tail[..cut_at]));
            assert!(fed.refused.is_none());
            assert!(fed.to_app == sent[..plain], "cut at {cut_at}");
        }
        end += frame.len();
        plain += payload_len(frame);
    }
}

// ---------------------------------------------------------------------------------
// 5. Dropped, reordered and duplicated records

#[test]
fn dropped_reordered_or_duplicated_records_are_replays() {
    let mut link = Link::pair(Split::Whole);
    let first = cat(&[HTTP2_PREFACE, &pattern(3 * LARGE_RECORD_PAYLOAD, 7)]);
    link.connect(&first, SETTINGS).unwrap();
    let tail = link.i2r_after_hello();
    let msgs = frames(&tail); // message 3, Meta, d1..d4
    assert_eq!(msgs.len(), 6);
    let plain_after = |n: usize| -> usize {
        let p: usize = msgs[2..n.max(2)].iter().map(|m| payload_len(m)).sum();
        p.saturating_sub(HTTP2_PREFACE.len())
    };

    let cases: [(&str, &[usize], &str); 7] = [
        ("drop d1", &[0, 1, 3, 4, 5], "replay"),
        ("drop d3", &[0, 1, 2, 3, 5], "replay"),
        ("swap d2 d3", &[0, 1, 2, 4, 3, 5], "replay"),
        ("d4 first", &[0, 1, 5, 2, 3, 4], "replay"),
        ("duplicate d2", &[0, 1, 2, 3, 3, 4, 5], "replay"),
        ("duplicate Meta", &[0, 1, 1, 2], "replay"),
        // d1 where the Meta belongs: refused by its header, longer than a Meta may be.
        ("drop Meta", &[0, 2, 3], "malformed"),
    ];
    let rng = FixedByteRandom { byte: RESP_RNG };
    for (split_seed, (name, order, reason)) in cases.into_iter().enumerate() {
        let altered: Vec<u8> = order.iter().flat_map(|&i| msgs[i].to_vec()).collect();
        let in_order = order
            .iter()
            .enumerate()
            .take_while(|&(i, &m)| i == m)
            .count();
        let (mut resp, _) = responder_after_reply(&link.hello, &rng);
        let mut cut = Cutter::new(Split::Random(split_seed as u64));
        let fed = feed(resp_feeder(&mut resp, &rng), cut.pieces(&altered));
        let refusal = fed.refused.unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(refusal.reason(), reason, "{name}: {refusal:?}");
        // Nothing past the last record that arrived in order.
        let allowed = &first[HTTP2_PREFACE.len()..][..plain_after(in_order)];
        assert!(allowed.starts_with(&fed.to_app), "{name}");
        assert_resp_closed(&mut resp, &tail);
    }

    // The responder's records, to the initiator.
    let b = pattern(3 * LARGE_RECORD_PAYLOAD, 8);
    link.resp_writes(&b).unwrap();
    let reply_len = frames(&link.r2i)[0].len();
    let r_tail = link.r2i[reply_len..].to_vec();
    let recs = frames(&r_tail); // SETTINGS, b1..b3
    let cases: [(&str, &[usize]); 3] = [
        ("drop", &[0, 2, 3]),
        ("swap", &[0, 2, 1, 3]),
        ("duplicate", &[0, 1, 1, 2]),
    ];
    for (name, order) in cases {
        let altered: Vec<u8> = order.iter().flat_map(|&i| recs[i].to_vec()).collect();
        let mut link = Link::pair(Split::Whole);
        link.connect(&first, SETTINGS).unwrap();
        let init = &mut link.init;
        let fed = feed(
            |p| init.from_peer(p),
            Cutter::new(Split::Bytes).pieces(&altered),
        );
        let refusal = fed.refused.unwrap_or_else(|| panic!("{name}: accepted"));
        assert_eq!(refusal.reason(), "replay", "{name}: {refusal:?}");
        assert_init_closed(&mut link.init, &r_tail);
    }
}

// ---------------------------------------------------------------------------------
// 6. Reflection and splicing

#[test]
fn reflected_messages_and_records_are_refused() {
    let mut link = Link::pair(Split::Random(11));
    link.connect(&cat(&[HTTP2_PREFACE, b"alice"]), SETTINGS)
        .unwrap();
    // The initiator sent Meta (1) and one data record (2): the responder expects 3.
    let expected = frames(&link.i2r_after_hello()).len() as u64; // message 3 + records
    let mut own = Vec::new();
    for data in [&b"one"[..], b"two", b"three"] {
        own.push(link.resp.from_app(data).unwrap());
    }
    let own: Vec<u8> = own.concat();
    let matching = frames(&own)
        .into_iter()
        .find(|r| seq(r) == expected)
        .unwrap()
        .to_vec();

    // Same number as the one expected: only the keys and the bound receiver id differ.
    let fed = feed(
        resp_feeder(&mut link.resp, &SystemRandom::new()),
        [&matching[..]],
    );
    let refusal = fed.refused.expect("the responder's own record is refused");
    assert_eq!(refusal.reason(), "tampered", "{refusal:?}");
    assert!(fed.to_app.is_empty());
    assert_resp_closed(&mut link.resp, &matching);

    // The initiator, fed its own record at the number it expects next.
    let mut link = Link::pair(Split::Whole);
    link.connect(HTTP2_PREFACE, SETTINGS).unwrap();
    link.resp_writes(b"bob").unwrap(); // SETTINGS (1) and "bob" (2): it expects 3
    let mine = link.init.from_app(b"x").unwrap(); // after Meta (1) and the preface (2)
    assert_eq!(seq(&mine), 3);
    let fed = feed(|p| link.init.from_peer(p), [&mine[..]]);
    let refusal = fed.refused.expect("the initiator's own record is refused");
    assert_eq!(refusal.reason(), "tampered", "{refusal:?}");
    assert!(fed.to_app.is_empty());
    assert_init_closed(&mut link.init, &mine);

    // Handshake messages sent back to their sender.
    let mut link = Link::pair(Split::Whole);
    let hello = link.hello.clone();
    let refusal = link.deliver_to_init(&hello).unwrap_err();
    // Refused by its kind already (a Hello where a HelloReply must come).
    assert_eq!(refusal.reason(), "malformed", "{refusal:?}");
    let mut link = Link::pair(Split::Whole);
    link.deliver_to_resp(&hello).unwrap();
    let reply = link.resp.from_app(SETTINGS).unwrap();
    let refusal = link.deliver_to_resp(&reply).unwrap_err();
    assert!(
        ["handshake", "malformed"].contains(&refusal.reason()),
        "{refusal:?}"
    );
    assert_eq!(link.resp_app, HTTP2_PREFACE);
}

#[test]
fn records_of_another_connection_are_refused() {
    // Two connections between the same ends: the same numbers, other keys and ids.
    let mut one = Link::pair(Split::Whole);
    one.connect(&cat(&[HTTP2_PREFACE, b"first"]), SETTINGS)
        .unwrap();
    one.init_writes(b"next").unwrap();
    let rng = FixedByteRandom { byte: 0x33 };
    let mut two = Link::new(
        alice(),
        bob().id(),
        bob(),
        meta(),
        Split::Whole,
        &rng,
        fixed(0x44),
    );
    two.connect(&cat(&[HTTP2_PREFACE, b"second"]), SETTINGS)
        .unwrap();
    let from_one = frames(&one.i2r_after_hello())[3].to_vec();
    assert_eq!(seq(&from_one), 3);
    let refusal = two.deliver_to_resp(&from_one).unwrap_err();
    assert_eq!(refusal.reason(), "tampered", "{refusal:?}");
    assert_eq!(two.resp_app, cat(&[HTTP2_PREFACE, b"second"]));
}

// ---------------------------------------------------------------------------------
// 7. Plaintext injection

#[test]
fn plaintext_is_not_the_protocol() {
    let get = b"GET / HTTP/1.1\r\nHost: checkout\r\n\r\n";
    let tls = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];
    for split in SPLITS {
        for junk in [&get[..], &tls[..], HTTP2_PREFACE] {
            let rng = FixedByteRandom { byte: RESP_RNG };
            let mut resp = StreamResponder::new(HTTP2_PREFACE);
            let mut cut = Cutter::new(split);
            let fed = feed(resp_feeder(&mut resp, &rng), cut.pieces(junk));
            let refusal = fed.refused.expect("refused");
            assert_eq!(refusal.reason(), "malformed", "{split:?}: {refusal:?}");
            assert!(fed.to_app.is_empty(), "{split:?}");
            assert_resp_closed(&mut resp, junk);
        }
        // As message 2, to the initiator.
        let mut link = Link::pair(split);
        assert!(link.init.from_app(HTTP2_PREFACE).unwrap().is_empty());
        let refusal = link
            .deliver_to_init(b"HTTP/1.1 200 OK\r\n\r\n")
            .unwrap_err();
        assert_eq!(refusal.reason(), "malformed", "{split:?}");
        assert_init_closed(&mut link.init, b"");
    }

    // After the handshake, between records, either way.
    for split in SPLITS {
        let mut link = Link::pair(split);
        link.connect(&cat(&[HTTP2_PREFACE, b"one"]), SETTINGS)
            .unwrap();
        let refusal = link.deliver_to_resp(get).unwrap_err();
        assert_eq!(refusal.reason(), "malformed", "{split:?}");
        assert_eq!(link.resp_app, cat(&[HTTP2_PREFACE, b"one"]));
        assert_resp_closed(&mut link.resp, b"");

        let mut link = Link::pair(split);
        link.connect(HTTP2_PREFACE, SETTINGS).unwrap();
        link.resp_writes(b"one").unwrap();
        let refusal = link
            .deliver_to_init(b"HTTP/1.1 200 OK\r\n\r\nforged")
            .unwrap_err();
        assert_eq!(refusal.reason(), "malformed", "{split:?}");
        assert_eq!(link.init_app, cat(&[SETTINGS, b"one"]));
        assert_init_closed(&mut link.init, b"");
    }
}

// ---------------------------------------------------------------------------------
// 8. The wrong peer

#[test]
fn a_hello_for_someone_else_or_another_mesh_is_refused() {
    let rng = FixedByteRandom { byte: INIT_RNG };
    let elsewhere = identity("elsewhere", 0xa1);
    let cases = [
        ("for carol", alice(), carol().id(), HandshakeError::NotForMe),
        (
            "other mesh",
            &elsewhere,
            bob().id(),
            HandshakeError::WrongMesh,
        ),
    ];
    for (name, from, to, why) in cases {
        for split in SPLITS {
            let mut link = Link::new(from, to, bob(), meta(), split, &rng, fixed(RESP_RNG));
            let refusal = link.connect(HTTP2_PREFACE, SETTINGS).unwrap_err();
            assert_eq!(refusal.reason(), "handshake", "{name}");
            assert_eq!(refusal, Refusal::Handshake(why.clone()), "{name}");
            assert!(
                link.resp_app.is_empty(),
                "{name}: no preface for a refused hello"
            );
            assert_resp_closed(&mut link.resp, b"");
        }
    }
}

#[test]
fn a_reply_from_the_wrong_peer_or_connection_is_refused() {
    let config = HandshakeConfig::default();
    // Carol answers a hello made for her; alice meant to reach bob.
    let rng = FixedByteRandom { byte: INIT_RNG };
    let mut for_carol = Link::new(
        alice(),
        carol().id(),
        carol(),
        meta(),
        Split::Whole,
        &rng,
        fixed(RESP_RNG),
    );
    for_carol.connect(HTTP2_PREFACE, SETTINGS).unwrap();
    let carols_reply = frames(&for_carol.r2i)[0].to_vec();
    // Bob's answer to another of alice's connections.
    let other_rng = FixedByteRandom { byte: 0x33 };
    let mut other = Link::new(
        alice(),
        bob().id(),
        bob(),
        meta(),
        Split::Whole,
        &other_rng,
        fixed(0x44),
    );
    other.connect(HTTP2_PREFACE, SETTINGS).unwrap();
    let other_reply = frames(&other.r2i)[0].to_vec();

    for reply in [carols_reply, other_reply] {
        let (mut init, _) =
            StreamInitiator::start(alice(), bob().id(), meta(), &config, NOW_MS, &rng).unwrap();
        assert!(init.from_app(HTTP2_PREFACE).unwrap().is_empty());
        let fed = feed(
            |p| init.from_peer(p),
            Cutter::new(Split::Random(4)).pieces(&reply),
        );
        let refusal = fed.refused.expect("refused");
        assert_eq!(refusal.reason(), "handshake", "{refusal:?}");
        assert!(fed.to_peer.is_empty(), "no message 3, no held bytes");
        assert_eq!(init.peer_id(), None);
        assert_init_closed(&mut init, &reply);
    }
}

// ---------------------------------------------------------------------------------
// 9. Oversize

fn header(session_id: u64, seq: u64, len: u32) -> [u8; wire::RECORD_HEADER_LEN] {
    RecordHeader {
        version: PROTOCOL_VERSION,
        kind: Kind::Record as u8,
        session_id,
        seq,
        reply_to: 0,
        len,
    }
    .encode()
}

#[test]
fn a_huge_record_is_refused_at_its_header() {
    for options in [StreamOptions::LARGE_RECORDS, StreamOptions::NONE] {
        let mut link = Link::pair_with(options, Split::Whole);
        link.connect(HTTP2_PREFACE, SETTINGS).unwrap();
        let tail = link.i2r_after_hello();
        let session = RecordHeader::decode(frames(&tail)[1]).unwrap().session_id;
        let next = frames(&tail).len() as u64;

        // Beyond what the channel allows, and beyond the records this stream agreed on
        // (an authenticated peer must not make an end buffer a 1 MiB record either).
        let stream_max = (options.record_payload() + 1) as u32;
        for len in [u32::MAX, MAX_RECORD_PAYLOAD as u32 + 1, stream_max] {
            for split in [Split::Whole, Split::Bytes] {
                let mut link = Link::pair_with(options, split);
                link.connect(HTTP2_PREFACE, SETTINGS).unwrap();
                // Only the header: the refusal must not wait for the body.
                let refusal = link
                    .deliver_to_resp(&header(session, next, len))
                    .unwrap_err();
                assert!(
                    matches!(
                        refusal,
                        Refusal::Malformed(
                            WireError::TooLarge { .. } | WireError::UnexpectedKind { .. }
                        )
                    ),
                    "{len}: {refusal:?}"
                );
                assert_resp_closed(&mut link.resp, b"");

                // The initiator of an open stream, the same way.
                let mut link = Link::pair_with(options, split);
                link.connect(HTTP2_PREFACE, SETTINGS).unwrap();
                let refusal = link.deliver_to_init(&header(session, 9, len)).unwrap_err();
                assert!(
                    matches!(refusal, Refusal::Malformed(WireError::TooLarge { .. })),
                    "{len}: {refusal:?}"
                );
                assert_init_closed(&mut link.init, b"");

                // The initiator, waiting for message 2.
                let mut link = Link::pair(split);
                assert!(link.init.from_app(HTTP2_PREFACE).unwrap().is_empty());
                let refusal = link.deliver_to_init(&header(session, 1, len)).unwrap_err();
                assert!(matches!(
                    refusal,
                    Refusal::Malformed(
                        WireError::TooLarge { .. } | WireError::UnexpectedKind { .. }
                    )
                ));
                assert_init_closed(&mut link.init, b"");

                // A responder waiting for message 1.
                let mut link = Link::pair(split);
                let refusal = link.deliver_to_resp(&header(session, 1, len)).unwrap_err();
                assert_eq!(refusal.reason(), "malformed");
            }
        }
    }
}

/// The first record after message 3 (the Meta) has the stream's 16 KiB bound too: an
/// initiator that completed the handshake cannot make the responder hold a 1 MiB
/// record before it has said who it claims to be (found in review).
#[test]
fn a_huge_record_in_place_of_the_meta_is_refused_at_its_header() {
    let mut link = Link::pair(Split::Whole);
    link.connect(HTTP2_PREFACE, SETTINGS).unwrap();
    let tail = link.i2r_after_hello();
    let confirm = frames(&tail)[0].to_vec();
    let session = RecordHeader::decode(frames(&tail)[1]).unwrap().session_id;
    for len in [
        (themis_core::stream::MAX_CHUNK + 1) as u32,
        MAX_RECORD_PAYLOAD as u32,
    ] {
        // The same fixed randomness: a responder in the state message 3 finds.
        let (mut resp, _) = responder_after_reply(&link.hello, &*fixed(RESP_RNG));
        let rng = fixed(RESP_RNG);
        let mut deliver = |bytes: &[u8]| {
            resp.from_peer(
                bytes,
                bob(),
                &HandshakeConfig::default(),
                &mut HelloGuard::default(),
                NOW_MS,
                &*rng,
            )
        };
        assert!(deliver(&confirm).unwrap().to_app.is_empty());
        let refusal = deliver(&header(session, 1, len)).unwrap_err();
        assert!(
            matches!(refusal, Refusal::Malformed(WireError::TooLarge { .. })),
            "{len}: {refusal:?}"
        );
    }
}

#[test]
fn a_hello_longer_than_the_limit_is_refused_by_then() {
    // version, kind Hello, suites, records_per_key, then a 4000-byte mesh name.
    let mut long = vec![PROTOCOL_VERSION, Kind::Hello as u8, 1, 16, 0xa0, 0x1f];
    long.resize(4 * MAX_HANDSHAKE_LEN, b'm');
    let rng = FixedByteRandom { byte: RESP_RNG };

    let mut resp = StreamResponder::new(HTTP2_PREFACE);
    let fed = feed(
        resp_feeder(&mut resp, &rng),
        Cutter::new(Split::Bytes).pieces(&long),
    );
    assert!(matches!(
        fed.refused,
        Some(Refusal::Malformed(
            WireError::TooLarge { .. } | WireError::UnexpectedKind { .. }
        ))
    ));
    assert!(fed.to_app.is_empty());
    // Refused once MAX_HANDSHAKE_LEN bytes are buffered, not later.
    let mut resp = StreamResponder::new(HTTP2_PREFACE);
    let ok = feed(
        resp_feeder(&mut resp, &rng),
        Cutter::new(Split::Bytes).pieces(&long[..MAX_HANDSHAKE_LEN - 1]),
    );
    assert!(
        ok.refused.is_none(),
        "shorter than the limit: it may still be a hello"
    );
    let fed = feed(
        resp_feeder(&mut resp, &rng),
        [&long[MAX_HANDSHAKE_LEN - 1..MAX_HANDSHAKE_LEN + 1]],
    );
    assert!(matches!(
        fed.refused,
        Some(Refusal::Malformed(
            WireError::TooLarge { .. } | WireError::UnexpectedKind { .. }
        ))
    ));

    for split in [Split::Whole, Split::Random(12)] {
        let mut resp = StreamResponder::new(HTTP2_PREFACE);
        let fed = feed(
            resp_feeder(&mut resp, &rng),
            Cutter::new(split).pieces(&long),
        );
        assert_eq!(fed.refused.map(|r| r.reason()), Some("malformed"));
        assert_resp_closed(&mut resp, b"");
    }
}

// ---------------------------------------------------------------------------------
// 10. The preface

#[test]
fn a_stream_without_the_preface_is_refused() {
    for split in SPLITS {
        let mut link = Link::pair(split);
        let refusal = link
            .connect(b"GET / HTTP/1.1\r\nHost: checkout\r\n\r\n", SETTINGS)
            .unwrap_err();
        assert_eq!(
            (refusal.clone(), refusal.reason()),
            (Refusal::Preface, "preface")
        );
        assert_eq!(
            link.resp_app, HTTP2_PREFACE,
            "{split:?}: the request never reached the app"
        );
        assert_resp_closed(&mut link.resp, b"");

        // Right start, wrong rest, in a later write.
        let mut link = Link::pair(split);
        link.connect(&HTTP2_PREFACE[..10], SETTINGS).unwrap();
        let refusal = link.init_writes(b"XXXXXXXXXXXXXXXXXXXXXXXXXX").unwrap_err();
        assert_eq!(refusal, Refusal::Preface, "{split:?}");
        assert_eq!(link.resp_app, HTTP2_PREFACE);
        assert_resp_closed(&mut link.resp, b"");
    }
}

// ---------------------------------------------------------------------------------
// 11. Out of turn

#[test]
fn data_before_message_2_is_out_of_turn() {
    let rec = record_small();
    let record = frames(&rec.i2r_tail)[1].to_vec();
    let rng = FixedByteRandom { byte: RESP_RNG };
    for extra in [&record[..], &rec.hello, &[PROTOCOL_VERSION][..]] {
        // Glued to message 1, in one read.
        let mut resp = StreamResponder::new(HTTP2_PREFACE);
        let fed = feed(
            resp_feeder(&mut resp, &rng),
            [&cat(&[&rec.hello, extra])[..]],
        );
        assert_eq!(
            fed.refused.as_ref().map(Refusal::reason),
            Some("out_of_turn")
        );
        assert!(fed.to_app.is_empty());
        assert_resp_closed(&mut resp, b"");

        // In a later read, before the app answered (so before message 2 left).
        let mut resp = StreamResponder::new(HTTP2_PREFACE);
        let fed = feed(resp_feeder(&mut resp, &rng), [&rec.hello[..], extra]);
        assert_eq!(
            fed.refused.as_ref().map(Refusal::reason),
            Some("out_of_turn")
        );
        assert_eq!(fed.to_app, HTTP2_PREFACE);
        assert_resp_closed(&mut resp, b"");
    }
}

// ---------------------------------------------------------------------------------
// 12. Closed for good

#[test]
fn after_a_refusal_the_genuine_bytes_are_refused_too() {
    // The responder refuses one forged record mid-stream; the genuine ones after it
    // must not resume the stream.
    let mut link = Link::pair(Split::Whole);
    link.connect(&cat(&[HTTP2_PREFACE, b"one"]), SETTINGS)
        .unwrap();
    let before = link.resp_app.clone();
    let sealed = link.init.from_app(b"two").unwrap();
    let mut forged = sealed.clone();
    *forged.last_mut().unwrap() ^= 1;
    assert_eq!(
        link.deliver_to_resp(&forged).unwrap_err().reason(),
        "tampered"
    );
    for _ in 0..3 {
        assert!(link.deliver_to_resp(&sealed).is_err());
        assert!(link.resp.from_app(b"reply").is_err());
    }
    assert_eq!(link.resp_app, before);

    // The initiator likewise, and it seals nothing more.
    let mut link = Link::pair(Split::Whole);
    link.connect(HTTP2_PREFACE, SETTINGS).unwrap();
    let sealed = link.resp.from_app(b"one").unwrap();
    let mut forged = sealed.clone();
    forged[40] ^= 0x80;
    assert_eq!(
        link.deliver_to_init(&forged).unwrap_err().reason(),
        "tampered"
    );
    for _ in 0..3 {
        assert!(link.deliver_to_init(&sealed).is_err());
        assert!(link.init.from_app(b"request").is_err());
    }
    assert!(link.init_app.is_empty());
}

#[test]
fn a_record_before_the_handshake_is_refused_at_its_header() {
    // Only a handshake message (at most MAX_HANDSHAKE_LEN bytes) is valid before the
    // session exists, so an unauthenticated peer should not make an end buffer a whole
    // record (MAX_RECORD_LEN) before it is refused.
    let record = header(7, 1, MAX_RECORD_PAYLOAD as u32);
    let mut waiting = Vec::new();

    let mut link = Link::pair(Split::Whole);
    if link.deliver_to_resp(&record).is_ok() {
        waiting.push("responder awaiting message 1");
    }
    let mut link = Link::pair(Split::Whole);
    let hello = link.hello.clone();
    link.deliver_to_resp(&hello).unwrap();
    link.resp.from_app(SETTINGS).unwrap();
    if link.deliver_to_resp(&record).is_ok() {
        waiting.push("responder awaiting message 3");
    }
    let mut link = Link::pair(Split::Whole);
    assert!(link.init.from_app(HTTP2_PREFACE).unwrap().is_empty());
    if link.deliver_to_init(&record).is_ok() {
        waiting.push("initiator awaiting message 2");
    }
    assert!(
        waiting.is_empty(),
        "still buffering a 1 MiB record: {waiting:?}"
    );
}

// ---------------------------------------------------------------------------------
// Holding the app's bytes

/// A peer that never answers (a black hole at an endorsed address, a stalled
/// node) while the app writes on: each side holds at most [`MAX_HELD`] of its app's
/// bytes before the session opens, then refuses (`overflow`) and stays closed —
/// the app's whole upload is never buffered. Up to the bound nothing is lost.
#[test]
fn a_silent_peer_makes_a_side_hold_at_most_max_held_of_its_apps_bytes() {
    let rec = record_small();
    let config = HandshakeConfig::default();
    let rng = FixedByteRandom { byte: INIT_RNG };
    let start = || StreamInitiator::start(alice(), bob().id(), meta(), &config, NOW_MS, &rng);

    // Up to the bound, in pieces: held, and all of it leaves once the peer answers.
    let (mut init, hello) = start().unwrap();
    assert_eq!(hello, rec.hello);
    let app = pattern(MAX_HELD, 7);
    for piece in app.chunks(MIB) {
        assert!(init.from_app(piece).unwrap().is_empty());
    }
    let out = init.from_peer(&rec.reply).unwrap();
    assert!(init.is_open());
    assert!(
        out.to_peer.len() > MAX_HELD,
        "message 3 and every held byte, sealed"
    );

    // One byte past it: refused, nothing sent, closed for good.
    let (mut init, _) = start().unwrap();
    assert!(init.from_app(&app).unwrap().is_empty());
    let refusal = init.from_app(b"x").unwrap_err();
    assert_eq!(refusal.reason(), "overflow");
    assert_eq!(refusal, Refusal::Overflow);
    assert_init_closed(&mut init, &rec.reply);
    // In one write too.
    let (mut init, _) = start().unwrap();
    let over = pattern(MAX_HELD + 1, 8);
    assert_eq!(init.from_app(&over), Err(Refusal::Overflow));
    assert_init_closed(&mut init, &rec.reply);

    // The responder's app (a server that speaks first) while message 3 does not come.
    let rng = FixedByteRandom { byte: RESP_RNG };
    let (mut resp, _) = responder_after_reply(&rec.hello, &rng);
    assert!(resp
        .from_app(&pattern(MAX_HELD - SETTINGS.len(), 9))
        .unwrap()
        .is_empty());
    assert_eq!(resp.from_app(b"x"), Err(Refusal::Overflow));
    assert_resp_closed(&mut resp, &rec.i2r_tail);
    // And before message 1 came at all.
    let mut early = StreamResponder::new(HTTP2_PREFACE);
    assert_eq!(early.from_app(&over), Err(Refusal::Overflow));
    assert_resp_closed(&mut early, &rec.hello);
}
