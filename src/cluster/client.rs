//! The API client: from `--kubeconfig`, or in-cluster configuration.

use std::path::Path;

use anyhow::Context;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub async fn make_client(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .context("loading kubeconfig")?;
            Ok(Client::try_from(cfg)?)
        }
        None => Ok(Client::try_default()
            .await
            .context("no in-cluster config or kubeconfig")?),
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
}
