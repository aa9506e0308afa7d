//! Builders: the Kubernetes objects a TrainingJob needs, as pure functions of the job.
//!
//! Guarantees: nothing here touches the API server, reads a clock or draws randomness (the job
//! token and SSH keys are inputs), so the same job always builds the same objects, in the same
//! order. Every object carries the job's controller owner reference and the labels of
//! [`crate::names`]. A user's pod template is kept: the operator only adds its container
//! settings, environment, volumes and network presets on top of it.
//!
//! Assumptions: the job passed [`crate::validate::validate`] (namespace and uid are present).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, KeyToPath, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext,
    PodTemplateSpec, Probe, ResourceRequirements, Secret, SecretVolumeSource, SecurityContext, Service,
    ServicePort, ServiceSpec, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Resource, ResourceExt};
use tandem_api::contract::{self, env};
use tandem_api::{
    Backend, Endpoint, GroupTopology, JobConfig, LaunchEnv, PodGroupFlavor, Role, TrainingJob, Transport,
};

use crate::names;

/// Default RDMA resource of `transport: infiniband` (the Mellanox shared device plugin's example).
pub const DEFAULT_RDMA_RESOURCE: &str = "rdma/hca_shared_devices_a";
/// Extended resource of AWS EFA.
pub const EFA_RESOURCE: &str = "vpc.amazonaws.com/efa";
/// Huge pages an EFA worker gets (libfabric registers its buffers there).
pub const EFA_HUGEPAGES: &str = "5120Mi";
/// Scheduler of gang-scheduled pods when the job names none, per PodGroup flavour.
pub const VOLCANO_SCHEDULER: &str = "volcano";
/// See [`VOLCANO_SCHEDULER`].
pub const SCHEDULER_PLUGINS_SCHEDULER: &str = "scheduler-plugins-scheduler";
/// Pod annotation Volcano reads to find a pod's PodGroup.
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// Pod label the scheduler-plugins coscheduling plugin reads.
pub const SCHEDULER_PLUGINS_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";
/// Key (and file name) of the host CA's private key in a job's SSH Secret.
pub const SSH_HOST_CA_KEY: &str = "host-ca-key";
/// Key (and file name) of the `known_hosts` in a job's SSH Secret.
pub const SSH_KNOWN_HOSTS: &str = "known_hosts";
/// The trainer image's sshd wrapper that MPI workers run (docker/tandem-sshd): it makes the pod's
/// host key, certifies it with the job's host CA and execs sshd with the given arguments.
pub const SSHD_COMMAND: &str = "tandem-sshd";

/// Group of the trainer image's `tandem` user (uid 1000): the `fsGroup` of every pod whose template
/// sets none, so that it can read the mounted job token and SSH keys.
pub const TRAINER_FS_GROUP: i64 = 1000;

/// The SSH keys of a `backend: mpi` job, in OpenSSH formats: the user key pair the launcher logs
/// in with, and the job's host CA, which certifies the host key every worker makes at start (so
/// that the launcher checks host keys without any being baked into the image).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshKeys {
    /// `-----BEGIN OPENSSH PRIVATE KEY-----` block.
    pub private_key: String,
    /// `ssh-ed25519 AAAA… comment` line.
    pub public_key: String,
    /// The host CA's private key (mounted on workers only, as `host-ca-key`).
    pub host_ca_private_key: String,
    /// The host CA's public-key line (trusted through `known_hosts`).
    pub host_ca_public_key: String,
}

/// The `known_hosts` of a job's pods: any host showing a certificate of the job's host CA.
pub fn known_hosts(keys: &SshKeys) -> String {
    format!("@cert-authority * {}\n", keys.host_ca_public_key.trim())
}

fn namespace(job: &TrainingJob) -> String {
    job.namespace().unwrap_or_default()
}

fn owner(job: &TrainingJob) -> Vec<OwnerReference> {
    job.controller_owner_ref(&()).into_iter().collect()
}

fn meta(job: &TrainingJob, name: String, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace(job)),
        labels: Some(names::child_labels(&job.name_any(), component)),
        owner_references: Some(owner(job)),
        ..ObjectMeta::default()
    }
}

