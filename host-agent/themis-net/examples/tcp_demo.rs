//! Two Themis identities over a real TCP socket, through `themis-net`.
//!
//! ```text
//! tcp_demo keygen <mesh> <key-file>                 create an identity, print its id
//! tcp_demo serve  <mesh> <key-file> <addr>          answer sealed requests (the paper's `check`)
//! tcp_demo call   <mesh> <key-file> <addr> <peer-id> <message>...
//!                                                   handshake with <peer-id>, send each message
//! ```
//! The README shows them with two agents; the demo (`scripts/demo.sh`) now goes through Envoy.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::process::ExitCode;
use std::sync::Arc;

use bytes::BytesMut;
use ring::rand::SystemRandom;
use themis_core::{Identity, MeshName, PeerId, SessionInfo};
use themis_net::{connect, serve, Config, NetError, NetStats};
use tokio::net::TcpListener;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["keygen", mesh, key] => keygen(mesh, key),
        ["serve", mesh, key, addr] => serve_check(mesh, key, addr).await,
        ["call", mesh, key, addr, peer, messages @ ..] if !messages.is_empty() => {
            call(mesh, key, addr, peer, messages).await
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

async fn serve_check(mesh: &str, key: &str, addr: &str) -> Result<(), Error> {
    let me = Arc::new(load(mesh, key)?);
    let listener = TcpListener::bind(addr).await?;
    println!(
        "[check] {} listening on {}",
        me.printable_id(),
        listener.local_addr()?
    );
    let handler = Arc::new(|peer: Arc<SessionInfo>, request: BytesMut| async move {
        let peer = peer.peer_id.printable(&peer.mesh);
        let request = String::from_utf8_lossy(&request).into_owned();
        println!("[check] authenticated {peer} asks: {request:?}");
        format!(
            "check says: {request:?} is {} bytes, received from {}",
            request.len(),
            &peer[..16]
        )
        .into_bytes()
    });
    let stats = Arc::new(NetStats::default());
    serve(listener, me, Config::default(), handler, stats).await?;
    Ok(())
}

async fn call(
    mesh: &str,
    key: &str,
    addr: &str,
    peer: &str,
    messages: &[&str],
) -> Result<(), Error> {
    let me = load(mesh, key)?;
    let peer_id = PeerId::parse_in(peer, me.mesh())?;
    let addr = addr.parse()?;
    let mut stream = connect(&me, addr, peer_id, &Config::default())
        .await
        .map_err(|e| match e {
            NetError::Closed => {
                format!("{addr} ended the handshake without answering: it is not {peer}, or it refused us")
            }
            e => e.to_string(),
        })?;
    let info = stream.info();
    println!(
        "[handler] {} authenticated {} ({:?}, session {:016x})",
        &me.printable_id()[..16],
        info.peer_id.printable(&info.mesh),
        info.suite,
        info.session_id,
    );
    for message in messages {
        // `request` checks that the response's sealed reply_to names this request.
        let response = stream.request(message.as_bytes()).await?;
        println!(
            "[handler] {message:?} -> {}",
            String::from_utf8_lossy(&response)
        );
    }
    Ok(())
}
