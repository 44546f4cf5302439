//! `themis log ...`: the trust log for operators and auditors, and `revoke --publish`.

use std::path::Path;
use std::process::ExitCode;

use serde::Deserialize;
use themis_agent::trust::load_root;
use themis_agent::trust_log::status_of;
use themis_agent_client::ApiClient;
use themis_agent_client::{Method, StatusCode};
use themis_cli::operator::{MeshDir, OperatorError};
use themis_contracts::{api as contract, paths};
use themis_log::{Entry, Kind, Log};
use themis_trust::{PemKind, Signed};

use super::{ago, LogCommand};

/// Runs one `themis log` command; `socket` is the local agent's.
pub fn command(command: LogCommand, socket: &str, json: bool) -> ExitCode {
    let result = match command {
        LogCommand::Show { subject, mesh_dir } => {
            show(subject.as_deref(), mesh_dir.as_deref(), socket, json)
        }
        LogCommand::Status => status(socket, json),
        LogCommand::Verify { file, mesh_root } => verify(&file, &mesh_root, json),
        LogCommand::Publish { mesh_dir } => publish(&mesh_dir, socket, json),
        LogCommand::Import { mesh_dir, files } => import(&mesh_dir, &files, json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("starting the tokio runtime")
}

/// `GET path` on the local agent, as `T`.
fn get<T: for<'de> Deserialize<'de>>(socket: &str, path: &str) -> Result<T, String> {
    let (status, answer) = runtime()
        .block_on(ApiClient::new(socket).get(path))
        .map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("the agent answered {status}: {answer}"));
    }
    serde_json::from_value(answer).map_err(|e| format!("the agent's answer does not parse: {e}"))
}

fn show(
    subject: Option<&str>,
    mesh_dir: Option<&Path>,
    socket: &str,
    json: bool,
) -> Result<(), String> {
    let mut status = match mesh_dir {
        Some(dir) => {
            let mesh = MeshDir::open(dir).map_err(|e| e.to_string())?;
            status_of(&mesh.log().map_err(|e| e.to_string())?, Vec::new())
        }
        None => get::<contract::LogStatus>(socket, paths::LOG)?,
    };
    if let Some(subject) = subject {
        status
            .leaves
            .retain(|l| l.subject == subject || l.service.as_deref() == Some(subject));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&status).expect("JSON"));
        return Ok(());
    }
    print!("{}", render_header(&status));
    match subject {
        Some(subject) if status.leaves.is_empty() => println!("nothing in the log about {subject}"),
        Some(subject) => println!("{} leaf(s) about {subject}:", status.leaves.len()),
        None => {}
    }
    for leaf in &status.leaves {
        let what = match leaf.kind.as_str() {
            "grant" => format!(
                "{}{}",
                leaf.service.as_deref().unwrap_or("?"),
                if leaf.delegate == Some(true) {
                    " (may pass it on)"
                } else {
                    ""
                }
            ),
            "revocation" => format!("reason: {}", leaf.reason.as_deref().unwrap_or("")),
            "address-range" => format!("addresses {}", leaf.range.as_deref().unwrap_or("?")),
            _ => String::new(),
        };
        println!(
            "  #{:<5} {:<10} {}  {}  signed {}",
            leaf.index,
            leaf.kind,
            leaf.subject,
            what,
            ago(Some(leaf.issued_at))
        );
    }
    Ok(())
}

fn render_header(status: &contract::LogStatus) -> String {
    let mut out = format!(
        "trust log: {} leaves, root hash {}, checkpoint signed {}\n",
        status.size,
        status.root_hash,
        ago(status.issued_at)
    );
    if status.checkpoint.is_none() {
        out += "  (no checkpoint yet: this node has not received the log)\n";
    }
    for fork in &status.forks {
        out += &format!("  FORK: {fork} (the mesh root signed two histories; evidence in the agent's log-forks/)\n");
    }
    out
}

fn status(socket: &str, json: bool) -> Result<(), String> {
    let mut status = get::<contract::LogStatus>(socket, paths::LOG)?;
    status.leaves.clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&status).expect("JSON"));
    } else {
        print!("{}", render_header(&status));
    }
    if status.forks.is_empty() {
        Ok(())
    } else {
        Err(format!("{} fork(s) seen", status.forks.len()))
    }
}

