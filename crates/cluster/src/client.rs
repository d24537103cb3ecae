//! The API client: from `--kubeconfig`, or in-cluster configuration.

use std::path::{Path, PathBuf};

use kube::Client;
use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Why there is no client. The messages leave the cause to the source
/// chain (the binary prints it with anyhow's `{:#}`).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("loading kubeconfig")]
    Load(#[source] KubeconfigError),
    #[error("no in-cluster config or kubeconfig")]
    Infer(#[source] InferConfigError),
    #[error(transparent)]
    Client(#[from] kube::Error),
}

pub async fn make_client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    Ok(Client::try_from(make_config(kubeconfig).await?)?)
}

/// The client's configuration: from `--kubeconfig`, or in-cluster (or
/// $KUBECONFIG).
pub async fn make_config(kubeconfig: Option<&Path>) -> Result<kube::Config, ClientError> {
    match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClientError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(ClientError::Load)
        }
        None => kube::Config::infer().await.map_err(ClientError::Infer),
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
