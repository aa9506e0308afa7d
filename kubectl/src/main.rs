//! `kubectl-tandem`: the kubectl plugin (`kubectl tandem …` runs it when it is on PATH). Reads the
//! command line and the kubeconfig; everything else is the library's.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use kubectl_tandem::{Cli, Error, run};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match main_with(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of a pipe went away (`| head`): not an error.
        Err(e) if e.downcast_ref::<Error>().is_some_and(is_broken_pipe) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn main_with(cli: Cli) -> anyhow::Result<()> {
    let options = KubeConfigOptions { context: cli.context.clone(), ..KubeConfigOptions::default() };
    let config = match (&cli.kubeconfig, &cli.context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path).with_context(|| format!("cannot read --kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &options).await.context("cannot use the kubeconfig")?
        }
        (None, Some(_)) => Config::from_kubeconfig(&options).await.context("cannot use the kubeconfig's context")?,
        (None, None) => Config::infer().await.context(
            "cannot find a cluster to talk to: set KUBECONFIG or write ~/.kube/config, as for kubectl (or pass --kubeconfig)",
        )?,
    };
    let namespace = cli.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).context("cannot make a client from the kubeconfig")?;
    let (mut out, mut notes) = (std::io::stdout(), std::io::stderr());
    run(cli.command, client, &namespace, &mut out, &mut notes).await?;
    Ok(())
}

fn is_broken_pipe(e: &Error) -> bool {
    matches!(e, Error::Output(io) if io.kind() == std::io::ErrorKind::BrokenPipe)
}
