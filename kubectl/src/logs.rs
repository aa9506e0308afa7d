//! `kubectl tandem logs NAME [--group G] [--rank R] [-f]`: the logs of the job's pods, chosen by the
//! operator's labels, each line prefixed with `[<pod>]`.
//!
//! Without `-f` the pods are read one after another, in the order of [`crate::job::pods`]; with
//! `-f` every selected pod is streamed at once and lines are written as they arrive, until every
//! stream ends. Pods whose container has not started (Pending, image pulls) are skipped with a note
//! naming them and why; when no selected pod has started, that is the error.
//!
//! Caveat: `-f` follows the pods that exist when it starts; a unit restarted meanwhile has new
//! pods of the same names, which a second `logs -f` picks up.

use std::io::Write;

use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, LogParams};
use tandem_api::names;

use crate::Error;
use crate::job::{self, JobPod};
use crate::status::pod_state;

/// Which pods and how.
#[derive(Debug, Default)]
pub struct Select {
    /// Only this worker group.
    pub group: Option<u32>,
    /// Only this rank.
    pub rank: Option<u32>,
    /// Stream until the containers end.
    pub follow: bool,
    /// The last lines of each pod only.
    pub tail: Option<i64>,
}

impl Select {
    fn wants(&self, pod: &JobPod) -> bool {
        self.group.is_none_or(|g| pod.group() == Some(g)) && self.rank.is_none_or(|r| pod.rank() == Some(r))
    }

    fn describe(&self) -> String {
        match (self.group, self.rank) {
            (None, None) => String::new(),
            (Some(g), None) => format!(" in group {g}"),
            (None, Some(r)) => format!(" of rank {r}"),
            (Some(g), Some(r)) => format!(" of rank {r} in group {g}"),
        }
    }
}

/// Writes the logs of job `name`'s selected pods to `out`, notes about skipped pods to `notes`.
pub async fn show(
    client: &Client,
    namespace: &str,
    name: &str,
    select: &Select,
    out: &mut (dyn Write + Send),
    notes: &mut (dyn Write + Send),
) -> Result<(), Error> {
    let job = job::find(client, namespace, name).await?;
    let all = job::pods(client, namespace, name).await?;
    if all.is_empty() {
        let phase =
            job.status.and_then(|s| s.phase).map_or_else(|| "none yet".to_owned(), |p| format!("{p:?}"));
        return Err(Error::NoPods(format!(
            "TrainingJob {name:?} has no pods (phase: {phase}); `kubectl tandem status {name} -n {namespace}` says why"
        )));
    }
    let chosen: Vec<&JobPod> = all.iter().filter(|p| select.wants(p)).collect();
    if chosen.is_empty() {
        let names: Vec<String> = all.iter().map(JobPod::name).collect();
        return Err(Error::NoPods(format!(
            "TrainingJob {name:?} has no pod{}; its pods are: {}",
            select.describe(),
            names.join(", ")
        )));
    }
    let (started, waiting): (Vec<&JobPod>, Vec<&JobPod>) =
        chosen.into_iter().partition(|p| has_started(&p.pod));
    let waiting: Vec<String> =
        waiting.iter().map(|p| format!("{} {}", p.name(), pod_state(&p.pod))).collect();
    if started.is_empty() {
        return Err(Error::NoPods(format!(
            "no pod{} of TrainingJob {name:?} has started its container yet, so there are no logs: {}",
            select.describe(),
            waiting.join("; ")
        )));
    }
    for w in &waiting {
        writeln!(notes, "skipped {w}: no container started yet")?;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = LogParams {
        container: Some(names::CONTAINER.to_owned()),
        follow: select.follow,
        tail_lines: select.tail,
        ..LogParams::default()
    };
    let started: Vec<String> = started.iter().map(|p| p.name()).collect();
    if !select.follow {
        for pod in &started {
            let text = api.logs(pod, &params).await.map_err(|e| read_error(pod, e))?;
            for line in text.lines() {
                writeln!(out, "[{pod}] {line}")?;
            }
        }
        return Ok(());
    }
    let mut streams = Vec::new();
    for pod in &started {
        let lines = api.log_stream(pod, &params).await.map_err(|e| read_error(pod, e))?.lines();
        let pod = pod.clone();
        streams.push(lines.map(move |line| (pod.clone(), line)).boxed_local());
    }
    let mut merged = futures::stream::select_all(streams);
    while let Some((pod, line)) = merged.next().await {
        match line {
            Ok(line) => writeln!(out, "[{pod}] {line}")?,
            Err(e) => writeln!(notes, "[{pod}] the log stream broke: {e}")?,
        }
        out.flush()?;
    }
    Ok(())
}

/// A pod on a node whose container runs or ran (now or in an earlier restart) has logs.
fn has_started(pod: &Pod) -> bool {
    let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    on_node
        && pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).any(|c| {
            let ran = |s: &Option<k8s_openapi::api::core::v1::ContainerState>| {
                s.as_ref().is_some_and(|s| s.running.is_some() || s.terminated.is_some())
            };
            ran(&c.state) || ran(&c.last_state)
        })
}

fn read_error(pod: &str, e: kube::Error) -> Error {
    Error::api(format!("cannot read the logs of pod {pod} (its node's kubelet serves them)"), e)
}
