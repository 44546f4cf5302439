//! rustls TLS 1.3 with client authentication (mTLS), both ends in memory.
//!
//! `ring` provider only, restricted to `TLS13_AES_256_GCM_SHA384` (Themis' default
//! suite has the same cipher). Ed25519 certificates: one self-signed CA issues the
//! server's and the client's leaf, so each side verifies a chain of one leaf (CA
//! signature) plus the peer's CertificateVerify. Resumption and tickets are off, so
//! every handshake is a full one.

use std::io::{self, Read, Write};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ED25519,
};
use rustls::client::Resumption;
use rustls::crypto::{ring as provider, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::{
    ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection,
};

const SERVER_NAME: &str = "server.bench";
const CLIENT_NAME: &str = "client.bench";

/// Both configurations, built once.
pub struct Tls {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

/// A client and a server connection with the wire between them.
pub struct TlsLink {
    /// The client end.
    pub client: Connection,
    /// The server end.
    pub server: Connection,
    wire: Vec<u8>,
}

fn leaf(
    name: &str,
    usage: ExtendedKeyUsagePurpose,
    ca: &Issuer<'_, KeyPair>,
) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
    let key = KeyPair::generate_for(&PKCS_ED25519).expect("Ed25519 key");
    let mut params = CertificateParams::new(vec![name.to_string()]).expect("valid name");
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, ca).expect("sign leaf");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (cert.der().clone(), key)
}

impl Tls {
    /// A CA, two leaf certificates and the two configurations.
    pub fn new() -> Self {
        let ca_key = KeyPair::generate_for(&PKCS_ED25519).expect("Ed25519 key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign CA");
        let ca = Issuer::new(ca_params, ca_key);
        let mut roots = RootCertStore::empty();
        roots.add(ca_cert.der().clone()).expect("CA certificate");
        let roots = Arc::new(roots);

        let provider = Arc::new(CryptoProvider {
            cipher_suites: vec![provider::cipher_suite::TLS13_AES_256_GCM_SHA384],
            ..provider::default_provider()
        });
        let versions = &[&rustls::version::TLS13];

        let (server_cert, server_key) = leaf(SERVER_NAME, ExtendedKeyUsagePurpose::ServerAuth, &ca);
        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .expect("client verifier");
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .expect("TLS 1.3")
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(vec![server_cert], server_key)
            .expect("server certificate");
        server.session_storage = Arc::new(NoServerSessionStorage {});
        server.send_tls13_tickets = 0;

        let (client_cert, client_key) = leaf(CLIENT_NAME, ExtendedKeyUsagePurpose::ClientAuth, &ca);
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .expect("TLS 1.3")
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![client_cert], client_key)
            .expect("client certificate");
        client.resumption = Resumption::disabled();

        Tls {
            client: Arc::new(client),
            server: Arc::new(server),
        }
    }

    /// A fresh, unconnected pair.
    pub fn link(&self) -> TlsLink {
        let name = ServerName::try_from(SERVER_NAME).expect("valid name");
        let client = ClientConnection::new(self.client.clone(), name).expect("client");
        let server = ServerConnection::new(self.server.clone()).expect("server");
        TlsLink {
            client: client.into(),
            server: server.into(),
            wire: Vec::new(),
        }
    }

    /// A fresh pair that has completed a full handshake.
    pub fn connected(&self) -> TlsLink {
        let mut link = self.link();
        link.handshake();
        link
    }
}

impl Default for Tls {
    fn default() -> Self {
        Self::new()
    }
}

impl TlsLink {
    /// Pumps bytes both ways until neither side is handshaking. The server stops
    /// handshaking only once it has processed the client's Finished.
    pub fn handshake(&mut self) {
        while self.client.is_handshaking() || self.server.is_handshaking() {
            let (to_server, _) =
                transfer(&mut self.client, &mut self.server, &mut self.wire, &mut []);
            let (to_client, _) =
                transfer(&mut self.server, &mut self.client, &mut self.wire, &mut []);
            assert!(to_server + to_client > 0, "the handshake stalled");
        }
    }

    /// Writes `payload` on the client and reads it into `received` on the server
    /// (rustls cuts it into records of at most 16 KB). Returns the bytes received.
    pub fn send(&mut self, payload: &[u8], received: &mut [u8]) -> usize {
        self.client.set_buffer_limit(None);
        self.client.writer().write_all(payload).expect("write");
        transfer(&mut self.client, &mut self.server, &mut self.wire, received).1
    }
}

/// Moves every TLS byte `from` has pending into `to`, and reads the plaintext `to`
/// decrypts into `plaintext`. Returns (TLS bytes moved, plaintext bytes read).
fn transfer(
    from: &mut Connection,
    to: &mut Connection,
    wire: &mut Vec<u8>,
    plaintext: &mut [u8],
) -> (usize, usize) {
    let (mut moved, mut read) = (0, 0);
    while from.wants_write() {
        wire.clear();
        moved += from.write_tls(wire).expect("write_tls");
        let mut incoming = &wire[..];
        while !incoming.is_empty() {
            to.read_tls(&mut incoming).expect("read_tls");
            to.process_new_packets().expect("TLS error");
            read += read_available(to, &mut plaintext[read..]);
        }
    }
    (moved, read)
}

/// Reads the plaintext `conn` has buffered.
fn read_available(conn: &mut Connection, out: &mut [u8]) -> usize {
    let mut read = 0;
    while read < out.len() {
        match conn.reader().read(&mut out[read..]) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("TLS read: {e}"),
        }
    }
    read
}
