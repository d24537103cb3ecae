//! Choosing and opening a backend (`--backend netlink|cli`).

use super::Dataplane;
use super::cli::CliDataplane;

/// The backends a user can choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Native netlink (no `ipset` binary needed); falls back to cli when the
    /// kernel's ipset netlink protocol is unavailable.
    Netlink,
    /// The `ipset` binary (`ipset restore` batches, `ipset list` reads).
    Cli,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("the ipset binary is needed for the cli backend but was not found: {0}")]
    NoBinary(String),
}

/// Open the chosen backend.
pub fn open(choice: Backend) -> Result<Box<dyn Dataplane>, OpenError> {
    match choice {
        Backend::Netlink => {
            eprintln!(
                "note: the netlink backend is not part of this build yet; using the ipset binary"
            );
            open_cli()
        }
        Backend::Cli => open_cli(),
    }
}

fn open_cli() -> Result<Box<dyn Dataplane>, OpenError> {
    let cli = CliDataplane::new();
    match std::process::Command::new(cli.binary())
        .arg("--version")
        .output()
    {
        Ok(_) => Ok(Box::new(cli)),
        Err(e) => Err(OpenError::NoBinary(e.to_string())),
    }
}