/// The headless Service through which pods find each other (`<pod>.<job>.<ns>.svc`). It
/// publishes pods before they are ready: peers must resolve while a group is still starting.
pub fn service(job: &TrainingJob) -> Service {
    let name = job.name_any();
    let mut ports = vec![
        port(names::PS_PORT_NAME, contract::PS_PORT),
        port(names::WORKER_PORT_NAME, contract::WORKER_PORT),
    ];
    if job.spec.workers.backend == Backend::Mpi {
        ports.push(port(names::SSH_PORT_NAME, names::SSH_PORT));
    }
    Service {
        metadata: meta(job, names::service(&name), "job"),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            selector: Some(BTreeMap::from([(names::LABEL_JOB.to_owned(), name)])),
            publish_not_ready_addresses: Some(true),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn port(name: &str, port: u16) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port: i32::from(port),
        target_port: Some(IntOrString::Int(i32::from(port))),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

/// The launch contract's shared part: endpoints of every PS and of every group in the spec.
pub fn job_config(job: &TrainingJob) -> JobConfig {
    let name = job.name_any();
    let ns = namespace(job);
    let spec = &job.spec;
    JobConfig {
        job_name: name.clone(),
        namespace: ns.clone(),
        spec: spec.clone(),
        parameter_servers: (0..spec.parameter_servers.replicas)
            .map(|index| Endpoint::new(names::pod_host(&name, &ns, Role::Ps { index }), contract::PS_PORT))
            .collect(),
        groups: (0..spec.workers.groups)
            .map(|group| GroupTopology {
                index: group,
                peers: (0..spec.workers.group_size)
                    .map(|rank| {
                        Endpoint::new(
                            names::pod_host(&name, &ns, Role::Worker { group, rank }),
                            contract::WORKER_PORT,
                        )
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The job ConfigMap: `job.json` holds [`job_config`].
pub fn config_map(job: &TrainingJob) -> ConfigMap {
    ConfigMap {
        metadata: meta(job, names::config_map(&job.name_any()), "job"),
        data: Some(BTreeMap::from([(contract::CONFIG_FILE.to_owned(), job_config(job).to_json())])),
        ..ConfigMap::default()
    }
}

/// The Secret with the job token every PS connection presents.
pub fn token_secret(job: &TrainingJob, token: &str) -> Secret {
    Secret {
        metadata: meta(job, names::token_secret(&job.name_any()), "job"),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(contract::TOKEN_KEY.to_owned(), ByteString(token.as_bytes().to_vec()))])),
        ..Secret::default()
    }
}

/// The SSH key Secret of a `backend: mpi` job (`kubernetes.io/ssh-auth`): the user key pair, the
/// host CA key and the `known_hosts` that trusts it.
pub fn ssh_secret(job: &TrainingJob, keys: &SshKeys) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    Secret {
        metadata: meta(job, names::ssh_secret(&job.name_any()), "launcher"),
        type_: Some("kubernetes.io/ssh-auth".to_owned()),
        data: Some(BTreeMap::from([
            ("ssh-privatekey".to_owned(), bytes(&keys.private_key)),
            ("ssh-publickey".to_owned(), bytes(&keys.public_key)),
            (SSH_HOST_CA_KEY.to_owned(), bytes(&keys.host_ca_private_key)),
            (SSH_KNOWN_HOSTS.to_owned(), bytes(&known_hosts(keys))),
        ])),
        ..Secret::default()
    }
}

/// Group `group`'s OpenMPI hostfile: one line per rank, in rank order, one slot each.
pub fn hostfile(job: &TrainingJob, group: u32) -> ConfigMap {
    let name = job.name_any();
    let ns = namespace(job);
    let text: String = (0..job.spec.workers.group_size)
        .map(|rank| format!("{} slots=1\n", names::pod_host(&name, &ns, Role::Worker { group, rank })))
        .collect();
    let mut metadata = meta(job, names::hostfile(&name, group), "launcher");
    if let Some(labels) = metadata.labels.as_mut() {
        labels.insert(names::LABEL_GROUP.to_owned(), group.to_string());
    }
    ConfigMap {
        metadata,
        data: Some(BTreeMap::from([(names::HOSTFILE.to_owned(), text)])),
        ..ConfigMap::default()
    }
}

/// The PodGroup API of a flavour.
pub fn pod_group_resource(flavor: PodGroupFlavor) -> ApiResource {
    let gvk = match flavor {
        PodGroupFlavor::Volcano => GroupVersionKind::gvk("scheduling.volcano.sh", "v1beta1", "PodGroup"),
        PodGroupFlavor::SchedulerPlugins => {
            GroupVersionKind::gvk("scheduling.x-k8s.io", "v1alpha1", "PodGroup")
        }
    };
    ApiResource::from_gvk_with_plural(&gvk, "podgroups")
}

/// Pods the gang must place together: every PS and worker. Launchers are left out: they start
/// only after their workers are ready, so counting them would deadlock the gang.
pub fn gang_size(job: &TrainingJob) -> u32 {
    job.spec.parameter_servers.replicas + job.spec.workers.groups * job.spec.workers.group_size
}

/// The PodGroup of a gang-scheduled job.
pub fn pod_group(job: &TrainingJob) -> DynamicObject {
    let scheduling = &job.spec.run_policy.scheduling;
    let resource = pod_group_resource(scheduling.pod_group_flavor);
    let mut spec = serde_json::Map::new();
    spec.insert("minMember".to_owned(), gang_size(job).into());
    if let Some(queue) = &scheduling.queue {
        spec.insert("queue".to_owned(), queue.clone().into());
    }
    if let Some(priority) = &scheduling.priority_class_name {
        spec.insert("priorityClassName".to_owned(), priority.clone().into());
    }
    let mut object = DynamicObject::new(&names::pod_group(&job.name_any()), &resource);
    object.metadata = meta(job, names::pod_group(&job.name_any()), "job");
    object.data = serde_json::json!({ "spec": spec });
    object
}

/// The pod of `role`, launched for `attempt` (the restarts of its unit so far).
pub fn pod(job: &TrainingJob, role: Role, attempt: u32) -> Pod {
    let name = job.name_any();
    let spec = &job.spec;
    let mpi = spec.workers.backend == Backend::Mpi;
    let template = match role {
        Role::Ps { .. } => spec.parameter_servers.template.clone(),
        Role::Worker { .. } | Role::Launcher { .. } => spec.workers.template.clone(),
    }
    .unwrap_or_default();
    let PodTemplateSpec { metadata: template_meta, spec: template_spec } = template;
    let template_meta = template_meta.unwrap_or_default();
    let mut pod_spec = template_spec.unwrap_or_default();

    // The container named `tandem`, else the template's first, else a new one; it is renamed
    // `tandem` so that exit codes are always read from the same container.
    let index = pod_spec.containers.iter().position(|c| c.name == names::CONTAINER).unwrap_or(0);
    if pod_spec.containers.is_empty() {
        pod_spec.containers.push(Container::default());
    }
    let container = &mut pod_spec.containers[index];
    container.name = names::CONTAINER.to_owned();
    if container.image.as_deref().is_none_or(str::is_empty) {
        container.image = Some(spec.image.clone());
    }
    if container.command.is_none() && container.args.is_none() {
        container.command = Some(match role {
            Role::Worker { .. } if mpi => {
                [SSHD_COMMAND, "-p", &names::SSH_PORT.to_string()].map(str::to_owned).to_vec()
            }
            _ => vec!["tandem".to_owned(), role.name().to_owned()],
        });
    }
    let resources = match role {
        Role::Ps { .. } => spec.parameter_servers.resources.clone(),
        Role::Worker { .. } => spec.workers.resources.clone(),
        Role::Launcher { .. } => None,
    };
    if let Some(resources) = resources {
        container.resources = Some(resources);
    }
    let env = container.env.get_or_insert_with(Vec::new);
    env.extend(contract_env(role, attempt));
    if let Role::Launcher { .. } = role {
        env.extend(launcher_env());
    }
    let ports = container.ports.get_or_insert_with(Vec::new);
    match role {
        Role::Ps { .. } => {
            ports.push(container_port(names::PS_PORT_NAME, contract::PS_PORT));
            // The HTTP status endpoint the operator reads progress from (see the crate docs).
            ports.push(container_port(STATUS_PORT_NAME, contract::STATUS_PORT));
        }
        Role::Worker { .. } => {
            ports.push(container_port(names::WORKER_PORT_NAME, contract::WORKER_PORT));
            if mpi {
                ports.push(container_port(names::SSH_PORT_NAME, names::SSH_PORT));
            }
        }
        Role::Launcher { .. } => {}
    }
    // Readiness is what the launcher waits for: a worker is ready once it accepts connections.
    let ready_port = match role {
        Role::Ps { .. } => Some(contract::PS_PORT),
        Role::Worker { .. } if mpi => Some(names::SSH_PORT),
        Role::Worker { .. } => Some(contract::WORKER_PORT),
        Role::Launcher { .. } => None,
    };
    if let (Some(port), None) = (ready_port, &container.readiness_probe) {
        container.readiness_probe = Some(Probe {
            tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(i32::from(port)), host: None }),
            period_seconds: Some(2),
            ..Probe::default()
        });
    }
    let mounts = container.volume_mounts.get_or_insert_with(Vec::new);
    mounts.push(mount("tandem-config", names::CONFIG_DIR, true));
    mounts.push(mount("tandem-token", names::TOKEN_DIR, true));
    mounts.push(mount("tandem-output", names::OUTPUT_DIR, false));
    if mpi && !matches!(role, Role::Ps { .. }) {
        mounts.push(mount("tandem-ssh", names::SSH_DIR, true));
    }
    if let Role::Launcher { .. } = role {
        mounts.push(mount("tandem-hostfile", names::HOSTFILE_DIR, true));
    }
    if let Role::Worker { .. } = role {
        apply_network_preset(container, &spec.network);
    }

    let volumes = pod_spec.volumes.get_or_insert_with(Vec::new);
    volumes.extend(pod_volumes(job, role, mpi));
    if let Role::Worker { .. } = role
        && spec.network.transport != Transport::Ethernet
    {
        // RDMA stacks keep large shared-memory segments; the default 64 MiB /dev/shm is too small.
        volumes.push(Volume {
            name: "tandem-shm".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource { medium: Some("Memory".to_owned()), size_limit: None }),
            ..Volume::default()
        });
    }

    // Secret files (the token on every pod, the SSH keys on MPI pods) are root-owned 0400/0600; with
    // an fsGroup the kubelet makes them group-readable by it, so the image's user can read them.
    let security = pod_spec.security_context.get_or_insert_with(PodSecurityContext::default);
    security.fs_group.get_or_insert(TRAINER_FS_GROUP);
    // A PS restarts in place (the kubelet restarts its container in the same pod, whose output
    // volume keeps its checkpoints; the operator counts those restarts, see `plan`). Workers and
    // launchers never do: their whole group restarts as a new attempt.
    pod_spec.restart_policy =
        Some(if matches!(role, Role::Ps { .. }) { "OnFailure" } else { "Never" }.to_owned());
    pod_spec.hostname = Some(names::pod(&name, role));
    pod_spec.subdomain = Some(names::service(&name));
    pod_spec.enable_service_links = Some(false);
    // Pods talk to their peers and the PS, never to the API server: no token unless asked for.
    if pod_spec.automount_service_account_token.is_none() {
        pod_spec.automount_service_account_token = Some(false);
    }
    if pod_spec.host_network == Some(true) {
        pod_spec.dns_policy = Some("ClusterFirstWithHostNet".to_owned());
    }
    let scheduling = &spec.run_policy.scheduling;
    if let Some(priority) = &scheduling.priority_class_name {
        pod_spec.priority_class_name = Some(priority.clone());
    }
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.extend(names::pod_labels(&name, role, attempt));
    let mut annotations = template_meta.annotations.unwrap_or_default();
    if scheduling.gang {
        let default_scheduler = match scheduling.pod_group_flavor {
            PodGroupFlavor::Volcano => {
                annotations.insert(VOLCANO_GROUP_ANNOTATION.to_owned(), names::pod_group(&name));
                VOLCANO_SCHEDULER
            }
            PodGroupFlavor::SchedulerPlugins => {
                labels.insert(SCHEDULER_PLUGINS_GROUP_LABEL.to_owned(), names::pod_group(&name));
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
            name: Some(names::pod(&name, role)),
            namespace: Some(namespace(job)),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(owner(job)),
            ..ObjectMeta::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The contract's variables; the bind address is the pod IP, filled in by the kubelet.
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
        .map(|(key, value)| {
            if key == env::BIND {
                EnvVar {
                    name: key.to_owned(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "status.podIP".to_owned(),
                            api_version: None,
                        }),
                        ..EnvVarSource::default()
                    }),
                }
            } else {
                plain_env(key, &value)
            }
        })
        .collect()
}

/// OpenMPI settings of a launcher: the group's hostfile, sshd on the workers' port, their host
/// certificates checked against the job's CA, patience while worker DNS records appear.
fn launcher_env() -> Vec<EnvVar> {
    [
        ("OMPI_MCA_orte_default_hostfile", format!("{}/{}", names::HOSTFILE_DIR, names::HOSTFILE)),
        ("OMPI_MCA_prte_default_hostfile", format!("{}/{}", names::HOSTFILE_DIR, names::HOSTFILE)),
        ("OMPI_MCA_orte_keep_fqdn_hostnames", "true".to_owned()),
        (
            "OMPI_MCA_plm_rsh_args",
            format!(
                "-p {port} -i {dir}/ssh-privatekey -o ConnectionAttempts=10 -o StrictHostKeyChecking=yes \
                 -o UserKnownHostsFile={dir}/{SSH_KNOWN_HOSTS} -o GlobalKnownHostsFile=/dev/null",
                port = names::SSH_PORT,
                dir = names::SSH_DIR
            ),
        ),
    ]
    .into_iter()
    .map(|(k, v)| plain_env(k, &v))
    .collect()
}

fn plain_env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.to_owned(), value: Some(value.to_owned()), value_from: None }
}

