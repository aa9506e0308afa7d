//! The node agent: a Node that binds pending pods to itself and runs them as local processes.
//!
//! Expected flow: [`run`] registers the Node (Ready, with capacity, not annotated for kwok), then
//! watches the pods it is told to handle. A pod without `nodeName` is bound to this node through the
//! Binding subresource (the agent is the scheduler too). A pod bound here gets a loopback IP of its
//! own (`127.1.x.y`), its names in the hosts file ([`crate::hosts`]), its volumes and environment
//! ([`crate::launch`]) and then its process: the container's command, its executable mapped through
//! [`AgentConfig::commands`], run in its own process group, stdout and stderr to
//! [`container_log`], pid in [`pid_file`]. Status goes Pending → Running (pod IP, running state,
//! Ready once a TCP readiness probe connects) → Succeeded or Failed with the exit code (128+signal
//! for a killed process).
//!
//! Deletion: a pod with a deletion timestamp gets SIGTERM, then SIGKILL after its grace period;
//! once the process is gone its final status is written and the agent deletes it with grace 0, as
//! a kubelet does. A pod removed outright (force delete) has its process killed the same way.
//!
//! Guarantees: a pod is started at most once per agent (restartPolicy is `Never` for Tandem's
//! pods; other policies are treated alike); on shutdown every process is stopped, the hosts block
//! removed and the Node deleted. Children die with the agent even if it is SIGKILLed
//! (`PR_SET_PDEATHSIG`).
//!
//! Caveats: one container per pod, no init containers, no image (the command runs on this
//! machine), no resource limits, no restart of containers, pods running when a previous agent died
//! are failed rather than adopted.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::hosts::{HostsFile, pod_names};
use crate::launch::{self, LaunchError, Mounts, PodFacts};

/// IP address reported as the node's (and every pod's `hostIP`).
pub const NODE_IP: &str = "127.0.0.1";

/// How the agent is set up.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Node name to register.
    pub node_name: String,
    /// Namespaces whose pods it handles (empty: all).
    pub namespaces: Vec<String>,
    /// Label selector of the pods it handles.
    pub selector: Option<String>,
    /// Executables to substitute: a command's first word (or its file name) → local path.
    pub commands: HashMap<String, PathBuf>,
    /// Where per-pod folders (volumes, logs, pid files) go.
    pub state_dir: PathBuf,
    /// Working directory of processes whose container sets none (the image's WORKDIR stand-in).
    pub workdir: PathBuf,
    /// Hosts file that pod names are written into.
    pub hosts_file: PathBuf,
    /// Node capacity (`cpu`, `memory`, `pods`).
    pub capacity: BTreeMap<String, String>,
    /// Variables every process gets before the pod's own (the image's ENV stand-in).
    pub base_env: Vec<(String, String)>,
}

/// Folder of pod `uid` under the agent's state folder.
pub fn pod_dir(state_dir: &Path, uid: &str) -> PathBuf {
    state_dir.join("pods").join(uid)
}

/// File holding the pid of pod `uid`'s process while it runs.
pub fn pid_file(state_dir: &Path, uid: &str) -> PathBuf {
    pod_dir(state_dir, uid).join("pid")
}

/// stdout and stderr of container `container` of pod `uid`.
pub fn container_log(state_dir: &Path, uid: &str, container: &str) -> PathBuf {
    pod_dir(state_dir, uid).join(format!("{container}.log"))
}

/// The loopback IP of the `seq`-th pod: `127.1.0.1`, `127.1.0.2`, … (254 per third octet).
pub fn pod_ip(seq: u64) -> String {
    format!("127.1.{}.{}", (seq / 254) % 256, seq % 254 + 1)
}

/// A stop request for a pod's process.
#[derive(Clone, Copy, Debug)]
struct Stop {
    grace: Duration,
    /// Delete the pod (grace 0) once its process is gone.
    delete: bool,
}

struct Handle {
    stop: watch::Sender<Option<Stop>>,
    done: Arc<AtomicBool>,
}

struct Agent {
    client: Client,
    config: AgentConfig,
    hosts: HostsFile,
    pods: Mutex<HashMap<String, Handle>>,
    next: AtomicU64,
}

