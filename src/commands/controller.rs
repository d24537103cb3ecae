//! `ipsetmgr controller`: the controller's parts (`crate::controller`)
//! wired together with its Lease, writers, feeds, listeners and client.

use std::time::Duration;

use anyhow::Context;
use kube_lease_manager::LeaseManagerBuilder;

use crate::args::ControllerConfig;
use ipsetmgr_cluster::client::{make_config, shutdown_signal};
use ipsetmgr_controller::{event_loop, feeds, inputs, metrics, slice_writer, writer};
use ipsetmgr_ipset::Naming;

/// The Lease the replicas compete for.
pub const LEASE_NAME: &str = "ipsetmgr-controller";

/// Run the controller until SIGTERM/SIGINT.
pub async fn run_controller(config: ControllerConfig, naming: Naming) -> anyhow::Result<()> {
    let kube_config = make_config(config.kubeconfig.as_deref()).await?;
    let api_url = kube_config.cluster_url.clone();
    let client = kube::Client::try_from(kube_config)?;
    let identity = config
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("ipsetmgr-controller-{}", std::process::id()));
    tracing::info!(
        version = ipsetmgr_cluster::telemetry::build_info::VERSION,
        revision = ipsetmgr_cluster::telemetry::build_info::REVISION,
        %identity,
        namespace = %config.namespace,
        set_prefix = naming.prefix(),
        listen = %config.listen,
        health_listen = %config.health_listen,
        "controller starting"
    );
    let mut settings = event_loop::Settings::new(naming);
    settings.limits = config.limits.into();
    let shared = metrics::ControllerShared::new(settings.tick);

    let server = ipsetmgr_cluster::server::Server::start(
        config.health_listen,
        config.listen,
        shared.clone(),
    )
    .await?;

    let lease = LeaseManagerBuilder::new(client.clone(), LEASE_NAME)
        .with_namespace(&config.namespace)
        .with_identity(&identity)
        .build()
        .await
        .map_err(|e| anyhow::anyhow!(lease_error(&e)))
        .with_context(|| format!("setting up the Lease {}/{LEASE_NAME}", config.namespace))?;
    own_lease(&client, &config.namespace).await;
    let (leader, lease_task) = lease.watch().await;

    let (plans_tx, plans_rx) = tokio::sync::watch::channel(Default::default());
    let (jobs_tx, jobs_rx) = tokio::sync::mpsc::channel(1024);
    let writer = tokio::spawn(writer::run_writer(
        client.clone(),
        writer::WriterSettings {
            identity: identity.clone(),
            per_policy_interval: Duration::from_secs(2),
            summary_interval: config.status_summary_interval,
            pacing: Duration::from_millis(20),
            request_timeout: Duration::from_secs(10),
        },
        plans_rx,
        jobs_rx,
        leader.clone(),
        shared.clone(),
    ));
    let (slices_tx, slices_rx) = tokio::sync::watch::channel(Default::default());
    let (needs_tx, needs_rx) = tokio::sync::watch::channel(inputs::Needs::default());
    let (feeds_tx, feeds_rx) = tokio::sync::watch::channel(Default::default());
    let slice_writer = tokio::spawn(slice_writer::run_slice_writer(
        client.clone(),
        slice_writer::SliceWriterSettings {
            per_slice_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(10),
        },
        slices_rx,
        leader.clone(),
        shared.clone(),
    ));
    let guard = config
        .egress
        .guard(ipsetmgr_feeds::egress::Setting::Cluster)
        .with_api_server(api_server_addresses(&api_url).await);
    // Its endpoints too, as they change (docs/member-sources.md, "Egress").
    let endpoints = tokio::spawn(ipsetmgr_controller::api_endpoints::follow(
        client.clone(),
        guard.api_server(),
    ));
    let fetcher = ipsetmgr_feeds::feed::Fetcher::new(
        ipsetmgr_feeds::feed::FETCH_TIMEOUT,
        ipsetmgr_feeds::feed::MAX_FEED_BYTES,
        guard,
    )
    .context("setting up the HTTP client of url sources")?;
    let (feed_out, feed_in) = futures::channel::mpsc::channel(64);
    let feeds = tokio::spawn(feeds::run_feeds(
        feeds_rx,
        leader.clone(),
        fetcher,
        feeds::HeaderSource {
            client: Some(client.clone()),
            namespace: config.namespace.clone(),
        },
        feed_out,
    ));
    let channels = event_loop::SourceChannels {
        slices: slices_tx,
        needs: needs_tx,
        feeds: feeds_tx,
    };
    let controller =
        event_loop::Controller::new(settings, plans_tx, jobs_tx, leader, shared, channels);
    let feed_in =
        futures::StreamExt::map(feed_in, |(key, result)| inputs::Input::Feed(key, result));
    let inputs = futures::stream::select(inputs::watch_inputs(client, needs_rx), feed_in);
    controller.run(inputs, shutdown_signal()).await;
    // The Lease first (issue 29, item 4): the writers write only as the
    // holder, and a new holder redoes whatever they leave, so they are
    // stopped rather than drained (draining the first statuses of a few
    // hundred policies took 11 s). With them and the loop gone nothing holds
    // a leadership receiver, and the lease task releases the Lease.
    for task in [&feeds, &endpoints, &slice_writer, &writer] {
        task.abort();
    }
    let _ = tokio::join!(feeds, endpoints, slice_writer, writer);
    release_lease(lease_task).await;
    let _ = server.stop().await;
    Ok(())
}

