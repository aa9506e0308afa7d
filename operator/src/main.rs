//! `tandem-operator`: runs the TrainingJob controller against the ambient kubeconfig or the
//! in-cluster config, with leader election, metrics and health endpoints, and JSON logs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tandem_operator::leader::LeaderElector;
use tandem_operator::metrics::Metrics;
use tandem_operator::server::{self, Health};
use tandem_operator::{Context, JobController, Scope, Settings, controller};
use tokio::sync::watch;

/// Reconciles TrainingJobs into parameter-server pods and MPI worker groups.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "TANDEM_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Run without leader election (only for a single replica).
    #[arg(long)]
    no_leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "tandem-operator")]
    lease_name: String,
    /// Lease duration in seconds; the leader renews every third of it.
    #[arg(long, default_value_t = 15)]
    lease_seconds: u64,
    /// This replica's identity in the Lease and in Events (default: the pod name, else host-pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Log format.
    #[arg(long, value_parser = ["json", "text"], default_value = "json")]
    log_format: String,
    /// Seconds a pod may stay terminating past its deadline on a lost node before it is
    /// force-deleted.
    #[arg(long, default_value_t = 60)]
    force_delete_after: u64,
    /// Seconds between reconciles of a job with nothing pending.
    #[arg(long, default_value_t = 300)]
    resync: u64,
    /// Most reconciles in flight at once (0: unbounded); bounds the operator's load on the API
    /// server.
    #[arg(long, env = "TANDEM_CONCURRENCY", default_value_t = tandem_operator::controller::DEFAULT_CONCURRENCY)]
    concurrency: u16,
    /// Milliseconds a job's reconcile waits for more events of the job (its pods starting, its
    /// children created), so that a burst is reconciled and its status written once (0: none).
    #[arg(long, env = "TANDEM_DEBOUNCE_MS", default_value_t = tandem_operator::controller::DEFAULT_DEBOUNCE_MS)]
    debounce_ms: u64,
    /// Seconds between reads of a Running job's progress from its PS replica 0, or from the
    /// progress sidecar of a group that runs the user's command (other jobs are not polled).
    #[arg(long, default_value_t = 10)]
    progress_every: u64,
    /// Give every job a NetworkPolicy: its pods admit only the job's own pods, and this
    /// operator's pods (namespace `--lease-namespace`, labels `--operator-labels`) on the PS
    /// status port.
    #[arg(long, env = "TANDEM_NETWORK_POLICY")]
    network_policy: bool,
    /// Labels of this operator's pods, `key=value,…`, for the NetworkPolicy's rule that admits it.
    #[arg(long, env = "TANDEM_OPERATOR_LABELS", default_value = "app.kubernetes.io/name=tandem")]
    operator_labels: String,
    /// Who may scrape the jobs' metrics port under their NetworkPolicy: a JSON list of
    /// NetworkPolicyPeers (`[{"namespaceSelector":{"matchLabels":{…}}}]`); empty (`[]`): any
    /// source.
    #[arg(long, env = "TANDEM_METRICS_FROM", default_value = "[]")]
    metrics_from: String,
    /// Queue jobs labelled `kueue.x-k8s.io/queue-name` through Kueue: each gets a Workload and runs
    /// no pod until Kueue admits it (needs Kueue's CRDs and the chart's Kueue RBAC).
    #[arg(long, env = "TANDEM_KUEUE")]
    kueue: bool,
}

/// How long in-flight work may take once a shutdown signal came: SIGTERM must stop the operator
/// well inside a pod's default 30 s grace period, even while the API server does not answer.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// `key=value,…` as labels; the message names the bad part.
fn parse_labels(text: &str) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| match part.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
            _ => anyhow::bail!(
                "--operator-labels: {part:?} is not key=value; write e.g. app.kubernetes.io/name=tandem"
            ),
        })
        .collect()
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if format == "json" {
        builder.json().flatten_event(true).with_current_span(false).init();
    } else {
        builder.init();
    }
}

