//! The exports of the WIT world, over `themis-core`.

use std::cell::RefCell;

use ring::rand::SystemRandom;
use themis_core::handshake::{
    self, AwaitingConfirm, AwaitingHelloReply, Initiator as CoreInitiator,
};
use themis_core::{
    wire, HandshakeConfig, HelloGuard, Identity as CoreIdentity, MeshName, PeerId,
    Session as CoreSession,
};

wit_bindgen::generate!({ path: "../../wit", world: "themis-tool", generate_all });

use exports::themis::mesh::channel::{self, GuestSession, Opened, Session as SessionHandle};
use exports::themis::mesh::identities::{self, GuestIdentity, Identity as IdentityHandle};
use exports::themis::mesh::key_agreement::{
    self, GuestInitiator, GuestResponder, Initiator as InitiatorHandle,
    Responder as ResponderHandle,
};
use exports::themis::mesh::types::Error;

/// The component.
pub struct Component;

export!(Component);

fn mesh(name: &str) -> Result<MeshName, Error> {
    MeshName::new(name).map_err(|e| Error::InvalidMeshName(e.to_string()))
}

fn peer_id(bytes: &[u8]) -> Result<PeerId, Error> {
    <[u8; 32]>::try_from(bytes)
        .map(PeerId)
        .map_err(|_| Error::InvalidId(format!("an id is 32 bytes, not {}", bytes.len())))
}

/// The WASI wall clock, Unix milliseconds (message 1's timestamp and its check).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn handshake_error(e: impl ToString) -> Error {
    Error::Handshake(e.to_string())
}

/// An identity.
pub struct Identity(CoreIdentity);

impl GuestIdentity for Identity {
    fn generate(mesh_name: String) -> Result<IdentityHandle, Error> {
        let identity = CoreIdentity::generate(mesh(&mesh_name)?, &SystemRandom::new())
            .map_err(|e| Error::InvalidKeyFile(e.to_string()))?;
        Ok(IdentityHandle::new(Identity(identity)))
    }

    fn from_key_file(mesh_name: String, pem: String) -> Result<IdentityHandle, Error> {
        let identity = CoreIdentity::from_key_file(mesh(&mesh_name)?, &pem)
            .map_err(|e| Error::InvalidKeyFile(e.to_string()))?;
        Ok(IdentityHandle::new(Identity(identity)))
    }

    fn to_key_file(&self) -> String {
        self.0.to_key_file().as_str().to_owned()
    }

    fn id(&self) -> Vec<u8> {
        self.0.id().0.to_vec()
    }

    fn printable_id(&self) -> String {
        self.0.printable_id()
    }

    fn public_key(&self) -> Vec<u8> {
        self.0.public_key().to_vec()
    }

    fn mesh(&self) -> String {
        self.0.mesh().as_str().to_owned()
    }
}

impl identities::Guest for Component {
    type Identity = Identity;

    fn parse_id(printable: String) -> Result<(String, Vec<u8>), Error> {
        let (mesh, id) = PeerId::parse(&printable).map_err(|e| Error::InvalidId(e.to_string()))?;
        Ok((mesh.as_str().to_owned(), id.0.to_vec()))
    }

    fn format_id(id: Vec<u8>, mesh_name: String) -> Result<String, Error> {
        Ok(peer_id(&id)?.printable(&mesh(&mesh_name)?))
    }

    fn key_matches_id(public_key: Vec<u8>, printable: String) -> Result<bool, Error> {
        let (mesh, id) = PeerId::parse(&printable).map_err(|e| Error::InvalidId(e.to_string()))?;
        let key = <[u8; 32]>::try_from(public_key.as_slice()).map_err(|_| {
            Error::InvalidKeyFile(format!(
                "a public key is 32 bytes, not {}",
                public_key.len()
            ))
        })?;
        Ok(PeerId::derive(&key, mesh.as_str()) == id)
    }
}

/// A secure channel session.
pub struct Session(RefCell<CoreSession>);

impl GuestSession for Session {
    fn peer_id(&self) -> Vec<u8> {
        self.0.borrow().info().peer_id.0.to_vec()
    }

