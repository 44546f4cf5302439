//! Attaches and detaches Themis's eBPF capture for the benchmarks in `benchmarks/ebpf/`
//! (`themis-capture` is a library). Capture lives on in bpffs after this exits;
//! `detach`, or removing the pin directory, ends it.
//!
//! Each command prints one JSON line: `attach` the workload's status, `detach` the
//! counters as they were just before detaching (`Capture::status`).

use std::{net::SocketAddrV4, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use themis_capture::{Capture, CaptureSpec};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Which capture: the pin directory (bpffs) and the workload's name under it.
#[derive(clap::Args)]
struct Target {
    #[arg(long)]
    pins: PathBuf,
    #[arg(long, default_value = "workload")]
    workload: String,
}

#[derive(Subcommand)]
enum Command {
    /// Attach capture to a cgroup.
    Attach {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        cgroup: PathBuf,
        #[arg(long)]
        proxy_cgroup: Option<PathBuf>,
        #[arg(long, default_value = "127.0.0.1:15001")]
        outbound: SocketAddrV4,
        /// Turn the sockops + sk_msg fast path on.
        #[arg(long)]
        fast_path: bool,
        /// Capture loopback destinations too (no default exclusions).
        #[arg(long)]
        no_exclude: bool,
    },
    /// Detach it, printing the counters first.
    Detach {
        #[command(flatten)]
        target: Target,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("capture_ctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Attach {
            target,
            cgroup,
            proxy_cgroup,
            outbound,
            fast_path,
            no_exclude,
        } => {
            let mut capture = Capture::start(&target.pins, fast_path).map_err(|e| e.to_string())?;
            let mut spec = CaptureSpec {
                proxy_cgroup,
                outbound,
                ..CaptureSpec::new(cgroup)
            };
            if no_exclude {
                spec.exclude_cidrs.clear();
            }
            let status = capture
                .attach(&target.workload, &spec)
                .map_err(|e| e.to_string())?;
            if !status.missing.is_empty() {
                return Err(format!("attached only partly: {status:?}"));
            }
            println!("{}", serde_json::to_string(&status).expect("serializable"));
        }
        Command::Detach { target } => {
            // Capture::start sets the fast-path setting; it is about to stop anyway.
            let mut capture = Capture::start(&target.pins, false).map_err(|e| e.to_string())?;
            let status = capture.status().map_err(|e| e.to_string())?;
            if !capture
                .detach(&target.workload)
                .map_err(|e| e.to_string())?
            {
                return Err(format!("workload {} was not attached", target.workload));
            }
            println!(
                "{}",
                serde_json::to_string(&status.counters).expect("serializable")
            );
        }
    }
    Ok(())
}
