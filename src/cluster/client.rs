//! The API client: from `--kubeconfig`, or in-cluster configuration.

use std::path::Path;

use anyhow::Context;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub async fn make_client(kubeconfig: Option<&Path>) -> anyhow::Result<Client> {
    Ok(Client::try_from(make_config(kubeconfig).await?)?)
}

/// The client's configuration: from `--kubeconfig`, or in-cluster (or
/// $KUBECONFIG).
pub async fn make_config(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .context("loading kubeconfig")
        }
        None => kube::Config::infer()
            .await
            .context("no in-cluster config or kubeconfig"),
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
