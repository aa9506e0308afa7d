//! The pod of one role: the user's template, with the parts that the role, the worker backend
//! and the network add, and the scheduling settings.

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SecretVolumeSource, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tandem_api::contract::{self, env};
use tandem_api::{Backend, LaunchEnv, PodGroupFlavor, Role};

use super::{mpi, network, user};
use crate::validate::ValidatedJob;
use tandem_api::names;

/// Scheduler of gang-scheduled pods when the job names none, per PodGroup flavour.
pub const VOLCANO_SCHEDULER: &str = "volcano";
/// See [`VOLCANO_SCHEDULER`].
pub const SCHEDULER_PLUGINS_SCHEDULER: &str = "scheduler-plugins-scheduler";
/// Pod annotation Volcano reads to find a pod's PodGroup.
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// Pod label the scheduler-plugins coscheduling plugin reads.
pub const SCHEDULER_PLUGINS_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";
/// Name of a PS pod's container port of its HTTP status endpoint.
pub const STATUS_PORT_NAME: &str = "status";
/// Group of the trainer image's `tandem` user (uid 1000): the `fsGroup` of every pod whose template
/// sets none, so that it can read the mounted job token and SSH keys.
pub const TRAINER_FS_GROUP: i64 = 1000;

/// What one concern adds to a pod: to its `tandem` container and to its spec.
#[derive(Debug, Default)]
pub(super) struct Parts {
    /// The container's command, unless the template sets a command or arguments.
    pub command: Option<Vec<String>>,
    /// The container's arguments, with [`Parts::command`].
    pub args: Option<Vec<String>>,
    pub env: Vec<EnvVar>,
    pub ports: Vec<ContainerPort>,
    /// The port of a TCP readiness probe, unless the template sets a probe.
    pub ready_port: Option<u16>,
    pub mounts: Vec<VolumeMount>,
    pub volumes: Vec<Volume>,
    /// The pod's `fsGroup`, unless the template sets one.
    pub fs_group: Option<i64>,
}

impl Parts {
    /// Adds `more` after these: its lists follow, its command and readiness port win.
    fn and(mut self, more: Parts) -> Self {
        if more.command.is_some() {
            (self.command, self.args) = (more.command, more.args);
        }
        self.env.extend(more.env);
        self.ports.extend(more.ports);
        self.ready_port = more.ready_port.or(self.ready_port);
        self.mounts.extend(more.mounts);
        self.volumes.extend(more.volumes);
        self.fs_group = more.fs_group.or(self.fs_group);
        self
    }

    /// Adds the parts to the pod and to its container number `container`.
    fn apply(self, pod_spec: &mut PodSpec, container: usize) {
        let Some(container) = pod_spec.containers.get_mut(container) else { return };
        if container.command.is_none() && container.args.is_none() {
            container.command = self.command;
            container.args = self.args;
        }
        container.env.get_or_insert_with(Vec::new).extend(self.env);
        container.ports.get_or_insert_with(Vec::new).extend(self.ports);
        if let (Some(port), None) = (self.ready_port, &container.readiness_probe) {
            container.readiness_probe = Some(Probe {
                tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(i32::from(port)), host: None }),
                period_seconds: Some(2),
                ..Probe::default()
            });
        }
        container.volume_mounts.get_or_insert_with(Vec::new).extend(self.mounts);
        pod_spec.volumes.get_or_insert_with(Vec::new).extend(self.volumes);
        if let Some(group) = self.fs_group {
            let security = pod_spec.security_context.get_or_insert_with(PodSecurityContext::default);
            security.fs_group.get_or_insert(group);
        }
    }
}

