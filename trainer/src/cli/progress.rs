//! `tandem progress`: the status endpoint of a worker group that runs the user's own command
//! (`workers.command`), beside its rank 0 (the operator starts it as a native sidecar of that
//! pod). It follows the group's progress file ([`tandem_api::contract::user::env::PROGRESS_FILE`],
//! the lines the user's process appends) and serves what it read as the PS status endpoint does
//! ([`tandem::ps::server::http`]): `GET /status` with the job token's HMAC, a
//! [`tandem_api::contract::PsStatus`] whose `progress` the operator copies into
//! `status.progress`, and `/metrics`, `/healthz`. Where `TANDEM_METRICS_PORT` is set (the
//! operator sets it for a group that runs the user's command) it also serves the group's
//! `tandem_group_*` families there without the token ([`tandem_util::metrics`]).
//!
//! Before serving it creates the group's checkpoint folder and the progress file's folder (group
//! writable: the user's process runs in another container, under the pod's `fsGroup`). It stops
//! on SIGTERM, or when the pod's main container has ended (the kubelet then stops native
//! sidecars), with code 0, after reading the file a last time and writing the last progress to
//! its termination message (JSON of [`tandem_api::Progress`]): a group that finishes between two
//! of the operator's polls still reports its final step.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tandem::ps::server::http::{self, Document, Health, StatusListener};
use tandem::runner::user::LineTail;
use tandem_api::contract::user::{UserProgress, env as user_env};
use tandem_api::contract::{self, PsStatus, Role};
use tokio::sync::{mpsc, oneshot};

/// How often the progress file is read for new lines.
const POLL: Duration = Duration::from_secs(1);

/// Arguments of `tandem progress`.
#[derive(clap::Args)]
pub struct Args {
    /// Port of the status endpoint (default `TANDEM_STATUS_PORT`, else the contract's status port).
    #[arg(long)]
    pub port: Option<u16>,
}

/// The document of one group: the contract's summary, and what was read.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupDocument {
    #[serde(flatten)]
    summary: PsStatus,
    /// The group this endpoint reports.
    group: u32,
    /// Progress lines read (those that parsed).
    lines: u64,
    /// Lines skipped as not a progress object.
    skipped_lines: u64,
}

impl Document for GroupDocument {
    fn metrics(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let progress = self.summary.progress.as_ref();
        let g = self.group;
        let mut metric = |name: &str, kind: &str, help: &str, value: Option<f64>| {
            let _ = writeln!(out, "# HELP tandem_group_{name} {help}\n# TYPE tandem_group_{name} {kind}");
            if let Some(v) = value {
                let _ = writeln!(out, "tandem_group_{name}{{group=\"{g}\"}} {v}");
            }
        };
        metric("step", "gauge", "Step of the group's latest progress line.", progress.map(|p| p.step as f64));
        metric("loss", "gauge", "Training loss of that line.", progress.and_then(|p| p.loss));
        metric(
            "accuracy",
            "gauge",
            "Latest test accuracy the group reported.",
            progress.and_then(|p| p.accuracy),
        );
        metric(
            "samples_per_second",
            "gauge",
            "The group's throughput between its last two lines that counted samples.",
            progress.and_then(|p| p.samples_per_second),
        );
        metric("progress_lines_total", "counter", "Progress lines read.", Some(self.lines as f64));
        out
    }
}

/// What the lines read so far say.
#[derive(Debug)]
struct Reading {
    group: u32,
    replicas: u32,
    lines: u64,
    skipped: u64,
    last: Option<UserProgress>,
    accuracy: Option<f64>,
    /// Samples and the instant of the last line that counted them, for the throughput.
    samples_at: Option<(u64, Instant)>,
    samples_per_second: Option<f64>,
}

impl Reading {
    fn new(group: u32, replicas: u32) -> Self {
        Self {
            group,
            replicas,
            lines: 0,
            skipped: 0,
            last: None,
            accuracy: None,
            samples_at: None,
            samples_per_second: None,
        }
    }

