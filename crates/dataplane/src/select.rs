//! Choosing and opening a backend (`--backend netlink|cli`).

use crate::Dataplane;
use crate::cli::CliDataplane;
use crate::netlink::NetlinkDataplane;

/// The backends a user can choose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Native netlink (no `ipset` binary needed); falls back to cli, saying
    /// why, when the kernel's ipset netlink protocol is unavailable.
    Netlink,
    /// The `ipset` binary (`ipset restore` batches, `ipset list` reads).
    Cli,
}

/// A `--backend` word that names no backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {0:?}: use netlink or cli")]
pub struct UnknownBackend(pub String);

impl std::str::FromStr for Backend {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Backend, UnknownBackend> {
        match s {
            "netlink" => Ok(Backend::Netlink),
            "cli" => Ok(Backend::Cli),
            other => Err(UnknownBackend(other.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("the ipset binary is needed for the cli backend but could not be run: {0}")]
    NoBinary(String),
    #[error("netlink backend unavailable ({netlink}) and the cli fallback failed too: {cli}")]
    NoBackend { netlink: String, cli: String },
}

/// Open the chosen backend.
pub fn open(choice: Backend) -> Result<Box<dyn Dataplane>, OpenError> {
    match choice {
        Backend::Cli => open_cli(),
        Backend::Netlink => match NetlinkDataplane::new() {
            Ok(nl) => Ok(Box::new(nl)),
            Err(e) => {
                eprintln!(
                    "netlink backend unavailable ({e}); falling back to the ipset binary (cli backend)"
                );
                tracing::warn!(error = %e, "netlink backend unavailable; using the cli backend");
                open_cli().map_err(|cli| OpenError::NoBackend {
                    netlink: e.to_string(),
                    cli: cli.to_string(),
                })
            }
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_backend_word_names_the_choices() {
        assert_eq!("cli".parse::<Backend>(), Ok(Backend::Cli));
        let e = "nft".parse::<Backend>().unwrap_err();
        assert_eq!(e, UnknownBackend("nft".into()));
        assert_eq!(e.to_string(), "unknown backend \"nft\": use netlink or cli");
    }
}
