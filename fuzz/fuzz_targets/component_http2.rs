//! The component tool's HTTP/2 client (`call --http`, HPACK included) against a server
//! that answers anything. Nothing panics, and how the answer is cut does not matter:
//! fed at once or a byte at a time, the client ends with the same verdict and, unless
//! it is an error, sent the same bytes back and reported the same events. After an
//! error it is not fed again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use themis_component::http2::{Client, Event, Request};

/// What a client made of the server's bytes: what it sent, what it reported, and the
/// error that ended it, if one did.
fn run(body_len: usize, data: &[u8], chunk: usize) -> (Vec<u8>, Vec<Event>, Option<String>) {
    let request = Request {
        method: "POST".into(),
        path: "/echo".into(),
        authority: "check".into(),
        headers: vec![("x-custom".into(), "value".into())],
        // Up to 256 KiB: past the initial windows, so that the server's
        // WINDOW_UPDATEs and SETTINGS decide what the client sends.
        body: Some(vec![b'x'; body_len]),
    };
    let (mut client, _first) = Client::start(&request).expect("a valid request");
    let (mut sent, mut events) = (Vec::new(), Vec::new());
    for piece in data.chunks(chunk) {
        match client.receive(piece) {
            Ok((out, new)) => {
                sent.extend_from_slice(&out);
                events.extend(new);
            }
            Err(error) => {
                let _ = error.goaway();
                return (sent, events, Some(error.to_string()));
            }
        }
        if client.is_done() {
            break;
        }
    }
    (sent, events, None)
}

/// Data events, joined: the body does not depend on where reads were cut.
fn normalise(events: Vec<Event>) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    for event in events {
        match (out.last_mut(), event) {
            (Some(Event::Data(body)), Event::Data(more)) => body.extend_from_slice(&more),
            (_, Event::Data(more)) if more.is_empty() => {}
            (_, event) => out.push(event),
        }
    }
    out
}

/// Events come in HTTP's order: informational answers, then the response, its body
/// and trailers, and nothing after the end.
fn assert_ordered(events: &[Event]) {
    let mut responded = false;
    let mut ended = false;
    for event in events {
        assert!(!ended, "an event after the end: {events:?}");
        match event {
            Event::Informational { .. } => assert!(!responded, "1xx after the response"),
            Event::Response { .. } => {
                assert!(!responded, "two responses");
                responded = true;
            }
            Event::Data(_) | Event::Trailers(_) => {
                assert!(responded, "body before the response: {events:?}")
            }
            Event::End => ended = true,
        }
    }
}

fuzz_target!(|input: &[u8]| {
    // The first two bytes choose the request body's length (in 4-byte steps).
    let Some((len, data)) = input.split_first_chunk::<2>() else {
        return;
    };
    if data.len() > 64 * 1024 {
        return;
    }
    let body_len = usize::from(u16::from_le_bytes(*len)) * 4;
    let (sent, events, verdict) = run(body_len, data, data.len().max(1));
    let (sent_bytewise, events_bytewise, verdict_bytewise) = run(body_len, data, 1);
    assert_ordered(&events);
    assert_ordered(&events_bytewise);
    assert_eq!(verdict, verdict_bytewise, "the verdict depends on the cut");
    // After an error the connection ends (with a GOAWAY): what a read produced before
    // the error in the same read is dropped, so only error-free runs compare.
    if verdict.is_none() {
        assert_eq!(
            normalise(events),
            normalise(events_bytewise),
            "the events depend on the cut"
        );
        assert_eq!(sent, sent_bytewise, "what is sent depends on the cut");
    }
});