    fn peer_printable_id(&self) -> String {
        let session = self.0.borrow();
        let info = session.info();
        info.peer_id.printable(&info.mesh)
    }

    fn seal(&self, payload: Vec<u8>, reply_to: Option<u64>) -> Result<(u64, Vec<u8>), Error> {
        self.0
            .borrow_mut()
            .seal(&payload, reply_to)
            .map_err(|e| Error::Channel(e.to_string()))
    }

    fn open(&self, mut record: Vec<u8>) -> Result<Opened, Error> {
        let mut session = self.0.borrow_mut();
        let opened = session
            .open_in_place(&mut record)
            .map_err(|e| Error::Channel(e.to_string()))?;
        Ok(Opened {
            seq: opened.seq,
            reply_to: opened.reply_to,
            payload: opened.payload.to_vec(),
        })
    }
}

impl channel::Guest for Component {
    type Session = Session;

    fn frame_length(buffer: Vec<u8>) -> Result<Option<u32>, Error> {
        match wire::frame_len(&buffer) {
            Ok(len) => Ok(len.and_then(|n| u32::try_from(n).ok())),
            Err(e) => Err(Error::Channel(e.to_string())),
        }
    }
}

fn session(session: CoreSession) -> SessionHandle {
    SessionHandle::new(Session(RefCell::new(session)))
}

/// An initiator waiting for the reply.
pub struct Initiator(RefCell<Option<AwaitingHelloReply>>);

impl GuestInitiator for Initiator {
    fn start(
        me: identities::IdentityBorrow<'_>,
        peer: Vec<u8>,
    ) -> Result<(InitiatorHandle, Vec<u8>), Error> {
        let me: &Identity = me.get();
        let (waiting, hello) = CoreInitiator::start(
            &me.0,
            peer_id(&peer)?,
            &HandshakeConfig::default(),
            now_ms(),
            &SystemRandom::new(),
        )
        .map_err(handshake_error)?;
        Ok((
            InitiatorHandle::new(Initiator(RefCell::new(Some(waiting)))),
            hello,
        ))
    }

    fn finish(this: InitiatorHandle, reply: Vec<u8>) -> Result<(SessionHandle, Vec<u8>), Error> {
        let waiting = this
            .get::<Initiator>()
            .0
            .borrow_mut()
            .take()
            .ok_or(Error::UsedUp)?;
        let (s, confirm) = waiting.read_hello_reply(&reply).map_err(handshake_error)?;
        Ok((session(s), confirm))
    }
}

/// A responder waiting for the key confirmation.
pub struct Responder(RefCell<Option<AwaitingConfirm>>);

impl GuestResponder for Responder {
    fn respond(
        me: identities::IdentityBorrow<'_>,
        hello: Vec<u8>,
    ) -> Result<(ResponderHandle, Vec<u8>), Error> {
        let me: &Identity = me.get();
        let (pending, reply) = handshake::respond(
            &me.0,
            &hello,
            &HandshakeConfig::default(),
            // The freshness window; a replay cache needs a guard kept across calls,
            // which this per-handshake interface has no place for (a replay still
            // fails at message 3).
            &mut HelloGuard::default(),
            now_ms(),
            &SystemRandom::new(),
        )
        .map_err(handshake_error)?;
        Ok((
            ResponderHandle::new(Responder(RefCell::new(Some(pending)))),
            reply,
        ))
    }

    fn finish(this: ResponderHandle, confirm: Vec<u8>) -> Result<SessionHandle, Error> {
        let pending = this
            .get::<Responder>()
            .0
            .borrow_mut()
            .take()
            .ok_or(Error::UsedUp)?;
        pending
            .read_confirm(&confirm)
            .map(session)
            .map_err(handshake_error)
    }
}

impl key_agreement::Guest for Component {
    type Initiator = Initiator;
    type Responder = Responder;
}

impl exports::wasi::cli::run::Guest for Component {
    fn run() -> Result<(), ()> {
        crate::tool::main()
    }
}