/// At most this long for the Lease's release: an API server that does not
/// answer does not hold the exit (the Lease then expires after its
/// duration, as after a kill).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// Wait for the lease task, whose last leadership receiver is gone, to
/// clear the Lease's holder; say how it went.
async fn release_lease(
    lease_task: tokio::task::JoinHandle<
        kube_lease_manager::Result<kube_lease_manager::LeaseManager>,
    >,
) {
    let started = std::time::Instant::now();
    match tokio::time::timeout(RELEASE_TIMEOUT, lease_task).await {
        Ok(Ok(Ok(_))) => {
            tracing::info!(took = ?started.elapsed(), "Lease released")
        }
        Ok(Ok(Err(e))) => {
            let e = lease_error(&e);
            let e = ipsetmgr_policy::text::bounded(&e, 1024);
            tracing::warn!(error = %e, "the Lease could not be released; it expires after its duration")
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "the lease task failed"),
        Err(_) => tracing::warn!(
            timeout = ?RELEASE_TIMEOUT,
            "the Lease was not released in time; it expires after its duration"
        ),
    }
}

/// Give the Lease to this pod's ServiceAccount (when in a pod of that
/// namespace), so `helm uninstall`, which deletes the ServiceAccount, has
/// the garbage collector delete the Lease too. Never fatal: without it the
/// Lease expires after its duration.
async fn own_lease(client: &kube::Client, namespace: &str) {
    use ipsetmgr_controller::lease_owner;
    let Some(sa) = lease_owner::this_pods_service_account() else {
        tracing::debug!("no ServiceAccount token: the Lease has no owner");
        return;
    };
    if sa.namespace != namespace {
        // An owner must be in the Lease's namespace.
        return;
    }
    match lease_owner::own_lease(client.clone(), namespace, LEASE_NAME, &sa).await {
        Ok(()) => {
            tracing::info!(service_account = %sa.name, "the Lease is owned by the controller's ServiceAccount")
        }
        Err(e) => {
            tracing::warn!(error = %ipsetmgr_cluster::api_error::describe(&e), "the Lease could not be given an owner; it expires after its duration once released or abandoned")
        }
    }
}

/// A Lease error as a sentence: kube's errors through the same words as
/// every other API error, never their debug dump.
fn lease_error(e: &kube_lease_manager::LeaseManagerError) -> String {
    match e {
        kube_lease_manager::LeaseManagerError::KubeError(e) => {
            ipsetmgr_cluster::api_error::describe(e)
        }
        other => other.to_string(),
    }
}

/// The addresses of the API server (its URL's host, resolved, and the
/// in-cluster service address), which url sources must never reach; its
/// endpoints are followed beside them (`api_endpoints`).
async fn api_server_addresses(url: &http::Uri) -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let port = url.port_u16().unwrap_or(443);
    let hosts = url
        .host()
        .map(|h| h.trim_matches(['[', ']']).to_string())
        .into_iter()
        .chain(std::env::var("KUBERNETES_SERVICE_HOST").ok());
    for host in hosts {
        match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(addrs) => out.extend(addrs.map(|a| a.ip())),
            Err(e) => {
                tracing::warn!(%host, error = %e, "cannot resolve the API server's host; url sources are guarded without it")
            }
        }
    }
    out.sort();
    out.dedup();
    tracing::info!(addresses = ?out, "url sources may not connect to the API server's addresses");
    out
}
