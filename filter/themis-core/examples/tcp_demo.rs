//! Two Themis identities over a real TCP socket: the smallest complete driver of the
//! sans-IO core (the host agent and the Envoy filter are larger ones).
//!
//! ```text
//! tcp_demo keygen <mesh> <key-file>                 create an identity, print its id
//! tcp_demo serve  <mesh> <key-file> <addr>          answer sealed requests (the paper's `check`)
//! tcp_demo call   <mesh> <key-file> <addr> <peer-id> <message>...
//!                                                   handshake with <peer-id>, send each message
//! ```
//! `scripts/demo.sh` runs them; see the README.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::OpenOptionsExt;
use std::process::ExitCode;

use ring::rand::SystemRandom;
use themis_core::handshake::{self, Initiator};
use themis_core::wire::{self, RECORD_HEADER_LEN, RECORD_OVERHEAD};
use themis_core::{HandshakeConfig, Identity, MeshName, PeerId, Session};

type Error = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["keygen", mesh, key] => keygen(mesh, key),
        ["serve", mesh, key, addr] => serve(mesh, key, addr),
        ["call", mesh, key, addr, peer, messages @ ..] if !messages.is_empty() => {
            call(mesh, key, addr, peer, messages)
        }
        _ => {
            eprintln!("usage: tcp_demo keygen|serve|call … (see the top of examples/tcp_demo.rs)");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load(mesh: &str, key: &str) -> Result<Identity, Error> {
    let pem = std::fs::read_to_string(key).map_err(|e| format!("reading {key}: {e}"))?;
    Ok(Identity::from_key_file(MeshName::new(mesh)?, &pem)?)
}

fn keygen(mesh: &str, key: &str) -> Result<(), Error> {
    let identity = Identity::generate(MeshName::new(mesh)?, &SystemRandom::new())?;
    // Private keys are created readable by their owner only.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(key)
        .and_then(|mut f| f.write_all(identity.to_key_file().as_bytes()))
        .map_err(|e| format!("writing {key}: {e}"))?;
    println!("{}", identity.printable_id());
    Ok(())
}

/// Reads one whole message from a stream, using the wire's own framing.
fn read_message(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, Error> {
    loop {
        if let Some(len) = wire::frame_len(buf)? {
            if buf.len() >= len {
                return Ok(Some(buf.drain(..len).collect()));
            }
        }
        let mut chunk = [0u8; 16 * 1024];
        match stream.read(&mut chunk)? {
            0 if buf.is_empty() => return Ok(None),
            0 => return Err("connection closed in the middle of a message".into()),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn serve(mesh: &str, key: &str, addr: &str) -> Result<(), Error> {
    let me = load(mesh, key)?;
    let listener = TcpListener::bind(addr)?;
    println!(
        "[check] {} listening on {}",
        me.printable_id(),
        listener.local_addr()?
    );
    let rng = SystemRandom::new();
    for stream in listener.incoming() {
        let mut stream = stream?;
        // One bad client must not stop the server.
        if let Err(e) = serve_one(&me, &rng, &mut stream) {
            println!("[check] rejected a connection: {e}");
        }
    }
    Ok(())
}

fn serve_one(me: &Identity, rng: &SystemRandom, stream: &mut TcpStream) -> Result<(), Error> {
    let mut buf = Vec::new();
    let hello = read_message(stream, &mut buf)?.ok_or("closed before the handshake")?;
    let (pending, reply) = handshake::respond(me, &hello, &HandshakeConfig::default(), rng)?;
    stream.write_all(&reply)?;
    let confirm = read_message(stream, &mut buf)?.ok_or("closed before the key confirmation")?;
    let mut session = pending.read_confirm(&confirm)?;
    let peer = session.info().peer_id.printable(&session.info().mesh);
    println!("[check] authenticated {peer} ({:?})", session.info().suite);
    while let Some(mut record) = read_message(stream, &mut buf)? {
        let opened = session.open_in_place(&mut record)?;
        let request = String::from_utf8_lossy(opened.payload).into_owned();
        let answer = format!(
            "check says: {:?} is {} bytes, received from {}",
            request,
            request.len(),
            &peer[..16]
        );
        println!(
            "[check] request {} from {}…: {:?}",
            opened.seq,
            &peer[..16],
            request
        );
        let (_, response) = session.seal(answer.as_bytes(), Some(opened.seq))?;
        stream.write_all(&response)?;
    }
    Ok(())
}

fn call(mesh: &str, key: &str, addr: &str, peer: &str, messages: &[&str]) -> Result<(), Error> {
    let me = load(mesh, key)?;
    let peer_id = PeerId::parse_in(peer, me.mesh())?;
    let mut stream = TcpStream::connect(addr)?;
    let mut buf = Vec::new();
    let (waiting, hello) = Initiator::start(
        &me,
        peer_id,
        &HandshakeConfig::default(),
        &SystemRandom::new(),
    )?;
    stream.write_all(&hello)?;
    let reply = read_message(&mut stream, &mut buf)?.ok_or_else(|| {
        format!("{addr} ended the handshake without answering: it is not {peer}, or it refused us")
    })?;
    let (mut session, confirm) = waiting.read_hello_reply(&reply)?;
    stream.write_all(&confirm)?;
    println!(
        "[handler] {} authenticated {} ({:?}, session {:016x}; handshake {} + {} + {} bytes)",
        &me.printable_id()[..16],
        peer,
        session.info().suite,
        session.info().session_id,
        hello.len(),
        reply.len(),
        confirm.len()
    );
    for message in messages {
        let request = seal_in_place(&mut session, message.as_bytes())?;
        stream.write_all(&request.record)?;
        println!(
            "[handler] sent request {} ({} bytes on the wire, starts {})",
            request.seq,
            request.record.len(),
            hex(&request.record[RECORD_HEADER_LEN..][..12.min(message.len())])
        );
        let mut response =
            read_message(&mut stream, &mut buf)?.ok_or("closed before the response")?;
        let opened = session.open_in_place(&mut response)?;
        opened.expect_reply_to(request.seq)?;
        println!(
            "[handler] response to {}: {}",
            request.seq,
            String::from_utf8_lossy(opened.payload)
        );
    }
    Ok(())
}

struct Sealed {
    seq: u64,
    record: Vec<u8>,
}

/// Seals through the allocation-free path, as a proxy would with its own buffers.
fn seal_in_place(session: &mut Session, payload: &[u8]) -> Result<Sealed, Error> {
    let mut record = vec![0u8; payload.len() + RECORD_OVERHEAD];
    record[RECORD_HEADER_LEN..][..payload.len()].copy_from_slice(payload);
    let seq = session.seal_in_place(&mut record, None)?;
    Ok(Sealed { seq, record })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