fn verify(file: &Path, mesh_root: &str, json: bool) -> Result<(), String> {
    let root = load_root(mesh_root).map_err(|e| e.to_string())?;
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let log = Log::from_copy(root, &bytes)
        .map_err(|e| format!("{}: the log does not verify: {e}", file.display()))?;
    let count = |kind: Kind| log.statements().filter(|(_, s)| s.kind() == kind).count();
    let (admissions, grants, revocations, ranges, bindings) = (
        count(Kind::Admission),
        count(Kind::Grant),
        count(Kind::Revocation),
        count(Kind::AddressRange),
        count(Kind::Binding),
    );
    let root_hash = hex::encode(log.root_hash());
    let issued_at = log.checkpoint().map(|c| c.checkpoint.issued_at);
    if json {
        let answer = serde_json::json!({
            "verified": true, "size": log.size(), "root_hash": root_hash,
            "issued_at": issued_at, "admissions": admissions, "grants": grants,
            "revocations": revocations, "address_ranges": ranges,
            "bindings": bindings,
        });
        println!("{}", serde_json::to_string_pretty(&answer).expect("JSON"));
    } else {
        println!(
            "verified: {} leaves from the first, every one signed by the mesh root and hashing to the checkpoint signed {}",
            log.size(),
            ago(issued_at)
        );
        println!("  root hash      {root_hash}");
        println!(
            "  admissions     {admissions}\n  grants         {grants}\n  revocations    {revocations}\n  address ranges {ranges}\n  bindings       {bindings}"
        );
    }
    Ok(())
}

fn publish(mesh_dir: &Path, socket: &str, json: bool) -> Result<(), String> {
    let mesh = MeshDir::open(mesh_dir).map_err(|e| e.to_string())?;
    let log = mesh.log().map_err(|e| e.to_string())?;
    let copy = log
        .to_copy()
        .ok_or("the mesh directory's log has no checkpoint")?;
    let answer = runtime().block_on(ApiClient::new(socket).call_raw(
        Method::POST,
        paths::LOG,
        &copy,
        "application/octet-stream",
    ));
    let (status, body) = answer.map_err(|e| {
        format!("{e}: the log was NOT published (no agent took it); it is kept in {} and `themis log publish` retries", mesh_dir.display())
    })?;
    if status != StatusCode::OK {
        let error = serde_json::from_slice::<contract::ErrorBody>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
        return Err(format!("the agent refused the log ({status}): {error}"));
    }
    let published: contract::LogPublished = serde_json::from_slice(&body)
        .map_err(|e| format!("the agent's answer does not parse: {e}"))?;
    if !published.took || published.size < log.size() {
        return Err(format!(
            "the agent holds {} leaves, not the {} published",
            published.size,
            log.size()
        ));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&published).expect("JSON")
        );
    } else {
        println!(
            "published: the local agent holds the log's {} leaves ({} new); its peers take them within their log sync",
            published.size, published.added
        );
    }
    Ok(())
}

fn import(mesh_dir: &Path, files: &[std::path::PathBuf], json: bool) -> Result<(), String> {
    let mesh = MeshDir::open(mesh_dir).map_err(|e| e.to_string())?;
    let mut log = mesh.log().map_err(|e| e.to_string())?;
    let known: std::collections::BTreeSet<Vec<u8>> =
        log.leaves(0, usize::MAX).iter().cloned().collect();
    let (mut added, mut skipped) = (0u64, 0u64);
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        for (kind, signed) in statements_in(&text) {
            if signed.signer != mesh.root.key {
                // An authority's grant: a chain's later link, not a root decision.
                skipped += 1;
                continue;
            }
            let leaf = Entry::new(kind, signed).encode();
            if known.contains(&leaf) {
                skipped += 1;
                continue;
            }
            log.append(leaf)
                .map_err(|e| format!("{}: {e}", file.display()))?;
            added += 1;
        }
    }
    if added > 0 {
        log.sign_checkpoint(&mesh.key, themis_agent::trust::unix_millis());
        mesh.save_log(&log)
            .map_err(|e: OperatorError| e.to_string())?;
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"added": added, "skipped": skipped, "size": log.size()})
        );
    } else {
        println!("imported {added} statement(s) ({skipped} skipped: logged already or not the root's); the log holds {} leaves", log.size());
    }
    Ok(())
}

/// The statements in PEM text (admissions, grant chains, revocations), as the log
/// holds them.
fn statements_in(text: &str) -> Vec<(Kind, Signed)> {
    themis_trust::pem_blocks(text)
        .into_iter()
        .flatten()
        .map(|(kind, signed)| {
            let kind = match kind {
                PemKind::Admission => Kind::Admission,
                PemKind::Grant => Kind::Grant,
                PemKind::Revocation => Kind::Revocation,
                PemKind::AddressRange => Kind::AddressRange,
            };
            (kind, signed)
        })
        .collect()
}