async fn signalled() {
    #[cfg(unix)]
    {
        if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

async fn fired(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging(&args.log_format);
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client: set KUBECONFIG or run in a pod with a ServiceAccount")?;
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "tandem-operator".to_owned());
        format!("{host}-{}", std::process::id())
    });

    let (stop_tx, stop_rx) = watch::channel(false);
    let signal_tx = stop_tx.clone();
    tokio::spawn(async move {
        signalled().await;
        tracing::info!("shutdown signal received");
        let _ = signal_tx.send(true);
    });

    let metrics = Metrics::default();
    let health = Health::default();
    let settings = Settings {
        force_delete_after: Duration::from_secs(args.force_delete_after),
        resync: Duration::from_secs(args.resync.max(1)),
    };
    let mut ctx = Context::new(client.clone(), metrics.clone(), settings, Some(identity.clone()));
    ctx.concurrency = args.concurrency;
    ctx.debounce = Duration::from_millis(args.debounce_ms);
    ctx.progress_every = Duration::from_secs(args.progress_every.max(1));
    ctx.kueue = args.kueue;
    if args.network_policy {
        let labels = parse_labels(&args.operator_labels)?;
        anyhow::ensure!(
            !labels.is_empty(),
            "--network-policy needs --operator-labels to select this operator's pods"
        );
        let metrics_from = serde_json::from_str(&args.metrics_from).with_context(|| {
            format!(
                "--metrics-from {:?} is not a JSON list of NetworkPolicyPeers, e.g. \
                 [{{\"namespaceSelector\":{{\"matchLabels\":{{\"kubernetes.io/metadata.name\":\"monitoring\"}}}}}}]",
                args.metrics_from
            )
        })?;
        ctx.network_policy = Some(tandem_operator::builder::OperatorPeer {
            namespace: args.lease_namespace.clone(),
            labels,
            metrics_from,
        });
    }
    let ctx = Arc::new(ctx);
    let prepared = JobController::new(ctx, &Scope { namespace: args.namespace.clone() });
    let refresh_store = prepared.store();
    let refresh_metrics = metrics.clone();
    let refresh: server::Refresh =
        Arc::new(move || refresh_metrics.set_jobs(controller::count_phases(&refresh_store)));

    let listener = server::bind(args.metrics_addr).await.with_context(|| {
        format!("cannot listen on {} for /metrics; pick another --metrics-addr", args.metrics_addr)
    })?;
    tracing::info!(addr = %args.metrics_addr, "serving /metrics, /healthz and /readyz");
    let server_task =
        tokio::spawn(server::serve(listener, metrics, health.clone(), refresh, fired(stop_rx.clone())));

    let elector = (!args.no_leader_election).then(|| {
        LeaderElector::new(
            client.clone(),
            &args.lease_namespace,
            &args.lease_name,
            &identity,
            Duration::from_secs(args.lease_seconds.max(3)),
        )
    });
    if let Some(elector) = &elector {
        let standby_health = health.clone();
        let mut last_holder = String::new();
        let acquired = async {
            elector
                .acquire(|holder| {
                    standby_health.ready.store(true, Ordering::Relaxed);
                    if holder != last_holder {
                        tracing::info!(%holder, "standing by: another replica leads");
                        last_holder = holder.to_owned();
                    }
                })
                .await;
        };
        tokio::select! {
            () = acquired => tracing::info!(%identity, "leading"),
            () = fired(stop_rx.clone()) => {
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, server_task).await;
                tracing::info!("stopped");
                return Ok(());
            }
        }
        health.ready.store(false, Ordering::Relaxed);
    }

    // Ready once TrainingJobs can be listed: the CRD is installed and RBAC allows the watch.
    let ready_health = health.clone();
    let probe: kube::Api<tandem_api::TrainingJob> = match &args.namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    };
    tokio::spawn(async move {
        loop {
            match probe.list(&kube::api::ListParams::default().limit(1)).await {
                Ok(_) => {
                    tracing::info!("TrainingJobs are listable; ready");
                    ready_health.ready.store(true, Ordering::Relaxed);
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "cannot list TrainingJobs yet: is the CRD installed?"),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    let mut controller_task = tokio::spawn(prepared.run(fired(stop_rx.clone())));
    let mut lost = false;
    // Reconcile until a signal (or, leading, until the Lease is lost); only then is the grace
    // below counted.
    if let Some(elector) = &elector {
        tokio::select! {
            () = elector.renew_until_lost() => {
                lost = true;
                let _ = stop_tx.send(true);
            }
            () = fired(stop_rx.clone()) => {}
        }
    } else {
        tokio::select! {
            () = fired(stop_rx.clone()) => {}
            joined = &mut controller_task => {
                joined.context("the controller task panicked")?;
                anyhow::bail!("the controller stopped by itself; exiting so that the Deployment restarts it");
            }
        }
    }
    // Bounded: in-flight reconciles may wait on an API server that does not answer.
    match tokio::time::timeout(SHUTDOWN_GRACE, controller_task).await {
        Ok(joined) => joined.context("the controller task panicked")?,
        Err(_) => tracing::warn!(
            grace_seconds = SHUTDOWN_GRACE.as_secs(),
            "in-flight reconciles did not finish within the grace period; stopping without them"
        ),
    }
    if let Some(elector) = &elector
        && !lost
    {
        match tokio::time::timeout(SHUTDOWN_GRACE / 2, elector.release()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot release the leader Lease; a standby takes over once it expires");
            }
            Err(_) => tracing::warn!(
                "the API server did not answer the Lease release; a standby takes over once it expires"
            ),
        }
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, server_task).await;
    if lost {
        anyhow::bail!("lost the leader Lease; exiting so that a fresh replica can stand by");
    }
    tracing::info!("stopped");
    Ok(())
}
