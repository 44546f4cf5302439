//! The fixed initiator starts a handshake and reads a fuzzed message 2. It is
//! accepted exactly when it is the genuine answer, and then the key confirmation the
//! initiator sends convinces the responder.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use themis_fuzz::{
    assert_accepted_iff_genuine, assert_session_works, respond, start, Message, Settings,
};

#[derive(Arbitrary, Debug)]
struct Input {
    settings: Settings,
    reply: Message,
}

fuzz_target!(|input: Input| {
    let config = input.settings.config();
    let (waiting, hello) = start(&config);
    let (pending, genuine_reply) =
        respond(&hello, &config).expect("the genuine message 1 is accepted");
    let reply = input.reply.bytes(&genuine_reply);
    let read = waiting.read_hello_reply(&reply);
    assert_accepted_iff_genuine("message 2", &read, &reply, &genuine_reply);
    if let Ok((mut initiator, confirm)) = read {
        let mut responder = pending.read_confirm(&confirm).expect("message 3 is accepted");
        assert_session_works(&mut initiator, &mut responder);
    }
});