/// Registers the node, runs pods until `shutdown` resolves, then stops them and cleans up.
pub async fn run(
    client: Client,
    config: AgentConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.state_dir)
        .with_context(|| format!("cannot create the state folder {}", config.state_dir.display()))?;
    register_node(&client, &config).await?;
    let agent = Arc::new(Agent {
        hosts: HostsFile::new(&config.hosts_file, &config.node_name),
        client: client.clone(),
        config,
        pods: Mutex::new(HashMap::new()),
        next: AtomicU64::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    let api: Api<Pod> = match agent.config.namespaces.as_slice() {
        [one] => Api::namespaced(client.clone(), one),
        _ => Api::all(client.clone()),
    };
    let mut wc = watcher::Config::default();
    if let Some(selector) = &agent.config.selector {
        wc = wc.labels(selector);
    }
    let events = watcher(api, wc).default_backoff();
    futures::pin_mut!(events);
    futures::pin_mut!(shutdown);
    tracing::info!(node = %agent.config.node_name, "watching pods");
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            event = events.next() => match event {
                Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                    if let Some(task) = agent.on_pod(pod).await {
                        tasks.spawn(task);
                    }
                }
                Some(Ok(watcher::Event::Delete(pod))) => agent.on_gone(&pod),
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                None => break,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    tracing::info!("shutting down: stopping every pod");
    for handle in agent.pods.lock().unwrap_or_else(|e| e.into_inner()).values() {
        handle.stop.send_replace(Some(Stop { grace: Duration::from_secs(5), delete: false }));
    }
    while tasks.join_next().await.is_some() {}
    if let Err(e) = agent.hosts.clear() {
        tracing::warn!(error = %e, "cannot remove the block from {}", agent.config.hosts_file.display());
    }
    let nodes: Api<Node> = Api::all(client);
    if let Err(e) = nodes.delete(&agent.config.node_name, &DeleteParams::default()).await {
        tracing::warn!(error = %e, "cannot delete node {}", agent.config.node_name);
    }
    Ok(())
}

async fn register_node(client: &Client, config: &AgentConfig) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = &config.node_name;
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "tandem.dev/node-agent": "tandem-node"}},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::info!(node = %name, "node exists; taking it over")
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot register node {name}; check the kubeconfig's rights"));
        }
    }
    let now = Time(jiff::Timestamp::now());
    let status = json!({"status": {
        "capacity": config.capacity, "allocatable": config.capacity,
        "addresses": [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": name}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "tandem-node runs pods as local processes", "lastHeartbeatTime": now,
            "lastTransitionTime": now}],
        "nodeInfo": {"kubeletVersion": "tandem-node", "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
            "containerRuntimeVersion": "tandem-node://local-process", "kubeProxyVersion": ""},
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .with_context(|| format!("cannot set the status of node {name}"))?;
    tracing::info!(node = %name, "node registered and Ready");
    Ok(())
}

impl Agent {
    fn handles(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handle>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reacts to a pod as it now is; returns the task that runs it when it is to be started.
    async fn on_pod(self: &Arc<Self>, pod: Pod) -> Option<impl Future<Output = ()> + use<>> {
        let ns = pod.namespace().unwrap_or_default();
        if !self.config.namespaces.is_empty() && !self.config.namespaces.contains(&ns) {
            return None;
        }
        let uid = pod.uid()?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let mine = node.as_deref() == Some(self.config.node_name.as_str());
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            if mine {
                let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30).max(0);
                let stop = Stop { grace: Duration::from_secs(grace.unsigned_abs()), delete: true };
                let running = self.handles().get(&uid).map(|h| {
                    h.stop.send_replace(Some(stop));
                    !h.done.load(Ordering::SeqCst)
                });
                if running != Some(true) {
                    self.force_delete(&pod).await;
                }
            }
            return None;
        }
        if node.is_none() {
            if phase.is_empty() || phase == "Pending" {
                self.bind(&pod).await;
            }
            return None;
        }
        if !mine || self.handles().contains_key(&uid) {
            return None;
        }
        let (stop, stop_rx) = watch::channel(None);
        let done = Arc::new(AtomicBool::new(false));
        self.handles().insert(uid, Handle { stop, done: done.clone() });
        if phase == "Succeeded" || phase == "Failed" {
            done.store(true, Ordering::SeqCst);
            return None;
        }
        let agent = self.clone();
        if phase == "Running" {
            // Started by an earlier agent whose process is gone.
            return Some(Box::pin(async move {
                let message = "the node agent restarted; its process is gone";
                agent.report(&pod, terminal_status(&pod, None, 137, "Error", message, None)).await;
                done.store(true, Ordering::SeqCst);
            }) as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>);
        }
        let seq = self.next.fetch_add(1, Ordering::SeqCst);
        Some(Box::pin(async move {
            agent.run_pod(pod, seq, stop_rx).await;
            done.store(true, Ordering::SeqCst);
        }))
    }

    /// The pod object is gone (force-deleted, or deleted by us): stop its process, forget it.
    fn on_gone(&self, pod: &Pod) {
        let Some(uid) = pod.uid() else { return };
        if let Some(handle) = self.handles().remove(&uid) {
            handle.stop.send_replace(Some(Stop { grace: Duration::from_secs(2), delete: false }));
        }
        if let Err(e) = self.hosts.remove(&uid) {
            tracing::warn!(error = %e, "cannot update {}", self.config.hosts_file.display());
        }
    }

    async fn bind(&self, pod: &Pod) {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": pod.uid()},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.config.node_name},
        });
        match api.create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding).await {
            Ok(_) => tracing::info!(pod = %format!("{ns}/{name}"), "bound"),
            // Already bound (a stale event) or gone: the next event tells.
            Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {}
            Err(e) => tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "cannot bind"),
        }
    }

    async fn force_delete(&self, pod: &Pod) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let params = DeleteParams::default()
            .grace_period(0)
            .preconditions(Preconditions { uid: pod.uid(), resource_version: None });
        match api.delete(&pod.name_any(), &params).await {
            Ok(_) => tracing::info!(pod = %pod.name_any(), "deleted"),
            Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => {}
            Err(e) => tracing::warn!(pod = %pod.name_any(), error = %e, "cannot finish deletion"),
        }
    }

    async fn report(&self, pod: &Pod, status: Value) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let patch = Patch::Merge(json!({ "status": status }));
        if let Err(e) = api.patch_status(&pod.name_any(), &PatchParams::default(), &patch).await {
            tracing::warn!(pod = %pod.name_any(), error = %e, "cannot report status");
        }
    }

    /// Runs one pod from start to its final status (and its deletion, when asked for).
    async fn run_pod(&self, pod: Pod, seq: u64, mut stop: watch::Receiver<Option<Stop>>) {
        let uid = pod.uid().unwrap_or_default();
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let ip = pod_ip(seq);
        let spec = pod.spec.clone().unwrap_or_default();
        let hostname = spec.hostname.clone().unwrap_or_else(|| name.clone());
        if let Err(e) = self.hosts.add(seq, &uid, &ip, pod_names(&hostname, spec.subdomain.as_deref(), &ns)) {
            tracing::warn!(error = %e, "cannot write {}", self.config.hosts_file.display());
        }
        let facts = PodFacts {
            pod_ip: ip.clone(),
            host_ip: NODE_IP.to_owned(),
            node_name: self.config.node_name.clone(),
        };
        let container = spec.containers.first().cloned().unwrap_or_default();
        let dir = pod_dir(&self.config.state_dir, &uid);
        let _ = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join("pod"), format!("{ns}/{name}\n")));

        // Prepare; a missing ConfigMap or Secret is waited for, as a kubelet does.
        let mut command = loop {
            let error = match self.prepare(&pod, &container, &dir, &facts, &hostname).await {
                Ok(command) => break command,
                Err(e) => e,
            };
            let retry = matches!(error, LaunchError::MissingSource { .. });
            let reason = if retry { "CreateContainerConfigError" } else { "CreateContainerError" };
            tracing::warn!(pod = %format!("{ns}/{name}"), error = %error, "cannot start the container");
            if !retry {
                let status = terminal_status(&pod, Some(&ip), 128, reason, &error.to_string(), None);
                self.report(&pod, status).await;
                return self.finish(&pod, &stop).await;
            }
            self.report(&pod, waiting_status(&container, &ip, reason, &error.to_string())).await;
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(2)) => {}
                _ = stop.changed() => return self.finish(&pod, &stop).await,
            }
        };
        let started = Time(jiff::Timestamp::now());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                let message = format!("cannot run {:?}: {e}", command.as_std().get_program());
                tracing::warn!(pod = %format!("{ns}/{name}"), "{message}");
                self.report(&pod, terminal_status(&pod, Some(&ip), 128, "StartError", &message, None)).await;
                return self.finish(&pod, &stop).await;
            }
        };
        let pid = child.id().unwrap_or_default();
        let _ = std::fs::write(pid_file(&self.config.state_dir, &uid), format!("{pid}\n"));
        tracing::info!(pod = %format!("{ns}/{name}"), %ip, pid, "started");
        let probe = readiness_port(&container);
        self.report(&pod, running_status(&container, &ip, &started, probe.is_none())).await;

        let mut ready = probe.is_none();
        let mut kill_at: Option<tokio::time::Instant> = None;
        let exit = loop {
            tokio::select! {
                exit = child.wait() => break exit,
                Ok(()) = stop.changed(), if kill_at.is_none() => {
                    let grace = stop.borrow().map(|s| s.grace).unwrap_or_default();
                    signal_group(pid, libc::SIGTERM);
                    kill_at = Some(tokio::time::Instant::now() + grace);
                }
                () = sleep_until(kill_at), if kill_at.is_some() => {
                    signal_group(pid, libc::SIGKILL);
                    kill_at = Some(tokio::time::Instant::now() + Duration::from_secs(3600));
                }
                () = tokio::time::sleep(Duration::from_millis(500)), if !ready => {
                    let addr = format!("{ip}:{}", probe.unwrap_or_default());
                    if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                        ready = true;
                        self.report(&pod, running_status(&container, &ip, &started, true)).await;
                    }
                }
            }
        };
        // Whatever is left of the process group goes with its leader.
        signal_group(pid, libc::SIGKILL);
        let _ = std::fs::remove_file(pid_file(&self.config.state_dir, &uid));
        let (code, signal) = match &exit {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(code), _) => (code, None),
                (None, Some(sig)) => (128 + sig, Some(sig)),
                (None, None) => (128, None),
            },
            Err(_) => (128, None),
        };
        let (reason, message) = match (code, signal) {
            (0, _) => ("Completed", String::new()),
            (_, Some(sig)) => ("Error", format!("killed by signal {sig}")),
            _ => ("Error", format!("exited with code {code}")),
        };
        tracing::info!(pod = %format!("{ns}/{name}"), code, "exited");
        let mut status = terminal_status(&pod, Some(&ip), code, reason, &message, Some(&started));
        if let (Some(sig), Some(state)) =
            (signal, status.pointer_mut("/containerStatuses/0/state/terminated"))
        {
            state["signal"] = json!(sig);
        }
        self.report(&pod, status).await;
        self.finish(&pod, &stop).await;
    }

    /// After the final status: delete the pod if its deletion was asked for.
    async fn finish(&self, pod: &Pod, stop: &watch::Receiver<Option<Stop>>) {
        let delete = stop.borrow().is_some_and(|s| s.delete);
        if delete {
            self.force_delete(pod).await;
        }
    }

    async fn prepare(
        &self,
        pod: &Pod,
        container: &Container,
        dir: &Path,
        facts: &PodFacts,
        hostname: &str,
    ) -> Result<tokio::process::Command, LaunchError> {
        let spec = pod.spec.clone().unwrap_or_default();
        if spec.containers.len() != 1 || spec.init_containers.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(LaunchError::Unsupported(
                "pods with more than one container or with init containers".into(),
            ));
        }
        let volumes = launch::materialise_volumes(&self.client, pod, &dir.join("volumes")).await?;
        let mounts = Mounts::new(container, &volumes)?;
        let env = launch::resolve_env(&self.client, pod, container, facts).await?;
        let argv: Vec<String> = container
            .command
            .iter()
            .flatten()
            .chain(container.args.iter().flatten())
            .map(|word| mounts.rewrite(word))
            .collect();
        let Some((program, args)) = argv.split_first() else {
            return Err(LaunchError::Unsupported(
                "a container without `command` (the image's entrypoint is unknown here)".into(),
            ));
        };
        let file_name = Path::new(program).file_name().and_then(|f| f.to_str()).unwrap_or_default();
        let program = self
            .config
            .commands
            .get(program)
            .or_else(|| self.config.commands.get(file_name))
            .cloned()
            .unwrap_or_else(|| program.into());
        let log_path = container_log(&self.config.state_dir, &pod.uid().unwrap_or_default(), &container.name);
        let log = std::fs::File::create(&log_path)
            .map_err(|source| LaunchError::Io { path: log_path.clone(), source })?;
        let log_err = log.try_clone().map_err(|source| LaunchError::Io { path: log_path.clone(), source })?;
        let workdir = match &container.working_dir {
            Some(dir) => PathBuf::from(mounts.rewrite(dir)),
            None => self.config.workdir.clone(),
        };
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .env_clear()
            .envs(self.config.base_env.iter().map(|(k, v)| (k, v)))
            .env("HOSTNAME", hostname)
            .envs(env.iter().map(|(k, v)| (k.clone(), mounts.rewrite(v))))
            .current_dir(workdir)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut command = tokio::process::Command::from(command);
        command.kill_on_drop(true);
        Ok(command)
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Sends `signal` to the process group led by `pid` (each pod's process leads its own group).
fn signal_group(pid: u32, signal: i32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    if pid > 0 {
        // SAFETY: kill(2) with a negative pid only sends a signal; a gone group gives ESRCH.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}

fn readiness_port(container: &Container) -> Option<u16> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let port = container.readiness_probe.as_ref()?.tcp_socket.as_ref()?.port.clone();
    match port {
        IntOrString::Int(p) => u16::try_from(p).ok(),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

fn conditions(ready: bool, reason: Option<&str>) -> Value {
    let now = Time(jiff::Timestamp::now());
    let status = if ready { "True" } else { "False" };
    let cond = |t: &str, s: &str| {
        let mut c = json!({"type": t, "status": s, "lastTransitionTime": now});
        if let (Some(r), "False") = (reason, s) {
            c["reason"] = json!(r);
        }
        c
    };
    json!([
        cond("PodScheduled", "True"),
        cond("Initialized", "True"),
        cond("ContainersReady", status),
        cond("Ready", status)
    ])
}

fn running_status(container: &Container, ip: &str, started: &Time, ready: bool) -> Value {
    json!({
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": NODE_IP, "hostIPs": [{"ip": NODE_IP}],
        "startTime": started,
        "conditions": conditions(ready, None),
        "containerStatuses": [{"name": container.name, "image": container.image.clone().unwrap_or_default(),
            "imageID": "", "ready": ready, "started": true, "restartCount": 0,
            "state": {"running": {"startedAt": started}}}],
    })
}

fn waiting_status(container: &Container, ip: &str, reason: &str, message: &str) -> Value {
    json!({
        "phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": NODE_IP, "hostIPs": [{"ip": NODE_IP}],
        "conditions": conditions(false, Some("ContainersNotReady")),
        "containerStatuses": [{"name": container.name, "image": container.image.clone().unwrap_or_default(),
            "imageID": "", "ready": false, "started": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}}}],
    })
}

fn terminal_status(
    pod: &Pod,
    ip: Option<&str>,
    code: i32,
    reason: &str,
    message: &str,
    started: Option<&Time>,
) -> Value {
    let container = pod.spec.as_ref().and_then(|s| s.containers.first()).cloned().unwrap_or_default();
    let now = Time(jiff::Timestamp::now());
    let mut terminated = json!({"exitCode": code, "reason": reason, "finishedAt": now,
        "startedAt": started.cloned().unwrap_or_else(|| now.clone())});
    if !message.is_empty() {
        terminated["message"] = json!(message);
    }
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    let mut status = json!({
        "phase": phase, "hostIP": NODE_IP, "hostIPs": [{"ip": NODE_IP}],
        "conditions": conditions(false, Some(if code == 0 { "PodCompleted" } else { "PodFailed" })),
        "containerStatuses": [{"name": container.name, "image": container.image.clone().unwrap_or_default(),
            "imageID": "", "ready": false, "started": false, "restartCount": 0,
            "state": {"terminated": terminated}}],
    });
    if let Some(ip) = ip {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_ips_are_distinct_loopback_addresses() {
        let ips: std::collections::HashSet<String> = (0..2000).map(pod_ip).collect();
        assert_eq!(ips.len(), 2000);
        assert!(
            ips.iter().all(|ip| ip.starts_with("127.1.") && !ip.ends_with(".0") && !ip.ends_with(".255"))
        );
    }

    #[test]
    fn a_killed_process_reports_128_plus_the_signal() {
        let pod = Pod::default();
        let status = terminal_status(&pod, Some("127.1.0.1"), 137, "Error", "killed by signal 9", None);
        assert_eq!(status["phase"], "Failed");
        assert_eq!(status["containerStatuses"][0]["state"]["terminated"]["exitCode"], 137);
        assert_eq!(terminal_status(&pod, None, 0, "Completed", "", None)["phase"], "Succeeded");
    }
}
