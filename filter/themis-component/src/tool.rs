//! The component as a tool for people, run by `wasmtime run` through `wasi:cli/run`:
//! create and show identities, and check that a key is the key of an id.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use ring::rand::SystemRandom;
use themis_core::{Identity, MeshName, PeerId};

/// Themis identities, from the portable component (`wasmtime run themis_component.wasm …`).
///
/// Files are reached through the directories `wasmtime run --dir` grants.
#[derive(Parser)]
#[command(name = "themis_component.wasm", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Identity key files.
    #[command(subcommand)]
    Id(IdCommand),
}

#[derive(Subcommand)]
enum IdCommand {
    /// Create a new identity and print its key file (PEM PKCS#8) on stdout: redirect
    /// it under `umask 077`, since WASI cannot set file permissions. Its id goes to
    /// stderr.
    New {
        /// The mesh the identity belongs to.
        #[arg(long)]
        mesh: String,
    },
    /// Show the id and public key of a key file.
    Show {
        /// The key file.
        key: PathBuf,
        /// The mesh.
        #[arg(long)]
        mesh: String,
    },
    /// Check that a key file is the key of a printable id (exit 1 if not).
    Check {
        /// The printable id (its mesh is part of it).
        id: String,
        /// The key file.
        #[arg(long)]
        key: PathBuf,
    },
}

/// Runs the tool; `Err` makes the process exit 1 (clap exits 2 on bad usage itself).
pub fn main() -> Result<(), ()> {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => Ok(()),
        Err(message) => {
            eprintln!("error: {message}");
            Err(())
        }
    }
}

fn mesh(name: &str) -> Result<MeshName, String> {
    MeshName::new(name).map_err(|e| format!("mesh {name:?}: {e}"))
}

fn load(key: &PathBuf, mesh: MeshName) -> Result<Identity, String> {
    let pem = std::fs::read_to_string(key).map_err(|e| format!("{}: {e}", key.display()))?;
    Identity::from_key_file(mesh, &pem).map_err(|e| format!("{}: {e}", key.display()))
}

fn run(command: Command) -> Result<(), String> {
    let Command::Id(command) = command;
    match command {
        IdCommand::New { mesh: name } => {
            let identity = Identity::generate(mesh(&name)?, &SystemRandom::new())
                .map_err(|e| e.to_string())?;
            print!("{}", identity.to_key_file().as_str());
            eprintln!("{}", identity.printable_id());
        }
        IdCommand::Show { key, mesh: name } => {
            let identity = load(&key, mesh(&name)?)?;
            println!("id          {}", identity.printable_id());
            println!("mesh        {}", identity.mesh());
            println!("public key  {}", hex(identity.public_key()));
        }
        IdCommand::Check { id, key } => {
            let (mesh, expected) = PeerId::parse(&id).map_err(|e| e.to_string())?;
            let identity = load(&key, mesh)?;
            if identity.id() != expected {
                return Err(format!(
                    "{} is the key of {}, not of {id}",
                    key.display(),
                    identity.printable_id()
                ));
            }
            println!("ok: the key matches {id}");
        }
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
