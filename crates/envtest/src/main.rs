//! `ipsetmgr-envtest`: start a test control plane and keep it until SIGTERM
//! or Ctrl-C, for scripts (scripts/scale.py) and for poking around by hand:
//!
//! ```sh
//! cargo run -p ipsetmgr-envtest -- --kubeconfig /tmp/kc &
//! kubectl --kubeconfig /tmp/kc get --raw /version
//! ```

#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser;
use ipsetmgr_envtest::{ControlPlane, Server};

#[derive(Parser)]
#[command(about = "Run etcd and a kube-apiserver on loopback until SIGTERM")]
struct Args {
    /// Start the oldest supported API server instead of the newest.
    #[arg(long)]
    oldest: bool,
    /// Copy the admin kubeconfig here once the server is ready.
    #[arg(long)]
    kubeconfig: PathBuf,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let server = if args.oldest {
        Server::Oldest
    } else {
        Server::Newest
    };
    let plane = ControlPlane::start(server).await?;
    std::fs::copy(plane.kubeconfig(), &args.kubeconfig)?;
    let (etcd, apiserver) = plane.pids();
    println!(
        "ready: {} at {} (kube-apiserver pid {}, etcd pid {}), kubeconfig {}",
        plane.version(),
        plane.url(),
        apiserver.unwrap_or(0),
        etcd.unwrap_or(0),
        args.kubeconfig.display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    plane.stop();
    Ok(())
}
