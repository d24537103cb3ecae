//! Hollow agents (kubemark's hollow nodes, for ipsetmgr): many agents in one
//! process, each the real agent code (its own watches, store, compile,
//! node-state writer and driver thread), with the in-memory kernel model as
//! its kernel, against any API server. `ipsetmgr hollow --nodes N` creates
//! a Node object for each (labels varied, so that selectors matter) and runs
//! them until SIGTERM; `scripts/scale.py` drives it and measures what a
//! change costs the control plane at N nodes (docs/scaling.md).

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::args::HollowConfig;
use ipsetmgr_agent::api_side::ApiSide;
use ipsetmgr_agent::event_loop::Settings;
use ipsetmgr_agent::{metrics, node_state, worker};
use ipsetmgr_cluster::client::{make_client, shutdown_signal};
use ipsetmgr_dataplane::model::ModelDataplane;
use ipsetmgr_ipset::Naming;
use ipsetmgr_node::KernelSide;
use ipsetmgr_sets::ReconcilerConfig;
use ipsetmgr_sets::driver::DriverConfig;

/// The labels of hollow Node `i`: every one has `ipsetmgr.io/hollow=true`;
/// half are `role=edge`, a quarter in each of four zones.
fn labels(i: usize) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("ipsetmgr.io/hollow", "true".to_string()),
        (
            "ipsetmgr-hollow/role",
            if i.is_multiple_of(2) { "edge" } else { "core" }.to_string(),
        ),
        ("topology.kubernetes.io/zone", format!("zone-{}", i % 4)),
    ])
}

/// Create (or update) the Node objects, a few at a time.
async fn apply_nodes(client: &kube::Client, names: &[String]) -> anyhow::Result<()> {
    use futures::StreamExt;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply("ipsetmgr-hollow").force();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let (nodes, pp) = (nodes.clone(), pp.clone());
            async move {
                let body = json!({"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": name, "labels": labels(i)}});
                nodes
                    .patch(name, &pp, &Patch::Apply(&body))
                    .await
                    .with_context(|| format!("applying Node {name}"))?;
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Run the hollow agents until SIGTERM or SIGINT.
pub async fn run_hollow(config: HollowConfig, naming: Naming) -> anyhow::Result<()> {
    let client = make_client(config.kubeconfig.as_deref()).await?;
    let names: Vec<String> = (0..config.nodes)
        .map(|i| format!("{}-{i}", config.name_prefix))
        .collect();
    apply_nodes(&client, &names).await?;
    tracing::info!(
        nodes = names.len(),
        "hollow Nodes applied; starting their agents"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::with_capacity(names.len());
    for name in &names {
        let shared = metrics::Shared::new(config.resync_interval);
        let (reports_tx, reports) = tokio::sync::mpsc::unbounded_channel();
        let observer = worker::Forward::new(shared.clone(), reports_tx);
        let kernel_naming = naming.clone();
        let kernel = tokio::task::block_in_place(|| {
            KernelSide::start_with(
                None,
                DriverConfig::new(config.resync_interval),
                Box::new(observer),
                move || {
                    let config = ReconcilerConfig {
                        naming: kernel_naming,
                        ..ReconcilerConfig::default()
                    };
                    Ok((
                        None,
                        ipsetmgr_dataplane::adapter::reconciler(ModelDataplane::new(), config),
                    ))
                },
            )
        })?;
        let mut settings = Settings::new(naming.clone(), config.heartbeat_interval);
        settings.limits = config.limits.into();
        let agent = ApiSide::start(
            &client,
            name,
            node_state::Pacing::from(config.node_state),
            settings,
            Box::new(kernel),
            reports,
            shared,
        );
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(agent.run(async move {
            let _ = stop.changed().await;
        })));
    }
    tracing::info!(agents = tasks.len(), "hollow agents running");
    shutdown_signal().await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    tracing::info!("hollow agents stopped");
    Ok(())
}
