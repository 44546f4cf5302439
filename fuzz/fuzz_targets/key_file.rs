//! Loading a private key file: the input as text, and the input as the DER document
//! inside a well-formed PEM armour (random text almost never gets past the armour).
//! Loading returns, and a key that loads writes out to a file that loads back to the
//! same identity.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pem_rfc7468::LineEnding;
use themis_core::Identity;
use themis_fuzz::mesh;

fn load(text: &str) {
    if let Ok(identity) = Identity::from_key_file(mesh(), text) {
        let again = Identity::from_key_file(mesh(), &identity.to_key_file())
            .expect("a key file we wrote loads");
        assert_eq!(again.id(), identity.id());
    }
}

fuzz_target!(|bytes: &[u8]| {
    load(&String::from_utf8_lossy(bytes));
    load(&pem_rfc7468::encode_string("PRIVATE KEY", LineEnding::LF, bytes).expect("PEM encoding"));
});