/// Name of a PS pod's container port of its HTTP status endpoint.
pub const STATUS_PORT_NAME: &str = "status";

fn container_port(name: &str, port: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(port),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn pod_volumes(job: &TrainingJob, role: Role, mpi: bool) -> Vec<Volume> {
    let name = job.name_any();
    let mut volumes = vec![
        Volume {
            name: "tandem-config".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::config_map(&name),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "tandem-token".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::token_secret(&name)),
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
    ];
    if mpi && !matches!(role, Role::Ps { .. }) {
        let mut items = vec![
            key_to_path("ssh-privatekey", "ssh-privatekey"),
            key_to_path("ssh-publickey", "ssh-publickey"),
            key_to_path("ssh-publickey", "authorized_keys"),
            key_to_path(SSH_KNOWN_HOSTS, SSH_KNOWN_HOSTS),
        ];
        // Only workers certify a host key; the launcher only checks certificates.
        if let Role::Worker { .. } = role {
            items.push(key_to_path(SSH_HOST_CA_KEY, SSH_HOST_CA_KEY));
        }
        volumes.push(Volume {
            name: "tandem-ssh".to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(names::ssh_secret(&name)),
                default_mode: Some(0o600),
                items: Some(items),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    if let Role::Launcher { group } = role {
        volumes.push(Volume {
            name: "tandem-hostfile".to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: names::hostfile(&name, group),
                default_mode: Some(0o444),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    volumes
}

fn key_to_path(key: &str, path: &str) -> KeyToPath {
    KeyToPath { key: key.to_owned(), path: path.to_owned(), mode: None }
}

/// Extended resources (name, quantity) and environment of a network preset.
type Preset = (Vec<(String, String)>, Vec<(&'static str, &'static str)>);

/// Network presets of a worker container: the RDMA device, IPC_LOCK to pin memory, a large
/// /dev/shm and the UCX/NCCL or libfabric environment. Ethernet adds nothing.
fn apply_network_preset(container: &mut Container, network: &tandem_api::NetworkSpec) {
    let devices = network.devices_per_worker.unwrap_or(1).to_string();
    let (extra_limits, extra_env): Preset = match network.transport {
        Transport::Ethernet => return,
        Transport::Infiniband => (
            vec![(
                network.rdma_resource.clone().unwrap_or_else(|| DEFAULT_RDMA_RESOURCE.to_owned()),
                devices,
            )],
            vec![
                ("OMPI_MCA_pml", "ucx"),
                ("OMPI_MCA_btl", "^openib,tcp"),
                ("UCX_TLS", "rc,sm,self"),
                ("NCCL_IB_DISABLE", "0"),
                ("NCCL_SOCKET_IFNAME", "eth0"),
            ],
        ),
        Transport::Efa => (
            vec![(EFA_RESOURCE.to_owned(), devices), ("hugepages-2Mi".to_owned(), EFA_HUGEPAGES.to_owned())],
            vec![
                ("FI_PROVIDER", "efa"),
                ("FI_EFA_USE_DEVICE_RDMA", "1"),
                ("FI_EFA_FORK_SAFE", "1"),
                ("OMPI_MCA_pml", "^ucx"),
                ("OMPI_MCA_btl", "tcp,self,vader"),
                ("NCCL_SOCKET_IFNAME", "eth0"),
            ],
        ),
    };
    let resources = container.resources.get_or_insert_with(ResourceRequirements::default);
    for (key, value) in extra_limits {
        // Extended resources and huge pages must be requested and limited alike.
        resources
            .limits
            .get_or_insert_with(BTreeMap::new)
            .entry(key.clone())
            .or_insert(Quantity(value.clone()));
        resources.requests.get_or_insert_with(BTreeMap::new).entry(key).or_insert(Quantity(value));
    }
    let security = container.security_context.get_or_insert_with(SecurityContext::default);
    let capabilities = security.capabilities.get_or_insert_with(Capabilities::default);
    let add = capabilities.add.get_or_insert_with(Vec::new);
    if !add.iter().any(|c| c == "IPC_LOCK") {
        add.push("IPC_LOCK".to_owned());
    }
    let env = container.env.get_or_insert_with(Vec::new);
    for (key, value) in extra_env {
        if !env.iter().any(|e| e.name == key) {
            env.push(plain_env(key, value));
        }
    }
    container.volume_mounts.get_or_insert_with(Vec::new).push(mount("tandem-shm", "/dev/shm", false));
}
