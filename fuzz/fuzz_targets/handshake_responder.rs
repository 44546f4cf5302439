//! The fixed responder answers a fuzzed message 1 and, when it got that far, reads a
//! fuzzed message 3. Each is accepted exactly when it is the genuine message, and a
//! session that comes out of it works.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use themis_fuzz::{
    assert_accepted_iff_genuine, assert_session_works, respond, start, Message, Settings,
};

#[derive(Arbitrary, Debug)]
struct Input {
    settings: Settings,
    hello: Message,
    confirm: Message,
}

fuzz_target!(|input: Input| {
    let config = input.settings.config();
    let (waiting, genuine_hello) = start(&config);
    let hello = input.hello.bytes(&genuine_hello);
    let answered = respond(&hello, &config);
    assert_accepted_iff_genuine("message 1", &answered, &hello, &genuine_hello);
    let Ok((pending, reply)) = answered else { return };

    let (mut initiator, genuine_confirm) =
        waiting.read_hello_reply(&reply).expect("the genuine message 2 is accepted");
    let confirm = input.confirm.bytes(&genuine_confirm);
    let confirmed = pending.read_confirm(&confirm);
    assert_accepted_iff_genuine("message 3", &confirmed, &confirm, &genuine_confirm);
    if let Ok(mut responder) = confirmed {
        assert_session_works(&mut initiator, &mut responder);
    }
});
