//! Where the control plane's binaries are, by the envtest convention.
//!
//! - `KUBE_APISERVER`, `KUBE_APISERVER_OLDEST`, `ETCD`: paths of the binaries;
//! - otherwise `KUBEBUILDER_ASSETS`, a directory holding `kube-apiserver`,
//!   `kube-apiserver-oldest` and `etcd` (controller-runtime's convention,
//!   with one more file for the oldest supported version);
//! - otherwise `target/envtest/` of this workspace, which
//!   `scripts/envtest-assets.sh` fills (and `.ci/run` runs);
//! - etcd also from `PATH` (Debian's `etcd-server` installs `/usr/bin/etcd`).

use std::path::{Path, PathBuf};

/// Which of the two API servers the project supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Server {
    /// The newest supported Kubernetes: everything is tested on it.
    Newest,
    /// The oldest the chart claims (`kubeVersion`): install and schema.
    Oldest,
}

impl Server {
    pub fn name(self) -> &'static str {
        match self {
            Server::Newest => "newest",
            Server::Oldest => "oldest",
        }
    }

    fn env_var(self) -> &'static str {
        match self {
            Server::Newest => "KUBE_APISERVER",
            Server::Oldest => "KUBE_APISERVER_OLDEST",
        }
    }

    fn file_name(self) -> &'static str {
        match self {
            Server::Newest => "kube-apiserver",
            Server::Oldest => "kube-apiserver-oldest",
        }
    }
}

/// The two programs of one control plane.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub apiserver: PathBuf,
    pub etcd: PathBuf,
}

/// What could not be found, said so that the reader knows what to install.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what} not found (looked at {looked}); run scripts/envtest-assets.sh, or set \
     KUBEBUILDER_ASSETS to a directory with kube-apiserver, kube-apiserver-oldest and etcd"
)]
pub struct Missing {
    pub what: String,
    pub looked: String,
}

/// The default assets directory: `target/envtest` of this workspace.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/envtest")
}

fn assets_dir() -> PathBuf {
    std::env::var_os("KUBEBUILDER_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(default_dir)
}

/// An executable regular file (following symlinks).
fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| executable(p))
}

/// Find a tool: its own variable, then the assets directory, then `PATH`
/// when `path_ok`.
pub fn tool(var: &str, file: &str, path_ok: bool) -> Result<PathBuf, Missing> {
    let mut looked = Vec::new();
    if let Some(p) = std::env::var_os(var) {
        let p = PathBuf::from(p);
        if executable(&p) {
            return Ok(p);
        }
        looked.push(format!("{var}={}", p.display()));
    }
    let in_assets = assets_dir().join(file);
    if executable(&in_assets) {
        return Ok(in_assets);
    }
    looked.push(in_assets.display().to_string());
    if path_ok {
        if let Some(p) = on_path(file) {
            return Ok(p);
        }
        looked.push(format!("{file} on PATH"));
    }
    Err(Missing {
        what: file.to_string(),
        looked: looked.join(", "),
    })
}

impl Binaries {
    pub fn find(server: Server) -> Result<Binaries, Missing> {
        Ok(Binaries {
            apiserver: tool(server.env_var(), server.file_name(), false)?,
            etcd: tool("ETCD", "etcd", true)?,
        })
    }
}
