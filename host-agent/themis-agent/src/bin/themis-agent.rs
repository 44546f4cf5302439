//! `themis-agent`: the host agent daemon alone (the same as `themis agent`).

use clap::Parser;
use themis_agent::config::AgentArgs;

/// The Themis host agent: keeps this node in the ring, registers its workloads and
/// resolves services. Stops gracefully (leaving the ring) on SIGTERM or SIGINT.
#[derive(Parser)]
#[command(version, args_override_self = true)]
struct Cli {
    #[command(flatten)]
    agent: AgentArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    themis_agent::agent::main(&cli.agent)
}