    /// Takes one complete line read at `now`.
    fn line(&mut self, text: &str, now: Instant) {
        let Some(p) = UserProgress::parse(text) else {
            self.skipped += u64::from(!text.trim().is_empty());
            return;
        };
        self.lines += 1;
        self.accuracy = p.accuracy.or(self.accuracy);
        if let Some(samples) = p.samples {
            if let Some((before, then)) = self.samples_at {
                let seconds = now.duration_since(then).as_secs_f64();
                if samples > before && seconds > 0.0 {
                    self.samples_per_second = Some((samples - before) as f64 / seconds);
                }
            }
            self.samples_at = Some((samples, now));
        }
        self.last = Some(p);
    }

    fn document(&self) -> GroupDocument {
        let progress = self.last.map(|p| tandem_api::job::Progress {
            step: p.step,
            epoch: p.epoch.map_or(0, |e| u32::try_from(e).unwrap_or(u32::MAX)),
            loss: p.loss,
            accuracy: self.accuracy,
            samples_per_second: self.samples_per_second,
        });
        GroupDocument {
            summary: PsStatus {
                shard: 0,
                replicas: self.replicas,
                version: self.last.map_or(0, |p| p.step),
                member_groups: 1,
                progress,
                planned_groups: None,
            },
            group: self.group,
            lines: self.lines,
            skipped_lines: self.skipped,
        }
    }
}

/// Runs `tandem progress`.
pub fn run(args: Args) -> anyhow::Result<()> {
    super::init_logging();
    let super::Contract { env, job, token } = super::load_contract()?;
    let Role::Worker { group, .. } = env.role else {
        bail!("`tandem progress` reports a worker group, but TANDEM_ROLE says this process is {}", env.role);
    };
    let var = |name: &str| {
        std::env::var(name).ok().filter(|v| !v.is_empty()).map(PathBuf::from).with_context(|| {
            format!(
                "{name} is not set: `tandem progress` runs beside a group's rank 0 that runs workers.command"
            )
        })
    };
    let file = var(user_env::PROGRESS_FILE)?;
    let checkpoints = var(user_env::CHECKPOINT_DIR)?;
    for dir in [checkpoints.as_path(), file.parent().unwrap_or(Path::new("."))] {
        make_shared_dir(dir)?;
    }
    let port = match args.port {
        Some(port) => port,
        None => contract::status_port(|k| std::env::var(k).ok())?.unwrap_or(contract::STATUS_PORT),
    };
    let host = if env.bind.contains(':') { format!("[{}]", env.bind) } else { env.bind.clone() };
    let replicas = job.parameter_servers.len() as u32;
    let metrics = super::metrics_listener(env.attempt)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let addr = format!("{host}:{port}");
        let listener = StatusListener::bind(&addr)
            .await
            .with_context(|| format!("cannot serve the status endpoint on {addr}"))?;
        let at = listener.local_addr().context("cannot read the status endpoint's address")?;
        tracing::info!(group, %at, file = %file.display(), "group status endpoint listening");
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "status on {at}");
        let _ = stdout.flush();
        let (query, queries) = mpsc::channel(16);
        let metrics = match metrics.map(tokio::net::TcpListener::from_std).transpose() {
            Ok(listener) => {
                listener.map(|l| tokio::spawn(tandem_util::metrics::serve(l, group_page(&query))))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot serve metrics; the group's status is served without them");
                None
            }
        };
        let server = tokio::spawn(http::serve(listener, Arc::from(token), query, None, Health::default()));
        let reading =
            follow(file, Reading::new(group, replicas), queries, super::ps::shutdown_signal()).await;
        server.abort();
        if let Some(metrics) = metrics {
            metrics.abort();
        }
        // The group's rank 0 has ended (the kubelet stops a sidecar after the main container) or
        // the pod is going: the last progress stays in this container's termination message,
        // where the operator reads the final step of a group that finished between two polls.
        if let Some(progress) = reading.document().summary.progress {
            super::termination_message(
                &serde_json::to_string(&progress).context("cannot encode the progress")?,
            );
        }
        anyhow::Ok(())
    })
}

