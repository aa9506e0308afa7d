//! `tandem-node`: a test node agent that runs pods as local processes (see `tandem_e2e::agent`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use tandem_e2e::AgentConfig;

/// Registers a Node and runs the pods bound to it as local processes.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Name of the Node to register.
    #[arg(long, default_value = "tandem-node")]
    node_name: String,
    /// Namespace whose pods to handle (repeatable; none: every namespace).
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// Label selector of the pods to handle, e.g. `app.kubernetes.io/name=tandem`.
    #[arg(long)]
    selector: Option<String>,
    /// Substitute an executable: `NAME=PATH` runs PATH where a pod's command starts with NAME
    /// (repeatable), e.g. `tandem=target/release/tandem`.
    #[arg(long = "command", value_parser = parse_pair)]
    commands: Vec<(String, String)>,
    /// Folder for per-pod volumes, logs and pid files.
    #[arg(long, default_value = "/tmp/tandem-node")]
    state_dir: PathBuf,
    /// Working directory of the processes (stands in for the image's WORKDIR).
    #[arg(long, default_value = ".")]
    workdir: PathBuf,
    /// Hosts file that pod names are written into (a marked block, removed on exit).
    #[arg(long, default_value = "/etc/hosts")]
    hosts_file: PathBuf,
    /// CPUs the node offers.
    #[arg(long, default_value = "16")]
    cpu: String,
    /// Memory the node offers.
    #[arg(long, default_value = "64Gi")]
    memory: String,
    /// Pods the node accepts.
    #[arg(long, default_value = "110")]
    pods: String,
    /// Extra variable `NAME=VALUE` for every process (repeatable); PATH is always passed on.
    #[arg(long = "env", value_parser = parse_pair)]
    env: Vec<(String, String)>,
}

fn parse_pair(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let absolute = |p: PathBuf| std::path::absolute(&p).with_context(|| format!("bad path {}", p.display()));
    let mut commands = HashMap::new();
    for (name, path) in args.commands {
        commands.insert(name, absolute(path.into())?);
    }
    let mut base_env: Vec<(String, String)> =
        std::env::var("PATH").map(|p| ("PATH".to_owned(), p)).into_iter().collect();
    base_env.extend(args.env);
    let config = AgentConfig {
        node_name: args.node_name,
        namespaces: args.namespaces,
        selector: args.selector,
        commands,
        state_dir: absolute(args.state_dir)?,
        workdir: absolute(args.workdir)?,
        hosts_file: args.hosts_file,
        capacity: BTreeMap::from([
            ("cpu".to_owned(), args.cpu),
            ("memory".to_owned(), args.memory),
            ("pods".to_owned(), args.pods),
        ]),
        base_env,
    };
    let client = kube::Client::try_default()
        .await
        .context("cannot reach the API server; set KUBECONFIG to the control plane's kubeconfig")?;
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    tandem_e2e::agent::run(client, config, shutdown).await
}