/// The pod of `role`, launched for `attempt` (the restarts of its unit so far).
pub fn pod(job: &ValidatedJob<'_>, role: Role, attempt: u32) -> Pod {
    let spec = job.spec;
    let template = match role {
        Role::Ps { .. } => spec.parameter_servers.template.clone(),
        Role::Worker { .. } | Role::Launcher { .. } => spec.workers.template.clone(),
    }
    .unwrap_or_default();
    let PodTemplateSpec { metadata: template_meta, spec: template_spec } = template;
    let mut pod_spec = template_spec.unwrap_or_default();
    let backend = match spec.workers.backend {
        Backend::Tcp => Parts::default(),
        Backend::Mpi => mpi::parts(job, role),
    };
    let mut parts = role_parts(job, role, attempt);
    parts.env.extend(user::progress_file_env(job, role, attempt));
    let mut parts = if user::runs_user_command(job, role) {
        user::parts(job, role, attempt, parts)
    } else {
        parts.and(backend)
    };
    if user::uses_user_image(job, role) {
        // The user's processes serve no metrics: rank 0's progress sidecar serves the group's.
        parts.ports.retain(|p| p.name.as_deref() != Some(contract::METRICS_PORT_NAME));
    }
    let container = tandem_container(&mut pod_spec, job, role);
    parts.apply(&mut pod_spec, container);
    if let Some(init) =
        user::progress_sidecar(job, role, attempt).or_else(|| user::master_wait(job, role, attempt))
    {
        pod_spec.init_containers.get_or_insert_with(Vec::new).push(init);
    }
    if let Role::Worker { .. } = role {
        network::apply(&mut pod_spec, container, &spec.network);
    }
    pod_settings(&mut pod_spec, job, role);
    let mut metadata = template_meta.unwrap_or_default();
    let mut labels = metadata.labels.take().unwrap_or_default();
    labels.extend(names::pod_labels(job.name, role, attempt));
    let mut annotations = metadata.annotations.take().unwrap_or_default();
    let scheduling = &spec.run_policy.scheduling;
    if scheduling.gang {
        let default_scheduler = match scheduling.pod_group_flavor {
            PodGroupFlavor::Volcano => {
                annotations.insert(VOLCANO_GROUP_ANNOTATION.to_owned(), names::pod_group(job.name));
                VOLCANO_SCHEDULER
            }
            PodGroupFlavor::SchedulerPlugins => {
                labels.insert(SCHEDULER_PLUGINS_GROUP_LABEL.to_owned(), names::pod_group(job.name));
                SCHEDULER_PLUGINS_SCHEDULER
            }
        };
        pod_spec.scheduler_name = Some(default_scheduler.to_owned());
    }
    if let Some(scheduler) = &scheduling.scheduler_name {
        pod_spec.scheduler_name = Some(scheduler.clone());
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(names::pod(job.name, role)),
            namespace: Some(job.namespace.to_owned()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![job.owner_reference()]),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The index of the container named `tandem`, else of the template's first, else of a new one; it
/// is renamed `tandem` so that exit codes are always read from the same container. It gets the
/// job's image (a user command's workers: theirs) unless the template names one, and the
/// resources of its role.
fn tandem_container(pod_spec: &mut PodSpec, job: &ValidatedJob<'_>, role: Role) -> usize {
    let index = pod_spec.containers.iter().position(|c| c.name == names::CONTAINER).unwrap_or(0);
    if pod_spec.containers.is_empty() {
        pod_spec.containers.push(Container::default());
    }
    let Some(container) = pod_spec.containers.get_mut(index) else { return index };
    container.name = names::CONTAINER.to_owned();
    if container.image.as_deref().is_none_or(str::is_empty) {
        container.image =
            Some(if user::uses_user_image(job, role) { user::image(job) } else { job.spec.image.clone() });
    }
    let resources = match role {
        Role::Ps { .. } => job.spec.parameter_servers.resources.clone(),
        Role::Worker { .. } => job.spec.workers.resources.clone(),
        Role::Launcher { .. } => None,
    };
    if let Some(resources) = resources {
        container.resources = Some(resources);
    }
    index
}

/// What every pod of `role` gets: `tandem <role>` with the launch contract, its ports and
/// readiness, the job ConfigMap, the token Secret and the output volume, and the image user's
/// `fsGroup` (Secret files, the token on every pod and the SSH keys on MPI pods, are root-owned
/// 0400/0600; with an fsGroup the kubelet makes them group-readable by it).
fn role_parts(job: &ValidatedJob<'_>, role: Role, attempt: u32) -> Parts {
    let (ports, ready_port) = match role {
        // The HTTP status endpoint is what the operator reads progress from (see the crate docs).
        Role::Ps { .. } => (
            vec![
                container_port(names::PS_PORT_NAME, contract::PS_PORT),
                container_port(STATUS_PORT_NAME, contract::STATUS_PORT),
                container_port(contract::METRICS_PORT_NAME, contract::METRICS_PORT),
            ],
            Some(contract::PS_PORT),
        ),
        // Readiness is what a launcher waits for: a worker is ready once it accepts connections.
        Role::Worker { .. } => (
            vec![
                container_port(names::WORKER_PORT_NAME, contract::WORKER_PORT),
                container_port(contract::METRICS_PORT_NAME, contract::METRICS_PORT),
            ],
            Some(contract::WORKER_PORT),
        ),
        Role::Launcher { .. } => (Vec::new(), None),
    };
    Parts {
        command: Some(vec!["tandem".to_owned(), role.name().to_owned()]),
        args: None,
        env: contract_env(role, attempt),
        ports,
        ready_port,
        mounts: vec![
            mount("tandem-config", names::CONFIG_DIR, true),
            mount("tandem-token", names::TOKEN_DIR, true),
            mount("tandem-output", names::OUTPUT_DIR, false),
        ],
        volumes: job_volumes(job),
        fs_group: Some(TRAINER_FS_GROUP),
    }
}

/// Settings of every pod: its restart policy ([`restart_policy`]), named for the headless
/// Service, no API token unless asked for, the job's priority class, and unless the template sets
/// one, a grace period ([`contract::TERMINATION_GRACE_SECONDS`]) long enough for the preemption
/// checkpoint that SIGTERM starts.
fn pod_settings(pod_spec: &mut PodSpec, job: &ValidatedJob<'_>, role: Role) {
    pod_spec.restart_policy = Some(restart_policy(role).to_owned());
    pod_spec.termination_grace_period_seconds.get_or_insert(contract::TERMINATION_GRACE_SECONDS);
    pod_spec.hostname = Some(names::pod(job.name, role));
    pod_spec.subdomain = Some(names::service(job.name));
    pod_spec.enable_service_links = Some(false);
    // Pods talk to their peers and the PS, never to the API server.
    if pod_spec.automount_service_account_token.is_none() {
        pod_spec.automount_service_account_token = Some(false);
    }
    if pod_spec.host_network == Some(true) {
        pod_spec.dns_policy = Some("ClusterFirstWithHostNet".to_owned());
    }
    if let Some(priority) = &job.spec.run_policy.scheduling.priority_class_name {
        pod_spec.priority_class_name = Some(priority.clone());
    }
}

/// A PS restarts in place, `OnFailure`: the kubelet restarts its container in the same pod, whose
/// output volume keeps its checkpoints (the operator counts those restarts, see
/// `plan::failures`). Workers and launchers never do, `Never`: their whole group restarts as a new
/// attempt, which the operator makes.
pub fn restart_policy(role: Role) -> &'static str {
    match role {
        Role::Ps { .. } => "OnFailure",
        Role::Worker { .. } | Role::Launcher { .. } => "Never",
    }
}

/// The contract's variables, with the metrics port (a launcher's mpirun forwards it to the ranks
/// it starts on the worker pods); the bind address is the pod IP, filled in by the kubelet.
fn contract_env(role: Role, attempt: u32) -> Vec<EnvVar> {
    let launch = LaunchEnv {
        role,
        config: format!("{}/{}", names::CONFIG_DIR, contract::CONFIG_FILE).into(),
        token_file: format!("{}/{}", names::TOKEN_DIR, contract::TOKEN_KEY).into(),
        bind: String::new(),
        output: names::OUTPUT_DIR.into(),
        attempt,
    };
    launch
        .to_vars()
        .into_iter()
        .map(
            |(key, value)| {
                if key == env::BIND { field_env(key, "status.podIP") } else { plain_env(key, &value) }
            },
        )
        .chain([metrics_port_env()])
        .collect()
}

/// [`env::METRICS_PORT`] set to the contract's metrics port.
pub(super) fn metrics_port_env() -> EnvVar {
    plain_env(env::METRICS_PORT, &contract::METRICS_PORT.to_string())
}

/// The job ConfigMap, the token Secret, and the output folder: the checkpoint claim, else an
/// emptyDir.
fn job_volumes(job: &ValidatedJob<'_>) -> Vec<Volume> {
    vec![
        Volume {
            name: "tandem-config".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::config_map(job.name),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "tandem-token".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::token_secret(job.name)),
                default_mode: Some(0o400),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        match &job.spec.training.checkpoint.claim_name {
            Some(claim) => Volume {
                name: "tandem-output".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.clone(),
                    read_only: None,
                }),
                ..Volume::default()
            },
            None => Volume {
                name: "tandem-output".to_owned(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
        },
    ]
}

pub(super) fn plain_env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.to_owned(), value: Some(value.to_owned()), value_from: None }
}

/// A variable the kubelet fills in from the pod's field `path` (the downward API).
pub(super) fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.to_owned(), api_version: None }),
            ..EnvVarSource::default()
        }),
    }
}

pub(super) fn container_port(name: &str, port: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(port),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}