/// The sidecar's metrics page: the process's families, then the group's, asked of the reader as
/// a status query is.
fn group_page(query: &mpsc::Sender<oneshot::Sender<GroupDocument>>) -> tandem_util::metrics::Page {
    let query = query.clone();
    Arc::new(move || {
        let query = query.clone();
        Box::pin(async move {
            let mut page = tandem_util::metrics::metrics().encode(false);
            let (tx, rx) = oneshot::channel();
            if query.try_send(tx).is_ok()
                && let Ok(Ok(document)) = tokio::time::timeout(Duration::from_secs(5), rx).await
            {
                page.push_str(&document.metrics());
            }
            page
        })
    })
}

/// Reads new complete lines of `file` every [`POLL`] and answers the endpoint's queries, until
/// `stop` (then reads the lines written meanwhile) or the endpoint ends; returns what was read.
async fn follow(
    file: PathBuf,
    mut reading: Reading,
    mut queries: mpsc::Receiver<oneshot::Sender<GroupDocument>>,
    stop: impl Future<Output = ()>,
) -> Reading {
    let mut tail = LineTail::new(file);
    let mut tick = tokio::time::interval(POLL);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                tail.read(|text| reading.line(text, now));
            }
            asked = queries.recv() => match asked {
                Some(reply) => { let _ = reply.send(reading.document()); }
                None => return reading,
            },
            () = &mut stop => {
                let now = Instant::now();
                tail.read(|text| reading.line(text, now));
                return reading;
            }
        }
    }
}

/// Creates `dir` (and its parents) writable by the pod's `fsGroup`, which the user's container
/// shares with this one.
fn make_shared_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o2775))
        .with_context(|| format!("cannot make {} group-writable", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_keeps_the_latest_step_the_last_accuracy_and_a_throughput() {
        let mut r = Reading::new(1, 0);
        let t0 = Instant::now();
        assert!(r.document().summary.progress.is_none());
        r.line(r#"{"step":10,"loss":0.9,"samples":640}"#, t0);
        r.line("epoch 1 done", t0);
        r.line(r#"{"step":20,"loss":0.7,"accuracy":0.81,"samples":1280}"#, t0 + Duration::from_secs(2));
        r.line(r#"{"step":30,"loss":0.6}"#, t0 + Duration::from_secs(3));
        let doc = r.document();
        let p = doc.summary.progress.as_ref().unwrap();
        assert_eq!((p.step, p.loss, p.accuracy), (30, Some(0.6), Some(0.81)));
        assert_eq!(p.samples_per_second, Some(320.0));
        assert_eq!((doc.group, doc.lines, doc.skipped_lines), (1, 3, 1));
        assert!(doc.metrics().contains("tandem_group_step{group=\"1\"} 30"));
    }

    #[tokio::test]
    async fn stopping_reads_the_lines_written_since_the_last_poll() {
        let dir = std::env::temp_dir().join(format!("tandem-progress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("progress.jsonl");
        std::fs::write(
            &file,
            "{\"step\":10,\"loss\":0.9}\n{\"step\":20,\"loss\":0.5,\"accuracy\":0.8}\n{\"step\":3",
        )
        .unwrap();
        let (_query, queries) = mpsc::channel(1);
        let reading = follow(file, Reading::new(0, 0), queries, std::future::ready(())).await;
        std::fs::remove_dir_all(&dir).unwrap();
        let progress = reading.document().summary.progress.unwrap();
        // The incomplete last line is not read.
        assert_eq!((progress.step, progress.accuracy), (20, Some(0.8)));
    }
}
